"""The report's simulated section: `rackc compile`'s short request-by-request run
(plan.predicted.simulated) beside the closed-form figures, and where they disagree, in
report/performance.md and report/index.html (the rows: compiler.simulate.compare)."""

from html import escape

from compiler.plan import Plan
from compiler.simulate.compare import WHY, rows, start_up


def _caption(plan: Plan) -> str:
    s = plan.predicted.simulated
    return (f"{s.requests} requests ({s.workload} arrivals, routing `{s.policy}`, seed "
            f"{s.seed}) replayed request by request by `rackc simulate`, steady state only.")


def simulated_md(plan: Plan) -> list[str]:
    p = plan.predicted
    table = rows(p) if p is not None else []
    if not table:
        return []
    lines = ["", "## Simulated beside closed form", "", _caption(plan), "",
             "| metric | simulated | closed form | disagree (>10%) |", "|---|---|---|---|"]
    lines += [f"| {r.label} | {_num(r.simulated)} | {_num(r.closed)} | "
              f"{'yes' if r.disagrees else ''} |" for r in table]
    if p.simulated.disagrees:
        lines += ["", WHY[0].upper() + WHY[1:] + "."]
    short = start_up(p)
    if short:
        lines += ["", short[0].upper() + short[1:] + "."]
    return lines


def simulated_html(plan: Plan) -> list[str]:
    """The section's body: the table, and a warning naming the figures more than 10% apart."""
    p = plan.predicted
    table = rows(p) if p is not None else []
    if not table:
        return ["<p>No simulated run is recorded for the plan as a whole (a pinned "
                "prediction has none; a mixed fleet's compile records one per group, in "
                "<code>hardware.groups[].predicted.simulated</code>); <code>rackc simulate "
                "OUT/plan.yaml --deployment DEP</code> runs one over all of it.</p>"]
    out = [f"<p>{escape(_caption(plan))}</p>"]
    gone = [r.label for r in table if r.disagrees]
    if gone:
        out.append(f'<div class="warn"><b>Simulation and closed form disagree</b> (more than '
                   f"10% apart): {escape(', '.join(gone))}; {escape(WHY)}.</div>")
    else:
        out.append('<div class="ok">The simulation agrees with the closed form within 10% on '
                   "every figure both give.</div>")
    short = start_up(p)
    if short:
        out.append(f'<div class="warn"><b>A short run</b>: {escape(short)}.</div>')
    body = ["<table><thead><tr><th>metric</th><th>simulated</th><th>closed form</th>"
            "<th>disagree (&gt;10%)</th></tr></thead><tbody>"]
    for r in table:
        flag = '<td class="miss">yes</td>' if r.disagrees else "<td></td>"
        body.append(f"<tr><td>{escape(r.label)}</td><td class=\"n\">{_num(r.simulated)}</td>"
                    f"<td class=\"n\">{_num(r.closed)}</td>{flag}</tr>")
    return [*out, "".join(body) + "</tbody></table>"]


def _num(x: object) -> str:
    return "" if x is None else f"{x:g}"
