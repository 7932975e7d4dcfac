"""Candidate engine shapes per role and what one instance of each sustains at the SLO.

Decode: the largest batch per DP rank whose per-user rate still meets the SLO (P50 and P90),
capped by the KV that fits; capacity = requests/s at that batch. Prefill: new tokens/s at the
chunk size, divided by the new tokens per request, held below a utilisation that keeps TTFT
within its SLO. These are the numbers the count model trades against each other.
"""

from dataclasses import dataclass, replace

from compiler.load import Inputs
from compiler.perf import serving
from compiler.perf.predict import (
    MAX_DECODE_BATCH,
    PREFILL_CHUNK_TOKENS,
    PREFILL_MAX_SEQS,
    context,
    kv_capacity_requests,
)
from compiler.perf.serving import MAX_UTILISATION, Workload
from compiler.perf.step import PerfContext, decode_step, prefill_step
from compiler.precheck import Precheck
from compiler.shapes import Shape

PREFILL_CHUNKS = (PREFILL_CHUNK_TOKENS, 8192, 4096, 2048)  # tokens per rank per prefill step


@dataclass(frozen=True)
class Candidate:
    role: str
    shape: Shape
    requests_per_s: float  # one instance, at the SLO; 0 when it cannot meet it
    max_batch: int  # decode: requests per DP rank at the SLO; prefill: sequences per step
    max_batched_tokens: int
    step_us: float
    why_not: str  # empty when usable
    why: str = ""  # how its batch limit was chosen (the plan's decision)


def _meets(ctx: PerfContext, shape: Shape, batch: int, kv_len: float, w: Workload,
           p50: float | None, p90: float | None) -> tuple[bool, float]:
    step = decode_step(ctx, shape, batch, kv_len)
    r50, r90 = serving.per_user_rates(ctx, step, batch, w)
    return (p50 is None or r50 >= p50) and (p90 is None or r90 >= p90), step.us


def decode_candidate(inputs: Inputs, shape: Shape, w: Workload, batch_cap: int | None,
                     enforce_slo: bool = True) -> Candidate:
    slo = inputs.deployment.spec.slo
    ctx = context(inputs, shape.gpus, "decode", shape)
    cap = min(MAX_DECODE_BATCH, kv_capacity_requests(inputs, shape, "decode", shape.gpus, w))
    if batch_cap is not None:
        cap = min(cap, batch_cap)
    kv_len = w.isl + w.osl / 2
    p50, p90 = slo.tokens_per_s_per_user_p50, slo.tokens_per_s_per_user_p90
    if not enforce_slo:
        p50 = p90 = None
    if cap < 1:
        return Candidate("decode", shape, 0.0, 0, 0, 0.0, "no room for one request's KV")
    ok, step = _meets(ctx, shape, 1, kv_len, w, p50, p90)
    if not ok:
        rate = 1e6 * ctx.acceptance / step
        return Candidate("decode", shape, 0.0, 0, 0, step,
                         f"{rate:.0f} tokens/s per user at batch 1, below the SLO")
    lo, hi = 1, cap  # largest batch meeting the SLO: rates fall as the batch grows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _meets(ctx, shape, mid, kv_len, w, p50, p90)[0]:
            lo = mid
        else:
            hi = mid - 1
    step = decode_step(ctx, shape, lo, kv_len).us
    rps = shape.dp * lo * ctx.acceptance / step * 1e6 / w.osl
    why = (f"largest batch per DP rank whose per-user rate meets the SLO, within the KV that "
           f"fits ({cap} requests)" if enforce_slo else f"the KV that fits ({cap} requests)")
    return Candidate("decode", shape, rps, lo, lo * (1 + ctx.draft_tokens), step, "", why)


def prefill_candidate(inputs: Inputs, shape: Shape, w: Workload, hit: float,
                      engram_gpus: int) -> Candidate:
    """The prefill chunk (tokens per rank per step) with the most requests/s within the TTFT
    SLO: smaller chunks finish sooner, larger ones use the GPU better."""
    options = [_prefill_at(inputs, shape, w, hit, engram_gpus, chunk)
               for chunk in PREFILL_CHUNKS]
    best = max(options, key=lambda c: (c.requests_per_s, c.max_batched_tokens))
    sizes = ", ".join(f"{c:,}" for c in PREFILL_CHUNKS)
    return replace(best, why=f"of prefill chunks {sizes} tokens per rank, "
                             f"{best.max_batched_tokens:,} sustains the most requests/s within "
                             "the TTFT SLO (REFERENCE-DATA.md C1 V2 runs 16,384)")


