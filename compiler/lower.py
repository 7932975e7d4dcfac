"""Pass 5: lower a solution to the canonical Plan IR (ids, memory map, Engram shards, pool)."""

import math

import networkx as nx

from compiler import arch, graph, site
from compiler.load import Inputs
from compiler.plan import (
    Decision,
    DomainMemory,
    EngramShard,
    Hardware,
    Instance,
    KvPool,
    ModelInfo,
    Plan,
    PoolSegment,
    Routing,
    Serving,
    SolverInfo,
    Speculative,
    Tray,
)
from compiler.precheck import kv_dtype, max_model_len
from compiler.solve import Solution
from compiler.solve.memory_map import total_gib
from compiler.solve.place import gpu_index


def _hardware(inputs: Inputs, g: nx.Graph) -> Hardware:
    system, spec = inputs.system, inputs.hardware.spec
    trays = [Tray(id=t, node_name=g.nodes[t]["node_name"],
                  nvlink_domain=g.nodes[graph.gpus_of_tray(g, t)[0]]["nvlink_domain"],
                  gpus=graph.gpus_of_tray(g, t), available=g.nodes[t]["available"])
             for t in graph.trays(g)]
    return Hardware(
        system=system.name, form=system.form, gpu_family=system.gpu.family,
        arch=system.arch,
        gpus_per_tray=system.gpus_per_tray, domains_per_gpu=system.domains_per_gpu,
        hbm_gib_per_gpu=system.gpu.hbm_gib.value,
        rdma_devices_per_tray=spec.rdma_devices_per_tray or system.gpus_per_tray,
        node_labels=dict(sorted(spec.node_labels.items())), trays=trays,
        unavailable_gpus=sorted(set(graph.gpus(g)) - set(graph.available_gpus(g)),
                                key=graph._natural))


def _model(inputs: Inputs) -> ModelInfo:
    m = inputs.model.spec
    return ModelInfo(
        name=inputs.model_name, hf_id=m.hf_id, architecture=m.architecture,
        attention=m.attention.kind, sparse_attention=m.attention.indexer is not None,
        weights_dtype=m.dtypes.weights, experts_dtype=m.dtypes.experts, moe=m.moe is not None,
        experts=m.moe.experts if m.moe else 0, engram_tables=m.engram.tables if m.engram else 0,
        engram_table_bytes=round(m.engram.table_gib * arch.GIB) if m.engram else 0)


def _serving(inputs: Inputs) -> Serving:
    d = inputs.deployment
    s = d.spec.serving
    spec = Speculative(method=s.speculative.method, draft_tokens=s.speculative.draft_tokens,
                       acceptance=s.speculative.acceptance) if s.speculative else None
    return Serving(name=d.metadata.name, namespace=s.namespace,
                   vllm_version=s.vllm_version, kv_cache_dtype=kv_dtype(inputs), block_size=s.block_size,
                   max_model_len=max_model_len(inputs), speculative=spec,
                   engram_placement=s.engram_placement)


def _instances(sol: Solution, g: nx.Graph) -> list[Instance]:
    index = gpu_index(sol.problem)
    rows = sorted(zip(sol.wanted, sol.candidates, sol.placement.gpus, strict=True),
                  key=lambda r: (r[0].role, index[r[2][0]]))
    out, counter = [], {}
    for w, c, gpus in rows:
        k = counter.get(w.role, 0)
        counter[w.role] = k + 1
        need = w.need
        util = math.floor(100 * total_gib(need) / need.capacity_gib) / 100
        trays = sorted({graph.tray_of_gpu(g, x) for x in gpus}, key=graph._natural)
        out.append(Instance(id=f"{w.role}-{k:02d}", role=w.role, shape=w.shape.name,
                            gpus=list(gpus), trays=trays, dp=w.shape.dp, ep=w.shape.ep,
                            tp=w.shape.tp, max_batch=c.max_batch,
                            max_batched_tokens=c.max_batched_tokens,
                            gpu_memory_utilization=util))
    return out


