"""Serving model: where the first token comes from, and what TTFT is made of."""

from dataclasses import replace
from pathlib import Path

import pytest

from compiler.load import load_inputs
from compiler.perf import serving
from compiler.perf.predict import Layout, groups, predict_layout, workload
from compiler.shapes import parse_shape

H200 = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


@pytest.fixture(scope="module")
def h200():
    inputs = load_inputs(H200 / "deployment.yaml")
    return inputs, replace(workload(inputs), prefix_reuse=0.0, isl_cv=0.0)


AGG = [Layout("aggregated", parse_shape("DEP8"), 1)]
DISAGG = [Layout("prefill", parse_shape("DEP2"), 2), Layout("decode", parse_shape("DEP4"), 1)]


@pytest.mark.parametrize("layout", [AGG, DISAGG], ids=["aggregated", "disaggregated"])
def test_osl_one_is_all_prefill(h200, layout):
    """The first output token comes from prefill: at OSL 1 no decode step is charged, so the
    request rate is what prefill sustains, and one more output token costs one decode step
    at most (not a second prefill's worth)."""
    inputs, w = h200
    one = predict_layout(inputs, layout, replace(w, osl=1, concurrency=4096))
    two = predict_layout(inputs, layout, replace(w, osl=2, concurrency=4096))
    assert one.requests_per_s >= two.requests_per_s
    assert two.requests_per_s > 0.8 * one.requests_per_s
    assert one.prefill_utilisation == pytest.approx(serving.MAX_UTILISATION, rel=1e-3)


def test_decode_is_charged_osl_minus_one_steps(h200):
    inputs, w = h200
    ctx = groups(inputs, AGG, w)[0].ctx
    assert serving.decode_steps(replace(w, osl=1), ctx) == 0
    assert serving.decode_steps(replace(w, osl=385), ctx) == pytest.approx(384 / ctx.acceptance)


def test_aggregated_ttft_includes_the_prompt_in_chunks(h200):
    """At concurrency 1 the TTFT is the request's own chunked prefill: it grows with the
    uncached prompt (more chunks), and is far more than one decode step."""
    inputs, w = h200
    short = predict_layout(inputs, AGG, replace(w, isl=1024, concurrency=1))
    long = predict_layout(inputs, AGG, replace(w, isl=32768, concurrency=1))
    decode_step_ms = short.instances[0]["decode_step_us"] / 1e3
    assert short.ttft_ms_p50 > 2 * decode_step_ms
    assert long.ttft_ms_p50 > 16 * short.ttft_ms_p50


def test_aggregated_ttft_queues_with_load(h200):
    inputs, w = h200
    light = predict_layout(inputs, AGG, replace(w, concurrency=8))
    heavy = predict_layout(inputs, AGG, replace(w, concurrency=2048))
    assert heavy.prefill_utilisation > light.prefill_utilisation
    assert heavy.ttft_ms_p50 > 2 * light.ttft_ms_p50
    assert heavy.ttft_ms_p90 >= heavy.ttft_ms_p50


VR = Path(__file__).resolve().parents[2] / "examples" / "vr-nvl72-deepseek-v4.1-flash"


def test_agentx_hit_rate_holds_with_the_rack_pool():
    """SYSTEM.md's source material: AgentX prefix hits stay at 96.5-97% at very high
    concurrency with the rack-wide pool. The pool holds the sessions' working set (and four
    times as many sessions), so the hit rate is the trace's reusable share; a pool smaller
    than the working set loses hits in proportion."""
    from compiler.perf.predict import pool_tokens
    inputs = load_inputs(VR / "deployment.yaml")
    w = workload(inputs)
    plan = [Layout("decode", parse_shape("DEP32"), 2), Layout("prefill", parse_shape("DEP2"), 4)]
    pool = pool_tokens(inputs, groups(inputs, plan, w))
    assert 0.965 <= serving.prefix_hit_rate(w, pool) <= 0.97
    assert 0.965 <= serving.prefix_hit_rate(replace(w, sessions=4 * w.sessions), pool) <= 0.97
    working_set = w.sessions * w.shared_prefix_tokens
    assert serving.prefix_hit_rate(w, working_set / 2) == pytest.approx(w.prefix_reuse / 2)


