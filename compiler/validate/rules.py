"""Controller-level rules: what the DRA driver, the scheduler, the kubelet and the engines decide
between objects, which no schema holds. Pure: `check(plan, files)` reads the plan and the
emitted files (path relative to OUT -> text) and returns one diagnostic per broken rule and
object, naming both. `rackc compile` runs the rules in ENFORCED on what it emits; `rackc
validate` runs them all.

Rules and where their facts come from:
- dra-channel-per-node: the NVIDIA DRA driver's default channel DeviceClass selects channel 0
  only (deployments/helm/.../deviceclass-compute-domain-default-channel.yaml: `...id == 0`), and
  the kubelet plugin refuses a second claim of it on a node (cmd/compute-domain-kubelet-plugin/
  device_state.go assertImexChannelNotAllocated): one channel claim per node; pods that each take
  one from a ResourceClaimTemplate need a node each, pods sharing a ResourceClaim share it.
- node-gpus, node-rdma-devices, node-memory: the scheduler's fit of requests within a node's
  capacity as the plan records it (`Hardware`: GPUs of the tray less the unavailable ones, the
  tray's allocatable host memory, its RDMA devices). CPU cores are not checked: no input or
  catalog entry tells them (`unchecked_resources` names them; E825 is retired).
- host-ports-per-node: processes on one host (launch scripts on a tray, hostNetwork pods) must
  not bind the same port, and hostNetwork pods declare what they bind so that the scheduler
  keeps them apart: vLLM's API `--port` (default 8000) and NIXL's side channel
  (VLLM_NIXL_SIDE_CHANNEL_PORT, default 5600, + the DP index: vLLM 0.33
  distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py; the scheduler's, so a
  headless node of a TP or PP instance binds none).
- selector-matches-node: every nodeSelector and required node affinity admits a node of the
  rack manifest, with the labels known there (the manifest's node_labels, kubernetes.io/arch,
  kubernetes.io/os; metadata.name as a field), unless it excludes every one by name
  (`metadata.name NotIn`): such a pod runs off the rack. A field selector with In or NotIn takes
  exactly one value (Kubernetes core validation, ValidateNodeFieldSelectorRequirement).
- cpu-pods-off-trays: pods that request no GPU (frontend, Mooncake master, router) keep off the
  rack's trays: the engine pods' memory requests fill a tray's allocatable (the host budget), so
  a CPU pod there takes what a pinned worker needs, or leaves it Pending. GPU nodes need not be
  tainted, so a GPU toleration does not keep them off; a required `metadata.name NotIn` does.
- connector-env: NixlConnector and NixlPushConnector advertise VLLM_NIXL_SIDE_CHANNEL_HOST
  (vLLM default `localhost`, which no peer reaches); Dynamo 1.6.1 fills it in only when the
  connector is NixlConnector or PdConnector, not a MultiConnector member (dynamo/vllm/args.py
  _uses_nixl_connector), and its operator only for multi-node components.
  MooncakeStoreConnector reads MOONCAKE_CONFIG_PATH (vLLM distributed/mooncake_store.py), from a
  mounted folder in a pod.
- rdma-transport: a Mooncake client with `protocol: rdma` needs an RDMA device and IPC_LOCK in
  the pod that loads it; NIXL between NVLink domains needs an RDMA transport in UCX_TLS (else KV
  goes over TCP).
- dynamo-connector: Dynamo's prefill handler resolves a P/D protocol per request from the
  worker's connector and raises for one it has none for (dynamo/vllm/kv_connector_protocols.py;
  the plan's site.engines.dynamo.facts.pd_connectors).
- graph-components: a DynamoGraphDeployment lists at most 25 components (its CRD's
  spec.components maxItems; site.engines.dynamo.facts.graph_components), or the API server
  refuses it whole.
- capabilities-effective, host-path-writable, pod-security, service-names, cpu-pods-arch,
  per-instance-placement, pd-within-group:
  compiler/validate/workloads.py says where each comes from.
- engine-matches-plan: every engine is a plan instance's, with its numbers
  (compiler/validate/engine_plan.py); pool-matches-plan: each Mooncake client file registers the
  plan's segment over its transport and HCAs (compiler/validate/pool_plan.py).
- engine-capability: the limits of the engine release each engine runs, as the plan records them
  (site.engines.<target>.facts, read from compiler/catalog/engines/ at compile time, each with
  its engine source: block sizes per attention backend, MoE backends for the plan's expert
  format and for the batched layout of DeepEP low-latency, the environment of all-to-all
  backends across trays; a Dynamo worker against the vLLM release its Dynamo imports), a
  hybrid model's --block-size one the release keeps at the engine's TP (it raises a block whose
  attention page cannot hold a request's linear-attention state: site.engines.<target>.facts.
  hybrid_block, by compiler.engine_choices.hybrid_block), the frontend's KV block size equal
  to the block the workers run, and NIXL by push on every P/D engine where a prefill has
  pipeline stages (the pull connector reads one stage). validate reads no catalog.

One module past 500 lines on purpose: it is the registry of the rules (RULES), one function
each, so that a code (E821-E842) and the check behind it are found in one file; the object
model they read is compiler/validate/pods.py and bundle.py.
"""

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from compiler import engine_choices, ports
from compiler.plan import EngineFacts, Plan
from compiler.validate import bundle, engine_plan, placement, pods, pool_plan, workloads
from compiler.validate.finding import Finding
from compiler.validate.pods import Engine, Node, PodGroup
from schemas.diagnostics import Diagnostic

