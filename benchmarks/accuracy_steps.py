"""Step-level accuracy of rackc's step model against whole steps measured on our own H200.

The measurements (benchmarks/data/h200-steps-<model>.json, from benchmarks/measure_steps.py)
are whole decode and prefill steps of three MoE models in bf16 on one H200, captured in CUDA
graphs, with the fused glue kernels an engine runs between the GEMMs
(compiler/perf/engine_kernels.py): Qwen3-30B-A3B, DeepSeek-V2-Lite (MLA) and Mixtral-8x7B.
Each point is predicted the way the compiler predicts a step: a one-node hgx-h200 Cluster and
a Deployment of the model
(the catalog's, or benchmarks/models/<model>.yaml; bf16 KV cache, fixed workload) are written
to a temporary folder and loaded, then `compiler.perf.predict.context(inputs, 1)` with shape
TP1 feeds
`compiler.perf.step.decode_step(ctx, shape, batch, kv_len)` or
`prefill_step(ctx, shape, tokens, tokens, 0)`.

decode_step adds DECODE_OVERHEAD_US and prefill_step PREFILL_OVERHEAD_US per step (scheduler,
input preparation) that a bare graph replay does not pay, so every point is compared with and
without those constants; "GPU-side" means without them.

The measurement also timed every stage of the forward alone (all layers in one graph).
Stages are matched to the step model's breakdown keys (STAGE_KEYS); the rest are listed as
"not modelled": the norms, RoPE, routing bookkeeping and KV write, which the model costs
together as its `glue` term. The per-op table shows that split for one decode
and one prefill point of each model.

    python3 benchmarks/accuracy_steps.py [--data FILE ...] [--decode 32:8192] [--prefill 4096]

The op curves are by default those fitted to our own H200 kernel measurements
(hgx-h200.raw.json), i.e. of the PyTorch kernels the measured forward runs, so the comparison
tests how the step model composes kernels into a step; `--curves catalog` uses the shipped
hgx-h200 calibration (AIConfigurator's vLLM kernel tables), as `rackc predict` does.

Goal (issue 11): median |error| <= 10% over the decode points and <= 15% over the prefill
points, with the overheads (what `rackc predict` reports). Exit 1 when it is missed.
"""

import argparse
import functools
import json
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

from compiler import catalog
from compiler.load import load_inputs
from compiler.perf import fit
from compiler.perf.ops import OpModel, op_model
from compiler.perf.predict import context
from compiler.perf.step import (
    DECODE_OVERHEAD_US,
    PREFILL_OVERHEAD_US,
    PerfContext,
    StepTime,
    decode_step,
    prefill_step,
)
from compiler.shapes import parse_shape

HERE = Path(__file__).resolve().parent
DATA = sorted((HERE / "data").glob("h200-steps-*.json"))
SYSTEM, SHAPE = "hgx-h200", "TP1"
GOALS = {"decode": 0.10, "prefill": 0.15}  # median |error| per phase (issue 11)

# Step-model breakdown key -> the measured stages that do that work (GQA and MLA names).
STAGE_KEYS = {
    "attn_proj": ("qkv_proj", "o_proj", "q_proj", "kv_a", "q_absorb", "o_absorb", "kv_expand"),
    "attention": ("attention",),
    "router": ("router",),
    "moe_experts": ("gate_up", "down"),
    "shared_expert": ("shared_expert",),
    "dense_ffn": ("dense_ffn",),
    "lm_head": ("head",),
}
MODELLED_STAGES = {s for names in STAGE_KEYS.values() for s in names}


def model_ref(name: str) -> str:
    """The Deployment's model: the catalog's, else the file under benchmarks/models/."""
    local = HERE / "models" / f"{name}.yaml"
    return str(local) if local.is_file() else name


def not_modelled(stages: dict[str, float]) -> list[str]:
    return [name for name in stages if name not in MODELLED_STAGES]


@functools.cache
def own_kernels() -> OpModel:
    """Op curves fitted to our own H200 kernel measurements (hgx-h200.raw.json): the PyTorch
    kernels (cuBLAS, torch._grouped_mm, cuDNN attention) that the measured forward runs."""
    system = catalog.system(SYSTEM)
    raw = json.loads(catalog.calibration_path(SYSTEM, "raw.json").read_text())
    return op_model(system, fit.calibration(raw, system))