def test_balance_says_what_spare_prefill_buys():
    """One DEP32 decode bound by its supply, 20 DEP2 prefill where 5 would carry it: the
    spare lowers prefill utilisation and TTFT."""
    from types import SimpleNamespace

    from compiler.balance import balance
    inputs = load_inputs(VR / "deployment.yaml")
    plan = [Layout("decode", parse_shape("DEP32"), 1), Layout("prefill", parse_shape("DEP2"), 20)]
    instances = [SimpleNamespace(role="decode", shape="DEP32")] \
        + [SimpleNamespace(role="prefill", shape="DEP2")] * 20
    b = balance(inputs, instances, {"decode:DEP32": 400.0, "prefill:DEP2": 90.0}, 400.0, 72,
                plan)
    assert b["binding_role"] == "decode"
    assert b["one_more_binding_instance_goodput"] == pytest.approx(4 * 90.0)
    assert (b["prefill_instances_needed"], b["prefill_instances_spare"]) == (5, 15)
    assert b["prefill_utilisation_with_spare"] < b["prefill_utilisation_without_spare"]
    assert b["ttft_ms_p90_with_spare"] < b["ttft_ms_p90_without_spare"]


def test_a_long_prompt_queues_for_whole_prompts():
    """At the same utilisation a prompt of 16 chunks waits 16 times as long as a one-chunk
    prompt: the queue's unit is a request's hold on the rank, not one step."""
    one = serving.ttft_us(1000.0, 8192, 8192, 0.0, 0.0, 0.8, 0.9)
    sixteen = serving.ttft_us(1000.0, 8192, 16 * 8192, 0.0, 0.0, 0.8, 0.9)
    wait_one = one - 1000.0 - serving.request_overhead_us(8192)
    wait_sixteen = sixteen - 16 * 1000.0 - serving.request_overhead_us(16 * 8192)
    assert wait_one > 0
    assert wait_sixteen == pytest.approx(16 * wait_one)


def test_a_closed_loop_bounds_the_prefill_wait():
    """No more than the other clients' prompts can be ahead: the wait is capped at it."""
    open_loop = serving.ttft_us(1000.0, 8192, 8192, 0.0, 0.0, 0.95, 0.9)
    closed = serving.ttft_us(1000.0, 8192, 8192, 0.0, 0.0, 0.95, 0.9, max_wait_us=3000.0)
    extra = serving.request_overhead_us(8192)
    assert open_loop > 1000.0 + 3000.0 + extra
    assert closed == pytest.approx(1000.0 + 3000.0 + extra)


EXAMPLE = [Layout("prefill", parse_shape("DEP8"), 1), Layout("decode", parse_shape("DEP8"), 1)]


@pytest.mark.parametrize("layout", [AGG, EXAMPLE], ids=["aggregated", "disaggregated"])
def test_equal_lengths_arrive_in_bursts(h200, layout):
    """A fixed-concurrency client with equal lengths sends its prompts back together: they
    are prefilled in one step of all their tokens, so TTFT grows with concurrency even far
    from saturation; a length spread de-synchronises them and TTFT falls back."""
    inputs, w = h200
    w = replace(w, osl_cv=0.0)
    lone = predict_layout(inputs, layout, replace(w, isl=1024, osl=1024, concurrency=1))
    burst = predict_layout(inputs, layout, replace(w, isl=1024, osl=1024, concurrency=64))
    spread = predict_layout(inputs, layout, replace(w, isl=1024, osl=1024, concurrency=64,
                                                    osl_cv=0.5))
    assert burst.ttft_ms_p50 > 1.5 * lone.ttft_ms_p50
    assert lone.ttft_ms_p50 < spread.ttft_ms_p50 < burst.ttft_ms_p50


def test_a_lone_short_prompt_is_costed_at_its_own_size(h200):
    """One 256-token prompt alone runs a step of 256 tokens, less efficient per token than a
    full chunk: its TTFT is more than its share of a full chunk's time plus the overheads."""
    inputs, w = h200
    short = replace(w, isl=256, osl=64, concurrency=1)
    p = predict_layout(inputs, DISAGG, short)
    chunk = p.instances[-1]
    share_ms = chunk["prefill_step_us"] * 256 / chunk["chunk_tokens"] / 1e3
    assert p.ttft_ms_p50 > share_ms + serving.request_overhead_us(256) / 1e3


def test_request_overhead_grows_with_the_prompt():
    assert serving.request_overhead_us(0) == serving.REQUEST_OVERHEAD_US
    assert serving.request_overhead_us(8192) > serving.request_overhead_us(1024)


def test_arrival_sync():
    assert serving.arrival_sync(1000.0, 0.0) == 1.0
    assert serving.arrival_sync(1000.0, 1e5) == pytest.approx(1000.0 / (12 ** 0.5 * 1e5))
    assert serving.co_batched_tokens(8, 1024, 16384, 1.0) == 8192
    assert serving.co_batched_tokens(64, 1024, 16384, 1.0) == 16384
    assert serving.co_batched_tokens(8, 1024, 16384, 0.0) == 1024


