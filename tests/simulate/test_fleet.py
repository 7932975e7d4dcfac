"""`rackc simulate` on a mixed fleet's plan (GB300 and Vera Rubin groups): one router and one
pool over every group's instances, each instance stepping at its own system's perf model."""

from pathlib import Path

from compiler import api
from compiler.load import load_fleet
from compiler.simulate.cluster import build_cluster
from compiler.simulate.runner import Options, fleet_workload

ROOT = Path(__file__).resolve().parents[2]
CASE = "mixed-gb300-vr-deepseek-v4.1-flash"
PLAN = ROOT / "tests" / "golden" / CASE / "plan" / "plan.yaml"
DEP = ROOT / "examples" / CASE / "deployment.yaml"


def test_a_mixed_fleet_runs_on_both_systems_at_their_own_speeds():
    out = api.simulate(PLAN, DEP, Options(requests=600))
    (m,) = out["results"].values()
    assert m["finished"] == 600 and m["lost_to_faults"] == 0
    plan = api.read_plan(PLAN)
    system = {i.id: plan.hardware_of(plan.tray_of_gpu(i.gpus[0]).id).system
              for i in plan.instances}
    assert len(set(system.values())) == 2
    (outcome, _), = out["outcomes"].values()
    busy = {}
    for r in outcome.ranks:
        busy.setdefault((system[r["instance"]], r["role"]), []).append(r["busy_us"])
    # every group's prefill and decode ranks take requests from the one router
    for key in [(s, role) for s in set(system.values()) for role in ("prefill", "decode")]:
        assert key in busy and sum(busy[key]) > 0, key
    # the instances of each system step at that system's perf model: a group's step times
    # are its own (GB300's and Vera Rubin's decode steps differ at the same batch)
    fleet = load_fleet(DEP)
    cluster = build_cluster(fleet[0], plan, fleet_workload(fleet), fleet)
    by_system = {}
    for info in cluster.instances:
        assert info.system == system[info.id]
        if info.role == "decode":
            by_system.setdefault(info.system, info.steps.decode_us(8, 8, 8192))
    a, b = by_system.values()
    assert a != b
    assert {s.system for s in cluster.segments} <= set(system.values())
