"""Mixed fleets: one plan from the plans of a Cluster's groups, each solved on its own system.

Every group is planned as a one-system cluster (its own candidates, counts, placement and perf
model), so no instance straddles groups. Racks, NVLink domains and instances are numbered on
across the groups in order (group 2's first rack follows group 1's last): each group is built
with its rack and NVLink offsets (`Inputs.offsets`) and lowered with the instance numbers the
groups before it used, so its plan already has the fleet's ids and merging renames nothing.
One Mooncake pool (every group's segments) spans the fleet, whose KV blocks move between
groups, so the groups must agree on the block size and the KV cache dtype; each group is served
by its own routers (its routing groups, compiler.routes: `Plan.routes`).
"""

from collections import Counter

from compiler import routes, site
from compiler.ids import natural
from compiler.load import Inputs
from compiler.plan import (
    CurvePoint,
    Decision,
    EngineRun,
    Fleet,
    KvPool,
    PhaseSolve,
    Plan,
    Predicted,
    RouteGroup,
    Routing,
    SolverInfo,
)
from compiler.solve.params import gap
from compiler.solve.problem import DECIMALS
from schemas.diagnostics import CompileError, Diagnostic


def merge(fleet: tuple[Inputs, ...], plans: list[Plan]) -> Plan:
    """The fleet's plan from each group's (in the Cluster's order), whose ids are already the
    fleet's (each group was built and lowered with the offsets of those before it)."""
    _check_shared(fleet, plans)
    names = [i.hardware.metadata.name for i in fleet]
    first = plans[0]
    # each group's own: what its one-system plan held for the whole plan
    groups = [p.hardware.groups[0].model_copy(update={
        "serving": p.serving, "predicted": p.predicted,
        "host_reserved_gib": p.site.host_reserved_gib}) for p in plans]
    instances = sorted((i.model_copy(update={"group": n})
                        for n, p in zip(names, plans, strict=True) for i in p.instances),
                       key=lambda i: natural(i.id))
    segments = [s for p in plans for s in p.kv_pool.segments]
    pool = KvPool(enabled=any(p.kv_pool.enabled for p in plans), segments=segments,
                  total_gib=round(sum(p.kv_pool.total_gib for p in plans), 3))
    # a new Plan, not first.model_copy: the copy would keep first's cached lookups (its trays)
    return Plan(**{**dict(first), **{
        "hardware": Fleet(groups=groups),
        "instances": instances,
        "memory": dict(sorted(((k, v) for p in plans for k, v in p.memory.items()),
                              key=lambda kv: natural(kv[0]))),
        "host_memory": dict(sorted(((k, v) for p in plans for k, v in p.host_memory.items()),
                                   key=lambda kv: natural(kv[0]))),
        "engram_shards": [s.model_copy(update={"group": f"prefill-{n}"}) if s.group == "prefill"
                          else s for n, p in zip(names, plans, strict=True)
                          for s in p.engram_shards],  # one prefill peer group per group
        "kv_pool": pool,
        "routing": _routing(fleet, plans, names),
        "solver": _solver([p.solver for p in plans], names),
        "predicted": _predicted(fleet, plans),
        "decisions": _decisions(names, plans),
        "site": first.site.model_copy(update={  # the deployment's site, every group's pods
            "pods": sorted((pod for p in plans for pod in p.site.pods),
                           key=lambda pod: pod.instance),
            "mooncake_segment_bytes": dict(sorted(
                ((k, v) for p in plans for k, v in p.site.mooncake_segment_bytes.items()),
                key=lambda kv: natural(kv[0]))),
            # one timeout for every engine: the slowest group's cold start
            "model_cache": max((p.site.model_cache for p in plans),
                               key=lambda c: c.engine_ready_timeout_s),
            "engines": _engines(plans),
            **_security(plans)}),
    }})


def _security(plans: list[Plan]) -> dict:
    """Every kind of pod some group runs (an HGX group's engines register no RDMA memory where
    an NVL72 group's do), and the namespace's level that admits them all."""
    kinds = dict(sorted((k, v) for p in plans for k, v in p.site.security.items()))
    return {"security": kinds, "pod_security_level": site.pod_security_level(kinds)}


def _routing(fleet: tuple[Inputs, ...], plans: list[Plan], names: list[str]) -> Routing:
    """The fleet's routers: each group's routing groups (compiler.routes) where a group has
    several, named `<group>-<routing group>`, the others one group each, named after it; none
    listed where no group has several (each group is then one router: `Plan.routes`)."""
    first = plans[0].routing
    if not any(p.routing.groups for p in plans):
        return first
    groups = []
    for inputs, plan, name in zip(fleet, plans, names, strict=True):
        if plan.routing.groups:  # named after their group: two groups may both have `all-1`
            groups += [g.model_copy(update={"name": f"{name}-{g.name}"})
                       for g in plan.routing.groups]
            continue
        found = routes.of_plan(inputs, plan)[0]
        groups.append(RouteGroup(
            name=name, domains=sorted({t.nvlink_domain for t in plan.hardware.trays},
                                      key=natural),
            cross_domain_share=found[0].cross,
            requests_per_s=plan.solver.objective))  # its goodput, as each routing group's
    _check_route_names(fleet, groups, names)
    return first.model_copy(update={"groups": groups})


