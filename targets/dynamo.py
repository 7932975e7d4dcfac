"""dynamo: the DynamoGraphDeployment (nvidia.com/v1beta1) that serves the plan behind Dynamo.

A frontend with the KV router, which sends each request to the (worker, DP rank) with the least
uncached work, and one prefill or decode component per plan component. For a component whose
instances span several trays the operator runs `multinode.nodeCount` pods per replica and
injects the per-node flags itself (DP address, local size and start rank, or --nnodes/--node-rank
for tensor or pipeline parallelism across nodes: TP x PP above a pod's GPUs), so the engine
arguments here name only the sizes.
"""

from kubernetes.client import (
    V1Container,
    V1EmptyDirVolumeSource,
    V1PodSpec,
    V1Volume,
    V1VolumeMount,
)

from compiler import ports
from compiler.names import graph_name
from compiler.plan import Plan
from targets import _kube
from targets._components import Component, by_group, components
from targets._engine import engine_args, engine_env
from targets._errors import TargetError
from targets._yaml import compact_json, dump_documents

# vLLM publishes KV events here for the router (Dynamo's KV-routing recipes); DP ranks offset it.
KV_EVENTS_ENDPOINT = "tcp://*:20080"
COMPONENT_TYPE = {"prefill": "prefill", "decode": "decode", "aggregated": "worker"}
DISAGGREGATION_MODE = {"prefill": "prefill", "decode": "decode", "aggregated": "agg"}
DYNAMO_OVERLAP_SCORE_CREDIT = 1.0  # --router-kv-overlap-score-credit default (kv_router_args.py)


def frontend_args(plan: Plan) -> list[str]:
    routing = plan.routing
    args = ["--http-port", str(ports.FRONTEND_HTTP), "--router-mode", routing.policy]
    if routing.policy == "kv":
        if routing.block_size != plan.serving.block_size:
            raise TargetError(f"routing.block_size {routing.block_size} differs from the engines' "
                              f"serving.block_size {plan.serving.block_size}")
        args += ["--kv-cache-block-size", str(routing.block_size)]
        if routing.overlap_score_credit != DYNAMO_OVERLAP_SCORE_CREDIT:
            # Deprecated in Dynamo 1.6 (to be removed in 1.7), still read there; the default
            # needs no flag.
            args += ["--router-kv-overlap-score-credit", f"{routing.overlap_score_credit:g}"]
    return args


