"""The pipelined prefill: stage times, the activations between stages, TTFT and throughput
against the number of stages (compiler/perf/step.py prefill_stages)."""

from pathlib import Path

import pytest

from compiler.load import load_inputs
from compiler.perf import serving
from compiler.perf.predict import context
from compiler.perf.step import prefill_stages, prefill_step, stage_transfer_us
from compiler.shapes import parse_shape

PP_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" \
    / "hgx-h200-x4-deepseek-v3-128k-pp" / "deployment.yaml"
ISL = 131072
CHUNK = 8192


@pytest.fixture(scope="module")
def inputs():
    return load_inputs(PP_EXAMPLE)


def _idle_ttft(inputs, name: str, isl: int = ISL) -> float:
    shape = parse_shape(name)
    st = prefill_step(context(inputs, 16, "prefill", shape), shape, CHUNK, isl, 0.0)
    return serving.ttft_us(st.us, CHUNK, isl, 0.0, 0.0, 0.0, 0.5, st.fill_us)


def test_a_long_prompt_fills_the_pipeline(inputs):
    """16 chunks through 2 stages take 17 stage turns of about half a TP8 step: TTFT falls to
    about 17/32 of TP8's (a little more: the activations cross the NIC, each stage has its
    own per-step overhead)."""
    ratio = _idle_ttft(inputs, "TP8PP2") / _idle_ttft(inputs, "TP8")
    assert 17 / 32 <= ratio <= 0.6


def test_more_stages_shorten_a_long_prompt(inputs):
    assert _idle_ttft(inputs, "TP8PP4") < _idle_ttft(inputs, "TP8PP2") < _idle_ttft(inputs, "TP8")


def test_a_one_chunk_prompt_gains_nothing_from_stages(inputs):
    """One chunk passes every stage in turn: the bubble leaves the other stage idle."""
    assert _idle_ttft(inputs, "TP8PP2", CHUNK) >= _idle_ttft(inputs, "TP8", CHUNK)


def test_throughput_is_the_slowest_stage(inputs):
    """A chunk enters every slowest-stage time: per GPU, a pipeline never beats TP8 (it adds
    the sends and a per-stage overhead) and loses little."""
    tp8, pp2 = parse_shape("TP8"), parse_shape("TP8PP2")
    whole = prefill_step(context(inputs, 16, "prefill", tp8), tp8, CHUNK, ISL, 0.0).us
    ctx = context(inputs, 16, "prefill", pp2)
    stages = prefill_stages(ctx, pp2, CHUNK, ISL, 0.0)
    step = prefill_step(ctx, pp2, CHUNK, ISL, 0.0)
    assert step.us == pytest.approx(max(s.us for s in stages))
    assert step.us + step.fill_us == pytest.approx(sum(s.us for s in stages))
    per_gpu_tp8, per_gpu_pp2 = CHUNK / whole / 8, CHUNK / step.us / 16
    assert 0.9 * per_gpu_tp8 <= per_gpu_pp2 <= per_gpu_tp8


def test_activations_cross_the_nic_only_between_nodes(inputs):
    """TP4PP4 on 8-GPU HGX nodes: stages 0-1 on the first node, 2-3 on the second; only the
    hand-off into stage 2 goes over the NIC (400 Gb/s per GPU vs NVLink's 450 GB/s)."""
    shape = parse_shape("TP4PP4")
    ctx = context(inputs, 16, "prefill", shape)
    inside = stage_transfer_us(ctx, shape, CHUNK, 1)
    across = stage_transfer_us(ctx, shape, CHUNK, 2)
    assert across > 2 * inside  # both end in the same all-gather over the stage's NVLink
    stages = prefill_stages(ctx, shape, CHUNK, ISL, 0.0)
    assert "stage_recv" not in stages[0].breakdown
    assert all(s.breakdown["stage_recv"] > 0 for s in stages[1:])
    assert "lm_head" in stages[-1].breakdown and "lm_head" not in stages[0].breakdown