NIXL = frozenset({"NixlConnector", "NixlPushConnector"})  # vLLM 0.33's P/D hand-off: pull, push


@dataclass(frozen=True)
class Bundle:
    """One folder deployed on its own, read back as pods and engines."""

    folder: str
    objs: list[bundle.Obj]
    groups: list[PodGroup]
    engines: list[Engine]


@dataclass(frozen=True)
class Context:
    plan: Plan
    nodes: list[Node]
    bundles: list[Bundle]
    scripts: list[Engine]
    files: Mapping[str, str | bytes]


def context(plan: Plan, files: Mapping[str, str | bytes]) -> Context:
    out = []
    for folder in bundle.BUNDLES:
        objs = bundle.objects(files, folder)
        groups = pods.pod_groups(objs)
        out.append(Bundle(folder, objs, groups, pods.engines(groups)))
    requested = tuple(sorted({r for b in out for g in b.groups for r in pods.demand(g.spec)}))
    return Context(plan, pods.nodes(plan, requested), out,
                   pods.script_engines(bundle.scripts(files)), files)


def _names(nodes: Iterable[Node]) -> str:
    names = [n.name for n in nodes]
    return ", ".join(names) if len(names) <= 4 else f"{names[0]} .. {names[-1]} ({len(names)})"


# --- selector-matches-node ------------------------------------------------------------------

# Why rackc cannot know the value of a label other agents own (pods.OWNED_PREFIXES).
_OWNED = (("nvidia.com/", "GPU Feature Discovery sets nvidia.com/* labels from the hardware "
           "(nvidia.com/gpu.clique is <clusterUUID>.<cliqueId>)"),
          ("feature.node.kubernetes.io/", "Node Feature Discovery sets this label"),
          ("kubernetes.io/hostname", "the kubelet sets it to the host's name, which need not "
           "be the node name: pin by node name with matchFields metadata.name"))


def _label_hint(requirement: str) -> str:
    for prefix, why in _OWNED:
        if prefix in requirement:
            return f"{why}; give the label in the rack manifest's node_labels when your nodes " \
                   "carry it"
    return "the rack manifest's node_labels are the labels rackc knows the nodes carry"


def selector_matches_node(ctx: Context) -> list[Finding]:
    out = []
    bad_values = {k: v for hw in ctx.plan.fleet for k, v in hw.node_labels.items()
                  if k in pods.GFD_FORMATS and not pods.GFD_FORMATS[k].fullmatch(v)}
    names = {n.name for n in ctx.nodes}
    for b in ctx.bundles:
        for g in b.groups:
            for e in pods.bad_field_selectors(g.spec):
                out.append(Finding(
                    "selector-matches-node", g.obj.file, g.obj.line_at(g.path), g.where,
                    "one value in a matchFields requirement with In or NotIn (the API server "
                    "rejects more)", f"{e.get('key')} {e.get('operator')} {e.get('values', [])}",
                    "give one requirement per node name: ANDed in a term for NotIn, one term "
                    "each for In"))
            if names <= pods.excluded_names(g.spec):
                continue  # kept off the rack on purpose (cpu-pods-off-trays)
            if g.pods and not pods.eligible(g, ctx.nodes) and ctx.nodes:
                why = pods.node_mismatch(g.selector, ctx.nodes[0]) or "?"
                hint = _label_hint(why)
                for key, value in bad_values.items():
                    if key in why:
                        hint = f"{key}={value} in node_labels is not a value GPU Feature " \
                               f"Discovery writes (<clusterUUID>.<cliqueId>); {hint}"
                out.append(Finding("selector-matches-node", g.obj.file, g.obj.line_at(g.path),
                                   g.where,
                                   "a node selection that admits a node of the rack manifest",
                                   f"{why}, which no node of {_names(ctx.nodes)} is known "
                                   "to match", hint))
    return out


def cpu_pods_off_trays(ctx: Context) -> list[Finding]:
    out = []
    for b in ctx.bundles:
        for g in b.groups:
            if not g.pods or pods.demand(g.spec).get(pods.GPU, 0) > 0:
                continue
            on = [ctx.nodes[i] for i in pods.candidates(g.spec, ctx.nodes)
                  if pods.node_mismatch(g.selector, ctx.nodes[i], assume_owned=True) is None]
            if on:
                out.append(Finding(
                    "cpu-pods-off-trays", g.obj.file, g.obj.line_at(g.path), g.where,
                    "a pod without GPUs kept off the rack's trays, whose allocatable memory the "
                    "engine pods' requests fill", f"it may run on {_names(on)}",
                    "add a required nodeAffinity term with matchFields metadata.name NotIn "
                    "the trays' node names (a GPU taint alone need not exist)"))
    return out