def _memory(sol: Solution, instances: list[Instance], g: nx.Graph) -> dict[str, DomainMemory]:
    out = {}
    for inst in instances:
        w = next(x for x in sol.wanted if x.shape.name == inst.shape and x.role == inst.role)
        for gpu in inst.gpus:
            for dom in graph.domains_of_gpu(g, gpu):
                out[dom] = w.need
    return dict(sorted(out.items(), key=lambda kv: graph._natural(kv[0])))


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def _shards(model: ModelInfo, domains: list[str], group: str) -> list[EngramShard]:
    """Each table cut into one contiguous byte range per domain, covering it exactly once."""
    out = []
    for table in range(model.engram_tables):
        offset = 0
        for k, (dom, size) in enumerate(zip(domains, _split(model.engram_table_bytes,
                                                             len(domains)), strict=True)):
            out.append(EngramShard(table=table, shard=k, domain=dom, offset_bytes=offset,
                                   bytes=size, group=group))
            offset += size
    return out


def _engram(inputs: Inputs, model: ModelInfo, instances: list[Instance],
            g: nx.Graph) -> list[EngramShard]:
    if not model.engram_tables or inputs.deployment.spec.serving.engram_placement != "hbm":
        return []
    prefill = [d for i in instances if i.role == "prefill" for x in i.gpus
               for d in graph.domains_of_gpu(g, x)]
    out = _shards(model, prefill, "prefill") if prefill else []
    for inst in instances:
        if inst.role != "prefill":
            doms = [d for x in inst.gpus for d in graph.domains_of_gpu(g, x)]
            out += _shards(model, doms, inst.id)
    return out


def _pool(inputs: Inputs, hardware: Hardware, model: ModelInfo, instances: list[Instance],
          engram: list[EngramShard], memory: dict[str, DomainMemory]) -> KvPool:
    """A DRAM segment per tray running engines: the deployment's share of the tray, at most
    what its pods leave free (compiler.site)."""
    cfg = inputs.deployment.spec.serving.kv_pool
    if not cfg or not cfg.dram:
        return KvPool(enabled=False, segments=[], total_gib=0.0)
    dram = inputs.hardware.spec.dram_gib_per_tray or inputs.system.tray.dram_gib.value
    fixed = site.pinned_besides_pool_gib(inputs.deployment.spec.site, hardware, model, instances,
                                         engram, inputs.deployment.spec.serving.engram_placement,
                                         True, dram)
    trays = sorted({t for i in instances for t in i.trays}, key=graph._natural)
    segs = [PoolSegment(kind="dram", location=t, gib=math.floor(1000 * max(
        0.0, min(dram * cfg.dram_fraction, dram - fixed[t]))) / 1000) for t in trays]
    if cfg.hbm:
        segs += [PoolSegment(kind="hbm", location=d, gib=m.pool_gib)
                 for d, m in memory.items() if m.pool_gib > 0]
    return KvPool(enabled=True, segments=segs, total_gib=round(sum(s.gib for s in segs), 3))


def lower(inputs: Inputs, g: nx.Graph, sol: Solution, predicted: dict,
          decisions: list[Decision]) -> Plan:
    model = _model(inputs)
    instances = _instances(sol, g)
    memory = _memory(sol, instances, g)
    hardware = _hardware(inputs, g)
    engram = _engram(inputs, model, instances, g)
    kv_pool = _pool(inputs, hardware, model, instances, engram, memory)
    routing = inputs.deployment.spec.serving.routing
    c, p = sol.counts, sol.placement
    both_optimal = c.status == "OPTIMAL" and p.status == "OPTIMAL"
    return Plan(
        inputs_digest=inputs.digest,
        hardware=hardware,
        model=model,
        serving=_serving(inputs),
        instances=instances,
        memory=memory,
        engram_shards=engram,
        kv_pool=kv_pool,
        routing=Routing(policy=routing.policy, overlap_score_credit=routing.overlap_score_credit,
                        block_size=inputs.deployment.spec.serving.block_size),
        solver=SolverInfo(status="OPTIMAL" if both_optimal else "FEASIBLE",
                          objective=round(c.objective, 3), bound=round(c.bound, 3),
                          seconds=round(c.deterministic_seconds + p.deterministic_seconds, 3)),
        predicted=predicted,
        decisions=decisions,
        site=site.lower_site(inputs.deployment.spec.site, site.checkpoint_bytes(inputs.model.spec),
                             hardware,
                             model, instances, kv_pool, engram,
                             inputs.deployment.spec.serving.engram_placement),
        parsers=site.parsers(inputs.model_name),
    )
