"""Pass 5: lower a solution to the canonical Plan IR (ids, memory map, Engram shards, pool)."""

import functools
from collections.abc import Iterable

import networkx as nx

from compiler import arch, deploy, engine_policy, graph, offload, routes, site
from compiler.choice import Choice
from compiler.decisions import decisions
from compiler.engine_releases import release_run
from compiler.host_memory import host_memory
from compiler.ids import instance_id, natural, parse_instance
from compiler.load import Inputs
from compiler.memory import utilization
from compiler.plan import (
    Considered,
    Decision,
    DomainMemory,
    EngramShard,
    Fleet,
    FleetGroup,
    Hardware,
    HostMemory,
    Instance,
    KvPool,
    ModelInfo,
    PhaseSolve,
    Plan,
    PoolSegment,
    RackSolve,
    RouteGroup,
    Routing,
    Serving,
    SolverInfo,
    Speculative,
    Tray,
    WeightOffload,
)
from compiler.shapes import Shape, stage_layers
from compiler.solve import Solution
from compiler.solve.memory_map import stage_domain_memory
from compiler.solve.params import gap
from compiler.solve.place import gpu_index
from compiler.solve.problem import DECIMALS, Kept


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
        dram_gib_per_tray=inputs.resolved.dram_gib_per_tray.value,
        allocatable_gib_per_tray=_allocatable_gib(inputs),
        rdma_devices_per_tray=inputs.resolved.rdma_devices_per_tray.value,
        node_labels=dict(sorted(spec.node_labels.items())), trays=trays,
        unavailable_gpus=sorted(set(graph.gpus(g)) - set(graph.available_gpus(g)),
                                key=natural))


def _allocatable_gib(inputs: Inputs) -> float:
    r = inputs.resolved
    return round(r.dram_gib_per_tray.value - r.host_reserved_gib.value, 3)  # as the reserve


def _allocatable_decision(inputs: Inputs) -> Decision:
    r = inputs.resolved
    return Decision(path="hardware.allocatable_gib_per_tray", value=f"{_allocatable_gib(inputs):g}",
                    source="rule:node-allocatable",
                    why=f"the tray's DRAM ({r.dram_gib_per_tray.value:g} GiB, "
                        f"{r.dram_gib_per_tray.path}) less the node reserve "
                        f"({r.host_reserved_gib.value:g} GiB, {r.host_reserved_gib.path}): what "
                        "the scheduler hands to pods")


def _model(inputs: Inputs) -> ModelInfo:
    m = inputs.model.spec
    return ModelInfo(
        name=inputs.model_name, hf_id=m.hf_id, architecture=m.architecture,
        attention=m.attention.kind, sparse_attention=m.attention.indexer is not None,
        weights_dtype=m.dtypes.weights, experts_dtype=m.dtypes.experts,
        expert_format=inputs.resolved.expert_format.value, moe=m.moe is not None,
        experts=m.moe.experts if m.moe else 0,
        redundant_experts=m.moe.redundant_experts if m.moe else 0,
        engram_tables=m.engram.tables if m.engram else 0,
        engram_table_bytes=round(m.engram.table_gib * arch.GIB) if m.engram else 0,
        assumed=sorted(k or "(whole entry)" for k, v in m.sources.items()
                       if v.startswith("assumed")))


def _serving(inputs: Inputs, block_size: int) -> Serving:
    r = inputs.resolved
    spec = None
    if r.speculative:
        extra = r.engines.vllm.speculative.options.get(r.speculative.method)
        spec = Speculative(method=r.speculative.method,
                           draft_tokens=r.speculative.draft_tokens,
                           acceptance=r.speculative.acceptance,
                           options=dict(extra.value) if extra else {})
    return Serving(name=r.name, namespace=r.namespace,
                   vllm_version=r.vllm_version,
                   kv_cache_dtype=r.kv_cache_dtype.value, block_size=block_size,
                   max_model_len=r.max_model_len.value,
                   attention_backend=r.attention_backend.value,
                   attention_options=r.attention_options.value,
                   linear_backend=r.linear_backend.value, speculative=spec,
                   engram_placement=r.engram_placement.value,
                   language_model_only=bool(r.language_model_only
                                            and r.language_model_only.value),
                   model_flags=list(r.model_flags.value) if r.model_flags else [])