# --- placement: channels, capacities, host ports --------------------------------------------

_RESOURCE_RULES = {pods.GPU: "node-gpus", pods.MEMORY: "node-memory"}


def _channel_templates(objs: list[bundle.Obj]) -> dict[str, str]:
    """ResourceClaimTemplate name -> the ComputeDomain whose channel it hands out."""
    out = {}
    for o in objs:
        if o.kind == "ComputeDomain":
            name = (((o.doc.get("spec") or {}).get("channel") or {})
                    .get("resourceClaimTemplate") or {}).get("name")
            if name:
                out[str(name)] = o.name
    return out


def _channel(spec: dict[str, Any], templates: dict[str, str]) -> tuple[bool, str | None]:
    template, claim = False, None
    for rc in spec.get("resourceClaims") or []:
        if rc.get("resourceClaimTemplateName") in templates:
            template = True
        elif rc.get("resourceClaimName"):
            claim = str(rc["resourceClaimName"])  # a shared claim; channel if it names one
    return template, claim if claim and claim in templates.values() else None


def _rule_for(resource: str, plan: Plan) -> str | None:
    if pods.is_rdma(resource, plan):
        return "node-rdma-devices"
    return _RESOURCE_RULES.get(resource)


def _engine_ports(e: Engine) -> set[int]:
    """The ports an engine process binds on its host (see the module docstring)."""
    bound = set()
    if not e.has("--headless"):
        bound.add(_int(e.flag("--port"), ports.ENGINE_API))
    schedules = not e.has("--headless") or _int(e.flag("--data-parallel-size"), 1) > 1
    if schedules and any(c.get("kv_connector") in NIXL for c in e.connectors()):
        base = _int(e.env.get("VLLM_NIXL_SIDE_CHANNEL_PORT"), ports.NIXL_SIDE_CHANNEL)
        start = _int(e.flag("--data-parallel-start-rank"), 0)
        local = _int(e.flag("--data-parallel-size-local"), 0) or _local_ranks(e)
        bound |= {base + start + i for i in range(local)}
    return bound


