"""Precheck arithmetic: weights per GPU per shape, and what fits."""

from pathlib import Path

import pytest

from compiler import arch, catalog
from compiler.graph import build_graph
from compiler.load import load_inputs
from compiler.memory import gpu_budget, weight_parts_gib
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
    # FP8: one byte per parameter; the embedding and LM head two (BF16)
    rest = p.non_expert + p.embedding + p.lm_head
    want = (p.routed_experts / 8 / arch.GIB, rest / arch.GIB)
    assert weight_parts_gib(spec, parse_shape("DEP8")) == pytest.approx(want)
    tp = (p.routed_experts / 8 / arch.GIB, rest / 8 / arch.GIB)
    assert weight_parts_gib(spec, parse_shape("TP8")) == pytest.approx(tp)


def test_dense_model_gets_tensor_parallel_shapes_only():
    shapes = candidate_shapes(catalog.model("llama-3.1-70b").spec, catalog.system("hgx-h200"), 8,
                              catalog.engines().vllm.pipeline)
    assert [s.name for s in shapes] == ["TP1", "TP2", "TP4", "TP8"]


def test_h200_example_fits_only_from_eight_gpus():
    inputs = load_inputs(EXAMPLES / "hgx-h200-deepseek-v3" / "deployment.yaml")
    pre = precheck(inputs, build_graph(inputs))
    fits = {f.shape.name for f in pre.fits if f.fits and f.role == "decode"}
    assert fits == {"DEP8", "DEP16", "TP8", "TP8EP8"}
    assert pre.ok


def test_vr_example_prefill_keeps_engram_in_host_memory_decode_in_its_own_hbm():
    """vLLM 0.33 cannot shard Engram across instances: the prefill peer group of SYSTEM.md
    falls back to host tables (no HBM share), decode shards over its own GPUs."""
    inputs = load_inputs(EXAMPLES / "vr-nvl72-deepseek-v4.1-flash" / "deployment.yaml")
    prefill = gpu_budget(inputs, "prefill", parse_shape("DEP2"), 72)
    decode = gpu_budget(inputs, "decode", parse_shape("DEP2"), 2)
    assert prefill.engram_gib == 0.0
    assert decode.engram_gib == pytest.approx(2 * 94.4 / 2, rel=1e-3)
    pre = precheck(inputs, build_graph(inputs))
    assert {f.role: f.fits for f in pre.fits if f.shape.name == "DEP2"} == {
        "prefill": True, "decode": True}


def _glm_deployment(tmp_path: Path, max_model_len: int) -> Path:
    (tmp_path / "rack.yaml").write_text(
        "apiVersion: rackc.dev/v1alpha1\nkind: Rack\nmetadata: {name: h}\n"
        "spec: {system: hgx-h200, trays: 2}\n")
    path = tmp_path / "deployment.yaml"
    path.write_text(
        "apiVersion: rackc.dev/v1alpha1\nkind: Deployment\nmetadata: {name: glm}\n"
        "spec:\n  rack: rack.yaml\n  model: glm-4.5\n  workload: {profile: chat}\n"
        f"  serving: {{max_model_len: {max_model_len}}}\n")
    return path


@pytest.mark.parametrize("max_model_len", [8192, 65536, 69632, 100352, 131072])
def test_a_shape_precheck_passes_holds_one_max_length_request(tmp_path, max_model_len):
    """One budget: whatever precheck lets through keeps at least one maximum-length request's
    KV in the memory map (glm-4.5 DEP8 at 69,632 tokens used to pass with less)."""
    inputs = load_inputs(_glm_deployment(tmp_path, max_model_len))
    pre = precheck(inputs, build_graph(inputs))
    checked = 0
    for f in pre.fits:
        if not f.fits:
            continue
        mem = gpu_budget(inputs, f.role, f.shape, 16 if f.role == "prefill" else f.shape.gpus)
        assert mem.kv_gib >= mem.kv_min_gib - 1e-9, (f.role, f.shape.name)
        assert mem.budget_gib + mem.reserved_gib <= mem.capacity_gib + 1e-9
        checked += 1
    assert checked


def test_glm_dep8_at_69632_tokens_does_not_fit_on_h200(tmp_path):
    inputs = load_inputs(_glm_deployment(tmp_path, 69632))
    pre = precheck(inputs, build_graph(inputs))
    assert {f.role: f.fits for f in pre.fits if f.shape.name == "DEP8"} == {
        "prefill": False, "decode": False}
