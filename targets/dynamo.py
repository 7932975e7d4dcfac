"""dynamo: the DynamoGraphDeployment (nvidia.com/v1beta1) that serves the plan behind Dynamo.

A frontend with the KV router, which sends each request to the (worker, DP rank) with the least
uncached work, and one prefill or decode component per plan component. For a component whose
instances span several trays the operator runs `multinode.nodeCount` pods per replica and
injects the per-node flags itself (DP address, local size and start rank, or --nnodes/--node-rank
for tensor parallelism across nodes), so the engine arguments here name only the sizes.
"""

from kubernetes.client import V1Container, V1PodSpec

from compiler.plan import Plan
from targets import _kube
from targets._components import Component, components
from targets._engine import engine_args, engine_env
from targets._errors import TargetError
from targets._names import dns_label
from targets._yaml import compact_json, dump_yaml

FRONTEND_PORT = 8000
# vLLM publishes KV events here for the router (Dynamo's KV-routing recipes); DP ranks offset it.
KV_EVENTS_ENDPOINT = "tcp://*:20080"
COMPONENT_TYPE = {"prefill": "prefill", "decode": "decode", "aggregated": "worker"}
DISAGGREGATION_MODE = {"prefill": "prefill", "decode": "decode", "aggregated": "agg"}


def frontend_args(plan: Plan) -> list[str]:
    routing = plan.routing
    args = ["--http-port", str(FRONTEND_PORT), "--router-mode", routing.policy]
    if routing.policy == "kv":
        if routing.block_size != plan.serving.block_size:
            raise TargetError(f"routing.block_size {routing.block_size} differs from the engines' "
                              f"serving.block_size {plan.serving.block_size}")
        args += ["--router-kv-overlap-score-credit", f"{routing.overlap_score_credit:g}",
                 "--kv-cache-block-size", str(routing.block_size)]
    return args


def worker_args(plan: Plan, component: Component) -> list[str]:
    args = ["--model", plan.model.hf_id, *engine_args(plan, component),
            "--disaggregation-mode", DISAGGREGATION_MODE[component.role]]
    if plan.routing.policy == "kv":
        args += ["--kv-events-config", compact_json(
            {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": KV_EVENTS_ENDPOINT})]
    return args


def frontend_component(plan: Plan) -> dict:
    container = V1Container(
        name="main", image=plan.serving.image, command=["python3", "-m", "dynamo.frontend"],
        args=frontend_args(plan), env_from=_kube.secret_env(plan))
    spec = V1PodSpec(containers=[container],
                     node_selector={"kubernetes.io/arch": plan.fleet[0].arch})
    return {"name": "frontend", "type": "frontend", "replicas": 1,
            "podTemplate": _kube.pod_template(spec)}


def worker_component(plan: Plan, component: Component) -> dict:
    container = _kube.engine_container(plan, component, ["python3", "-m", "dynamo.vllm"],
                                       worker_args(plan, component),
                                       _kube.env_vars(engine_env(plan, component)))
    spec = _kube.engine_pod_spec(plan, component, container)
    out = {"name": component.name, "type": COMPONENT_TYPE[component.role],
           "replicas": len(component.instances)}
    if component.nodes_per_instance > 1:
        out["multinode"] = {"nodeCount": component.nodes_per_instance}
        out["podTemplate"] = _kube.pod_template(
            spec, annotations={"nvidia.com/vllm-distributed-executor-backend": "mp"})
    else:
        out["podTemplate"] = _kube.pod_template(spec)
    return out


def graph_deployment(plan: Plan) -> dict:
    comps = components(plan)
    return {
        "apiVersion": "nvidia.com/v1beta1",
        "kind": "DynamoGraphDeployment",
        "metadata": _kube.to_dict(_kube.metadata(plan, dns_label(plan.serving.name))),
        "spec": {
            "backendFramework": "vllm",
            "components": [frontend_component(plan),
                           *(worker_component(plan, c) for c in comps)],
        },
    }


def emit(plan: Plan) -> dict[str, str]:
    return {"dynamo/dgd.yaml": dump_yaml(graph_deployment(plan))}
