"""Pass 1: read the deployment and the files it names, check them against schemas and catalog.

Every problem found in any file is collected and raised together as one CompileError.
"""

import hashlib
import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from compiler import catalog
from compiler.catalog.system import System
from compiler.catalog.workload import Profile
from compiler.ids import Offsets, parse_gpu
from compiler.input_checks import (
    check_fleet_objective,
    check_model,
    check_objective,
    check_serving,
    diag,
)
from compiler.resolve import Resolved, kernel_block_problem, resolve
from schemas import ClusterV1, DeploymentV1, ModelV1, RackV1
from schemas.base import DNS1123_SUBDOMAIN
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean, shown
from schemas.rack import MAX_GPUS, ClusterSpec
from schemas.reading import FileProblem, read_regular
from schemas.source import Document, SourceMap, file_error, format_path, load_yaml_bytes
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
    resolved: Resolved  # every default and catalog choice (compiler.resolve)
    files: tuple[Path, ...] = ()  # the input files read (absolute), which outputs never replace
    kernels: str = catalog.DEPLOYED_KERNELS  # whose measured kernels the perf model uses
    # a mixed fleet's group: where its rack and NVLink ids start (compiler.ids)
    offsets: Offsets = field(default_factory=Offsets)
    # perf contexts built for these inputs (compiler.perf.predict.context), so that the
    # candidates, the prediction, its curve and the simulator share their step memos
    perf_contexts: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # each role and shape's weight offload (compiler.offload.of), computed once
    offloads: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def model_name(self) -> str:
        return self.model.metadata.name