def _engine(inputs: Inputs, role: str, shape: Shape, pipelined: bool
            ) -> tuple[dict, list[Choice]]:
    """The engine policy of one instance (compiler.engine_policy), and its decisions;
    `pipelined`: a prefill instance of the layout has pipeline stages."""
    r = inputs.resolved
    policy = engine_policy.of(inputs, role, shape)
    choices = [c for c in (policy.all2all, policy.env if policy.env.value else None,
                           policy.moe_backend if policy.moe_backend.value else None) if c]
    engram = r.engram_prefill if role == "prefill" else r.engram_decode
    connectors = engine_policy.kv_connectors(r.engines.vllm, role, r.kv_pool_dram.value,
                                             pipelined)
    fields = {"all2all_backend": policy.all2all_backend,
              "moe_backend": policy.moe_backend.value, "engram": engram.value,
              "env": dict(sorted(policy.env.value.items())), "kv_connectors": connectors.value,
              "connector_env": engine_policy.connector_env(r.engines.vllm, connectors.value)}
    off, ask = offload.of(inputs, role, shape), r.offload_ask(role, shape.name)
    if off is None or ask is None:
        return fields, [*choices, connectors]
    fields["weight_offload"] = WeightOffload(
        backend=off.backend, gib_per_gpu=off.host_gib, params=off.params,
        group_size=off.group_size, num_in_group=off.num_in_group,
        prefetch_step=off.prefetch_step, buffer_gib=off.buffer_gib)
    return fields, [*choices, connectors, offload.decision(off, ask, r.engines.vllm.offload)]


def _instances(inputs: Inputs, sol: Solution, g: nx.Graph
               ) -> tuple[list[Instance], list[Decision]]:
    """Kept instances keep their ids; new ones are numbered per role in GPU order, from the
    first number the running plan (a mixed fleet: the groups before this one) has not used
    (0 in a fresh compile of one system)."""
    index = gpu_index(sol.problem)
    rows = sorted(zip(sol.wanted, sol.candidates, sol.gpus, sol.ids, strict=True),
                  key=lambda r: (r[0].role, index[r[2][0]]))
    out, made, counter = [], [], dict(sol.problem.next_id)
    pipelined = any(w.role == "prefill" and w.shape.pp > 1 for w in sol.wanted)
    prefill_gpus = sum(w.shape.gpus for w in sol.wanted if w.role == "prefill")
    for w, c, gpus, kept_id in rows:
        if kept_id is None:
            k = counter.get(w.role, 0)
            counter[w.role] = k + 1
        # every stage's GPUs under one flag: the strictest stage's (their reserves differ by
        # the rounding of their parts)
        util = min(utilization(d.capacity_gib, d.reserved_gib)
                   for d in _stage_needs(sol, w.role, w.shape, w.need, prefill_gpus))
        trays = sorted({graph.tray_of_gpu(g, x) for x in gpus}, key=natural)
        iid = kept_id or instance_id(w.role, k)
        fields, choices = _engine(inputs, w.role, w.shape, pipelined)
        out.append(Instance(id=iid, role=w.role, shape=w.shape.name,
                            gpus=list(gpus), trays=trays, dp=w.shape.dp, ep=w.shape.ep,
                            tp=w.shape.tp, pp=w.shape.pp,
                            stage_layers=stage_layers(inputs.model.spec.layers, w.shape.pp)
                            if w.shape.pp > 1 else [], max_batch=c.max_batch,
                            max_batched_tokens=c.max_batched_tokens,
                            gpu_memory_utilization=util, **fields))
        made += [ch.decision().model_copy(update={"path": f"instances.{iid}.{ch.path}"})
                 for ch in choices]
    return sorted(out, key=lambda i: parse_instance(i.id)), made


