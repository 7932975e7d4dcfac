"""Pipelined prefill end to end: the plan's stages, the launch flags per node, and the solver
choosing stages where TP alone misses the TTFT SLO."""

import shlex
from pathlib import Path

import pytest

from compiler import api
from schemas.diagnostics import CompileError
from tests.builders import write_case

LONG = {"profile": "fixed", "isl": 131072, "osl": 1024, "concurrency": 16}
SERVING = {"kv_cache_dtype": "fp8", "max_model_len": 135168}


def _case(tmp_path: Path, objective: dict, slo: dict | None = None) -> Path:
    return write_case(tmp_path, system="hgx-h200", model="deepseek-v3", kind="Cluster",
                      hardware={"nodes": 4}, workload=LONG, objective=objective, slo=slo,
                      serving=SERVING)


def _argv(script: str) -> list[str]:
    return shlex.split(script.split("exec ", 1)[1].replace("\\\n", " "))


def test_pinned_stages_span_two_nodes(tmp_path):
    path = _case(tmp_path, {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "TP8PP2", "count": 1},
        {"role": "decode", "shape": "TP8", "count": 2}]})
    result = api.compile(path, only=("vllm",))
    [prefill] = [i for i in result.plan.instances if i.role == "prefill"]
    assert (prefill.tp, prefill.pp, len(prefill.gpus), len(prefill.trays)) == (8, 2, 16, 2)
    scripts = {p: _argv(t) for p, t in result.artifacts.items() if p.startswith("vllm/prefill")}
    assert len(scripts) == 2
    for argv in scripts.values():
        at = argv.index("--pipeline-parallel-size")
        assert argv[at + 1] == "2" and argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    leader, other = (scripts[p] for p in sorted(scripts))
    assert "--headless" not in leader and "--headless" in other
    assert leader[leader.index("--node-rank") + 1] == "0"
    assert other[other.index("--node-rank") + 1] == "1"
    decode = [t for p, t in result.artifacts.items() if p.startswith("vllm/decode")]
    assert decode and all("--pipeline-parallel-size" not in t for t in decode)
    # the memory map: each stage's GPUs hold their own layers, together one TP8's weights
    tp8 = next(i.gpus[0] for i in result.plan.instances if i.role == "decode")
    first, last = (result.plan.memory[f"{prefill.gpus[r]}-d0"] for r in (0, 8))
    whole = result.plan.memory[f"{tp8}-d0"]
    assert first.weights_gib != last.weights_gib
    assert first.weights_gib + last.weights_gib == pytest.approx(whole.weights_gib, abs=0.01)


def test_solver_takes_stages_when_tp_misses_the_ttft(tmp_path):
    """A 128K prompt on TP8 takes ~18 s at best; two stages bring it under 12 s."""
    slo = {"ttft_ms_p90": 12000}
    with pytest.raises(CompileError) as info:
        api.compile(_case(tmp_path / "tp", {"shapes": {"prefill": ["TP8"],
                                                        "decode": ["TP8"]}}, slo), only=("vllm",))
    assert info.value.exit_code == 3
    result = api.compile(_case(tmp_path / "pp", {"shapes": {"prefill": ["TP8", "TP8PP2"],
                                                             "decode": ["TP8"]}}, slo),
                         only=("vllm",))
    assert {i.shape for i in result.plan.instances if i.role == "prefill"} == {"TP8PP2"}
    assert result.plan.predicted.ttft_ms_p90 <= 12000


def test_a_pipelined_prefill_and_its_decode_peers_push_kv(tmp_path):
    """NIXL hands KV off from pipeline stages only by push, and push peers only handshake
    with push peers (catalog/engines/vllm-0.33.yaml kv_connectors.disaggregated_pipelined)."""
    pipelined = api.compile(_case(tmp_path / "pp", {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "TP8PP2", "count": 1},
        {"role": "decode", "shape": "TP8", "count": 2}]}), only=("vllm",)).plan
    assert {i.kv_connectors[0] for i in pipelined.instances} == {"NixlPushConnector"}
    flat = api.compile(_case(tmp_path / "tp", {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "TP8", "count": 2},
        {"role": "decode", "shape": "TP8", "count": 2}]}), only=("vllm",)).plan
    assert {i.kv_connectors[0] for i in flat.instances} == {"NixlConnector"}


def test_the_report_explains_the_stages(tmp_path):
    """The report gives each stage's layers (vLLM's split: 31 + 30 of DeepSeek-V3's 61), GPUs
    and memory, the prompt's own time, and how the KV leaves the stages."""
    result = api.compile(_case(tmp_path / "pp", {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "TP8PP2", "count": 1},
        {"role": "decode", "shape": "TP8", "count": 2}]}), only=("report",))
    [prefill] = [i for i in result.plan.instances if i.role == "prefill"]
    assert prefill.stage_layers == [31, 30]
    md = result.artifacts["report/performance.md"]
    assert "| 0 | 31 | r0-t00-g0 .. r0-t00-g7 | r0-t00 |" in md
    assert "| 1 | 30 | r0-t01-g0 .. r0-t01-g7 | r0-t01 |" in md
    assert "NixlPushConnector" in md and "over the NICs between stages on different nodes" in md
    [row] = [r for r in result.plan.predicted.instances if r.role == "prefill"]
    chunks = 131072 / row.chunk_tokens
    assert row.prompt_us == pytest.approx(chunks * row.prefill_step_us + row.pipeline_fill_us,
                                          rel=1e-6)
