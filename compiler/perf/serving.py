"""Serving model: from step times to what users and operators see.

Closed loop: `concurrency` requests are in flight; each waits for prefill (queueing at the
prefill ranks), moves its KV to a decode rank, then decodes `osl` tokens at the per-user rate
of its decode batch. The request rate, decode batch and prefill utilisation are solved as one
fixed point. Aggregated instances interleave prefill chunks with decode steps.

TTFT follows the client of a fixed-concurrency benchmark: each of the clients sends its next
request when its last one finishes. With equal lengths the requests prefilled in one step
decode together and come back together, so a rank's clients arrive as a burst and are
prefilled together (one step of all their tokens, up to the budget); a spread of lengths
de-synchronises them (`arrival_sync`), and the de-synchronised part queues as before. A
prompt is costed at the token count of the step it is prefilled in, not at a full chunk's
efficiency, and the engine's per-request work (`request_overhead_us`) comes on top.
"""

import math
from dataclasses import dataclass, field

from compiler.perf import handoff
from compiler.perf.step import PerfContext, StepTime, decode_step, prefill_step
from compiler.shapes import Shape

Z90 = 1.2816  # standard normal 90th percentile
MAX_UTILISATION = 0.95  # prefill ranks are never planned beyond this utilisation
SETTLED = 1e-6  # fixed points stop when rate and batch move by less than this share
# What the engine adds to a request's first token besides prefill (no public measurement of
# vLLM 0.33 / Dynamo 1.6.1 at this granularity; benchmarks/README.md lists them):
REQUEST_OVERHEAD_US = 3000.0  # assumed: HTTP in, the frontend's preprocessing and routing, the
# engine core's scheduling of the request, the first token's detokenisation and SSE write
TOKENISE_US_PER_TOKEN = 1.0  # assumed: a fast (Rust) tokenizer at ~1M tokens/s on one core
UNBOUNDED_CONCURRENCY = 1e9  # throughput mode without a stated concurrency: demand unbounded


@dataclass(frozen=True)
class Workload:
    isl: float
    osl: float
    isl_cv: float
    osl_cv: float
    concurrency: float
    prefix_reuse: float
    shared_prefix_tokens: float
    sessions: float

    @property
    def closed_loop(self) -> bool:
        """A stated number of clients, each sending its next request when its last one ends;
        without one (unbounded demand, admitted at the goodput) arrivals are independent."""
        return self.concurrency < UNBOUNDED_CONCURRENCY


@dataclass(frozen=True)
class Group:
    """`count` identical instances of one role and shape, with their batch limits per DP rank."""

    role: str  # prefill | decode | aggregated
    shape: Shape
    count: int
    max_batch: int
    max_batched_tokens: int
    ctx: PerfContext

    @property
    def ranks(self) -> int:
        return self.count * self.shape.dp

    @property
    def gpus(self) -> int:
        return self.count * self.shape.gpus


@dataclass
class Prediction:
    output_tokens_per_s_per_gpu: float
    total_tokens_per_s_per_gpu: float
    tokens_per_s_per_user_p50: float
    tokens_per_s_per_user_p90: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    tpot_ms_p50: float
    prefix_hit_rate: float
    tokens_per_s_per_kw: float
    requests_per_s: float
    prefill_utilisation: float
    instances: list[dict] = field(default_factory=list)
    breakdown: dict[str, dict[str, float]] = field(default_factory=dict)


def prefix_hit_rate(w: Workload, pool_tokens: float) -> float:
    """Share of input tokens served from cache: the reusable share, scaled down when the
    working set (sessions x their distinct prefix) does not fit in the pool."""
    working_set = w.sessions * w.shared_prefix_tokens
    if w.prefix_reuse <= 0 or working_set <= 0:
        return 0.0
    return w.prefix_reuse * min(1.0, pool_tokens / working_set)


def decode_time(g: Group, batch: float, kv_len: float) -> StepTime:
    return decode_step(g.ctx, g.shape, max(batch, 1e-3), kv_len)


