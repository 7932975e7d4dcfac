"""`rackc predict`: a layout (instance counts and shapes) plus the deployment's workload in,
the serving metrics out. The solver calls the same functions to rank layouts."""

import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from compiler import arch, catalog, engine_policy, offload
from compiler.load import Inputs, layout
from compiler.memory import gpu_budget
from compiler.perf.aggregated import predict_aggregated
from compiler.perf.ops import OpModel, op_model
from compiler.perf.serving import (
    UNBOUNDED_CONCURRENCY,
    Group,
    Prediction,
    Workload,
    predict_disaggregated,
    prefix_hit_rate,
)
from compiler.perf.step import PerfContext
from compiler.shapes import Shape, parse_shape

if TYPE_CHECKING:
    from compiler.plan import Instance

PREFILL_CHUNK_TOKENS = 16384  # REFERENCE-DATA.md C1 V2: 16,384 tokens per device in prefill
PREFILL_MAX_SEQS = 64  # assumed
MAX_DECODE_BATCH = 1024  # assumed: beyond this vLLM's scheduler and graphs stop paying off


@dataclass(frozen=True)
class Layout:
    """Instance groups to predict: (role, shape, count), optionally with batch limits."""

    role: str
    shape: Shape
    count: int
    max_batch: int | None = None
    max_batched_tokens: int | None = None


def workload(inputs: Inputs) -> Workload:
    """The request mix compiler.resolve chose (the profile's numbers, or the user's)."""
    r = inputs.resolved
    return Workload(**{c.path.split(".", 1)[1]: c.value for c in r.workload})


@functools.cache
def system_ops(system_name: str, kernels: str = catalog.DEPLOYED_KERNELS) -> OpModel:
    return op_model(catalog.system(system_name), catalog.calibration(system_name, kernels),
                    catalog.floors(system_name)["floors"])


def context(inputs: Inputs, engram_gpus: int, role: str = "decode",
            shape: Shape | None = None) -> PerfContext:
    """What the step model needs of one instance group; `role` says where its Engram tables
    are (compiler.resolve: prefill's are in host memory when the engine cannot share HBM), and
    with `shape`, which MoE kernels run (a weight-only fallback computes in BF16) and what it
    offloads (compiler.offload). Built once
    per inputs and arguments, so every caller shares its step memo (compiler.perf.step)."""
    key = (max(1, engram_gpus), role, shape)
    ctx = inputs.perf_contexts.get(key)
    if ctx is None:
        ctx = inputs.perf_contexts[key] = _context(inputs, *key)
    return ctx


def _context(inputs: Inputs, engram_gpus: int, role: str, shape: Shape | None) -> PerfContext:
    r = inputs.resolved
    spec = r.speculative
    weight_only, off, batched = False, None, False
    if shape is not None:
        policy = engine_policy.of(inputs, role, shape)
        weight_only, batched = policy.weight_only, policy.batched_experts
        off = offload.of(inputs, role, shape)
    return _interned(
        model=inputs.model.spec, system=inputs.system,
        ops=system_ops(inputs.system.name, inputs.kernels),
        kv_dtype=r.kv_cache_dtype.value,
        stage_tensors=r.engines.vllm.pipeline.stage_tensors.value,
        draft_tokens=spec.draft_tokens if spec else 0,
        acceptance=spec.acceptance if spec else 1.0, die_local=True,
        engram_gpus=max(1, engram_gpus), engram_host=not r.engram_in_hbm(role),
        moe_weight_only=weight_only, batched_experts=batched, offload=off,
        nic_gbps=r.nic_gbps_per_gpu.value,
        image_token_share=r.image_tokens / max(1.0, r.workload_value("isl")),
        tokens_per_image=r.tokens_per_image)


_CONTEXTS: dict[tuple, PerfContext] = {}
_KEEP = 64  # contexts remembered (with their memos) in one process: a fleet's groups, a few
_BY_ID = ("model", "system", "ops")  # unhashable or costly to compare: the same object


