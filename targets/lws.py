"""lws: for clusters without Dynamo, each component as a LeaderWorkerSet of plain `vllm serve`
engines (one group per instance, one pod per tray), in a kustomize bundle `lws/` with the same
Namespace, Mooncake and ComputeDomain objects as the k8s target, a Service per component in
front of its leaders, and for a P/D plan a vllm-router (when the site names its image) that
sends each request to a prefill engine and then a decode engine.

LWS tells each pod its leader and index (`LWS_LEADER_ADDRESS`, `LWS_WORKER_INDEX`). The leader's
arguments use Kubernetes' `$(VAR)` expansion; a worker of a data-parallel instance needs its start
rank, `index x GPUs per node`, so its command is a shell that does the arithmetic. The leaders
serve the OpenAI API on compiler.ports.ENGINE_API and carry startup/readiness/liveness probes on
vLLM's /health;
headless workers run no HTTP server, so they have none (as Dynamo's operator does).
"""

import math

from kubernetes.client import (
    RbacV1Subject,
    V1Container,
    V1ContainerPort,
    V1Deployment,
    V1DeploymentSpec,
    V1HTTPGetAction,
    V1LabelSelector,
    V1ObjectMeta,
    V1PodSpec,
    V1PodTemplateSpec,
    V1PolicyRule,
    V1Probe,
    V1Role,
    V1RoleBinding,
    V1RoleRef,
    V1Service,
    V1ServiceAccount,
    V1ServicePort,
    V1ServiceSpec,
)

from compiler import ports
from compiler.names import dns_label, leader_worker_set_name, router_name
from compiler.plan import Plan
from targets import _kube
from targets._bundle import bundle
from targets._components import Component, by_group, components
from targets._engine import engine_args, engine_env, multinode_flags, parser_flags
from targets._shell import exec_command

LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"  # Kubernetes expansion in the leader's args
WORKER_LEADER_ADDRESS = "${LWS_LEADER_ADDRESS}"  # shell expansion in a worker's script
WORKER_INDEX = "${LWS_WORKER_INDEX}"
PROBE_PERIOD_S = 10
# assumed: after the engine core is ready, the API server loads the tokenizer and binds; the
# startup probe waits this long past VLLM_ENGINE_READY_TIMEOUT_S, so the engine's own timeout
# (with its message) ends a start that is too slow, not the kubelet.
STARTUP_MARGIN_S = 600
# LWS labels every pod with its group and index; index 0 is the leader (LWS docs).
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
API_ROLE_LABEL = "rackc.dev/serves"  # on pods that serve the API: their role
GROUP_LABEL = "rackc.dev/group"  # and their router's group, where there are several


def _engine_command(plan: Plan) -> list[str]:
    return ["vllm", "serve", plan.model.hf_id]


def leader_args(plan: Plan, component: Component) -> list[str]:
    return [*engine_args(plan, component, "vllm"), "--port", str(ports.ENGINE_API),
            *parser_flags(plan),
            *multinode_flags(component, node_rank="0", start_rank="0", leader=LEADER_ADDRESS,
                             leader_node=True)]


def worker_script(plan: Plan, component: Component) -> str:
    """`sh -c` script of the pods at LWS_WORKER_INDEX 1..size-1; expressions stay unquoted."""
    start_rank = f"$((LWS_WORKER_INDEX * {component.gpus_per_node}))"
    expressions = {WORKER_LEADER_ADDRESS, WORKER_INDEX, start_rank}
    flags = multinode_flags(component, node_rank=WORKER_INDEX, start_rank=start_rank,
                            leader=WORKER_LEADER_ADDRESS, leader_node=False)
    return exec_command(_engine_command(plan),
                        [*engine_args(plan, component, "vllm"), *parser_flags(plan), *flags],
                        expressions)


def _probes(plan: Plan) -> dict[str, V1Probe]:
    """vLLM's /health answers once the engine is up: the startup probe waits as long as the
    engine itself may take to become ready (VLLM_ENGINE_READY_TIMEOUT_S, a cold start)."""
    health = V1HTTPGetAction(path="/health", port="http")
    startup = math.ceil((plan.site.model_cache.engine_ready_timeout_s + STARTUP_MARGIN_S)
                        / PROBE_PERIOD_S)
    return {"startup_probe": V1Probe(http_get=health, period_seconds=PROBE_PERIOD_S,
                                     failure_threshold=startup),
            "readiness_probe": V1Probe(http_get=health, period_seconds=PROBE_PERIOD_S),
            "liveness_probe": V1Probe(http_get=health, period_seconds=30, failure_threshold=3)}