def prefill_time(g: Group, tokens: int, new: float, cached: float) -> StepTime:
    return prefill_step(g.ctx, g.shape, tokens, max(1.0, new), cached)


def ttft_us(chunk_us: float, chunk_tokens: int, new: float, isl_cv: float, transfer_us: float,
            rho: float, q: float, fill_us: float = 0.0, max_wait_us: float = math.inf,
            own_us: float | None = None, sync: float = 0.0, isl: float | None = None,
            cycle_floor_us: float = 0.0) -> float:
    """Time to first token at quantile q: the request's prefill chunks (a long prompt at the
    P90 of lengths needs more), the KV hand-off, waiting at a prefill rank and the engine's
    per-request work. Through pipeline stages the chunks follow each other one slowest stage
    (`chunk_us`) apart and the last one still passes the other stages (`fill_us`): n chunks
    take (n + pp - 1) stage turns where stages are equal, so a prompt shorter than pp chunks
    leaves stages idle. `own_us`: the request's prefill (at quantile q's length) at the size
    of the step it shares with the prompts that arrive with it (default: its chunks' share of
    full chunks, at least one). The queue's unit of
    service is a request's hold on the rank: its chunks (vLLM schedules prompts first come,
    first served), at least one step; a closed loop of clients bounds the wait
    (`max_wait_us`), and its synchronised share waits as `closed_loop_wait` says."""
    spread = 1 + (Z90 * isl_cv if q > 0.5 else 0.0)
    hold = request_hold_us(chunk_us, chunk_tokens, new)
    own = request_hold_us(chunk_us, chunk_tokens, new * spread) if own_us is None else own_us
    wait = closed_loop_wait(own, cycle_floor_us, sync,
                            min(queue_wait(rho, hold, q), max_wait_us))
    return own + fill_us + transfer_us + wait + request_overhead_us(new if isl is None else isl)


def request_overhead_us(isl: float) -> float:
    """The engine's work on a request outside the GPU steps before its first token arrives:
    the fixed part (HTTP, routing, scheduling, detokenising and sending the token) and
    tokenising the whole prompt (cached prefix included)."""
    return REQUEST_OVERHEAD_US + TOKENISE_US_PER_TOKEN * max(0.0, isl)


def arrival_sync(service_us: float, cycle_sd_us: float, closed_loop: bool = True) -> float:
    """Share of a rank's other clients whose prompts arrive within one prefill of a request's
    own. Requests prefilled together decode together and come back together when their
    lengths are equal (share 1); with a spread of lengths a group comes back over a window of
    sqrt(12) standard deviations of its cycle time (the width of a uniform spread with that
    deviation), of which one prefill catches `service_us` / window. Independent arrivals
    (no closed loop) are not synchronised."""
    if not closed_loop:
        return 0.0
    window = math.sqrt(12.0) * cycle_sd_us
    return 1.0 if window <= service_us else service_us / window


def prefill_step_tokens(budget: int, max_seqs: int, new: float) -> int:
    """Prompt tokens a prefill step holds at most: the token budget
    (--max-num-batched-tokens), or `max_seqs` whole prompts where they are shorter, since the
    scheduler runs at most --max-num-seqs requests at once (vLLM v1/core/sched/scheduler.py:
    a waiting request is admitted only while len(running) < max_num_seqs)."""
    return max(1, min(budget, math.ceil(max_seqs * max(new, 1.0))))


def co_batched_tokens(clients_per_rank: float, new: float, budget: int, sync: float) -> float:
    """Prompt tokens in the step that prefills a request: its own (up to the token budget)
    and those of the rank's other clients that arrive with it."""
    others = max(0.0, clients_per_rank - 1.0) * sync
    return min(float(budget), max(1.0, new) * (1.0 + others))


