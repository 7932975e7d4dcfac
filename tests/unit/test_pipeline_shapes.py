"""Pipeline-parallel shapes (TPnPPm): parsing, vLLM's layer split, the shape rules, and the
per-stage memory budget."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiler import arch, catalog
from compiler.load import load_inputs
from compiler.memory import gpu_budget, stage_budgets, stage_weight_parts_gib
from compiler.shapes import parse_shape, shape_problem, stage_layer_mix, stage_layers

ROOT = Path(__file__).resolve().parents[2]
PP_EXAMPLE = ROOT / "examples" / "hgx-h200-x4-deepseek-v3-128k-pp" / "deployment.yaml"


def test_pp_shapes_parse_into_stages_of_tp_ranks():
    s = parse_shape("TP8PP2")
    assert (s.gpus, s.tp, s.pp, s.dp, s.ep, s.stage_gpus) == (16, 8, 2, 1, 1, 8)
    e = parse_shape("TP8EP8PP2")
    assert (e.gpus, e.ep, e.stage_gpus) == (16, 8, 8)
    assert parse_shape("TP8PP1") is None  # PP1 is TP8
    assert parse_shape("TP8PP0") is None
    assert parse_shape("TP8").pp == 1


def test_stage_layers_follow_vllm_get_pp_indices():
    # distributed/utils.py get_pp_indices: the remainder goes to the stages before the last
    assert stage_layers(61, 2) == [31, 30]
    assert stage_layers(61, 4) == [15, 15, 16, 15]
    assert stage_layers(10, 4) == [2, 3, 3, 2]
    assert stage_layers(8, 2) == [4, 4]


@given(layers=st.integers(1, 200), pp=st.integers(1, 16))
def test_stage_layers_cover_every_layer_once(layers, pp):
    if pp > layers:
        return
    parts = stage_layers(layers, pp)
    assert sum(parts) == layers and len(parts) == pp and max(parts) - min(parts) <= 1


def test_dense_layers_sit_on_the_first_stage():
    model = catalog.model("deepseek-v3").spec  # 3 dense layers first
    mix = stage_layer_mix(model, 2)
    assert mix == [(31, 3, 0), (30, 0, 0)]


PIPE = catalog.engines().vllm.pipeline


def test_pp_shape_rules():
    dsv3, hgx = catalog.model("deepseek-v3").spec, catalog.system("hgx-h200")
    assert shape_problem(parse_shape("TP8PP2"), dsv3, hgx, 32, PIPE) is None
    assert shape_problem(parse_shape("TP8EP8PP2"), dsv3, hgx, 32, PIPE) is None
    assert "data-parallel" in shape_problem(parse_shape("DEP8PP2"), dsv3, hgx, 32, PIPE)
    assert "61 layers" in shape_problem(parse_shape("TP1PP64"), dsv3, hgx, 64, PIPE)
    assert "NVLink domain" in shape_problem(parse_shape("TP16PP2"), dsv3, hgx, 32, PIPE)
    gpt_oss = catalog.model("gpt-oss-120b").spec  # sliding-window layers: hybrid KV
    assert "hybrid" in shape_problem(parse_shape("TP4PP2"), gpt_oss, hgx, 32, PIPE)
    v41 = catalog.model("deepseek-v4.1-flash").spec  # compressed caches: hybrid KV as well
    assert "hybrid" in shape_problem(parse_shape("TP4PP2"), v41, hgx, 32, PIPE)
    nvl = catalog.system("gb200-nvl72")
    # 16 GPUs in one domain
    assert shape_problem(parse_shape("TP8PP2"), dsv3, nvl, 72, PIPE) is None


@pytest.fixture(scope="module")
def inputs():
    return load_inputs(PP_EXAMPLE)


def test_stages_hold_the_whole_model_once(inputs):
    """Each weight is on exactly one stage (DeepSeek-V3 has an untied LM head): the stages'
    weights, summed over their GPUs, are the model's."""
    model, shape = inputs.model.spec, parse_shape("TP8PP2")
    parts = stage_weight_parts_gib(model, shape)
    total = sum(e * shape.stage_gpus + r * shape.tp for e, r in parts)
    assert total == pytest.approx(arch.weight_bytes(model) / arch.GIB, rel=1e-9)
    # the embedding on the first stage, the LM head on the last: the stages differ
    assert parts[0] != parts[1]


def test_stage_budget_splits_weights_and_kv(inputs):
    tp8, pp2 = parse_shape("TP8"), parse_shape("TP8PP2")
    whole = gpu_budget(inputs, "prefill", tp8, 16)
    stages = stage_budgets(inputs, "prefill", pp2, 16)
    assert len(stages) == 2
    for layers, b in zip(stage_layers(61, 2), stages, strict=True):
        assert b.kv_token_bytes == pytest.approx(whole.kv_token_bytes * layers / 61)
        assert b.weights_gib < 0.55 * whole.weights_gib
    bound = gpu_budget(inputs, "prefill", pp2, 16)
    assert bound in stages  # the stage with the fewest KV tokens bounds the instance
    tokens = [b.kv_gib / b.kv_token_bytes for b in stages]
    assert bound.kv_gib / bound.kv_token_bytes == min(tokens)
    assert min(tokens) > 2 * whole.kv_gib / whole.kv_token_bytes
