"""Op model properties for any valid curve, dtype and catalog system: no prediction beats the
roofline, time never falls as work grows, and a faster GPU is never slower."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import catalog
from compiler.catalog.system import Sourced, System
from compiler.perf import ops
from compiler.perf.ops import Curve, OpModel

SYSTEMS = catalog.system_names()
OPS = ("gemm", "grouped_gemm", "attn_decode", "attn_prefill", "indexer", "copy")

efficiency = st.floats(0.05, 1.0)
term = st.one_of(st.just(0.0), st.floats(1e-3, 1e4))
curves = st.builds(Curve, e_max=efficiency, size_half=term, e_mem=efficiency,
                   overhead_us=st.floats(0.0, 50.0), depth_half=term, streams_full=term)
sizes = st.integers(1, 1 << 16)
heads = st.sampled_from([(64, 8), (64, 4), (32, 32), (128, 1), (16, 1), (128, 128)])
head_dims = st.sampled_from([64, 128, 192, 576])
dtypes = st.sampled_from(ops.DTYPES)
placements = st.sampled_from(ops.PLACEMENTS)


@st.composite
def models(draw: st.DrawFn) -> OpModel:
    """A catalog system with either its calibration, the defaults, or one random curve."""
    system = catalog.system(draw(st.sampled_from(SYSTEMS)))
    choice = draw(st.sampled_from(["catalog", "defaults", "random"]))
    if choice == "catalog":
        return ops.op_model(system, catalog.calibration(system.name))
    if choice == "defaults":
        return OpModel(system)
    curve = draw(curves)
    return OpModel(system, {op: {ops.ANY_DTYPE: curve} for op in OPS})


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, dict]:
    """An op and keyword arguments for it (dtype included)."""
    op = draw(st.sampled_from(OPS))
    q_heads, kv_heads = draw(heads)
    if op == "gemm":
        args = {"m": draw(sizes), "n": draw(sizes), "k": draw(sizes)}
    elif op == "grouped_gemm":
        args = {"experts": draw(st.integers(1, 384)),
                "tokens_per_expert": draw(st.floats(0.01, 8192.0)),
                "k": draw(sizes), "n": draw(sizes), "skew": draw(st.floats(1.0, 4.0))}
    elif op == "attn_decode":
        args = {"batch": draw(st.integers(1, 1024)), "q_heads": q_heads, "kv_heads": kv_heads,
                "head_dim": draw(head_dims), "kv_len": draw(st.integers(1, 1 << 18)),
                "q_len": draw(st.integers(1, 8)),
                "v_head_dim": draw(st.sampled_from([None, 128, 512])),
                "topk": draw(st.sampled_from([None, 512, 2048]))}
    elif op == "attn_prefill":
        args = {"seq_len": draw(st.integers(1, 1 << 16)), "q_heads": q_heads,
                "kv_heads": kv_heads, "head_dim": draw(head_dims), "causal": draw(st.booleans()),
                "kv_len": draw(st.integers(0, 1 << 17))}
    elif op == "indexer":
        args = {"batch": draw(st.integers(1, 1024)), "q_len": draw(st.integers(1, 8)),
                "heads": draw(st.sampled_from([32, 64])), "head_dim": 128,
                "kv_len": draw(st.integers(1, 1 << 18))}
    else:
        return op, {"nbytes": draw(st.integers(1, 1 << 36))}
    return op, {"dtype": draw(dtypes), **args}


WORK = {"gemm": ops.gemm_work, "grouped_gemm": ops.grouped_gemm_work,
        "attn_decode": ops.attn_decode_work, "attn_prefill": ops.attn_prefill_work,
        "indexer": ops.indexer_work, "copy": ops.copy_work}


def predict(model: OpModel, op: str, args: dict) -> float:
    return getattr(model, op)(**args)


def roofline(model: OpModel, op: str, args: dict) -> float:
    """The bound at full (die-local) bandwidth, whatever the placement asked."""
    work = WORK[op](**{k: v for k, v in args.items() if k != "placement"})
    return model.roofline_us(work.flops, work.nbytes, args.get("dtype", "bf16"))


@settings(max_examples=400, deadline=None)
@given(models(), queries(), placements)
def test_no_prediction_beats_the_roofline(model: OpModel, query: tuple[str, dict],
                                          placement: str):
    op, args = query
    if op != "attn_prefill":
        args = {**args, "placement": placement}
    assert predict(model, op, args) >= roofline(model, op, args) * (1 - 1e-12)


GROWING = {  # op -> the arguments whose growth must never make it faster
    "gemm": ("m",), "grouped_gemm": ("tokens_per_expert",), "attn_decode": ("batch", "kv_len"),
    "attn_prefill": ("seq_len", "kv_len"), "indexer": ("batch", "kv_len"), "copy": ("nbytes",)}


@settings(max_examples=400, deadline=None)
@given(models(), queries(), st.floats(1.0, 64.0), st.data())
def test_more_work_never_predicts_faster(model: OpModel, query: tuple[str, dict],
                                         factor: float, data: st.DataObject):
    op, args = query
    name = data.draw(st.sampled_from(GROWING[op]))
    grown = args[name] * factor if isinstance(args[name], float) else round(args[name] * factor)
    bigger = {**args, name: grown}
    assert predict(model, op, bigger) >= predict(model, op, args) * (1 - 1e-12)


def faster(system: System, compute: float, memory: float) -> System:
    """`system` with every peak scaled by `compute` and HBM bandwidth by `memory`."""
    gpu = system.gpu
    tflops = gpu.tflops.model_copy(update={
        dt: Sourced(value=getattr(gpu.tflops, dt).value * compute, source="test: scaled")
        for dt in ops.DTYPES})
    hbm = Sourced(value=gpu.hbm_tbytes_per_s.value * memory, source="test: scaled")
    return system.model_copy(update={"gpu": gpu.model_copy(
        update={"tflops": tflops, "hbm_tbytes_per_s": hbm})})


@settings(max_examples=300, deadline=None)
@given(models(), queries(), st.floats(1.0, 8.0), st.floats(1.0, 8.0))
def test_a_faster_gpu_never_predicts_slower(model: OpModel, query: tuple[str, dict],
                                            compute: float, memory: float):
    op, args = query
    quick = OpModel(faster(model.system, compute, memory), model.curves, model.source)
    assert predict(quick, op, args) <= predict(model, op, args) * (1 + 1e-12)


@pytest.mark.parametrize("system", SYSTEMS)
def test_die_local_placement_is_fastest_and_remote_slowest(system: str):
    s = catalog.system(system)
    model = ops.op_model(s, catalog.calibration(system))
    times = [model.grouped_gemm("fp4", 48, 8, 4096, 4608, placement=p) for p in ops.PLACEMENTS]
    assert times == sorted(times)
    if s.domains_per_gpu == 1:
        assert times[0] == times[-1]
    else:
        assert times[0] < times[1] < times[2]


def test_rubin_local_weights_read_at_full_bandwidth_and_remote_at_its_factor():
    s = catalog.system("vera-rubin-nvl72")
    model = OpModel(s, {"copy": {ops.ANY_DTYPE: Curve(1.0, 0.0, 1.0, 0.0)}})
    nbytes = 22e9  # one millisecond at 22 TB/s
    assert model.copy(nbytes, placement="local") == pytest.approx(1e3)
    assert model.copy(nbytes, placement="remote") == pytest.approx(
        1e3 / s.gpu.hbm_remote_factor.value)


def test_topk_caps_the_attended_tokens():
    model = ops.op_model(catalog.system("hgx-h200"), catalog.calibration("hgx-h200"))
    sparse = model.attn_decode("fp8", 64, 128, 1, 576, 100_000, v_head_dim=512, topk=2048)
    assert sparse == model.attn_decode("fp8", 64, 128, 1, 576, 2048, v_head_dim=512)
    assert sparse < model.attn_decode("fp8", 64, 128, 1, 576, 100_000, v_head_dim=512)


def test_mla_latent_is_read_once_and_gqa_reads_k_and_v():
    mla = ops.attn_decode_work("bf16", 1, 128, 1, 576, 1000, v_head_dim=512)
    gqa = ops.attn_decode_work("bf16", 1, 64, 8, 128, 1000)
    assert mla.nbytes == 1000 * 576 * 2 + 128 * (576 + 512) * 2
    assert gqa.nbytes == 1000 * 8 * 256 * 2 + 64 * 256 * 2


def test_fp4_runs_on_the_fp8_curve_with_smaller_weights():
    model = ops.op_model(catalog.system("hgx-h200"), catalog.calibration("hgx-h200"))
    assert model.curve("gemm", "fp4") == model.curve("gemm", "fp8")
    assert model.gemm("fp4", 1, 8192, 8192) < model.gemm("fp8", 1, 8192, 8192)


def test_indexer_borrows_decode_attention_curve():
    model = ops.op_model(catalog.system("hgx-h200"), catalog.calibration("hgx-h200"))
    assert model.curve("indexer", "fp8") == model.curve("attn_decode", "fp8")
    assert model.curve("indexer", "bf16") == model.curve("attn_decode", "bf16")


@pytest.mark.parametrize("bad", [dict(e_max=1.01), dict(e_mem=0.0), dict(overhead_us=-1.0),
                                 dict(streams_full=-2.0)])
def test_curves_that_could_beat_the_roofline_are_refused(bad: dict):
    with pytest.raises(ValueError, match="must be"):
        Curve(**{"e_max": 0.7, "size_half": 1.0, "e_mem": 0.8, "overhead_us": 2.0, **bad})


@pytest.mark.parametrize("system", SYSTEMS)
def test_every_catalog_system_has_a_calibration_that_loads(system: str):
    calibration = catalog.calibration(system)
    assert calibration is not None and calibration["system"] == system
    model = ops.op_model(catalog.system(system), calibration)
    assert model.gemm("bf16", 1, 4096, 4096) > 0
    assert calibration["source"].startswith(("assumed", "measured"))


def test_random_routing_reads_the_experts_that_receive_a_token():
    """Oracle: route T x k copies to E experts at random and count the experts hit; the
    weight bytes of random routing are that share of all experts (about E (1 - e^-t)), fewer
    than evenly spread routing's min(1, t) share, and equal once every expert is hit."""
    import random

    experts, k, n = 256, 7168, 512
    whole = experts * n * k  # fp8: one byte per weight
    rng = random.Random(0)
    for tokens in (4, 16, 32):
        copies = tokens * 8
        hit = sum(len({rng.randrange(experts) for _ in range(copies)})
                  for _ in range(400)) / 400
        t = copies / experts
        random_bytes = ops.grouped_gemm_work("fp8", experts, t, k, n, tile_rows=1).nbytes
        even_bytes = ops.grouped_gemm_work("fp8", experts, t, k, n).nbytes
        rows = experts * t * (k + 2 * n)
        assert (random_bytes - rows) / whole == pytest.approx(hit / experts, rel=0.02)
        assert even_bytes - rows == pytest.approx(whole * min(1.0, t))
    busy = ops.grouped_gemm_work("fp8", experts, 64.0, k, n, tile_rows=1).nbytes
    assert busy == pytest.approx(ops.grouped_gemm_work("fp8", experts, 64.0, k, n).nbytes)


