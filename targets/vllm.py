"""vllm: one launch script per instance and rank group (node), `vllm/<instance>/<tray>.sh`.

Each script sets the environment and execs `vllm serve` with the shared engine arguments and the
flags that place this node's ranks: CUDA devices, and for a multi-node instance the leader's
address (the leader tray's node name), this node's start rank or node rank, and `--headless` on
every node but the leader.
"""

import shlex

from compiler.plan import Plan, RankGroup
from targets._components import Component, components
from targets._engine import engine_args, engine_env, multinode_flags, parser_flags
from targets._mooncake import client_config_path, pool_enabled
from targets._shell import exec_command
from targets._site import cache_env

ENGINE = ("vllm", "serve")


def launch_flags(plan: Plan, component: Component, leader: RankGroup, group: RankGroup
                 ) -> list[str]:
    """The host ports are the plan's (compiler.deploy: offset so that instances sharing a host
    bind none of each other's)."""
    api = ["--port", str(group.api_port)] if group.api_port is not None else []
    return [*engine_args(plan, component, "vllm"), *api, *parser_flags(plan),
            *multinode_flags(component, node_rank=str(group.index),
                             start_rank=str(group.first_rank), leader=leader.node_name,
                             leader_node=group.is_leader, dp_rpc_port=leader.dp_rpc_port,
                             master_port=leader.master_port)]


def launch_env(plan: Plan, component: Component, group: RankGroup) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, group.cuda_devices)),
           # NIXL's handshake address: what decode engines dial to pull this node's KV.
           "VLLM_NIXL_SIDE_CHANNEL_HOST": group.node_name,
           **cache_env(plan),
           **engine_env(plan, component, "vllm")}
    if group.nixl_port is not None:
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(group.nixl_port)
    if pool_enabled(plan):
        env["MOONCAKE_CONFIG_PATH"] = client_config_path(group.node_name)
    return dict(sorted(env.items()))


def script(plan: Plan, component: Component, instance_id: str, groups: tuple[RankGroup, ...],
           group: RankGroup) -> str:
    ranks = f"ranks {group.first_rank}-{group.first_rank + len(group.gpus) - 1}"
    role = "leader" if group.is_leader else "headless"
    head = [
        "#!/bin/sh",
        f"# rackc: {instance_id} ({component.instances[0].shape}, {component.role}), node "
        f"{group.index + 1} of {len(groups)} ({role}): {ranks} on tray {group.tray}, "
        f"node {group.node_name}",
        f"# the model cache {plan.site.model_cache.source} is mounted at "
        f"{plan.site.model_cache.mount_path}"
        + ("; HF_TOKEN: from the environment (secret "
           f"{plan.site.hf_token_secret})" if plan.site.hf_token_secret else ""),
    ]
    env = [f"export {k}={shlex.quote(v)}"
           for k, v in launch_env(plan, component, group).items()]
    if plan.site.rdma.transport == "rdma":
        # RDMA registration pins the KV buffers and pool segments (in pods: IPC_LOCK)
        env.insert(0, 'ulimit -l unlimited || echo "rackc: memlock limit stays $(ulimit -l)" >&2')
    command = exec_command([*ENGINE, plan.model.hf_id],
                           launch_flags(plan, component, groups[0], group))
    return "\n".join([*head, *env, command]) + "\n"


def emit(plan: Plan) -> dict[str, str]:
    files = {}
    for component in components(plan):
        for instance in component.instances:
            groups = tuple(instance.rank_groups)
            for group in groups:
                files[f"vllm/{instance.id}/{group.tray}.sh"] = script(
                    plan, component, instance.id, groups, group)
    return dict(sorted(files.items()))
