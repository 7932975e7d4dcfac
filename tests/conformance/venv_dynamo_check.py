"""Checks Dynamo worker, frontend and router lines; runs inside `.venv-dyn161`.

Same protocol as `venv_vllm_check.py` (one JSON request per stdin line), with
two ops: `{"op": "parse", "lines": [argv, ...]}` and
`{"op": "import", "modules": [...]}`. Each argv is
`python3 -m dynamo.vllm|dynamo.frontend|dynamo.router ...`. The entry points are
never run as programs: they look for etcd. The harness strips `DYN_*` variables
from this process's environment, because Dynamo reads flag defaults from them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

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


class _StandIn(types.ModuleType):
    """An absent third-party package: a package whose every attribute is a placeholder class."""

    __path__: ClassVar[list[str]] = []

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})


def check_imports(modules: list[str]) -> dict[str, Any]:
    """Imports each module as `python3 -m dynamo.vllm` would, and says which vLLM it met.
    Third-party packages the image has but this venv lacks (its lock carries what the flag
    parsers need) are stood in for, and named in the answer: what is checked is every import
    from vLLM and Dynamo themselves."""
    import importlib
    from importlib.metadata import version

    errors, stand_ins = {}, set()
    for name in modules:
        for _ in range(64):
            try:
                importlib.import_module(name)
                break
            except ModuleNotFoundError as exc:
                missing = exc.name or ""
                top = missing.split(".")[0]
                if not top or top in ("vllm", "dynamo") or (
                        top in sys.modules and top not in stand_ins):
                    errors[name] = f"ModuleNotFoundError: {exc}"
                    break
                stand_ins.add(top)
                sys.modules[missing] = _StandIn(missing)
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                break
    return {"errors": errors, "vllm": version("vllm"), "stand_ins": sorted(stand_ins)}


def main() -> None:
    serve_requests({"parse": lambda request: [check_line(a) for a in request["lines"]],
                    "import": lambda request: [check_imports(request["modules"])]})


if __name__ == "__main__":
    main()
