"""Pass 6: the draft plan with its one prediction.

`lower` builds the plan without `predicted`; this pass adds what the layout predicts
(compiler.prediction), the balance note where the solver's supply and the operating point part
(compiler.balance), the table of layouts considered (compiler.layout_table) and the
compile-time simulated run (compiler.simulate.runner). It reads the inputs, the solution and
the draft only.
"""

from compiler import graph
from compiler.load import Inputs
from compiler.perf.predict import instance_layouts
from compiler.perf.routed import RouteLayout
from compiler.plan import Plan, Predicted, Routing
from compiler.solve import Solution


def predicted(inputs: Inputs, plan: Plan, available_gpus: int) -> Predicted:
    """The layout's one prediction (compiler.prediction), each routing group of it
    (compiler.routes) on its own; the prefix cache is the plan's pool (its DRAM segments
    after the host budget)."""
    from compiler import prediction, routes

    pool = plan.kv_pool.total_gib if plan.kv_pool.enabled else None
    return prediction.predict(inputs, routes.of_plan(inputs, plan)[1], available_gpus, pool)


def with_prediction(inputs: Inputs, sol: Solution, draft: Plan, g) -> Plan:
    """The draft with its prediction, balance note, layouts table, its routing groups' rates
    and the simulated run."""
    from compiler import routes
    from compiler.balance import balance
    from compiler.layout_table import layout_table
    from compiler.simulate.runner import compile_run

    available = len(graph.available_gpus(g))
    layouts = instance_layouts(draft.instances)
    found = routes.of_plan(inputs, draft)[1]
    metrics = predicted(inputs, draft, available)
    if sol.problem.mode != "pinned" and len(found) == 1 and found[0].count == 1:
        supply = {f"{c.role}:{c.shape.name}": c.requests_per_s for c in sol.problem.candidates}
        pool = draft.kv_pool.total_gib if draft.kv_pool.enabled else None
        why = balance(inputs, draft.instances, supply, sol.counts.objective, available,
                      layouts, pool, found[0].cross)
        if why:
            metrics = metrics.model_copy(update={"balance": why})
    table = layout_table(inputs, sol, found, metrics, available)
    plan = draft.model_copy(update={
        "predicted": metrics, "routing": _route_rates(inputs, draft, available),
        "solver": draft.solver.model_copy(update={"layouts": table})})
    return plan.model_copy(update={"predicted": metrics.model_copy(
        update={"simulated": compile_run(inputs, plan)})})


def _route_rates(inputs: Inputs, plan: Plan, available: int) -> Routing:
    """The plan's routing with what each routing group sustains (its admission cap): the
    share of the traffic its frontend should get."""
    from compiler.prediction import goodput

    if not plan.routing.groups:
        return plan.routing
    rates: dict[RouteLayout, float] = {}
    out = []
    for group in plan.routing.groups:
        mine = [i for i in plan.instances if plan.route_of(i) == group.name]
        key = RouteLayout(tuple(instance_layouts(mine)), group.cross_domain_share)
        if key not in rates:
            rates[key] = goodput(inputs, [key], available)
        out.append(group.model_copy(update={"requests_per_s": rates[key]}))
    return plan.routing.model_copy(update={"groups": out})
