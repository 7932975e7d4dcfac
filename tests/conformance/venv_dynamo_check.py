"""Checks Dynamo worker, frontend and router lines; runs inside `.venv-dyn161`.

Same protocol as `venv_vllm_check.py` (one JSON request per stdin line), with
one op: `{"op": "parse", "lines": [argv, ...]}`. Each argv is
`python3 -m dynamo.vllm|dynamo.frontend|dynamo.router ...`. The entry points are
never run as programs: they look for etcd. The harness strips `DYN_*` variables
from this process's environment, because Dynamo reads flag defaults from them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from venv_vllm_check import inexact_flags, run_check, serve_requests


def parse_worker(argv: list[str]) -> None:
    from dynamo.vllm.args import parse_args

    parse_args(argv)


def parse_frontend(_argv: list[str]) -> None:
    """`dynamo.frontend.main.parse_args()` takes no argv: it reads `sys.argv`,
    which `check_line` sets to the line."""
    from dynamo.frontend.main import parse_args

    parse_args()


def parse_router(argv: list[str]) -> None:
    from dynamo.router.args import parse_args

    parse_args(argv)


PARSERS: dict[str, Callable[[list[str]], None]] = {
    "dynamo.vllm": parse_worker,
    "dynamo.frontend": parse_frontend,
    "dynamo.router": parse_router,
}


@contextlib.contextmanager
def patched_argv(argv: list[str]) -> Iterator[None]:
    """As `python3 -m MODULE ...` would set it, so that the parsers' `prog` is the module."""
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def recorded_options() -> Iterator[set[str]]:
    """Collects the option strings of every argparse parser that parses meanwhile.

    Dynamo splits one line over several parsers (its own, the router flags,
    vLLM's engine flags; the frontend adds vLLM's with `--chat-processor vllm`),
    each built inside `parse_args`, so their union is known only after a parse.
    """
    seen: set[str] = set()
    original = argparse.ArgumentParser.parse_known_args

    def recording(self, *args, **kwargs):
        seen.update(self._option_string_actions)
        return original(self, *args, **kwargs)

    argparse.ArgumentParser.parse_known_args = recording
    try:
        yield seen
    finally:
        argparse.ArgumentParser.parse_known_args = original


def check_line(argv: list[str]) -> dict[str, Any]:
    """Inexact flags are listed only for lines that parse: a parse that fails early
    has not met all the parsers, so the option strings it saw are incomplete."""
    if len(argv) < 3 or argv[1] != "-m" or argv[2] not in PARSERS:
        expected = " | ".join(PARSERS)
        error = f"expected 'python3 -m {expected} ...', got {argv[:3]}"
        return {"error": error, "inexact_flags": []}
    with patched_argv(argv[2:]), recorded_options() as options:
        error = run_check(PARSERS[argv[2]], argv[3:])
    return {"error": error, "inexact_flags": [] if error else inexact_flags(argv[3:], options)}


def main() -> None:
    serve_requests({"parse": lambda request: [check_line(a) for a in request["lines"]]})


if __name__ == "__main__":
    main()
