"""Unit tests of the scheduler, KV stores, links and router on a synthetic instance."""

import numpy as np
import pytest

from compiler.perf.serving import tokens_per_step_pmf
from compiler.simulate.kv import Links, Pool, PoolSegment, PrefixCache
from compiler.simulate.router import Router
from compiler.simulate.scheduler import Instance, Req, decode_steps
from compiler.simulate.steps import bucket
from tests.simulate.synthetic import instance


def _req(i: int, isl: int = 100, osl: int = 11, steps: int = 10, session: int = 0) -> Req:
    r = Req(i, isl, osl, 0, session, session, steps)
    r.new = r.todo = isl
    r.base = isl
    return r


def test_decode_steps_follow_the_acceptance_distribution():
    rng = np.random.default_rng(0)
    osl = np.array([17] * 20000 + [2001] * 20000)
    steps = decode_steps(rng, osl, 3, 2.5)
    pmf = np.array(tokens_per_step_pmf(3, 2.5))
    assert pmf @ np.arange(1, 5) == pytest.approx(2.5, rel=1e-6)
    # E[steps to n tokens]: f(n) = 1 + sum_j p_j f(n - j), f(<= 0) = 0; ~ n / 2.5 when long
    f = [0.0] * 2001
    for m in range(1, 2001):
        f[m] = 1 + sum(p * f[max(0, m - j - 1)] for j, p in enumerate(pmf))
    for n in (16, 2000):
        got = steps[osl == n + 1]
        assert got.mean() == pytest.approx(f[n], rel=0.02)
        assert got.std() > 0  # a distribution, not the mean
        assert got.min() >= np.ceil(n / 4) and got.max() <= n
    assert (decode_steps(rng, np.array([1, 5]), 0, 1.0) == [0, 4]).all()


def test_chunked_prefill_fills_the_token_budget_first_come_first_served():
    inst = Instance(instance("p", "prefill", max_tokens=250, max_seqs=8), 0, 16)
    rank = inst.ranks[0]
    reqs = [_req(i, isl=100) for i in range(3)]
    for r in reqs:
        r.rank = rank
        rank.enqueue(r)
    assert inst.plan() == pytest.approx(100 + 250)
    assert [(r.i, t) for r, t in inst.chunks] == [(0, 100), (1, 100), (2, 50)]
    prompts, _ = inst.finish(350.0)
    assert [r.i for r in prompts] == [0, 1] and reqs[2].todo == 50
    inst.plan()
    assert [(r.i, t) for r, t in inst.chunks] == [(2, 50)]


def test_max_num_seqs_and_kv_bound_admission():
    inst = Instance(instance("d", "decode", max_seqs=2, kv_tokens=10_000), 0, 16)
    rank = inst.ranks[0]
    for i in range(4):
        r = _req(i, isl=1000)
        r.rank = rank
        rank.waiting.append(r)
        rank.touch()
    inst.plan()
    assert len(rank.running) == 2 and len(rank.waiting) == 2  # --max-num-seqs
    small = Instance(instance("d", "decode", max_seqs=8, kv_tokens=2500), 0, 16)
    k = small.ranks[0]
    for i in range(3):
        r = _req(i, isl=1000)
        r.rank = k
        k.waiting.append(r)
        k.touch()
    small.plan()
    assert len(k.running) == 2  # a third prompt's blocks do not fit


def test_preemption_frees_the_latest_and_recomputes_it():
    # two requests of 1000 tokens each grow 10 tokens per step in a 2100-token cache
    inst = Instance(instance("d", "decode", kv_tokens=2100), 0, 16)
    rank = inst.ranks[0]
    for i in range(2):
        r = _req(i, isl=1000, osl=1001, steps=100)
        r.rank = rank
        rank.waiting.append(r)
        rank.touch()
    seen = 0
    while inst.preemptions == 0 and seen < 50:
        inst.plan()
        inst.finish(1.0)
        seen += 1
    assert inst.preemptions == 1
    victim = rank.queue[0]
    assert victim.i == 1 and victim.recompute and victim.todo > 1000  # prompt + generated
    assert list(rank.running) == [next(r for r in rank.running)] and len(rank.running) == 1
    assert rank.kv_at(inst.step) <= 2100


def test_requests_finish_at_their_step_count():
    inst = Instance(instance("d", "decode"), 0, 16)
    rank = inst.ranks[0]
    r = _req(0, steps=3)
    r.rank = rank
    rank.waiting.append(r)
    rank.touch()
    done = []
    for _ in range(5):
        if inst.plan():
            done += inst.finish(1.0)[1]
    assert done == [r] and inst.step == 3 and not rank.running


def test_prefix_cache_lru_and_pool_segments():
    c = PrefixCache(1000)
    c.put(1, 400)
    c.put(2, 400)
    assert c.hit(1, 500) == 400  # 1 is now the most recent
    c.put(3, 400)  # evicts 2, the least recently used
    assert c.peek(2, 100) == 0 and c.peek(1, 100) == 100 and c.used == 800
    pool = Pool([PoolSegment("r0-t00", PrefixCache(1000)),
                 PoolSegment("r0-t01", PrefixCache(1000))])
    for key in range(6):
        pool.put(key, 300)
    assert pool.used <= pool.capacity == 2000
    held = {k for k in range(6) if pool.peek(k, 1)}
    assert all(pool.where[k] in (0, 1) for k in held)
    lost = pool.fail({"r0-t00"})
    assert lost > 0 and pool.capacity == 1000
    assert all(pool.where[k] == 1 for k in pool.where)


def test_links_queue_transfers_first_come_first_served():
    links = Links()
    assert links.reserve(("a", "b"), 0.0, 10.0) == 10.0
    assert links.reserve(("b", "c"), 5.0, 10.0) == 20.0  # waits for b
    assert links.reserve(("d",), 5.0, 10.0) == 15.0  # an idle link does not wait


def test_router_policies():
    p = Instance(instance("p", "prefill", dp=4), 0, 16)
    ranks = p.ranks
    ranks[0].cache.put(7, 900)
    ranks[1].queued = 5000
    r = _req(0, isl=1000, session=7)
    r.parent, r.reuse = 7, 900
    assert Router("kv", 1.0, 16, 0).prefill(r, ranks, None) is ranks[0]  # overlap wins
    rr = Router("round-robin", 1.0, 16, 0)
    assert [rr.prefill(r, ranks, None).index for _ in range(5)] == [0, 1, 2, 3, 0]
    s = Router("session", 1.0, 16, 0)
    assert s.prefill(r, ranks, None) is s.prefill(r, ranks, None)
    pool = Pool([PoolSegment("r0-t00", PrefixCache(10_000))])
    pool.put(7, 900)
    # with the prefix in the pool every idle rank is as good: the least queued work wins
    assert Router("least-uncached", 1.0, 16, 0).prefill(r, ranks[1:], pool) is ranks[2]


def test_bucket_grid():
    assert bucket(3.4) == 3 and bucket(16) == 16
    for x in (17, 100, 5000, 123456):
        assert abs(bucket(x) / x - 1) < 0.045
