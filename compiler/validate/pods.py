"""What the cluster would run from a bundle: the pods each workload object creates (as their
controllers do), what each pod asks of its node, which nodes of the rack manifest it may land
on, and the engine processes it starts. The rules (compiler.validate.rules) read only these."""

import functools
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from compiler.plan import Hardware, Plan
from compiler.validate.bundle import Obj, Script
from compiler.validate.quantity import parse as parse_quantity

GPU = "nvidia.com/gpu"
MEMORY = "memory"
CHANNEL = "compute-domain-channel"  # not a resource name: one per node (rules.dra_channels)
OS_LABELS = {"kubernetes.io/os": "linux"}
# Values GPU Feature Discovery can write, where its format is fixed: a node never carries
# another value, whatever the rack manifest says.
GFD_FORMATS = {"nvidia.com/gpu.clique": re.compile(r"[0-9a-fA-F-]{36}\.\d+")}

def quantity(value: object) -> Fraction | None:
    """A Kubernetes quantity (`500m`, `64Gi`, 4); None when it is not one."""
    try:
        return parse_quantity(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class Node:
    """A node of the rack manifest, as the scheduler sees it."""

    name: str
    tray: str
    labels: dict[str, str] = field(hash=False, compare=False)
    capacity: dict[str, Fraction] = field(hash=False, compare=False)


def rdma_resource(plan: Plan) -> str | None:
    """The device-plugin resource the site names for the trays' RDMA devices, when the plan
    carries one."""
    return plan.site.rdma.resource


def is_rdma(resource: str, plan: Plan) -> bool:
    """The site's RDMA resource, or, where the plan names none, a device-plugin resource
    named for RDMA (`rdma/...`, `.../rdma...`)."""
    named = rdma_resource(plan)
    return resource == named if named else "rdma" in resource.lower()


def nodes(plan: Plan, requested: tuple[str, ...] = ()) -> list[Node]:
    """The schedulable nodes, as the plan records them (`Hardware`): trays that are available;
    GPUs less the unavailable ones; allocatable memory (the tray's DRAM less the site's node
    reserve, `Hardware.allocatable_gib_per_tray`); the tray's RDMA devices under each RDMA
    resource name `requested` (is_rdma). Labels: the manifest's `node_labels` (less values GPU
    Feature Discovery cannot write), and those the kubelet sets whose values are known
    (`kubernetes.io/arch`, `kubernetes.io/os`, and `kubernetes.io/hostname` where the site says
    it is the node name). A mixed fleet: each group's nodes, as its system has them."""
    return [n for hw in plan.fleet for n in _nodes(plan, hw, requested)]


def _nodes(plan: Plan, hw: Hardware, requested: tuple[str, ...]) -> list[Node]:
    labels = {k: v for k, v in hw.node_labels.items()
              if k not in GFD_FORMATS or GFD_FORMATS[k].fullmatch(v)}
    labels.update({"kubernetes.io/arch": hw.arch, **OS_LABELS})
    allocatable = Fraction(str(hw.allocatable_gib_per_tray))
    hostname = plan.site.pin_by_hostname  # the user says they are equal
    down = set(hw.unavailable_gpus)
    out = []
    for tray in hw.trays:
        if not tray.available:
            continue
        capacity = {GPU: Fraction(sum(1 for g in tray.gpus if g not in down)),
                    MEMORY: allocatable * 2**30}
        for name in requested:
            if is_rdma(name, plan):
                capacity[name] = Fraction(hw.rdma_devices_per_tray)
        own = {**labels, "kubernetes.io/hostname": tray.node_name} if hostname else labels
        out.append(Node(tray.node_name, tray.id, own, capacity))
    return out


@dataclass(frozen=True)
class PodGroup:
    """Identical pods one workload object creates from one pod template."""

    obj: Obj
    path: str  # field path of the pod spec in the object
    name: str  # the component or role, for messages
    pods: int
    spec: dict[str, Any] = field(hash=False, compare=False)
    # Pods of one group are spread by their controller over distinct nodes (multi-node
    # instances: one pod per node) and the controller injects the NIXL side-channel host.
    multinode: bool = False

    @property
    def where(self) -> str:
        return self.at(self.path)

    @functools.cached_property
    def selector(self) -> "Selector":
        """Its node selection, compiled once: a fleet's rules test each group against a
        thousand nodes, and its pods without GPUs exclude a thousand trays by name."""
        return compile_selector(self.spec)

    def at(self, path: str) -> str:
        """An object, a field path in it and, for a component or role, its name."""
        named = f" ({self.name})" if self.name != self.obj.name else ""
        return f"{self.obj.label} {path}{named}"


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _spec(template: object) -> dict[str, Any]:
    spec = template.get("spec") if isinstance(template, dict) else None
    return spec if isinstance(spec, dict) else {}


def pod_groups(objs: list[Obj]) -> list[PodGroup]:
    """The pods of DynamoGraphDeployment components (replicas x multinode.nodeCount), of
    LeaderWorkerSets (replicas leaders and replicas x (size - 1) workers), of Deployments,
    StatefulSets and Jobs (replicas), and bare Pods."""
    out = []
    for obj in objs:
        spec = _dict(obj.doc.get("spec"))
        if obj.kind == "DynamoGraphDeployment":
            for i, comp in enumerate(_list(spec.get("components"))):
                comp = _dict(comp)
                nodes_ = _int((comp.get("multinode") or {}).get("nodeCount"), 1)
                out.append(PodGroup(obj, f"spec.components[{i}].podTemplate.spec",
                                    str(comp.get("name")),
                                    _int(comp.get("replicas"), 1) * nodes_,
                                    _spec(comp.get("podTemplate")), nodes_ > 1))
        elif obj.kind == "LeaderWorkerSet":
            lwt = _dict(spec.get("leaderWorkerTemplate"))
            replicas, size = _int(spec.get("replicas"), 1), _int(lwt.get("size"), 1)
            worker = lwt.get("workerTemplate")
            leader = lwt.get("leaderTemplate") or worker
            base = "spec.leaderWorkerTemplate"
            out.append(PodGroup(obj, f"{base}.leaderTemplate.spec" if lwt.get("leaderTemplate")
                                else f"{base}.workerTemplate.spec", f"{obj.name} leader",
                                replicas, _spec(leader), size > 1))
            if size > 1:
                out.append(PodGroup(obj, f"{base}.workerTemplate.spec", f"{obj.name} worker",
                                    replicas * (size - 1), _spec(worker), True))
        elif obj.kind in ("Deployment", "StatefulSet", "ReplicaSet"):
            out.append(PodGroup(obj, "spec.template.spec", obj.name,
                                _int(spec.get("replicas"), 1), _spec(spec.get("template"))))
        elif obj.kind == "Job":
            out.append(PodGroup(obj, "spec.template.spec", obj.name,
                                _int(spec.get("parallelism"), 1), _spec(spec.get("template"))))
        elif obj.kind == "Pod":
            out.append(PodGroup(obj, "spec", obj.name, 1, spec))
    return out


def _requests(container: dict[str, Any]) -> dict[str, Fraction]:
    """A container's requests; a limit stands for a missing request (the API server's rule)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {k: q for k, v in merged.items() if (q := quantity(v)) is not None}


def demand(spec: dict[str, Any]) -> dict[str, Fraction]:
    """What one pod asks of its node: the sum over containers, or the largest init container
    where that is more (the scheduler's effective request)."""
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        for k, v in _requests(c).items():
            total[k] = total.get(k, Fraction(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in _requests(c).items():
            total[k] = max(total.get(k, Fraction(0)), v)
    return total


# --- node selection -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Requirement:
    """One node selector requirement, its values as a set (a fleet's `metadata.name NotIn`
    lists a thousand names, tested against a thousand nodes)."""

    key: str
    operator: str
    values: tuple[str, ...]
    members: frozenset[str]
    failure: str  # how mismatch() names it

    @classmethod
    def of(cls, expr: dict[str, Any], kind: str) -> "_Requirement":
        values = tuple(str(v) for v in expr.get("values") or [])
        return cls(str(expr.get("key")), str(expr.get("operator")), values, frozenset(values),
                   f"{kind} {expr.get('key')} {expr.get('operator')} {expr.get('values', [])}")

    def matches(self, value: str | None) -> bool:
        op = self.operator
        if op == "In":
            return value in self.members
        if op == "NotIn":
            return value not in self.members
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt") and value is not None and self.values:
            try:
                a, b = int(value), int(self.values[0])
            except ValueError:
                return False
            return a > b if op == "Gt" else a < b
        return False


@dataclass(frozen=True)
class Selector:
    """A pod spec's nodeSelector and required node affinity terms, compiled once (a pod
    group's: PodGroup.selector)."""

    node_selector: tuple[tuple[str, str], ...]
    terms: tuple[tuple[tuple[_Requirement, ...], tuple[_Requirement, ...]], ...]


def compile_selector(spec: dict[str, Any]) -> Selector:
    """The pod spec's node selection, its requirement values as sets."""
    terms = tuple((tuple(_Requirement.of(e, "label") for e in t.get("matchExpressions") or []),
                   tuple(_Requirement.of(e, "field") for e in t.get("matchFields") or []))
                  for t in _required_terms(spec))
    return Selector(tuple((k, str(v)) for k, v in (spec.get("nodeSelector") or {}).items()),
                    terms)


# Labels the cluster's agents set, whose values the rack manifest does not tell: GPU Feature
# Discovery (nvidia.com/*), Node Feature Discovery, and the kubelet's hostname label (commonly,
# not always, the node name).
OWNED_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/", "kubernetes.io/hostname")


def _label(node: Node, key: str, assume_owned: bool) -> str | None:
    """The node's label; with `assume_owned`, a label some agent owns and the manifest does not
    give is taken as what the selector asks (the hostname label as the node name)."""
    if key in node.labels or not assume_owned or not key.startswith(OWNED_PREFIXES):
        return node.labels.get(key)
    return node.name if key == "kubernetes.io/hostname" else _ASSUMED


_ASSUMED = object()  # stands for "whatever the selector asks"


def _term_mismatch(term: tuple[tuple[_Requirement, ...], tuple[_Requirement, ...]],
                   node: Node, assume_owned: bool) -> str | None:
    """None when the node selector term matches the node, else the requirement that fails."""
    expressions, fields = term
    for r in expressions:
        value = _label(node, r.key, assume_owned)
        if value is not _ASSUMED and not r.matches(value):
            return r.failure
    for r in fields:
        if not r.matches(node.name if r.key == "metadata.name" else None):
            return r.failure
    return None


def _required_terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}) \
        .get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(affinity.get("nodeSelectorTerms") or [])


def bad_field_selectors(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Required-affinity field selectors with In/NotIn and other than one value, which the API
    server rejects (core validation ValidateNodeFieldSelectorRequirement: "must be only one
    value when `operator` is 'In' or 'NotIn' for node field selector")."""
    return [e for t in _required_terms(spec) for e in t.get("matchFields") or []
            if e.get("operator") in ("In", "NotIn") and len(e.get("values") or []) != 1]


def excluded_names(spec: dict[str, Any]) -> set[str]:
    """The node names every term of the pod's required node affinity excludes by field
    (`metadata.name NotIn [...]`): where it says it must not run."""
    terms = _required_terms(spec)
    if not terms:
        return set()
    return set.intersection(*({str(v) for e in t.get("matchFields") or []
                               if e.get("key") == "metadata.name" and e.get("operator") == "NotIn"
                               for v in e.get("values") or []} for t in terms))


def mismatch(spec: dict[str, Any], node: Node, assume_owned: bool = False) -> str | None:
    """None when the pod's nodeSelector and required node affinity admit the node, else the
    first requirement that does not. `assume_owned`: see _label (the placement rules use it,
    so that a label rackc cannot know does not hide what the scheduler would do)."""
    return node_mismatch(compile_selector(spec), node, assume_owned)


def node_mismatch(sel: Selector, node: Node, assume_owned: bool = False) -> str | None:
    """`mismatch` of a compiled selector (a pod group's is compiled once)."""
    for key, value in sel.node_selector:
        label = _label(node, key, assume_owned)
        if label is not _ASSUMED and label != value:
            return f"nodeSelector {key}={value}"
    if sel.terms:
        failures = [_term_mismatch(t, node, assume_owned) for t in sel.terms]
        if all(failures):
            return f"nodeAffinity {failures[0]}"
    return None


HOSTNAME = "kubernetes.io/hostname"


def _pins(spec: dict[str, Any]) -> set[tuple[str, str]] | None:
    """What a required node affinity pins when every term does: ("host", hostname) for a
    `hostname In [...]` expression, ("name", node) for a `metadata.name In [...]` field (how
    rackc pins engine pods); else None: the pre-filter below is sound only then (terms are
    ORed, a term's requirements ANDed, so a term holding a pin admits only pinned nodes)."""
    terms = _required_terms(spec)
    if not terms:
        return None
    pins: set[tuple[str, str]] = set()
    for term in terms:
        hosts = [("host", str(v)) for e in term.get("matchExpressions") or []
                 if e.get("key") == HOSTNAME and e.get("operator") == "In"
                 for v in e.get("values") or []]
        names = [("name", str(v)) for e in term.get("matchFields") or []
                 if e.get("key") == "metadata.name" and e.get("operator") == "In"
                 for v in e.get("values") or []]
        if not hosts and not names:
            return None
        pins.update(hosts or names)
    return pins


def candidates(spec: dict[str, Any], all_nodes: list[Node]) -> list[int]:
    """Indices of the nodes that may match: those a pinning affinity names (by hostname, the
    label or the node name it is assumed to be, or by node name), else all, less those every
    term excludes by name (`metadata.name NotIn`). A superset of the matching nodes, so a
    fleet's thousands of pod groups and nodes are not tested pair by pair."""
    pins = _pins(spec)
    excluded = excluded_names(spec)
    return [i for i, n in enumerate(all_nodes) if n.name not in excluded and (
        pins is None or ("host", n.labels.get(HOSTNAME, n.name)) in pins
        or ("name", n.name) in pins)]


def eligible(g: PodGroup, all_nodes: list[Node]) -> list[Node]:
    return [all_nodes[i] for i in candidates(g.spec, all_nodes)
            if node_mismatch(g.selector, all_nodes[i]) is None]


# --- engine processes -----------------------------------------------------------------------

@dataclass(frozen=True)
class Engine:
    """A vLLM engine process: `vllm serve` or Dynamo's `python3 -m dynamo.vllm` worker."""

    where: str  # the object and field path, or the script
    file: str
    path: str  # the container's field path in its object ("" for a launch script)
    launcher: str  # "vllm" | "dynamo"
    argv: tuple[str, ...]  # the engine's flags
    env: dict[str, str | None] = field(hash=False, compare=False)  # None: from valueFrom
    mounts: tuple[str, ...] = ()
    group: PodGroup | None = None  # None for a launch script

    @property
    def line(self) -> int:
        """Where it is written (asked for by a finding only: the bundle's lines are parsed
        on demand)."""
        return self.group.obj.line_at(self.path) if self.group is not None else 1

    def flag(self, name: str) -> str | None:
        for i, word in enumerate(self.argv):
            if word == name and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None

    def has(self, name: str) -> bool:
        return name in self.argv

    def connectors(self) -> list[dict[str, Any]]:
        """The KV connectors of `--kv-transfer-config`, MultiConnector's members flattened."""
        text = self.flag("--kv-transfer-config")
        try:
            config = json.loads(text) if text else None
        except ValueError:
            return []
        return list(_flatten_connectors(config)) if isinstance(config, dict) else []


def _flatten_connectors(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    members = (config.get("kv_connector_extra_config") or {}).get("connectors")
    if config.get("kv_connector") in ("MultiConnector", "PdConnector") and \
            isinstance(members, list):
        for member in members:
            if isinstance(member, dict):
                yield from _flatten_connectors(member)
    else:
        yield config


def _engine_argv(words: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """(launcher, flags) when the words start an engine: `vllm serve MODEL ...` or
    `python3 -m dynamo.vllm ...`, possibly inside `sh -c SCRIPT`."""
    for i, word in enumerate(words):
        if word.endswith("vllm") and words[i + 1:i + 2] == ["serve"]:
            rest = words[i + 2:]
            return "vllm", tuple(rest[1:] if rest and not rest[0].startswith("-") else rest)
        if word == "-m" and words[i + 1:i + 2] == ["dynamo.vllm"]:
            return "dynamo", tuple(words[i + 2:])
    return None


def _container_words(container: dict[str, Any]) -> list[str]:
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    if len(words) >= 3 and words[0].endswith("sh") and words[1] == "-c":
        try:
            return shlex.split(words[2].replace("\\\n", " "))
        except ValueError:
            return words
    return words


def engines(groups: list[PodGroup]) -> list[Engine]:
    out = []
    for g in groups:
        if not g.pods:
            continue
        for i, c in enumerate(g.spec.get("containers") or []):
            found = _engine_argv(_container_words(c))
            if found is None:
                continue
            env = {str(e.get("name")): e.get("value") if "value" in e else None
                   for e in c.get("env") or [] if isinstance(e, dict)}
            mounts = tuple(str(m.get("mountPath")) for m in c.get("volumeMounts") or [])
            path = f"{g.path}.containers[{i}]"
            out.append(Engine(g.at(path), g.obj.file, path, found[0], found[1], env, mounts, g))
    return out


def script_engines(scripts: list[Script]) -> list[Engine]:
    return [Engine(s.file, s.file, "", "vllm", s.argv, dict(s.env)) for s in scripts]
