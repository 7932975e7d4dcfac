"""Whole compiles of the examples and of variants the issue names."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compiler import api, arch, catalog
from compiler.plan import Predicted
from schemas.diagnostics import CompileError
from tests.invariants import check_plan

ROOT = Path(__file__).resolve().parents[2]
VR = ROOT / "examples" / "vr-nvl72-deepseek-v4.1-flash" / "deployment.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*/deployment.yaml"))


@pytest.fixture(scope="module")
def vr_plan():
    return api.compile(VR, only=()).plan


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_every_example_compiles_to_a_valid_plan(path: Path):
    plan = api.compile(path, only=()).plan
    check_plan(plan)
    assert plan.solver.status == "OPTIMAL"


def test_vr_shapes_engram_and_memory(vr_plan):
    roles = {(i.role, i.shape) for i in vr_plan.instances}
    # Wide expert parallelism in both roles: SYSTEM.md's shapes (DEP16 / DEP32 decode, DEP2
    # prefill) first, every DEP shape when those cannot meet the SLO on these curves
    assert {s for r, s in roles if r == "prefill"} <= {"DEP2", "DEP4", "DEP8"}
    assert {s for r, s in roles if r == "decode"} <= {"DEP16", "DEP32", "DEP64"}
    # vLLM 0.33 has no Engram group across instances: prefill reads host tables, each decode
    # instance shards them over its own GPUs
    assert all(i.engram == ("host" if i.role == "prefill" else "hbm") for i in vr_plan.instances)
    for inst in (i for i in vr_plan.instances if i.role == "decode"):
        per_gpu = {}
        for s in vr_plan.engram_shards:
            if s.group == inst.id:
                gpu = s.domain.rsplit("-", 1)[0]
                per_gpu[gpu] = per_gpu.get(gpu, 0) + s.bytes
        assert sorted(per_gpu) == sorted(inst.gpus)
        want = arch.engram_bytes(catalog.model("deepseek-v4.1-flash").spec) / len(inst.gpus)
        assert all(abs(b - want) <= 4 for b in per_gpu.values())  # bytes rounded per shard
    assert {s.group for s in vr_plan.engram_shards} == {
        i.id for i in vr_plan.instances if i.role == "decode"}
    assert vr_plan.solver.status == "OPTIMAL"
    assert vr_plan.predicted.tokens_per_s_per_user_p90 >= 387


def _variant(tmp_path: Path, edit) -> Path:
    src = VR.parent
    for name in ("rack.yaml", "deployment.yaml"):
        doc = yaml.safe_load((src / name).read_text())
        edit(name, doc)
        (tmp_path / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return tmp_path / "deployment.yaml"


def test_latency_mode_gives_tp8_on_two_trays(tmp_path: Path):
    def edit(name, doc):
        if name == "deployment.yaml":
            doc["spec"]["objective"] = {"mode": "latency"}
    plan = api.compile(_variant(tmp_path, edit), only=()).plan
    tp8 = [i for i in plan.instances if i.role == "decode"]
    assert tp8 and all(i.shape == "TP8" and len(i.trays) == 2 for i in tp8)
    check_plan(plan)


def test_unavailable_tray_gets_nothing(tmp_path: Path):
    def edit(name, doc):
        if name == "rack.yaml":
            doc["spec"]["unavailable"] = {"trays": [7]}
    plan = api.compile(_variant(tmp_path, edit), only=()).plan
    assert all("r0-t07" not in i.trays for i in plan.instances)
    check_plan(plan)


def test_over_constrained_exits_3_naming_the_fields(tmp_path: Path):
    def edit(name, doc):
        if name == "deployment.yaml":
            doc["spec"]["slo"]["tokens_per_s_per_user_p90"] = 9_000
    path = _variant(tmp_path, edit)
    with pytest.raises(CompileError) as info:
        api.compile(path, only=())
    assert info.value.exit_code == 3
    d = info.value.diagnostics[0]
    assert d.path == "spec.slo.tokens_per_s_per_user_p90" and d.line > 0
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(path), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert proc.returncode == 3 and "E501" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_same_inputs_same_bytes():
    a = api.compile(VR).artifacts
    b = api.compile(VR).artifacts
    assert a == b


def test_failed_compile_leaves_existing_output_untouched(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    bad = tmp_path / "deployment.yaml"
    bad.write_text("kind: Deployment\n")
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", str(bad), "-o",
                           str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_compile_writes_plan_and_report_then_explain_and_diff(tmp_path: Path):
    out = tmp_path / "out"
    run = lambda *a: subprocess.run([sys.executable, "-m", "compiler.cli", *a],  # noqa: E731
                                    capture_output=True, text=True, check=False)
    proc = run("compile", str(VR), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("plan.yaml", "report/performance.md", "report/performance.json",
                 "report/index.html", "report/curve.svg"):
        assert (out / name).is_file()
    assert (out / "report" / "index.html").read_text().startswith("<!DOCTYPE html>")
    plan = yaml.safe_load((out / "plan.yaml").read_text())
    assert list(plan)[:3] == ["apiVersion", "kind", "inputs_digest"]
    for key in ("instances", "memory", "engram_shards", "kv_pool", "routing", "solver",
                "predicted", "decisions"):
        assert key in plan
    explained = run("explain", str(out / "plan.yaml"), "instances.decode-00")
    assert explained.returncode == 0 and "[solver]" in explained.stdout
    assert run("diff", str(out / "plan.yaml"), str(out / "plan.yaml")).returncode == 0
    missing = run("explain", str(out / "plan.yaml"), "no.such.path")
    assert missing.returncode == 2 and "E702" in missing.stderr


def test_predict_json_keys():
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "predict", str(VR), "--format",
                           "json"], capture_output=True, text=True, check=False)
    data = json.loads(proc.stdout)
    # the typed prediction in its order (optional parts only where they apply), and whose
    # kernels it used
    assert list(data) == [*(k for k in Predicted.model_fields if k in data), "kernels"]
    assert set(Predicted.model_fields) - set(data) <= set(Predicted.OPTIONAL)
    assert data["kernels"]["engine"] == "vllm"
    for key in ("output_tokens_per_s_per_gpu", "total_tokens_per_s_per_gpu",
                "tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90", "ttft_ms_p50",
                "ttft_ms_p90", "tpot_ms_p50", "prefix_hit_rate", "tokens_per_s_per_kw",
                "instances", "breakdown"):
        assert key in data


def test_forked_emitter_gives_the_same_files():
    from compiler.emit_worker import EmitWorker

    worker = EmitWorker()
    try:
        forked = api.compile(VR, emitter=worker).artifacts
    finally:
        worker.close()
    assert forked == api.compile(VR).artifacts
