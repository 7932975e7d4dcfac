"""Run the targets in a forked child process that imports them while the parent solves.

Most of a compile's wall time is importing third-party libraries: OR-Tools (with pandas) for
the solver, the Kubernetes client for the targets. On a machine with two or more cores the
child, forked before the parent imports the solver, loads the targets in parallel; once the
plan exists it is sent over (pickled), the child emits every target from it and sends the
files back. The output is the same as emitting in-process.

The child never outlives the parent: the kernel kills it when the parent dies (SIGINT,
SIGTERM, SIGKILL alike, through PR_SET_PDEATHSIG), and `close` kills it if it is still busy.
"""

import contextlib
import ctypes
import multiprocessing
import os
import signal
import traceback
from multiprocessing.connection import Connection

from compiler.plan import Plan

PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: `close` still applies
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _serve(conn: Connection, parent: int) -> None:
    _die_with(parent)
    for signum in (signal.SIGINT, signal.SIGTERM):  # the parent decides what they do, and
        signal.signal(signum, signal.SIG_IGN)  # the kernel ends the child with the parent
    from compiler.targets_registry import emitted, targets

    emitters = targets(every=True)
    try:
        request = conn.recv()
    except EOFError:
        return
    plan, only = request
    try:
        out: dict[str, str | bytes] = {}
        for name, emit in emitters.items():
            if emitted(name, only):
                out.update(emit(plan))
        conn.send(("ok", out))
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class EmitWorker:
    def __init__(self) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, os.getpid()), daemon=True)
        self._process.start()  # starts the child (and its imports) now
        child.close()

    def emit(self, plan: Plan, only: tuple[str, ...] | None) -> dict[str, str | bytes]:
        self.start(plan, only)
        return self.result()

    def start(self, plan: Plan, only: tuple[str, ...] | None) -> None:
        """Hand the plan over; the child emits while the caller goes on (e.g. writes
        plan.yaml)."""
        self._conn.send((plan, only))

    def result(self) -> dict[str, str | bytes]:
        try:
            status, payload = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the target emitter exited ({self._process.exitcode})") from None
        if status != "ok":
            raise RuntimeError(f"a target failed in the emitter process:\n{payload}")
        return payload

    def close(self) -> None:
        self._conn.close()
        self._process.join(timeout=1)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
