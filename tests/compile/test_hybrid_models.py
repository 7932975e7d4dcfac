"""MiniMax M3 and Kimi K3 on a GB300 NVL72 rack (tests/inputs/gb300-*): each loads, fits,
predicts and compiles to engines that carry what vLLM 0.33 needs for it (MSA's 128-token KV
block; Kimi K3's tokenizer under --trust-remote-code, and the KV block vLLM raises for its KDA
state on every engine and the router), with the linear-attention state in the memory budget."""

import re
from pathlib import Path

import pytest
import yaml

from compiler import api, arch, engine_choices, memory
from compiler.load import load_inputs
from compiler.shapes import parse_shape

INPUTS = Path(__file__).resolve().parents[1] / "inputs"
CASES = {"minimax-m3": INPUTS / "gb300-minimax-m3" / "deployment.yaml",
         "kimi-k3": INPUTS / "gb300-kimi-k3" / "deployment.yaml"}


@pytest.fixture(scope="module", params=sorted(CASES))
def compiled(request):
    return request.param, api.compile(CASES[request.param], only=("vllm", "dynamo"))


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


def _dynamo_blocks(artifacts) -> tuple[int, set[int]]:
    """The frontend's --kv-cache-block-size and the workers' --block-size."""
    [dgd] = [d for d in yaml.safe_load_all(artifacts["dynamo/dgd.yaml"])
             if d["kind"] == "DynamoGraphDeployment"]
    args = [(c["type"], c["podTemplate"]["spec"]["containers"][0]["args"])
            for c in dgd["spec"]["components"]]
    [frontend] = [a for kind, a in args if kind == "frontend"]
    workers = [a for kind, a in args if kind != "frontend"]
    assert workers
    return (int(frontend[frontend.index("--kv-cache-block-size") + 1]),
            {int(a[a.index("--block-size") + 1]) for a in workers})


def test_every_engine_and_the_router_run_the_block_vllm_runs(compiled):
    """Kimi K3's engines are given the block vLLM raises its KDA state's to at the smallest TP
    (TP8: 1536 tokens at FP8, TP16 768), which vLLM keeps at every TP: the scripts, the Dynamo
    workers and frontend and the plan's router all say it. MiniMax M3 (no state) keeps MSA's."""
    model, result = compiled
    plan, files = result.plan, result.artifacts
    block = plan.serving.block_size
    hybrid = plan.site.engines["vllm"].facts.hybrid_block
    tps = {i.tp for i in plan.instances}
    if model == "kimi-k3":
        assert tps == {8, 16} and block == 1536  # this plan's layout: both TPs
        assert block == max(engine_choices.hybrid_block(hybrid, tp, 64) for tp in tps)
        assert all(engine_choices.hybrid_block(hybrid, tp, block) == block for tp in tps)
        [decision] = [d for d in plan.decisions if d.path == "serving.block_size"]
        assert (decision.value, decision.source) == ("1536", "rule:hybrid-block")
        assert "TP8 1536, TP16 768" in decision.why
    else:
        assert hybrid is None and block == 128
    scripts = [t for p, t in files.items() if p.endswith(".sh")]
    assert {int(b) for t in scripts for b in re.findall(r"--block-size (\d+)", t)} == {block}
    frontend, workers = _dynamo_blocks(files)
    assert plan.routing.block_size == frontend == block and workers == {block}
