"""Every compiled example (each compiled once per session, tests/targets/fixtures.compiled_plan)
keeps the plan invariants of tests/invariants.check_plan, among them: every instance carries
its own decisions, and the KV cache of every GPU of every instance holds one maximum-length
request."""

import pytest

from tests.invariants import check_plan
from tests.targets.fixtures import EXAMPLE_CASES

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_example_keeps_the_plan_invariants(case: str):
    check_plan(EXAMPLE_CASES[case]())