def _check_route_names(fleet: tuple[Inputs, ...], groups: list[RouteGroup],
                       names: list[str]) -> None:
    """Each router names one Dynamo graph (`<deployment>-<router>`): a fleet group named like
    another group's routing group (`<group>-nvl0`, `<group>-shared`, ...) would merge both."""
    clash = sorted(n for n, k in Counter(g.name for g in groups).items() if k > 1)
    if clash:
        j = names.index(clash[0]) if clash[0] in names else 0
        src = fleet[j].sources["hardware"]  # the group's own view of the cluster file
        pos = src.locate(("spec", "name"))
        raise CompileError([Diagnostic(
            "error", "E210", src.file, pos.line, pos.column, f"spec.groups[{j}].name",
            "a group name that no routing group of another group has (each router is one "
            "Dynamo graph, named after it)", f"{clash[0]!r}, also a routing group's name",
            "rename the group (a group's routing groups are named `<group>-<routing group>`: "
            "`<group>-nvl<k>`, `<group>-shared`, `<group>-all` and their parts "
            "`...-<k>`)")])


def _engines(plans: list[Plan]) -> dict[str, EngineRun]:
    """Each target's release over the fleet: every group's own kernels, the first refusal."""
    first = plans[0].site.engines
    return {target: run.model_copy(update={
        "refused": next((p.site.engines[target].refused for p in plans
                         if p.site.engines[target].refused), None),
        "kernels": sorted((k for p in plans for k in p.site.engines[target].kernels),
                          key=lambda k: natural(k.instance))}) for target, run in first.items()}


def _check_shared(fleet: tuple[Inputs, ...], plans: list[Plan]) -> None:
    """What the pool, the router and KV transfer between groups need the groups to share."""
    first = plans[0]
    for inputs, plan in zip(fleet[1:], plans[1:], strict=True):
        for what, a, b in (("block_size", first.serving.block_size, plan.serving.block_size),
                           ("kv_cache_dtype", first.serving.kv_cache_dtype,
                            plan.serving.kv_cache_dtype)):
            if a != b:
                src = inputs.sources["deployment"]
                pos = src.locate(("spec", "serving", what))
                raise CompileError([Diagnostic(
                    "error", "E210", src.file, pos.line, pos.column, f"spec.serving.{what}",
                    f"one {what} for every group (KV blocks move between groups)",
                    f"{a} on {fleet[0].system.name}, {b} on {inputs.system.name}",
                    f"set serving.{what} to a value both systems' kernels take")])
        if plan.model != first.model:
            src = inputs.sources["hardware"]
            raise CompileError([Diagnostic(
                "error", "E210", src.file, 1, 1, "spec.groups",
                "groups that serve the model in one format",
                f"{first.model.expert_format} on {fleet[0].system.name}, "
                f"{plan.model.expert_format} on {inputs.system.name}",
                "set serving.checkpoint so that every group loads the same weights")])


def _solver(infos: list[SolverInfo], names: list[str]) -> SolverInfo:
    """Goodputs add up (each group serves its own share); the worst status and gap hold; the
    candidates weighed are each group's, named by group."""
    def phase(ps: list[PhaseSolve]) -> PhaseSolve:
        obj, bound = sum(p.objective for p in ps), sum(p.bound for p in ps)
        return PhaseSolve(status=_status(p.status for p in ps),
                          objective=round(obj, DECIMALS), bound=round(bound, DECIMALS),
                          gap=max(p.gap for p in ps),
                          seconds=round(sum(p.seconds for p in ps), 3))
    counts, placement = phase([s.counts for s in infos]), phase([s.placement for s in infos])
    counts = counts.model_copy(update={"gap": round(gap(counts.objective, counts.bound), 6)})
    return SolverInfo(status=_status(s.status for s in infos),
                      objective=round(sum(s.objective for s in infos), DECIMALS),
                      bound=round(sum(s.bound for s in infos), DECIMALS),
                      seconds=round(sum(s.seconds for s in infos), 3), counts=counts,
                      placement=placement, racks=[r for s in infos for r in s.racks],
                      considered=[c.model_copy(update={"group": n})
                                  for s, n in zip(infos, names, strict=True)
                                  for c in s.considered],
                      layouts=[x.model_copy(update={"group": n})
                               for s, n in zip(infos, names, strict=True) for x in s.layouts])


def _status(statuses) -> str:
    return "OPTIMAL" if all(s == "OPTIMAL" for s in statuses) else "FEASIBLE"


