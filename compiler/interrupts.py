"""^C and SIGTERM: either the command stops with nothing of its own left behind (exit 130 or
143), or, once OUT is being committed, the commit finishes first.

`install` (the CLI does it) turns both signals into `Interrupted`, raised in the main thread
wherever it is, so `finally` blocks clean up as they unwind. Inside `held()` a signal is only
noted and raised when the outermost `held` block ends: the swap of OUT and the removal of the
staging folder are never cut in half. A flag rather than a signal mask, because Python runs
its handlers in the main thread whichever thread the kernel chose.
"""

import contextlib
import signal
import sys
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_depth = 0
_pending: list[int] = []
_received: list[int] = []  # every signal that came, even one an extension turned into an error
# raised where Python cannot let an exception out (a weakref callback, __del__: "Exception
# ignored in ..."), so the command went on: still to be answered
_lost: list[int] = []


class Interrupted(KeyboardInterrupt):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _handler(signum: int, _frame: object) -> None:
    _received.append(signum)
    if _depth:
        _pending.append(signum)
        return
    raise Interrupted(signum)


def _unraisable(args: "sys.UnraisableHookArgs") -> None:
    """An interrupt that a finalizer or callback swallowed is kept for the next chance to stop
    (entering `held`, or the command's end), not printed as a traceback."""
    if isinstance(args.exc_value, Interrupted):
        _lost.append(args.exc_value.signum)
        return
    sys.__unraisablehook__(args)


def install() -> None:
    for signum in SIGNALS:
        signal.signal(signum, _handler)
    sys.unraisablehook = _unraisable


@contextlib.contextmanager
def held() -> Iterator[None]:
    global _depth
    if not _depth and _lost:  # swallowed on the way here: stop before the work is committed
        signum = _lost[0]
        _lost.clear()
        raise Interrupted(signum)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)


def pending() -> bool:
    """A signal came during the `held` block that is running."""
    return bool(_pending)


def forget() -> None:
    """The work a signal would have stopped is committed: answer it by finishing."""
    _pending.clear()
    _lost.clear()


def lost() -> int | None:
    """A signal that was swallowed and not answered yet (see `_unraisable`)."""
    return _lost[0] if _lost else None


def received() -> int | None:
    """The first signal that came, if any: a C extension that was running Python code when
    the handler raised (OR-Tools' pybind11 module init) reports it as its own error, e.g.
    ImportError 'initialization failed', which is this interrupt, not a bug."""
    return _received[0] if _received else None
