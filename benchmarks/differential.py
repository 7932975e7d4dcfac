"""Differential check: rackc's step model against AIConfigurator's own estimator
(`aiconfigurator-core`, the `calibrate` extra) on a grid both can express.

Grid: GPU x model x engine shape x batch x (input, output) lengths, all with the vLLM backend
(rackc's shipped curves are AIConfigurator's vLLM kernel tables, compiler/perf/aiconfigurator.py),
BF16 KV, no speculative decoding. For each point:
* per step: one prefill of `batch` prompts of `isl` tokens (AIConfigurator
  `predict_prefill_latency`; rackc `prefill_step` with a chunk of batch x isl tokens) and one
  decode step of `batch` requests over `isl` cached tokens (`predict_decode_latency`;
  `decode_step`);
* end to end: a static batch, as AIConfigurator's `run_static` runs it: the batch's prefill,
  then osl - 1 decode steps with the context growing from isl to isl + osl (rackc: the same
  prefill, and its decode step integrated over that context, Simpson's rule on 9 points).
Prints the distribution of rackc / AIConfigurator - 1 per quantity and every point beyond 15%.

    python3 benchmarks/differential.py [--systems h200,b200] [--format json]
    python3 benchmarks/differential.py --explain h200:deepseek-v3:DEP8:8:1024
"""

import argparse
import io
import json
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e

from compiler.load import load_inputs
from compiler.perf.predict import context
from compiler.perf.step import decode_step, prefill_step
from compiler.shapes import parse_shape

HERE = Path(__file__).resolve().parent
FLAG = 0.15  # differences beyond this are listed (and explained in benchmarks/README.md)

# rackc system -> AIConfigurator system
SYSTEMS = {"h100": ("hgx-h100", "h100_sxm"), "h200": ("hgx-h200", "h200_sxm"),
           "b200": ("hgx-b200", "b200_sxm"), "b300": ("hgx-b300", "b300_sxm"),
           "gb200": ("gb200-nvl72", "gb200")}
# rackc model (catalog name or benchmarks/ file) -> (AIConfigurator model path, gemm quant,
# moe quant, the shapes of the grid: name -> (tp, attention dp, moe tp, moe ep))
MODELS = {
    "qwen3-32b": ("Qwen/Qwen3-32B", "bfloat16", None,
                  {"TP1": (1, 1, 1, 1), "TP2": (2, 1, 1, 1), "TP4": (4, 1, 1, 1)}),
    "models/qwen3-235b-a22b-fp8.yaml": ("Qwen/Qwen3-235B-A22B-FP8", "fp8_block", "fp8_block",
                                        {"TP4": (4, 1, 4, 1), "TP4EP4": (4, 1, 1, 4),
                                         "TP8EP8": (8, 1, 1, 8)}),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "fp8_block", "fp8_block",
                    {"TP8": (8, 1, 8, 1), "TP8EP8": (8, 1, 1, 8), "DEP8": (1, 8, 1, 8)}),
}
BATCHES = (1, 8, 64)
LENGTHS = ((1024, 1024), (4096, 256))
SIMPSON = 9  # points of the decode integral over the growing context


def aic_engine(model_path: str, system: str, gemm: str, moe: str | None, layout: tuple):
    from aiconfigurator_core.sdk.engine import EngineHandle

    tp, dp, moe_tp, moe_ep = layout
    quant = {"gemm_quant_mode": gemm, "kvcache_quant_mode": "bfloat16",
             "fmha_quant_mode": "bfloat16"}
    if moe:
        quant["moe_quant_mode"] = moe
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        return EngineHandle.compile(model_path, system, "vllm", tp_size=tp,
                                    attention_dp_size=dp, moe_tp_size=moe_tp,
                                    moe_ep_size=moe_ep, **quant)


