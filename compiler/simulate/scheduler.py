"""One engine instance as vLLM 0.33 schedules it (vllm/v1/core/sched/scheduler.py), per DP
rank, stepping in lockstep with its other ranks (data-parallel ranks meet at every MoE layer).

Per step and rank, as `Scheduler.schedule()` does: running requests first (each decodes
1 + k tokens), then prompt chunks first come, first served into what is left of
`max_num_batched_tokens` (chunked prefill; a long prompt continues next step), new requests only
while `max_num_seqs` allows and their KV fits, and none in a step that preempted. When the KV
cache cannot hold the running requests' next tokens, the most recently admitted one is
preempted (`self.running[-1]` under FCFS): its blocks are freed and it is recomputed from its
prompt and what it had generated when it comes back, ahead of the waiting ones
(`waiting.prepend_request`).

A request's decode steps are drawn when it is made (`decode_steps`): each step emits 1 + j
tokens with the acceptance distribution of compiler.perf.serving.tokens_per_step_pmf, so the
instance only counts steps and a request finishes at a known step index.
"""

import heapq
import math
from collections import deque

import numpy as np

from compiler.perf.serving import tokens_per_step_pmf
from compiler.simulate.cluster import InstanceInfo
from compiler.simulate.kv import PrefixCache

EXACT_TOKENS = 32  # below this many decode tokens steps are drawn one by one; above, by the
# renewal theorem's normal limit of the number of steps (same mean and variance)


def decode_steps(rng: np.random.Generator, osl: np.ndarray, draft_tokens: int,
                 acceptance: float) -> np.ndarray:
    """Verification steps each request needs for its `osl - 1` tokens after the first."""
    need = np.maximum(osl - 1, 0)
    pmf = np.array(tokens_per_step_pmf(draft_tokens, acceptance))
    if len(pmf) == 1:
        return need.astype(np.int64)
    sizes = np.arange(1, len(pmf) + 1)
    mu = float(pmf @ sizes)
    var = float(pmf @ (sizes - mu) ** 2)
    out = np.empty(len(need), dtype=np.int64)
    small = need <= EXACT_TOKENS
    if small.any():
        draws = rng.choice(sizes, size=(int(small.sum()), EXACT_TOKENS), p=pmf)
        reached = np.cumsum(draws, axis=1) >= need[small, None]
        out[small] = np.where(need[small] > 0, reached.argmax(axis=1) + 1, 0)
    big = ~small
    if big.any():
        m = need[big].astype(float)
        n = rng.normal(m / mu, np.sqrt(m * var / mu ** 3))
        lo = np.ceil(m / len(pmf))
        out[big] = np.clip(np.rint(n), lo, m).astype(np.int64)
    return out


class Req:
    """A request in flight; `i` indexes the workload's arrays."""

    __slots__ = (
        "base",
        "cached",
        "epoch",
        "finish",
        "i",
        "isl",
        "join",
        "new",
        "osl",
        "parent",
        "rank",
        "rate",
        "recompute",
        "reuse",
        "session",
        "steps_left",
        "todo",
    )

    def __init__(self, i: int, isl: int, osl: int, reuse: int, session: int, parent: int,
                 steps: int) -> None:
        self.i, self.isl, self.osl, self.reuse = i, isl, osl, reuse
        self.session, self.parent = session, parent
        self.steps_left = steps
        self.cached = self.new = self.todo = self.base = self.join = self.finish = 0
        self.rate = 0.0
        self.epoch = 0
        self.recompute = False
        self.rank: Rank | None = None