def _local_ranks(e: Engine) -> int:
    """DP ranks of the engine in this process: the GPUs it sees (CUDA_VISIBLE_DEVICES, else the
    pod's GPU request) over its TP size, at most the DP size."""
    devices = e.env.get("CUDA_VISIBLE_DEVICES")
    if devices:
        gpus = len(devices.split(","))
    else:
        asked = pods.demand(e.group.spec).get(pods.GPU) if e.group is not None else None
        gpus = int(asked) if asked else 1
    tp = _int(e.flag("--tensor-parallel-size"), 1) or 1
    dp = _int(e.flag("--data-parallel-size"), 1)
    return max(1, min(dp, gpus // tp))


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except ValueError:
        return default


def _declared_ports(g: PodGroup) -> set[int]:
    """The host ports the scheduler knows of: hostPort, or every containerPort with
    hostNetwork (the API server defaults hostPort to it)."""
    key = "containerPort" if g.spec.get("hostNetwork") else "hostPort"
    return {int(p[key]) for c in g.spec.get("containers") or [] for p in c.get("ports") or []
            if isinstance(p, dict) and isinstance(p.get(key), int)}


def _bound_ports(g: PodGroup, engines: list[Engine]) -> set[int]:
    """What the pod's engines bind on the host, with hostNetwork."""
    if not g.spec.get("hostNetwork"):
        return set()
    return {p for e in engines if e.group is g for p in _engine_ports(e)}


def _host_ports(g: PodGroup, engines: list[Engine]) -> tuple[int, ...]:
    return tuple(sorted(_declared_ports(g) | _bound_ports(g, engines)))


def _can_share(g: PodGroup, h: PodGroup, nodes: list[Node], plan: Plan) -> Node | None:
    """A node both pods may run on at once, as far as their requests and channels go."""
    if _claims_channel(g) and _claims_channel(h):
        return None
    asks = [pods.demand(g.spec), pods.demand(h.spec)]
    both = sorted(set(pods.candidates(g.spec, nodes)) & set(pods.candidates(h.spec, nodes)))
    for n in (nodes[i] for i in both):
        if pods.node_mismatch(g.selector, n, True) is None \
                and pods.node_mismatch(h.selector, n, True) is None \
                and all(sum(a.get(r, Fraction(0)) for a in asks) <= cap
                        for r, cap in n.capacity.items() if _rule_for(r, plan)):
            return n
    return None


def _claims_channel(g: PodGroup) -> bool:
    return any(rc.get("resourceClaimTemplateName") or rc.get("resourceClaimName")
               for rc in g.spec.get("resourceClaims") or [] if isinstance(rc, dict))


def undeclared_ports(ctx: Context) -> list[Finding]:
    """hostNetwork pods whose engines bind a port the pod does not declare: the scheduler may
    put two of them on one node, where the second cannot bind it."""
    out = []
    for b in ctx.bundles:
        hidden = [(g, _bound_ports(g, b.engines) - _declared_ports(g)) for g in b.groups
                  if g.pods]
        for i, (g, held) in enumerate(hidden):
            for h, theirs in hidden[i:]:
                both = sorted(held & theirs)
                if not both or (h is g and g.pods < 2):
                    continue
                node = _can_share(g, h, ctx.nodes, ctx.plan)
                if node is not None:
                    out.append(Finding(
                        "host-ports-per-node", g.obj.file, g.obj.line_at(g.path), g.where,
                        f"port{'s' if len(both) > 1 else ''} {', '.join(map(str, both))} "
                        "declared as containerPort, so that the scheduler keeps pods binding "
                        "them apart", f"undeclared, and {'two of its pods' if h is g else h.where}"
                        f" may run on {node.name} together", "declare every port the engine "
                        "binds with hostNetwork, or give each pod its own ports"))
                    break
    return out


def _family_rule(family: str, plan: Plan) -> str | None:
    kind, _, name = family.partition(":")
    if kind == "resource":
        return _rule_for(name, plan)
    return "dra-channel-per-node" if kind == "channel" else "host-ports-per-node"


def _shortfall_finding(s: placement.Shortfall, groups: list[PodGroup], nodes: list[Node],
                       rule: str) -> Finding:
    blamed = [groups[k] for k in s.keys]
    first = blamed[0] if blamed else groups[0]
    where = "; ".join(f"{g.where} ({g.pods} pods)" for g in blamed)
    on = _names(nodes[n] for n in s.nodes)
    kind, _, name = s.family.partition(":")
    if kind == "channel":
        expected = "at most one ComputeDomain channel claim per node (the DRA driver " \
                   "allocates channel 0 once per node)"
        got = f"{s.asked} channel claims for {len(s.nodes)} nodes ({on})" if s.asked >= 0 \
            else f"channel claims that no placement on {on} can hold"
        hint = "run one pod per node, or let the pods of a node share one ResourceClaim; " \
               f"{s.asked - s.offered} pods would stay Pending" if s.asked >= 0 else \
               "run one pod per node, or let the pods of a node share one ResourceClaim"
    elif kind == "port":
        expected = f"port {name} bound once per node"
        got = f"{s.asked} pods binding it on {len(s.nodes)} nodes ({on})"
        hint = "give each co-located process its own port"
    else:
        unit = "GiB" if name == pods.MEMORY else ""
        scale = Fraction(2**30) if unit else Fraction(1)
        asked = f"{float(s.asked / scale):g}{' ' + unit if unit else ''}"
        offered = f"{float(s.offered / scale):g}{' ' + unit if unit else ''}"
        expected = f"{name} requests within the nodes' capacity"
        got = f"{asked} asked on {on}, which offer {offered}" if s.asked >= 0 else \
            f"requests that no placement on {on} can hold"
        hint = "requests of every pod that may run there count, whatever the pod"
    return Finding(rule, first.obj.file, first.obj.line_at(first.path), where, expected, got,
                   hint)


def placement_rules(ctx: Context) -> list[Finding]:
    out = []
    for b in ctx.bundles:
        templates = _channel_templates(b.objs)
        demands, groups = [], []
        for g in b.groups:
            allowed = tuple(i for i in pods.candidates(g.spec, ctx.nodes)
                            if pods.node_mismatch(g.selector, ctx.nodes[i], True) is None)
            if not g.pods or not allowed:
                continue  # no pods, or selector-matches-node says why
            template, claim = _channel(g.spec, templates)
            ask = tuple(sorted((r, v) for r, v in pods.demand(g.spec).items()
                               if _rule_for(r, ctx.plan)))
            demands.append(placement.Demand(len(groups), g.pods, allowed, ask, template, claim,
                                            _host_ports(g, b.engines)))
            groups.append(g)
        if not demands:
            continue
        for s in placement.shortfalls(demands, ctx.nodes):
            rule = _family_rule(s.family, ctx.plan)
            if rule:
                out.append(_shortfall_finding(s, groups, ctx.nodes, rule))
    return out


def script_ports(ctx: Context) -> list[Finding]:
    """Launch scripts run where their tray is: two on one node must not bind one port."""
    out = []
    by_node: dict[str, list[tuple[Engine, set[int]]]] = {}
    for e in ctx.scripts:
        tray = e.file.rsplit("/", 1)[-1].removesuffix(".sh")
        node = next((t.node_name for t in ctx.plan.hardware.trays if t.id == tray), tray)
        by_node.setdefault(node, []).append((e, _engine_ports(e)))
    for node, running in sorted(by_node.items()):
        for i, (e, held) in enumerate(running):
            for other, theirs in running[:i]:
                both = sorted(held & theirs)
                if both:
                    out.append(Finding("host-ports-per-node", e.file, 1, e.file,
                                       f"ports of its own on node {node}",
                                       f"port{'s' if len(both) > 1 else ''} "
                                       f"{', '.join(map(str, both))}, also bound by {other.file}",
                                       "set --port and VLLM_NIXL_SIDE_CHANNEL_PORT apart for "
                                       "each instance on a node"))
                    break
    return out


# --- connector-env --------------------------------------------------------------------------

_UNREACHABLE = {None, "", "localhost", "127.0.0.1"}


def _set(e: Engine, name: str) -> bool:
    """The variable has a value (from valueFrom counts) that is not a loopback address."""
    return name in e.env and e.env[name] not in _UNREACHABLE - {None}


def _all_engines(ctx: Context) -> list[Engine]:
    return [e for b in ctx.bundles for e in b.engines] + ctx.scripts


def connector_env(ctx: Context) -> list[Finding]:
    out = []
    for e in _all_engines(ctx):
        config = _top_connector(e)
        names = [c.get("kv_connector") for c in e.connectors()]
        if NIXL & set(names) and not _set(e, "VLLM_NIXL_SIDE_CHANNEL_HOST"):
            filled = e.launcher == "dynamo" and config in ("NixlConnector", "PdConnector")
            operator = e.group is not None and e.group.multinode and e.launcher == "dynamo" \
                and e.group.obj.kind == "DynamoGraphDeployment"
            if not (filled or operator):
                out.append(Finding("connector-env", e.file, e.line, e.where,
                                   "VLLM_NIXL_SIDE_CHANNEL_HOST set to an address peers reach",
                                   f"no VLLM_NIXL_SIDE_CHANNEL_HOST with {config} (vLLM's "
                                   "default is localhost)",
                                   "set it from status.podIP (pods) or the node's address "
                                   "(scripts); Dynamo sets it only for a plain NixlConnector"))
        if "MooncakeStoreConnector" in names:
            path = e.env.get("MOONCAKE_CONFIG_PATH") if "MOONCAKE_CONFIG_PATH" in e.env else None
            if "MOONCAKE_CONFIG_PATH" not in e.env:
                out.append(Finding("connector-env", e.file, e.line, e.where,
                                   "MOONCAKE_CONFIG_PATH for the MooncakeStoreConnector",
                                   "no MOONCAKE_CONFIG_PATH",
                                   "vLLM's Mooncake store reads its client config from it"))
            elif e.group is not None and path and not any(
                    path.startswith(m.rstrip("/") + "/") for m in e.mounts):
                out.append(Finding("connector-env", e.file, e.line, e.where,
                                   "MOONCAKE_CONFIG_PATH inside a mounted volume",
                                   f"{path}, under no volumeMount of the container",
                                   "mount the Mooncake client ConfigMap there"))
    return out


def _top_connector(e: Engine) -> str | None:
    text = e.flag("--kv-transfer-config")
    try:
        config = json.loads(text) if text else None
    except ValueError:
        return None
    return config.get("kv_connector") if isinstance(config, dict) else None


# --- rdma-transport -------------------------------------------------------------------------

_UCX_RDMA = {"rc", "rc_x", "rc_v", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "ud", "ud_x", "ud_v",
             "ud_mlx5", "ib", "all"}


def _mooncake_protocols(files: Mapping[str, str | bytes]) -> set[str]:
    out = set()
    for path, text in files.items():
        if path.startswith("mooncake/clients/") and isinstance(text, str):
            try:
                out.add(str(json.loads(text).get("protocol")))
            except (ValueError, AttributeError):
                continue
    return out


def _rdma_devices(g: PodGroup, plan: Plan) -> bool:
    asks = pods.demand(g.spec)
    return any(_rule_for(r, plan) == "node-rdma-devices" and v > 0 for r, v in asks.items())


def _ipc_lock(g: PodGroup) -> bool:
    return any("IPC_LOCK" in (((c.get("securityContext") or {}).get("capabilities") or {})
                              .get("add") or []) or (c.get("securityContext") or {})
               .get("privileged") for c in g.spec.get("containers") or [])


def _domains(plan: Plan, role: str) -> set[str]:
    trays = {t.id: t.nvlink_domain for t in plan.hardware.trays}
    return {trays[t] for i in plan.instances if i.role == role for t in i.trays}


def rdma_transport(ctx: Context) -> list[Finding]:
    out = []
    rdma_store = "rdma" in _mooncake_protocols(ctx.files)
    split = len(_domains(ctx.plan, "prefill") | _domains(ctx.plan, "decode")) > 1
    for b in ctx.bundles:
        for e in b.engines:
            g = e.group
            names = [c.get("kv_connector") for c in e.connectors()]
            if g is not None and rdma_store and "MooncakeStoreConnector" in names:
                missing = [what for what, ok in (("RDMA device request", _rdma_devices(
                    g, ctx.plan)), ("IPC_LOCK capability", _ipc_lock(g))) if not ok]
                if missing:
                    out.append(Finding("rdma-transport", e.file, e.line, e.where,
                                       "an RDMA device and IPC_LOCK in a pod whose Mooncake "
                                       "client uses protocol rdma", "no " + " and no ".join(
                                           missing), "Mooncake registers host memory with "
                                       "the RDMA NIC; without both the transfer engine fails"))
    for e in _all_engines(ctx):
        names = [c.get("kv_connector") for c in e.connectors()]
        tls = e.env.get("UCX_TLS")
        if split and NIXL & set(names) and tls and not \
                {t.strip() for t in tls.split(",")} & _UCX_RDMA:
            out.append(Finding("rdma-transport", e.file, e.line, e.where,
                               "an RDMA transport in UCX_TLS for KV between NVLink domains",
                               f"UCX_TLS={tls}", "without rc/dc/ud UCX sends the KV cache "
                               "over TCP"))
    return out


# --- engine-capability ----------------------------------------------------------------------

def _facts_of(plan: Plan, e: Engine) -> EngineFacts:
    """What the release running engine `e` can do, as the plan recorded it: a Dynamo worker
    runs the vLLM its Dynamo imports (site.engines.dynamo), a script or LWS pod the plan's."""
    return plan.site.engines["dynamo" if e.launcher == "dynamo" else "vllm"].facts


def engine_capability(ctx: Context) -> list[Finding]:
    out = [f for e in _all_engines(ctx) for f in _engine_kernels(e, ctx.plan)]
    for engines in [b.engines for b in ctx.bundles] + [ctx.scripts]:
        out += _pipelined_peers_push(engines, ctx.plan)
    for b in ctx.bundles:
        out += _frontend_block_size(b, ctx.plan)
    return out


def _engine_kernels(e: Engine, plan: Plan) -> list[Finding]:
    """One engine's flags against its release's kernels: the attention kernel's block size,
    a --moe-backend that loads the experts (with a kernel for the all-to-all's batched
    layout), and the all-to-all's environment across trays."""
    out = []
    facts, moe_model = _facts_of(plan, e), plan.model.moe
    block = _int(e.flag("--block-size"), 0)
    backend = e.flag("--attention-backend")
    sizes = facts.kernel_block_sizes.get(backend) if backend else None
    if sizes and block and not any(block % s == 0 for s in sizes.value):
        out.append(Finding("engine-capability", e.file, e.line, e.where,
                           f"--block-size a multiple of {backend}'s kernel block "
                           f"size{'s' if len(sizes.value) > 1 else ''} {sizes.value}",
                           f"--block-size {block}", "the attention kernels read KV in "
                           f"pages of their block size ({sizes.source})"))
    moe = e.flag("--moe-backend")
    fmt = plan.model.expert_format
    if moe and moe_model and facts.moe_backends and moe not in facts.moe_backends.value:
        out.append(Finding("engine-capability", e.file, e.line, e.where,
                           f"a --moe-backend that loads {fmt} experts "
                           f"({', '.join(facts.moe_backends.value)})",
                           f"--moe-backend {moe}", facts.moe_backends.source))
    a2a = e.flag("--all2all-backend")
    if moe and a2a and moe_model and a2a in facts.batched_layout.value and \
            facts.moe_batched and moe not in facts.moe_batched.value:
        out.append(Finding("engine-capability", e.file, e.line, e.where,
                           f"a --moe-backend with a kernel for {a2a}'s batched "
                           f"activations ({', '.join(facts.moe_batched.value)})",
                           f"--moe-backend {moe}", facts.moe_batched.source))
    out += _raised_block(e, plan, facts)
    need = facts.multi_node_nvlink_env.get(a2a) if a2a else None
    if need and _on_nvl72(e, plan) and \
            _spans_trays(e, plan):  # across HGX nodes the EP group is on RDMA
        out += [Finding("engine-capability", e.file, e.line, e.where,
                        f"{key}={value} for {a2a} across trays", f"{key}={e.env.get(key)}",
                        need.source)
                for key, value in need.value.items() if e.env.get(key) != value]
    return out


def _raised_block(e: Engine, plan: Plan, facts: EngineFacts) -> list[Finding]:
    """A hybrid model's engine given a block its release raises runs (and publishes KV events
    in) another block than the plan's router hashes in."""
    block, runs = _int(e.flag("--block-size"), 0), _block_run(e, plan)
    if runs == block or facts.hybrid_block is None:
        return []
    tp = _int(e.flag("--tensor-parallel-size"), 1)
    return [Finding("engine-capability", e.file, e.line, e.where,
                    f"--block-size {runs}, the block vLLM raises it to at TP{tp}",
                    f"--block-size {block}", "one KV block's attention page must hold a "
                    "request's linear-attention state of a layer on each rank "
                    f"({facts.hybrid_block.source})")]


def _block_run(e: Engine, plan: Plan) -> int:
    """The KV block engine `e` runs: its --block-size (0: none), or the larger one its release
    raises a hybrid model's to at its TP."""
    block, hybrid = _int(e.flag("--block-size"), 0), _facts_of(plan, e).hybrid_block
    if not (block and hybrid):
        return block
    return engine_choices.hybrid_block(hybrid, _int(e.flag("--tensor-parallel-size"), 1), block)


def _frontend_block_size(b: Bundle, plan: Plan) -> list[Finding]:
    """A Dynamo frontend hashes prompts in blocks of its --kv-cache-block-size, which must be
    the one block the workers run (and publish KV events in)."""
    out = []
    worker_blocks = {_block_run(e, plan) for e in b.engines} - {0}
    for g in b.groups:
        for c in g.spec.get("containers") or []:
            words = [str(w) for w in (c.get("command") or []) + (c.get("args") or [])]
            if "dynamo.frontend" in words and worker_blocks:
                given = _int(_after(words, "--kv-cache-block-size"), 0)
                if given not in worker_blocks or len(worker_blocks) > 1:
                    out.append(Finding("engine-capability", g.obj.file,
                                       g.obj.line_at(g.path), g.where,
                                       "--kv-cache-block-size equal to the block the "
                                       f"workers run {sorted(worker_blocks)}",
                                       f"--kv-cache-block-size {given or 'unset (16)'}",
                                       "the router hashes prompts in blocks of this size "
                                       "to match the workers' KV events"))
    return out


def dynamo_connector(ctx: Context) -> list[Finding]:
    """Dynamo P/D workers hand KV off through a connector its prefill handler has a protocol
    for (site.engines.dynamo.facts.pd_connectors, from dynamo/vllm/kv_connector_protocols.py)."""
    run = ctx.plan.site.engines["dynamo"]
    protocols, wrappers = run.facts.pd_connectors, run.facts.connector_wrappers
    out = []
    for e in _all_engines(ctx):
        if e.launcher != "dynamo" or protocols is None or \
                e.flag("--disaggregation-mode") not in ("prefill", "decode"):
            continue
        top = _top_connector(e)
        names = {c.get("kv_connector") for c in e.connectors()}
        pd = names - {top} if wrappers and top in wrappers.value else {top}
        if not pd & set(protocols.value):
            out.append(Finding("dynamo-connector", e.file, e.line, e.where,
                               f"a P/D connector Dynamo {run.dynamo} has a protocol "
                               f"for ({', '.join(protocols.value)})",
                               ", ".join(sorted(str(n) for n in pd)),
                               "its prefill handler raises ValueError on every request "
                               f"({protocols.source.split(' (')[0]})"))
    return out


def graph_components(ctx: Context) -> list[Finding]:
    """A DynamoGraphDeployment holds at most the components its CRD admits
    (site.engines.dynamo.facts.graph_components): a longer list is refused at `kubectl apply`,
    and nothing of the graph deploys."""
    most = ctx.plan.site.engines["dynamo"].facts.graph_components
    out = []
    for b in ctx.bundles:
        for obj in b.objs:
            if most is None or obj.doc.get("kind") != "DynamoGraphDeployment":
                continue
            components = (obj.doc.get("spec") or {}).get("components") or []
            if len(components) > most.value:
                name = (obj.doc.get("metadata") or {}).get("name")
                out.append(Finding("graph-components", obj.file, obj.line_at("spec.components"),
                                   f"DynamoGraphDeployment/{name} spec.components",
                                   f"at most {most.value} components ({most.source})",
                                   f"{len(components)}",
                                   "one component is one instance; a routing group of more "
                                   "is dealt into graphs only where every part can hold each "
                                   "role it serves, by whole NVLink domains or by tray "
                                   "(compiler/routes.py): serve fewer, larger instances (a "
                                   "role with fewer instances, or trays, than the parts "
                                   "needed leaves the group whole)"))
    return out


def _pipelined_peers_push(engines: list[Engine], plan: Plan) -> list[Finding]:
    """Where a P/D engine of one bundle has pipeline stages, every NIXL engine there pushes
    (the connector of the release running it)."""
    def nixl(e: Engine) -> set[str]:
        return {c.get("kv_connector") for c in e.connectors()} & NIXL

    if not any(_int(e.flag("--pipeline-parallel-size"), 1) > 1 and nixl(e)
                for e in engines):
        return []
    out = []
    for e in engines:
        push = _facts_of(plan, e).pipelined_connector
        if nixl(e) and nixl(e) != {push.value}:
            out.append(Finding("engine-capability", e.file, e.line, e.where,
                               f"{push.value} beside a prefill with pipeline stages",
                               ", ".join(sorted(nixl(e))), push.source))
    return out


def _after(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def _on_nvl72(e: Engine, plan: Plan) -> bool:
    """The engine runs on NVL72 trays: in a mixed fleet, those of the group its launch script's
    tray or its pods' pinned nodes belong to (any NVL72 group when they name none)."""
    forms = {hw.form for hw in plan.fleet}
    if len(forms) > 1:
        trays = {t.node_name: t.id for t in plan.hardware.trays}
        if e.group is None:
            names = [e.file.rsplit("/", 1)[-1].removesuffix(".sh")]
        else:
            terms = (((e.group.spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
                "requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                "nodeSelectorTerms") or []
            names = [trays.get(str(v)) for term in terms
                     for m in (term.get("matchFields") or []) + (term.get("matchExpressions") or [])
                     for v in m.get("values") or []]
        forms = {plan.hardware_of(t).form for t in names if t in set(trays.values())} or forms
    return "nvl72" in forms


def _spans_trays(e: Engine, plan: Plan) -> bool:
    """The engine's DP group spans trays: more DP ranks than run in this process or pod."""
    dp = _int(e.flag("--data-parallel-size"), 1)
    return dp > _local_ranks(e) if e.group is None else \
        (e.group.multinode or dp > _int(pods.demand(e.group.spec).get(pods.GPU, 0), 0) > 0)


# --- the registry ---------------------------------------------------------------------------

RULES: dict[str, str] = {  # rule -> diagnostic code
    "selector-matches-node": "E821",
    "dra-channel-per-node": "E822",
    "node-gpus": "E823",
    "node-rdma-devices": "E824",
    "node-memory": "E826",
    "host-ports-per-node": "E827",
    "connector-env": "E828",
    "rdma-transport": "E829",
    "engine-capability": "E830",
    "cpu-pods-off-trays": "E831",
    "capabilities-effective": "E832",
    "host-path-writable": "E833",
    "pod-security": "E834",
    "service-names": "E835",
    "cpu-pods-arch": "E836",
    "dynamo-connector": "E837",
    "per-instance-placement": "E838",
    "engine-matches-plan": "E839",
    "pool-matches-plan": "E840",
    "pd-within-group": "E841",
    "graph-components": "E842",
}
_PLACEMENT = frozenset({"dra-channel-per-node", "node-gpus", "node-rdma-devices", "node-memory",
                        "host-ports-per-node"})
# Each check and the rules it can break: only those a caller asks for are run.
CHECKS: tuple[tuple[Callable[[Context], list[Finding]], frozenset[str]], ...] = (
    (selector_matches_node, frozenset({"selector-matches-node"})),
    (cpu_pods_off_trays, frozenset({"cpu-pods-off-trays"})),
    (placement_rules, _PLACEMENT),
    (script_ports, frozenset({"host-ports-per-node"})),
    (undeclared_ports, frozenset({"host-ports-per-node"})),
    (connector_env, frozenset({"connector-env"})),
    (rdma_transport, frozenset({"rdma-transport"})),
    (engine_capability, frozenset({"engine-capability"})),
    (workloads.capabilities_effective, frozenset({"capabilities-effective"})),
    (workloads.host_path_writable, frozenset({"host-path-writable"})),
    (workloads.pod_security, frozenset({"pod-security"})),
    (workloads.service_names, frozenset({"service-names"})),
    (workloads.cpu_pods_arch, frozenset({"cpu-pods-arch"})),
    (dynamo_connector, frozenset({"dynamo-connector"})),
    (graph_components, frozenset({"graph-components"})),
    (workloads.per_instance_placement, frozenset({"per-instance-placement"})),
    (workloads.pd_within_group, frozenset({"pd-within-group"})),
    (engine_plan.engine_matches_plan, frozenset({"engine-matches-plan"})),
    (pool_plan.pool_matches_plan, frozenset({"pool-matches-plan"})),
)
# The rules `rackc compile` enforces on what it emits (exit 3, nothing written). A rule joins
# when the targets no longer break it on the examples (tests/validate/test_examples.py).
ENFORCED: frozenset[str] = frozenset(RULES)  # compile refuses a bundle that breaks any


def findings(plan: Plan, files: Mapping[str, str | bytes],
             only: Iterable[str] | None = None) -> list[Finding]:
    """Every broken rule of `only` (default: all), each checker run once, in a stable order."""
    wanted = set(RULES if only is None else only)
    return findings_in(context(plan, files), wanted) if wanted else []


def findings_in(ctx: Context, only: Iterable[str] | None = None) -> list[Finding]:
    """`findings` of a context already read (`rackc validate` also lists its resources)."""
    wanted = set(RULES if only is None else only)
    out = [f for check_, breaks in CHECKS if breaks & wanted for f in check_(ctx)
           if f.rule in wanted]
    return sorted(set(out), key=lambda f: (f.file, f.line, f.rule, f.where, f.got))


def unchecked_resources(ctx: Context) -> list[str]:
    """Resources pods request whose node capacity the plan does not tell (CPU cores, a
    device plugin rackc does not know): no rule checks their sums."""
    known = {r for n in ctx.nodes for r in n.capacity}
    return sorted({r for b in ctx.bundles for g in b.groups if g.pods
                   for r, v in pods.demand(g.spec).items() if v > 0 and r not in known})


def diagnostic(f: Finding) -> Diagnostic:
    return Diagnostic("error", RULES[f.rule], f.file, f.line, 1, f"[{f.rule}] {f.where}",
                      f.expected, f.got, f.hint)


def check(plan: Plan, files: Mapping[str, str | bytes],
          only: Iterable[str] | None = None) -> list[Diagnostic]:
    return [diagnostic(f) for f in findings(plan, files, only)]