def display_name(path: Path) -> str:
    """A stable name for diagnostics: relative to the working directory when below it."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _load(raw: bytes, path: Path, kinds: tuple[str, ...]) -> tuple[object, Document]:
    doc = load_yaml_bytes(raw, display_name(path))
    return validate(doc, kinds), doc


def _read_ref(base: Path, src: SourceMap, field: str,
              value: str) -> tuple[Path, bytes] | Diagnostic:
    """The file a `rack:` or `model:` path names, read; any problem is blamed on the field."""
    target = base / value
    try:
        return target, read_regular(target)
    except FileProblem as problem:
        return diag(src, ("spec", field), "E204" if problem.code == "E001" else problem.code,
                     problem.expected, f"{shown(value)}: {problem.got}",
                     f"{problem.hint}; paths are relative to {src.file}")


def load_inputs(deployment_path: Path, kernels: str = catalog.DEPLOYED_KERNELS) -> Inputs:
    """The inputs of a deployment on one system (a mixed fleet: load_fleet)."""
    fleet = load_fleet(deployment_path, kernels)
    if len(fleet) > 1:
        raise CompileError([Diagnostic(
            "error", "E210", display_name(deployment_path), 0, 0, "spec.rack",
            "a Rack or a one-system Cluster", f"a Cluster of {len(fleet)} groups",
            "this command plans one system; `rackc check` and `rackc compile` take mixed fleets")])
    return fleet[0]


def load_fleet(deployment_path: Path,
               kernels: str = catalog.DEPLOYED_KERNELS) -> tuple[Inputs, ...]:
    """One Inputs per group of a mixed-fleet Cluster (one for a Rack or a one-system Cluster),
    each with its own system, hardware and resolved choices. A group's hardware is a Cluster
    named after the group; its workload is the deployment's, scaled by its share of the GPUs.
    `kernels`: whose measured kernel tables the perf model predicts with (`predict
    --kernels`, a what-if: the bundle runs vLLM whatever it is)."""
    try:
        raw = read_regular(deployment_path)
    except FileProblem as problem:
        raise file_error(problem, display_name(deployment_path)) from None
    dep, dep_doc = _load(raw, deployment_path, ("Deployment",))
    assert isinstance(dep, DeploymentV1)
    base = deployment_path.resolve().parent
    dsrc = dep_doc.source
    errors: list[Diagnostic] = []
    texts = [raw]

    hardware, rack_path = _read_rack(dep, base, dsrc, errors, texts)
    model, model_src = _resolve_model(dep, base, dsrc, errors, texts)
    units: list[tuple[RackV1 | ClusterV1, SourceMap, System]] = []
    if hardware is not None:
        units = fleet_units(hardware[0], hardware[1].source, errors)
    if model is not None:
        model_errors = check_model(model, model_src)
        errors.extend(model_errors)
        if not model_errors:
            errors.extend(check_serving(dep, model, dsrc))
    errors.extend(check_objective(dep, dsrc))
    errors.extend(check_fleet_objective(dep, [system for _, _, system in units], dsrc))
    if errors:
        raise CompileError(sorted(errors, key=lambda d: (d.file, d.line, d.column, d.code)))
    model = with_checkpoint(model, dep.spec.serving.checkpoint)
    model = with_redundant_experts(model, dep.spec.serving.redundant_experts)
    digest = hashlib.sha256(b"\0".join(texts)).hexdigest()
    model_path = Path(os.path.realpath(base / dep.spec.model)) if model_src.file != dsrc.file and \
        not model_src.file.startswith("catalog:") else None
    files = tuple(p for p in (deployment_path.resolve(), rack_path, model_path) if p)
    _check_kernels(kernels, [system for _, _, system in units])
    return _group_inputs(dep, units, model, dsrc, model_src, digest, files, kernels)


def _read_rack(dep: DeploymentV1, base: Path, dsrc: SourceMap, errors: list[Diagnostic],
               texts: list[bytes]) -> tuple[tuple[RackV1 | ClusterV1, Document] | None,
                                            Path | None]:
    """The Rack or Cluster the deployment names, with its document, and its real path (None
    where it could not be read: the problem is in `errors`)."""
    rack = _read_ref(base, dsrc, "rack", dep.spec.rack)
    if isinstance(rack, Diagnostic):
        errors.append(rack)
        return None, None
    try:
        hardware, doc = _load(rack[1], rack[0], ("Rack", "Cluster"))
    except CompileError as exc:
        errors.extend(exc.diagnostics)
        return None, None
    texts.append(rack[1])
    assert isinstance(hardware, (RackV1, ClusterV1))
    return (hardware, doc), Path(os.path.realpath(rack[0]))


def _group_inputs(dep: DeploymentV1, units: list[tuple[RackV1 | ClusterV1, SourceMap, System]],
                  model: ModelV1, dsrc: SourceMap, model_src: SourceMap, digest: str,
                  files: tuple[Path, ...], kernels: str) -> tuple[Inputs, ...]:
    """One Inputs per group, its workload scaled by its share of the fleet's GPUs and its ids
    numbered on from the groups before it."""
    gpus = [_gpus(hw, system) for hw, _, system in units]
    out, at = [], Offsets()
    for (hw, hsrc, system), share in zip(units, gpus, strict=True):
        d = dep if len(units) == 1 else _scaled(dep, share / sum(gpus))
        sources = {"deployment": dsrc, "hardware": hsrc, "model": model_src}
        resolved = resolve(d, hw, model, system, sources, digest)
        _check_block_size(d, resolved, dsrc, model.spec.architecture)
        out.append(Inputs(d, hw, model, system, catalog.workload(d.spec.workload.profile),
                          sources, resolved, files, kernels, at))
        racks, trays = layout(hw, system)
        at = at.after(racks, racks if system.form == "nvl72" else racks * trays)
    return tuple(out)


def _check_kernels(kernels: str, systems: list[System]) -> None:
    """Another engine's kernels exist only where its tables were converted for the system."""
    missing = sorted({s.name for s in systems if catalog.calibration(s.name, kernels) is None})
    if kernels == catalog.DEPLOYED_KERNELS or not missing:
        return
    have = [k for k in catalog.KERNEL_SOURCES
            if all(catalog.calibration(n, k) is not None for n in missing)]
    raise CompileError([Diagnostic(
        "error", "E606", "<argument>", 0, 0, "--kernels",
        f"an engine whose measured kernels rackc has for {', '.join(missing)}: "
        f"{', '.join(have)}", kernels,
        f"predict with {' or '.join(have)}; for a system AIConfigurator measured, `rackc "
        f"calibrate --system {missing[0]} --from-aiconfigurator --framework {kernels} -o "
        f"{catalog.kernels_path(missing[0], kernels).name}` converts its tables")])


def _gpus(hw: RackV1 | ClusterV1, system: System) -> int:
    racks, trays = layout(hw, system)
    return racks * trays * system.gpus_per_tray


def _scaled(dep: DeploymentV1, share: float) -> DeploymentV1:
    """A group's deployment: the sessions and requests in flight it serves of the fleet's."""
    w = dep.spec.workload
    scaled = {k: max(1, round(getattr(w, k) * share)) for k in ("sessions", "concurrency")
              if getattr(w, k) is not None}
    spec = dep.spec.model_copy(update={"workload": w.model_copy(update=scaled)})
    return dep.model_copy(update={"spec": spec})


