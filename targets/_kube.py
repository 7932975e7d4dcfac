"""Kubernetes objects shared by the dynamo, k8s, lws and mooncake targets.

Built-in kinds are the `kubernetes` client's typed models, turned into plain dicts by its own
serialiser; the ComputeDomain (a custom resource) is a plain dict from a small typed function.
"""

import math
from typing import Any

from kubernetes.client import (
    ApiClient,
    CoreV1ResourceClaim,
    V1Affinity,
    V1Capabilities,
    V1ConfigMap,
    V1ConfigMapVolumeSource,
    V1Container,
    V1ContainerPort,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStrategy,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1EnvVarSource,
    V1HostPathVolumeSource,
    V1LabelSelector,
    V1Namespace,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectFieldSelector,
    V1ObjectMeta,
    V1PersistentVolumeClaimVolumeSource,
    V1PodResourceClaim,
    V1PodSpec,
    V1PodTemplateSpec,
    V1Probe,
    V1ResourceRequirements,
    V1SeccompProfile,
    V1SecretKeySelector,
    V1SecurityContext,
    V1Service,
    V1ServicePort,
    V1ServiceSpec,
    V1TCPSocketAction,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)

from compiler import ports
from compiler.names import dns_label
from compiler.plan import Plan, Resources
from targets import _mooncake
from targets._components import Component
from targets._site import cache_env
from targets._topology import claims_channel
from targets._yaml import dump_json, dump_yaml

_API = ApiClient()
CHANNEL_CLAIM = "compute-domain-channel"
MODEL_CACHE_VOLUME = "model-cache"
MOONCAKE_VOLUME = "mooncake-config"


def to_dict(model: Any) -> dict:
    return _API.sanitize_for_serialization(model)


def app_name(plan: Plan) -> str:
    return dns_label(plan.serving.name)


def labels(plan: Plan, component: str | None = None) -> dict[str, str]:
    out = {"app.kubernetes.io/name": app_name(plan), "app.kubernetes.io/managed-by": "rackc"}
    if component:
        out["app.kubernetes.io/component"] = component
    return out


def metadata(plan: Plan, name: str, component: str | None = None) -> V1ObjectMeta:
    return V1ObjectMeta(name=name, namespace=plan.serving.namespace,
                        labels=labels(plan, component))


PSS_ENFORCE = "pod-security.kubernetes.io/enforce"


def namespace(plan: Plan) -> dict:
    """Pod Security admission enforces the least level that admits every pod of the plan
    (`site.security`); the CPU-only pods meet restricted on their own."""
    return to_dict(V1Namespace(api_version="v1", kind="Namespace", metadata=V1ObjectMeta(
        name=plan.serving.namespace, labels={"app.kubernetes.io/part-of": app_name(plan),
                                             PSS_ENFORCE: plan.site.pod_security_level})))


def config_map(plan: Plan, name: str, data: dict[str, str]) -> dict:
    return to_dict(V1ConfigMap(api_version="v1", kind="ConfigMap", metadata=metadata(plan, name),
                               data=data))


# --- ComputeDomain (NVIDIA DRA driver): one per NVLink domain the engines use -----------------

def compute_domain_name(plan: Plan, domain: str) -> str:
    return dns_label(plan.serving.name, domain)


def channel_template_name(plan: Plan, domain: str) -> str:
    return dns_label(plan.serving.name, domain, "channel")


