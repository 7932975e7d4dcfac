"""The CustomResourceDefinitions a bundle's custom resources are checked against: a folder of
CRDs as `kubectl get crd NAME -o yaml` (or `-o json`) writes them from the user's cluster, or as
the projects publish them. A cluster's copy carries `metadata` and `status` the API server adds;
only `spec` is read. `kubectl get crd A B -o yaml` writes a `List`: its items are read."""

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from schemas.diagnostics import CompileError, Diagnostic

CRDS_ENV = "RACKC_CRDS"
SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILE_BYTES = 16 * 2**20  # the largest upstream CRD (Dynamo's DGD) is under 2 MiB

Crds = dict[tuple[str, str], dict[str, Any]]  # (group, kind) -> CRD
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def crd_folder(explicit: Path | None) -> Path | None:
    """`--crds DIR`, else the folder `RACKC_CRDS` names, else None (no CRD schemas)."""
    if explicit is not None:
        return explicit
    named = os.environ.get(CRDS_ENV)
    return Path(named) if named else None


def _error(where: str, expected: str, got: str, hint: str) -> CompileError:
    return CompileError([Diagnostic("error", "E810", where, 0, 0, "--crds", expected, got, hint)])


def _crds_in(doc: Any) -> Iterable[dict[str, Any]]:
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") == "List":
        items = doc.get("items")
        return [i for i in items if isinstance(i, dict) and i.get("kind") ==
                "CustomResourceDefinition"] if isinstance(items, list) else []
    return [doc] if doc.get("kind") == "CustomResourceDefinition" else []


def _key(crd: dict[str, Any], where: str) -> tuple[str, str]:
    spec = crd.get("spec")
    names = spec.get("names") if isinstance(spec, dict) else None
    if not (isinstance(names, dict) and isinstance(spec.get("group"), str)
            and isinstance(names.get("kind"), str) and isinstance(spec.get("versions"), list)):
        raise _error(where, "a CustomResourceDefinition with spec.group, spec.names.kind and "
                     "spec.versions", f"{crd.get('metadata', {}).get('name', '?')!r} without them",
                     "write it with `kubectl get crd NAME -o yaml`")
    return spec["group"], names["kind"]


def load_crds(folder: Path) -> Crds:
    """Every CRD in the folder's YAML/JSON files, by (group, kind); CompileError (E810) when
    the folder or a file cannot be read."""
    if not folder.is_dir():
        raise _error(str(folder), "a folder of CRD files", "no such folder",
                     f"pass --crds DIR or set {CRDS_ENV}; write the files with "
                     "`kubectl get crd NAME -o yaml > DIR/NAME.yaml`")
    crds: Crds = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file()):
        where = str(path)
        if path.stat().st_size > MAX_FILE_BYTES:
            raise _error(where, f"a CRD file under {MAX_FILE_BYTES // 2**20} MiB", "a larger file",
                         "keep only CustomResourceDefinitions in the folder")
        try:
            docs = list(yaml.load_all(path.read_text(encoding="utf-8"), Loader=_LOADER))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _error(where, "readable YAML or JSON", first,
                         "write it with `kubectl get crd NAME -o yaml`") from None
        for doc in docs:
            for crd in _crds_in(doc):
                crds[_key(crd, where)] = crd
    return crds
