"""The discrete-event loop: one event per engine step of an instance (all its DP ranks at
once, every running request advancing), per request issue, pool load, KV hand-off and fault;
never one per token. Deterministic: events are ordered by (time, sequence number) and every
draw comes from generators seeded by `seed`."""

import heapq
from dataclasses import dataclass, field

import numpy as np

from compiler.simulate.cluster import POOL_LOOKUP_US, Cluster
from compiler.simulate.faults import Fault
from compiler.simulate.kv import Links, Pool, PoolSegment, PrefixCache
from compiler.simulate.router import Router
from compiler.simulate.scheduler import Instance, Rank, Req, decode_steps
from compiler.simulate.workload import Requests

ISSUE, READY, STEP, HANDOFF, FAULT, SAMPLE = range(6)
SAMPLE_US = 10_000.0  # first sampling interval; doubled whenever the samples pass MAX_SAMPLES
MAX_SAMPLES = 512
RETRIES = 1  # a request cut by a fault is issued again once, then reported lost


@dataclass
class Outcome:
    """Per request (indexed as the workload) and per run: what `report` summarises. The
    per-request columns are numpy arrays once the run has finished."""

    issued_us: np.ndarray
    first_us: np.ndarray
    done_us: np.ndarray
    cached: np.ndarray
    lost: np.ndarray  # 0 finished, 1 lost to a fault, 2 longer than its rank's KV cache
    retries: np.ndarray
    itl_us: list[float] = field(default_factory=list)
    itl_weight: list[int] = field(default_factory=list)
    samples: list[tuple] = field(default_factory=list)  # (t, prefill queue, decode wait,
    #  pool used share, idle prefill ranks while one queues, same for decode)
    sample_us: float = SAMPLE_US
    ranks: list[dict] = field(default_factory=list)
    end_us: float = 0.0
    preemptions: int = 0
    peak_kv_share: float = 0.0
    links_busy_us: dict[str, float] = field(default_factory=dict)
    faults: list[dict] = field(default_factory=list)