def compute_domain(plan: Plan, domain: str) -> dict:
    """`numNodes: 0`: readiness follows the pods (the driver's IMEXDaemonsWithDNSNames default)."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": to_dict(metadata(plan, compute_domain_name(plan, domain))),
        "spec": {
            "numNodes": 0,
            "channel": {"allocationMode": "Single",
                        "resourceClaimTemplate": {"name": channel_template_name(plan, domain)}},
        },
    }


def compute_domains(plan: Plan, comps: tuple[Component, ...]) -> list[dict]:
    """One per NVLink domain whose pods claim a channel (`claims_channel`)."""
    return [compute_domain(plan, d) for d in sorted({
        c.domain for c in comps if claims_channel(plan, c.instances[0], c.nodes_per_instance)})]


# --- engine pods ----------------------------------------------------------------------------

def node_selector(plan: Plan, component: Component) -> dict[str, str]:
    """The kubelet's own arch label and the labels the user says every node carries (of the
    component's group, in a mixed fleet); no label GPU Feature Discovery owns is guessed (pods
    are pinned by node name instead)."""
    hw = plan.system_of(component.instances[0])
    return {"kubernetes.io/arch": hw.arch, **hw.node_labels}


def node_affinity(plan: Plan, node_names: tuple[str, ...]) -> V1Affinity:
    """Replicas of a component land on the set of trays the plan chose for them. By node name
    (`metadata.name`, one field selector per term: the API allows one value each), unless the
    user says the `kubernetes.io/hostname` label equals the node names."""
    if plan.site.pin_by_hostname:
        terms = [V1NodeSelectorTerm(match_expressions=[V1NodeSelectorRequirement(
            key="kubernetes.io/hostname", operator="In", values=list(node_names))])]
    else:
        terms = [V1NodeSelectorTerm(match_fields=[V1NodeSelectorRequirement(
            key="metadata.name", operator="In", values=[n])]) for n in node_names]
    return V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=V1NodeSelector(
            node_selector_terms=terms)))


def off_rack_affinity(plan: Plan) -> V1Affinity:
    """CPU-only pods (frontend, Mooncake master, router) keep off every tray of the rack
    manifest, whose host memory the engine pods' requests already fill; by node name, which is
    exact (GPU nodes need not be tainted, so a toleration alone would not keep them off). One
    term, one requirement per tray (ANDed): a field selector takes one value."""
    return V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=V1NodeSelector(
            node_selector_terms=[V1NodeSelectorTerm(match_fields=[
                V1NodeSelectorRequirement(key="metadata.name", operator="NotIn", values=[n])
                for n in sorted(t.node_name for t in plan.hardware.trays)])])))


def cpu_node_selector(plan: Plan) -> dict[str, str] | None:
    """Pods without GPUs: the site's `scheduling.cpu_arch`, else any architecture (their
    images are multi-arch; on NVL72 the only arm64 nodes may be the trays they keep off)."""
    return {"kubernetes.io/arch": plan.site.cpu_arch} if plan.site.cpu_arch else None


def tolerations(plan: Plan) -> list[V1Toleration] | None:
    """The site's tolerations, on every pod: GPU pods need them, and the CPU-only ones (frontend,
    master, router) may then also run on GPU nodes outside the rack, where only those have the
    image's architecture."""
    return [V1Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
            for t in plan.site.tolerations] or None


def env_vars(env: dict[str, str]) -> list[V1EnvVar]:
    return [V1EnvVar(name=k, value=v) for k, v in env.items()]


def field_env(name: str, field_path: str) -> V1EnvVar:
    """An env var from the pod's own fields (`status.podIP`, `spec.nodeName`)."""
    return V1EnvVar(name=name, value_from=V1EnvVarSource(
        field_ref=V1ObjectFieldSelector(field_path=field_path)))


def secret_env(plan: Plan) -> list[V1EnvVar]:
    """HF_TOKEN from the user's Secret, when the checkpoint is gated; public ones need none."""
    if not plan.site.hf_token_secret:
        return []
    return [V1EnvVar(name="HF_TOKEN", value_from=V1EnvVarSource(
        secret_key_ref=V1SecretKeySelector(name=plan.site.hf_token_secret, key="HF_TOKEN")))]


def mooncake_client_map(plan: Plan) -> str:
    return dns_label(plan.serving.name, "mooncake-client")


def component_resources(plan: Plan, component: Component) -> Resources:
    """One template serves every replica: the largest pod of its instances."""
    sizes = [plan.pod_size(i.id).resources for i in component.instances]
    return Resources(cpu=max(r.cpu for r in sizes), memory_gib=max(r.memory_gib for r in sizes),
                     shm_gib=max(r.shm_gib for r in sizes),
                     rdma_devices=max(r.rdma_devices for r in sizes),
                     registers_memory=any(r.registers_memory for r in sizes))


def _gib(value: float) -> str:
    return f"{math.ceil(value)}Gi"


def requirements(plan: Plan, size: Resources, gpus: int = 0,
                 claims: list[CoreV1ResourceClaim] | None = None) -> V1ResourceRequirements:
    """CPU and memory requested, memory capped at the request (the pinned pages are the pod's);
    GPUs and RDMA devices as extended resources (requests = limits)."""
    requests = {"cpu": str(size.cpu), "memory": _gib(size.memory_gib)}
    limits = {"memory": _gib(size.memory_gib)}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if size.rdma_devices:
        requests[plan.site.rdma.resource] = limits[plan.site.rdma.resource] = \
            str(size.rdma_devices)
    return V1ResourceRequirements(requests=requests, limits=limits, claims=claims)


