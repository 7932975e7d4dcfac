"""`rackc predict --kernels`: another engine's measured kernels as a what-if. The prediction
moves with the kernels and says whose they were; what the bundle runs does not change; a
system without that engine's tables is a diagnostic."""

import json
import subprocess
import sys
from pathlib import Path

from compiler import api, catalog
from compiler.load import load_inputs
from compiler.perf.predict import context
from compiler.perf.step import decode_step
from compiler.pinned import predict_pinned
from compiler.shapes import parse_shape
from tests.builders import write_case

PINS = {"mode": "pinned", "instances": [{"role": "aggregated", "shape": "TP8", "count": 1,
                                         "max_batch": 16}]}


def case(tmp_path: Path, system: str = "hgx-h200") -> Path:
    return write_case(tmp_path, system=system, model="deepseek-r1", kind="Cluster",
                      hardware={"nodes": 1}, objective=PINS,
                      workload={"profile": "fixed", "isl": 1024, "osl": 1024,
                                "concurrency": 16})


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], capture_output=True,
                          text=True, check=False)


def test_each_engines_kernels_give_their_own_step_times(tmp_path: Path):
    path = case(tmp_path)
    shape = parse_shape("TP8")
    steps = {k: decode_step(context(load_inputs(path, k), 8, "decode", shape), shape, 16,
                            1536).us
             for k in catalog.KERNEL_SOURCES}
    assert len(set(steps.values())) == 3
    assert catalog.calibration("hgx-h200", "sglang")["tables"][0]["framework"] == "sglang"


def test_predict_says_whose_kernels_it_used(tmp_path: Path):
    path = case(tmp_path)
    vllm = json.loads(run("predict", str(path), "--format", "json").stdout)
    sglang = json.loads(run("predict", str(path), "--format", "json", "--kernels",
                            "sglang").stdout)
    assert vllm["kernels"]["engine"] == "vllm" and vllm["kernels"]["deployed"]
    (cal,) = sglang["kernels"]["calibration"]
    assert not sglang["kernels"]["deployed"]
    assert cal["file"] == "hgx-h200.sglang.json" and "sglang" in cal["source"]
    assert sglang["tpot_ms_p50"] != vllm["tpot_ms_p50"]
    text = run("predict", str(path), "--kernels", "trtllm").stdout
    assert "kernels: trtllm (a what-if: the bundle runs vllm), hgx-h200: hgx-h200.trtllm.json" \
        in text


def test_the_bundle_runs_vllm_whatever_the_kernels(tmp_path: Path):
    path = case(tmp_path)
    deployed = api.compile(path, only=("vllm",)).artifacts
    what_if = api.compile(path, only=("vllm",), kernels="sglang").artifacts
    launch = {k: v for k, v in deployed.items() if k.startswith("vllm/")}
    assert launch and launch == {k: v for k, v in what_if.items() if k.startswith("vllm/")}
    assert predict_pinned(path, "sglang") != predict_pinned(path)


def test_a_system_without_the_engines_tables_is_a_diagnostic(tmp_path: Path):
    path = write_case(tmp_path, system="vera-rubin-nvl72", model="deepseek-v3",
                      hardware={"trays": 2},
                      objective={"mode": "pinned", "instances": [
                          {"role": "aggregated", "shape": "DEP8", "count": 1}]})
    proc = run("predict", str(path), "--kernels", "sglang")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "E606" in proc.stderr and "--kernels" in proc.stderr and "vllm" in proc.stderr
