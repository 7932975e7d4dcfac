"""compiler.deploy: rank groups and host ports, recorded on the plan and checked when read."""

from pathlib import Path

import pytest

from compiler import deploy, ports
from compiler.plan import dump_plan, load_plan
from schemas.diagnostics import CompileError
from tests.targets.fixtures import compiled_plan

VR, H200 = "vr-nvl72-deepseek-v4.1-flash", "hgx-h200-deepseek-v3"
PINNED = "vr-nvl72-pinned-site"  # DEP2 prefill two per tray, TP8 decode over two trays

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _groups(plan, instance_id):
    trays = {t.id: t for t in plan.hardware.trays}
    of_gpu = {g: t.id for t in plan.hardware.trays for g in t.gpus}
    return deploy.rank_groups(trays, of_gpu, plan.instance(instance_id))


def test_one_group_per_tray_in_rank_order():
    plan = compiled_plan(VR)
    decode = plan.instance("decode-00")
    groups = _groups(plan, "decode-00")
    per_tray = plan.system_of(decode).gpus_per_tray
    assert len(decode.trays) > 1 and [g.tray for g in groups] == decode.trays
    assert [g.first_rank for g in groups] == [per_tray * k for k in range(len(decode.trays))]
    assert [x for g in groups for x in g.gpus] == decode.gpus
    assert groups == decode.rank_groups  # what the plan records


def test_instances_sharing_a_tray_bind_distinct_ports():
    """Two DEP2 prefill instances on one tray: every port one binds is free of the other's."""
    plan = compiled_plan(PINNED)
    by_tray: dict[str, list] = {}
    for i in plan.instances:
        for g in i.rank_groups:
            bound = {g.api_port, g.dp_rpc_port, g.master_port} - {None}
            if g.nixl_port is not None:
                bound |= {g.nixl_port + g.first_rank + k for k in range(len(g.gpus))}
            by_tray.setdefault(g.tray, []).append(bound)
    shared = [t for t, sets in by_tray.items() if len(sets) > 1]
    assert shared, "the case has trays with two instances"
    for t in shared:
        sets = by_tray[t]
        assert sum(len(x) for x in sets) == len(set().union(*sets)), t


def test_multi_node_ports_are_the_leaders():
    dep = compiled_plan(VR).instance("decode-00").rank_groups
    assert dep[0].api_port == ports.ENGINE_API and dep[0].dp_rpc_port == ports.DP_RPC
    assert all(g.api_port is None and g.dp_rpc_port is None for g in dep[1:])
    # every DP rank listens for NIXL: base + its global rank = 5600 + its local index
    assert {g.nixl_port + g.first_rank for g in dep} == {ports.NIXL_SIDE_CHANNEL}
    tp = next(i for i in compiled_plan(PINNED).instances if i.tp == 8).rank_groups
    assert len(tp) == 2
    assert tp[0].master_port == ports.MASTER and tp[0].nixl_port is not None
    assert tp[1].nixl_port is None and tp[1].master_port is None  # headless workers only


def test_refuses_ranks_that_interleave_trays():
    plan = compiled_plan(VR)
    decode = plan.instance("decode-00")
    n = plan.system_of(decode).gpus_per_tray  # the second tray's first GPU moved before the first's
    gpus = [decode.gpus[n], *decode.gpus[:n], *decode.gpus[n + 1:]]
    trays = {t.id: t for t in plan.hardware.trays}
    of_gpu = {g: t.id for t in plan.hardware.trays for g in t.gpus}
    with pytest.raises(deploy.LayoutError, match="contiguous"):
        deploy.rank_groups(trays, of_gpu, decode.model_copy(update={"gpus": gpus}))


def test_a_plan_with_edited_rank_groups_is_refused():
    plan = compiled_plan(H200)
    text = dump_plan(plan)
    assert load_plan(text) == plan
    edited = text.replace("first_rank: 0", "first_rank: 3", 1)
    with pytest.raises(CompileError) as err:
        load_plan(edited)
    assert "E701" in str(err.value) and "rank_groups" in str(err.value)


def test_memory_utilization_leaves_the_reserve():
    """`--gpu-memory-utilization` x HBM never reaches into the reserve vLLM's start-up check
    needs free (rounded down, not to nearest: 0.9600 -> 0.96, 0.9699 -> 0.96)."""
    from compiler.memory import utilization

    assert utilization(140.4, 5.617) == 0.95  # 0.9599..: the H200 example's domains
    assert utilization(100.0, 3.0) == 0.97
    for golden in sorted(GOLDEN.glob("*/plan/plan.yaml")):
        plan = load_plan(golden.read_text())
        for i in plan.instances:
            for gpu in i.gpus:
                for name, d in plan.memory.items():
                    if name.startswith(gpu + "-d"):
                        assert i.gpu_memory_utilization * d.capacity_gib \
                            <= d.capacity_gib - d.reserved_gib + 1e-9, (golden, i.id, name)