def engine_kind(size: Resources, dynamo: bool = False) -> str:
    """The `site.security` kind of an engine pod: those that register memory with the RDMA
    NIC (NIXL's KV buffers, the Mooncake segments) hold IPC_LOCK; Dynamo's workers keep their
    service-account token (compiler/site.py security)."""
    return ("dynamo-" if dynamo else "") + ("engine-rdma" if size.registers_memory else "engine")


def security_context(plan: Plan, kind: str) -> V1SecurityContext:
    """A container's securityContext as the plan's `site.security[kind]` says."""
    sec = plan.site.security[kind]
    caps = None
    if sec.capabilities_add or sec.drop_all_capabilities:
        caps = V1Capabilities(add=sec.capabilities_add or None,
                              drop=["ALL"] if sec.drop_all_capabilities else None)
    return V1SecurityContext(
        allow_privilege_escalation=False, capabilities=caps, run_as_user=sec.run_as_user,
        run_as_non_root=sec.run_as_non_root or None,
        seccomp_profile=V1SeccompProfile(type="RuntimeDefault")
        if sec.seccomp_runtime_default else None)


def token(plan: Plan, kind: str) -> bool:
    """automountServiceAccountToken: only pods that call the API server get one."""
    return plan.site.security[kind].service_account_token


NODE_VAR = "MOONCAKE_CLIENT_NODE"  # sorts before MOONCAKE_CONFIG_PATH, which expands it


def engine_container(plan: Plan, component: Component, image: str, command: list[str],
                     args: list[str], env: list[V1EnvVar],
                     extra_mounts: list[V1VolumeMount] | None = None) -> V1Container:
    """The `main` container of an engine pod. With a pool it reads its node's Mooncake client
    file: MOONCAKE_CLIENT_NODE (the node's name) comes first, so that Kubernetes can expand it
    in MOONCAKE_CONFIG_PATH, and its name sorts first too: an operator that sorts the env by
    name (a Dynamo operator's MergeEnvs, deploy/operator/internal/dynamo/graph.go, in some
    releases) keeps the order (fresh review R4-01)."""
    size = component_resources(plan, component)
    channel = claims_channel(plan, component.instances[0], component.nodes_per_instance)
    claims = [CoreV1ResourceClaim(name=CHANNEL_CLAIM)] if channel else None
    mounts = [V1VolumeMount(name=MODEL_CACHE_VOLUME, mount_path=plan.site.model_cache.mount_path),
              *(extra_mounts or [])]
    env = [*env_vars(cache_env(plan)), *secret_env(plan), *env]
    if _mooncake.pool_enabled(plan):
        mounts.append(V1VolumeMount(name=MOONCAKE_VOLUME, mount_path=_mooncake.CONFIG_DIR,
                                    read_only=True))
        env = [field_env(NODE_VAR, "spec.nodeName"),
               V1EnvVar(name="MOONCAKE_CONFIG_PATH",
                        value=_mooncake.client_config_path(f"$({NODE_VAR})")),
               *env]
    return V1Container(
        name="main", image=image, command=command, args=args, env=env, volume_mounts=mounts,
        resources=requirements(plan, size, component.gpus_per_node, claims),
        security_context=security_context(plan, engine_kind(size)))


def model_cache_volume(plan: Plan) -> V1Volume:
    cache = plan.site.model_cache
    if cache.kind == "pvc":
        return V1Volume(name=MODEL_CACHE_VOLUME, persistent_volume_claim=(
            V1PersistentVolumeClaimVolumeSource(claim_name=cache.source)))
    return V1Volume(name=MODEL_CACHE_VOLUME, host_path=V1HostPathVolumeSource(
        path=cache.source, type="DirectoryOrCreate"))


def engine_pod_spec(plan: Plan, component: Component, container: V1Container,
                    extra_volumes: list[V1Volume] | None = None,
                    dynamo: bool = False) -> V1PodSpec:
    claims, volumes = None, [model_cache_volume(plan), *(extra_volumes or [])]
    if claims_channel(plan, component.instances[0], component.nodes_per_instance):
        claims = [V1PodResourceClaim(
            name=CHANNEL_CLAIM,
            resource_claim_template_name=channel_template_name(plan, component.domain))]
    if _mooncake.pool_enabled(plan):
        volumes.append(V1Volume(name=MOONCAKE_VOLUME, config_map=V1ConfigMapVolumeSource(
            name=mooncake_client_map(plan))))
    kind = engine_kind(component_resources(plan, component), dynamo)
    return V1PodSpec(containers=[container], affinity=node_affinity(plan, component.node_names),
                     automount_service_account_token=token(plan, kind),
                     node_selector=node_selector(plan, component), resource_claims=claims,
                     tolerations=tolerations(plan),
                     priority_class_name=plan.site.priority_class, volumes=volumes)