def _pod(plan: Plan, component: Component, command: list[str], args: list[str],
         leader: bool) -> dict:
    shm = _kube.component_resources(plan, component).shm_gib
    shm_volume, shm_mount = _kube.shared_memory_volume(shm)
    env = [*_kube.env_vars(engine_env(plan, component, "vllm")),
           _kube.field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP")]
    container = _kube.engine_container(plan, component, plan.site.images.vllm, command, args,
                                       env, [shm_mount])
    if leader:
        container.ports = [V1ContainerPort(name="http", container_port=ports.ENGINE_API)]
        for name, probe in _probes(plan).items():
            setattr(container, name, probe)
    spec = _kube.engine_pod_spec(plan, component, container, [shm_volume])
    labels = _kube.labels(plan, component.name)
    if leader:
        labels[API_ROLE_LABEL] = component.role
        if plan.routes is not None:
            labels[GROUP_LABEL] = plan.route_of(component.instances[0]) or ""
    return _kube.pod_template(spec, labels_=labels)


def lws_name(plan: Plan, component: Component) -> str:
    return leader_worker_set_name(plan.serving.name, component.name)


def leader_worker_set(plan: Plan, component: Component) -> dict:
    size = component.nodes_per_instance
    leader = _pod(plan, component, _engine_command(plan), leader_args(plan, component), True)
    template: dict = {"size": size}
    if size == 1:
        template["workerTemplate"] = leader
    else:
        template["leaderTemplate"] = leader
        template["workerTemplate"] = _pod(plan, component, ["/bin/sh", "-c"],
                                          [worker_script(plan, component)], False)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _kube.to_dict(_kube.metadata(plan, lws_name(plan, component),
                                                 component.name)),
        "spec": {"replicas": len(component.instances), "leaderWorkerTemplate": template},
    }


def leader_service_name(plan: Plan, component: Component) -> str:
    """Not the LeaderWorkerSet's own name: the LWS controller makes its pods' headless Service
    under that name only when no Service has it (lws pkg/utils/controller/controller_utils.go
    CreateHeadlessServiceIfNotExists), and without that Service LWS_LEADER_ADDRESS never
    resolves. `-http` cannot be a group index either (pod_controller.go names per-replica
    headless Services `<lws>-<group>`)."""
    return dns_label(plan.serving.name, component.name, "http")


def leader_service(plan: Plan, component: Component) -> dict:
    """The OpenAI API of a component's leaders (every instance's rank 0)."""
    return _kube.to_dict(V1Service(
        api_version="v1", kind="Service",
        metadata=_kube.metadata(plan, leader_service_name(plan, component), component.name),
        spec=V1ServiceSpec(selector={LWS_NAME_LABEL: lws_name(plan, component),
                                     LWS_INDEX_LABEL: "0"},
                           ports=[V1ServicePort(name="http", port=ports.ENGINE_API,
                                                target_port="http")])))


def router_objects(plan: Plan, comps: tuple[Component, ...]) -> list[dict]:
    """vllm-router in P/D mode with Kubernetes discovery of the prefill and decode leaders
    (vllm-project/router docs/environment/kubernetes.md), its ServiceAccount, the Role that
    lets it watch pods, and its Service. Only with `site.images.router`. One per router of the
    plan (`Plan.routes`: its routing groups, a mixed fleet's groups), discovering only its
    group's leaders: each group was priced with its own prefill and decode instances
    (compiler.routes), so none is paired across groups."""
    return [obj for group, mine in by_group(plan, comps) for obj in _router(plan, group, mine)]


