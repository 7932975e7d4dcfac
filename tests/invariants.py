"""Plan invariants every compiled plan must satisfy (used by example and property tests)."""

from collections import defaultdict

from compiler.plan import Plan
from compiler.shapes import parse_shape


def check_plan(plan: Plan) -> None:
    used = [g for i in plan.instances for g in i.gpus]
    assert len(used) == len(set(used)), "a GPU serves two instances"
    assert not set(used) & set(plan.hardware.unavailable_gpus), "an unavailable GPU is used"
    tray_of = {g: t.id for t in plan.hardware.trays for g in t.gpus}
    domain_of = {t.id: t.nvlink_domain for t in plan.hardware.trays}
    for inst in plan.instances:
        hw = plan.system_of(inst)
        assert all(plan.hardware_of(t) is hw for t in inst.trays), f"{inst.id} straddles groups"
        if len(plan.fleet) > 1:
            group = next(g for g in plan.hardware.groups if g.hardware is hw)
            assert inst.group == group.name, f"{inst.id} names the wrong group"
        per = hw.gpus_per_tray
        shape = parse_shape(inst.shape)
        assert len(inst.gpus) == shape.gpus == inst.dp * inst.tp * inst.pp
        assert inst.pp == shape.pp and (inst.pp == 1 or inst.role == "prefill")
        trays = {tray_of[g] for g in inst.gpus}
        assert sorted(trays) == sorted(inst.trays)
        if shape.gpus <= per:
            assert len(trays) == 1, f"{inst.id} leaves its tray"
        else:
            assert len(trays) == shape.gpus // per, f"{inst.id} not on whole trays"
        if hw.form == "nvl72":
            assert len({domain_of[t] for t in trays}) == 1, f"{inst.id} spans NVLink domains"
    for dom, m in plan.memory.items():
        total = m.weights_gib + m.kv_gib + m.engram_gib + m.pool_gib + m.workspace_gib
        assert total <= m.capacity_gib + 1e-6, f"{dom} over capacity"
        assert min(m.weights_gib, m.kv_gib, m.engram_gib, m.pool_gib, m.workspace_gib) >= 0
    _check_shards(plan)


def _check_shards(plan: Plan) -> None:
    """Every byte of every Engram table exactly once per group (prefill peer group, and each
    decode instance)."""
    by_group: dict[tuple[str, int], list] = defaultdict(list)
    for s in plan.engram_shards:
        by_group[s.group, s.table].append(s)
    for shards in by_group.values():
        shards.sort(key=lambda s: s.offset_bytes)
        offset = 0
        for s in shards:
            assert s.offset_bytes == offset and s.bytes > 0
            offset += s.bytes
        assert offset == plan.model.engram_table_bytes