def test_saturated_data_parallel_prefill_loses_nothing_to_imbalance(h200):
    """Prefill only (OSL 1) at a concurrency that keeps every DEP rank's budget full: the
    ranks are equally loaded, so the aggregated rate is what the chunk time alone sustains
    (within the utilisation cap), not a busiest-rank share less."""
    inputs, w = h200
    layout = [Layout("aggregated", parse_shape("DEP2"), 1, max_batched_tokens=16384)]
    p = predict_layout(inputs, layout, replace(w, isl=4096, osl=1, concurrency=4096))
    g = groups(inputs, layout, w)[0]
    chunk_us = serving.prefill_step(g.ctx, g.shape, 16384, 4096, 0.0).us
    alone = 2 * 16384 / chunk_us * 1e6 / 4096  # requests/s of two full ranks
    assert p.requests_per_s > 0.9 * alone


def test_a_prefill_step_holds_at_most_max_num_seqs_prompts(h200):
    """vLLM schedules at most --max-num-seqs requests at once: a prefill pinned to one request
    runs steps of one prompt, not of its whole token budget, and sustains one prompt per
    step per rank."""
    inputs, w = h200
    one = [Layout("prefill", parse_shape("DEP2"), 1, max_batch=1),
           Layout("decode", parse_shape("DEP4"), 1)]
    assert serving.prefill_step_tokens(16384, 1, 1024) == 1024
    assert serving.prefill_step_tokens(16384, 64, 1024) == 16384
    w = replace(w, isl=1024, osl=1, concurrency=4096)
    p = predict_layout(inputs, one, w)
    g = groups(inputs, one, w)[0]
    step_us = serving.prefill_step(g.ctx, g.shape, 1024, 1024, 0.0).us
    assert p.instances[-1]["prefill_step_us"] == pytest.approx(step_us, rel=1e-3)
    assert p.requests_per_s <= 2 / step_us * 1e6 * (1 + 1e-3)
    full = [replace(one[0], max_batch=None), one[1]]  # 64 prompts: full 16,384-token steps
    assert p.requests_per_s < 0.8 * predict_layout(inputs, full, w).requests_per_s


SMALL_DECODE = [Layout("prefill", parse_shape("DEP2"), 2), Layout("decode", parse_shape("DEP4"), 1,
                                                                   max_batch=2)]
SMALL_AGG = [Layout("aggregated", parse_shape("DEP8"), 1, max_batch=2)]
AGG_16 = [Layout("aggregated", parse_shape("DEP8"), 1, max_batch=16)]


@pytest.mark.parametrize("layout", [AGG, DISAGG, SMALL_DECODE, SMALL_AGG, AGG_16],
                         ids=["aggregated", "disaggregated", "few-slots", "few-slots-agg",
                              "agg-16"])
@pytest.mark.parametrize("concurrency", [4, 64, 4096])
@pytest.mark.parametrize("lengths", [(2048, 256), (4096, 64), (8192, 256)],
                         ids=["2k-256", "4k-64", "8k-256"])
def test_a_closed_loop_obeys_littles_law(h200, layout, concurrency, lengths):
    """Oracle: a closed loop of N clients keeps N requests in flight, so requests/s x (TTFT +
    the decode steps) = N, below the limits and at them (where the clients the layout cannot
    hold wait for a prefill rank or a decode slot), also where the aggregated fixed point
    does not settle (4k-64 and 8k-256 at 4,096 clients on agg-16)."""
    inputs, w = h200
    w = replace(w, isl=lengths[0], osl=lengths[1], concurrency=concurrency, osl_cv=0.0)
    p = predict_layout(inputs, layout, w)
    cycle_s = (p.ttft_ms_p50 + (w.osl - 1) * p.tpot_ms_p50) / 1e3
    assert p.requests_per_s * cycle_s == pytest.approx(concurrency, rel=0.01)


def test_admission_at_the_goodput_waits_outside(h200):
    """A closed loop admitted at the solver's goodput: the clients beyond it wait outside the
    deployment, which TTFT at the operating point leaves out (W511 states the queue), so the
    capped prediction keeps the TTFT of the rate it admits, with fewer requests in flight."""
    inputs, w = h200
    w = replace(w, isl=2048, osl=256, concurrency=64, osl_cv=0.0)
    free = predict_layout(inputs, DISAGG, w)
    capped = predict_layout(inputs, DISAGG, w, max_requests_per_s=free.requests_per_s / 2)
    assert capped.requests_per_s == pytest.approx(free.requests_per_s / 2, rel=0.01)
    cycle_s = (capped.ttft_ms_p50 + (w.osl - 1) * capped.tpot_ms_p50) / 1e3
    assert capped.requests_per_s * cycle_s < 0.75 * 64
    assert capped.ttft_ms_p50 <= free.ttft_ms_p50
