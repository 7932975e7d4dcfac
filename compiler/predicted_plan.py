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
from compiler.plan import Plan, Predicted
from compiler.solve import Solution


def predicted(inputs: Inputs, plan: Plan, available_gpus: int) -> Predicted:
    """The layout's one prediction (compiler.prediction); the prefix cache is the plan's pool
    (its DRAM segments after the host budget)."""
    from compiler import prediction

    pool = plan.kv_pool.total_gib if plan.kv_pool.enabled else None
    return prediction.predict(inputs, instance_layouts(plan.instances), available_gpus, pool)


def with_prediction(inputs: Inputs, sol: Solution, draft: Plan, g) -> Plan:
    """The draft with its prediction, balance note, layouts table and simulated run."""
    from compiler.balance import balance
    from compiler.layout_table import layout_table
    from compiler.simulate.runner import compile_run

    available = len(graph.available_gpus(g))
    layouts = instance_layouts(draft.instances)
    metrics = predicted(inputs, draft, available)
    if sol.problem.mode != "pinned":
        supply = {f"{c.role}:{c.shape.name}": c.requests_per_s for c in sol.problem.candidates}
        pool = draft.kv_pool.total_gib if draft.kv_pool.enabled else None
        why = balance(inputs, draft.instances, supply, sol.counts.objective, available,
                      layouts, pool)
        if why:
            metrics = metrics.model_copy(update={"balance": why})
    table = layout_table(inputs, sol, layouts, metrics, available)
    plan = draft.model_copy(update={"predicted": metrics, "solver": draft.solver.model_copy(
        update={"layouts": table})})
    return plan.model_copy(update={"predicted": metrics.model_copy(
        update={"simulated": compile_run(inputs, plan)})})
