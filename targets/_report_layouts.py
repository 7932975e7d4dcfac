"""The decision table of whole layouts (plan `solver.layouts`, compiler/layout_table.py), as
rows both the HTML report and performance.md render: the chosen layout first, the layouts it
beat after it, the Pareto front (goodput, P90 per-user rate, P90 TTFT) marked."""

from compiler.plan import LayoutOption, Plan

HEAD = ["mode", "instances", "GPUs", "goodput req/s", "tokens/s per user P90", "TTFT P90 ms",
        "TPOT P50 ms", "SLO", "Pareto", "why"]
NUMERIC = {2, 3, 4, 5, 6}
INTRO = ("The chosen layout beside the best whole layout without each of its shapes (and, where "
         "both were searched, the best of the other serving mode): each a re-solve of the count "
         "model, each predicted at its operating point by the same prediction as the plan. "
         "Pareto: no other row is as good on goodput, P90 per-user rate and P90 TTFT and better "
         "on one. Rows other than the chosen one see the pool before the host budget trims it.")


def _instances(row: LayoutOption) -> str:
    return " + ".join(f"{g.count} x {g.shape} {g.role}" for g in row.instances)


def rows(plan: Plan) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, a class per row: "chosen" or ""); a mixed fleet's rows name their group."""
    layouts = plan.solver.layouts
    many = len({r.group for r in layouts}) > 1
    out = []
    for r in layouts:
        out.append(([r.group or ""] if many else []) + [
            r.mode, _instances(r), str(r.gpus), f"{r.goodput:,.3f}",
            f"{r.tokens_per_s_per_user_p90:g}", f"{r.ttft_ms_p90:,.1f}", f"{r.tpot_ms_p50:g}",
            "met" if r.slo_met else "missed", "yes" if r.pareto else "", r.why])
    return (["group"] if many else []) + HEAD, out, ["chosen" if r.chosen else "" for r in layouts]


def markdown(plan: Plan) -> list[str]:
    if not plan.solver.layouts:
        return []
    head, body, _ = rows(plan)
    return ["", "## Layouts weighed", "", INTRO, "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in body)]