class Rank:
    """One DP rank: prompts to compute (`queue`), requests whose KV has arrived waiting for a
    slot (`waiting`), and the running batch (insertion-ordered: the last is preempted first).
    KV in use at step s is `kv_a + kv_r * s` tokens: each running request holds its
    prompt and grows by its own tokens per step. Busy time is kept as intervals of the
    instance's step clock while the rank has work."""

    __slots__ = ("busy_us", "cache", "index", "inst", "kv_a", "kv_r", "occupied", "peak_kv",
                 "preempted_at", "queue", "queued", "running", "safe_until", "since",
                 "waiting", "waiting_tokens")

    def __init__(self, inst: "Instance", index: int, cache_tokens: int) -> None:
        self.inst, self.index = inst, index
        self.queue: deque[Req] = deque()
        self.waiting: deque[Req] = deque()
        self.running: dict[Req, None] = {}
        self.kv_a = 0.0
        self.kv_r = 0.0
        self.queued = 0  # prompt tokens still to compute in `queue`
        self.waiting_tokens = 0  # KV of `waiting` and of hand-offs on their way
        self.busy_us = 0.0
        self.since = 0.0
        self.occupied = False
        self.peak_kv = 0.0  # highest KV use seen once scheduled, tokens
        self.preempted_at = -1
        self.safe_until = math.inf  # the last step whose KV fits without preempting
        self.cache = PrefixCache(cache_tokens)

    def kv_at(self, step: int) -> float:
        return self.kv_a + self.kv_r * step

    def active(self) -> float:
        """Tokens of KV its running requests hold now (the router's decode blocks)."""
        return self.kv_a + self.kv_r * self.inst.step

    def touch(self) -> None:
        """Call after its queues change: opens or closes a busy interval, and asks the
        instance to look at it next step while anything waits."""
        inst = self.inst
        occupied = bool(self.running or self.queue)
        if occupied != self.occupied:
            if occupied:
                self.since = inst.clock
            else:
                self.busy_us += inst.clock - self.since
            self.occupied = occupied
        if self.queue or self.waiting:
            inst.attention[self] = None

    def _changed(self) -> None:
        inst = self.inst
        free = inst.info.kv_tokens - len(self.running) * inst.half_block - self.kv_a
        if self.kv_r > 0:
            self.safe_until = math.floor(free / self.kv_r)
        else:
            self.safe_until = math.inf if free >= 0 else -1
        inst.dirty = True
        inst.changed[self] = None

    def join_running(self, r: Req, step: int) -> None:
        r.join, r.finish = step, step + r.steps_left
        if not r.recompute:  # tokens per step, kept through preemptions
            r.rate = (r.osl - 1) / max(1, r.steps_left)
        a = r.base - r.rate * step
        self.kv_a += a
        self.kv_r += r.rate
        inst = self.inst
        inst.kv_a += a
        inst.kv_r += r.rate
        inst.n_running += 1
        self.running[r] = None
        heapq.heappush(inst.finishing, (r.finish, r.i, r.epoch, r))
        self._changed()
        self.touch()

    def note_peak(self) -> None:
        kv = self.kv_a + self.kv_r * self.inst.step
        if kv > self.peak_kv:
            self.peak_kv = kv

    def leave_running(self, r: Req) -> None:
        del self.running[r]
        a = r.base - r.rate * r.join
        inst = self.inst
        inst.kv_a -= a
        inst.kv_r -= r.rate
        inst.n_running -= 1
        self.kv_a -= a
        self.kv_r -= r.rate
        if not self.running:  # no drift from float sums
            self.kv_a = self.kv_r = 0.0
        if not inst.n_running:
            inst.kv_a = inst.kv_r = 0.0
        self._changed()
        self.touch()

    def enqueue(self, r: Req) -> None:
        self.queue.append(r)
        self.queued += r.todo
        self.touch()