def load_context(model: str, curves: str) -> PerfContext:
    """The PerfContext the compiler builds for `model` on one HGX H200 node; with `curves`
    "own", its op model is `own_kernels` instead of the catalog's calibration."""
    rack = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "h200"},
            "spec": {"system": SYSTEM, "nodes": 1}}
    dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
           "metadata": {"name": "qwen3-steps"},
           "spec": {"rack": "rack.yaml", "model": model_ref(model),
                    "workload": {"profile": "fixed"},
                    "serving": {"kv_cache_dtype": "bf16"}}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "rack.yaml").write_text(yaml.safe_dump(rack))
        (root / "deployment.yaml").write_text(yaml.safe_dump(dep))
        inputs = load_inputs(root / "deployment.yaml")
    ctx = context(inputs, 1)
    return replace(ctx, ops=own_kernels()) if curves == "own" else ctx


def length(p: dict) -> int:
    return p["kv_len"] if p["phase"] == "decode" else p["tokens"]


def predict(ctx: PerfContext, p: dict) -> tuple[StepTime, float]:
    """(predicted step, the per-step overhead constant it includes)."""
    shape = parse_shape(SHAPE)
    if p["phase"] == "decode":
        return decode_step(ctx, shape, p["batch"], p["kv_len"]), DECODE_OVERHEAD_US
    return prefill_step(ctx, shape, p["tokens"], p["tokens"], 0), PREFILL_OVERHEAD_US


def rel(pred: float, meas: float) -> float:
    return pred / meas - 1


def row_errors(ctx: PerfContext, points: list[dict]) -> list[dict]:
    rows = []
    for p in points:
        st, overhead = predict(ctx, p)
        stages = p.get("stages_us", {})
        modelled_meas = sum(stages.get(s, 0.0) for s in MODELLED_STAGES)
        ops_pred = sum(st.breakdown.get(key, 0.0) for key in STAGE_KEYS)
        rows.append({
            "point": p, "step": st, "pred": st.us, "pred_gpu": st.us - overhead,
            "err": rel(st.us, p["us"]), "err_gpu": rel(st.us - overhead, p["us"]),
            "glue": sum(stages[s] for s in not_modelled(stages)),
            "ops_pred": ops_pred, "ops_meas": modelled_meas,
            "err_ops": rel(ops_pred, modelled_meas) if modelled_meas else float("nan"),
        })
    return rows