def request_hold_us(chunk_us: float, chunk_tokens: int, new: float) -> float:
    """How long a prompt of `new` tokens holds a prefill rank: its share of the token budget's
    steps, at least one step."""
    return chunk_us * max(1.0, new / chunk_tokens)


def queue_wait(rho: float, service_us: float, q: float) -> float:
    """Waiting time at quantile q of an M/M/1 queue with utilisation rho (a safe upper shape
    for the prefill queue): P(W > t) = rho * exp(-(1 - rho) t / s)."""
    if rho <= 1 - q:
        return 0.0
    rho = min(rho, 0.999)
    return service_us * math.log(rho / (1 - q)) / (1 - rho)


class PrefillAt:
    """Prefill steps of one group at the token count they really hold (memoised to three
    significant digits, so a fixed point does not recompute them; a full chunk exactly, as
    the solver's candidates cost it)."""

    def __init__(self, g: Group, new: float, cached: float, chunk_us: float, full: int):
        self.g, self.new, self.cached = g, new, cached
        self.seen: dict[int, float] = {}
        self.chunk_us, self.full = chunk_us, full

    def step_us(self, tokens: float) -> float:
        if tokens == self.full:
            return self.chunk_us
        key = max(1, int(float(f"{max(1.0, tokens):.3g}")))
        if key not in self.seen:
            self.seen[key] = prefill_time(self.g, key, self.new, self.cached).us
        return self.seen[key]

    def per_token_us(self, tokens: float) -> float:
        return self.step_us(tokens) / max(1.0, tokens)

    def own_us(self, tokens: float, new: float | None = None) -> float:
        """A prompt's own prefill (`new` tokens, default the group's) when each of its steps
        holds `tokens` prompt tokens: one step when it shares it, its chunks' steps when it
        is longer than a step."""
        new = self.new if new is None else new
        return self.step_us(tokens) * max(1.0, new / max(1.0, tokens))


def closed_loop_wait(own_us: float, cycle_floor_us: float, sync: float,
                     queue_us: float) -> float:
    """A request's wait before its own prefill: the de-synchronised share of arrivals
    (1 - `sync`) finds the rank busy as a queue would (`queue_us`); the synchronised share is
    prefilled with its burst and waits only where the burst cannot come back sooner than its
    rank prefills them all (in a closed loop each client's cycle, TTFT + decode, is at least
    the rank's prompt work for every client once: `cycle_floor_us`), at most as long as the
    queue would hold it (the floor binds near saturation)."""
    burst = min(max(0.0, cycle_floor_us - own_us), queue_us)
    return (1.0 - sync) * queue_us + sync * burst


@dataclass(frozen=True)
class State:
    rate: float  # requests per microsecond, whole deployment
    batch: float  # decode requests per DP rank