class Instance:
    """An engine instance's ranks and step counter. `plan()` decides the next step's work and
    its duration; `finish()` applies it; the engine calls them around each step's event.
    Only ranks with something waiting are visited each step (`attention`); the KV check
    visits the others only when one of them may overflow (`safe_until`)."""

    def __init__(self, info: InstanceInfo, cache_tokens: int, block_size: int) -> None:
        self.info = info
        self.half_block = 0.5 * block_size  # blocks are whole: half a block per request
        self.step = 0
        self.clock = 0.0  # sum of its step times
        self.busy = False
        self.alive = True
        self.kv_a = 0.0
        self.kv_r = 0.0
        self.n_running = 0
        self.dirty = False
        self.changed: dict[Rank, None] = {}
        self.safe_until = math.inf
        self.attention: dict[Rank, None] = {}
        self.ranks = [Rank(self, d, cache_tokens) for d in range(len(info.ranks))]
        self.runnings = [k.running for k in self.ranks]
        self.finishing: list[tuple[int, int, int, Req]] = []
        self.chunks: list[tuple[Req, int]] = []
        self.admitted: list[Req] = []  # joined the running batch in the planned step
        self.preemptions = 0
        self.decode_tokens = 1 + info.draft_tokens
        self.step_us = 0.0
        self.step_running = 0

    def never_fits(self, r: Req) -> bool:
        """Whether `r` alone outgrows a rank's KV cache before it finishes: its prompt and
        output with the half block the scheduler reserves per running request. Such a request
        would be preempted as soon as it is admitted, recomputed and preempted again, forever;
        it is refused instead (vLLM refuses what can never be allocated)."""
        return r.isl + r.osl + self.half_block > self.info.kv_tokens

    def plan(self) -> float:
        """Schedule the next step on every rank; its duration (us), 0 when there is nothing
        to do. Preempts where the KV cache would overflow."""
        step = self.step
        if self.dirty:
            self.safe_until = min(k.safe_until for k in self.ranks)
            self.dirty = False
        if step + 1 > self.safe_until:
            self._preempt_overflowing()
        if self.changed:  # ranks whose batch changed: their KV use once scheduled
            for rank in self.changed:
                rank.note_peak()
            self.changed.clear()
        chunks: list[tuple[Req, int]] = []
        admitted: list[Req] = []
        chunk_max = 0
        for rank in list(self.attention):
            seqs = len(rank.running)
            if rank.waiting and rank.preempted_at != step:
                seqs = self._admit(rank, seqs, admitted)
            if rank.queue:
                taken = self._take_chunks(rank, seqs, chunks)
                if taken > chunk_max:
                    chunk_max = taken
            if admitted:
                rank.note_peak()
            if not rank.queue and not rank.waiting:
                del self.attention[rank]
        self.chunks, self.admitted = chunks, admitted
        return self._step_us(chunks, chunk_max)

    def _fits(self, rank: Rank, r: Req) -> bool:
        """Whether `r`'s blocks, and the running requests' next tokens, fit the rank's cache."""
        return rank.kv_a + rank.kv_r * (self.step + 1) + r.base \
            + self.half_block * (len(rank.running) + 1) <= self.info.kv_tokens

    def _preempt_overflowing(self) -> None:
        """Preempt the newest running requests of each rank whose cache would overflow."""
        step = self.step
        for rank in self.ranks:
            while rank.running and step + 1 > rank.safe_until:
                self._preempt(rank, next(reversed(rank.running)))
                rank.preempted_at = step
        self.safe_until = min(k.safe_until for k in self.ranks)
        self.dirty = False

    def _admit(self, rank: Rank, seqs: int, admitted: list[Req]) -> int:
        """Move waiting requests (their prompts done) into the running batch while they fit;
        the rank's sequences after."""
        while rank.waiting and seqs < self.info.max_seqs:
            r = rank.waiting[0]
            if not self._fits(rank, r):
                break
            rank.waiting.popleft()
            rank.waiting_tokens -= r.base
            rank.join_running(r, self.step)
            admitted.append(r)
            seqs += 1
        return seqs

    def _take_chunks(self, rank: Rank, seqs: int, chunks: list[tuple[Req, int]]) -> int:
        """Fill the rank's token budget with prompt chunks from its queue; the tokens taken."""
        info = self.info
        budget = info.max_tokens - len(rank.running) * self.decode_tokens
        taken = 0
        fresh_ok = rank.preempted_at != self.step  # no new prompts in a preempting step
        for r in rank.queue:
            if budget <= 0 or seqs >= info.max_seqs:
                break
            if r.todo == r.new and not fresh_ok:
                break
            if r.todo == r.new and info.role != "prefill" and not self._fits(rank, r):
                break  # its prompt's blocks do not fit
            take = min(r.todo, budget)
            chunks.append((r, take))
            budget -= take
            taken += take
            seqs += 1
        return taken

    def _step_us(self, chunks: list[tuple[Req, int]], chunk_max: int) -> float:
        """The planned step's time: the decode of the running batch and the largest rank's
        prompt chunks (the ranks meet every layer)."""
        info, us, n = self.info, 0.0, self.n_running
        if n:
            us += info.steps.decode_us(n / len(self.ranks), max(map(len, self.runnings)),
                                       (self.kv_a + self.kv_r * self.step) / n)
        if chunk_max:
            new_sum = sum(r.new for r, _ in chunks)
            cached_sum = sum(r.cached for r, _ in chunks)
            pre, _fill = info.steps.prefill_us(chunk_max, new_sum / len(chunks),
                                               cached_sum / len(chunks))
            us += pre
        self.step_running = n
        return us

    def _preempt(self, rank: Rank, r: Req) -> None:
        done = r.rate * (self.step - r.join)
        rank.leave_running(r)
        r.steps_left = max(0, r.finish - self.step)
        r.base = int(r.base + done)
        r.epoch += 1
        r.recompute = True
        r.cached, r.new, r.todo = 0, r.base, r.base
        rank.queue.appendleft(r)
        rank.queued += r.todo
        rank.touch()
        self.preemptions += 1

    def finish(self, us: float) -> tuple[list[Req], list[Req]]:
        """Apply the planned step: (prompts completed, requests finished)."""
        self.clock += us
        prompts = []
        touched: dict[Rank, None] = {}
        for r, take in self.chunks:
            r.todo -= take
            rank = r.rank
            rank.queued -= take
            touched[rank] = None
        for rank in touched:
            q = rank.queue
            while q and q[0].todo == 0:
                prompts.append(q.popleft())
            rank.touch()
        self.chunks = []
        self.step += 1
        done = []
        fin = self.finishing
        while fin and fin[0][0] <= self.step:
            _, _, epoch, r = heapq.heappop(fin)
            if epoch != r.epoch:
                continue
            r.rank.leave_running(r)
            done.append(r)
        return prompts, done

    def close(self) -> None:
        """End of the run: close the ranks' open busy intervals."""
        for k in self.ranks:
            if k.occupied:
                k.busy_us += self.clock - k.since
                k.occupied = False