def _check_block_size(dep: DeploymentV1, resolved: Resolved, src: SourceMap,
                      architecture: str) -> None:
    block = dep.spec.serving.block_size
    problem = None if block is None else kernel_block_problem(
        resolved.attention_backend.value, block, architecture)
    if problem:
        raise CompileError([diag(src, ("spec", "serving", "block_size"), "E105",
                                  "a multiple of the attention kernel block", str(block),
                                  f"{problem}; leave block_size out to take "
                                  f"{resolved.attention_backend.value}'s")])


def with_checkpoint(model: ModelV1, checkpoint) -> ModelV1:
    """The Model as served from the deployment's `serving.checkpoint`, if it names one."""
    if checkpoint is None:
        return model
    spec = model.spec
    dtypes = spec.dtypes.model_copy(update={
        "weights": checkpoint.weights or spec.dtypes.weights,
        "experts": checkpoint.experts or spec.dtypes.experts})
    return model.model_copy(update={"spec": spec.model_copy(update={
        "dtypes": dtypes, "hf_id": checkpoint.hf_id or spec.hf_id})})


def with_redundant_experts(model: ModelV1, redundant: int | None) -> ModelV1:
    """The Model with the deployment's EPLB replicas, if it sets them (MoE models only:
    check_serving rejects them for dense ones)."""
    if redundant is None or model.spec.moe is None:
        return model
    moe = model.spec.moe.model_copy(update={"redundant_experts": redundant})
    return model.model_copy(update={"spec": model.spec.model_copy(update={"moe": moe})})


def _resolve_model(dep: DeploymentV1, base: Path, dsrc: SourceMap, errors: list[Diagnostic],
                   texts: list[bytes]) -> tuple[ModelV1 | None, SourceMap]:
    ref = dep.spec.model
    if ref.endswith((".yaml", ".yml")):
        read = _read_ref(base, dsrc, "model", ref)
        if isinstance(read, Diagnostic):
            errors.append(read)
            return None, dsrc
        try:
            model, doc = _load(read[1], read[0], ("Model",))
        except CompileError as exc:
            errors.extend(exc.diagnostics)
            return None, dsrc
        texts.append(read[1])
        return model, doc.source
    if ref not in catalog.model_names():
        errors.append(diag(dsrc, ("spec", "model"), "E202", "a catalog model or a *.yaml path",
                            shown(ref), did_you_mean(ref, catalog.model_names())))
        return None, dsrc
    texts.append(catalog.model_text(ref).encode())
    return catalog.model(ref), SourceMap(f"catalog:models/{ref}.yaml")


def _resolve_system(hw: RackV1 | ClusterV1, src: SourceMap, errors: list[Diagnostic]):
    name = hw.spec.system
    if name not in catalog.system_names():
        errors.append(diag(src, ("spec", "system"), "E201", "a catalog system", shown(name),
                            did_you_mean(name, catalog.system_names())))
        return None
    return catalog.system(name)


def fleet_units(hw: RackV1 | ClusterV1, src: SourceMap,
                errors: list[Diagnostic]) -> list[tuple[RackV1 | ClusterV1, SourceMap, System]]:
    """(hardware, its source view, its system) per group: the hardware itself, or each group
    of a mixed-fleet Cluster as a one-system Cluster. Problems go to `errors` (then: [])."""
    if not (isinstance(hw, ClusterV1) and hw.spec.groups):
        if isinstance(hw, ClusterV1) and hw.spec.system is None:
            errors.append(diag(src, ("spec",), "E102", "`spec.system` or `spec.groups`",
                                "neither", "name the catalog system, or list the groups of a "
                                "mixed fleet"))
            return []
        system = _resolve_system(hw, src, errors)
        found = check_hardware(hw, system, src) if system is not None else []
        errors.extend(found)
        return [(hw, src, system)] if system is not None and not found else []
    before = len(errors)
    both = sorted(hw.spec.model_fields_set - {"groups"})
    if both:
        errors.append(diag(src, ("spec", both[0]), "E210", "`groups` alone (each group sets "
                            "its own hardware)", f"`{both[0]}` beside `groups`",
                            f"move `{both[0]}` into the groups it applies to", key=True))
    units, offset, seen = [], 0, {}
    for i, group in enumerate(hw.spec.groups):
        gsrc = src.group(i)
        if group.name in seen:
            errors.append(diag(gsrc, ("spec", "name"), "E210", "a group name not used before",
                                shown(group.name), f"groups[{seen[group.name]}] is named so"))
        seen.setdefault(group.name, i)
        unit = _group(hw, group, offset, gsrc, errors)
        if unit is None:
            continue
        units.append(unit)
        offset += layout(unit[0], unit[2])[0]
    if len(errors) == before:
        errors.extend(_fleet_size(units, src))
    if len(errors) == before:
        errors.extend(_unique_node_names(units))
    return units if len(errors) == before else []


