"""Communication costs: MoE all-to-all (dispatch/combine), all-reduce and KV transfers.

Datasheet bandwidths times achieved efficiencies from REFERENCE-DATA.md D until measured
(the multi-GPU calibration issue): DeepEP V2 on NVLink reaches ~81% of the per-direction
bandwidth at EP8 and the GB200 one-sided all-to-all ~65-70% at EP64; DeepEP over RDMA reaches
~95% of the NIC. Per-call floors: ~18-20 us dispatch and ~31 us combine on NVLink (TRT-LLM
blog18); aiconfigurator's 10 us P2P and 5 us inter-rack latencies.
"""

import math
from dataclasses import dataclass

from compiler.catalog.system import System

NVLINK_EFF_EP8 = 0.81  # REFERENCE-DATA.md D: DeepEP V2 726/900 GB/s
NVLINK_EFF_EP64 = 0.67  # REFERENCE-DATA.md D: GB200 one-sided EP64 588-631 of 900
RDMA_EFF = 0.95  # REFERENCE-DATA.md D: DeepEP RDMA 43-58 of ~50 GB/s (bottleneck link)
DISPATCH_FLOOR_US = 19.0  # REFERENCE-DATA.md D: ~18-20 us dispatch floor (GB200 NVL72)
COMBINE_FLOOR_US = 31.0  # REFERENCE-DATA.md D: ~31 us combine floor (GB200 NVL72)
FLOOR_REFERENCE_GBYTES_PER_S = 900.0  # GB200's NVLink5 per direction, where the floors were read
ALLREDUCE_EFF = 0.80  # assumed: NCCL ring bus bandwidth share of NVLink


@dataclass(frozen=True)
class Link:
    """Where an instance's collectives run: inside one NVLink domain, or across RDMA NICs."""

    kind: str  # "nvlink" | "rdma"
    gbytes_per_s: float  # per direction, per GPU
    spans_trays: bool


def instance_link(system: System, gpus: int, nic_gbps: float | None = None) -> Link:
    domain = int(system.rack.nvlink_domain_gpus.value)
    if gpus > domain:
        return Link("rdma", (nic_gbps or system.tray.nic_gbps_per_gpu.value) / 8, True)
    return Link("nvlink", system.gpu.nvlink_gbytes_per_s.value, gpus > system.gpus_per_tray)


def _nvlink_eff(ranks: int) -> float:
    """Efficiency falls from EP8 to EP64 with the number of peers (log-linear between)."""
    if ranks <= 8:
        return NVLINK_EFF_EP8
    frac = min(1.0, math.log2(ranks / 8) / 3)
    return NVLINK_EFF_EP8 + (NVLINK_EFF_EP64 - NVLINK_EFF_EP8) * frac


def _bandwidth(link: Link, ranks: int) -> float:
    """Achieved bytes per microsecond per GPU."""
    eff = RDMA_EFF if link.kind == "rdma" else _nvlink_eff(ranks)
    return link.gbytes_per_s * 1e3 * eff


def all_to_all_floor_us(system: System, combine: bool) -> float:
    """Per-call floor of an NVLink all-to-all, measured on GB200; scaled to other NVLink
    generations by link speed (assumed: the floor is set by the fabric's round trips)."""
    floor = COMBINE_FLOOR_US if combine else DISPATCH_FLOOR_US
    return floor * FLOOR_REFERENCE_GBYTES_PER_S / system.gpu.nvlink_gbytes_per_s.value


def all_to_all_us(system: System, link: Link, ranks: int, bytes_per_rank: float,
                  combine: bool, nodes: int = 1, top_k: int = 8) -> float:
    """One dispatch (or combine) of `bytes_per_rank` leaving each rank to its peers. Across
    `nodes` RDMA-joined nodes a token crosses the network once per distinct remote node its
    experts live on (DeepEP forwards inside the node over NVLink)."""
    if ranks <= 1:
        return 0.0
    floor = all_to_all_floor_us(system, combine)
    share = (ranks - 1) / ranks
    if link.kind == "rdma":
        floor += system.latency.p2p_us.value
        share = remote_node_share(nodes, top_k)
    return floor + bytes_per_rank * share / _bandwidth(link, ranks)


def remote_node_share(nodes: int, top_k: int) -> float:
    """Bytes that cross RDMA per routed copy of a token: distinct remote nodes among its
    top-k experts (uniform routing) over top-k."""
    if nodes <= 1:
        return 0.0
    distinct = nodes * (1 - (1 - 1 / nodes) ** top_k)
    return distinct * (nodes - 1) / nodes / top_k


def all_reduce_us(system: System, link: Link, ranks: int, nbytes: float) -> float:
    """Ring all-reduce of `nbytes` per rank: 2(n-1)/n of the data crosses each link."""
    if ranks <= 1:
        return 0.0
    latency = system.latency.mem_op_us.value * 2
    if link.spans_trays:
        latency += system.latency.cross_tray_allreduce_us.value
    if link.kind == "rdma":
        latency += system.latency.p2p_us.value
    bw = link.gbytes_per_s * 1e3 * (RDMA_EFF if link.kind == "rdma" else ALLREDUCE_EFF)
    return latency + 2 * (ranks - 1) / ranks * nbytes / bw


def all_gather_us(system: System, link: Link, ranks: int, nbytes: float) -> float:
    """Ring all-gather of `nbytes` in all, 1/n from each rank: (n-1)/n of it crosses each
    link, in one pass (half of a ring all-reduce)."""
    if ranks <= 1:
        return 0.0
    latency = system.latency.mem_op_us.value
    if link.spans_trays:
        latency += system.latency.cross_tray_allreduce_us.value
    if link.kind == "rdma":
        latency += system.latency.p2p_us.value
    bw = link.gbytes_per_s * 1e3 * (RDMA_EFF if link.kind == "rdma" else ALLREDUCE_EFF)
    return latency + (ranks - 1) / ranks * nbytes / bw


def transfer_us(system: System, nbytes: float, kind: str, nic_gbps: float | None = None) -> float:
    """Move KV (or any buffer) over `kind`: nvlink (peer HBM), rdma (pool / other rack), c2c.
    `nic_gbps`: the rack's per-GPU NIC rate when it overrides the catalog's."""
    if nbytes <= 0:
        return 0.0
    if kind == "nvlink":
        bw = system.gpu.nvlink_gbytes_per_s.value * NVLINK_EFF_EP8
    elif kind == "c2c":
        return system.latency.p2p_us.value + nbytes / host_link_bytes_per_us(system)
    else:
        bw = (nic_gbps or system.tray.nic_gbps_per_gpu.value) / 8 * RDMA_EFF
    return system.latency.p2p_us.value + nbytes / (bw * 1e3)


def host_link_bytes_per_us(system: System) -> float:
    """What the GPU-CPU link (NVLink-C2C, or PCIe on HGX: the system's `c2c_gbytes_per_s`)
    moves per microsecond from pinned host memory to one GPU, at the achieved share
    (ALLREDUCE_EFF, assumed alike for kernel reads and copies)."""
    return system.gpu.c2c_gbytes_per_s.value * ALLREDUCE_EFF * 1e3
