"""What one engine instance sustains at the SLO: the numbers the count model trades.

Decode: the largest batch per DP rank whose per-user rate still meets the SLO (P50 and P90),
capped by the KV that fits; capacity = requests/s at that batch. Prefill: new tokens/s at the
chunk size, divided by the new tokens per request, held below a utilisation that keeps TTFT
within its SLO. Used by the solver's candidates and by `rackc predict` of a pinned layout
(which needs no solver).
"""

import math
from dataclasses import dataclass, replace

from compiler import routes
from compiler.load import Inputs
from compiler.perf import handoff, serving
from compiler.perf.predict import (
    MAX_DECODE_BATCH,
    PREFILL_CHUNK_TOKENS,
    PREFILL_MAX_SEQS,
    UNBOUNDED_CONCURRENCY,
    Layout,
    aggregated_budget,
    context,
    kv_capacity_requests,
    predict_layout,
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
    # the best each SLO metric can be on this shape (decode: at batch 1; prefill: idle), for
    # the diagnostic of an SLO nothing meets
    reach: tuple[tuple[str, float], ...] = ()
    # the SLO requirements it cannot meet (compiler/solve/build.py keys: "slo", the per-user
    # rate; "ttft"): unused while one of them holds; none, with no supply, is never usable
    misses: tuple[str, ...] = ()
    # one instance in a routing group whose every hand-off crosses NVLink domains, over the
    # NICs (compiler.routes SHARED); None: as `requests_per_s` (no such group on this hardware)
    remote_requests_per_s: float | None = None

    @property
    def remote(self) -> float:
        """Requests/s with every hand-off across domains (compiler/solve/locality.py)."""
        return self.requests_per_s if self.remote_requests_per_s is None \
            else min(self.requests_per_s, self.remote_requests_per_s)


def _meets(ctx: PerfContext, shape: Shape, batch: int, kv_len: float, w: Workload,
           p50: float | None, p90: float | None) -> tuple[bool, float]:
    step = decode_step(ctx, shape, batch, kv_len)
    r50, r90 = serving.per_user_rates(ctx, step, batch, w)
    return (p50 is None or r50 >= p50) and (p90 is None or r90 >= p90), step.us


def decode_candidate(inputs: Inputs, shape: Shape, w: Workload, batch_cap: int | None,
                     enforce_slo: bool = True) -> Candidate:
    slo = inputs.resolved.slo
    ctx = context(inputs, shape.gpus, "decode", shape)
    kv = kv_capacity_requests(inputs, shape, "decode", shape.gpus, w)
    cap = min(MAX_DECODE_BATCH, kv) if batch_cap is None else min(kv, batch_cap)
    stated = inputs.resolved.stated_concurrency
    if batch_cap is None and stated:  # a rank never holds more than its share of those
        cap = min(cap, max(1, math.ceil(stated / shape.dp)))
    kv_len = w.isl + w.osl / 2
    p50, p90 = slo.tokens_per_s_per_user_p50, slo.tokens_per_s_per_user_p90
    if not enforce_slo:
        p50 = p90 = None
    if cap < 1:
        return Candidate("decode", shape, 0.0, 0, 0, 0.0, "no room for one request's KV")
    ok, step = _meets(ctx, shape, 1, kv_len, w, p50, p90)
    one = decode_step(ctx, shape, 1, kv_len)
    r50, r90 = serving.per_user_rates(ctx, one, 1, w)
    reach = (("tokens_per_s_per_user_p50", r50), ("tokens_per_s_per_user_p90", r90))
    if not ok:
        rate = 1e6 * ctx.acceptance / step
        return Candidate("decode", shape, 0.0, 0, 0, step,
                         f"{rate:.0f} tokens/s per user at batch 1, below the SLO", "", reach,
                         ("slo",))
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
    rps, remote = _taken_in(inputs, ctx, shape, w, rps)
    within = f"the KV that fits and the stated concurrency ({cap} requests)" if stated \
        and batch_cap is None else f"the KV that fits ({cap} requests)"
    why = (f"largest batch per DP rank whose per-user rate meets the SLO, within {within}"
           if enforce_slo else within)
    return Candidate("decode", shape, rps, lo, lo * (1 + ctx.draft_tokens), step, "", why, reach,
                     remote_requests_per_s=remote)


def _taken_in(inputs: Inputs, ctx: PerfContext, shape: Shape, w: Workload, rps: float
              ) -> tuple[float, float | None]:
    """A decode instance's requests/s within what its NICs take in (compiler.perf.handoff):
    at the hardware's own share of crossing hand-offs, and where routing groups follow NVLink
    domains, with every hand-off crossing (None otherwise)."""
    def within(cross: float) -> float:
        return min(rps, handoff.nic_requests_per_us(ctx, shape.gpus, w.isl, cross) * 1e6)

    return within(routes.base_cross(inputs)), within(1.0) if routes.by_domain(inputs) else None


def prefill_candidate(inputs: Inputs, shape: Shape, w: Workload, hit: float,
                      engram_gpus: int) -> Candidate:
    """The prefill chunk (tokens per rank per step) with the most requests/s within the TTFT
    SLO: smaller chunks finish sooner, larger ones use the GPU better."""
    options = [_prefill_at(inputs, shape, w, hit, engram_gpus, chunk)
               for chunk in PREFILL_CHUNKS]
    best = max(options, key=lambda c: (c.requests_per_s, c.max_batched_tokens))
    idle = tuple((key, min(dict(c.reach)[key] for c in options))
                 for key in ("ttft_ms_p50", "ttft_ms_p90"))
    best = replace(best, reach=idle, remote_requests_per_s=_remote(
        inputs, shape, w, hit, engram_gpus, best.max_batched_tokens))
    sizes = ", ".join(f"{c:,}" for c in PREFILL_CHUNKS)
    return replace(best, why=f"of prefill chunks {sizes} tokens per rank, "
                             f"{best.max_batched_tokens:,} sustains the most requests/s within "
                             "the TTFT SLO (REFERENCE-DATA.md C1 V2 runs 16,384)")


def _remote(inputs: Inputs, shape: Shape, w: Workload, hit: float, engram_gpus: int,
            chunk: int, max_seqs: int = PREFILL_MAX_SEQS) -> float | None:
    """A prefill instance's requests/s at its chunk with every hand-off across NVLink
    domains, where routing groups follow them (compiler.routes); None elsewhere."""
    if not routes.by_domain(inputs):
        return None
    return _prefill_at(inputs, shape, w, hit, engram_gpus, chunk, max_seqs, 1.0).requests_per_s


def _prefill_at(inputs: Inputs, shape: Shape, w: Workload, hit: float, engram_gpus: int,
                chunk: int, max_seqs: int = PREFILL_MAX_SEQS,
                cross: float | None = None) -> Candidate:
    """One prefill instance at `chunk` tokens per rank; `cross`: the share of its hand-offs
    that leave its NVLink domain over its GPUs' NICs (default: the hardware's,
    compiler.routes.base_cross), which limits its requests/s and, as the NICs get busy, adds
    to TTFT (compiler.perf.handoff)."""
    ctx = context(inputs, engram_gpus, "prefill", shape)
    cross = routes.base_cross(inputs) if cross is None else cross
    new, cached = w.isl * (1 - hit), w.isl * hit
    tokens = serving.prefill_step_tokens(chunk, max_seqs, new)
    chunk_step = prefill_step(ctx, shape, tokens, max(1.0, new), cached)
    step = chunk_step.us
    full = shape.dp * tokens / step / max(1.0, new)  # requests per us, every rank busy

    def ttft(rho: float, q: float) -> float:
        load = handoff.nic_load(ctx, rho * full, shape.gpus, w.isl, cross)
        return serving.ttft_us(step, tokens, new, w.isl_cv,
                               handoff.handoff_us(ctx, w.isl, cross, load), rho, q,
                               chunk_step.fill_us, isl=w.isl)

    nics = handoff.nic_requests_per_us(ctx, shape.gpus, w.isl, cross) / full
    utilisation = _utilisation_for_ttft(inputs, ttft, min(MAX_UTILISATION, nics))
    reach = (("ttft_ms_p50", ttft(0.0, 0.5) / 1e3), ("ttft_ms_p90", ttft(0.0, 0.9) / 1e3))
    if utilisation <= 0:
        return Candidate("prefill", shape, 0.0, max_seqs, chunk, step,
                         f"an idle prefill takes {ttft(0.0, 0.9) / 1e3:.0f} ms to the first "
                         "token, over the TTFT SLO", "", reach, ("ttft",))
    return Candidate("prefill", shape, full * 1e6 * utilisation, max_seqs, chunk, step, "", "",
                     reach)


def _utilisation_for_ttft(inputs: Inputs, ttft, top: float = MAX_UTILISATION) -> float:
    """Highest prefill utilisation up to `top` whose TTFT (with queueing) stays within the
    SLO."""
    slo = inputs.resolved.slo
    best = top
    for limit_ms, q in ((slo.ttft_ms_p50, 0.5), (slo.ttft_ms_p90, 0.9)):
        if limit_ms is None:
            continue
        if ttft(0.0, q) > limit_ms * 1e3:
            return 0.0
        lo, hi = 0.0, top
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ttft(mid, q) <= limit_ms * 1e3 else (lo, mid)
        best = min(best, lo)
    return best


def aggregated_candidate(inputs: Inputs, shape: Shape, w: Workload,
                         max_batch: int | None = None, max_batched_tokens: int | None = None,
                         enforce_slo: bool = True, search_up_to: int | None = None
                         ) -> Candidate:
    """One aggregated instance (prefill chunks interleaved with decode steps): the largest
    batch per DP rank at which, under unbounded demand, its per-user rate and TTFT still meet
    the SLO (`max_batch` given or `enforce_slo` off: that batch, or what the KV holds), and
    the requests/s it then sustains, from the serving model's aggregated prediction.
    `search_up_to`: a batch known to miss the SLO beyond (the shape's decode-only batch)."""
    slo = inputs.resolved.slo
    kv = decode_candidate(inputs, shape, w, max_batch, enforce_slo=False)
    if kv.max_batch < 1:
        return Candidate("aggregated", shape, 0.0, 0, 0, 0.0, kv.why_not)
    demand = replace(w, concurrency=UNBOUNDED_CONCURRENCY)
    draft = kv.max_batched_tokens // kv.max_batch - 1

    def at(batch: int) -> tuple[Candidate, bool]:
        tokens = max_batched_tokens or aggregated_budget(batch * (1 + draft))
        p = predict_layout(inputs, [Layout("aggregated", shape, 1, batch, tokens)], demand)
        rate_ok = all(limit is None or value >= limit for value, limit in (
            (p.tokens_per_s_per_user_p50, slo.tokens_per_s_per_user_p50),
            (p.tokens_per_s_per_user_p90, slo.tokens_per_s_per_user_p90)))
        ttft_ok = all(limit is None or value <= limit for value, limit in (
            (p.ttft_ms_p50, slo.ttft_ms_p50), (p.ttft_ms_p90, slo.ttft_ms_p90)))
        misses = (() if rate_ok else ("slo",)) + (() if ttft_ok else ("ttft",))
        c = Candidate("aggregated", shape, p.requests_per_s, batch, tokens,
                      p.tpot_ms_p50 * 1e3, "", misses=misses)
        return c, not misses

    if max_batch is not None or not enforce_slo:
        c, _ = at(kv.max_batch)
        why = f"{max_batch} requests per rank, pinned" if max_batch else kv.why
        return replace(c, why=why)
    first, ok = at(1)
    if not ok:
        return replace(first, requests_per_s=0.0, why_not=(
            f"{first.requests_per_s:.2f} requests/s at batch 1 already misses the SLO"))
    # the largest batch meeting the SLO (rates fall as it grows)
    lo, hi, best = 1, min(kv.max_batch, search_up_to or kv.max_batch), first
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c, ok = at(mid)
        if ok:
            lo, best = mid, c
        else:
            hi = mid - 1
    return replace(best, why=f"largest batch per DP rank whose per-user rate and TTFT meet "
                             f"the SLO with prompts interleaved, within the KV that fits "
                             f"({kv.max_batch} requests)")


def pinned_candidate(inputs: Inputs, role: str, shape: Shape, w: Workload, hit: float,
                     guess: int, max_batch: int | None = None,
                     max_batched_tokens: int | None = None) -> Candidate:
    """A pinned entry's batch limits: the user's where given; else the rule the solver's
    candidates follow (prefill at its best chunk, decode and aggregated at the largest batch
    that meets the SLO), so that a layout pinned as compile chose it gets the same limits;
    where even one request misses the SLO, the largest batch its KV holds."""
    if role == "prefill":
        chosen = None if max_batched_tokens else prefill_candidate(inputs, shape, w, hit, guess)
        if chosen is not None and not max_batch:
            return chosen
        chunk = max_batched_tokens or chosen.max_batched_tokens
        seqs = max_batch or PREFILL_MAX_SEQS
        c = _prefill_at(inputs, shape, w, hit, guess, chunk, seqs)
        pinned = ([f"{chunk:,} tokens per rank"] if max_batched_tokens else []) \
            + ([f"{max_batch} requests per step"] if max_batch else [])
        return replace(c, why=", ".join(pinned) + ", pinned",
                       remote_requests_per_s=_remote(inputs, shape, w, hit, guess, chunk, seqs))
    if role == "aggregated":
        c = aggregated_candidate(inputs, shape, w, max_batch, max_batched_tokens)
        if c.requests_per_s <= 0 and c.max_batch:
            c = aggregated_candidate(inputs, shape, w, max_batch, max_batched_tokens,
                                     enforce_slo=False)
        return c
    c = decode_candidate(inputs, shape, w, max_batch, enforce_slo=max_batch is None)
    if c.requests_per_s <= 0:
        c = decode_candidate(inputs, shape, w, max_batch, enforce_slo=False)
    tokens = max_batched_tokens or c.max_batched_tokens
    why = f"{max_batch} requests per rank, pinned" if max_batch else c.why
    return Candidate(role, c.shape, c.requests_per_s, c.max_batch, tokens, c.step_us,
                     c.why_not, why, remote_requests_per_s=c.remote_requests_per_s)


def layout_goodput(inputs: Inputs, layouts: list[Layout], w: Workload, hit: float,
                   guess: int, cross: float | None = None) -> float:
    """Requests/s a layout (one routing group, `cross` of whose hand-offs cross NVLink
    domains: default the hardware's, compiler.routes) sustains with its batch limits, by the
    candidates' arithmetic: the smaller of prefill and decode supply, or the aggregated
    instances' sum (at SCALE's resolution, rounded down: compiler/solve/problem.py). Compile
    and a pinned predict both cap admission here, so one layout gets one prediction whichever
    command made it."""
    base = routes.base_cross(inputs)
    cross = base if cross is None else cross
    supply: dict[str, float] = {}
    for x in layouts:
        if x.role == "prefill":
            c = _prefill_at(inputs, x.shape, w, hit, guess,
                            x.max_batched_tokens or PREFILL_CHUNK_TOKENS,
                            x.max_batch or PREFILL_MAX_SEQS, cross)
        elif x.role == "decode":
            c = decode_candidate(inputs, x.shape, w, x.max_batch, enforce_slo=False)
            c = replace(c, requests_per_s=c.remote if cross > base else c.requests_per_s)
        else:
            c = aggregated_candidate(inputs, x.shape, w, x.max_batch, x.max_batched_tokens,
                                     enforce_slo=False)
        supply[x.role] = supply.get(x.role, 0.0) + x.count * c.requests_per_s
    value = supply["aggregated"] if "aggregated" in supply else \
        min(supply.get("prefill", 0.0), supply.get("decode", 0.0))
    return math.floor(value * 1e6) / 1e6
