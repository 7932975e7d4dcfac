"""`rackc import-hf` gives Models whose derived numbers equal the catalog's."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from compiler import arch, catalog
from compiler.hf_import import import_hf
from schemas import ModelV1
from schemas.diagnostics import CompileError

HF = Path(__file__).resolve().parents[1] / "inputs" / "hf"


@pytest.mark.parametrize("name", sorted(p.stem for p in HF.glob("*.json")))
def test_import_matches_catalog(name: str):
    doc = ModelV1.model_validate(yaml.safe_load(import_hf(HF / f"{name}.json", name, name)))
    ref = catalog.model(name).spec
    assert arch.params(doc.spec) == arch.params(ref)
    for dtype in ("bf16", "fp8"):
        assert arch.kv_bytes_per_token(doc.spec, dtype) == arch.kv_bytes_per_token(ref, dtype)
    assert arch.weight_bytes(doc.spec) == pytest.approx(arch.weight_bytes(ref))


def test_unknown_architecture_is_a_diagnostic(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLLM"]}))
    with pytest.raises(CompileError) as info:
        import_hf(path, "config.json")
    d = info.value.diagnostics[0]
    assert d.code == "E401" and "LlamaForCausalLM" in d.hint


def test_missing_keys_are_all_reported(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}))
    with pytest.raises(CompileError) as info:
        import_hf(path, "config.json")
    assert {d.path for d in info.value.diagnostics} >= {"num_hidden_layers", "vocab_size"}


def test_cli_writes_the_file(tmp_path: Path):
    out = tmp_path / "model.yaml"
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "import-hf",
                           str(HF / "llama-3.1-70b.json"), "-o", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(out.read_text())["spec"]["layers"] == 80


def test_cli_bad_json_exits_2(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "import-hf", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "E002" in proc.stderr and "Traceback" not in proc.stderr
