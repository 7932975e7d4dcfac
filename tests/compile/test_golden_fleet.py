"""Cheap golden of the fleet-sized examples: per rack, its instances (shape, trays); the solver
phases and the headline predictions. The full plan and targets are checked on the small
examples; here the point is that the fleet's layout and figures do not drift unnoticed."""

import pytest

from compiler.plan import Plan
from targets import dynamo
from tests.invariants import check_plan
from tests.targets.fixtures import FLEET_EXAMPLES, compiled_plan
from tests.targets.test_golden import GOLDEN, check_golden

pytestmark = pytest.mark.golden


def summary(plan: Plan) -> str:
    rack_of = {t.id: t.nvlink_domain for t in plan.hardware.trays}
    lines = [f"{plan.hardware.system}: {len(plan.hardware.trays)} trays, "
             f"{len(plan.instances)} instances on {sum(len(i.gpus) for i in plan.instances)} "
             f"GPUs"]
    s = plan.solver
    lines.append(f"solver {s.status}: goodput {s.objective:g} (bound {s.bound:g}); counts "
                 f"{s.counts.status} gap {s.counts.gap:g}; placement {s.placement.status} "
                 f"gap {s.placement.gap:g} in {len(s.racks)} rack models")
    for key in ("tokens_per_s_per_user_p90", "ttft_ms_p90", "total_tokens_per_s_per_gpu",
                "prefix_hit_rate"):
        lines.append(f"{key}: {getattr(plan.predicted, key):g}")
    for inst in plan.instances:
        lines.append(f"{rack_of[inst.trays[0]]} {inst.id} {inst.role} {inst.shape} "
                     f"{inst.trays[0]}..{inst.trays[-1]} batch {inst.max_batch}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", FLEET_EXAMPLES)
def test_fleet_golden(case: str, update_goldens: bool):
    plan = compiled_plan(case)
    check_plan(plan)
    assert plan.solver.status == "OPTIMAL"
    folder = GOLDEN / case / "summary"
    actual = {"summary/summary.txt": summary(plan)}
    check_golden(folder, actual, update_goldens)


@pytest.mark.parametrize("case", FLEET_EXAMPLES)
def test_fleet_graphs_fit_the_graph_crd(case: str):
    """Every instance in a graph of its routing group, none of more components than the DGD
    CRD admits (tests/conformance checks the graphs against the CRD itself)."""
    plan = compiled_plan(case)
    graphs = dynamo.graph_deployments(plan)
    most = plan.site.engines["dynamo"].facts.graph_components.value
    assert all(len(g["spec"]["components"]) <= most for g in graphs)
    workers = [c for g in graphs for c in g["spec"]["components"] if c["type"] != "frontend"]
    assert len(workers) == len(plan.instances)
