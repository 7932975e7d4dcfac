"""Golden plan.yaml and report (index.html, curve.svg, performance.md and .json) for every
example (the targets' goldens are in tests/targets/test_golden.py)."""

import pytest

from compiler.plan import dump_plan
from targets.report import emit as emit_report
from tests.targets.fixtures import EXAMPLE_CASES
from tests.targets.test_golden import GOLDEN, check_golden

pytestmark = pytest.mark.golden


def _text(case: str, target: str) -> dict[str, str]:
    plan = EXAMPLE_CASES[case]()
    if target == "plan":
        return {"plan/plan.yaml": dump_plan(plan)}
    return {f"report/{k.split('/', 1)[1]}": v for k, v in emit_report(plan).items()}


@pytest.mark.parametrize("target", ["plan", "report"])
@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_golden(case: str, target: str, update_goldens: bool):
    folder = GOLDEN / case / target
    actual = _text(case, target)
    check_golden(folder, actual, update_goldens)