class _Disaggregated:
    """The prefill and decode groups of one routing group of a P/D layout under workload `w`:
    their steps (decode memoised by batch) and a request's TTFT at a rate, with the hand-off
    that `cross` of its requests make across NVLink domains over the NICs
    (compiler.perf.handoff)."""

    def __init__(self, prefill: list[Group], decode: list[Group], w: Workload, hit: float,
                 cross: float):
        self.prefill, self.decode, self.w, self.cross = prefill, decode, w, cross
        self.ctx = decode[0].ctx
        self.kv_len = w.isl + w.osl / 2
        self.cached, self.new = w.isl * hit, w.isl * (1 - hit)
        new = self.new
        self.p_tokens = {id(g): prefill_step_tokens(g.max_batched_tokens, g.max_batch, new)
                         for g in prefill}
        self.p_steps = {id(g): prefill_time(g, self.p_tokens[id(g)], new, self.cached)
                        for g in prefill}
        self.p_cap = sum(g.ranks * self.p_tokens[id(g)] / self.p_steps[id(g)].us
                         for g in prefill)  # prompt tokens per us
        self.d_ranks = sum(g.ranks for g in decode)
        self.max_slots = sum(g.ranks * g.max_batch for g in decode)
        self.seen: dict[float, tuple[float, dict[int, StepTime]]] = {}
        self.p_gpus = sum(g.gpus for g in prefill)
        # the NICs carry at most this many requests per us of hand-offs, out and in
        self.nic_cap = min(handoff.nic_requests_per_us(self.ctx, self.p_gpus, w.isl, cross),
                           handoff.nic_requests_per_us(self.ctx, sum(g.gpus for g in decode),
                                                       w.isl, cross))
        self.p_ranks = sum(g.ranks for g in prefill)
        # the clients that cycle through a prefill rank: at most what decode holds at once
        self.clients = min(w.concurrency, self.max_slots) / max(self.p_ranks, 1)
        self.full = self.p_tokens[id(prefill[0])]
        self.at_size = PrefillAt(prefill[0], new, self.cached, self.p_steps[id(prefill[0])].us,
                                 self.full)

    def decode_at(self, batch: float) -> tuple[float, dict[int, StepTime]]:
        """The slowest decode group's step at `batch` per rank, and every group's."""
        if batch not in self.seen:
            steps = {id(g): decode_time(g, min(batch, g.max_batch), self.kv_len)
                     for g in self.decode}
            self.seen[batch] = max(s.us for s in steps.values()), steps
        return self.seen[batch]

    def utilisation(self, rate: float) -> float:
        return rate * self.new / self.p_cap if self.p_cap else 0.0

    def transfer(self, rate: float) -> float:
        """A request's hand-off at `rate` requests/us: its prefill GPUs' NICs that busy."""
        load = handoff.nic_load(self.ctx, rate, self.p_gpus, self.w.isl, self.cross)
        return handoff.handoff_us(self.ctx, self.w.isl, self.cross, load)

    def ttft(self, rate: float, q: float, decode_us: float) -> float:
        w, new, full, at_size = self.w, self.new, self.full, self.at_size
        rho = rate * new / self.p_cap if self.p_cap else 1.0
        step = self.p_steps[id(self.prefill[0])]
        hold = request_hold_us(step.us, full, new)
        # a closed loop: at most the other clients' prompts queue ahead, spread over the ranks
        ahead = max(0.0, w.concurrency - 1) / max(self.p_ranks, 1) * hold
        alone = at_size.own_us(min(new, full))
        sync = arrival_sync(alone, math.hypot(w.osl_cv * decode_us, w.isl_cv * alone),
                            w.closed_loop)
        tokens = co_batched_tokens(self.clients, new, full, sync)
        floor = at_size.per_token_us(tokens) * new * self.clients - decode_us
        # a prompt at quantile q's length, in a step with the others that arrive with it
        mine = new * (1 + (Z90 * w.isl_cv if q > 0.5 else 0.0))
        size = min(full, max(tokens, mine))
        return ttft_us(step.us, full, new, w.isl_cv, self.transfer(rate), rho, q,
                       step.fill_us, ahead, at_size.own_us(size, mine), sync, w.isl, floor)

    def rows(self, batch: float, steps: dict[int, StepTime]) -> list[dict]:
        return [group_row(g, batch, steps[id(g)], "decode_step_us") for g in self.decode] \
            + [_prefill_row(g, self.p_steps[id(g)], self.p_tokens[id(g)], self.new)
               for g in self.prefill]


