"""`-o` never destroys what rackc did not write; single files never go through a planted link;
replacing is atomic and reversible; the forked emitter never outlives rackc."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler import files, output_dir
from schemas.diagnostics import CompileError

ROOT = Path(__file__).resolve().parents[2]
VR = ROOT / "examples" / "vr-nvl72-deepseek-v4.1-flash" / "deployment.yaml"
ARTIFACTS = {"plan.yaml": "plan: 1\n", "vllm/decode-00/run.sh": "#!/bin/sh\n",
             "report/curve.png": b"\x89PNG..."}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(CompileError) as info:
        call(*args, **kwargs)
    (d,) = info.value.diagnostics
    assert info.value.exit_code == 2 and d.code == "E801" and d.path.startswith("-o ")
    return d.got


def test_creates_and_then_replaces_its_own_output(tmp_path: Path):
    out = tmp_path / "a" / "b" / "out"
    output_dir.write_output(out, ARTIFACTS)
    assert set(snapshot(out)) == {*ARTIFACTS, output_dir.MANIFEST}
    assert output_dir.owned_files(out).keys() == ARTIFACTS.keys()
    output_dir.write_output(out, {"plan.yaml": "plan: 2\n"})
    assert set(snapshot(out)) == {"plan.yaml", output_dir.MANIFEST}
    assert (out / "plan.yaml").read_text() == "plan: 2\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]  # no lock, no staging


def test_fills_an_empty_folder(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir()
    output_dir.write_output(out, ARTIFACTS)
    assert (out / "plan.yaml").is_file()


def test_a_foreign_folder_is_refused_and_left_alone(tmp_path: Path):
    out = tmp_path / "notes"
    (out / ".git").mkdir(parents=True)
    (out / "todo.md").write_text("keep me")
    before = snapshot(out)
    assert "did not write" in refused(output_dir.write_output, out, ARTIFACTS)
    assert snapshot(out) == before


@pytest.mark.parametrize("change", ["extra", "edited", "removed"])
def test_a_rackc_folder_changed_since_is_refused(tmp_path: Path, change: str):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    if change == "extra":
        (out / "vllm" / "mine.txt").write_text("user's")
    elif change == "edited":
        (out / "plan.yaml").write_text("plan: edited\n")
    else:
        (out / "plan.yaml").unlink()
    before = snapshot(out)
    assert "since" in refused(output_dir.write_output, out, ARTIFACTS) or change == "extra"
    assert snapshot(out) == before


def test_non_folders_are_refused(tmp_path: Path):
    f = tmp_path / "somefile"
    f.write_text("data")
    assert refused(output_dir.write_output, f, ARTIFACTS) == "a regular file"
    assert f.read_text() == "data"
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert refused(output_dir.check_location, link) == "a symbolic link"
    assert "/dev" in refused(output_dir.check_location, Path("/dev/null"))
    assert Path("/dev/null").is_char_device()


def test_places_that_are_never_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    work = tmp_path / "home" / "src" / "work"
    work.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(work)
    assert refused(output_dir.check_location, Path("/")) == "the root folder"
    assert refused(output_dir.check_location, tmp_path / "home") == "your home folder"
    assert refused(output_dir.check_location, Path(".")) == "the working directory"
    assert "above the working" in refused(output_dir.check_location, Path(".."))
    inputs = work / "in" / "deployment.yaml"
    inputs.parent.mkdir()
    inputs.write_text("x")
    assert "holding" in refused(output_dir.check_location, work / "in", (inputs,))


def test_a_target_subset_keeps_the_other_targets(tmp_path: Path):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    output_dir.write_output(out, {"plan.yaml": "plan: 3\n", "vllm/decode-00/run.sh": "new\n"},
                            keep_targets=True)
    now = snapshot(out)
    assert now["report/curve.png"] == ARTIFACTS["report/curve.png"]
    assert now["vllm/decode-00/run.sh"] == b"new\n"
    assert output_dir.owned_files(out) is not None  # the manifest lists the kept files too


def test_a_failure_while_writing_leaves_the_old_output(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    before = snapshot(out)

    def fail(staging: Path, artifacts: dict) -> None:
        (staging / "half").write_text("x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output_dir, "_fill", fail)
    assert "No space" in refused(output_dir.write_output, out, {"plan.yaml": "new"})
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_two_rename_fallback_restores_the_old_output(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    before = snapshot(out)
    monkeypatch.setattr(output_dir, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(src, dst):
        if ".rackc-stage." in str(src) and not str(src).endswith("/old"):
            raise OSError(5, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(output_dir.os, "rename", rename)
    refused(output_dir.write_output, out, {"plan.yaml": "new"})
    assert snapshot(out) == before
    monkeypatch.setattr(output_dir.os, "rename", real_rename)
    output_dir.write_output(out, {"plan.yaml": "new"})  # and the fallback itself works
    assert (out / "plan.yaml").read_text() == "new"


def _staging(folder: Path, pid: int | str, token: str, marker: str | None) -> Path:
    stage = folder / f".out.rackc-stage.{pid}.{token}"
    (stage / "out").mkdir(parents=True)
    (stage / "out" / "plan.yaml").write_text("old")
    if marker is not None:
        (stage / output_dir.STAGE_MARKER).write_text(marker)
    return stage


def test_only_rackcs_own_staging_of_dead_processes_is_swept(tmp_path: Path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = _staging(tmp_path, dead, "abc", f"rackc staging {dead} abc\n")
    live = _staging(tmp_path, os.getpid(), "def", f"rackc staging {os.getpid()} def\n")
    user = _staging(tmp_path, dead, "ghi", None)  # a user's folder that only looks like one
    forged = _staging(tmp_path, dead, "jkl", f"rackc staging {dead} other\n")
    output_dir.write_output(tmp_path / "out", ARTIFACTS)
    assert not stale.exists() and live.exists() and user.exists() and forged.exists()
    assert (user / "out" / "plan.yaml").read_text() == "old"


def test_an_empty_user_folder_inside_out_is_not_replaced_away(tmp_path: Path):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    (out / "vllm" / "notes").mkdir()
    assert "notes/ (a folder)" in refused(output_dir.write_output, out, ARTIFACTS)
    assert (out / "vllm" / "notes").is_dir()


def test_check_lists_differences(tmp_path: Path):
    out = tmp_path / "out"
    output_dir.write_output(out, ARTIFACTS)
    assert output_dir.differences(out, ARTIFACTS) == []
    changed = {**ARTIFACTS, "plan.yaml": "plan: 9\n", "k8s/x.yaml": "x"}
    del changed["report/curve.png"]
    assert output_dir.differences(out, changed) == ["+ k8s/x.yaml", "~ plan.yaml",
                                                    "- report/curve.png"]
    assert output_dir.differences(out, {"plan.yaml": "plan: 1\n"}, subset=True) == []


def test_single_files_replace_only_regular_files(tmp_path: Path):
    target = tmp_path / "curve.png"
    files.write_bytes_atomic(target, b"one")
    files.write_bytes_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    secret = tmp_path / "secret"
    secret.write_text("untouched")
    planted = tmp_path / "planted.png"
    planted.symlink_to(secret)
    assert refused(files.write_bytes_atomic, planted, b"x") == "a symbolic link"
    assert secret.read_text() == "untouched"
    assert refused(files.write_bytes_atomic, tmp_path, b"x") == "a directory"
    assert refused(files.write_bytes_atomic, Path("/dev/null"), b"x") == "a character device"
    assert "input" in refused(files.write_bytes_atomic, secret, b"x", keep=(secret,))
    assert "Not a directory" in refused(files.write_bytes_atomic, secret / "x", b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.png", "planted.png", "secret"]


def test_a_failed_single_write_removes_its_temporary(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    def fail(src, dst):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(files.os, "replace", fail)
    refused(files.write_bytes_atomic, tmp_path / "x.png", b"data")
    assert list(tmp_path.iterdir()) == []


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], capture_output=True,
                          text=True, check=False, cwd=cwd)


def test_cli_refuses_the_working_directory_before_any_work(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "notes.md").write_text("mine")
    before = snapshot(tmp_path)
    for out in (".", ".."):
        proc = cli("compile", str(VR), "-o", out, cwd=tmp_path)
        assert proc.returncode == 2 and "E801" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before


def test_cli_unknown_target_is_an_error_with_a_suggestion(tmp_path: Path):
    proc = cli("compile", str(VR), "-o", str(tmp_path / "out"), "--targets", "vlm")
    assert proc.returncode == 2 and "did you mean `vllm`" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_cli_check_reports_drift(tmp_path: Path):
    out = tmp_path / "out"
    assert cli("compile", str(VR), "-o", str(out), "--targets", "report").returncode == 0
    assert cli("compile", str(VR), "-o", str(out), "--check", "--targets", "report"
               ).returncode == 0
    (out / "plan.yaml").write_text("edited\n")
    proc = cli("compile", str(VR), "-o", str(out), "--check", "--targets", "report")
    assert proc.returncode == 1 and "~ plan.yaml" in proc.stdout


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_emitter_dies_with_its_parent(sig: signal.Signals):
    code = ("import time; from compiler.emit_worker import EmitWorker; w = EmitWorker(); "
            "print(w._process.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(sig)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_a_replaced_single_file_keeps_its_mode(tmp_path: Path):
    path = tmp_path / "curve.png"
    path.write_bytes(b"old")
    path.chmod(0o600)
    files.write_bytes_atomic(path, b"new", "--plot")
    assert path.read_bytes() == b"new" and (path.stat().st_mode & 0o777) == 0o600