def _router(plan: Plan, group: str | None, comps: list[Component]) -> list[dict]:
    prefill = [c for c in comps if c.role == "prefill"]
    decode = [c for c in comps if c.role == "decode"]
    image = plan.site.images.router
    if not (image and prefill and decode):
        return []
    name = router_name(plan.serving.name, group)
    selector = _kube.labels(plan, "router")
    if group is not None:
        selector[GROUP_LABEL] = group
    meta = V1ObjectMeta(name=name, namespace=plan.serving.namespace, labels=selector)
    pod = _router_pod(plan, name, _router_container(plan, image, group))
    return [_kube.to_dict(x) for x in (
        *_router_access(meta),
        V1Deployment(api_version="apps/v1", kind="Deployment", metadata=meta,
                     spec=V1DeploymentSpec(
                         replicas=1, selector=V1LabelSelector(match_labels=selector),
                         template=V1PodTemplateSpec(metadata=V1ObjectMeta(labels=selector),
                                                    spec=pod))),
        V1Service(api_version="v1", kind="Service", metadata=meta,
                  spec=V1ServiceSpec(selector=selector, ports=[
                      V1ServicePort(name="http", port=ports.ROUTER_HTTP, target_port="http")])))]


def _router_args(plan: Plan, group: str | None) -> list[str]:
    args = ["--vllm-pd-disaggregation", "--service-discovery",
            "--service-discovery-namespace", plan.serving.namespace,
            "--service-discovery-port", str(ports.ENGINE_API)]
    for flag, role in (("--prefill-selector", "prefill"), ("--decode-selector", "decode")):
        args += [flag, f"app.kubernetes.io/name={_kube.app_name(plan)}", f"{API_ROLE_LABEL}={role}",
                 *([f"{GROUP_LABEL}={group}"] if group is not None else [])]
    # prefill by prefix (cache_aware, the default); decode by load: it takes the prompt's KV
    # from prefill, and cache_aware would ask every decode server to tokenize each request
    # (docs/model-routing/pd-disaggregation.md "Policy Recommendations")
    return [*args, "--decode-policy", "power_of_two", "--host", "0.0.0.0",
            "--port", str(ports.ROUTER_HTTP)]


def _router_container(plan: Plan, image: str, group: str | None) -> V1Container:
    # /readiness answers once a healthy prefill and a healthy decode are discovered, /health
    # even with none (src/routers/http/pd_router.rs readiness, health; src/server.rs)
    return V1Container(
        name="router", image=image, command=["vllm-router"], args=_router_args(plan, group),
        ports=[V1ContainerPort(name="http", container_port=ports.ROUTER_HTTP)],
        readiness_probe=V1Probe(http_get=V1HTTPGetAction(path="/readiness", port="http"),
                                period_seconds=PROBE_PERIOD_S),
        liveness_probe=V1Probe(http_get=V1HTTPGetAction(path="/liveness", port="http"),
                               period_seconds=30, failure_threshold=3),
        resources=_kube.requirements(plan, plan.site.frontend),
        security_context=_kube.security_context(plan, "router"))


def _router_pod(plan: Plan, name: str, container: V1Container) -> V1PodSpec:
    return V1PodSpec(service_account_name=name, containers=[container],
                     automount_service_account_token=_kube.token(plan, "router"),
                     affinity=_kube.off_rack_affinity(plan),
                     priority_class_name=plan.site.priority_class,
                     tolerations=_kube.tolerations(plan),
                     node_selector=_kube.cpu_node_selector(plan))


def _router_access(meta: V1ObjectMeta) -> list:
    """The router's ServiceAccount and the Role (bound to it) that lets it watch pods."""
    name, ns = meta.name, meta.namespace
    return [
        V1ServiceAccount(api_version="v1", kind="ServiceAccount", metadata=meta),
        V1Role(api_version="rbac.authorization.k8s.io/v1", kind="Role", metadata=meta,
               rules=[V1PolicyRule(api_groups=[""], resources=["pods"],
                                   verbs=["get", "list", "watch"])]),
        V1RoleBinding(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding",
                      metadata=meta, role_ref=V1RoleRef(api_group="rbac.authorization.k8s.io",
                                                        kind="Role", name=name),
                      subjects=[RbacV1Subject(kind="ServiceAccount", name=name, namespace=ns)])]


def emit(plan: Plan) -> dict[str, str]:
    """Nothing for a P/D plan without a router (`Plan.lws_refused`, a W901 warning)."""
    if plan.lws_refused:
        return {}
    comps = components(plan)
    workloads = [leader_worker_set(plan, c) for c in comps]
    services = [leader_service(plan, c) for c in comps] + router_objects(plan, comps)
    return bundle(plan, "lws", comps, ("leaderworkersets.yaml", workloads + services))