def rackc_context(system: str, model: str, shape_name: str, isl: int, osl: int):
    """The PerfContext `rackc predict` builds for one pinned aggregated instance of the shape."""
    shape = parse_shape(shape_name)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec = {"system": system}
        if not system.startswith("gb"):
            spec["nodes"] = max(1, shape.gpus // 8)
        rack = {"apiVersion": "rackc.dev/v1alpha1",
                "kind": "Rack" if system.startswith("gb") else "Cluster",
                "metadata": {"name": "hw"}, "spec": spec}
        if model.endswith(".yaml"):
            (root / "model.yaml").write_text((HERE / model).read_text())
            model = "model.yaml"
        dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
               "metadata": {"name": "diff"},
               "spec": {"rack": "rack.yaml", "model": model,
                        "workload": {"profile": "fixed", "isl": isl, "osl": osl},
                        "objective": {"mode": "pinned", "instances": [
                            {"role": "aggregated", "shape": shape_name, "count": 1}]},
                        "serving": {"kv_cache_dtype": "bf16", "kv_pool": {"dram": False}}}}
        (root / "rack.yaml").write_text(yaml.safe_dump(rack))
        (root / "deployment.yaml").write_text(yaml.safe_dump(dep))
        inputs = load_inputs(root / "deployment.yaml")
    return context(inputs, shape.gpus, "aggregated", shape), shape


def rackc_point(ctx, shape, batch: int, isl: int, osl: int) -> dict:
    prefill_ms = prefill_step(ctx, shape, batch * isl, isl, 0.0).us / 1e3
    decode_ms = decode_step(ctx, shape, batch, isl).us / 1e3
    h = osl / (SIMPSON - 1)
    ys = [decode_step(ctx, shape, batch, isl + i * h).us / 1e3 for i in range(SIMPSON)]
    weights = [1 if i in (0, SIMPSON - 1) else (4 if i % 2 else 2) for i in range(SIMPSON)]
    mean_step = sum(w * y for w, y in zip(weights, ys, strict=True)) * h / 3 / osl
    return {"prefill_ms": prefill_ms, "decode_ms": decode_ms,
            "total_ms": prefill_ms + mean_step * (osl - 1)}


def aic_point(engine, batch: int, isl: int, osl: int) -> dict:
    _prefill_ms, _decode_ms, total_ms = engine.run_static(batch_size=batch, isl=isl, osl=osl)
    return {"prefill_ms": engine.predict_prefill_latency(batch, isl),
            "decode_ms": engine.predict_decode_latency(batch, isl, 2), "total_ms": total_ms}


def grid(systems: list[str]) -> list[dict]:
    out = []
    for key in systems:
        rackc_system, aic_system = SYSTEMS[key]
        for model, (path, gemm, moe, shapes) in MODELS.items():
            for shape_name, layout in shapes.items():
                try:
                    engine = aic_engine(path, aic_system, gemm, moe, layout)
                except Exception as exc:  # a point AIConfigurator cannot build is listed
                    out.append({"system": rackc_system, "model": model, "shape": shape_name,
                                "skipped": f"aiconfigurator: {type(exc).__name__}: {exc}"[:160]})
                    continue
                for isl, osl in LENGTHS:
                    try:
                        ctx, shape = rackc_context(rackc_system, model, shape_name, isl, osl)
                    except Exception as exc:
                        from schemas.diagnostics import CompileError

                        if not isinstance(exc, CompileError):
                            raise
                        out.append({"system": rackc_system, "model": model,
                                    "shape": shape_name, "isl": isl, "osl": osl,
                                    "skipped": "rackc: " + "; ".join(
                                        f"{d.code} {d.got}" for d in exc.diagnostics)[:160]})
                        continue
                    for batch in BATCHES:
                        ours = rackc_point(ctx, shape, batch, isl, osl)
                        theirs = aic_point(engine, batch, isl, osl)
                        out.append({"system": rackc_system, "model": model,
                                    "shape": shape_name, "batch": batch, "isl": isl,
                                    "osl": osl, "rackc": ours, "aiconfigurator": theirs,
                                    "diff": {k: ours[k] / theirs[k] - 1 for k in ours}})
    return out


