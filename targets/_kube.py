"""Kubernetes objects shared by the dynamo, k8s, lws and mooncake targets.

Built-in kinds are the `kubernetes` client's typed models, turned into plain dicts by its own
serialiser; the ComputeDomain (a custom resource) is a plain dict from a small typed function.
"""

from typing import Any

from kubernetes.client import (
    ApiClient,
    CoreV1ResourceClaim,
    V1Affinity,
    V1ConfigMap,
    V1ConfigMapVolumeSource,
    V1Container,
    V1ContainerPort,
    V1Deployment,
    V1DeploymentSpec,
    V1DeploymentStrategy,
    V1EmptyDirVolumeSource,
    V1EnvFromSource,
    V1EnvVar,
    V1EnvVarSource,
    V1LabelSelector,
    V1Namespace,
    V1NodeAffinity,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectFieldSelector,
    V1ObjectMeta,
    V1PodResourceClaim,
    V1PodSpec,
    V1PodTemplateSpec,
    V1Probe,
    V1ResourceRequirements,
    V1SecretEnvSource,
    V1Service,
    V1ServicePort,
    V1ServiceSpec,
    V1TCPSocketAction,
    V1Volume,
    V1VolumeMount,
)

from compiler.plan import Plan
from targets import _mooncake
from targets._components import Component
from targets._names import dns_label
from targets._yaml import dump_json, dump_yaml

_API = ApiClient()
CHANNEL_CLAIM = "compute-domain-channel"
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


def namespace(plan: Plan) -> dict:
    return to_dict(V1Namespace(api_version="v1", kind="Namespace", metadata=V1ObjectMeta(
        name=plan.serving.namespace, labels={"app.kubernetes.io/part-of": app_name(plan)})))


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
    """One ComputeDomain per NVLink domain that runs engines (none on HGX)."""
    return [compute_domain(plan, d) for d in sorted({c.domain for c in comps if c.domain})]


# --- engine pods ----------------------------------------------------------------------------

def node_selector(plan: Plan, component: Component) -> dict[str, str]:
    hw = plan.hardware_of(component.instances[0].trays[0])
    return {"kubernetes.io/arch": hw.arch, "nvidia.com/gpu.product": hw.gpu_product,
            **hw.node_labels}


def node_affinity(node_names: tuple[str, ...]) -> V1Affinity:
    """Replicas of a component land on the set of trays the plan chose for them."""
    return V1Affinity(node_affinity=V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=V1NodeSelector(node_selector_terms=[
            V1NodeSelectorTerm(match_expressions=[V1NodeSelectorRequirement(
                key="kubernetes.io/hostname", operator="In", values=list(node_names))])])))


def env_vars(env: dict[str, str]) -> list[V1EnvVar]:
    return [V1EnvVar(name=k, value=v) for k, v in env.items()]


def field_env(name: str, field_path: str) -> V1EnvVar:
    """An env var from the pod's own fields (`status.podIP`, `spec.nodeName`)."""
    return V1EnvVar(name=name, value_from=V1EnvVarSource(
        field_ref=V1ObjectFieldSelector(field_path=field_path)))


def secret_env(plan: Plan) -> list[V1EnvFromSource] | None:
    """The model token by reference: the Secret's keys (HF_TOKEN) become the container's env."""
    if not plan.serving.hf_token_secret:
        return None
    return [V1EnvFromSource(secret_ref=V1SecretEnvSource(name=plan.serving.hf_token_secret))]


def mooncake_client_map(plan: Plan) -> str:
    return dns_label(plan.serving.name, "mooncake-client")


