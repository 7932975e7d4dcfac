"""Golden plan.yaml and report text for every example (the targets' goldens are in
tests/targets/test_golden.py); PNGs are compared byte for byte between two runs instead."""

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
    return {f"report/{k.split('/', 1)[1]}": v for k, v in emit_report(plan).items()
            if isinstance(v, str)}


@pytest.mark.parametrize("target", ["plan", "report"])
@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_golden(case: str, target: str, update_goldens: bool):
    folder = GOLDEN / case / target
    actual = _text(case, target)
    check_golden(folder, actual, update_goldens)


@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_plots_are_byte_identical(case: str):
    plan = EXAMPLE_CASES[case]()
    first = {k: v for k, v in emit_report(plan).items() if isinstance(v, bytes)}
    again = {k: v for k, v in emit_report(plan).items() if isinstance(v, bytes)}
    assert first == again and set(first) == {"report/curve.png", "report/rack.png"}
