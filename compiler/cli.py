"""The `rackc` command line: parse arguments, call compiler.api, print. Only this module does I/O
on the user's behalf (and `write_artifacts`, which it calls)."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from compiler import api
from compiler.load import display_name
from schemas import KINDS
from schemas.diagnostics import CompileError, Diagnostic
from schemas.export import schema_text

EXIT_INTERNAL = 70


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _report(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> None:
    for d in diagnostics:
        sys.stderr.write(d.render() + "\n")
    errors = sum(1 for d in diagnostics if d.severity == "error")
    if errors:
        sys.stderr.write(f"{errors} error{'s' if errors != 1 else ''}\n")


def cmd_check(args: argparse.Namespace) -> int:
    try:
        result = api.check(Path(args.deployment))
    except CompileError as exc:
        if args.format == "json":
            _print_json(api.failed_check(exc))
        _report(exc.diagnostics)
        return exc.exit_code
    if args.format == "json":
        _print_json(result)
        return 0
    print(f"ok: {result['system']}, {result['racks']} rack(s), {result['trays']} trays, "
          f"{result['gpus_available']}/{result['gpus']} GPUs available, "
          f"{result['memory_domains']} memory domains, {result['nvlink_domains']} NVLink domain(s)")
    print(f"model {result['model']}: {result['weights_gib']} GiB of weights, "
          f"{result['kv_bytes_per_token']} KV bytes per token")
    for role in ("prefill", "decode"):
        shapes = [s for s in result["shapes"] if s["role"] == role]
        fit = ", ".join(f"{s['shape']} ({s['weights_gib_per_gpu']} GiB)" for s in shapes
                        if s["fits"])
        print(f"{role} shapes that fit: {fit or 'none'}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    if args.kind is None:
        print("\n".join(KINDS))
        return 0
    kind = next((k for k in KINDS if k.lower() == args.kind.lower()), None)
    if kind is None:
        _report([Diagnostic("error", "E011", "<argument>", 0, 0, "KIND", " or ".join(KINDS),
                            repr(args.kind), "run `rackc schema` to list the kinds")])
        return 2
    sys.stdout.write(schema_text(kind))
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from compiler.hf_import import import_hf

    path = Path(args.config)
    try:
        text = import_hf(path, display_name(path), args.name)
    except CompileError as exc:
        _report(exc.diagnostics)
        return exc.exit_code
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        api.write_text_atomic(Path(args.output), text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rackc", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check", help="validate inputs and show which engine shapes fit")
    check.add_argument("deployment")
    check.add_argument("--format", choices=("text", "json"), default="text")
    check.set_defaults(run=cmd_check)

    schema = sub.add_parser("schema", help="print the JSON Schema of an input kind")
    schema.add_argument("kind", nargs="?")
    schema.set_defaults(run=cmd_schema)

    imp = sub.add_parser("import-hf", help="turn a Hugging Face config.json into a Model file")
    imp.add_argument("config")
    imp.add_argument("-o", "--output")
    imp.add_argument("--name", help="metadata.name of the model (default: from the config)")
    imp.set_defaults(run=cmd_import_hf)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
