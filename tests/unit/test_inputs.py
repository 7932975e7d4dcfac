"""Bad input never gives a traceback: each broken case gives its code at its line, exit 2/3."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import api
from schemas.diagnostics import CompileError

BROKEN = Path(__file__).resolve().parents[1] / "inputs" / "broken"
CASES = sorted(p.name for p in BROKEN.iterdir() if p.is_dir())


def _expected(case: str) -> tuple[str, str, int]:
    code, where = (BROKEN / case / "expected.txt").read_text().split()
    file, line = where.split(":")
    return code, file, int(line)


def test_corpus_is_large_enough():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES)
def test_broken_input_gives_its_diagnostic(case: str, monkeypatch: pytest.MonkeyPatch):
    code, file, line = _expected(case)
    monkeypatch.chdir(BROKEN / case)
    with pytest.raises(CompileError) as info:
        api.check(Path("deployment.yaml"))
    found = [(d.code, d.file, d.line) for d in info.value.diagnostics]
    assert (code, file, line) in found, found
    for d in info.value.diagnostics:
        assert d.expected and d.got and d.path is not None


@pytest.mark.parametrize("case", ["03-unknown-key", "06-unknown-system", "07-unknown-model"])
def test_misspelling_gets_did_you_mean(case: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(BROKEN / case)
    with pytest.raises(CompileError) as info:
        api.check(Path("deployment.yaml"))
    assert "did you mean" in info.value.diagnostics[0].hint


def test_all_errors_reported_at_once(tmp_path: Path):
    (tmp_path / "rack.yaml").write_text(
        "apiVersion: rackc.dev/v1alpha1\nkind: Rack\nmetadata: {name: a}\n"
        "spec:\n  system: gb300-nvl72\n  trays: 0\n  colour: blue\n")
    (tmp_path / "deployment.yaml").write_text(
        "apiVersion: rackc.dev/v1alpha1\nkind: Deployment\nmetadata: {name: a}\n"
        "spec:\n  rack: rack.yaml\n  model: llama-3.1-70b\n  workload: {profile: chat}\n")
    with pytest.raises(CompileError) as info:
        api.check(tmp_path / "deployment.yaml")
    assert {d.code for d in info.value.diagnostics} == {"E101", "E104"}


def test_huge_file_is_refused(tmp_path: Path):
    path = tmp_path / "deployment.yaml"
    path.write_text("# padding\n" * 200_000)
    with pytest.raises(CompileError) as info:
        api.check(path)
    assert info.value.diagnostics[0].code == "E003"


def test_binary_file_is_refused(tmp_path: Path):
    path = tmp_path / "deployment.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CompileError) as info:
        api.check(path)
    assert info.value.diagnostics[0].code == "E002"


@pytest.mark.parametrize("case", ["05-negative-count", "22-alias", "27-all-gpus-down"])
def test_cli_prints_no_traceback_and_exits_nonzero(case: str):
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "check", "deployment.yaml",
                           "--format", "json"], cwd=BROKEN / case, capture_output=True,
                          text=True, check=False)
    assert proc.returncode in (2, 3)
    assert "Traceback" not in proc.stderr
    code, file, line = _expected(case)
    assert f"error[{code}] {file}:{line}:" in proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is False and set(data) == set(api.CHECK_KEYS)


def test_text_form_matches_the_documented_shape(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(BROKEN / "05-negative-count")
    with pytest.raises(CompileError) as info:
        api.check(Path("deployment.yaml"))
    assert info.value.diagnostics[0].render().startswith(
        "error[E104] rack.yaml:7:10 spec.trays: expected an integer from 1 to 576, got -3")
