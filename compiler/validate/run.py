"""`rackc validate OUT [--crds DIR]`: every check of a compiled bundle, as diagnostics.

Reads OUT as `rackc compile` wrote it (plan.yaml and the targets' files), then: the
controller-level rules (compiler.validate.rules), built-in kinds with kubernetes-validate,
custom resources with the given CRDs and their CEL rules, and `kubectl kustomize` on each
bundle folder. Custom resources without a CRD are listed as not schema-checked.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from compiler import output_dir
from compiler.plan_file import read_plan
from compiler.validate import bundle, crds, kube, rules
from schemas.diagnostics import CompileError, Diagnostic

MAX_FILES = 10_000
MAX_FILE_BYTES = 16 * 2**20
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Folders of Kubernetes objects: the rules read the deployable bundles (bundle.BUNDLES); the
# schemas also check dynamo/, the graph on its own, and netpol/ (the optional policies).
SCHEMA_FOLDERS = ("dynamo", *bundle.BUNDLES, "netpol")
TEXT_SUFFIXES = (".yaml", ".yml", ".json", ".sh", ".md", ".txt")


@dataclass
class Report:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # kinds without a CRD
    unchecked_resources: list[str] = field(default_factory=list)  # capacity unknown
    checked_objects: int = 0
    built: list[str] = field(default_factory=list)  # folders kustomize built

    @property
    def ok(self) -> bool:
        return not any(d.severity == "error" for d in self.diagnostics)


def _bad_out(out: Path, got: str, hint: str = "pass the folder `rackc compile -o OUT` wrote"):
    return CompileError([Diagnostic("error", "E801", str(out), 0, 0, "OUT",
                                    "a folder written by rackc compile", got, hint)])


def read_out(out: Path) -> dict[str, str | bytes]:
    """Every regular file under OUT (symbolic links are not followed), by relative path."""
    if not out.is_dir():
        raise _bad_out(out, "no such folder" if not out.exists() else "not a folder")
    if not (out / "plan.yaml").is_file():
        raise _bad_out(out, "a folder without plan.yaml")
    files: dict[str, str | bytes] = {}
    for root, dirs, names in os.walk(out):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            if len(files) >= MAX_FILES or path.stat().st_size > MAX_FILE_BYTES:
                raise _bad_out(out, f"{path}: more than rackc writes")
            data = path.read_bytes()
            rel = path.relative_to(out).as_posix()
            try:
                files[rel] = data.decode("utf-8") if name.endswith(TEXT_SUFFIXES) else data
            except UnicodeDecodeError:
                raise _bad_out(out, f"{rel}: not UTF-8 text") from None
    return files


def _unreadable(files: dict[str, str | bytes], report: "Report") -> dict[str, str | bytes]:
    """The files less the bundle YAML that does not parse, each of which gets a diagnostic."""
    out = dict(files)
    for path, text in files.items():
        if path.split("/", 1)[0] in SCHEMA_FOLDERS and path.endswith((".yaml", ".yml")):
            try:
                list(yaml.load_all(text, Loader=_LOADER))
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                report.diagnostics.append(Diagnostic(
                    "error", "E806", path, mark.line + 1 if mark else 0,
                    mark.column + 1 if mark else 0, "", "YAML that rackc compile writes",
                    str(getattr(exc, "problem", None) or exc).splitlines()[0][:200]))
                del out[path]
    return out


def _field_path(json_path: str) -> str:
    return json_path.removeprefix("$").removeprefix(".")


def _schema_diagnostics(obj: bundle.Obj, known: crds.Crds, report: Report) -> None:
    group, kind, _ = kube.group_kind_version(obj.doc)
    custom = (group, kind) in known
    if not custom and group not in kube.BUILTIN_GROUPS:
        name = f"{kind}.{group}"
        if name not in report.unchecked:
            report.unchecked.append(name)
        return
    try:
        problems = kube.custom_errors(obj.doc, known) if custom else kube.builtin_errors(obj.doc)
    except LookupError as exc:
        problems = [("$", str(exc))]
    report.checked_objects += 1
    checker = "its CRD's schema and CEL rules" if custom else \
        f"the Kubernetes {kube.KUBERNETES_VERSION} schema (kubernetes-validate --strict)"
    for path, message in problems:
        field_path = _field_path(path)
        report.diagnostics.append(Diagnostic(
            "error", "E802" if custom else "E803", obj.file, obj.line_at(field_path), 1,
            f"{obj.label} {field_path}".rstrip(), f"an object valid against {checker}",
            message))


def _rules(plan, files: dict[str, str | bytes], report: "Report") -> None:
    """The controller-level rules read objects of the shapes rackc writes; an OUT edited into
    other shapes gets one diagnostic here, beside the schema errors that say where."""
    try:
        ctx = rules.context(plan, files)
        report.diagnostics += [rules.diagnostic(f) for f in rules.findings_in(ctx)]
        report.unchecked_resources = rules.unchecked_resources(ctx)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        report.diagnostics.append(Diagnostic(
            "error", "E805", "OUT", 0, 0, "controller-level rules",
            "objects of the shapes rackc compile writes", f"{type(exc).__name__}: {exc}"[:200],
            "fix the schema errors first, or compile OUT again"))


def as_written(out: Path) -> list[Diagnostic]:
    """OUT against its manifest: one E807 per file added, changed or removed since rackc
    wrote it (a deleted kustomization.yaml would otherwise pass unbuilt). CompileError (exit
    2) up front for what is neither a file nor a folder (a FIFO would hang kustomize, a link
    would make it read outside OUT)."""
    try:
        files, odd, folders = output_dir.listing(out)
    except OSError as exc:
        raise _bad_out(out, f"unreadable: {exc.strerror or exc}") from None
    if odd:
        raise _bad_out(out, f"{', '.join(odd[:5])} in it",
                       "rackc writes regular files only; compile OUT again")
    manifest = output_dir.read_manifest(out)
    if manifest is None:
        return [Diagnostic("error", "E807", output_dir.MANIFEST, 0, 0, "",
                           "the manifest rackc compile writes", "none or unreadable",
                           "validate a folder as `rackc compile -o OUT` wrote it")]
    files.pop(output_dir.MANIFEST, None)
    drift = output_dir.drifted(manifest, files)
    drift["files rackc did not write:"] += [f"{f}/" for f in sorted(
        folders - output_dir.folders_of(manifest))]
    return [Diagnostic("error", "E807", rel, 0, 0, "", "the file as rackc compile wrote it "
                       f"({output_dir.MANIFEST})", label.removesuffix(":").replace("files ", ""),
                       "compile OUT again, or change the inputs rather than the bundle")
            for label, names in drift.items() for rel in names]


def validate(out: Path, crd_dir: Path | None = None) -> Report:
    """Every check of OUT; CompileError (exit 2) when OUT or the CRD folder cannot be read."""
    if not out.is_dir() or out.is_symlink():
        raise _bad_out(out, "no such folder" if not out.exists() else "not a folder")
    drift = as_written(out)
    files = read_out(out)
    plan = read_plan(out / "plan.yaml")
    folder = crds.crd_folder(crd_dir)
    known = crds.load_crds(folder) if folder is not None else {}
    report = Report(diagnostics=drift)
    files = _unreadable(files, report)
    _rules(plan, files, report)
    for name in SCHEMA_FOLDERS:
        for obj in bundle.objects(files, name):
            _schema_diagnostics(obj, known, report)
        if f"{name}/kustomization.yaml" in files:
            try:
                kube.kustomize_build(out / name)
                report.built.append(name)
            except kube.KustomizeError as exc:
                report.diagnostics.append(Diagnostic(
                    "error", "E804", f"{name}/kustomization.yaml", 0, 0, "",
                    "a bundle `kubectl kustomize` builds", str(exc).splitlines()[0]
                    if str(exc) else "a failure"))
    report.diagnostics.sort(key=lambda d: (d.file, d.line, d.code, d.path, d.got))
    return report
