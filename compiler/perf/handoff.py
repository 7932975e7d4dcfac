"""P/D hand-offs: what moving a request's KV from its prefill to its decode instance (NIXL)
costs, inside an NVLink domain or across domains over the NICs.

A router picks the prefill and the decode instance of a request among its routing group's
(compiler/routes.py); `cross` is the share of the group's hand-offs whose two instances sit in
different NVLink domains. Those leave over the NICs of the prefill instance's GPUs (the rank that
prefilled a request holds its KV; an instance's ranks share its requests evenly) and arrive
over the decode instance's: each GPU's NIC (`nic_gbps_per_gpu`, the rack's override or the
catalog's) at RDMA's achieved share. A NIC is planned at most as busy as a prefill rank
(`MAX_UTILISATION`): beyond that the NICs, not the GPUs, limit how many requests an instance
takes (`nic_requests_per_us`). A crossing transfer waits for the NIC's earlier transfers
(M/D/1: every hand-off of a workload has the same size, `nic_wait_us`); a local one moves over
NVLink. The solver's candidates (compiler/perf/capacity.py) and the prediction
(compiler/perf/serving.py) price hand-offs with these functions alone.
"""

import math

from compiler import arch
from compiler.perf import comm
from compiler.perf.step import PerfContext

MAX_NIC_UTILISATION = 0.95  # as a prefill rank (compiler.perf.serving MAX_UTILISATION)


def request_bytes(ctx: PerfContext, tokens: float) -> float:
    """One request's hand-off: the KV of its `tokens` prompt tokens and its linear-attention
    state."""
    return tokens * arch.kv_bytes_per_token(ctx.model, ctx.kv_dtype) \
        + arch.state_bytes_per_request(ctx.model)


def nic_bytes_per_us(ctx: PerfContext) -> float:
    """What one GPU's NIC moves per microsecond at RDMA's achieved share."""
    gbps = ctx.nic_gbps or ctx.system.tray.nic_gbps_per_gpu.value
    return gbps / 8 * 1e3 * comm.RDMA_EFF


def nic_load(ctx: PerfContext, requests_per_us: float, gpus: int, tokens: float,
             cross: float) -> float:
    """Utilisation of the NICs of `gpus` GPUs that send (or receive) `requests_per_us`
    hand-offs of `tokens`, `cross` of them across NVLink domains."""
    if cross <= 0 or gpus <= 0:
        return 0.0
    return requests_per_us * cross * request_bytes(ctx, tokens) / (gpus * nic_bytes_per_us(ctx))


def nic_requests_per_us(ctx: PerfContext, gpus: int, tokens: float, cross: float) -> float:
    """The most requests per microsecond `gpus` GPUs' NICs hand off (or take in) when `cross`
    of them cross domains: at `MAX_NIC_UTILISATION`; unbounded when none cross."""
    if cross <= 0:
        return math.inf
    return MAX_NIC_UTILISATION * gpus * nic_bytes_per_us(ctx) \
        / (cross * request_bytes(ctx, tokens))


def nic_wait_us(service_us: float, load: float) -> float:
    """Mean wait of a transfer behind the NIC's others (M/D/1: equal sizes)."""
    load = min(max(load, 0.0), 0.999)
    return load * service_us / (2 * (1 - load))


def handoff_us(ctx: PerfContext, tokens: float, cross: float, load: float = 0.0) -> float:
    """Mean time of a request's hand-off: over NVLink inside the domain, over the NICs at
    `load` (the sending NICs' utilisation) for the `cross` share that leaves it."""
    nbytes = request_bytes(ctx, tokens)
    local = comm.transfer_us(ctx.system, nbytes, "nvlink") if cross < 1 else 0.0
    if cross <= 0:
        return local
    remote = comm.transfer_us(ctx.system, nbytes, "rdma", ctx.nic_gbps)
    remote += nic_wait_us(remote - ctx.system.latency.p2p_us.value, load)
    return (1 - cross) * local + cross * remote
