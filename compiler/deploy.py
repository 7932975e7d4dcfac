"""Where an instance's processes run and which host ports they bind, recorded on the plan.

vLLM runs one process per node, serving the ranks on that node's GPUs, so an instance of n GPUs
on k trays is k rank groups. Ranks are `instance.gpus` in order; each tray holds a contiguous run
of them and every tray of a multi-tray instance the same number (vLLM's
`--data-parallel-size-local` and the DGD's GPUs per pod are one value per instance).

Host ports matter where processes share a host's network (the `vllm/` launch scripts): two
instances on one tray (two DEP2) would bind the same ports, so each instance's ports are offset
by its slot, the CUDA index of its first GPU on the leader's tray. vLLM's NIXL listener of DP
rank r binds VLLM_NIXL_SIDE_CHANNEL_PORT + r (r global, `data_parallel_index`:
nixl/base_scheduler.py), so a node whose first rank is f sets the base to 5600 + slot - f and its
ranks land on 5600 + slot + local index. A headless node of a TP / PP instance runs workers only
(entrypoints/cli/serve.py): no scheduler, so no listener. The leader of a multi-node instance
binds the DP coordinator's RPC port (DEP) or torch's master port (TP / PP); the other nodes
dial it.
"""

from itertools import groupby

from compiler import ports
from compiler.names import workload_name
from compiler.plan import Decision, Instance, RankGroup, Tray


class LayoutError(ValueError):
    """An instance's GPUs cannot be run as vLLM processes (a hand-edited plan)."""


def rank_groups(trays: dict[str, Tray], tray_of_gpu: dict[str, str], instance: Instance
                ) -> list[RankGroup]:
    runs = [(t, list(g)) for t, g in groupby(instance.gpus, key=lambda g: tray_of_gpu[g])]
    order = [t for t, _ in runs]
    if len(set(order)) != len(order):
        raise LayoutError(f"instances[{instance.id}].gpus: the ranks on each tray must be "
                          f"contiguous, got trays in rank order {order}")
    if set(order) != set(instance.trays):
        raise LayoutError(f"instances[{instance.id}].trays: expected {sorted(order)} (the "
                          f"trays of its GPUs), got {instance.trays}")
    if len({len(gpus) for _, gpus in runs}) > 1:
        raise LayoutError(f"instances[{instance.id}]: every tray must hold the same number of "
                          f"its GPUs, got {[len(gpus) for _, gpus in runs]}")
    devices_of = [[trays[t].gpus.index(g) for g in gpus] for t, gpus in runs]
    leader_slot = devices_of[0][0]
    multi = len(runs) > 1
    out, first = [], 0
    for index, ((tray_id, gpus), devices) in enumerate(zip(runs, devices_of, strict=True)):
        tray = trays[tray_id]
        leader = index == 0
        listens = leader or instance.dp > 1
        out.append(RankGroup(
            index=index, tray=tray_id, node_name=tray.node_name, gpus=gpus,
            cuda_devices=devices, first_rank=first,
            api_port=ports.ENGINE_API + leader_slot if leader else None,
            nixl_port=ports.NIXL_SIDE_CHANNEL + devices[0] - first if listens else None,
            dp_rpc_port=ports.DP_RPC + leader_slot if leader and multi and instance.dp > 1
            else None,
            master_port=ports.MASTER + leader_slot if leader and multi and instance.dp == 1
            else None))
        first += len(gpus)
    return out


def with_rank_groups(trays: list[Tray], instances: list[Instance]) -> list[Instance]:
    by_id = {t.id: t for t in trays}
    of_gpu = {g: t.id for t in trays for g in t.gpus}
    return [i.model_copy(update={"rank_groups": rank_groups(by_id, of_gpu, i),
                                 "workload": workload_name(i.id, i.shape)})
            for i in instances]


def decisions(instances: list[Instance]) -> list[Decision]:
    out = []
    for i in instances:
        g = i.rank_groups[0]
        nodes = len(i.rank_groups)
        where = (f"{nodes} vLLM processes, one per node, {len(g.gpus)} ranks each"
                 if nodes > 1 else f"one vLLM process on {g.node_name}")
        offset = g.api_port - ports.ENGINE_API if g.api_port is not None else 0
        out.append(Decision(
            path=f"instances.{i.id}.rank_groups", value=", ".join(
                f"{r.node_name}:cuda{r.cuda_devices[0]}-{r.cuda_devices[-1]}"
                for r in i.rank_groups),
            source="rule", why=f"{where}; host ports offset by {offset}, the CUDA index of its "
                               "first GPU, so instances sharing a host bind none of each "
                               "other's ports (compiler/deploy.py)"))
    return out
