"""Step and serving models: monotonic where physics says so, and composed as documented."""

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import catalog
from compiler.load import load_inputs
from compiler.perf.predict import context
from compiler.perf.serving import Workload, per_user_rates, prefix_hit_rate
from compiler.perf.step import PerfContext, decode_step, prefill_step
from compiler.shapes import parse_shape

VR = Path(__file__).resolve().parents[2] / "examples" / "vr-nvl72-deepseek-v4.1-flash"
H200 = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


@pytest.fixture(scope="module")
def vr() -> PerfContext:
    return context(load_inputs(VR / "deployment.yaml"), 32)


@pytest.fixture(scope="module")
def h200() -> PerfContext:
    return context(load_inputs(H200 / "deployment.yaml"), 8)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 255), kv=st.integers(128, 100_000))
def test_decode_step_grows_with_batch_and_context(vr, batch, kv):
    shape = parse_shape("DEP32")
    base = decode_step(vr, shape, batch, kv).us
    assert decode_step(vr, shape, batch + 1, kv).us >= base
    assert decode_step(vr, shape, batch, kv * 2).us >= base


@settings(max_examples=20, deadline=None)
@given(tokens=st.sampled_from([1024, 2048, 4096, 8192, 16384]), cached=st.integers(0, 60_000))
def test_prefill_chunk_grows_with_tokens_and_cached_prefix(h200, tokens, cached):
    shape = parse_shape("DEP8")
    base = prefill_step(h200, shape, tokens, 1024, cached).us
    assert prefill_step(h200, shape, tokens * 2, 1024, cached).us >= base
    assert prefill_step(h200, shape, tokens, 1024, cached + 4096).us >= base


def test_faster_gpu_is_never_slower(h200):
    b200 = catalog.system("hgx-b200")
    faster = dataclasses.replace(h200, system=b200, ops=dataclasses.replace(h200.ops,
                                                                            system=b200))
    for batch in (1, 16, 128):
        assert decode_step(faster, parse_shape("DEP8"), batch, 4096).us \
            <= decode_step(h200, parse_shape("DEP8"), batch, 4096).us


def test_breakdown_sums_to_the_step(vr):
    st_ = decode_step(vr, parse_shape("DEP16"), 32, 30_000)
    assert sum(st_.breakdown.values()) == pytest.approx(st_.us)
    assert {"moe_experts", "dispatch", "combine", "attention", "draft", "engram", "indexer"} \
        <= set(st_.breakdown)


def test_speculation_emits_acceptance_tokens_per_step(vr):
    st_ = decode_step(vr, parse_shape("DEP32"), 8, 30_000)
    w = Workload(1, 1, 0.0, 0.0, 1, 0, 0, 1)
    p50, p90 = per_user_rates(vr, st_, 8, w)
    assert p50 == pytest.approx(1e6 * vr.acceptance / st_.us)
    assert p90 < p50  # acceptance varies between requests


def test_die_local_placement_is_faster_on_rubin(vr):
    interleaved = dataclasses.replace(vr, die_local=False)
    shape = parse_shape("DEP16")
    # batch 4: the expert GEMMs stream their weights (at batch 64 they are compute-bound)
    assert decode_step(vr, shape, 4, 30_000).breakdown["moe_experts"] \
        < decode_step(interleaved, shape, 4, 30_000).breakdown["moe_experts"]


def test_prefix_hit_rate_follows_pool_capacity():
    w = Workload(1000, 100, 0, 0, 10, 0.9, 1000, 10)
    assert prefix_hit_rate(w, 10_000) == pytest.approx(0.9)
    assert prefix_hit_rate(w, 5_000) == pytest.approx(0.45)
    assert prefix_hit_rate(dataclasses.replace(w, prefix_reuse=0.0), 10_000) == 0.0


def test_prefill_overlap_hides_communication_under_compute(h200):
    """Dual-batch overlap: prefill shows only what dispatch and combine do not hide (and the
    SMs they take); decode's low-latency all-to-all is not overlapped."""
    from compiler.perf import comm
    shape = parse_shape("DEP8")
    pre = prefill_step(h200, shape, 16384, 1024, 0)
    exposed = pre.breakdown["dispatch"] + pre.breakdown["combine"]
    link = comm.instance_link(h200.system, 8)
    one = comm.all_to_all_us(h200.system, link, 8, 16384 * 8 * 7168, False)
    assert 0 <= exposed < one * (h200.model.layers - h200.model.dense_layers)
    dec = decode_step(h200, shape, 64, 2048)
    assert dec.breakdown["dispatch"] > 0 and dec.breakdown["combine"] > 0


def test_equal_contexts_share_one_memo():
    """Every prediction of a compile, and a fleet's groups on one system, ask for the same
    contexts: they get one object, so the steps one computed the others reuse."""
    inputs = load_inputs(VR / "deployment.yaml")
    a, b = context(inputs, 32), context(inputs, 32)
    assert a is b
    decode_step(a, parse_shape("DEP32"), 64, 4096)
    assert b._memo
    assert context(inputs, 16) is not a


