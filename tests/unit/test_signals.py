"""^C and SIGTERM, sent to a real `rackc compile` at several moments: exit 130 or 143 with a
message and no traceback, OUT exactly as it was, nothing left beside it (no staging, no lock).
A signal that comes once OUT is committed lets the command finish (exit 0, OUT new)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler import output_dir

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "examples" / "hgx-h200-deepseek-v3" / "deployment.yaml"
OLD = {"plan.yaml": "old: 1\n", "vllm/decode-00/run.sh": "#!/bin/sh\n"}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def staging_appeared(folder: Path) -> bool:
    return any(".rackc-stage." in p.name for p in folder.iterdir())


def handles_sigterm(pid: int) -> bool:
    """rackc's handlers are in place (SIGTERM is caught: Python alone leaves it default)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))
                 .split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def interrupted(tmp_path: Path, sig: signal.Signals, when) -> tuple[int, str]:
    """Run a compile into a rackc-written OUT, send `sig` once `when(seconds)` says so."""
    out = tmp_path / "out"
    output_dir.write_output(out, OLD)
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "compile", str(DEPLOYMENT),
                             "-o", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not handles_sigterm(proc.pid):
        time.sleep(0.001)
    start = time.monotonic()
    while proc.poll() is None and not when(time.monotonic() - start):
        time.sleep(0.002)
    if proc.poll() is None:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.fixture(scope="module")
def compile_seconds(tmp_path_factory) -> float:
    """How long an uninterrupted compile takes on this machine, process start included: a
    moment well inside it is loading, checking or solving, however fast the machine (a fixed
    second was past the end of the compile on a faster CI machine)."""
    seconds = []
    for _ in range(2):  # the quicker of two: the first may read a cold disk cache
        start = time.monotonic()
        code, err = interrupted(tmp_path_factory.mktemp("baseline"), signal.SIGINT,
                                lambda t: False)
        assert code == 0, err
        seconds.append(time.monotonic() - start)
    return min(seconds)


MOMENTS = {  # when to send, as a share of compile_seconds after rackc's handlers are in place
    "starting": 0.0,  # rackc's first line: its modules are being imported
    "loading": 0.4,  # loading, checking or solving (OR-Tools' solve included)
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_an_interrupt_leaves_out_as_it_was_and_nothing_beside(tmp_path: Path,
                                                               sig: signal.Signals, moment: str,
                                                               compile_seconds: float):
    code, err = interrupted(tmp_path, sig, lambda t: t >= MOMENTS[moment] * compile_seconds)
    assert code == 128 + sig, err
    assert "Traceback" not in err and "interrupted" in err
    assert snapshot(tmp_path / "out") == {**{k: v.encode() for k, v in OLD.items()},
                                          output_dir.MANIFEST: output_dir.manifest_text(
                                              {k: v.encode() for k, v in OLD.items()}).encode()}
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_an_interrupt_while_out_is_written(tmp_path: Path):
    """Sent the moment the staging folder appears: before the swap it is removed and OUT is
    as it was (130); if the swap was already under way, OUT is the new one (0)."""
    code, err = interrupted(tmp_path, signal.SIGINT, lambda t: staging_appeared(tmp_path))
    assert "Traceback" not in err
    files = snapshot(tmp_path / "out")
    if code == 130:
        assert files["plan.yaml"] == b"old: 1\n"
    else:
        assert code == 0 and files["plan.yaml"].startswith(b"apiVersion")
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_signal_in_a_held_block_is_raised_when_the_block_ends():
    from compiler import interrupts

    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    interrupts.install()
    try:
        reached = False
        with pytest.raises(interrupts.Interrupted) as info, interrupts.held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here, and only notes the signal
            assert interrupts.pending()
            reached = True
        assert reached and info.value.exit_code == 143 and not interrupts.pending()
        with interrupts.held():  # answered by finishing: nothing is raised
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            interrupts.forget()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_an_interrupt_an_extension_reports_as_its_own_error_exits_as_the_interrupt(
        monkeypatch, capsys):
    """SIGTERM while OR-Tools' pybind11 module initialises: the handler's exception comes out
    as ImportError 'initialization failed' (fuzz_commands.py found it): still exit 143, no
    traceback, not an internal error."""
    from compiler import cli, interrupts

    monkeypatch.setattr(interrupts, "_received", [])

    def cut_short(_args):
        interrupts._received.append(signal.SIGTERM)  # what the handler records
        raise ImportError("initialization failed")

    monkeypatch.setattr(cli, "cmd_check", cut_short)
    try:
        code = cli.main(["check", str(DEPLOYMENT)])
    finally:
        for signum in interrupts.SIGNALS:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
    err = capsys.readouterr().err
    assert code == 143 and "interrupted" in err and "Traceback" not in err


def test_an_interrupt_a_finalizer_swallows_still_stops_the_command(capsys):
    """A handler's exception raised inside a weakref callback or __del__ cannot leave it
    (Python prints 'Exception ignored in ...' and goes on; fuzz_commands.py saw a compile end
    with exit 0 and that traceback): it is kept, unprinted, and the next `held` block (the
    commit) raises it instead of committing."""
    import weakref

    from compiler import interrupts

    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    hook = sys.unraisablehook
    interrupts.install()
    try:
        class Lock:
            pass

        def callback(_ref):
            raise interrupts.Interrupted(signal.SIGINT)

        lock = Lock()
        ref = weakref.ref(lock, callback)
        del lock  # the callback runs here, and its exception is swallowed
        assert ref() is None and interrupts.lost() == signal.SIGINT
        assert "Traceback" not in capsys.readouterr().err
        with pytest.raises(interrupts.Interrupted) as info, interrupts.held():
            pytest.fail("the commit must not start")
        assert info.value.exit_code == 130 and interrupts.lost() is None
    finally:
        sys.unraisablehook = hook
        for s, handler in before.items():
            signal.signal(s, handler)


def test_an_interrupt_a_library_reports_while_the_cli_is_imported_exits_as_the_interrupt(
        monkeypatch, capsys):
    """SIGTERM while pydantic-core builds a model's validator at import: the handler's exception
    comes out as SchemaError (fuzz_commands.py, 2 of 104 signal cases): exit 143 and no
    traceback, as for any error of the import that follows a received signal; without a signal
    the error is raised (a bug)."""
    import types

    from compiler import __main__ as entry
    from compiler import interrupts

    class Cut(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError('Error building "model" validator: Interrupted: SIGTERM')

    monkeypatch.setitem(sys.modules, "compiler.cli", Cut("compiler.cli"))
    try:
        monkeypatch.setattr(interrupts, "_received", [signal.SIGTERM])
        assert entry.main() == 143
        assert "interrupted" in capsys.readouterr().err
        monkeypatch.setattr(interrupts, "_received", [])
        with pytest.raises(RuntimeError):
            entry.main()
    finally:
        for signum in interrupts.SIGNALS:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
        sys.unraisablehook = sys.__unraisablehook__
