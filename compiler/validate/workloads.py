"""Rules on what the controllers, the kubelet and the kernel do with a pod's objects, beyond where
it fits. Pure, as compiler.validate.rules (which registers them):

- service-names: the LeaderWorkerSet controller creates its pods' headless Service, named like the
  LWS (the pods' subdomain), only when no Service has that name (kubernetes-sigs/lws
  pkg/utils/controller/controller_utils.go CreateHeadlessServiceIfNotExists, called with
  lws.Name in pkg/controllers/leaderworkerset_controller.go; per-replica Services are named
  `<lws>-<group>` in pod_controller.go). A Service of either name leaves LWS_LEADER_ADDRESS
  (`<lws>-<group>.<lws>.<ns>`, pkg/utils/pod/pod_utils.go) without a DNS record.
- capabilities-effective: `capabilities.add` fills the bounding set only; a process of a
  non-root user starts with no effective capability (kubernetes/kubernetes#56374), so a
  container that adds one runs as UID 0, said in the object (an image's user is not in it).
- host-path-writable: the kubelet creates a hostPath `DirectoryOrCreate` as root with mode 0755
  (kubernetes.io, Volumes, hostPath); a container mounting it read-write must run as UID 0 to
  write there (fsGroup does not apply to hostPath).
- pod-security: Pod Security admission (kubernetes/pod-security-admission policy/) rejects a pod
  above the namespace's `pod-security.kubernetes.io/enforce` level; pods without GPUs need no
  privilege and meet restricted; a pod that calls no API server (no service account of its own)
  mounts no token.
- per-instance-placement: the plan places each instance on its own trays (what the report,
  the Engram shard map and `compile --from` rely on); replicas of one pod template share one
  node affinity, over which the scheduler (Grove, LWS) spreads them in any order. So every
  engine workload is one instance (one replica) whose affinity names exactly its trays.
- pd-within-group: the plan's routers (`Plan.routes`: its routing groups, compiler.routes, or a
  mixed fleet's groups) are priced each with its own prefill and decode instances (an NVLink
  domain's hand-offs on NVLink, the shared group's over the NICs; a mixed fleet's groups are
  solved apart), so every prefill/decode pair stays in one group. A
  Dynamo frontend pairs any prefill and decode worker of its graph (the operator gives each
  DynamoGraphDeployment its own Dynamo namespace: deploy/operator/internal/dynamo/graph.go
  GetDynamoNamespace), and a vllm-router any leader its prefill and decode selectors discover
  (vllm-project/router docs/environment/kubernetes.md): the workers of one graph, and the
  leaders one router selects, run on the nodes of one group (fresh review 3, S3-10).
- cpu-pods-arch: pods without GPUs require the `kubernetes.io/arch` the plan gives them
  (`site.cpu_arch`), or none: on NVL72 the only arm64 nodes may be the trays they keep off.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from compiler.validate import pods
from compiler.validate.finding import Finding
from compiler.validate.pods import PodGroup

if TYPE_CHECKING:
    from compiler.validate.rules import Bundle, Context

LEVELS = ("restricted", "baseline", "privileged")
ENFORCE = "pod-security.kubernetes.io/enforce"
ARCH = "kubernetes.io/arch"
# policy/check_capabilities_baseline.go: what baseline lets a container add.
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
# policy/check_restrictedVolumes.go: the volume sources restricted allows.
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                "persistentVolumeClaim", "projected", "secret"})
_VOLUME_META = frozenset({"name"})


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from (c for c in spec.get(key) or [] if isinstance(c, dict))


def _sc(container: dict[str, Any]) -> dict[str, Any]:
    return container.get("securityContext") or {}


def run_as_user(spec: dict[str, Any], container: dict[str, Any]) -> int | None:
    """The UID the object sets for a container (its own, else the pod's); None: the image's."""
    user = _sc(container).get("runAsUser", (spec.get("securityContext") or {}).get("runAsUser"))
    return user if isinstance(user, int) else None


def _baseline_breaks(spec: dict[str, Any]) -> list[str]:
    out = [f"{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"hostPath volume {v.get('name')}" for v in spec.get("volumes") or []
            if isinstance(v, dict) and "hostPath" in v]
    pod_seccomp = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        out.append("seccompProfile Unconfined")
    for c in _containers(spec):
        sc = _sc(c)
        if sc.get("privileged"):
            out.append(f"{c.get('name')}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
        if added:
            out.append(f"{c.get('name')}: capabilities.add {sorted(added)}")
        if any(isinstance(p, dict) and p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{c.get('name')}: hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c.get('name')}: seccompProfile Unconfined")
    return out


def _restricted_breaks(spec: dict[str, Any]) -> list[str]:
    out = []
    for v in spec.get("volumes") or []:
        kinds = set(v) - _VOLUME_META if isinstance(v, dict) else set()
        if kinds - RESTRICTED_VOLUMES:
            out.append(f"volume {v.get('name')}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    pod = spec.get("securityContext") or {}
    for c in _containers(spec):
        sc, name = _sc(c), c.get("name")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot not true")
        if run_as_user(spec, c) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp or 'unset'}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities.drop without ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities.add {sorted(caps.get('add'))}")
    return out


def level(spec: dict[str, Any]) -> tuple[str, list[str]]:
    """The least Pod Security Standards level that admits the pod, and what keeps it from the
    next stricter one."""
    if breaks := _baseline_breaks(spec):
        return "privileged", breaks
    if breaks := _restricted_breaks(spec):
        return "baseline", breaks
    return "restricted", []


def _finding(rule: str, g: PodGroup, expected: str, got: str, hint: str) -> Finding:
    return Finding(rule, g.obj.file, g.obj.line_at(g.path), g.where, expected, got, hint)


def _cpu_only(g: PodGroup) -> bool:
    return pods.demand(g.spec).get(pods.GPU, 0) == 0


def service_names(ctx: "Context") -> list[Finding]:
    out = []
    for b in ctx.bundles:
        sets = {o.name for o in b.objs if o.kind == "LeaderWorkerSet"}
        for o in b.objs:
            if o.kind != "Service":
                continue
            head, _, tail = o.name.rpartition("-")
            clash = o.name if o.name in sets else head if tail.isdigit() and head in sets \
                else None
            if clash:
                out.append(Finding(
                    "service-names", o.file, o.line, f"{o.label} metadata.name",
                    f"a name the LeaderWorkerSet {clash} does not give its headless Service",
                    o.name, "the LWS controller then creates no headless Service and "
                    "LWS_LEADER_ADDRESS does not resolve: name the client Service <lws>-http"))
    return out


def capabilities_effective(ctx: "Context") -> list[Finding]:
    out = []
    for b in ctx.bundles:
        for g in b.groups:
            for c in _containers(g.spec):
                added = (_sc(c).get("capabilities") or {}).get("add") or []
                user = run_as_user(g.spec, c)
                if added and not _sc(c).get("privileged") and user != 0:
                    out.append(_finding(
                        "capabilities-effective", g, f"runAsUser: 0 for {c.get('name')}, "
                        f"which adds {sorted(added)}",
                        f"runAsUser {user if user is not None else 'unset (the image user)'}",
                        "a non-root process gets no effective capability from "
                        "capabilities.add (IPC_LOCK then does not lift RLIMIT_MEMLOCK)"))
    return out


def host_path_writable(ctx: "Context") -> list[Finding]:
    out = []
    for b in ctx.bundles:
        for g in b.groups:
            created = {v.get("name") for v in g.spec.get("volumes") or []
                       if isinstance(v, dict) and (v.get("hostPath") or {}).get("type")
                       == "DirectoryOrCreate"}
            for c in _containers(g.spec):
                mounts = [m for m in c.get("volumeMounts") or []
                          if m.get("name") in created and not m.get("readOnly")]
                user = run_as_user(g.spec, c)
                for m in mounts if user != 0 else []:
                    out.append(_finding(
                        "host-path-writable", g, f"runAsUser: 0 for {c.get('name')}, which "
                        f"writes hostPath {m.get('name')} at {m.get('mountPath')}",
                        f"runAsUser {user if user is not None else 'unset (the image user)'}",
                        "the kubelet creates a DirectoryOrCreate hostPath as root, mode 0755"))
    return out


def _enforced(b: "Bundle") -> str:
    for o in b.objs:
        if o.kind == "Namespace":
            value = ((o.doc.get("metadata") or {}).get("labels") or {}).get(ENFORCE)
            return value if value in LEVELS else "privileged"
    return "privileged"


def pod_security(ctx: "Context") -> list[Finding]:
    out = []
    for b in ctx.bundles:
        enforced = _enforced(b)
        for g in b.groups:
            got, breaks = level(g.spec)
            if LEVELS.index(got) > LEVELS.index(enforced):
                out.append(_finding(
                    "pod-security", g, f"a pod the namespace's {ENFORCE}={enforced} admits",
                    f"{got}: " + "; ".join(_baseline_breaks(g.spec) or breaks),
                    "Pod Security admission rejects it: raise the namespace's level or drop "
                    "the privilege"))
            if _cpu_only(g) and got != "restricted":
                out.append(_finding(
                    "pod-security", g, "a pod without GPUs at restricted (it needs no "
                    "privilege)", f"{got}: " + "; ".join(breaks),
                    "run it non-root, drop ALL capabilities, no privilege escalation, "
                    "seccomp RuntimeDefault, no hostPath"))
            if g.obj.kind == "DynamoGraphDeployment":
                if g.spec.get("automountServiceAccountToken") is False:
                    out.append(_finding(
                        "pod-security", g, "the service-account token mounted (the operator "
                        "sets DYN_DISCOVERY_BACKEND=kubernetes: the runtime's KubeClient reads "
                        "it, deploy/operator/internal/dynamo/component_common.go)",
                        "automountServiceAccountToken: false",
                        "leave the token to the operator's discovery service account"))
            elif g.spec.get("automountServiceAccountToken") is not False and \
                    g.spec.get("serviceAccountName") in (None, "default"):
                out.append(_finding(
                    "pod-security", g, "automountServiceAccountToken: false (the pod calls no "
                    "API server)", "the default service account's token mounted",
                    "set automountServiceAccountToken: false"))
    return out


def _replicas(g: PodGroup) -> int:
    doc = g.obj.doc.get("spec") or {}
    if g.obj.kind == "DynamoGraphDeployment":
        index = int(g.path.split("[", 1)[1].split("]", 1)[0])
        return int((doc.get("components") or [])[index].get("replicas", 1))
    return int(doc.get("replicas", 1))


def _pinned_nodes(spec: dict[str, Any]) -> set[str]:
    """The node names a pod's required affinity admits (metadata.name or hostname In)."""
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    return {str(v) for term in terms
            for m in (term.get("matchFields") or []) + (term.get("matchExpressions") or [])
            if m.get("operator") == "In" and m.get("key") in ("metadata.name",
                                                               "kubernetes.io/hostname")
            for v in m.get("values") or []}


def per_instance_placement(ctx: "Context") -> list[Finding]:
    node = {t.id: t.node_name for t in ctx.plan.hardware.trays}
    trays = {frozenset(node[t] for t in i.trays): i.id for i in ctx.plan.instances}
    out = []
    for b in ctx.bundles:
        for g in b.groups:
            if not g.pods or _cpu_only(g) or g.obj.kind not in ("DynamoGraphDeployment",
                                                                "LeaderWorkerSet"):
                continue
            pinned, replicas = frozenset(_pinned_nodes(g.spec)), _replicas(g)
            if replicas > 1 or pinned not in trays:
                out.append(_finding(
                    "per-instance-placement", g, "one instance: one replica pinned to the "
                    "trays plan.yaml gives it", f"{replicas} replicas over "
                    f"{len(pinned)} nodes ({', '.join(sorted(pinned)[:4])}"
                    f"{', ...' if len(pinned) > 4 else ''}), the trays of no one instance"
                    if pinned not in trays else f"{replicas} replicas of {trays[pinned]}",
                    "the scheduler places replicas of one template in any order over its "
                    "nodes: emit a workload per instance"))
    return out


def _arch_requirements(spec: dict[str, Any]) -> set[str]:
    """The architectures a pod's selector and required affinity name (all must hold)."""
    out = set()
    if ARCH in (spec.get("nodeSelector") or {}):
        out.add(str(spec["nodeSelector"][ARCH]))
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for m in term.get("matchExpressions") or []:
            if m.get("key") == ARCH and m.get("operator") == "In":
                out.update(str(v) for v in m.get("values") or [])
    return out


def cpu_pods_arch(ctx: "Context") -> list[Finding]:
    out = []
    want = ctx.plan.site.cpu_arch
    for b in ctx.bundles:
        for g in b.groups:
            if not (g.pods and _cpu_only(g)):
                continue
            arches = _arch_requirements(g.spec)
            if arches and arches != {want}:
                out.append(_finding(
                    "cpu-pods-arch", g, f"kubernetes.io/arch {want}" if want else
                    "no kubernetes.io/arch requirement (site.scheduling.cpu_arch unset)",
                    f"kubernetes.io/arch {', '.join(sorted(arches))}",
                    "pods without GPUs keep off the trays; forcing the rack's arch too leaves "
                    "them Pending where the trays are the only nodes of it"))
    return out


def _selector_after(words: list[str], flag: str) -> dict[str, str]:
    """The `key=value` words after `flag` up to the next option (vllm-router's selectors)."""
    if flag not in words:
        return {}
    out = {}
    for word in words[words.index(flag) + 1:]:
        if word.startswith("--") or "=" not in word:
            break
        key, value = word.split("=", 1)
        out[key] = value
    return out


def _leaders(b: "Bundle") -> list[tuple[dict[str, Any], set[str]]]:
    """(pod labels, pinned nodes) of each LeaderWorkerSet's leader pods."""
    out = []
    for o in b.objs:
        if o.kind != "LeaderWorkerSet":
            continue
        lwt = ((o.doc.get("spec") or {}).get("leaderWorkerTemplate") or {})
        template = lwt.get("leaderTemplate") or lwt.get("workerTemplate") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        out.append((labels, _pinned_nodes(template.get("spec") or {})))
    return out


def pd_within_group(ctx: "Context") -> list[Finding]:
    plan = ctx.plan
    if not plan.routes:
        return []
    group_of = {t.node_name: plan.route_of_tray(t) for t in plan.hardware.trays}
    out = []

    def groups(nodes: set[str]) -> set[str]:
        return {group_of[n] for n in nodes if n in group_of}

    for b in ctx.bundles:
        graphs: dict[Any, set[str]] = {}
        for g in b.groups:
            if g.obj.kind == "DynamoGraphDeployment" and g.pods and not _cpu_only(g):
                graphs.setdefault(g.obj, set()).update(groups(_pinned_nodes(g.spec)))
        for obj, found in graphs.items():
            if len(found) > 1:
                out.append(Finding("pd-within-group", obj.file, obj.line, obj.label,
                                   "the workers of one routing group per graph",
                                   f"workers on groups {', '.join(sorted(found))}",
                                   "its frontend pairs any prefill with any decode worker of "
                                   "the graph, across groups that were priced apart"))
        leaders = _leaders(b)
        for g in b.groups:
            for c in g.spec.get("containers") or []:
                words = [str(w) for w in (c.get("command") or []) + (c.get("args") or [])]
                if "vllm-router" not in words:
                    continue
                found = set()
                for flag in ("--prefill-selector", "--decode-selector"):
                    want = _selector_after(words, flag)
                    for labels, nodes in leaders:
                        if want and all(labels.get(k) == v for k, v in want.items()):
                            found |= groups(nodes)
                if len(found) > 1:
                    out.append(_finding(
                        "pd-within-group", g, "prefill and decode leaders of one routing group",
                        f"selectors matching leaders of groups {', '.join(sorted(found))}",
                        "the router pairs any prefill with any decode leader it discovers, "
                        "across groups that were priced apart"))
    return out
