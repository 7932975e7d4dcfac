"""What one engine instance sustains at the SLO: the numbers the count model trades.

Decode: the largest batch per DP rank whose per-user rate still meets the SLO (P50 and P90),
capped by the KV that fits; capacity = requests/s at that batch. Prefill: new tokens/s at the
chunk size, divided by the new tokens per request, held below a utilisation that keeps TTFT
within its SLO. Used by the solver's candidates and by `rackc predict` of a pinned layout
(which needs no solver).
"""

from dataclasses import dataclass, replace

from compiler.load import Inputs
from compiler.perf import serving
from compiler.perf.predict import (
    MAX_DECODE_BATCH,
    PREFILL_CHUNK_TOKENS,
    PREFILL_MAX_SEQS,
    aggregated_budget,
    context,
    kv_capacity_requests,
)
from compiler.perf.serving import MAX_UTILISATION, Workload
from compiler.perf.step import PerfContext, decode_step, prefill_step
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
    kv = kv_capacity_requests(inputs, shape, "decode", shape.gpus, w)
    cap = min(MAX_DECODE_BATCH, kv) if batch_cap is None else min(kv, batch_cap)
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
    # a request holds its slot for its decode steps, and at least the one that takes it in
    rps = shape.dp * lo / (max(1.0, serving.decode_steps(w, ctx)) * step) * 1e6
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
    chunk_step = prefill_step(ctx, shape, chunk, max(1.0, new), cached)
    step = chunk_step.us
    transfer = serving.kv_transfer_us(ctx, w.isl, inputs.system.form == "nvl72")

    def ttft(rho: float, q: float) -> float:
        return serving.ttft_us(step, chunk, new, w.isl_cv, transfer, rho, q, chunk_step.fill_us,
                               isl=w.isl)

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


def pinned_candidate(inputs: Inputs, role: str, shape: Shape, w: Workload, hit: float,
                     guess: int, max_batch: int | None = None,
                     max_batched_tokens: int | None = None) -> Candidate:
    """A pinned entry's batch limits: the user's where given; else prefill at its best chunk,
    decode (and aggregated) at the largest batch its KV holds, the SLO not enforced."""
    if role == "prefill":
        c = _prefill_at(inputs, shape, w, hit, guess, max_batched_tokens) \
            if max_batched_tokens else prefill_candidate(inputs, shape, w, hit, guess)
        if max_batched_tokens:
            c = replace(c, why=f"{max_batched_tokens:,} tokens per rank, pinned")
        return replace(c, max_batch=max_batch) if max_batch else c
    c = decode_candidate(inputs, shape, w, max_batch, enforce_slo=False)
    tokens = max_batched_tokens or c.max_batched_tokens
    if role == "aggregated" and not max_batched_tokens:
        tokens = aggregated_budget(c.max_batched_tokens)
    why = f"{max_batch} requests per rank, pinned" if max_batch else c.why
    return Candidate(role, c.shape, c.requests_per_s, c.max_batch, tokens, c.step_us,
                     c.why_not, why)