def worker_args(plan: Plan, component: Component) -> list[str]:
    args = ["--model", plan.model.hf_id, *engine_args(plan, component, "dynamo"),
            "--disaggregation-mode", DISAGGREGATION_MODE[component.role]]
    if plan.routing.policy == "kv":
        args += ["--kv-events-config", compact_json(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": KV_EVENTS_ENDPOINT})]
    if plan.parsers.dynamo_tool_call:
        args += ["--dyn-tool-call-parser", plan.parsers.dynamo_tool_call]
    if plan.parsers.dynamo_reasoning:
        args += ["--dyn-reasoning-parser", plan.parsers.dynamo_reasoning]
    return args


def runtime_version(plan: Plan) -> dict[str, str]:
    """`runtimeVersionOverride` where the image tag is not the Dynamo version (DGD admission
    reads the tag as one, CRD nvidia.com_dynamographdeployments)."""
    override = plan.site.images.runtime_version_override
    return {"runtimeVersionOverride": override} if override else {}


def worker_env(plan: Plan, component: Component) -> list:
    """The engines' environment. A single-node worker also gets its pod IP as NIXL's side
    channel host: the operator injects it for multinode workers only (backend_vllm.go), and
    dynamo.vllm's own fallback looks for a NixlConnector at the top level or under a
    PdConnector, not under the MultiConnector the pool adds (dynamo/vllm/args.py)."""
    env = _kube.env_vars(engine_env(plan, component, "dynamo"))
    if component.nodes_per_instance == 1 and component.role != "aggregated":
        env.append(_kube.field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP"))
    return env


TOKENIZER_CACHE = "tokenizer-cache"


def frontend_component(plan: Plan) -> dict:
    """The HTTP frontend and KV router; its probes are the operator's (/live, /health on the
    http port, component_frontend.go). It fetches the tokenizer into an emptyDir of its own
    (restricted: no hostPath, no root-owned cache to write). It discovers the workers of its
    own graph only: the operator gives it DYN_NAMESPACE_PREFIX=<its graph's Dynamo namespace>
    (component_frontend.go), which the runtime matches as a plain string prefix unless
    DYN_NAMESPACE_PREFIX_STRICT is set (lib/runtime namespace.rs NamespacePrefixMode: then the
    prefix itself or `<prefix>-<worker generation>`), and `rackc-case-nvl1` is a prefix of
    `rackc-case-nvl10`. The operator sets it itself behind its StrictNamespacePrefix gate,
    from the runtime version it reads off the image tag (or runtimeVersionOverride); set here
    for any image, as Dynamo's docs advise where the image has the strict mode (the 1.6.1
    runtime reads it), and the template's env wins over the operator's (graph.go MergeEnvs)."""
    container = V1Container(
        name="main", image=plan.site.images.dynamo, command=["python3", "-m", "dynamo.frontend"],
        args=frontend_args(plan),
        env=[*_kube.env_vars({"HF_HOME": plan.site.model_cache.hf_home,
                              "DYN_NAMESPACE_PREFIX_STRICT": "true"}),
             *_kube.secret_env(plan)],
        resources=_kube.requirements(plan, plan.site.frontend),
        security_context=_kube.security_context(plan, "frontend"),
        volume_mounts=[V1VolumeMount(name=TOKENIZER_CACHE,
                                     mount_path=plan.site.model_cache.mount_path)])
    spec = V1PodSpec(containers=[container], affinity=_kube.off_rack_affinity(plan),
                     automount_service_account_token=_kube.token(plan, "frontend"),
                     node_selector=_kube.cpu_node_selector(plan),
                     priority_class_name=plan.site.priority_class,
                     tolerations=_kube.tolerations(plan),
                     volumes=[V1Volume(name=TOKENIZER_CACHE,
                                       empty_dir=V1EmptyDirVolumeSource())])
    return {"name": "frontend", "type": "frontend", "replicas": 1, **runtime_version(plan),
            "podTemplate": _kube.pod_template(spec)}


def worker_component(plan: Plan, component: Component) -> dict:
    """Probes are the operator's (startup up to 2 h, component_worker.go); /dev/shm is its
    emptyDir of `sharedMemorySize`, sized for the node's shared Engram tables."""
    container = _kube.engine_container(plan, component, plan.site.images.dynamo,
                                       ["python3", "-m", "dynamo.vllm"],
                                       worker_args(plan, component), worker_env(plan, component))
    spec = _kube.engine_pod_spec(plan, component, container, dynamo=True)
    shm = _kube.component_resources(plan, component).shm_gib
    out = {"name": component.name, "type": COMPONENT_TYPE[component.role],
           "replicas": len(component.instances), **runtime_version(plan),
           "sharedMemorySize": f"{shm:g}Gi"}
    if component.nodes_per_instance > 1:
        out["multinode"] = {"nodeCount": component.nodes_per_instance}
        out["podTemplate"] = _kube.pod_template(
            spec, annotations={"nvidia.com/vllm-distributed-executor-backend": "mp"})
    else:
        out["podTemplate"] = _kube.pod_template(spec)
    return out


def graph_deployments(plan: Plan) -> list[dict]:
    """One graph per fleet group. The operator gives each DynamoGraphDeployment its own Dynamo
    namespace, `<Kubernetes namespace>-<graph name>` (deploy/operator/internal/dynamo/graph.go
    GetDynamoNamespace -> ComputeDynamoNamespace), in which its frontend discovers workers: a
    mixed fleet's groups are routed each by its own frontend, so every prefill/decode pair stays
    in the group that was solved and predicted with it (`routing.groups`)."""
    out = []
    for group, mine in by_group(plan, components(plan)):
        name = graph_name(plan.serving.name, group)
        out.append({
            "apiVersion": "nvidia.com/v1beta1",
            "kind": "DynamoGraphDeployment",
            "metadata": _kube.to_dict(_kube.metadata(plan, name)),
            "spec": {
                "backendFramework": "vllm",
                "components": [frontend_component(plan),
                               *(worker_component(plan, c) for c in mine)],
            },
        })
    return out


_WRITTEN: list = [None, ""]  # the last plan graphs_text wrote, and its text


def graphs_text(plan: Plan) -> str:
    """The graphs as YAML, written once per plan: dynamo/ and k8s/ carry the same file (at 64
    groups, 12.6 MB that take 11 CPU s to build and write)."""
    if _WRITTEN[0] is not plan:
        _WRITTEN[:] = [plan, dump_documents(graph_deployments(plan))]
    return _WRITTEN[1]


def emit(plan: Plan) -> dict[str, str]:
    """Nothing for a plan Dynamo cannot serve (`site.engines.dynamo.refused`, a W901 warning)."""
    if plan.site.engines["dynamo"].refused:
        return {}
    return {"dynamo/dgd.yaml": graphs_text(plan)}
