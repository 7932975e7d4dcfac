"""The prefix caches and the pool under random puts, hits and tray failures, against an
oracle LRU: a cache never holds more than its capacity, every object lives on at most one
segment and the index names only what its segment still holds (an evicted or failed prefix
is never served), and a hit never returns more than was stored or asked for."""

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.simulate.kv import Pool, PoolSegment, PrefixCache

ops = st.lists(st.tuples(st.sampled_from(["put", "hit", "fail"]), st.integers(0, 12),
                         st.integers(0, 300)), max_size=120)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 600), ops)
def test_a_prefix_cache_is_an_lru_of_its_capacity(capacity, seq):
    cache, oracle = PrefixCache(capacity), OrderedDict()
    for op, key, tokens in seq:
        if op == "put":
            cache.put(key, tokens)
            oracle.pop(key, None)
            tokens = min(tokens, capacity)
            while oracle and sum(oracle.values()) + tokens > capacity:
                oracle.popitem(last=False)
            if tokens > 0:
                oracle[key] = tokens
        else:
            got = cache.hit(key, tokens)
            want = min(oracle.get(key, 0), tokens) if tokens > 0 else 0
            assert got == want
            if key in oracle and tokens > 0:
                oracle.move_to_end(key)
        assert list(cache.entries.items()) == list(oracle.items())
        assert cache.used == sum(oracle.values()) <= capacity


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 400), min_size=1, max_size=4), ops)
def test_the_pool_serves_each_prefix_from_one_live_segment_only(sizes, seq):
    pool = Pool([PoolSegment(f"t{k}", PrefixCache(n)) for k, n in enumerate(sizes)])
    stored: dict[int, int] = {}  # the most each key was ever stored with
    for op, key, tokens in seq:
        if op == "put":
            pool.put(key, tokens)
            stored[key] = max(stored.get(key, 0), tokens)
        elif op == "hit":
            got, tray = pool.hit(key, tokens)
            assert got <= min(tokens, stored.get(key, 0))
            assert (got == 0) == (tray is None)
            if tray is not None:
                assert any(s.tray == tray and s.alive for s in pool.segments)
        else:
            pool.fail({f"t{key % len(sizes)}"})
        holders = {}
        for k, s in enumerate(pool.segments):
            assert s.cache.used <= s.cache.capacity
            if not s.alive:
                assert not s.cache.entries
            for key_held in s.cache.entries:
                assert key_held not in holders  # one segment per object
                holders[key_held] = k
        assert pool.where == holders  # the index names exactly what is held, where
        assert pool.used <= pool.capacity