def _interned(**fields) -> PerfContext:
    """One PerfContext (and so one memo of its steps) for equal fields: every prediction of
    one compile, and the groups of a fleet on one system, share the steps they ask for. The
    context holds `_BY_ID`'s objects, so their ids stay theirs while it is remembered."""
    key = tuple((k, id(v) if k in _BY_ID else v) for k, v in fields.items())
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        if len(_CONTEXTS) >= _KEEP:
            del _CONTEXTS[next(iter(_CONTEXTS))]  # the oldest
        ctx = _CONTEXTS[key] = PerfContext(**fields)
    return ctx


def kv_capacity_requests(inputs: Inputs, shape: Shape, role: str, engram_gpus: int,
                         w: Workload) -> int:
    """Requests of average length whose KV (and linear-attention state) fits in the KV cache
    of the memory budget."""
    mem = gpu_budget(inputs, role, shape, engram_gpus)
    per_request = mem.kv_token_bytes * (w.isl + w.osl) + mem.state_bytes
    free = mem.kv_gib * arch.GIB
    return max(0, int(free / per_request)) if per_request else MAX_DECODE_BATCH


def groups(inputs: Inputs, plan: list[Layout], w: Workload,
           whole: list[Layout] | None = None) -> list[Group]:
    """`plan`'s instance groups with their perf contexts; `whole`: the deployment's layout
    when `plan` is one routing group of it (its prefill GPUs are the Engram peer group)."""
    prefill_gpus = sum(x.count * x.shape.gpus for x in whole or plan if x.role == "prefill")
    out = []
    for x in plan:
        engram_gpus = prefill_gpus if x.role == "prefill" else x.shape.gpus
        ctx = context(inputs, engram_gpus, x.role, x.shape)
        if x.role == "prefill":
            out.append(Group("prefill", x.shape, x.count, x.max_batch or PREFILL_MAX_SEQS,
                             x.max_batched_tokens or PREFILL_CHUNK_TOKENS, ctx))
            continue
        kv = kv_capacity_requests(inputs, x.shape, x.role, engram_gpus, w)
        batch = max(1, min(x.max_batch, kv) if x.max_batch else min(MAX_DECODE_BATCH, kv))
        tokens = batch * (1 + ctx.draft_tokens)
        if x.role == "aggregated":
            tokens = x.max_batched_tokens or aggregated_budget(tokens)
        out.append(Group(x.role, x.shape, x.count, batch, tokens, ctx))
    return out


