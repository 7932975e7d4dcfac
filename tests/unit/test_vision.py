"""Vision towers: their weights, --language-model-only for text workloads, and image tokens in
the prefill (Qwen3-VL-235B-A22B, DeepSeek-V4.1-Flash)."""

import pytest

from compiler import arch, catalog
from compiler.load import load_inputs
from compiler.perf.predict import context
from compiler.perf.step import prefill_step
from compiler.shapes import parse_shape
from schemas.diagnostics import CompileError
from tests.builders import write_case

VL = "qwen3-vl-235b-a22b"


def _vit_params(layers, h, inter, gated, patch, frames, positions, merge, mergers, mid, out):
    """The towers' tensors as vLLM builds them, written out per module (biases aside)."""
    qkv, proj = h * 3 * h, h * h
    mlp = (2 * inter * h + inter * h) if gated else (h * inter + inter * h)
    patch_embed = 3 * frames * patch * patch * h
    merger = (h * merge * merge) * mid + mid * out
    return layers * (qkv + proj + mlp) + patch_embed + positions * h + mergers * merger


def test_qwen3_vl_tower_and_total():
    spec = catalog.model(VL).spec
    assert arch.params(spec).vision == _vit_params(27, 1152, 4304, False, 16, 2, 2304, 2, 4,
                                                   4608, 4096)
    # the text stack is Qwen3-235B-A22B's; the whole checkpoint about 236B parameters
    text = arch.params(catalog.model("qwen3-235b-a22b").spec)
    assert arch.params(spec).total == text.total
    total = (arch.params(spec).total + arch.params(spec).vision) / 1e9
    assert total == pytest.approx(236, rel=0.01)
    assert arch.active_params(spec) / 1e9 == pytest.approx(22, rel=0.03)


def test_v41_backbone_is_552b():
    """Recipe: '552B backbone parameters' (routed experts, attention, embeddings)."""
    spec = catalog.model("deepseek-v4.1-flash").spec
    assert arch.params(spec).total / 1e9 == pytest.approx(552, rel=0.005)
    assert arch.params(spec).vision == _vit_params(32, 1024, 2816, True, 14, 1, 0, 3, 1, 5120,
                                                   5120)


def _inputs(tmp_path, workload, model=VL):
    return load_inputs(write_case(tmp_path, "gb300-nvl72", model, workload=workload))


def test_text_only_workload_skips_the_tower(tmp_path):
    r = _inputs(tmp_path, {"profile": "chat"}).resolved
    assert r.language_model_only.value is True and not r.loads_vision
    r = _inputs(tmp_path / "img", {"profile": "chat", "images_per_request": 1,
                                   "tokens_per_image": 1024}).resolved
    assert r.language_model_only.value is False and r.loads_vision
    assert _inputs(tmp_path / "text", {"profile": "chat"}, "qwen3-32b") \
        .resolved.language_model_only is None


def test_images_lengthen_the_prompt_and_the_prefill(tmp_path):
    text = _inputs(tmp_path, {"profile": "fixed", "isl": 1024, "osl": 128})
    image = _inputs(tmp_path / "img", {"profile": "fixed", "isl": 1024, "osl": 128,
                                       "images_per_request": 2, "tokens_per_image": 1024})
    assert image.resolved.workload_value("isl") == 1024 + 2 * 1024
    shape = parse_shape("TP4")
    plain = prefill_step(context(text, 4, "prefill", shape), shape, 8192, 3072, 0)
    with_vit = prefill_step(context(image, 4, "prefill", shape), shape, 8192, 3072, 0)
    assert "vision" not in plain.breakdown and with_vit.breakdown["vision"] > 0
    assert with_vit.us == pytest.approx(plain.us + with_vit.breakdown["vision"])


@pytest.mark.parametrize(("model", "workload", "code"), [
    ("qwen3-32b", {"images_per_request": 1, "tokens_per_image": 256}, "E105"),
    (VL, {"images_per_request": 1}, "E104"),
    ("deepseek-v4.1-flash", {"images_per_request": 1, "tokens_per_image": 4096}, "E104"),
])
def test_image_workloads_the_model_cannot_take_are_diagnostics(tmp_path, model, workload, code):
    with pytest.raises(CompileError) as info:
        _inputs(tmp_path, {"profile": "chat", **workload}, model)
    assert info.value.diagnostics[0].code == code
    assert info.value.diagnostics[0].path.startswith("spec.workload.")