def shared_memory_volume(shm_gib: float) -> tuple[V1Volume, V1VolumeMount]:
    """/dev/shm for the engine's processes, sized to hold the node's shared Engram tables
    (Dynamo's operator makes its own from the component's sharedMemorySize)."""
    return (V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(
                medium="Memory", size_limit=_gib(shm_gib))),
            V1VolumeMount(name="dshm", mount_path="/dev/shm"))


def pod_template(spec: V1PodSpec, labels_: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> dict:
    meta = V1ObjectMeta(labels=labels_, annotations=annotations) if labels_ or annotations else None
    return to_dict(V1PodTemplateSpec(metadata=meta, spec=spec))


# --- Mooncake master ------------------------------------------------------------------------

def mooncake_objects(plan: Plan) -> list[dict]:
    """The master's ConfigMap, Service and Deployment. The master runs from the vLLM image: the
    MooncakeStoreConnector needs mooncake-transfer-engine there, which ships mooncake_master.
    It registers no memory with a NIC (the clients' segments live in the engine pods)."""
    name = _mooncake.master_name(plan)
    selector = labels(plan, "mooncake-master")
    named = [("rpc", ports.MOONCAKE_RPC), ("metrics", ports.MOONCAKE_METRICS)]
    config = config_map(plan, name, {_mooncake.MASTER_CONFIG_FILE:
                                     dump_yaml(_mooncake.master_config())})
    service = V1Service(api_version="v1", kind="Service",
                        metadata=metadata(plan, name, "mooncake-master"),
                        spec=V1ServiceSpec(selector=selector, ports=[
                            V1ServicePort(name=n, port=p, target_port=n) for n, p in named]))
    rpc = V1TCPSocketAction(port="rpc")
    container = V1Container(
        name="master", image=plan.site.images.vllm, command=["mooncake_master"],
        args=[f"--config_path={_mooncake.CONFIG_DIR}/{_mooncake.MASTER_CONFIG_FILE}"],
        ports=[V1ContainerPort(name=n, container_port=p) for n, p in named],
        resources=requirements(plan, plan.site.mooncake_master),
        security_context=security_context(plan, "mooncake-master"),
        readiness_probe=V1Probe(tcp_socket=rpc, period_seconds=10),
        liveness_probe=V1Probe(tcp_socket=rpc, initial_delay_seconds=30, period_seconds=20),
        volume_mounts=[V1VolumeMount(name="config", mount_path=_mooncake.CONFIG_DIR,
                                     read_only=True)])
    pod = V1PodSpec(containers=[container], affinity=off_rack_affinity(plan),
                    automount_service_account_token=token(plan, "mooncake-master"),
                    node_selector=cpu_node_selector(plan),
                    priority_class_name=plan.site.priority_class,
                    tolerations=tolerations(plan),
                    volumes=[V1Volume(name="config",
                                      config_map=V1ConfigMapVolumeSource(name=name))])
    deployment = V1Deployment(
        api_version="apps/v1", kind="Deployment",
        metadata=metadata(plan, name, "mooncake-master"),
        spec=V1DeploymentSpec(
            replicas=1, strategy=V1DeploymentStrategy(type="Recreate"),
            selector=V1LabelSelector(match_labels=selector),
            template=V1PodTemplateSpec(metadata=V1ObjectMeta(labels=selector), spec=pod)))
    return [config, to_dict(service), to_dict(deployment)]


def mooncake_client_config_map(plan: Plan) -> dict:
    return config_map(plan, mooncake_client_map(plan), {
        _mooncake.client_config_file(node): dump_json(config)
        for node, config in _mooncake.client_configs(plan).items()})


def mooncake_bundle(plan: Plan) -> list[dict]:
    """Every Mooncake object the engines need, or none without a pool."""
    if not _mooncake.pool_enabled(plan):
        return []
    return [*mooncake_objects(plan), mooncake_client_config_map(plan)]
