"""The plan's decision table: the chosen layout beside the best whole layout without each of
its shapes, and of the other serving mode (compiler/solve/layouts.py), each predicted by the
one prediction (compiler.prediction: the admission cap, the operating point, the SLO checks),
without the curve.

Rows are compared on goodput, P90 per-user rate and P90 TTFT: a row no other row matches or
beats on all three, and beats on one, is on the Pareto front. The chosen row is the plan's own
prediction (its pool as lowered); the other rows' prefix cache is the pool before the host
budget trims it per tray (compiler.perf.predict.pool_tokens), as the solver's candidates see it.
"""

from compiler import routes
from compiler.load import Inputs
from compiler.perf.routed import RouteLayout, union
from compiler.plan import LayoutGroup, LayoutOption, Predicted
from compiler.prediction import goodput, predict
from compiler.solve import Solution
from compiler.solve.layouts import Alternative, alternatives

_ORDER = {"prefill": 0, "decode": 1, "aggregated": 2}


def _row(inputs: Inputs, routes: list[RouteLayout], metrics: Predicted, available: int,
         chosen: bool) -> LayoutOption:
    layouts = union(routes)
    counts: dict[tuple[str, str], int] = {}
    for x in layouts:
        counts[x.role, x.shape.name] = counts.get((x.role, x.shape.name), 0) + x.count
    groups = [LayoutGroup(role=r, shape=s, count=n) for (r, s), n in
              sorted(counts.items(), key=lambda kv: (_ORDER[kv[0][0]], kv[0][1]))]
    return LayoutOption(
        mode="aggregated" if any(x.role == "aggregated" for x in layouts) else "disaggregated",
        instances=groups, gpus=sum(x.count * x.shape.gpus for x in layouts),
        goodput=goodput(inputs, routes, available),
        tokens_per_s_per_user_p50=metrics.tokens_per_s_per_user_p50,
        tokens_per_s_per_user_p90=metrics.tokens_per_s_per_user_p90,
        ttft_ms_p50=metrics.ttft_ms_p50, ttft_ms_p90=metrics.ttft_ms_p90,
        tpot_ms_p50=metrics.tpot_ms_p50, slo_met=all(c.met for c in metrics.slo),
        pareto=False, chosen=chosen, why="")


def _beats(a: LayoutOption, b: LayoutOption) -> bool:
    """`a` dominates `b`: as good on goodput, P90 rate and P90 TTFT, better on one."""
    ge = (a.goodput >= b.goodput, a.tokens_per_s_per_user_p90 >= b.tokens_per_s_per_user_p90,
          a.ttft_ms_p90 <= b.ttft_ms_p90)
    gt = (a.goodput > b.goodput, a.tokens_per_s_per_user_p90 > b.tokens_per_s_per_user_p90,
          a.ttft_ms_p90 < b.ttft_ms_p90)
    return all(ge) and any(gt)


def _why(row: LayoutOption, chosen: LayoutOption, alt: Alternative | None, searched: int,
         status: str) -> str:
    missed = "; misses the SLO at its operating point" if not row.slo_met else ""
    if alt is None:
        return (f"chosen: CP-SAT ({status}) maximised goodput at the SLO over every layout of "
                f"the {searched} candidates at once, then the spare supply among equal "
                f"goodputs{missed}")
    parts = [f"the best without {alt.without}"
             + ("" if alt.status == "OPTIMAL" else f" (CP-SAT {alt.status} within its limit)")]
    if row.goodput < chosen.goodput:
        less = 100 * (1 - row.goodput / chosen.goodput)
        parts.append(f"{less:.1f}% less goodput" if less >= 1 else f"{less:.2f}% less goodput")
    elif row.goodput == chosen.goodput:
        parts.append("the same goodput: the tie-break (more spare supply) chose the other")
    else:
        parts.append("more goodput by the prediction's arithmetic, less by the count "
                     "model's (its supplies are rounded down)")
    if row.tokens_per_s_per_user_p90 > chosen.tokens_per_s_per_user_p90:
        parts.append("faster per user at P90")
    if row.ttft_ms_p90 < chosen.ttft_ms_p90:
        parts.append("lower TTFT at P90")
    return "; ".join(parts) + missed


def layout_table(inputs: Inputs, sol: Solution, chosen_routes: list[RouteLayout],
                 chosen_metrics: Predicted, available: int) -> list[LayoutOption]:
    """The chosen row, then the others by goodput (then P90 TTFT, then shapes); none when
    the layout was pinned. Each row is predicted per routing group (compiler.routes), from
    the count model's split of its instances over the NVLink domains."""
    if sol.problem.mode == "pinned":
        return []
    chosen = _row(inputs, chosen_routes, chosen_metrics, available, True)
    rows: list[tuple[LayoutOption, Alternative | None]] = []
    cands = sol.problem.candidates
    for alt in alternatives(sol.problem, sol.counts):
        _, found = routes.of_instances(inputs, (
            (d, f"{d}/{i}.{k}", (c.role, c.shape.name, c.max_batch, c.max_batched_tokens))
            for d, here in alt.by_domain.items() for i, n in sorted(here.items())
            for k, c in enumerate([cands[i]] * n)))  # trays unknown: one unit per instance
        metrics = predict(inputs, found, available, with_curve=False)
        rows.append((_row(inputs, found, metrics, available, False), alt))
    rows.sort(key=lambda ra: (-ra[0].goodput, ra[0].ttft_ms_p90,
                              [(g.role, g.shape, g.count) for g in ra[0].instances]))
    table = [(chosen, None), *rows]
    searched = len(sol.problem.candidates)
    return [r.model_copy(update={"pareto": not any(_beats(q, r) for q, _ in table),
                                 "why": _why(r, chosen, alt, searched, sol.counts.status)})
            for r, alt in table]
