"""`rackc predict`: a layout (instance counts and shapes) plus the deployment's workload in,
the serving metrics out. The solver calls the same functions to rank layouts."""

import functools
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace

from compiler import arch, catalog
from compiler.load import Inputs, layout
from compiler.memory import gpu_memory, kv_bytes_per_token_per_gpu
from compiler.perf.ops import OpModel, op_model
from compiler.perf.serving import (
    Group,
    Prediction,
    Workload,
    predict_aggregated,
    predict_disaggregated,
    prefix_hit_rate,
)
from compiler.perf.step import PerfContext
from compiler.precheck import kv_dtype, max_model_len, uses_draft
from compiler.shapes import Shape, parse_shape

PREFILL_CHUNK_TOKENS = 16384  # REFERENCE-DATA.md C1 V2: 16,384 tokens per device in prefill
PREFILL_MAX_SEQS = 64  # assumed
MAX_DECODE_BATCH = 1024  # assumed: beyond this vLLM's scheduler and graphs stop paying off
UNBOUNDED_CONCURRENCY = 1e9  # throughput mode without a stated concurrency: demand unbounded
PREDICT_KEYS = ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu",
                "tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90", "ttft_ms_p50",
                "ttft_ms_p90", "tpot_ms_p50", "prefix_hit_rate", "tokens_per_s_per_kw",
                "instances", "breakdown")


@dataclass(frozen=True)
class Layout:
    """Instance groups to predict: (role, shape, count), optionally with batch limits."""

    role: str
    shape: Shape
    count: int
    max_batch: int | None = None
    max_batched_tokens: int | None = None


def workload(inputs: Inputs) -> Workload:
    p, o = inputs.profile, inputs.deployment.spec.workload

    def pick(name: str) -> float:
        given = getattr(o, name)
        return given if given is not None else getattr(p, name).value

    return Workload(isl=pick("isl"), osl=pick("osl"), isl_cv=pick("isl_cv"),
                    osl_cv=pick("osl_cv"), concurrency=pick("concurrency"),
                    prefix_reuse=pick("prefix_reuse"),
                    shared_prefix_tokens=pick("shared_prefix_tokens"), sessions=pick("sessions"))


@functools.cache
def system_ops(system_name: str) -> OpModel:
    return op_model(catalog.system(system_name), catalog.calibration(system_name),
                    catalog.floors(system_name)["floors"])


def context(inputs: Inputs, engram_gpus: int) -> PerfContext:
    spec = inputs.deployment.spec.serving.speculative
    hw = inputs.hardware.spec
    return PerfContext(
        model=inputs.model.spec, system=inputs.system, ops=system_ops(inputs.system.name),
        kv_dtype=kv_dtype(inputs), draft_tokens=spec.draft_tokens if spec else 0,
        acceptance=spec.acceptance if spec else 1.0, die_local=True,
        engram_gpus=max(1, engram_gpus), nic_gbps=hw.nic_gbps_per_gpu)


def kv_capacity_requests(inputs: Inputs, shape: Shape, role: str, engram_gpus: int,
                         w: Workload) -> int:
    """Requests of average length whose KV fits beside weights, Engram and workspace."""
    mem = gpu_memory(inputs.model.spec, shape, inputs.system, kv_dtype(inputs), 0, engram_gpus,
                     inputs.deployment.spec.serving.engram_placement == "hbm", uses_draft(inputs))
    free = (inputs.system.gpu.hbm_gib.value - mem.total_gib) * arch.GIB
    per_request = kv_bytes_per_token_per_gpu(inputs.model.spec, shape, kv_dtype(inputs)) \
        * (w.isl + w.osl)
    return max(0, int(free / per_request)) if per_request else MAX_DECODE_BATCH


def groups(inputs: Inputs, plan: list[Layout], w: Workload) -> list[Group]:
    prefill_gpus = sum(x.count * x.shape.gpus for x in plan if x.role == "prefill")
    out = []
    for x in plan:
        engram_gpus = prefill_gpus if x.role == "prefill" else x.shape.gpus
        ctx = context(inputs, engram_gpus)
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


