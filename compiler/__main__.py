"""`rackc` and `python -m compiler`: ^C and SIGTERM are rackc's from its first line on, before
the command line module and its libraries are imported (compiler/interrupts.py)."""

import signal
import sys


def _starting(signum: int, _frame: object) -> None:
    """Until compiler.interrupts is imported: nothing is written yet, so just stop."""
    sys.stderr.write("rackc: interrupted; nothing was written\n")
    raise SystemExit(128 + signum)


for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _starting)

from compiler import interrupts  # noqa: E402 (after the handlers above)


def _interrupted(code: int) -> int:
    sys.stderr.write("rackc: interrupted; nothing was written\n")
    return code


def main() -> int:
    try:
        interrupts.install()
        from compiler.cli import main as run
    except KeyboardInterrupt as exc:  # while the CLI's modules were being imported
        return _interrupted(exc.exit_code if isinstance(exc, interrupts.Interrupted) else 130)
    except Exception:  # a library that ran Python code when the handler raised reports the
        # interrupt as its own error: an extension's init as ImportError (OR-Tools' pybind11),
        # pydantic-core's schema build of a model at import as SchemaError
        signum = interrupts.received()
        if signum is None:
            raise
        return _interrupted(128 + signum)
    code = None
    try:
        code = run()
        # The outcome is decided (OUT committed, or left as it was): a signal now changes
        # nothing. Ignored rather than left to rackc's handler, which interpreter shutdown
        # resets to the default action (CPython's _PySignal_Fini keeps only ignored signals
        # ignored), so a late signal would end a finished command by the signal (seen by
        # fuzz_commands.py).
        for signum in interrupts.SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        swallowed = interrupts.lost()  # by a finalizer, and nothing committed since
        if swallowed is not None:
            return _interrupted(128 + swallowed)
    except KeyboardInterrupt as exc:  # between the command's end and the line above
        if code is not None:
            return code
        return _interrupted(exc.exit_code if isinstance(exc, interrupts.Interrupted) else 130)
    return code


if __name__ == "__main__":
    sys.exit(main())
