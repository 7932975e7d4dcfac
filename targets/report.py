"""`report` target: the predicted-performance report of a plan (markdown, JSON, two plots)."""

import io
import json

from compiler.plan import Plan
from compiler.preflight import notices

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
        *_assumed_model_lines(plan),
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
    lines += before_you_deploy_md(plan)
    lines += _balance_lines(p.get("balance"))
    grouped = [k for k in p["breakdown"] if "/" in k]  # a mixed fleet: `group/phase`
    for phase in grouped or ("decode", "prefill"):
        steps = p["breakdown"].get(phase, {})
        total = sum(steps.values()) or 1.0
        group, _, name = phase.rpartition("/")
        title = f"{group}: {name}" if group else name.capitalize()
        lines += ["", f"## {title} step by operator", "", "| operator | us | share |",
                  "|---|---|---|"]
        for op, us in sorted(steps.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {op} | {us:,.1f} | {100 * us / total:.1f}% |")
        if name == "prefill":
            lines += _pipeline_lines(plan, p["instances"])
    return "\n".join(lines) + "\n"


def _assumed_model_lines(plan: Plan) -> list[str]:
    """The model's numbers that no public config or engine code gives (its catalog `sources`
    say `assumed`): every prediction below rests on them."""
    if not plan.model.assumed:
        return []
    return [f"Assumed architecture of {plan.model.name} (no public source): "
            f"{', '.join(plan.model.assumed)}.", ""]


def _pipeline_lines(plan: Plan, rows: list[dict]) -> list[str]:
    """What a pipelined prefill is: its stages (layers, GPUs, memory), what its step and a
    prompt's time mean, how its KV leaves it, and what it shares with whom."""
    out = []
    by_shape = {r["shape"]: r for r in rows if r.get("pipeline_fill_us") is not None}
    tray_of = {g: t.id for t in plan.hardware.trays for g in t.gpus}
    for inst in plan.instances:
        r = by_shape.get(inst.shape)
        if inst.pp == 1 or r is None:
            continue
        out += ["", f"### {inst.id}: {inst.shape}, {inst.pp} pipeline stages", "",
                "| stage | layers | GPUs | trays | weights GiB/GPU | KV GiB/GPU |",
                "|---|---|---|---|---|---|"]
        for k, layers in enumerate(inst.stage_layers):
            gpus = inst.gpus[k * inst.tp:(k + 1) * inst.tp]
            trays = sorted({tray_of[g] for g in gpus})
            mem = next(m for d, m in plan.memory.items() if d.startswith(gpus[0] + "-"))
            out.append(f"| {k} | {layers} | {gpus[0]} .. {gpus[-1]} | {', '.join(trays)} | "
                       f"{mem.weights_gib:g} | {mem.kv_gib:g} |")
        nixl = [c for c in inst.kv_connectors if c.startswith("Nixl")]
        link = ("the NICs between stages on different nodes, NVLink between stages of one node"
                if plan.hardware.form == "hgx" and len(inst.trays) > 1 else "NVLink")
        out += ["",
                f"- A step is one chunk of {r['chunk_tokens']:,} tokens per stage and lasts the "
                f"slowest stage's {r['prefill_step_us'] / 1e3:,.1f} ms; each chunk also spends "
                f"{r['pipeline_fill_us'] / 1e3:,.1f} ms in the other stages, so a prompt of n "
                f"chunks takes n steps plus that fill: {r['prompt_us'] / 1e6:,.1f} s for the "
                f"median prompt (the TTFT above adds the KV hand-off and the wait for other "
                "prompts).",
                f"- Between stages each chunk's hidden states and residual cross over {link}; "
                "vLLM sizes every stage's KV cache to the smallest stage's block count.",
                f"- Each stage hands its own layers' KV to the decode instances ("
                f"{', '.join(nixl) or 'no connector'}: the pull connector would read one stage, "
                "so the decode instances push too).",
                f"- The {len(inst.trays)} trays are one failure domain: losing one stops the "
                "instance."]
    return out


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


def before_you_deploy_md(plan: Plan) -> list[str]:
    """What the site must supply that the bundle cannot (compiler/preflight.py)."""
    found = notices(plan)
    if not found:
        return []
    out = ["", "## Before you deploy", "", "| folder | input | what | what to do |",
           "|---|---|---|---|"]
    out += [f"| {n.target}/ | {n.path} | {n.problem} | {n.hint} |" for n in found]
    return out


def _balance_lines(b: dict | None) -> list[str]:
    """Why the counts (compiler/balance.py): the binding role and what the spare buys."""
    if not b:
        return []
    bind = b["binding_role"]
    other = "prefill" if bind == "decode" else "decode"
    instead = b["one_more_binding_instance_goodput"]
    more = (f"would leave GPUs for only {instead:g} requests/s of {other}" if instead
            else f"would leave no GPUs for {other}")
    lines = ["", "## Why this layout", "",
             f"Goodput is bound by {bind}: its instances sustain "
             f"{b['binding_supply_requests_per_s']:g} requests/s at the SLO. One more {bind} "
             f"instance {more}, so the rest of the GPUs serve {other}; of its instances "
             f"{b[f'{other}_instances_needed']} carry the goodput and "
             f"{b[f'{other}_instances_spare']} are spare."]
    if "ttft_ms_p90_with_spare" in b:
        lines += ["", f"| with the spare {other} | with | without |", "|---|---|---|"]
        for key in ("ttft_ms_p50", "ttft_ms_p90", "prefill_utilisation", "prefix_hit_rate"):
            lines.append(f"| {key} | {b[key + '_with_spare']:g} | {b[key + '_without_spare']:g} |")
    return lines


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


HGX_NODES_PER_PANEL = 16
LABELLED_PANELS = 2  # instance ids written on the GPUs up to this many panels


def panels(plan: Plan) -> list[tuple[str, list]]:
    """(title, trays) per panel: one per NVLink rack; HGX nodes in runs of 16 (a mixed fleet:
    each group's panels in turn)."""
    return [panel for hw in plan.fleet for panel in _panels(hw)]


def _panels(hw) -> list[tuple[str, list]]:
    trays = hw.trays
    if hw.form == "hgx":
        n = HGX_NODES_PER_PANEL
        return [(f"{trays[k].id} .. {trays[min(k + n, len(trays)) - 1].id}", trays[k:k + n])
                for k in range(0, len(trays), n)]
    out: dict[str, list] = {}
    for t in trays:
        out.setdefault(t.nvlink_domain, []).append(t)
    return list(out.items())


def rack_png(plan: Plan) -> bytes:
    """One panel per rack (HGX: per 16 nodes): trays as rows, GPUs as columns, each GPU split
    into its memory domains (one cell each), coloured by the role of the instance using it
    (dark: unavailable, grey: idle). Panels are drawn into one image, so the cost grows with
    the GPUs, not with matplotlib artists per rack. In a mixed fleet every panel is as wide as
    the widest tray (in memory domains); a GPU of another system spans as many cells."""
    import math

    import numpy as np
    from matplotlib.colors import to_rgb

    role_of = {g: i.role for i in plan.instances for g in i.gpus}
    fleet = plan.fleet
    per = max(h.gpus_per_tray for h in fleet)
    cell_w = math.lcm(*(h.gpus_per_tray * h.domains_per_gpu for h in fleet))
    cells = {t.id: (cell_w // h.gpus_per_tray, h) for h in fleet for t in h.trays}
    doms = min(c for c, _ in cells.values())  # the gap between panels, in cells
    down = set(plan.hardware.unavailable_gpus)
    colour = {key: to_rgb(c) for key, c in ROLE_COLOURS.items()}
    dark, white = to_rgb(DOWN_COLOUR), (1.0, 1.0, 1.0)
    groups = panels(plan)
    cols = min(len(groups), 8)
    rows = -(-len(groups) // cols)
    height = max(len(trays) for _, trays in groups)
    gap_x, gap_y = doms, 2  # gaps between panels, in cells
    pw, ph = cell_w + gap_x, height + gap_y
    image = np.ones((rows * ph, cols * pw - gap_x, 3))
    for k, (_, trays) in enumerate(groups):
        y0, x0 = (k // cols) * ph + gap_y, (k % cols) * pw
        for r, tray in enumerate(trays):
            image[y0 + r, x0:x0 + cell_w] = [
                dark if g in down else colour[role_of.get(g)] for g in tray.gpus
                for _ in range(cells[tray.id][0])]
    labelled = len(groups) <= LABELLED_PANELS
    if labelled:  # room for tray ids and instance labels
        fig = _figure(1.6 + 1.1 * per * cols, 1.0 + 0.3 * image.shape[0])
        ax = fig.add_axes((0.14 / cols, 0.02, 1 - 0.16 / cols, 0.9))
    else:
        fig = _figure(0.6 + 0.09 * image.shape[1], 0.8 + 0.09 * image.shape[0])
        ax = fig.add_axes((0.02, 0.01, 0.96, 0.94))
    ax.imshow(image, aspect="auto", interpolation="nearest",
              extent=(0, image.shape[1], image.shape[0], 0))
    hy, hx0, hx1, vx, vy0, vy1, dx, dy0, dy1 = ([] for _ in range(9))
    for k, (title, trays) in enumerate(groups):
        y0, x0 = (k // cols) * ph + gap_y, (k % cols) * pw
        ax.text(x0, y0 - 0.3, title, fontsize=7)
        hy += [y0 + r for r in range(1, len(trays))]
        hx0 += [x0] * (len(trays) - 1)
        hx1 += [x0 + cell_w] * (len(trays) - 1)
        width, hw = cells[trays[0].id]  # cells per GPU, of this panel's system
        step = width // hw.domains_per_gpu
        vx += list(range(x0 + width, x0 + cell_w, width))
        vy0 += [y0] * (hw.gpus_per_tray - 1)
        vy1 += [y0 + len(trays)] * (hw.gpus_per_tray - 1)
        split = [x0 + x for x in range(step, cell_w, step) if x % width]  # its memory domains
        dx += split
        dy0 += [y0] * len(split)
        dy1 += [y0 + len(trays)] * len(split)
        if labelled:
            _label_panel(ax, plan, trays, x0, y0, width)
    ax.hlines(hy, hx0, hx1, color=white, linewidth=0.6)
    ax.vlines(vx, vy0, vy1, color=white, linewidth=1.2)
    if dx:
        ax.vlines(dx, dy0, dy1, color=white, linewidth=0.4, linestyles=":")
    ax.set_axis_off()
    ax.set_title(f"{plan.hardware.system}: role per GPU and memory domain "
                 f"({len(groups)} panel{'s' if len(groups) != 1 else ''})", fontsize=9)
    return _png(fig)


def _label_panel(ax, plan: Plan, trays: list, x0: int, y0: int, doms: int) -> None:
    label_of = {i.gpus[0]: i.id for i in plan.instances}
    for r, tray in enumerate(trays):
        ax.text(x0 - 0.2, y0 + r + 0.7, tray.id, fontsize=6, ha="right")
        for c, gpu in enumerate(tray.gpus):
            if gpu in label_of:
                ax.text(x0 + c * doms + 0.1, y0 + r + 0.7, label_of[gpu], fontsize=6,
                        color="white")
