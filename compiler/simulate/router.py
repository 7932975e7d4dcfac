"""Which prefill (or aggregated) DP rank a request goes to, and which decode rank takes it.

Policies, compared side by side by `rackc simulate --policy`:
- `round-robin`, `random`: Dynamo's frontend without KV awareness.
- `session`: a session stays on one rank (sticky routing, per-rank prefix tiers).
- `kv`: Dynamo 1.6's KV router cost (lib/kv-router/src/scheduling/selector.rs): per worker
  logit = overlap_score_weight x potential prefill blocks (its queued prompt tokens plus this
  request's tokens not in its cache) + its active decode blocks; the lowest wins (router
  temperature 0). Its overlap is what the rank's own prefix cache holds (the KV events it
  publishes); pool hits are not indexed.
- `least-uncached`: least uncached prompt work per rank, counting what the pool holds too.
Decode ranks are chosen by least KV reserved (Dynamo's decode routing by active blocks,
without prefix overlap, counting each request at its full length).
"""

import numpy as np

from compiler.simulate.kv import Pool
from compiler.simulate.scheduler import Rank, Req

POLICIES = ("kv", "round-robin", "random", "session", "least-uncached")
SESSION_HASH = 2654435761  # Knuth's multiplicative hash: sessions spread evenly over ranks


class Router:
    def __init__(self, policy: str, credit: float, block_size: int, seed: int) -> None:
        self.policy, self.credit, self.block = policy, credit, block_size
        self.turn = 0
        self.rng = np.random.default_rng(seed + 7919)

    def prefill(self, r: Req, ranks: list[Rank], pool: Pool | None) -> Rank | None:
        """The rank for a new request among `ranks` (alive), or None when there is none."""
        if not ranks:
            return None
        p = self.policy
        if p == "round-robin":
            self.turn += 1
            return ranks[(self.turn - 1) % len(ranks)]
        if p == "random":
            return ranks[int(self.rng.integers(len(ranks)))]
        if p == "session":
            return ranks[(r.session * SESSION_HASH) % (1 << 32) % len(ranks)]
        key, want = r.parent, r.reuse
        best, best_cost = None, 0.0
        if p == "least-uncached":
            pooled = pool.peek(key, want) if pool is not None else 0
            for k in ranks:
                hit = k.cache.entries.get(key, 0)
                hit = max(pooled, want if hit > want else hit)
                cost = k.queued - hit
                if best is None or cost < best_cost:
                    best, best_cost = k, cost
            return best
        credit = self.credit
        for k in ranks:  # (a loop, not min over a list: this runs once per request)
            hit = k.cache.entries.get(key, 0)
            cost = credit * (k.queued - (want if hit > want else hit))
            if k.kv_r or k.kv_a:
                cost += k.kv_a + k.kv_r * k.inst.step
            if best is None or cost < best_cost:
                best, best_cost = k, cost
        return best

    @staticmethod
    def decode(ranks: list[Rank], loads: list[float]) -> Rank | None:
        """The decode rank with the least KV reserved by the requests sent to it (`loads`,
        by rank position: what their prompts and outputs will hold)."""
        if not ranks:
            return None
        return ranks[loads.index(min(loads))]
