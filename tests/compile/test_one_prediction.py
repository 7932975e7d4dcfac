"""A layout has one prediction, whichever command produced it: compile's choice, pinned as the
solver chose it (shapes and counts only), predicts byte-identically through `predict`'s short
path and through a pinned compile; an SLO the prediction misses is a W510 warning on every
command and stays in the plan."""

from collections import Counter
from pathlib import Path

import pytest
import yaml

from compiler import api
from compiler.cli import main
from compiler.hf_import import import_hf
from compiler.pinned import predict_pinned
from tests.builders import write_case

QWEN3_8B = Path(__file__).resolve().parents[1] / "inputs" / "qwen3-8b" / "config.json"
CHAT_SLO = {"tokens_per_s_per_user_p90": 50, "ttft_ms_p90": 2000}


def _qwen3_8b(root: Path) -> str:
    root.mkdir(parents=True, exist_ok=True)
    text = import_hf(QWEN3_8B, "config.json", "qwen3-8b", "Qwen/Qwen3-8B")
    (root / "model.yaml").write_text(text)
    return "model.yaml"


CASES = {
    "qwen3-8b-h100": lambda root: write_case(
        root, system="hgx-h100", model=_qwen3_8b(root), kind="Cluster",
        hardware={"nodes": 1}, workload={"profile": "chat"}, slo=CHAT_SLO),
    "qwen3-30b-gb200": lambda root: write_case(
        root, system="gb200-nvl72", model="qwen3-30b-a3b", hardware={"trays": 4},
        workload={"profile": "chat"}, slo={"tokens_per_s_per_user_p90": 60}),
    "llama-70b-h200-concurrency": lambda root: write_case(
        root, system="hgx-h200", model="llama-3.1-70b", kind="Cluster", hardware={"nodes": 1},
        workload={"profile": "chat", "concurrency": 96}, slo={"ttft_ms_p90": 3000}),
}


def _pinned_as_chosen(path: Path, plan) -> Path:
    counts = Counter((i.role, i.shape) for i in plan.instances)
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["objective"] = {"mode": "pinned", "instances": [
        {"role": role, "shape": shape, "count": n} for (role, shape), n in sorted(counts.items())]}
    pinned = path.with_name("pinned.yaml")
    pinned.write_text(yaml.safe_dump(doc, sort_keys=False))
    return pinned


def _metrics(predicted) -> dict:
    # the closed form is one; the simulated run follows each mode's own workload (a pinned
    # deployment replays a closed loop, throughput mode arrivals at its goodput)
    return predicted.model_dump(mode="json", exclude={"balance", "simulated"})


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_compile_choice_pinned_predicts_the_same(tmp_path: Path, case: str):
    path = CASES[case](tmp_path)
    chosen = api.compile(path, only=())
    pinned = _pinned_as_chosen(path, chosen.plan)
    fast = predict_pinned(pinned)
    assert fast is not None
    assert _metrics(fast[0]) == _metrics(chosen.plan.predicted)
    full = api.compile(pinned, only=())
    assert _metrics(full.plan.predicted) == _metrics(chosen.plan.predicted)
    assert [(i.role, i.shape, i.max_batch, i.max_batched_tokens) for i in full.plan.instances] \
        == [(i.role, i.shape, i.max_batch, i.max_batched_tokens) for i in chosen.plan.instances]


def test_missed_slo_warns_on_every_command(tmp_path: Path, capsys):
    objective = {"mode": "pinned", "instances": [
        {"role": "aggregated", "shape": "TP1", "count": 8, "max_batch": 400}]}
    path = write_case(tmp_path, system="hgx-h100", model=_qwen3_8b(tmp_path), kind="Cluster",
                      hardware={"nodes": 1}, workload={"profile": "chat"}, slo=CHAT_SLO,
                      objective=objective)
    for argv in (["check", str(path)], ["predict", str(path)],
                 ["compile", str(path), "-o", str(tmp_path / "out")]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "warning[W510]" in err and "spec.slo.tokens_per_s_per_user_p90" in err, argv
    plan = yaml.safe_load((tmp_path / "out" / "plan.yaml").read_text())
    missed = [c for c in plan["predicted"]["slo"] if not c["met"]]
    assert [c["field"] for c in missed] == ["slo.tokens_per_s_per_user_p90"]
    assert missed[0]["predicted"] < 50


def test_a_stated_concurrency_the_batches_cannot_hold_warns_with_the_queue(tmp_path: Path,
                                                                           capsys):
    objective = {"mode": "pinned", "instances": [
        {"role": "prefill", "shape": "TP1", "count": 4},
        {"role": "decode", "shape": "TP2", "count": 2, "max_batch": 2}]}
    path = write_case(tmp_path, system="hgx-h100", model=_qwen3_8b(tmp_path), kind="Cluster",
                      hardware={"nodes": 1}, workload={"profile": "chat", "concurrency": 64},
                      objective=objective)
    assert main(["predict", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning[W511]" in err and "spec.workload.concurrency" in err
    assert "60 requests wait" in err  # 64 stated, 2 instances x 1 rank x 2 held


def test_decode_batches_stay_within_the_stated_concurrency(tmp_path: Path):
    path = write_case(tmp_path, system="hgx-h100", model=_qwen3_8b(tmp_path), kind="Cluster",
                      hardware={"nodes": 1}, workload={"profile": "chat", "concurrency": 24},
                      slo={"ttft_ms_p90": 2000})
    plan = api.compile(path, only=()).plan
    for i in plan.instances:
        if i.role != "prefill":
            assert i.max_batch <= 24, (i.id, i.max_batch)


def test_invented_node_names_warn(tmp_path: Path):
    bare = write_case(tmp_path / "bare", system="gb200-nvl72", model="qwen3-30b-a3b",
                      hardware={"trays": 4})
    assert [d.code for d in api.compile(bare, only=()).warnings if d.code == "W512"] == ["W512"]
    named = write_case(tmp_path / "named", system="gb200-nvl72", model="qwen3-30b-a3b",
                       hardware={"trays": 4, "node_name_template": "gb200-{tray}"})
    assert not [d for d in api.compile(named, only=()).warnings if d.code == "W512"]