class Simulation:
    def __init__(self, cluster: Cluster, reqs: Requests, policy: str, seed: int,
                 faults: list[Fault] = ()) -> None:
        self.c, self.w = cluster, reqs
        n = len(reqs)
        decode = [i for i in cluster.instances if i.role != "prefill"]
        spec = decode[0] if decode else cluster.instances[0]
        rng = np.random.default_rng(seed)
        self.steps = decode_steps(rng, reqs.osl, spec.draft_tokens, spec.acceptance)
        # plain lists: indexing them is several times cheaper than numpy scalars
        self.cols = [a.tolist() for a in (reqs.isl, reqs.osl, reqs.reuse, reqs.session,
                                          reqs.parent, self.steps)]
        self.think = reqs.think_us.tolist()
        self.insts = [Instance(i, i.kv_tokens, cluster.block_size) for i in cluster.instances]
        self.pool = Pool([PoolSegment(s.tray, PrefixCache(s.tokens), system=s.system)
                          for s in cluster.segments]) if cluster.segments else None
        if self.pool is not None:
            self._warm(reqs)
        self.links = Links()
        self.router = Router(policy, cluster.overlap_credit, cluster.block_size, seed)
        self.faults = list(faults)
        self.heap: list = []
        self.seq = 0
        self.settled = 0  # requests finished or lost
        # per-request columns as lists while the run goes (a list's item is several times
        # cheaper to read and set than a numpy array's); `_finish_stats` makes them arrays
        nan = float("nan")
        self.out = Outcome([nan] * n, [nan] * n, [nan] * n, [0] * n, [0] * n, [0] * n)
        self.next_of = _next_of_client(reqs.client).tolist()
        self.open_loop = (reqs.client < 0).tolist()
        self.open_next = 0
        self.open_order = np.flatnonzero(reqs.client < 0).tolist()
        self.arrival = reqs.arrival_us.tolist()
        self._route_lists()

    def _warm(self, reqs: Requests) -> None:
        """Start in steady state: the context each session's first request continues is in
        the pool already (as its earlier turns would have left it), as far as it fits."""
        _, first = np.unique(reqs.parent, return_index=True)
        for i in np.sort(first):
            if reqs.reuse[i] > 0 and (reqs.warm is None or reqs.warm[i]):
                self.pool.put(int(reqs.parent[i]), int(reqs.reuse[i]))

    # -- events ---------------------------------------------------------------------------
    def push(self, t: float, kind: int, obj: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj))

    def run(self) -> Outcome:
        w = self.w
        firsts = np.flatnonzero((w.client >= 0) & (_first_of_client(w.client)))
        for i in firsts:
            self.push(float(w.arrival_us[i]), ISSUE, int(i))
        self._push_open()
        for f in self.faults:
            self.push(f.at_us, FAULT, f)
        self.push(0.0, SAMPLE, None)
        now = 0.0
        pending = len(w)
        handlers = (self._issue, self._ready, self._step, self._handoff, self._fault)
        while self.heap:
            now, _, kind, obj = heapq.heappop(self.heap)
            if kind == SAMPLE:
                if self.settled >= pending:
                    continue
                self._sample(now)
                continue
            handlers[kind](obj, now)
        self.out.end_us = now
        self._finish_stats()
        return self.out

    def _push_open(self) -> None:
        if self.open_next < len(self.open_order):
            i = self.open_order[self.open_next]
            self.open_next += 1
            self.push(self.arrival[i], ISSUE, i)

    def _issue(self, i: int, now: float) -> None:
        if self.open_loop[i]:
            self._push_open()
        issued = self.out.issued_us
        if issued[i] != issued[i]:  # NaN: its first issue (a retry keeps the first time)
            issued[i] = now
        c = self.cols
        r = Req(i, c[0][i], c[1][i], c[2][i], c[3][i], c[4][i], c[5][i])
        rank = self.router.prefill(r, self.prefill_ranks, self.pool)
        if rank is None:
            self._settle(r, now, 1)
            return
        local = rank.cache.hit(r.parent, r.reuse)
        pooled, tray = self.pool.hit(r.parent, r.reuse) if self.pool else (0, None)
        cached = max(local, pooled)
        new = max(1, r.isl - cached)  # the last prompt token is always computed
        r.cached, r.new, r.todo, r.base = r.isl - new, new, new, r.isl
        r.rank = rank
        self.out.cached[i] = r.cached
        if pooled > local:  # load the rest of the prefix from the pool over RDMA
            info = rank.inst.info
            gpu = info.ranks[rank.index].gpus[0]
            us = self.c.transfer_us((pooled - local) * info.kv_token_bytes, "rdma", info.system)
            seg_us = us / max(1, self.c.rdma_devices(self.pool.system_of(tray)))
            t0 = now + POOL_LOOKUP_US
            end = max(self.links.reserve((f"pool:{tray}",), t0, seg_us),
                      self.links.reserve((f"nic:{gpu}",), t0, us))
            rank.queued += r.todo  # the router sees it coming
            self.push(end, READY, r)
            return
        self._enqueue(rank, r, now)

    def _ready(self, r: Req, now: float) -> None:
        rank = r.rank
        rank.queued -= r.todo
        if not rank.inst.alive:
            self._retry(r, now)
            return
        self._enqueue(rank, r, now)

    def _enqueue(self, rank: Rank, r: Req, now: float) -> None:
        if rank.inst.info.role != "prefill" and rank.inst.never_fits(r):
            self._settle(r, now, 2)
            return
        rank.enqueue(r)
        self._wake(rank.inst, now)

    def _wake(self, inst: Instance, now: float) -> None:
        if not inst.busy and inst.alive:
            self._start(inst, now)

    def _start(self, inst: Instance, now: float) -> None:
        us = inst.plan()
        first = self.out.first_us
        for r in inst.admitted:
            if first[r.i] != first[r.i]:  # NaN: not yet
                first[r.i] = now
        inst.busy = us > 0
        if inst.busy:
            inst.step_us = us
            self.push(now + us, STEP, inst)

    def _step(self, inst: Instance, now: float) -> None:
        if not inst.alive:
            return
        us = inst.step_us
        if inst.step_running:
            self.out.itl_us.append(us)
            self.out.itl_weight.append(inst.step_running)
        prompts, done = inst.finish(us)
        role = inst.info.role
        for r in prompts:
            rank = r.rank
            if r.recompute:
                rank.join_running(r, inst.step)
                continue
            rank.cache.put(r.session, r.isl)
            if self.pool is not None and inst.info.stores_to_pool:
                self.pool.put(r.session, r.isl)
            if role == "prefill":
                self._hand_off(r, rank, now)
                continue
            self.out.first_us[r.i] = now
            if r.steps_left <= 0:
                self._complete(r, now)
            else:
                rank.join_running(r, inst.step)
        for r in done:
            self._complete(r, now)
        self._start(inst, now)

    def _hand_off(self, r: Req, src: Rank, now: float) -> None:
        """NIXL moves the prompt's KV to a decode rank: over NVLink inside the domain, else
        over both ends' NICs; a link carries one transfer at a time."""
        dst = self.router.decode(self.decode_ranks, self.decode_loads)
        if dst is None:
            self._retry(r, now)
            return
        a = src.inst.info.ranks[src.index]
        b = dst.inst.info.ranks[dst.index]
        kind = "nvlink" if a.domain == b.domain else "rdma"
        us = self.c.transfer_us(r.isl * src.inst.info.kv_token_bytes, kind, src.inst.info.system)
        tag = "nvl" if kind == "nvlink" else "nic"
        end = self.links.reserve((f"{tag}-out:{a.gpus[0]}", f"{tag}-in:{b.gpus[0]}"), now, us)
        r.rank = dst
        dst.waiting_tokens += r.base
        self.decode_loads[self.decode_index[dst]] += r.isl + r.osl
        self.push(end, HANDOFF, r)

    def _handoff(self, r: Req, now: float) -> None:
        rank = r.rank
        if not rank.inst.alive:
            rank.waiting_tokens -= r.base
            self._retry(r, now)
            return
        if rank.inst.never_fits(r):  # vLLM refuses what can never fit
            rank.waiting_tokens -= r.base
            self._settle(r, now, 2)
            return
        if r.steps_left <= 0:  # one output token: the prefill's is the answer
            rank.waiting_tokens -= r.base
            self.out.first_us[r.i] = now
            self._complete(r, now)
            return
        rank.waiting.append(r)
        rank.touch()
        self._wake(rank.inst, now)

    def _complete(self, r: Req, now: float) -> None:
        inst = r.rank.inst
        if self.pool is not None and inst.info.stores_to_pool:
            self.pool.put(r.session, r.isl + r.osl)
        if inst.info.role == "aggregated":
            r.rank.cache.put(r.session, r.isl + r.osl)
        self._settle(r, now, 0)

    def _settle(self, r: Req, now: float, lost: int) -> None:
        i = r.i
        slot = self.decode_index.get(r.rank) if r.rank is not None else None
        if slot is not None:
            self.decode_loads[slot] -= r.isl + r.osl
        if lost:
            self.out.lost[i] = lost
        else:
            self.out.done_us[i] = now
        self.settled += 1
        nxt = self.next_of[i]
        if nxt >= 0:
            self.push(now + self.think[nxt], ISSUE, int(nxt))

    def _retry(self, r: Req, now: float) -> None:
        slot = self.decode_index.get(r.rank) if r.rank is not None else None
        if slot is not None:  # (a rank still alive: its reservation goes)
            self.decode_loads[slot] -= r.isl + r.osl
        r.rank = None
        if self.out.retries[r.i] < RETRIES:
            self.out.retries[r.i] += 1
            self.out.first_us[r.i] = float("nan")
            self.push(now, ISSUE, r.i)
        else:
            self._settle(r, now, 1)

    def _fault(self, f: Fault, now: float) -> None:
        hit = [x for x in self.insts if x.alive and x.info.gpus & f.gpus]
        cut = []
        for inst in hit:
            inst.alive = False
            for rank in inst.ranks:
                cut += list(rank.queue) + list(rank.waiting) + list(rank.running)
                rank.queue.clear()
                rank.waiting.clear()
                rank.running.clear()
                rank.touch()
            inst.attention.clear()
        lost_tokens = self.pool.fail(set(f.trays)) if self.pool else 0
        self.out.faults.append({"at_s": round(now / 1e6, 3), "target": f.target,
                                "instances": [x.info.id for x in hit], "requests_cut": len(cut),
                                "pool_tokens_lost": lost_tokens})
        self._route_lists()
        for r in sorted(cut, key=lambda x: x.i):
            r.epoch += 1
            self._retry(r, now)

    def _route_lists(self) -> None:
        alive = [x for x in self.insts if x.alive]
        pre = [x for x in alive if x.info.role == "prefill"] \
            or [x for x in alive if x.info.role == "aggregated"]
        if not any(x.info.role == "prefill" for x in self.insts):
            pre = [x for x in alive if x.info.role == "aggregated"]
        self.prefill_ranks = [k for x in pre for k in x.ranks]
        self.decode_ranks = [k for x in alive if x.info.role == "decode" for k in x.ranks]
        old = getattr(self, "decode_loads", None)
        was = getattr(self, "decode_index", {})
        self.decode_index = {k: j for j, k in enumerate(self.decode_ranks)}
        self.decode_loads = [old[was[k]] if old else 0.0 for k in self.decode_ranks]

    def _sample(self, now: float) -> None:
        out = self.out
        pre_q = sum(len(k.queue) for k in self.prefill_ranks)
        dec_w = sum(len(k.waiting) for k in self.decode_ranks)
        pool = self.pool.used / self.pool.capacity if self.pool and self.pool.capacity else 0.0
        out.samples.append((now, pre_q, dec_w, pool, _idle_while_queued(self.prefill_ranks),
                            _idle_while_queued(self.decode_ranks)))
        if len(out.samples) > MAX_SAMPLES:
            out.samples = out.samples[::2]
            out.sample_us *= 2
        last = out.samples[-1][0]
        self.push(last + out.sample_us, SAMPLE, None)

    def _finish_stats(self) -> None:
        out = self.out
        out.issued_us, out.first_us, out.done_us = (
            np.array(x, dtype=float) for x in (out.issued_us, out.first_us, out.done_us))
        out.cached = np.array(out.cached, dtype=np.int64)
        out.lost, out.retries = (np.array(x, dtype=np.int8) for x in (out.lost, out.retries))
        out.preemptions = sum(x.preemptions for x in self.insts)
        for inst in self.insts:
            inst.close()
            for k in inst.ranks:
                out.ranks.append({"instance": inst.info.id, "rank": k.index,
                                  "role": inst.info.role, "busy_us": k.busy_us})
                cap = inst.info.kv_tokens
                if inst.info.role != "prefill" and cap:
                    out.peak_kv_share = max(out.peak_kv_share, k.peak_kv / cap)
        out.links_busy_us = dict(self.links.busy_us)


def _idle_while_queued(ranks: list[Rank]) -> int:
    """Ranks with nothing to do while another rank of the same role has requests waiting."""
    queued = any(len(k.queue) > 1 or k.waiting for k in ranks)
    if not queued:
        return 0
    return sum(1 for k in ranks if not k.queue and not k.waiting and not k.running)


def _first_of_client(client: np.ndarray) -> np.ndarray:
    first = np.zeros(len(client), dtype=bool)
    _, idx = np.unique(client, return_index=True)
    first[idx] = True
    return first


def _next_of_client(client: np.ndarray) -> np.ndarray:
    """For each request, the index of its client's next request (-1: none or open loop)."""
    nxt = np.full(len(client), -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(client)), client))
    same = client[order[1:]] == client[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same]
    nxt[client < 0] = -1
    return nxt
