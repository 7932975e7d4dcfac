"""Pass 2: the hardware as a networkx graph.

Nodes: rack, tray (HGX: node), gpu, memory domain, cpu (with its DRAM), nic, and one NVLink
switch fabric per NVLink domain plus one RDMA fabric. Edges carry `link` (contains | nvlink | c2c
| rdma) and `gbytes_per_s` per direction. Ids are the plan's stable strings: `r0-t07-g2-d1`.
"""

from collections.abc import Iterable

import networkx as nx

from compiler import ids, load
from compiler.catalog.system import System
from compiler.ids import domain_id, gpu_id, natural, nvlink_id, rack_id, tray_id
from compiler.load import Inputs, layout

RDMA = "rdma"


def build_graph(inputs: Inputs) -> nx.Graph:
    """The hardware of one system; a mixed fleet's group with its ids from `inputs.offsets`
    (racks and NVLink domains numbered on from the groups before it). Indices (`index`, the
    node name's rack and tray, `unavailable.trays`) count within the group."""
    system, spec = inputs.system, inputs.hardware.spec
    racks, trays = layout(inputs.hardware, system)
    down_trays = set(spec.unavailable.trays)
    down_gpus = set(spec.unavailable.gpus)
    nic_gbps = inputs.resolved.nic_gbps_per_gpu.value
    dram = inputs.resolved.dram_gib_per_tray.value
    at = inputs.offsets
    g = nx.Graph(system=system.name, racks=racks, trays_per_rack=trays, form=system.form)
    g.add_node(RDMA, kind="fabric", link="rdma")
    for r in range(racks):
        rid = rack_id(at.racks + r)
        g.add_node(rid, kind="rack", index=r)
        if system.form == "nvl72":
            _add_fabric(g, nvlink_id(at.nvlinks + r))
        for t in range(trays):
            index = r * trays + t
            tid = tray_id(at.racks + r, t)
            node_name = load.node_name(inputs.hardware, r, t, index)
            g.add_node(tid, kind="tray", rack=at.racks + r, tray=t, index=index,
                       node_name=node_name, available=index not in down_trays, dram_gib=dram)
            g.add_edge(rid, tid, link="contains")
            fabric = nvlink_id(at.nvlinks + (r if system.form == "nvl72" else index))
            if system.form == "hgx":
                _add_fabric(g, fabric)
            _add_tray(g, system, tid, at.racks + r, t, fabric, index not in down_trays,
                      down_gpus, nic_gbps, dram)
    return g


def _add_fabric(g: nx.Graph, fid: str) -> None:
    g.add_node(fid, kind="fabric", link="nvlink")


def _add_tray(g: nx.Graph, system: System, tid: str, r: int, t: int, fabric: str,
              tray_up: bool, down_gpus: set[str], nic_gbps: float, dram: float) -> None:
    cpus = int(system.tray.cpus.value)
    for c in range(cpus):
        cid = f"{tid}-c{c}"
        g.add_node(cid, kind="cpu", dram_gib=dram / cpus, name=system.tray.cpu_name)
        g.add_edge(tid, cid, link="contains")
    per_cpu = max(1, system.gpus_per_tray // cpus)
    for i in range(system.gpus_per_tray):
        gid = gpu_id(r, t, i)
        g.add_node(gid, kind="gpu", rack=r, tray=t, gpu=i, nvlink_domain=fabric,
                   available=tray_up and gid not in down_gpus, hbm_gib=system.gpu.hbm_gib.value)
        g.add_edge(tid, gid, link="contains")
        g.add_edge(gid, fabric, link="nvlink", gbytes_per_s=system.gpu.nvlink_gbytes_per_s.value)
        g.add_edge(gid, f"{tid}-c{min(i // per_cpu, cpus - 1)}", link="c2c",
                   gbytes_per_s=system.gpu.c2c_gbytes_per_s.value)
        nid = f"{gid}-nic"
        g.add_node(nid, kind="nic", gbps=nic_gbps)
        g.add_edge(gid, nid, link="contains")
        g.add_edge(nid, RDMA, link="rdma", gbytes_per_s=nic_gbps / 8)
        for d in range(system.domains_per_gpu):
            g.add_node(domain_id(gid, d), kind="domain", gpu=gid, domain=d,
                       hbm_gib=system.hbm_gib_per_domain,
                       sms=int(system.gpu.sms_per_domain.value))
            g.add_edge(gid, domain_id(gid, d), link="contains")


def _of_kind(g: nx.Graph, kind: str, nodes: Iterable[str] | None = None) -> list[str]:
    pool = g.nodes if nodes is None else nodes
    return sorted((n for n in pool if g.nodes[n]["kind"] == kind), key=natural)


def gpus(g: nx.Graph) -> list[str]:
    return _of_kind(g, "gpu")


def available_gpus(g: nx.Graph) -> list[str]:
    return [n for n in gpus(g) if g.nodes[n]["available"]]


def trays(g: nx.Graph) -> list[str]:
    return _of_kind(g, "tray")


def gpus_of_tray(g: nx.Graph, tray: str) -> list[str]:
    return _of_kind(g, "gpu", g.neighbors(tray))


def domains_of_gpu(g: nx.Graph, gpu: str) -> list[str]:
    return _of_kind(g, "domain", g.neighbors(gpu))


def memory_domains(g: nx.Graph) -> list[str]:
    return _of_kind(g, "domain")


def tray_of_gpu(g: nx.Graph, gpu: str) -> str:
    return ids.tray_of_gpu(gpu)


def nvlink_domain_of(g: nx.Graph, gpu: str) -> str:
    return g.nodes[gpu]["nvlink_domain"]


def nvlink_domains(g: nx.Graph) -> list[str]:
    return sorted({g.nodes[n]["nvlink_domain"] for n in gpus(g)}, key=lambda s: int(s[3:]))


def bandwidth_gbytes_per_s(g: nx.Graph, a: str, b: str) -> float:
    """Per-direction bandwidth between two GPUs: NVLink inside a domain, else the RDMA NICs."""
    if a == b:
        return float("inf")
    fa, fb = nvlink_domain_of(g, a), nvlink_domain_of(g, b)
    if fa == fb:
        return min(g.edges[a, fa]["gbytes_per_s"], g.edges[b, fb]["gbytes_per_s"])
    return min(g.edges[f"{a}-nic", RDMA]["gbytes_per_s"], g.edges[f"{b}-nic", RDMA]["gbytes_per_s"])