def predict_disaggregated(prefill: list[Group], decode: list[Group], w: Workload,
                          hit: float, power_w: float, total_gpus: int,
                          rate_cap: float = float("inf"), cross: float = 0.0) -> Prediction:
    """One routing group's prediction. `rate_cap` (requests/us): the admission limit that
    keeps the SLO (the solver's goodput); requests beyond it wait outside the deployment.
    `cross`: the share of its hand-offs that cross NVLink domains (compiler.routes)."""
    pd = _Disaggregated(prefill, decode, w, hit, cross)
    ctx, new, d_ranks = pd.ctx, pd.new, max(pd.d_ranks, 1)
    top = max(g.max_batch for g in decode)
    state = State(rate=0.0, batch=min(w.concurrency / d_ranks, decode[0].max_batch))
    for _ in range(60):
        decode_us = decode_steps(w, ctx) * pd.decode_at(state.batch)[0]
        slots = pd.max_slots / decode_us if decode_us > 0 else float("inf")
        cap = min(pd.p_cap * MAX_UTILISATION / max(new, 1.0), slots, rate_cap, pd.nic_cap)
        rate = min(w.concurrency / (pd.ttft(state.rate, 0.5, decode_us) + decode_us), cap)
        batch = min(rate * decode_us / d_ranks, top)
        # a batch held at its limit is taken as is (no damping): its step is then reused
        nxt = State(0.5 * state.rate + 0.5 * rate,
                    batch if batch == top else 0.5 * state.batch + 0.5 * batch)
        settled = abs(nxt.rate - state.rate) <= SETTLED * max(rate, 1e-12)
        if settled and abs(nxt.batch - state.batch) <= SETTLED * max(batch, 1.0):
            break
        state = nxt
    _, steps = pd.decode_at(state.batch)
    slowest = max(steps.values(), key=lambda st: st.us)
    decode_us = decode_steps(w, ctx) * slowest.us
    ttft50 = pd.ttft(state.rate, 0.5, decode_us)
    held = held_back_us(w, state.rate, decode_us, ttft50, rate_cap)
    return finish(w, state, slowest, ttft50 + held, pd.ttft(state.rate, 0.9, decode_us) + held,
                  hit, power_w, total_gpus, ctx, pd.rows(state.batch, steps),
                  {"decode": steps[id(decode[0])].rounded(),
                   "prefill": pd.p_steps[id(prefill[0])].rounded()},
                  pd.utilisation(state.rate))


def held_back_us(w: Workload, rate: float, decode_us: float, ttft_us: float,
                 rate_cap: float, ranks: int = 1) -> float:
    """Time to first token that a closed loop's clients spend waiting inside the deployment
    beyond `ttft_us`: by Little's law each client's cycle, TTFT plus decode, is concurrency /
    rate, so where the rate stops at a physical limit (the prefill capacity, the decode
    slots) the cycle the steps do not fill is waiting (for a prefill rank, or in the engine's
    waiting queue for a --max-num-seqs slot); where the fixed point holds, nothing (the
    identity itself decides, so a fixed point that has not quite settled still keeps N
    requests in flight). At the admission cap (`rate_cap`, the goodput that keeps the SLO;
    the operating point admits no more) the rest wait outside, which TTFT at the operating
    point leaves out and W511 states. `rate` and `rate_cap` per rank of `ranks` that share
    the clients evenly."""
    if not w.closed_loop or rate <= 0 or rate >= rate_cap * (1 - 1e-3):
        return 0.0
    return max(0.0, w.concurrency / ranks / rate - decode_us - ttft_us)


def decode_steps(w: Workload, ctx: PerfContext) -> float:
    """Decode steps per request: the first output token comes from prefill, the other
    `osl - 1` from verification steps that each emit `acceptance` tokens."""
    return max(0.0, w.osl - 1) / ctx.acceptance


def decode_share(g: Group, batch: float, kv_len: float) -> StepTime:
    """The decode part of a step with `batch` requests decoding on average: below one, only
    that share of steps has a decode batch at all (OSL 1 has none)."""
    if batch >= 1:
        return decode_time(g, batch, kv_len)
    return decode_time(g, 1, kv_len).scaled(max(batch, 0.0))


def group_row(g: Group, batch: float, st: StepTime, key: str) -> dict:
    return {"role": g.role, "shape": g.shape.name, "count": g.count, "gpus": g.gpus,
            "batch": round(batch, 2), key: round(st.us, 1)}