def engine_container(plan: Plan, component: Component, command: list[str], args: list[str],
                     env: list[V1EnvVar], extra_mounts: list[V1VolumeMount] | None = None
                     ) -> V1Container:
    """The `main` container of an engine pod. With a pool it reads its node's Mooncake client
    file: NODE_NAME comes first, so that Kubernetes can expand it in MOONCAKE_CONFIG_PATH."""
    claims = [CoreV1ResourceClaim(name=CHANNEL_CLAIM)] if component.domain else None
    mounts = list(extra_mounts or [])
    if _mooncake.pool_enabled(plan):
        mounts.append(V1VolumeMount(name=MOONCAKE_VOLUME, mount_path=_mooncake.CONFIG_DIR,
                                    read_only=True))
        env = [field_env("NODE_NAME", "spec.nodeName"),
               V1EnvVar(name="MOONCAKE_CONFIG_PATH",
                        value=_mooncake.client_config_path("$(NODE_NAME)")),
               *env]
    return V1Container(
        name="main", image=plan.serving.image, command=command, args=args, env=env,
        env_from=secret_env(plan), volume_mounts=mounts or None,
        resources=V1ResourceRequirements(limits={"nvidia.com/gpu": str(component.gpus_per_node)},
                                         claims=claims))


def engine_pod_spec(plan: Plan, component: Component, container: V1Container,
                    extra_volumes: list[V1Volume] | None = None) -> V1PodSpec:
    claims, volumes = None, list(extra_volumes or [])
    if component.domain:
        claims = [V1PodResourceClaim(
            name=CHANNEL_CLAIM,
            resource_claim_template_name=channel_template_name(plan, component.domain))]
    if _mooncake.pool_enabled(plan):
        volumes.append(V1Volume(name=MOONCAKE_VOLUME, config_map=V1ConfigMapVolumeSource(
            name=mooncake_client_map(plan))))
    return V1PodSpec(containers=[container], affinity=node_affinity(component.node_names),
                     node_selector=node_selector(plan, component), resource_claims=claims,
                     volumes=volumes or None)


def shared_memory_volume() -> tuple[V1Volume, V1VolumeMount]:
    """/dev/shm for the engine's processes (Dynamo's operator adds it to its pods itself)."""
    return (V1Volume(name="dshm", empty_dir=V1EmptyDirVolumeSource(medium="Memory")),
            V1VolumeMount(name="dshm", mount_path="/dev/shm"))


def pod_template(spec: V1PodSpec, labels_: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> dict:
    meta = V1ObjectMeta(labels=labels_, annotations=annotations) if labels_ or annotations else None
    return to_dict(V1PodTemplateSpec(metadata=meta, spec=spec))


# --- Mooncake master ------------------------------------------------------------------------

def mooncake_objects(plan: Plan) -> list[dict]:
    """The master's ConfigMap, Service and Deployment. The master runs from the serving image:
    the MooncakeStoreConnector needs mooncake-transfer-engine there, which ships mooncake_master."""
    name = _mooncake.master_name(plan)
    selector = labels(plan, "mooncake-master")
    ports = [("rpc", _mooncake.RPC_PORT), ("metrics", _mooncake.METRICS_PORT)]
    config = config_map(plan, name, {_mooncake.MASTER_CONFIG_FILE:
                                     dump_yaml(_mooncake.master_config())})
    service = V1Service(api_version="v1", kind="Service",
                        metadata=metadata(plan, name, "mooncake-master"),
                        spec=V1ServiceSpec(selector=selector, ports=[
                            V1ServicePort(name=n, port=p, target_port=n) for n, p in ports]))
    container = V1Container(
        name="master", image=plan.serving.image, command=["mooncake_master"],
        args=[f"--config_path={_mooncake.CONFIG_DIR}/{_mooncake.MASTER_CONFIG_FILE}"],
        ports=[V1ContainerPort(name=n, container_port=p) for n, p in ports],
        readiness_probe=V1Probe(tcp_socket=V1TCPSocketAction(port="rpc")),
        volume_mounts=[V1VolumeMount(name="config", mount_path=_mooncake.CONFIG_DIR,
                                     read_only=True)])
    pod = V1PodSpec(containers=[container],
                    node_selector={"kubernetes.io/arch": plan.fleet[0].arch},
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
