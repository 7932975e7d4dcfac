"""Aggregated serving: ranks that interleave chunked prefill with decode (vLLM's token budget).

Each step decodes the running batch and fills the rest of `max_batched_tokens` with prompt
chunks. A request's first token comes after ceil(new / free budget) such mixed steps of its own
prompt, plus its wait behind earlier prompts; then it decodes `osl - 1` tokens. Rate per rank,
decode batch and the rank's share of time spent prefilling are solved as one fixed point of the
closed loop (`concurrency` requests in flight), from the primitives of compiler.perf.serving.
"""

import math
from dataclasses import dataclass

from compiler.perf import routing
from compiler.perf.serving import (
    MAX_UTILISATION,
    SETTLED,
    Z90,
    Group,
    Prediction,
    PrefillAt,
    State,
    Workload,
    arrival_sync,
    closed_loop_wait,
    co_batched_tokens,
    decode_share,
    decode_steps,
    decode_time,
    finish,
    group_row,
    held_back_us,
    prefill_time,
    queue_wait,
    request_overhead_us,
)
from compiler.perf.step import StepTime


@dataclass(frozen=True)
class _Load:
    """An aggregated rank at one load (`State`: rate per rank, requests decoding)."""

    step: StepTime  # the mixed step as a decoding user sees it
    decode_us: float  # a request's decode time
    ttft50: float
    ttft90: float
    rho: float  # prefill utilisation
    limit: float  # the rate per rank its prefill capacity allows


