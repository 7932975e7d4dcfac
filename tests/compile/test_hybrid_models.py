"""MiniMax M3 and Kimi K3 on a GB300 NVL72 rack (tests/inputs/gb300-*): each loads, fits,
predicts and compiles to engines that carry what vLLM 0.33 needs for it (MSA's 128-token KV
block; Kimi K3's tokenizer under --trust-remote-code), with the linear-attention state in the
memory budget."""

from pathlib import Path

import pytest

from compiler import api, arch, memory
from compiler.load import load_inputs
from compiler.shapes import parse_shape

INPUTS = Path(__file__).resolve().parents[1] / "inputs"
CASES = {"minimax-m3": INPUTS / "gb300-minimax-m3" / "deployment.yaml",
         "kimi-k3": INPUTS / "gb300-kimi-k3" / "deployment.yaml"}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request):
    return request.param, api.compile(CASES[request.param], only=("vllm",))


@pytest.mark.parametrize("model", sorted(CASES))
def test_check_loads_the_model_and_finds_shapes_that_fit(model):
    result = api.check(CASES[model])
    assert result["ok"] and result["model"] == model, result["diagnostics"]
    assert any(s["fits"] for s in result["shapes"])
    assert (result["state_bytes_per_request"] > 0) == (model == "kimi-k3")


def test_compiles_predicts_and_emits_what_vllm_needs(compiled):
    model, result = compiled
    plan = result.plan
    assert plan.predicted.requests_per_s > 0 and plan.predicted.tokens_per_s_per_user_p90 > 0
    scripts = [t for p, t in result.artifacts.items() if p.endswith(".sh")]
    assert scripts
    if model == "minimax-m3":
        assert plan.serving.block_size == 128
        assert all("--block-size 128" in t for t in scripts)
    else:
        assert plan.serving.model_flags == ["--trust-remote-code"]
        assert all("--trust-remote-code" in t for t in scripts)


def test_kimi_k3_budget_holds_each_requests_state():
    """One maximum-length request is its MLA KV at 131072 tokens plus its KDA state, both
    per GPU of a TP8 rank (the latent replicated, the KDA heads split)."""
    inputs = load_inputs(CASES["kimi-k3"])
    spec, shape = inputs.model.spec, parse_shape("TP8")
    budget = memory.gpu_budget(inputs, "aggregated", shape, 8)
    state = arch.state_bytes_per_request(spec) / 8
    assert budget.state_bytes == state
    assert budget.kv_min_gib * arch.GIB == pytest.approx(
        arch.kv_bytes_per_token(spec, "fp8") * 131072 + state)
    assert budget.requests_at(1) == int(budget.kv_gib * arch.GIB
                                        / (budget.kv_token_bytes + state))
