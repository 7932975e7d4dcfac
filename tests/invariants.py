"""Plan invariants every compiled plan must satisfy (used by example and property tests)."""

from collections import defaultdict

from compiler import arch, catalog
from compiler.memory import kv_bytes_per_token_per_gpu
from compiler.plan import Instance, Plan
from compiler.shapes import parse_shape, stage_layer_mix
from schemas.model import ModelSpec


def check_plan(plan: Plan, model: ModelSpec | None = None) -> None:
    """`model`: the plan's model where it is no catalog model (a file the deployment names)."""
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
    _check_decisions(plan)
    _check_kv(plan, model or catalog.model(plan.model.name).spec)


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


def _check_decisions(plan: Plan) -> None:
    """Every instance carries its own decisions: its placement and its batch limit."""
    by_path = {d.path: d for d in plan.decisions}
    for inst in plan.instances:
        placed = by_path.get(f"instances.{inst.id}")
        assert placed is not None, f"{inst.id} has no placement decision"
        assert placed.value == f"{inst.shape} on " + ",".join(inst.trays), inst.id
        key, value = ("max_batched_tokens", inst.max_batched_tokens) if inst.role == "prefill" \
            else ("max_batch", inst.max_batch)
        limit = by_path.get(f"instances.{inst.id}.{key}")
        assert limit is not None and limit.value == str(value), f"{inst.id}.{key}"


def _check_kv(plan: Plan, model: ModelSpec) -> None:
    """The KV cache of every GPU of every instance holds one maximum-length request."""
    kv_of: dict[str, float] = defaultdict(float)
    for dom, m in plan.memory.items():
        kv_of[dom.rsplit("-d", 1)[0]] += m.kv_gib
    for inst in plan.instances:
        per_stage = len(inst.gpus) // inst.pp
        for rank, gpu in enumerate(inst.gpus):
            need = _one_request_gib(plan, model, inst, rank // per_stage)
            assert kv_of[gpu] >= need - 1e-3, (
                f"{inst.id} rank {rank} ({gpu}): KV {kv_of[gpu]:.3f} GiB < one "
                f"{plan.serving.max_model_len}-token request {need:.3f} GiB")


def _one_request_gib(plan: Plan, model: ModelSpec, inst: Instance, stage: int) -> float:
    """KV of one `max_model_len` request on one GPU of `stage` (its share of the full-attention
    layers, plus its sliding layers' windows)."""
    shape = parse_shape(inst.shape)
    dtype = plan.serving.kv_cache_dtype
    per_token = kv_bytes_per_token_per_gpu(model, shape, dtype)
    window = arch.kv_window_bytes_per_request(model, dtype)
    n, _, w = stage_layer_mix(model, shape.pp)[stage]
    full, sliding = model.layers - model.attention.sliding_layers, model.attention.sliding_layers
    full_share = (n - w) / full if shape.pp > 1 and full else 1.0
    window_share = w / sliding if shape.pp > 1 and sliding else 1.0
    return (per_token * full_share * plan.serving.max_model_len + window * window_share) \
        / arch.GIB