class _MixedRank:
    """One aggregated rank of `groups` (identical ranks) under workload `w`."""

    def __init__(self, groups: list[Group], w: Workload, hit: float):
        g = self.g = groups[0]
        self.w, self.ctx = w, g.ctx
        self.cached, self.new = w.isl * hit, w.isl * (1 - hit)
        self.ranks = sum(x.ranks for x in groups)
        self.kv_len = w.isl + w.osl / 2
        self.chunk = prefill_time(g, g.max_batched_tokens, self.new, self.cached)
        self.per_token = self.chunk.us / g.max_batched_tokens  # us per prompt token, chunked
        # with data-parallel attention the ranks meet at every MoE layer, so a step lasts as
        # long as its busiest rank's prompt chunks; only the expert GEMMs are shared evenly
        self.spread = self.chunk.breakdown.get("moe_experts", 0.0) / g.max_batched_tokens \
            if g.shape.dp > 1 else self.per_token
        self.steps = decode_steps(w, self.ctx)
        self.clients = min(w.concurrency / self.ranks, g.max_batch)  # what a rank decodes
        self.at_size = PrefillAt(g, self.new, self.cached, self.chunk.us, g.max_batched_tokens)

    def at(self, s: State) -> _Load:
        g, new = self.g, self.new
        shared = decode_share(g, s.batch, self.kv_len)
        budget = max(1.0, g.max_batched_tokens - s.batch * (1 + self.ctx.draft_tokens))
        cost = self._cost_per_token(s, shared.us, budget)  # us of a step per prompt token
        busy = min(s.rate * new * cost, MAX_UTILISATION)  # share of time prefilling
        step = decode_time(g, max(s.batch, 1.0), self.kv_len)
        step.add("prefill_chunks", step.us * busy / (1 - busy))
        # the prefill server: up to `budget` prompt tokens per mixed step
        capacity = budget / (shared.us + budget * cost)  # prompt tokens per us
        rho = s.rate * new / capacity
        decode_us = self.steps * step.us
        ttft50, ttft90 = self._ttft(shared.us, budget, rho, decode_us)
        return _Load(step, decode_us, ttft50, ttft90, rho,
                     MAX_UTILISATION * capacity / max(new, 1.0))

    def _cost_per_token(self, s: State, shared_us: float, budget: float) -> float:
        """Prompt pieces (a prompt, or a budget's share of a longer one) per rank per step:
        those that arrive during a step (a step that carries a chunk lasts at least that
        chunk) and the backlog a busy rank builds (M/D/1's mean queue, rho^2 / 2(1 - rho)),
        at most `per_step` within the budget: ranks that all fill their budget wait for
        nobody, a light load waits for its busiest rank."""
        new = self.new
        mean_busy = min(s.rate * new * self.per_token, MAX_UTILISATION)
        step_us = max(shared_us / (1 - mean_busy), min(new, budget) * self.per_token)
        backlog = mean_busy ** 2 / (2 * (1 - mean_busy))
        pieces = s.rate * step_us * math.ceil(max(new, 1.0) / budget) + backlog
        per_step = int(budget // max(1.0, min(new, budget)))
        busiest = routing.busiest_of_capped(pieces, per_step, self.g.shape.dp)
        return self.spread + (self.per_token - self.spread) * busiest

    def _service(self, shared_us: float, budget: float, tokens: float,
                 step_tokens: float) -> float:
        """Mixed steps of a prompt of `tokens` whose steps each hold `step_tokens` prompt
        tokens, costed at that count (a lone short prompt is not a full chunk)."""
        size = min(step_tokens, budget)
        return math.ceil(max(tokens, 1.0) / budget) * shared_us \
            + max(tokens, size) * self.at_size.per_token_us(size)

    def _ttft(self, shared_us: float, budget: float, rho: float, decode_us: float
              ) -> tuple[float, float]:
        """TTFT at P50 and P90: a request's own mixed steps, its wait behind the prompts of
        its burst or its queue, and the engine's per-request work."""
        w, new = self.w, self.new

        def service(tokens: float, step_tokens: float) -> float:
            return self._service(shared_us, budget, tokens, step_tokens)

        alone = service(new, new)
        sync = arrival_sync(alone, math.hypot(w.osl_cv * decode_us, w.isl_cv * alone),
                            w.closed_loop)
        size = co_batched_tokens(self.clients, new, budget, sync)
        hold = service(new, budget)
        ahead = max(0.0, w.concurrency - 1) / self.ranks * hold  # a closed loop queues no more
        extra = request_overhead_us(w.isl)

        def ttft(q: float) -> float:
            mine = new * (1 + (Z90 * w.isl_cv if q > 0.5 else 0.0))  # quantile q's prompt
            own = service(mine, max(size, mine))
            wait = closed_loop_wait(service(new, size), service(new * self.clients, size)
                                    - decode_us, sync, min(queue_wait(rho, hold, q), ahead))
            return own + wait + extra

        return ttft(0.5), ttft(0.9)


def predict_aggregated(groups: list[Group], w: Workload, hit: float, power_w: float,
                       total_gpus: int, rate_cap: float = float("inf")) -> Prediction:
    """`rate_cap` (requests/us): the admission limit that keeps the SLO (the solver's
    goodput); requests beyond it wait outside the deployment."""
    rank = _MixedRank(groups, w, hit)
    g, ranks = rank.g, rank.ranks
    state = State(rate=0.0, batch=min(w.concurrency / ranks, g.max_batch))
    for _ in range(80):
        load = rank.at(state)
        slots = g.max_batch / load.decode_us if load.decode_us > 0 else float("inf")
        rate = min(w.concurrency / ranks / (load.ttft50 + load.decode_us), slots, load.limit,
                   rate_cap / ranks)
        batch = min(rate * load.decode_us, g.max_batch)
        nxt = State(0.5 * state.rate + 0.5 * rate, 0.5 * state.batch + 0.5 * batch)
        settled = abs(nxt.rate - state.rate) <= SETTLED * max(rate, 1e-12) \
            and abs(nxt.batch - state.batch) <= SETTLED * max(batch, 1.0)
        state = nxt
        if settled:
            break
    load = rank.at(state)
    held = held_back_us(w, state.rate, load.decode_us, load.ttft50, rate_cap / ranks, ranks)
    total = State(state.rate * ranks, state.batch)
    return finish(w, total, load.step, load.ttft50 + held, load.ttft90 + held, hit, power_w,
                  total_gpus, rank.ctx,
                  [group_row(x, state.batch, load.step, "decode_step_us") for x in groups],
                  {"decode": load.step.rounded(), "prefill": rank.chunk.rounded()}, load.rho)