def aggregated_budget(decode_tokens: int) -> int:
    """An aggregated rank's token budget per step: its decode tokens plus room for prompt
    chunks (half a prefill chunk, assumed), unless the deployment pins one."""
    return max(decode_tokens + 1, PREFILL_CHUNK_TOKENS // 2)


def pool_tokens(inputs: Inputs, gs: list[Group], pool_gib: float | None = None) -> float:
    """KV tokens the prefix cache holds: the Mooncake pool (its DRAM segments, plus spare
    prefill HBM where the store takes HBM segments) when configured, else the prefill ranks'
    own HBM cache. `pool_gib`: the plan's pool, once lowered."""
    r = inputs.resolved
    per_token = arch.kv_bytes_per_token(inputs.model.spec, r.kv_cache_dtype.value)
    prefill = [g for g in gs if g.role in ("prefill", "aggregated")]
    hbm_free = sum(g.gpus * max(0.0, gpu_budget(inputs, "prefill", g.shape,
                                                g.ctx.engram_gpus).spare_gib)
                   for g in prefill)
    if pool_gib is not None:
        total = pool_gib
    elif r.kv_pool_dram.value:
        total = pool_dram_gib(inputs) + (hbm_free if r.kv_pool_hbm.value else 0.0)
    else:
        total = hbm_free
    return total * arch.GIB / per_token


def pool_dram_gib(inputs: Inputs) -> float:
    """The store's DRAM over every tray, at the requested share (the host budget may trim a
    tray's segment; compiler.host_memory)."""
    racks, trays = layout(inputs.hardware, inputs.system)
    r = inputs.resolved
    return racks * trays * r.dram_gib_per_tray.value * r.dram_fraction.value


def predict_layout(inputs: Inputs, plan: list[Layout], w: Workload | None = None,
                   max_requests_per_s: float | None = None,
                   pool_gib: float | None = None, cross: float = 0.0,
                   whole: list[Layout] | None = None) -> Prediction:
    """Metrics of `plan` under the workload; `max_requests_per_s` caps admission (the rate at
    which the solver found the SLO still holds). `plan` is one routing group (compiler.routes)
    whose hand-offs cross NVLink domains at share `cross`; `whole`: the deployment's layout
    it is part of (its prefix pool and Engram peer group), default `plan` itself."""
    w = w or workload(inputs)
    cap = max_requests_per_s / 1e6 if max_requests_per_s else float("inf")
    gs = groups(inputs, plan, w, whole)
    every = gs if whole is None else groups(inputs, whole, w)
    hit = prefix_hit_rate(w, pool_tokens(inputs, every, pool_gib))
    gpus = sum(g.gpus for g in gs)
    power = inputs.system.gpu.power_w.value
    prefill = [g for g in gs if g.role == "prefill"]
    decode = [g for g in gs if g.role == "decode"]
    if prefill and decode:
        return predict_disaggregated(prefill, decode, w, hit, power, gpus, cap, cross)
    return predict_aggregated([g for g in gs if g.role != "prefill"], w, hit, power, gpus, cap)


def curve(inputs: Inputs, plan: list[Layout], w: Workload | None = None,
          pool_gib: float | None = None, cross: float = 0.0,
          whole: list[Layout] | None = None) -> list[dict]:
    """Throughput-interactivity curve: sweep the decode batch (concurrency follows) in powers
    of two up to what the KV cache holds, past the SLO's batch, so the trade-off shows
    (`cross`, `whole`: as predict_layout's)."""
    w = w or workload(inputs)
    ranks = sum(x.count * x.shape.dp for x in plan if x.role != "prefill")
    unlimited = [replace(x, max_batch=None) if x.role != "prefill" else x for x in plan]
    cap = max(g.max_batch for g in groups(inputs, unlimited, w) if g.role != "prefill")
    points = []
    batch = 1
    while batch <= cap:
        limited = [replace(x, max_batch=batch) if x.role != "prefill" else x for x in plan]
        p = predict_layout(inputs, limited, replace(w, concurrency=batch * ranks * 1.05),
                           pool_gib=pool_gib, cross=cross, whole=whole)
        points.append({"batch": batch, "tokens_per_s_per_user_p50": p.tokens_per_s_per_user_p50,
                       "tokens_per_s_per_user_p90": p.tokens_per_s_per_user_p90,
                       "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
                       "total_tokens_per_s_per_gpu": p.total_tokens_per_s_per_gpu})
        batch *= 2
    return points



def instance_layouts(instances: "Iterable[Instance]") -> list[Layout]:
    """A plan's instances grouped by (role, shape, batch limits) for the perf model."""
    return grouped_layouts((i.role, i.shape, i.max_batch, i.max_batched_tokens)
                           for i in instances)


def grouped_layouts(instances: Iterable[tuple[str, str, int, int]]) -> list[Layout]:
    """(role, shape name, max batch, max batched tokens) per instance, grouped and counted."""
    counts = Counter(instances)
    return [Layout(role, parse_shape(shape), n, batch, tokens if role != "decode" else None)
            for (role, shape, batch, tokens), n in sorted(counts.items())]


def operating_workload(inputs: Inputs) -> Workload:
    """The workload at the operating point: without a stated concurrency, demand is unbounded
    in throughput and pinned mode (admission stops at the layout's goodput, so a layout
    predicts the same whichever mode chose it); latency mode keeps the profile's."""
    w = workload(inputs)
    r = inputs.resolved
    if r.objective_mode.value != "latency" and r.stated_concurrency is None:
        w = replace(w, concurrency=UNBOUNDED_CONCURRENCY)
    return w