def test_tensor_parallel_moe_is_the_engines_measured_kernel(h200):
    """Without DP every rank runs the engine's fused MoE over all tokens: where the
    calibration has a measured table of the rank's shape the step charges it, linear between
    token counts, instead of the curve fitted to all shapes. The tables route evenly; at one
    copy per expert random routing leaves 1/e of the experts idle, whose weight reads come
    off, but never the call's one-token time nor below reading the busy experts at the
    datasheet's bandwidth. Under DEP the curve (DeepEP runs other kernels)."""
    import dataclasses
    import math

    from compiler.perf.step import StepTime, _moe_glue_us, moe_layer

    m = h200.model
    inter, experts = m.moe.expert_intermediate // 8, m.moe.experts
    key = (m.dtypes.experts, m.dtypes.scales or "", m.hidden_size, inter, m.moe.top_k,
           experts, experts)
    counts, times = (1, 32, 256, 1024), (60.0, 400.0, 900.0, 2000.0)
    ctx = dataclasses.replace(h200, ops=dataclasses.replace(h200.ops,
                                                            moe_tables={key: (counts, times)}))

    def experts_us(tokens: float, shape: str = "TP8") -> float:
        st_ = StepTime()
        moe_layer(ctx, st_, parse_shape(shape), tokens, 0.0, decode=True)
        return st_.breakdown["moe_experts"]

    # every expert busy (8 copies each and more): random routing reads them all, as measured
    assert experts_us(256) == pytest.approx(900.0, rel=1e-3)
    assert experts_us(640) == pytest.approx(900.0 + 1100.0 * 384 / 768, rel=1e-3)
    one = experts // m.moe.top_k  # one copy per expert on average: 1/e of them idle
    weights = 3 * m.hidden_size * inter  # FP8: a byte each
    hbm = ctx.ops.hbm_bytes_per_us("local")
    saved = experts * math.exp(-1) * weights / (hbm * ctx.ops.curve("grouped_gemm", "fp8").e_mem)
    assert experts_us(one) == pytest.approx(max(400.0 - saved,
                                                -math.expm1(-1) * experts * weights / hbm))
    assert experts_us(one) < 400.0
    assert experts_us(256, "DEP8") != pytest.approx(900.0, rel=1e-3)
    # the fused call's time holds its routing and activation: only the shared expert's glue
    assert _moe_glue_us(ctx, parse_shape("TP8"), 32) < _moe_glue_us(h200, parse_shape("TP8"), 32)


def test_shared_index_layers_run_no_indexer():
    """IndexShare (GLM-5.2): only the layers that own an indexer score the context; the
    others reuse its top-k and still attend only that many tokens."""
    from compiler import arch
    from compiler.perf.step import _among

    def indexers(model, n, which):
        return _among(arch.indexer_owners(model), n, model.layers, which, draft=n)

    m = catalog.model("glm-5.2").spec
    owners = len(m.attention.indexer.source_layers)
    assert 0 < owners < m.layers
    assert indexers(m, m.layers, (None, None, None)) == owners
    assert indexers(m, 10, (None, range(10), None)) == 4  # layers 0, 1, 2 and 6
    assert indexers(m, 1, (1, None, None)) == 1  # the MTP layer owns one
    every = m.model_copy(update={"attention": m.attention.model_copy(update={
        "indexer": m.attention.indexer.model_copy(update={"source_layers": None})})})
    assert indexers(every, m.layers, (None, None, None)) == m.layers


def test_mtp_passes_after_the_first_reuse_the_indexer_top_k(h200):
    """GLM-5.2's index_share_for_mtp_iteration: of k MTP passes only the first runs the MTP
    layer's indexer (vLLM v1/spec_decode/llm_base_proposer.py), so k passes cost k full passes
    less k - 1 indexers; without the flag every pass runs it."""
    from compiler.perf.step import StepTime, _draft_us, _layers

    glm = catalog.model("glm-5.2").spec
    assert glm.draft.index_share
    shared = dataclasses.replace(h200, model=glm, draft_tokens=3)
    own = dataclasses.replace(h200, model=glm.model_copy(update={
        "draft": glm.draft.model_copy(update={"index_share": False})}), draft_tokens=3)
    shape = parse_shape("TP8")
    per_pass = _draft_us(dataclasses.replace(own, draft_tokens=1), shape, 16, 8192)
    mtp_layer = StepTime()
    _layers(own, mtp_layer, shape, 16, 1, 8192, prefill=False, count=1)
    indexer = mtp_layer.breakdown["indexer"]
    assert indexer > 0
    assert _draft_us(own, shape, 16, 8192) == pytest.approx(3 * per_pass)
    assert _draft_us(shared, shape, 16, 8192) == pytest.approx(3 * per_pass - 2 * indexer)