def _fleet_size(units: list[tuple[ClusterV1, SourceMap, System]],
                src: SourceMap) -> list[Diagnostic]:
    """A mixed fleet holds at most the GPUs of the largest one-system cluster, so compile
    time and memory stay within the bound docs/constraints.md states for every input."""
    gpus = [_gpus(hw, system) for hw, _, system in units]
    if sum(gpus) <= MAX_GPUS:
        return []
    return [diag(src, ("spec", "groups"), "E212",
                  f"at most {MAX_GPUS} GPUs over the groups (64 NVL72 racks)",
                  f"{sum(gpus)} GPUs in {len(units)} groups",
                  "split the fleet into deployments of at most 64 racks' GPUs each")]


def _group(cluster: ClusterV1, group, offset: int, src: SourceMap,
           errors: list[Diagnostic]) -> tuple[ClusterV1, SourceMap, System] | None:
    """One group as a one-system Cluster named after it, whose racks start at `offset`: its
    unavailable GPU ids are the plan's (racks numbered across the fleet)."""
    fields = {k: v for k, v in group if k != "name"}
    hw = ClusterV1.model_construct(
        apiVersion=cluster.apiVersion, kind="Cluster",
        metadata=cluster.metadata.model_copy(update={"name": group.name}),
        spec=ClusterSpec.model_construct(**fields))
    system = _resolve_system(hw, src, errors)
    if system is None:
        return None
    racks = layout(hw, system)[0]
    for j, gid in enumerate(group.unavailable.gpus):
        if not offset <= parse_gpu(gid).rack < offset + racks:
            errors.append(diag(src, ("spec", "unavailable", "gpus", j), "E205",
                                f"a GPU of racks r{offset}..r{offset + racks - 1}", repr(gid),
                                "GPU ids are the plan's: racks count on across the groups"))
            return None
    found = check_hardware(hw, system, src, offset)
    errors.extend(found)
    return None if found else (hw, src, system)


def _unique_node_names(units: list[tuple[ClusterV1, SourceMap, System]]) -> list[Diagnostic]:
    """A Kubernetes node belongs to one group: node names must differ across groups."""
    owner: dict[str, int] = {}
    for i, (hw, src, system) in enumerate(units):
        racks, trays = layout(hw, system)
        for r in range(racks):
            for t in range(trays):
                name = node_name(hw, r, t, r * trays + t)
                if owner.setdefault(name, i) != i:
                    field = "node_names" if hw.spec.node_names else "node_name_template"
                    return [diag(src, ("spec", field), "E208",
                                  "node names no other group uses", repr(name),
                                  f"groups[{owner[name]}] has a node of that name; a node "
                                  "belongs to one group")]
    return []


def check_hardware(hw: RackV1 | ClusterV1, system: System, src: SourceMap,
                   rack_offset: int = 0) -> list[Diagnostic]:
    """Counts and ids that only make sense against the catalog system (a mixed fleet's group:
    its GPU ids' racks start at `rack_offset`)."""
    out: list[Diagnostic] = []
    spec = hw.spec
    if isinstance(hw, ClusterV1):
        want, other = ("nodes", "racks") if system.form == "hgx" else ("racks", "nodes")
        if getattr(spec, other) is not None:
            out.append(diag(src, ("spec", other), "E207", f"`{want}` for a {system.form} system",
                             f"`{other}`", f"{system.name} is counted in {want}", key=True))
        elif getattr(spec, want) is None:
            out.append(diag(src, ("spec",), "E102", f"`spec.{want}`", "nothing",
                             f"add `{want}:` (how many {system.name} {want})"))
    max_trays = int(system.rack.trays.value)
    if system.form == "nvl72" and spec.trays is not None and spec.trays > max_trays:
        out.append(diag(src, ("spec", "trays"), "E104", f"at most {max_trays} trays per rack",
                         str(spec.trays), f"a {system.name} rack has {max_trays} compute trays"))
    if out:
        return out
    racks, trays = layout(hw, system)
    for i, tray in enumerate(spec.unavailable.trays):
        if tray >= racks * trays:
            out.append(diag(src, ("spec", "unavailable", "trays", i), "E205",
                             f"a tray index below {racks * trays}", str(tray),
                             "trays count from 0 across racks (rack * trays + tray)"))
    gpus = system.gpus_per_tray
    for i, gid in enumerate(spec.unavailable.gpus):
        r, t, g = parse_gpu(gid)
        if not 0 <= r - rack_offset < racks or t >= trays or g >= gpus:
            out.append(diag(src, ("spec", "unavailable", "gpus", i), "E205",
                             f"an id r<0..{racks - 1}>-t<00..{trays - 1:02d}>-g<0..{gpus - 1}>",
                             repr(gid), "GPU ids are r{rack}-t{tray:02d}-g{gpu}, from 0"))
    out.extend(_check_template(hw, racks, trays, src))
    if spec.node_names is not None and len(spec.node_names) != racks * trays:
        out.append(diag(src, ("spec", "node_names"), "E208",
                         f"{racks * trays} node names (one per tray)",
                         f"{len(spec.node_names)}", "list one Kubernetes node per tray"))
    return out