def _predicted(fleet: tuple[Inputs, ...], plans: list[Plan]) -> Predicted | None:
    """The fleet's metrics from its groups': rates add up, per-GPU and per-kW figures are the
    fleet totals over its GPUs and power, the prefix hit rate and prefill utilisation are
    weighted by requests; percentiles are the worst group's (the fleet's own percentile lies
    between the groups'), so they bound it. Each group's own prediction is in its group."""
    ps = [p.predicted for p in plans]
    if any(p is None for p in ps):
        return None
    gpus = [sum(len(i.gpus) for i in p.instances) for p in plans]
    kw = [n * i.system.gpu.power_w.value / 1000
          for n, i in zip(gpus, fleet, strict=True)]
    rps = [p.requests_per_s for p in ps]

    def per_gpu(field: str) -> float:
        return round(sum(getattr(p, field) * n for p, n in zip(ps, gpus, strict=True))
                     / max(sum(gpus), 1), 3)

    def by_requests(field: str) -> float:
        return round(sum(getattr(p, field) * r for p, r in zip(ps, rps, strict=True))
                     / max(sum(rps), 1e-9), 4)

    names = [i.hardware.metadata.name for i in fleet]
    return Predicted(
        output_tokens_per_s_per_gpu=per_gpu("output_tokens_per_s_per_gpu"),
        total_tokens_per_s_per_gpu=per_gpu("total_tokens_per_s_per_gpu"),
        tokens_per_s_per_user_p50=min(p.tokens_per_s_per_user_p50 for p in ps),
        tokens_per_s_per_user_p90=min(p.tokens_per_s_per_user_p90 for p in ps),
        ttft_ms_p50=max(p.ttft_ms_p50 for p in ps),
        ttft_ms_p90=max(p.ttft_ms_p90 for p in ps),
        tpot_ms_p50=max(p.tpot_ms_p50 for p in ps),
        prefix_hit_rate=by_requests("prefix_hit_rate"),
        tokens_per_s_per_kw=round(sum(p.tokens_per_s_per_kw * k for p, k in
                                      zip(ps, kw, strict=True)) / max(sum(kw), 1e-9), 3),
        instances=[g for p in ps for g in p.instances],
        breakdown={f"{n}/{k}": v for n, p in zip(names, ps, strict=True)
                   for k, v in p.breakdown.items()},
        requests_per_s=round(sum(rps), 4),
        prefill_utilisation=by_requests("prefill_utilisation"),
        curve=_curve(ps, gpus),
        slo=[c for p in ps for c in p.slo],
    )


def _curve(ps: list[Predicted], gpus: list[int]) -> list[CurvePoint]:
    """At each decode batch every group reaches: throughput over the fleet's GPUs, the slowest
    group's tokens per user."""
    by_batch = [{c.batch: c for c in p.curve} for p in ps]
    common = sorted(set.intersection(*(set(b) for b in by_batch)))
    total = max(sum(gpus), 1)
    return [CurvePoint(
        batch=b,
        tokens_per_s_per_user_p50=min(c[b].tokens_per_s_per_user_p50 for c in by_batch),
        tokens_per_s_per_user_p90=min(c[b].tokens_per_s_per_user_p90 for c in by_batch),
        output_tokens_per_s_per_gpu=round(sum(c[b].output_tokens_per_s_per_gpu * n for c, n in
                                              zip(by_batch, gpus, strict=True)) / total, 3),
        total_tokens_per_s_per_gpu=round(sum(c[b].total_tokens_per_s_per_gpu * n for c, n in
                                             zip(by_batch, gpus, strict=True)) / total, 3))
        for b in common]


# Decisions about one instance or one tray: their ids are the fleet's, so their paths are too.
_OWN_PATHS = ("instances.", "kv_pool.segments.")


def _decisions(names: list[str], plans: list[Plan]) -> list[Decision]:
    """Every group's decisions, none dropped: those about an instance or a tray under their
    own path, the group's settings under `groups.<group>.` (rackc explain finds them by
    the plain path too)."""
    out = [d if d.path.startswith(_OWN_PATHS)
           else d.model_copy(update={"path": f"groups.{n}.{d.path}"})
           for n, p in zip(names, plans, strict=True) for d in p.decisions]
    return sorted([*out, ROUTING], key=lambda d: d.path)


# Each group is routed on its own: targets/dynamo.py emits a graph per group, whose frontend
# discovers only that group's workers (compiler.preflight says how to split traffic).
ROUTING = Decision(
    path="routing.groups", value="one frontend and router per group", source="rule:mixed-fleet",
    why="each group is solved and predicted with its own prefill and decode instances, so each "
        "is served by its own: the Dynamo operator gives every DynamoGraphDeployment its own "
        "Dynamo namespace (deploy/operator/internal/dynamo/graph.go GetDynamoNamespace), and "
        "rackc emits one graph per group, and in lws/ one vllm-router per group whose selectors "
        "name its group (rackc.dev/group), so no request is prefilled in one group and decoded "
        "in another")