def _stage_needs(sol: Solution, role: str, shape: Shape, need: DomainMemory,
                 prefill_gpus: int) -> tuple[DomainMemory, ...]:
    """What each memory domain of an instance's GPUs holds, per pipeline stage (one stage
    without pipelining: the solver's `need`)."""
    if shape.pp > 1:
        return stage_domain_memory(sol.problem, role, shape, prefill_gpus)
    return (need,)


def _memory(sol: Solution, instances: list[Instance], g: nx.Graph) -> dict[str, DomainMemory]:
    wanted = {(w.role, w.shape.name): w for w in sol.wanted}
    prefill_gpus = sum(len(i.gpus) for i in instances if i.role == "prefill")
    out = {}
    for inst in instances:
        w = wanted[inst.role, inst.shape]
        stages = _stage_needs(sol, w.role, w.shape, w.need, prefill_gpus)
        for rank, gpu in enumerate(inst.gpus):
            held = stages[rank // w.shape.stage_gpus]
            for dom in graph.domains_of_gpu(g, gpu):
                out[dom] = held
    return dict(sorted(out.items(), key=lambda kv: natural(kv[0])))


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


def _engram(model: ModelInfo, instances: list[Instance], g: nx.Graph) -> list[EngramShard]:
    """HBM shards only: prefill's peer group (when the engine shares tables across instances)
    and each other instance's own ranks. Tables read from host memory have no shards."""
    if not model.engram_tables:
        return []
    prefill = [d for i in instances if i.role == "prefill" and i.engram == "hbm"
               for x in i.gpus for d in graph.domains_of_gpu(g, x)]
    out = _shards(model, prefill, "prefill") if prefill else []
    for inst in instances:
        if inst.role != "prefill" and inst.engram == "hbm":
            doms = [d for x in inst.gpus for d in graph.domains_of_gpu(g, x)]
            out += _shards(model, doms, inst.id)
    return out


def _pool(inputs: Inputs, host: dict[str, HostMemory],
          memory: dict[str, DomainMemory]) -> KvPool:
    """One DRAM segment per tray running engines (its size from the host budget), plus the
    prefill ranks' spare HBM where the store can take HBM segments (compiler.resolve)."""
    r = inputs.resolved
    if not r.kv_pool_dram.value:
        return KvPool(enabled=False, segments=[], total_gib=0.0)
    trays = sorted(host, key=natural)
    segs = [PoolSegment(kind="dram", location=t, gib=host[t].pool_gib) for t in trays]
    if r.kv_pool_hbm.value:
        segs += [PoolSegment(kind="hbm", location=d, gib=m.pool_gib)
                 for d, m in memory.items() if m.pool_gib > 0]
    return KvPool(enabled=True, segments=segs, total_gib=round(sum(s.gib for s in segs), 3))


def _solver(sol: Solution) -> SolverInfo:
    """Status, objective and gap of both phases, and of each per-rack placement model."""
    c, p = sol.counts, sol.placement
    racks = [RackSolve(domains=list(r.domains), status=r.status,
                       objective=round(r.objective, DECIMALS), bound=round(r.bound, DECIMALS),
                       gap=round(r.gap, 6)) for r in p.domains]
    return SolverInfo(
        status="OPTIMAL" if c.status == p.status == "OPTIMAL" else "FEASIBLE",
        objective=round(c.objective, DECIMALS), bound=round(c.bound, DECIMALS),
        seconds=round(c.deterministic_seconds + p.deterministic_seconds, 3),
        counts=PhaseSolve(status=c.status, objective=round(c.objective, DECIMALS),
                          bound=round(c.bound, DECIMALS),
                          gap=round(gap(c.objective, c.bound), 6),
                          seconds=c.deterministic_seconds),
        placement=PhaseSolve(status=p.status, objective=round(p.objective, DECIMALS),
                             bound=round(p.bound, DECIMALS),
                             gap=max((r.gap for r in racks), default=0.0),
                             seconds=p.deterministic_seconds),
        racks=racks,
        considered=[Considered(role=x.role, shape=x.shape.name, gpus=x.shape.gpus,
                               requests_per_s=round(x.requests_per_s, DECIMALS),
                               max_batch=x.max_batch, step_ms=round(x.step_us / 1e3, 3),
                               why_not=x.why_not) for x in sol.problem.candidates])


def lower(inputs: Inputs, g: nx.Graph, sol: Solution) -> Plan:
    """The plan without predictions (the perf model reads the plan's pool)."""
    model = _model(inputs)
    instances, made = _instances(inputs, sol, g)
    memory = _memory(sol, instances, g)
    hardware = _hardware(inputs, g)
    instances = deploy.with_rank_groups(hardware.trays, instances)
    host, trimmed = host_memory(inputs, instances)
    kv_pool = _pool(inputs, host, memory)
    route_groups, routed = _route_groups(inputs, g, instances, sol.problem.kept)
    r, spec = inputs.resolved, inputs.model.spec
    block = r.block_for(i.tp for i in instances)
    dynamo_run = release_run(inputs, "dynamo", r.engines.dynamo.worker.vllm.value, instances)
    site_plan = site.lower_site(r.site, spec, hardware, instances, kv_pool, r.host,
                                r.vllm_version, dynamo_run, r.engines,
                                expert_format=r.expert_format.value if spec.moe else None,
                                hybrid=functools.partial(r.hybrid_in, spec=spec))
    return Plan(
        inputs_digest=inputs.resolved.digest,
        # one group: this system's (a mixed fleet's group: compiler.fleet adds what the plan
        # holds for one system)
        hardware=Fleet(groups=[FleetGroup(name=inputs.hardware.metadata.name,
                                          hardware=hardware)]),
        model=model,
        serving=_serving(inputs, block.value),
        instances=instances,
        memory=memory,
        host_memory=host,
        engram_shards=_engram(model, instances, g),
        kv_pool=kv_pool,
        routing=Routing(policy=r.routing_policy.value, overlap_score_credit=r.overlap_score_credit,
                        block_size=block.value, groups=route_groups),
        solver=_solver(sol),
        predicted=None,
        decisions=sorted(decisions(inputs, sol, instances,
                                   [*made, *trimmed, *deploy.decisions(instances),
                                    _allocatable_decision(inputs), block.decision(), *routed])
                         + site.decisions(inputs, site_plan) + dynamo_run.decisions,
                         key=lambda d: d.path),
        site=site_plan,
        parsers=site.parsers(inputs.model_name),
    )


def _route_groups(inputs: Inputs, g: nx.Graph, instances: list[Instance],
                  kept: Iterable[Kept] = ()) -> tuple[list[RouteGroup], list[Decision]]:
    """The routing groups (compiler.routes), where there are several (each served by its own
    frontend and router), with the decision; a recompile's kept instances stay in the part
    (the Dynamo graph) that served them."""
    previous = {(graph.nvlink_domain_of(g, k.gpus[0]), graph.tray_of_gpu(g, k.gpus[0])): k.route
                for k in kept if k.route}
    found, _ = routes.of_instances(inputs, (
        (graph.nvlink_domain_of(g, i.gpus[0]), i.trays[0],
         (i.role, i.shape, i.max_batch, i.max_batched_tokens)) for i in instances), previous)
    if len(found) < 2:
        return [], []
    spans: dict[str, set[str]] = {}  # first tray -> every tray of the instances starting there
    for i in instances:
        spans.setdefault(i.trays[0], set()).update(i.trays)
    return [RouteGroup(name=r.name, domains=list(r.domains), cross_domain_share=r.cross,
                       trays=sorted({t for first in r.trays for t in spans[first]}, key=natural))
            for r in found], [routes.decision(found)]
