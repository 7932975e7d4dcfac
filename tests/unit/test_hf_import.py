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
    ref = catalog.model(name).spec
    doc = ModelV1.model_validate(yaml.safe_load(import_hf(HF / f"{name}.json", name, name,
                                                          ref.hf_id)))
    assert doc.spec.hf_id == ref.hf_id
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
                           str(HF / "llama-3.1-70b.json"), "-o", str(out),
                           "--hf-id", "meta-llama/Llama-3.1-70B-Instruct"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(out.read_text())["spec"]["layers"] == 80


def test_cli_bad_json_exits_2(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "import-hf", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "E002" in proc.stderr and "Traceback" not in proc.stderr


def test_hf_id_is_a_hub_repository(tmp_path: Path):
    """hf_id is what vLLM downloads: the config's `_name_or_path` when it is OWNER/NAME, else
    `--hf-id`, else E404 (never the Model's name)."""
    data = json.loads((HF / "qwen3-32b.json").read_text())
    data.pop("_name_or_path", None)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CompileError) as info:
        import_hf(path, "config.json", "qwen3-32b")
    assert [(d.code, d.path) for d in info.value.diagnostics] == [("E404", "_name_or_path")]
    assert "--hf-id" in info.value.diagnostics[0].hint
    for saved in ("/models/qwen3-32b", "qwen3-32b"):
        path.write_text(json.dumps({**data, "_name_or_path": saved}))
        with pytest.raises(CompileError):
            import_hf(path, "config.json")
    path.write_text(json.dumps({**data, "_name_or_path": "Qwen/Qwen3-32B"}))
    assert yaml.safe_load(import_hf(path, "config.json"))["spec"]["hf_id"] == "Qwen/Qwen3-32B"
    given = yaml.safe_load(import_hf(path, "config.json", hf_id="org/other"))
    assert given["spec"]["hf_id"] == "org/other"
    with pytest.raises(CompileError) as info:
        import_hf(path, "config.json", hf_id="not a repo")
    assert info.value.diagnostics[0].path == "--hf-id"