def acceptance_cv(draft_tokens: int, acceptance: float, steps: float) -> float:
    """Spread of a request's mean tokens per step over `steps` verification steps, when each
    draft token is accepted with the same probability a (solved from the mean acceptance,
    E = (1 - a^(k+1)) / (1 - a)) until the first rejection."""
    if draft_tokens <= 0 or acceptance <= 1.0:
        return 0.0
    probs = tokens_per_step_pmf(draft_tokens, acceptance)
    mean = sum((j + 1) * p for j, p in enumerate(probs))
    var = sum((j + 1 - mean) ** 2 * p for j, p in enumerate(probs))
    return math.sqrt(var) / mean / math.sqrt(max(steps, 1.0))


def tokens_per_step_pmf(draft_tokens: int, acceptance: float) -> list[float]:
    """P(a verification step emits j + 1 tokens), j = 0..k: each of the k draft tokens is
    accepted with the same probability a until the first rejection, a solved from the mean
    E = (1 - a^(k+1)) / (1 - a) = `acceptance`."""
    k = draft_tokens
    if k <= 0 or acceptance <= 1.0:
        return [1.0]
    lo, hi = 0.0, 1.0
    for _ in range(60):  # E grows with a
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a ** i for i in range(k + 1)) < acceptance else (lo, a)
    return [a ** j * (1 - a) for j in range(k)] + [a ** k]


def per_user_rates(ctx: PerfContext, step: StepTime, batch: float, w: Workload
                   ) -> tuple[float, float]:
    """(P50, P90) tokens/s per user. Users of one batch share its step time; they differ by
    the luck of their speculative acceptance over their output, and by how much the batch's
    context mix stretches a step (only attention grows with context; a batch averages it)."""
    per_user = 1e6 * ctx.acceptance / step.us
    attention = (step.breakdown.get("attention", 0.0) + step.breakdown.get("indexer", 0.0)) \
        / step.us
    cv = math.hypot(acceptance_cv(ctx.draft_tokens, ctx.acceptance, decode_steps(w, ctx)),
                    w.isl_cv * attention / math.sqrt(max(batch, 1.0)))
    return per_user, per_user / (1 + Z90 * cv)


def _prefill_row(g: Group, st: StepTime, tokens: int, new: float) -> dict:
    prompt = request_hold_us(st.us, tokens, new) + st.fill_us
    row = {"role": g.role, "shape": g.shape.name, "count": g.count, "gpus": g.gpus,
           "chunk_tokens": g.max_batched_tokens, "prefill_step_us": round(st.us, 1),
           "prompt_us": round(prompt, 1)}
    if g.shape.pp > 1:
        row["pipeline_fill_us"] = round(st.fill_us, 1)
    return row


def finish(w: Workload, s: State, step: StepTime, ttft50: float, ttft90: float, hit: float,
            power_w: float, gpus: int, ctx: PerfContext, rows: list[dict],
            breakdown: dict, utilisation: float) -> Prediction:
    tpot = step.us / ctx.acceptance
    per_user, per_user_p90 = per_user_rates(ctx, step, s.batch, w)
    out_per_s = s.rate * 1e6 * w.osl
    total_per_s = s.rate * 1e6 * (w.isl + w.osl)
    return Prediction(
        output_tokens_per_s_per_gpu=round(out_per_s / gpus, 1),
        total_tokens_per_s_per_gpu=round(total_per_s / gpus, 1),
        tokens_per_s_per_user_p50=round(per_user, 2),
        tokens_per_s_per_user_p90=round(per_user_p90, 2),
        ttft_ms_p50=round(ttft50 / 1e3, 1),
        ttft_ms_p90=round(ttft90 / 1e3, 1),
        tpot_ms_p50=round(tpot / 1e3, 3),
        prefix_hit_rate=round(hit, 4),
        tokens_per_s_per_kw=round(total_per_s / (gpus * power_w / 1e3), 1),
        requests_per_s=round(s.rate * 1e6, 3),
        prefill_utilisation=round(utilisation, 4),
        instances=rows,
        breakdown=breakdown,
    )
