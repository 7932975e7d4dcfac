"""`report` target: the predicted-performance report of a plan (markdown, JSON, two plots)."""

import io
import json

from compiler.plan import Plan

ROLE_COLOURS = {"prefill": "#4C72B0", "decode": "#DD8452", "aggregated": "#55A868",
                None: "#E5E5E5"}
DOWN_COLOUR = "#333333"


def emit(plan: Plan) -> dict[str, str | bytes]:
    return {
        "report/performance.json": json.dumps(plan.predicted.model_dump(mode="json"),
                                              indent=2) + "\n",
        "report/performance.md": performance_md(plan),
        "report/curve.png": curve_png(plan),
        "report/rack.png": rack_png(plan),
    }


def performance_md(plan: Plan) -> str:
    p = plan.predicted.model_dump(mode="json")
    gpus = sum(len(i.gpus) for i in plan.instances)
    lines = [
        f"# {plan.serving.name}: predicted performance",
        "",
        f"{plan.model.name} on {plan.hardware.system} ({gpus} GPUs in use), solver "
        f"{plan.solver.status}, goodput {plan.solver.objective:g} requests/s.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    for key in ("tokens_per_s_per_user_p50", "tokens_per_s_per_user_p90", "ttft_ms_p50",
                "ttft_ms_p90", "tpot_ms_p50", "output_tokens_per_s_per_gpu",
                "total_tokens_per_s_per_gpu", "tokens_per_s_per_kw", "prefix_hit_rate"):
        lines.append(f"| {key} | {p[key]:g} |")
    lines += ["", "## Instances", "", "| id | role | shape | trays | max batch | GPU mem util |",
              "|---|---|---|---|---|---|"]
    for i in plan.instances:
        lines.append(f"| {i.id} | {i.role} | {i.shape} | {', '.join(i.trays)} | "
                     f"{i.max_batch} | {i.gpu_memory_utilization:.2f} |")
    lines += fallbacks_md(plan)
    for phase in ("decode", "prefill"):
        steps = p["breakdown"].get(phase, {})
        total = sum(steps.values()) or 1.0
        lines += ["", f"## {phase.capitalize()} step by operator", "", "| operator | us | share |",
                  "|---|---|---|"]
        for op, us in sorted(steps.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {op} | {us:,.1f} | {100 * us / total:.1f}% |")
    return "\n".join(lines) + "\n"


FALLBACK_SOURCES = ("rule:engine-capability", "rule:host-memory")


def fallbacks_md(plan: Plan) -> list[str]:
    """Where the plan departs from SYSTEM.md because the engines (or the tray's host memory)
    cannot do more: each distinct decision once, with the plan paths it covers."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for d in plan.decisions:
        if d.source in FALLBACK_SOURCES:
            rows.setdefault((d.source, d.value, d.why), []).append(d.path)
    if not rows:
        return []
    out = ["", "## Engine fallbacks", "", "| plan paths | value | source | why |",
           "|---|---|---|---|"]
    for (source, value, why), paths in rows.items():
        shown = ", ".join(paths[:3]) + (f" (+{len(paths) - 3})" if len(paths) > 3 else "")
        out.append(f"| {shown} | {value} | {source} | {why} |")
    return out


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    return buf.getvalue()


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # imported late: only plotting needs it

    return Figure(figsize=(width, height))


def curve_png(plan: Plan) -> bytes:
    pts = plan.predicted.model_dump(mode="json")["curve"]
    fig = _figure(6.4, 4.2)
    ax = fig.subplots()
    xs = [q["tokens_per_s_per_user_p50"] for q in pts]
    ys = [q["total_tokens_per_s_per_gpu"] for q in pts]
    ax.plot(xs, ys, marker="o", color=ROLE_COLOURS["decode"])
    for q in pts:
        ax.annotate(f"b{q['batch']}", (q["tokens_per_s_per_user_p50"],
                                       q["total_tokens_per_s_per_gpu"]), fontsize=7)
    ax.set_xlabel("tokens/s per user (P50)")
    ax.set_ylabel("total tokens/s per GPU")
    ax.set_title(f"{plan.serving.name}: throughput vs interactivity")
    ax.grid(True, alpha=0.3)
    fig.subplots_adjust(left=0.15, right=0.97, bottom=0.12, top=0.92)
    return _png(fig)


def rack_png(plan: Plan) -> bytes:
    """Trays as rows, GPUs as columns, each GPU split into its memory domains (one cell
    each), coloured by the role of the instance using it (dark: unavailable, grey: idle)."""
    from matplotlib.colors import to_rgb

    role_of = {g: i.role for i in plan.instances for g in i.gpus}
    label_of = {i.gpus[0]: i.id for i in plan.instances}
    trays = plan.hardware.trays
    per, doms = plan.hardware.gpus_per_tray, plan.hardware.domains_per_gpu
    down = set(plan.hardware.unavailable_gpus)
    cells = [[to_rgb(DOWN_COLOUR if g in down else ROLE_COLOURS[role_of.get(g)])
              for g in tray.gpus for _ in range(doms)] for tray in trays]
    fig = _figure(1.6 + 1.1 * per, 1.0 + 0.3 * len(trays))
    ax = fig.add_axes((0.14, 0.04, 0.84, 0.88))
    ax.imshow(cells, aspect="auto", interpolation="nearest", extent=(0, per, len(trays), 0))
    for x in range(1, per * doms):
        ax.axvline(x / doms, color="white", linewidth=2 if x % doms == 0 else 0.6,
                   linestyle="-" if x % doms == 0 else ":")
    for row, tray in enumerate(trays):
        ax.axhline(row, color="white", linewidth=1)
        for col, gpu in enumerate(tray.gpus):
            if gpu in label_of:
                ax.text(col + 0.05, row + 0.65, label_of[gpu], fontsize=6, color="white")
    ax.set_yticks([r + 0.5 for r in range(len(trays))], [t.id for t in trays], fontsize=6)
    ax.set_xticks([c + 0.5 for c in range(per)], [f"g{c}" for c in range(per)], fontsize=7)
    ax.xaxis.tick_top()
    ax.set_title(f"{plan.hardware.system}: role per GPU and memory domain", fontsize=9, pad=14)
    return _png(fig)