def _prefill_at(inputs: Inputs, shape: Shape, w: Workload, hit: float, engram_gpus: int,
                chunk: int) -> Candidate:
    ctx = context(inputs, engram_gpus, "prefill", shape)
    new, cached = w.isl * (1 - hit), w.isl * hit
    step = prefill_step(ctx, shape, chunk, max(1.0, new), cached).us
    transfer = serving.kv_transfer_us(ctx, w.isl, inputs.system.form == "nvl72")

    def ttft(rho: float, q: float) -> float:
        return serving.ttft_us(step, chunk, new, w.isl_cv, transfer, rho, q)

    utilisation = _utilisation_for_ttft(inputs, ttft)
    if utilisation <= 0:
        return Candidate("prefill", shape, 0.0, PREFILL_MAX_SEQS, chunk, step,
                         f"an idle prefill takes {ttft(0.0, 0.9) / 1e3:.0f} ms to the first "
                         "token, over the TTFT SLO")
    rps = shape.dp * chunk / step * 1e6 / max(1.0, new) * utilisation
    return Candidate("prefill", shape, rps, PREFILL_MAX_SEQS, chunk, step, "")


def _utilisation_for_ttft(inputs: Inputs, ttft) -> float:
    """Highest prefill utilisation whose TTFT (with queueing) stays within the SLO."""
    slo = inputs.deployment.spec.slo
    best = MAX_UTILISATION
    for limit_ms, q in ((slo.ttft_ms_p50, 0.5), (slo.ttft_ms_p90, 0.9)):
        if limit_ms is None:
            continue
        if ttft(0.0, q) > limit_ms * 1e3:
            return 0.0
        lo, hi = 0.0, MAX_UTILISATION
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ttft(mid, q) <= limit_ms * 1e3 else (lo, mid)
        best = min(best, lo)
    return best


def searched_kinds(inputs: Inputs, role: str, mode: str) -> tuple[str, ...]:
    """Shape families the solver searches (SYSTEM.md engine shapes): MoE models serve prefill
    and high-concurrency decode data-parallel with wide expert parallelism (DEPn) and the
    lowest-latency decode tensor-parallel (TPn); dense models are tensor-parallel throughout.
    Other families (TPnEPn) are used when pinned."""
    if not inputs.model.spec.moe:
        return ("TP",)
    if role == "decode" and mode == "latency":
        return ("TP",)
    return ("DEP",)


def searched_names(inputs: Inputs, role: str, mode: str, recipe_ok: bool = True
                   ) -> list[str] | None:
    """Shape names to search for `role`: the deployment's objective.shapes, else the system's
    engine shapes from the catalog (MoE models, while `recipe_ok`), else None (every shape
    of the family)."""
    user = getattr(inputs.deployment.spec.objective.shapes, role)
    if user is not None:
        return user
    recipe = inputs.system.engine_shapes
    if recipe is None or not inputs.model.spec.moe or not recipe_ok:
        return None
    if role == "decode" and mode == "latency":
        return recipe.latency.value
    return getattr(recipe, role).value


def _searched(inputs: Inputs, shapes: list[Shape], role: str, mode: str,
              recipe_ok: bool) -> list[Shape]:
    names = searched_names(inputs, role, mode, recipe_ok)
    if names is not None:
        return [s for s in shapes if s.name in names]
    return [s for s in shapes if s.kind in searched_kinds(inputs, role, mode)]


def uses_recipe(inputs: Inputs) -> bool:
    """Whether the catalog's engine shapes narrow the search for this deployment."""
    shapes = inputs.deployment.spec.objective.shapes
    return inputs.system.engine_shapes is not None and inputs.model.spec.moe is not None \
        and (shapes.prefill is None or shapes.decode is None)


def candidates(inputs: Inputs, pre: Precheck, w: Workload, hit: float, mode: str,
               prefill_gpus_guess: int, recipe_ok: bool = True) -> list[Candidate]:
    """Usable and unusable candidates (the latter with `why_not`), in a stable order."""
    out = []
    for shape in _searched(inputs, pre.feasible("prefill"), "prefill", mode, recipe_ok):
        out.append(prefill_candidate(inputs, shape, w, hit, prefill_gpus_guess))
    decode_shapes = _searched(inputs, pre.feasible("decode"), "decode", mode, recipe_ok)
    for shape in decode_shapes:
        out.append(decode_candidate(inputs, shape, w, 1 if mode == "latency" else None))
    return out
