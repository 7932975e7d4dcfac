"""`report` target: the predicted-performance report of a plan. `index.html` is the one people
open (targets/_report_html.py); `performance.md` and `performance.json` are for machines and
diffs; `curve.svg` is the throughput-interactivity curve alone (`rackc predict --plot`)."""

import json

from compiler.plan import Plan
from targets._report_curve import curve_svg
from targets._report_html import index_html
from targets._report_layouts import markdown as layouts_md
from targets._report_text import balance_sentence, fallbacks
from targets._simulated import simulated_md


def emit(plan: Plan) -> dict[str, str]:
    return {
        "report/performance.json": json.dumps(plan.prediction.model_dump(mode="json"),
                                              indent=2) + "\n",
        "report/performance.md": performance_md(plan),
        "report/index.html": index_html(plan),
        "report/curve.svg": '<?xml version="1.0" encoding="utf-8"?>\n' + curve_svg(plan)[0]
                            + "\n",
    }


def performance_md(plan: Plan) -> str:
    p = plan.prediction.model_dump(mode="json")
    gpus = sum(len(i.gpus) for i in plan.instances)
    lines = [
        f"# {plan.serving.name}: predicted performance",
        "",
        f"{plan.model.name} on {plan.hardware.system} ({gpus} GPUs in use), solver "
        f"{plan.solver.status}, goodput {plan.goodput:g} requests/s.",
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
    lines += slo_md(plan)
    lines += isolated_md(plan)
    lines += layouts_md(plan)
    lines += fallbacks_md(plan)
    lines += before_you_deploy_md(plan)
    lines += _balance_lines(p.get("balance"))
    lines += simulated_md(plan)
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
                if plan.system_of(inst).form == "hgx" and len(inst.trays) > 1
                else "NVLink")
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


def fallbacks_md(plan: Plan) -> list[str]:
    """Where the plan departs from the usual layout: each distinct decision once, with the plan
    paths it covers."""
    rows = fallbacks(plan)
    if not rows:
        return []
    return ["", "## Engine fallbacks", "", "| plan paths | value | source | why |",
            "|---|---|---|---|", *("| " + " | ".join(r) + " |" for r in rows)]


def before_you_deploy_md(plan: Plan) -> list[str]:
    """What the site must supply that the bundle cannot (the plan's notices)."""
    found = plan.notices
    if not found:
        return []
    out = ["", "## Before you deploy", "", "| folder | input | what | what to do |",
           "|---|---|---|---|"]
    out += [f"| {n.target}/ | {n.path} | {n.problem} | {n.hint} |" for n in found]
    return out


def slo_md(plan: Plan) -> list[str]:
    """The SLOs the deployment sets against the prediction (plan.prediction.slo)."""
    checks = plan.prediction.slo
    if not checks:
        return []
    return ["", "## SLOs", "", "| SLO | target | predicted | |", "|---|---|---|---|",
            *(f"| {c.field} | {c.target:g} | {c.predicted:g} | {'met' if c.met else 'missed'} |"
              for c in checks)]


def isolated_md(plan: Plan) -> list[str]:
    """Each pinned operating point's role alone (plan.prediction.isolated)."""
    rows = plan.prediction.isolated
    if not rows:
        return []
    return ["", "## Phase-isolated", "", rows[0].HEADING + ".",
            "", *(f"- {r.summary()}" for r in rows)]


def _balance_lines(b: dict | None) -> list[str]:
    """Why the counts (compiler/balance.py): the binding role and what the spare buys."""
    if not b:
        return []
    lines = ["", "## Why this layout", "", balance_sentence(b)]
    other = "decode" if b["binding_role"] == "prefill" else "prefill"
    if "ttft_ms_p90_with_spare" in b:
        lines += ["", f"| with the spare {other} | with | without |", "|---|---|---|"]
        for key in ("ttft_ms_p50", "ttft_ms_p90", "prefill_utilisation", "prefix_hit_rate"):
            lines.append(f"| {key} | {b[key + '_with_spare']:g} | {b[key + '_without_spare']:g} |")
    return lines
