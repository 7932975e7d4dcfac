"""The event loop's invariants, as properties over random small workloads and clusters."""

import signal

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.perf.serving import Workload
from compiler.simulate.engine import Simulation
from compiler.simulate.faults import Fault
from compiler.simulate.workload import generate
from tests.simulate.synthetic import cluster, instance

W = Workload(isl=800, osl=40, isl_cv=0.8, osl_cv=0.8, concurrency=8, prefix_reuse=0.5,
             shared_prefix_tokens=840, sessions=16)


def _disagg(kv_tokens: int = 20_000, dp: int = 2, pool: int = 50_000):
    return cluster([instance("prefill-00", "prefill", dp=dp, max_tokens=1024),
                    instance("prefill-01", "prefill", dp=dp, max_tokens=1024,
                             tray="r0-t01", domain="nvl1"),
                    instance("decode-00", "decode", dp=dp, max_seqs=6, kv_tokens=kv_tokens,
                             tray="r0-t02", draft=2, acceptance=2.2)], pool)


def _agg(kv_tokens: int = 20_000):
    return cluster([instance("aggregated-00", "aggregated", dp=2, max_seqs=6,
                             max_tokens=512, kv_tokens=kv_tokens)])


workloads = st.builds(
    lambda n, seed, profile, c: (generate(profile, Workload(**{**W.__dict__,
                                                               "concurrency": c}),
                                          n, seed, 40.0), seed),
    st.integers(5, 120), st.integers(0, 2**16), st.sampled_from(["closed", "poisson",
                                                                  "bursty", "agentic"]),
    st.integers(1, 24))


@settings(max_examples=40, deadline=None)
@given(workloads, st.sampled_from(["disagg", "agg"]), st.integers(2_000, 40_000),
       st.sampled_from(["kv", "round-robin", "session", "least-uncached", "random"]))
def test_every_request_finishes_or_is_reported_lost(wl, kind, kv, policy):
    reqs, seed = wl
    c = _disagg(kv) if kind == "disagg" else _agg(kv)
    sim = Simulation(c, reqs, policy, seed)
    out = sim.run()
    finished = np.isfinite(out.done_us)
    assert (finished ^ (out.lost > 0)).all()  # each request exactly one of the two
    assert sim.settled == len(reqs)
    ok = finished
    assert (out.first_us[ok] >= out.issued_us[ok]).all()
    assert (out.done_us[ok] >= out.first_us[ok]).all()
    # too long for the KV cache is the only way to be lost without a fault
    too_long = reqs.isl + reqs.osl + sim.insts[-1].half_block > kv
    assert set(np.flatnonzero(out.lost > 0)) <= set(np.flatnonzero(too_long))
    # no KV block served twice: a rank never holds more than its cache after scheduling
    assert out.peak_kv_share <= 1.0 + 1e-9
    for inst in sim.insts:
        for k in inst.ranks:
            assert not k.running and not k.queue and not k.waiting
            assert k.kv_a == 0 and k.kv_r == 0


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.0, 0.05))
def test_a_fault_retries_or_loses_but_conserves(seed, at_s):
    reqs = generate("closed", W, 80, seed)
    c = _disagg()
    fault = Fault(at_s * 1e6, "r0-t00", frozenset(c.instances[0].gpus), frozenset({"r0-t00"}))
    sim = Simulation(c, reqs, "kv", seed, [fault])
    out = sim.run()
    assert (np.isfinite(out.done_us) ^ (out.lost > 0)).all()
    assert out.faults and out.faults[0]["instances"] == ["prefill-00"]
    # prefill-01 survives: everything cut is retried there, nothing lost
    assert (out.lost == 0).all()
    # those on the instance, and those on their way to it (pool loads, hand-offs)
    assert out.retries.sum() >= out.faults[0]["requests_cut"]


def _mean_e2e(n_clients: int, seed: int) -> float:
    reqs = generate("closed", Workload(**{**W.__dict__, "concurrency": n_clients,
                                          "isl_cv": 0.0, "osl_cv": 0.0}), 400, seed)
    out = Simulation(_disagg(), reqs, "kv", seed).run()
    return float(np.mean(out.done_us - out.issued_us))


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 6), st.integers(1, 12))
def test_latency_grows_with_load(seed, low, extra):
    """More clients of the same requests never make the mean latency shorter."""
    assert _mean_e2e(low + extra, seed) >= _mean_e2e(low, seed) * (1 - 1e-9)


def test_same_seed_same_outcome():
    reqs = generate("agentic", W, 200, 5)
    a = Simulation(_disagg(), reqs, "kv", 5).run()
    b = Simulation(_disagg(), reqs, "kv", 5).run()
    for field in ("issued_us", "first_us", "done_us", "cached", "lost"):
        assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True)
    assert a.itl_us == b.itl_us and a.samples == b.samples


def test_preemptions_happen_when_kv_is_short_and_all_still_finish():
    reqs = generate("closed", Workload(**{**W.__dict__, "concurrency": 24, "osl": 400}),
                    150, 1)
    out = Simulation(_agg(kv_tokens=6_000), reqs, "kv", 1).run()
    assert out.preemptions > 0
    assert (np.isfinite(out.done_us) | (out.lost == 2)).all()


def test_session_pinning_beats_random_on_rank_caches():
    """Without a pool, prefixes live in each prefill rank's cache: pinning sessions keeps
    hitting them, spraying requests at random does not (each rank's cache holds about the
    prefixes of its own share of the sessions)."""
    reqs = generate("closed", Workload(**{**W.__dict__, "prefix_reuse": 0.9,
                                          "isl_cv": 0.0}), 600, 2)
    c = cluster([instance("prefill-00", "prefill", dp=4, max_tokens=1024, kv_tokens=4000),
                 instance("decode-00", "decode", dp=2, max_seqs=8, tray="r0-t02")])
    hits = {p: Simulation(c, reqs, p, 2).run().cached.sum() for p in ("session", "random")}
    assert hits["session"] > 1.5 * hits["random"]


def test_a_request_that_only_fits_without_its_last_block_is_refused_not_cycled():
    """One request whose prompt and output fit the KV cache to the token but not with the
    scheduler's half block: admitted, it would be preempted at once and recomputed forever
    (hypothesis found this case: agentic, 2 clients, an aggregated rank of 10,236 tokens)."""
    reqs = generate("agentic", Workload(**{**W.__dict__, "concurrency": 2}), 107, 42106, 40.0)
    sim = Simulation(_agg(kv_tokens=10_236), reqs, "round-robin", 42106)

    def stuck(*_):
        raise TimeoutError("the run does not end")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(60)
    try:
        out = sim.run()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    edge = (reqs.isl + reqs.osl <= 10_236) & (reqs.isl + reqs.osl + sim.insts[0].half_block
                                              > 10_236)
    assert edge.any() and (out.lost[edge] == 2).all()
    assert (np.isfinite(out.done_us) ^ (out.lost > 0)).all()
