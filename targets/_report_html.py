"""report/index.html: the report people open. One self-contained file (inline CSS and SVG, no
script, font or request at view time), its sections in the order a reader needs them:
warnings and assumptions, the decision, the simulated run beside the closed form, the rack
map, memory per die, the curve, why each decision, and the step breakdown."""

from collections.abc import Set as AbstractSet
from html import escape

from compiler.plan import Plan, Predicted
from targets import _report_layouts as layouts
from targets import _report_memory as memory
from targets._report_curve import curve_svg
from targets._report_rack import legend_html, rack_svg
from targets._report_text import assumptions, balance_sentence, fallbacks
from targets._simulated import simulated_html

TOP_PER_ROLE = 4  # candidates shown beside the chosen ones, per role
SECTIONS = ("warnings", "decision", "simulated", "rack", "memory", "curve", "explain", "breakdown")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;margin:0;
background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid
#ddd;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.summary{color:#444;margin:0 0 12px}
table{border-collapse:collapse;margin:6px 0 12px;background:#fff}
table{max-width:100%}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.w{overflow-wrap:anywhere;min-width:8em}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.miss{color:#a31515;font-weight:600}.met{color:#1d6b2f}
.warn{background:#fff4e5;border-left:4px solid #e69500;padding:6px 10px;margin:6px 0}
.bad{background:#fdecea;border-left:4px solid #c44e52;padding:6px 10px;margin:6px 0}
.ok{background:#eef7ee;border-left:4px solid #55a868;padding:6px 10px;margin:6px 0}
code{font:12px "DejaVu Sans Mono",Menlo,Consolas,monospace;background:#f0f0f0;padding:0 3px}
.legend{list-style:none;padding:0;margin:6px 0;display:flex;flex-wrap:wrap;gap:4px 18px}
.swatch{display:inline-block;width:14px;height:14px;margin-right:6px;vertical-align:-2px;
position:relative;border:1px solid #bbb}
.swatch .dot{position:absolute;left:4px;top:4px;width:6px;height:6px;border-radius:3px;
background:#fff}.swatch .stripe{position:absolute;left:0;bottom:0;width:14px;height:4px;
background:#8172B3}.swatch.split{background:linear-gradient(90deg,#DD8452 45%,#fff 45%,#fff 55%,
#DD8452 55%)}
.figure{overflow-x:auto;background:#fff;border:1px solid #ddd;padding:8px}
tr.chosen td{background:#eef3fb;font-weight:600}
details summary{cursor:pointer;color:#335}
"""


def _table(head: list[str], rows: list[list[str]], numeric: AbstractSet[int] = frozenset(),
           classes: list[str] | None = None, wrap: AbstractSet[int] = frozenset()) -> str:
    """An HTML table; cells are escaped here. Cells of the `wrap` columns break anywhere (long
    values, image names), so that the table stays within the page."""
    out = ["<table><thead><tr>", *(f"<th>{escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for k, row in enumerate(rows):
        cls = f' class="{classes[k]}"' if classes and classes[k] else ""
        out.append(f"<tr{cls}>" + "".join(
            f'<td class="n">{escape(c)}</td>' if j in numeric else
            f'<td class="w">{escape(c)}</td>' if j in wrap else f"<td>{escape(c)}</td>"
            for j, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _section(key: str, title: str, body: list[str]) -> str:
    return f'<section id="{key}"><h2>{escape(title)}</h2>' + "".join(body) + "</section>"


def _warnings(plan: Plan) -> list[str]:
    out = []
    checks = plan.prediction.slo
    for c in checks:
        if not c.met:
            bound = "at least" if c.field.startswith("slo.tokens") else "at most"
            out.append(f'<div class="bad"><b>SLO missed</b>: {escape(c.field)} is predicted '
                       f"at {c.predicted:g}; the deployment asks for {bound} {c.target:g}."
                       "</div>")
    if checks and all(c.met for c in checks):
        out.append('<div class="ok">The prediction meets every SLO the deployment sets.</div>')
    if not checks:
        out.append('<div class="warn">The plan records no SLO check.</div>')
    if plan.notices:
        out.append("<h3>Before you deploy (W901)</h3>")
        out.append(_table(["folder", "input", "what", "what to do"],
                          [[f"{n.target}/", n.path, n.problem, n.hint] for n in plan.notices],
                          wrap={2, 3}))
    rows = fallbacks(plan)
    if rows:
        out.append("<h3>Engine fallbacks</h3><p>Where the plan departs from the usual layout "
                   "because the pinned engines (or the tray's host memory) cannot do more.</p>")
        out.append(_table(["plan paths", "value", "source", "why"], rows, wrap={1, 3}))
    rows = assumptions(plan)
    if rows:
        out.append("<h3>Assumptions that move the prediction</h3><p>Values without a public "
                   "source; the prediction follows them. Set them in the deployment where you "
                   "know better.</p>")
        out.append(_table(["plan path", "value", "source", "why"], rows, wrap={1, 3}))
    return out


def _slo_rows(plan: Plan) -> list[list[str]]:
    p = plan.prediction
    check = {c.field.removeprefix("slo."): c for c in p.slo}
    rows = []
    for key in ("tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90", "ttft_ms_p50",
                "ttft_ms_p90", "tpot_ms_p50"):
        c = check.get(key)
        rows.append([key, f"{getattr(p, key):g}", "" if c is None else f"{c.target:g}",
                     "" if c is None else "met" if c.met else "missed"])
    return rows


def _decision(plan: Plan) -> list[str]:
    p, s = plan.prediction, plan.solver
    gpus = sum(len(i.gpus) for i in plan.instances)
    mode = "disaggregated (prefill and decode instances)" if plan.disaggregated \
        else "aggregated (each instance prefills and decodes)"
    out = [f"<p>Chosen: <b>{escape(mode)}</b> on {gpus} GPUs, goodput "
           f"<b>{s.objective:g} requests/s</b> at the SLO; CP-SAT status {escape(s.status)} "
           f"(bound {s.bound:g}) over the candidates below.</p>"]
    why = balance_sentence(p.balance)
    if why:
        out.append(f"<p>{escape(why)}</p>")
    out.append("<h3>The chosen layout</h3>")
    groups = _by_group(plan)
    named = groups[0][0] is not None
    out.append(_table((["group"] if named else []) + ["role", "shape", "instances", "GPUs",
                                                      "batch per rank", "step ms"],
                      [([name or ""] if named else []) + [
                          g.role, g.shape, str(g.count), str(g.gpus),
                          "" if g.batch is None else f"{g.batch:g}",
                          f"{(g.decode_step_us or g.prefill_step_us or 0) / 1e3:,.1f}"]
                       for name, pred in groups for g in pred.instances],
                      {k + named for k in (2, 3, 4, 5)}))
    rows = _slo_rows(plan)
    classes = ["miss" if r[3] == "missed" else "" for r in rows]
    out.append(_table(["metric", "predicted", "SLO", ""], rows, {1, 2}, classes))
    out += _isolated(plan)
    out += _layouts(plan)
    out += _considered(plan)
    return out


def _isolated(plan: Plan) -> list[str]:
    """Each pinned operating point's role alone (plan.prediction.isolated)."""
    rows = plan.prediction.isolated
    if not rows:
        return []
    return ["<h3>Phase-isolated</h3>", f"<p>{escape(rows[0].HEADING)}.</p>",
            "<ul>", *(f"<li>{escape(r.summary())}</li>" for r in rows), "</ul>"]


def _by_group(plan: Plan) -> list[tuple[str | None, Predicted]]:
    """(group, its prediction) per group of a mixed fleet; else (None, the plan's)."""
    if plan.mixed:
        return [(g.name, g.predicted) for g in plan.hardware.groups if g.predicted is not None]
    return [(None, plan.prediction)]


def _layouts(plan: Plan) -> list[str]:
    if not plan.solver.layouts:
        return []
    head, body, classes = layouts.rows(plan)
    shift = len(head) - len(layouts.HEAD)
    return ["<h3>Layouts weighed</h3>", f"<p>{escape(layouts.INTRO)}</p>",
            _table(head, body, {k + shift for k in layouts.NUMERIC}, classes,
                   {len(head) - 1})]


def _considered(plan: Plan) -> list[str]:
    """The candidates the counts phase weighed, best per GPU first within each role: the
    chosen and the next best `TOP_PER_ROLE` in view, the rest folded."""
    considered = plan.solver.considered
    if not considered:
        return []
    chosen = {(name, g.role, g.shape): g.count for name, p in _by_group(plan)
              for g in p.instances}
    many = len({c.group for c in considered}) > 1
    order = {"prefill": 0, "decode": 1, "aggregated": 2}
    ranked = sorted(considered, key=lambda c: (c.group or "", order[c.role],
                                               -c.requests_per_s / c.gpus, c.shape))
    top: tuple[list, list] = ([], [])  # rows, their classes
    rest: tuple[list, list] = ([], [])
    seen: dict[tuple, int] = {}  # shown per (group, role), besides the chosen
    for c in ranked:
        n = chosen.get((c.group, c.role, c.shape), 0)
        state = f"chosen x{n}" if n else ("usable" if not c.why_not else f"no: {c.why_not}")
        row = ([c.group or ""] if many else []) + [
            c.role, c.shape, str(c.gpus), f"{c.requests_per_s:.3f}",
            f"{c.requests_per_s / c.gpus:.3f}", str(c.max_batch), f"{c.step_ms:,.2f}", state]
        others = seen.setdefault((c.group, c.role), 0)
        shown = n or others < TOP_PER_ROLE
        if not n and shown:
            seen[c.group, c.role] = others + 1
        target = top if shown else rest
        target[0].append(row)
        target[1].append("chosen" if n else "")
    modes = sorted({c.role for c in considered})
    head = (["group"] if many else []) + ["role", "shape", "GPUs", "req/s per instance",
                                          "req/s per GPU", "max batch", "step ms", ""]
    nums = {k + many for k in (2, 3, 4, 5, 6)}
    out = ["<h3>Engine shapes considered</h3>",
           f"<p>Every engine shape the solver weighed (roles: {escape(', '.join(modes))}), "
           "what one instance sustains at the SLO, and why a shape could not serve; the "
           "solver chose the counts of these that maximise goodput on the GPUs there are. "
           f"Shown: the chosen shapes and the {TOP_PER_ROLE} next best per GPU of each role."
           "</p>", _table(head, top[0], nums, top[1])]
    if rest[0]:
        out += [f"<details><summary>{len(rest[0])} more candidates</summary>",
                _table(head, rest[0], nums, rest[1]), "</details>"]
    return out


def _explain(plan: Plan) -> list[str]:
    rows = [[d.path, d.value, d.source, d.why] for d in plan.decisions]
    return ["<p>Every decision in the plan, with its source (user, default, catalog, solver, "
            "rule) and why; <code>rackc explain OUT/plan.yaml PATH</code> prints the same.</p>",
            f"<details><summary>{len(rows)} decisions (open to read)</summary>",
            _table(["plan path", "value", "source", "why"], rows, wrap={1, 3}), "</details>"]


def _breakdown(plan: Plan) -> list[str]:
    out = ["<details><summary>each phase's step time, operator by operator</summary>"]
    for phase, steps in plan.prediction.breakdown.items():
        total = sum(steps.values()) or 1.0
        out.append(f"<h3>{escape(phase)} step by operator</h3>")
        out.append(_table(["operator", "us", "share"],
                          [[op, f"{us:,.1f}", f"{100 * us / total:.1f}%"]
                           for op, us in sorted(steps.items(), key=lambda kv: -kv[1])], {1, 2}))
    return [*out, "</details>"]


def index_html(plan: Plan) -> str:
    p = plan.prediction
    gpus = sum(len(i.gpus) for i in plan.instances)
    rack, _ = rack_svg(plan)
    dies, _ = memory.die_svg(plan)
    host = memory.host_svg(plan)
    curve, _ = curve_svg(plan)
    memory_body = ["<h3>HBM per memory domain</h3>", memory.legend_html(memory.DIE_PARTS),
                   f'<div class="figure">{dies}</div>']
    if host is not None:
        memory_body += ["<h3>Host memory per tray</h3>", memory.legend_html(memory.HOST_PARTS),
                        f'<div class="figure">{host[0]}</div>']
    sections = [
        _section("warnings", "Warnings and assumptions", _warnings(plan)),
        _section("decision", "The decision", _decision(plan)),
        _section("simulated", "Simulated beside closed form", simulated_html(plan)),
        _section("rack", "Rack map", [
            "<p>Hover a GPU for its instance, rank and memory; a tray's violet bar for its "
            "pool segment.</p>", legend_html(plan), f'<div class="figure">{rack}</div>']),
        _section("memory", "Memory per die", memory_body),
        _section("curve", "Throughput and interactivity", [
            "<p>Each point is one decode batch per rank (b1, b2, ...); the solid line is the "
            "median user's tokens/s, the dashed one the 90th percentile's (the slower tail), "
            "against the SLO lines. The rings are the plan's operating point.</p>",
            f'<div class="figure">{curve}</div>']),
        _section("explain", "Why each decision", _explain(plan)),
        _section("breakdown", "Step time by operator", _breakdown(plan)),
    ]
    title = f"{plan.serving.name}: rackc report"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{escape(title)}</h1><p class=\"summary\">{escape(plan.model.name)} on "
            f"{escape(plan.hardware.system)}: {gpus} GPUs in use, {len(plan.instances)} "
            f"instances, goodput {plan.goodput:g} requests/s, "
            f"{p.total_tokens_per_s_per_gpu:g} tokens/s per GPU.</p>"
            + "".join(sections) + "</main></body></html>\n")
