"""lws: for clusters without Dynamo, each component as a LeaderWorkerSet of plain `vllm serve`
engines (one group per instance, one pod per tray), in a kustomize bundle `lws/` with the same
Namespace, Mooncake and ComputeDomain objects as the k8s target.

LWS tells each pod its leader and index (`LWS_LEADER_ADDRESS`, `LWS_WORKER_INDEX`). The leader's
arguments use Kubernetes' `$(VAR)` expansion; a worker of a data-parallel instance needs its start
rank, `index x GPUs per node`, so its command is a shell that does the arithmetic. A P/D pair of
components still needs a P/D-aware router in front (for example llm-d's); it is not emitted here.
"""

from compiler.plan import Plan
from targets import _kube
from targets._bundle import bundle
from targets._components import Component, components
from targets._engine import engine_args, engine_env, multinode_flags
from targets._names import dns_label
from targets._shell import exec_command

LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"  # Kubernetes expansion in the leader's args
WORKER_LEADER_ADDRESS = "${LWS_LEADER_ADDRESS}"  # shell expansion in a worker's script
WORKER_INDEX = "${LWS_WORKER_INDEX}"


def _engine_command(plan: Plan) -> list[str]:
    return ["vllm", "serve", plan.model.hf_id]


def leader_args(plan: Plan, component: Component) -> list[str]:
    return [*engine_args(plan, component),
            *multinode_flags(component, node_rank="0", start_rank="0", leader=LEADER_ADDRESS,
                             leader_node=True)]


def worker_script(plan: Plan, component: Component) -> str:
    """`sh -c` script of the pods at LWS_WORKER_INDEX 1..size-1; expressions stay unquoted."""
    start_rank = f"$((LWS_WORKER_INDEX * {component.gpus_per_node}))"
    expressions = {WORKER_LEADER_ADDRESS, WORKER_INDEX, start_rank}
    flags = multinode_flags(component, node_rank=WORKER_INDEX, start_rank=start_rank,
                            leader=WORKER_LEADER_ADDRESS, leader_node=False)
    return exec_command(_engine_command(plan), [*engine_args(plan, component), *flags],
                        expressions)


def _pod(plan: Plan, component: Component, command: list[str], args: list[str]) -> dict:
    shm_volume, shm_mount = _kube.shared_memory_volume()
    env = [*_kube.env_vars(engine_env(plan, component)),
           _kube.field_env("VLLM_NIXL_SIDE_CHANNEL_HOST", "status.podIP")]
    container = _kube.engine_container(plan, component, command, args, env, [shm_mount])
    spec = _kube.engine_pod_spec(plan, component, container, [shm_volume])
    return _kube.pod_template(spec, labels_=_kube.labels(plan, component.name))


def leader_worker_set(plan: Plan, component: Component) -> dict:
    size = component.nodes_per_instance
    leader = _pod(plan, component, _engine_command(plan), leader_args(plan, component))
    template: dict = {"size": size}
    if size == 1:
        template["workerTemplate"] = leader
    else:
        template["leaderTemplate"] = leader
        template["workerTemplate"] = _pod(plan, component, ["/bin/sh", "-c"],
                                          [worker_script(plan, component)])
    name = dns_label(plan.serving.name, component.name)
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": _kube.to_dict(_kube.metadata(plan, name, component.name)),
        "spec": {"replicas": len(component.instances), "leaderWorkerTemplate": template},
    }


def emit(plan: Plan) -> dict[str, str]:
    comps = components(plan)
    return bundle(plan, "lws", comps,
                  ("leaderworkersets.yaml", [leader_worker_set(plan, c) for c in comps]))