def node_name(hw: RackV1 | ClusterV1, rack: int, tray: int, index: int) -> str:
    """The Kubernetes node of a tray: from node_names, else from node_name_template."""
    spec = hw.spec
    if spec.node_names:
        return spec.node_names[index]
    return spec.node_name_template.format(name=hw.metadata.name, rack=rack, tray=tray)


def invented_node_names(inputs: "Inputs") -> list[Diagnostic]:
    """W512 when the manifest names no Kubernetes nodes (neither `node_names` nor
    `node_name_template`): the bundle pins pods to names rackc made up from the default
    template, which a real cluster rarely has."""
    src = inputs.sources["hardware"]
    given = {("spec", "node_names"), ("spec", "node_name_template")}
    if any(path[:2] in given for path in src.values):
        return []
    path = ("spec", "node_names")
    pos = src.locate(("spec",))
    example = node_name(inputs.hardware, 0, 0, 0)
    return [Diagnostic(
        "warning", "W512", src.file, pos.line, pos.column, format_path(path),
        "the Kubernetes node name of each tray (node_names or node_name_template)",
        f"neither: pods are pinned to names from the default template, e.g. {example!r}",
        "list spec.node_names (one per tray) or set spec.node_name_template to your "
        "cluster's naming before `kubectl apply`")]


def _check_template(hw: RackV1 | ClusterV1, racks: int, trays: int,
                    src: SourceMap) -> list[Diagnostic]:
    if hw.spec.node_names is not None:
        return []
    path = ("spec", "node_name_template")
    template = hw.spec.node_name_template
    try:
        fields = list(string.Formatter().parse(template))
        unsafe = next((f"{{{name}{':' + spec if spec else ''}}}"
                       for _, name, spec, conv in fields if name is not None and (
                           name not in ("name", "rack", "tray") or conv
                           or not _TEMPLATE_SPEC.match(spec or ""))), None)
        if unsafe:  # attribute access, nested fields or huge widths: never formatted
            raise ValueError(f"unsupported field {unsafe}")
        names = [node_name(hw, r, t, r * trays + t) for r in range(racks) for t in range(trays)]
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        return [diag(src, path, "E105", "a template with fields {name}, {rack}, {tray}",
                      shown(template), f"it fails to format: {exc}; e.g. "
                      "\"{name}-r{rack}-t{tray:02d}\"")]
    bad = [n for n in names if not re.match(DNS1123_SUBDOMAIN, n) or len(n) > 253]
    if bad:
        return [diag(src, path, "E105", "node names that are DNS-1123 subdomains",
                      repr(bad[0]), "Kubernetes node names are lower case letters, digits, "
                      "'-' and '.'")]
    return []


_TEMPLATE_SPEC = re.compile(r"^(0?[1-9]?d?)$")  # `{tray:02d}`: widths below 10 only


def layout(hw: RackV1 | ClusterV1, system: System) -> tuple[int, int]:
    """(racks, trays per rack). HGX nodes are trays of one rack, each its own NVLink domain."""
    spec = hw.spec
    if system.form == "hgx":
        nodes = spec.nodes if isinstance(hw, ClusterV1) else None
        return 1, nodes or spec.trays or 1
    racks = spec.racks if isinstance(hw, ClusterV1) and spec.racks else 1
    return racks, spec.trays or int(system.rack.trays.value)