def test_fused_moe_tables_interpolate_tokens_and_widths():
    """Between measured token counts linearly; a width the tables lack from the two nearest
    measured widths (affine in width), never below the narrowest in proportion."""
    key = ("fp8", "block", 3072, 384, 8, 256, 256)
    wide = (*key[:3], 768, *key[4:])
    tables = {key: ((1, 32), (100.0, 300.0)), wide: ((1, 32), (150.0, 500.0))}
    model = ops.OpModel(catalog.system("hgx-h200"), moe_tables=tables)

    def at(tokens: float, inter: int = 384, scales: str = "block", experts: int = 256):
        return model.fused_moe("fp8", scales, tokens, 3072, inter, 8, experts, experts)

    assert at(16.5) == pytest.approx(200.0)
    assert at(64) == pytest.approx(300 + 200 * 32 / 31)  # the last slope onward
    assert at(1, 576) == pytest.approx(125.0)
    assert at(1, 192) == pytest.approx(75.0)
    # at 32 tokens 300 - (500 - 300) / 2 = 200 is above 300 x 192 / 384 = 150
    assert at(32, 192) == pytest.approx(200.0)
    steep = ops.OpModel(catalog.system("hgx-h200"), moe_tables={
        key: ((1, 32), (100.0, 100.0)), wide: ((1, 32), (400.0, 400.0))})
    assert steep.fused_moe("fp8", "block", 1, 3072, 192, 8, 256, 256) == pytest.approx(50.0)
    assert at(1, experts=128) is None  # other experts
    assert at(1, scales="") is None  # a per-tensor FP8 kernel is another table