def explain(point: str) -> None:
    """Both sides' breakdown of one point, `SYSTEM:MODEL:SHAPE:BATCH:ISL` (keys of SYSTEMS and
    MODELS): rackc's StepTime categories and AIConfigurator's ops with their data source."""
    key, model, shape_name, batch, isl = point.split(":")
    batch, isl = int(batch), int(isl)
    rackc_system, aic_system = SYSTEMS[key]
    path, gemm, moe, shapes = MODELS[model]
    engine = aic_engine(path, aic_system, gemm, moe, shapes[shape_name])
    ctx, shape = rackc_context(rackc_system, model, shape_name, isl, 2)
    for phase, ours, theirs in (
            ("prefill", prefill_step(ctx, shape, batch * isl, isl, 0.0),
             engine.run_static_per_op(batch_size=batch, isl=isl, osl=2)[0]),
            ("decode", decode_step(ctx, shape, batch, isl),
             engine.decode_step_per_op(batch, isl, 2))):
        print(f"{phase}: rackc {ours.us / 1e3:.3f} ms")
        for name, us in sorted(ours.breakdown.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<28}{us / 1e3:>9.3f}")
        print(f"{phase}: aiconfigurator {sum(op[1] for op in theirs):.3f} ms")
        for name, ms, _energy, source in sorted(theirs, key=lambda op: -op[1]):
            print(f"  {name:<40}{ms:>9.3f}  {source}")


def quantiles(values: list[float]) -> str:
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return (f"n={len(s)} median {e2e.median(s):+.1%} median|d| "
            f"{e2e.median([abs(v) for v in s]):.1%} p10 {q(0.1):+.1%} p90 {q(0.9):+.1%} "
            f"within 15% {sum(abs(v) <= FLAG for v in s)}/{len(s)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--explain", metavar="SYSTEM:MODEL:SHAPE:BATCH:ISL",
                        help="print both breakdowns of one point, e.g. "
                             "h200:deepseek-v3:DEP8:8:1024")
    args = parser.parse_args(argv)
    if args.explain:
        explain(args.explain)
        return 0
    rows = grid(args.systems.split(","))
    done = [r for r in rows if "diff" in r]
    if args.format == "json":
        print(json.dumps(rows, indent=1))
        return 0
    for metric in ("prefill_ms", "decode_ms", "total_ms"):
        print(f"{metric:<11} rackc / aiconfigurator - 1: "
              f"{quantiles([r['diff'][metric] for r in done])}")
    for key in SYSTEMS:
        sub = [r for r in done if r["system"] == SYSTEMS[key][0]]
        if sub:
            for metric in ("decode_ms", "prefill_ms"):
                print(f"  {SYSTEMS[key][0]:<12} {metric:<11}"
                      f"{quantiles([r['diff'][metric] for r in sub])}")
    print(f"\npoints beyond {FLAG:.0%} (system model shape batch isl/osl: prefill, decode, "
          "total; rackc ms vs aiconfigurator ms):")
    for r in done:
        if any(abs(v) > FLAG for v in r["diff"].values()):
            d, a, b = r["diff"], r["rackc"], r["aiconfigurator"]
            print(f"  {r['system']:<12}{r['model'].split('/')[-1]:<26}{r['shape']:<8}"
                  f"b{r['batch']:<4}{r['isl']}/{r['osl']:<6}"
                  f"prefill {d['prefill_ms']:+.0%} ({a['prefill_ms']:.1f}/{b['prefill_ms']:.1f}) "
                  f"decode {d['decode_ms']:+.0%} ({a['decode_ms']:.2f}/{b['decode_ms']:.2f}) "
                  f"total {d['total_ms']:+.0%}")
    for r in rows:
        if "skipped" in r:
            print(f"  skipped {r['system']} {r['model']} {r['shape']}: {r['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