def print_table(rows: list[dict]) -> None:
    print("| phase | batch | kv_len / tokens | measured us | predicted us | err | "
          "predicted GPU-side us | err GPU-side | not-modelled stages us | "
          "modelled stages us | err vs modelled stages |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = r["point"]
        print(f"| {p['phase']} | {p['batch']} | {length(p)} | {p['us']:,.0f} | "
              f"{r['pred']:,.0f} | {r['err']:+.1%} | {r['pred_gpu']:,.0f} | "
              f"{r['err_gpu']:+.1%} | {r['glue']:,.0f} | {r['ops_meas']:,.0f} | "
              f"{r['err_ops']:+.1%} |")


def print_summary(rows: list[dict]) -> None:
    print("\n| points | median \\|err\\| with overhead | GPU-side | "
          "modelled ops vs their stages |")
    print("|---|---:|---:|---:|")
    for label, phase in (("decode", "decode"), ("prefill", "prefill"), ("all", None)):
        sel = [r for r in rows if phase is None or r["point"]["phase"] == phase]
        if not sel:
            continue
        med = [statistics.median(abs(r[k]) for r in sel) for k in ("err", "err_gpu", "err_ops")]
        print(f"| {label} ({len(sel)}) | {med[0]:.1%} | {med[1]:.1%} | {med[2]:.1%} |")


def print_breakdown(row: dict) -> None:
    p, st = row["point"], row["step"]
    stages = p.get("stages_us", {})
    print(f"\nPer-op, {p['phase']} batch {p['batch']} "
          f"{'kv_len' if p['phase'] == 'decode' else 'tokens'} {length(p)} "
          f"(us per step; measured: each stage alone, all layers, {p.get('attn_impl')})")
    print("| step-model term | predicted | measured stages | measured | err |")
    print("|---|---:|---|---:|---:|")
    for key, names in STAGE_KEYS.items():
        pred = st.breakdown.get(key, 0.0)
        meas = sum(stages.get(s, 0.0) for s in names)
        err = f"{rel(pred, meas):+.1%}" if meas else "-"
        print(f"| {key} | {pred:,.0f} | {' + '.join(names)} | {meas:,.0f} | {err} |")
    other = {k: v for k, v in st.breakdown.items() if k not in STAGE_KEYS and v}
    for key, pred in other.items():
        print(f"| {key} | {pred:,.0f} | (none in a graph replay) | 0 | - |")
    for name in not_modelled(stages):
        print(f"| (not modelled) | 0 | {name} | {stages[name]:,.0f} | - |")
    total = sum(stages.values())
    gaps = p["us"] - total
    print(f"| **step** | **{st.us:,.0f}** | sum of stages {total:,.0f}; whole-step graph "
          f"{gaps:+,.0f} vs that sum | **{p['us']:,.0f}** | **{rel(st.us, p['us']):+.1%}** |")
    extra = ["attention variants (us/step): " + ", ".join(
        f"{k} {v:,.0f}" for k, v in p.get("attn_variants_us", {}).items())]
    if "us_eager" in p:
        extra.append(f"eager (no graph): {p['us_eager']:,.0f} us")
    extra.append(f"busiest expert / mean (last layer): {p.get('expert_load_max_over_mean')}")
    for line in extra:
        print(f"  {line}")


def pick(rows: list[dict], phase: str, spec: str) -> dict | None:
    parts = [int(x) for x in spec.split(":")]
    for r in rows:
        p = r["point"]
        if p["phase"] != phase:
            continue
        if phase == "decode" and (p["batch"], p["kv_len"]) == tuple(parts):
            return r
        if phase == "prefill" and p["tokens"] == parts[0]:
            return r
    return None


def model_rows(path: Path, curves: str) -> tuple[str, list[dict]]:
    """(model name, predicted rows) of one measured file, with its header printed."""
    doc = json.loads(path.read_text())
    dev, model = doc["device"], doc["model"]["name"]
    print(f"\n## {model}\n\nMeasured ({path.name}): {dev.get('gpu')} ({dev.get('sm_count')} "
          f"SMs, driver {dev.get('driver')}, torch {dev.get('torch')}, CUDA {dev.get('cuda')}) "
          f"on {dev.get('measured_on')}; bf16, self-check rel err "
          f"{doc.get('self_check_rel_err')}")
    ctx = load_context(model, curves)
    print(f"Predicted: {SYSTEM} {model} {SHAPE}, kv {ctx.kv_dtype}, ops: {ctx.ops.source}\n")
    points = sorted(doc["points"], key=lambda p: (p["phase"] != "decode", p["batch"], length(p)))
    return model, row_errors(ctx, points)


def goal_lines(rows: list[dict]) -> tuple[list[str], bool]:
    """Per phase: the median |error| with overheads over every model's points, against GOALS."""
    lines, met = [], True
    for phase, goal in GOALS.items():
        errs = [abs(r["err"]) for r in rows if r["point"]["phase"] == phase]
        if not errs:
            continue
        median = statistics.median(errs)
        met &= median <= goal
        lines.append(f"{phase}: median |err| {median:.1%} over {len(errs)} points "
                     f"(goal <= {goal:.0%}: {'met' if median <= goal else 'missed'})")
    return lines, met


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, nargs="+", default=DATA)
    ap.add_argument("--decode", default="32:8192", help="batch:kv_len of the decode breakdown")
    ap.add_argument("--prefill", default="4096", help="tokens of the prefill breakdown")
    ap.add_argument("--curves", choices=("own", "catalog"), default="own",
                    help="own: op curves fitted to our H200 kernel measurements (the kernels "
                    "the measured forward runs; default); catalog: the shipped calibration "
                    "(AIConfigurator's vLLM tables)")
    args = ap.parse_args(argv)
    print(f"Overheads in the prediction: decode {DECODE_OVERHEAD_US:g} us, prefill "
          f"{PREFILL_OVERHEAD_US:g} us per step")
    every = []
    for path in args.data:
        _, rows = model_rows(path, args.curves)
        print_table(rows)
        print_summary(rows)
        for phase, spec in (("decode", args.decode), ("prefill", args.prefill)):
            row = pick(rows, phase, spec)
            if row:
                print_breakdown(row)
        every += rows
    print("\n## All models")
    print_summary(every)
    lines, met = goal_lines(every)
    print()
    for line in lines:
        print(line)
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
