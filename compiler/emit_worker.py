"""Run the targets in a forked child process that imports them while the parent solves.

Most of a compile's wall time is importing third-party libraries: OR-Tools (with pandas) for
the solver, the Kubernetes client and matplotlib for the targets. On a machine with two or more
cores the child, forked before the parent imports the solver, loads the targets and plotting
in parallel; once the plan exists it is sent over (pickled), the child emits every target from
it and sends the files back. The output is the same as emitting in-process.
"""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from compiler.plan import Plan
from compiler.targets_registry import Emit, targets

_TARGETS: dict[str, Emit] = {}


def _preload() -> None:
    _TARGETS.update(targets())
    from matplotlib.figure import Figure  # noqa: F401  (the report target plots with it)


def _ready() -> bool:
    return bool(_TARGETS)


def _emit(plan: Plan, only: tuple[str, ...] | None) -> dict[str, str | bytes]:
    out: dict[str, str | bytes] = {}
    for name, emit in _TARGETS.items():
        if only is None or name in only:
            out.update(emit(plan))
    return out


class EmitWorker:
    def __init__(self) -> None:
        context = multiprocessing.get_context("fork")
        self._pool = ProcessPoolExecutor(1, mp_context=context, initializer=_preload)
        self._pool.submit(_ready)  # starts the child (and its imports) now

    def emit(self, plan: Plan, only: tuple[str, ...] | None) -> dict[str, str | bytes]:
        return self._pool.submit(_emit, plan, only).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