def pool_tokens(inputs: Inputs, gs: list[Group]) -> float:
    """KV tokens the prefix cache holds: the Mooncake pool (tray DRAM share plus spare prefill
    HBM) when configured, else the prefill ranks' own HBM cache."""
    per_token = arch.kv_bytes_per_token(inputs.model.spec, kv_dtype(inputs))
    pool = inputs.deployment.spec.serving.kv_pool
    racks, trays = layout(inputs.hardware, inputs.system)
    dram = inputs.hardware.spec.dram_gib_per_tray or inputs.system.tray.dram_gib.value
    prefill = [g for g in gs if g.role in ("prefill", "aggregated")]
    hbm_free = sum(g.gpus * max(0.0, spare_hbm_gib(inputs, g.shape, g.ctx.engram_gpus))
                   for g in prefill)
    if pool and pool.dram:
        total = racks * trays * dram * pool.dram_fraction + (hbm_free if pool.hbm else 0.0)
    else:
        total = hbm_free
    return total * arch.GIB / per_token


def spare_hbm_gib(inputs: Inputs, shape: Shape, engram_gpus: int) -> float:
    """HBM a prefill GPU can lend to the pool after one maximum-length request's KV."""
    mem = gpu_memory(inputs.model.spec, shape, inputs.system, kv_dtype(inputs),
                     max_model_len(inputs), engram_gpus,
                     inputs.deployment.spec.serving.engram_placement == "hbm", uses_draft(inputs))
    return mem.spare_gib(inputs.system.gpu.hbm_gib.value)


def predict_layout(inputs: Inputs, plan: list[Layout], w: Workload | None = None,
                   max_requests_per_s: float | None = None) -> Prediction:
    """Metrics of `plan` under the workload; `max_requests_per_s` caps admission (the rate at
    which the solver found the SLO still holds)."""
    w = w or workload(inputs)
    cap = max_requests_per_s / 1e6 if max_requests_per_s else float("inf")
    gs = groups(inputs, plan, w)
    hit = prefix_hit_rate(w, pool_tokens(inputs, gs))
    gpus = sum(g.gpus for g in gs)
    power = inputs.system.gpu.power_w.value
    prefill = [g for g in gs if g.role == "prefill"]
    decode = [g for g in gs if g.role == "decode"]
    if prefill and decode:
        return predict_disaggregated(prefill, decode, w, hit, power, gpus, cap)
    return predict_aggregated([g for g in gs if g.role != "prefill"], w, hit, power, gpus, cap)


def curve(inputs: Inputs, plan: list[Layout], w: Workload | None = None) -> list[dict]:
    """Throughput-interactivity curve: sweep the decode batch (concurrency follows) in powers
    of two up to what the KV cache holds, past the SLO's batch, so the trade-off shows."""
    w = w or workload(inputs)
    ranks = sum(x.count * x.shape.dp for x in plan if x.role != "prefill")
    unlimited = [replace(x, max_batch=None) if x.role != "prefill" else x for x in plan]
    cap = max(g.max_batch for g in groups(inputs, unlimited, w) if g.role != "prefill")
    points = []
    batch = 1
    while batch <= cap:
        limited = [replace(x, max_batch=batch) if x.role != "prefill" else x for x in plan]
        p = predict_layout(inputs, limited, replace(w, concurrency=batch * ranks * 1.05))
        points.append({"batch": batch, "tokens_per_s_per_user_p50": p.tokens_per_s_per_user_p50,
                       "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
                       "total_tokens_per_s_per_gpu": p.total_tokens_per_s_per_gpu})
        batch *= 2
    return points


def prediction_json(p: Prediction) -> dict:
    data = asdict(p)
    ordered = {k: data[k] for k in PREDICT_KEYS}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    return ordered


def grouped_layouts(instances: Iterable[tuple[str, str, int, int]]) -> list[Layout]:
    """(role, shape name, max batch, max batched tokens) per instance, grouped and counted."""
    counts = Counter(instances)
    return [Layout(role, parse_shape(shape), n, batch, tokens if role != "decode" else None)
            for (role, shape, batch, tokens), n in sorted(counts.items())]


def operating_point(inputs: Inputs, plan: list[Layout], goodput: float | None) -> dict:
    """The plan's `predicted` block: metrics at the operating point and the curve. In
    throughput mode, unless the user fixed the concurrency, demand is unbounded and admission
    stops at the SLO goodput."""
    w = operating_workload(inputs)
    data = prediction_json(predict_layout(inputs, plan, w, max_requests_per_s=goodput))
    data["curve"] = curve(inputs, plan)
    return data


def operating_workload(inputs: Inputs) -> Workload:
    """The workload at the operating point: in throughput mode without a stated concurrency
    demand is unbounded (admission stops at the goodput)."""
    w = workload(inputs)
    if inputs.deployment.spec.objective.mode == "throughput" and \
            inputs.deployment.spec.workload.concurrency is None:
        w = replace(w, concurrency=UNBOUNDED_CONCURRENCY)
    return w
