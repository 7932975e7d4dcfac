"""Checks `vllm serve` lines with vLLM's own parser; runs inside `.venv-vllm033`.

Started by `harness.py` as a long-lived worker so that the parser (5-10 s to
build) is built once per test session. Protocol: one JSON request per stdin
line, one JSON response per stdout line, `{"results": [result, ...]}` with
`result = {"error": str | null, "inexact_flags": [str, ...]}`:

    {"op": "parse", "lines": [argv, ...]}
    {"op": "engine_config", "line": argv, "config": {...}, "env": {...}}

and `{"op": "mooncake", "config": {...}, "reader": "vllm" | "mooncake"}`, answered
with `result = {"error": str | null, "unknown_keys": [str, ...]}`.

Each argv starts with `vllm serve MODEL`. `venv_dynamo_check.py` reuses the
generic pieces (`run_check`, `inexact_flags`, `serve_requests`); vLLM is only
imported inside the functions that need it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

Op = Callable[[dict[str, Any]], list[dict[str, Any]]]

_NEGATIVE_NUMBER = re.compile(r"^-\d")
# Put there by make_venvs.sh, from the mooncake-transfer-engine 0.3.13.post1 wheel.
MOONCAKE_LOADER = os.path.join(
    sys.prefix, "mooncake-0.3.13.post1", "mooncake", "mooncake_config.py"
)


def inexact_flags(argv: Iterable[str], options: Iterable[str]) -> list[str]:
    """Flags that are not exact option strings (argparse also accepts prefixes).

    `--flag=value` and vLLM's dotted form (`--compilation-config.mode 3`) count by
    the part before `=` or `.`. A token starting with `-` is a flag, as for argparse.
    """
    known = set(options)
    flags = (a for a in argv if a.startswith("-") and not _NEGATIVE_NUMBER.match(a))
    return [f for f in flags if re.split(r"[=.]", f, maxsplit=1)[0] not in known]


def error_message(exc: BaseException, stderr: str) -> str:
    """argparse prints usage, then `prog: error: ...` to stderr and raises SystemExit(2)."""
    if isinstance(exc, SystemExit):
        lines = stderr.strip().splitlines()
        start = next((i for i, line in enumerate(lines) if ": error: " in line), 0)
        return "\n".join(lines[start:]) or f"SystemExit({exc.code})"
    return f"{type(exc).__name__}: {exc}"


def run_check(check: Callable[..., object], *args: Any) -> str | None:
    """Runs one check; returns None on success or the error message."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            check(*args)
    except BaseException as exc:  # argparse raises SystemExit; the engines raise anything
        return error_message(exc, captured.getvalue())
    return None


def serve_requests(ops: dict[str, Op]) -> None:
    """Answers JSON requests from stdin until it closes.

    The engines log to stdout, so file descriptor 1 is pointed at stderr and the
    answers go to a duplicate of the original stdout.
    """
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for raw in sys.stdin:
        request = json.loads(raw)
        out.write(json.dumps({"results": ops[request["op"]](request)}) + "\n")
        out.flush()


def build_parser() -> tuple[argparse.ArgumentParser, frozenset[str]]:
    """Builds the `vllm serve` parser as `vllm/entrypoints/cli/serve.py` does."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    serve = make_arg_parser(parser.add_subparsers(dest="subparser").add_parser("serve"))
    return parser, frozenset(serve._option_string_actions)


def parse_serve(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parses `vllm serve ...` and runs the serve-time checks that need no model."""
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

    if argv[:2] != ["vllm", "serve"]:
        raise ValueError(f"line must start with 'vllm serve', got {argv[:2]}")
    args = parser.parse_args(argv[1:])
    # As `vllm serve` does: the positional model tag wins over --model.
    if args.model_tag is not None:
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    return args


@contextlib.contextmanager
def patched_environ(env: dict[str, str]):
    """Enough for vLLM, which reads its environment variables lazily (vllm.envs)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def create_engine_config(parser, argv: list[str], config: dict[str, Any]) -> None:
    """Swaps the model for a folder holding only `config.json`, then builds the config."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    with tempfile.TemporaryDirectory() as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(config, f)
        args = parse_serve(parser, [*argv[:2], model_dir, *argv[3:]])
        AsyncEngineArgs.from_cli_args(args).create_engine_config()


def mooncake_config_class(reader: str) -> type:
    """The dataclass whose `from_file` reads a Mooncake client JSON for `reader`.

    Each `from_file` reads exactly its dataclass's fields (vLLM 0.33
    `vllm/distributed/mooncake_store.py`; Mooncake 0.3.13.post1
    `mooncake/mooncake_config.py`), so the fields are the keys it accepts.
    """
    if reader == "vllm":
        from vllm.distributed.mooncake_store import MooncakeStoreConfig

        return MooncakeStoreConfig
    spec = importlib.util.spec_from_file_location("mooncake_config", MOONCAKE_LOADER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MooncakeConfig


def check_mooncake(request: dict[str, Any]) -> list[dict[str, Any]]:
    config_class = mooncake_config_class(request["reader"])
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(request["config"], f)
        f.flush()
        error = run_check(config_class.from_file, f.name)
    known = {field.name for field in dataclasses.fields(config_class)}
    return [{"error": error, "unknown_keys": sorted(set(request["config"]) - known)}]


def main() -> None:
    parser, options = build_parser()

    def parse(request: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {
                "error": run_check(parse_serve, parser, argv),
                "inexact_flags": inexact_flags(argv, options),
            }
            for argv in request["lines"]
        ]

    def engine_config(request: dict[str, Any]) -> list[dict[str, Any]]:
        argv = request["line"]
        with patched_environ(request["env"]):
            error = run_check(create_engine_config, parser, argv, request["config"])
        return [{"error": error, "inexact_flags": inexact_flags(argv, options)}]

    serve_requests({"parse": parse, "engine_config": engine_config, "mooncake": check_mooncake})


if __name__ == "__main__":
    main()
