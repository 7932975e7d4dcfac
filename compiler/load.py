"""Pass 1: read the deployment and the files it names, check them against schemas and catalog.

Every problem found in any file is collected and raised together as one CompileError.
"""

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from compiler import catalog
from compiler.catalog.system import System
from compiler.catalog.workload import Profile
from schemas import ClusterV1, DeploymentV1, ModelV1, RackV1
from schemas.base import DNS1123_SUBDOMAIN
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean
from schemas.source import Document, PathKey, SourceMap, format_path, load_yaml_file
from schemas.validate import validate


@dataclass(frozen=True)
class Inputs:
    """The validated inputs of one compile, with where each came from."""

    deployment: DeploymentV1
    hardware: RackV1 | ClusterV1
    model: ModelV1
    system: System
    profile: Profile
    sources: dict[str, SourceMap]  # "deployment" | "hardware" | "model" -> its source map
    digest: str  # sha256 over the input texts, for the plan's header
    files: tuple[Path, ...] = ()  # the input files read (absolute), which outputs never replace

    @property
    def model_name(self) -> str:
        return self.model.metadata.name


def display_name(path: Path) -> str:
    """A stable name for diagnostics: relative to the working directory when below it."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _diag(src: SourceMap, path: PathKey, code: str, expected: str, got: str, hint: str,
          key: bool = False) -> Diagnostic:
    pos = src.locate(path, prefer_key=key)
    return Diagnostic("error", code, src.file, pos.line, pos.column, format_path(path),
                      expected, got, hint)


def _load(path: Path, kinds: tuple[str, ...]) -> tuple[object, Document]:
    doc = load_yaml_file(path, display_name(path))
    return validate(doc, kinds), doc


def _ref(base: Path, src: SourceMap, field: str, value: str) -> Path | Diagnostic:
    target = (base / value).resolve()
    if not target.is_file():
        return _diag(src, ("spec", field), "E204", "a path to an existing file", repr(value),
                     f"paths are relative to {src.file}")
    return target


def load_inputs(deployment_path: Path) -> Inputs:
    dep, dep_doc = _load(deployment_path, ("Deployment",))
    assert isinstance(dep, DeploymentV1)
    base = deployment_path.resolve().parent
    dsrc = dep_doc.source
    errors: list[Diagnostic] = []
    texts = [deployment_path.read_bytes()]

    hardware = hw_doc = None
    rack_path = _ref(base, dsrc, "rack", dep.spec.rack)
    if isinstance(rack_path, Diagnostic):
        errors.append(rack_path)
    else:
        try:
            hardware, hw_doc = _load(rack_path, ("Rack", "Cluster"))
            texts.append(rack_path.read_bytes())
        except CompileError as exc:
            errors.extend(exc.diagnostics)

    model, model_src = _resolve_model(dep, base, dsrc, errors, texts)
    system = None
    if hardware is not None:
        system = _resolve_system(hardware, hw_doc.source, errors)
        if system is not None:
            errors.extend(check_hardware(hardware, system, hw_doc.source))
    if model is not None:
        errors.extend(check_serving(dep, model, dsrc))
    errors.extend(check_objective(dep, dsrc))
    if errors:
        raise CompileError(sorted(errors, key=lambda d: (d.file, d.line, d.column, d.code)))
    sources = {"deployment": dsrc, "hardware": hw_doc.source, "model": model_src}
    digest = hashlib.sha256(b"\0".join(texts)).hexdigest()
    model_path = (base / dep.spec.model).resolve() if model_src.file != dsrc.file and \
        not model_src.file.startswith("catalog:") else None
    files = tuple(p for p in (deployment_path.resolve(), rack_path, model_path) if p)
    return Inputs(dep, hardware, model, system, catalog.workload(dep.spec.workload.profile),
                  sources, digest, files)


def _resolve_model(dep: DeploymentV1, base: Path, dsrc: SourceMap, errors: list[Diagnostic],
                   texts: list[bytes]) -> tuple[ModelV1 | None, SourceMap]:
    ref = dep.spec.model
    if ref.endswith((".yaml", ".yml")):
        path = _ref(base, dsrc, "model", ref)
        if isinstance(path, Diagnostic):
            errors.append(path)
            return None, dsrc
        try:
            model, doc = _load(path, ("Model",))
        except CompileError as exc:
            errors.extend(exc.diagnostics)
            return None, dsrc
        texts.append(path.read_bytes())
        return model, doc.source
    if ref not in catalog.model_names():
        errors.append(_diag(dsrc, ("spec", "model"), "E202", "a catalog model or a *.yaml path",
                            repr(ref), did_you_mean(ref, catalog.model_names())))
        return None, dsrc
    texts.append(catalog.model_text(ref).encode())
    return catalog.model(ref), SourceMap(f"catalog:models/{ref}.yaml")


def _resolve_system(hw: RackV1 | ClusterV1, src: SourceMap, errors: list[Diagnostic]):
    name = hw.spec.system
    if name not in catalog.system_names():
        errors.append(_diag(src, ("spec", "system"), "E201", "a catalog system", repr(name),
                            did_you_mean(name, catalog.system_names())))
        return None
    return catalog.system(name)


def check_hardware(hw: RackV1 | ClusterV1, system: System, src: SourceMap) -> list[Diagnostic]:
    """Counts and ids that only make sense against the catalog system."""
    out: list[Diagnostic] = []
    spec = hw.spec
    if isinstance(hw, ClusterV1):
        want, other = ("nodes", "racks") if system.form == "hgx" else ("racks", "nodes")
        if getattr(spec, other) is not None:
            out.append(_diag(src, ("spec", other), "E207", f"`{want}` for a {system.form} system",
                             f"`{other}`", f"{system.name} is counted in {want}", key=True))
        elif getattr(spec, want) is None:
            out.append(_diag(src, ("spec",), "E102", f"`spec.{want}`", "nothing",
                             f"add `{want}:` (how many {system.name} {want})"))
    max_trays = int(system.rack.trays.value)
    if system.form == "nvl72" and spec.trays is not None and spec.trays > max_trays:
        out.append(_diag(src, ("spec", "trays"), "E104", f"at most {max_trays} trays per rack",
                         str(spec.trays), f"a {system.name} rack has {max_trays} compute trays"))
    if out:
        return out
    racks, trays = layout(hw, system)
    for i, tray in enumerate(spec.unavailable.trays):
        if tray >= racks * trays:
            out.append(_diag(src, ("spec", "unavailable", "trays", i), "E205",
                             f"a tray index below {racks * trays}", str(tray),
                             "trays count from 0 across racks (rack * trays + tray)"))
    gpus = system.gpus_per_tray
    for i, gid in enumerate(spec.unavailable.gpus):
        r, t, g = (int(x[1:]) for x in gid.split("-"))
        if r >= racks or t >= trays or g >= gpus:
            out.append(_diag(src, ("spec", "unavailable", "gpus", i), "E205",
                             f"an id r<0..{racks - 1}>-t<00..{trays - 1:02d}>-g<0..{gpus - 1}>",
                             repr(gid), "GPU ids are r{rack}-t{tray:02d}-g{gpu}, from 0"))
    out.extend(_check_template(hw, racks, trays, src))
    if spec.node_names is not None and len(spec.node_names) != racks * trays:
        out.append(_diag(src, ("spec", "node_names"), "E208",
                         f"{racks * trays} node names (one per tray)",
                         f"{len(spec.node_names)}", "list one Kubernetes node per tray"))
    return out


def node_name(hw: RackV1 | ClusterV1, rack: int, tray: int, index: int) -> str:
    """The Kubernetes node of a tray: from node_names, else from node_name_template."""
    spec = hw.spec
    if spec.node_names:
        return spec.node_names[index]
    return spec.node_name_template.format(name=hw.metadata.name, rack=rack, tray=tray)


def _check_template(hw: RackV1 | ClusterV1, racks: int, trays: int,
                    src: SourceMap) -> list[Diagnostic]:
    if hw.spec.node_names is not None:
        return []
    path = ("spec", "node_name_template")
    template = hw.spec.node_name_template
    try:
        names = [node_name(hw, r, t, r * trays + t) for r in range(racks) for t in range(trays)]
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        return [_diag(src, path, "E105", "a template with fields {name}, {rack}, {tray}",
                      repr(template), f"it fails to format: {exc!r}; e.g. "
                      "\"{name}-r{rack}-t{tray:02d}\"")]
    bad = [n for n in names if not re.match(DNS1123_SUBDOMAIN, n) or len(n) > 253]
    if bad:
        return [_diag(src, path, "E105", "node names that are DNS-1123 subdomains",
                      repr(bad[0]), "Kubernetes node names are lower case letters, digits, "
                      "'-' and '.'")]
    return []


def layout(hw: RackV1 | ClusterV1, system: System) -> tuple[int, int]:
    """(racks, trays per rack). HGX nodes are trays of one rack, each its own NVLink domain."""
    spec = hw.spec
    if system.form == "hgx":
        nodes = spec.nodes if isinstance(hw, ClusterV1) else None
        return 1, nodes or spec.trays or 1
    racks = spec.racks if isinstance(hw, ClusterV1) and spec.racks else 1
    return racks, spec.trays or int(system.rack.trays.value)


def check_serving(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    out = []
    serving, mspec = dep.spec.serving, model.spec
    if serving.max_model_len and serving.max_model_len > mspec.max_context_tokens:
        out.append(_diag(src, ("spec", "serving", "max_model_len"), "E104",
                         f"at most the model's context ({mspec.max_context_tokens})",
                         str(serving.max_model_len), "lower max_model_len"))
    length = serving.max_model_len or mspec.max_context_tokens
    w = dep.spec.workload
    if w.isl is not None or w.osl is not None:
        profile = catalog.workload(w.profile)
        isl = w.isl if w.isl is not None else profile.isl.value
        osl = w.osl if w.osl is not None else profile.osl.value
        if isl + osl > length:
            field = "isl" if w.isl is not None else "osl"
            out.append(_diag(src, ("spec", "workload", field), "E104",
                             f"isl + osl within the context ({length} tokens)",
                             f"{isl:g} + {osl:g}", "raise serving.max_model_len (up to the "
                             f"model's {mspec.max_context_tokens}) or shorten the requests"))
    elif catalog.workload(w.profile).isl.value + catalog.workload(w.profile).osl.value > length:
        out.append(_diag(src, ("spec", "serving", "max_model_len"), "E104",
                         f"room for the {w.profile} profile's requests", f"{length} tokens",
                         "raise serving.max_model_len or set workload.isl/osl"))
    spec_cfg = serving.speculative
    if spec_cfg and spec_cfg.acceptance > spec_cfg.draft_tokens + 1:
        out.append(_diag(src, ("spec", "serving", "speculative", "acceptance"), "E104",
                         f"at most draft_tokens + 1 = {spec_cfg.draft_tokens + 1}",
                         str(spec_cfg.acceptance), "acceptance counts emitted tokens per step"))
    if spec_cfg and spec_cfg.method in ("mtp", "dspark") and (
            not mspec.draft or mspec.draft.method != spec_cfg.method):
        have = mspec.draft.method if mspec.draft else "none"
        out.append(_diag(src, ("spec", "serving", "speculative", "method"), "E105",
                         f"the model's built-in draft ({have})", repr(spec_cfg.method),
                         f"{model.metadata.name} has no {spec_cfg.method} layers"))
    pool = dep.spec.serving.kv_pool
    if pool and pool.hbm and not pool.dram:
        out.append(_diag(src, ("spec", "serving", "kv_pool", "hbm"), "E105",
                         "the HBM pool on top of the DRAM pool", "hbm without dram",
                         "set `dram: true`: the HBM segments join the DRAM store"))
    return out


def check_objective(dep: DeploymentV1, src: SourceMap) -> list[Diagnostic]:
    obj = dep.spec.objective
    if obj.mode == "pinned" and not obj.instances:
        return [_diag(src, ("spec", "objective", "mode"), "E209", "`instances:` with mode pinned",
                      "no instances", "list {role, shape, count} entries under objective")]
    if obj.mode != "pinned" and obj.instances:
        return [_diag(src, ("spec", "objective", "instances"), "E209",
                      "instances only with `mode: pinned`", f"mode {obj.mode}",
                      "set `mode: pinned` or remove `instances`", key=True)]
    roles = {i.role for i in obj.instances}
    if "aggregated" in roles and roles - {"aggregated"}:
        return [_diag(src, ("spec", "objective", "instances"), "E209",
                      "either aggregated instances or prefill + decode", "both",
                      "disaggregated serving needs prefill and decode; aggregated neither")]
    if roles and "aggregated" not in roles and roles != {"prefill", "decode"}:
        missing = ({"prefill", "decode"} - roles).pop()
        return [_diag(src, ("spec", "objective", "instances"), "E209",
                      "prefill and decode instances", f"no {missing}",
                      f"add a {missing} entry, or use role aggregated")]
    return []
