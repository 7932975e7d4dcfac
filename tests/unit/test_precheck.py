"""Precheck arithmetic: weights per GPU per shape, and what fits."""

from pathlib import Path

import pytest

from compiler import arch, catalog
from compiler.graph import build_graph
from compiler.load import load_inputs
from compiler.memory import weights_gib_per_gpu
from compiler.precheck import precheck
from compiler.shapes import candidate_shapes, parse_shape

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_parse_shape():
    assert parse_shape("DEP16").gpus == 16 and parse_shape("DEP16").ep == 16
    assert parse_shape("TP8").tp == 8 and parse_shape("TP8").ep == 1
    assert parse_shape("TP8EP8").ep == 8
    assert parse_shape("TP8EP4") is None and parse_shape("DP2") is None


def test_dep_weights_split_experts_and_replicate_the_rest():
    spec = catalog.model("deepseek-v3").spec
    p = arch.params(spec)
    want = (p.routed_experts / 8 + p.non_expert) / arch.GIB  # FP8: one byte per parameter
    assert weights_gib_per_gpu(spec, parse_shape("DEP8")) == pytest.approx(want)
    tp = (p.routed_experts + p.non_expert) / 8 / arch.GIB
    assert weights_gib_per_gpu(spec, parse_shape("TP8")) == pytest.approx(tp)


def test_dense_model_gets_tensor_parallel_shapes_only():
    shapes = candidate_shapes(catalog.model("llama-3.1-70b").spec, catalog.system("hgx-h200"), 8)
    assert [s.name for s in shapes] == ["TP1", "TP2", "TP4", "TP8"]


def test_h200_example_fits_only_from_eight_gpus():
    inputs = load_inputs(EXAMPLES / "hgx-h200-deepseek-v3" / "deployment.yaml")
    pre = precheck(inputs, build_graph(inputs))
    fits = {f.shape.name for f in pre.fits if f.fits and f.role == "decode"}
    assert fits == {"DEP8", "DEP16", "TP8", "TP8EP8"}
    assert pre.ok


def test_vr_example_engram_share_of_prefill_is_spread_over_the_rack():
    inputs = load_inputs(EXAMPLES / "vr-nvl72-deepseek-v4.1-flash" / "deployment.yaml")
    pre = precheck(inputs, build_graph(inputs))
    dep2 = {f.role: f for f in pre.fits if f.shape.name == "DEP2"}
    engram_decode = 2 * 94.4 / 2
    engram_prefill = 2 * 94.4 / 72
    gap = dep2["decode"].total_gib_per_gpu - dep2["prefill"].total_gib_per_gpu
    assert gap == pytest.approx(engram_decode - engram_prefill)
    assert dep2["prefill"].fits
