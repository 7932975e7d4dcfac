"""Visible anchors: AIConfigurator's public accuracy points (benchmarks/anchors/cases.yaml, TTFT
and TPOT at a fixed concurrency) predicted as `rackc predict` predicts a pinned deployment,
each with the measured kernels of the engine it ran (`--kernels`), then REFERENCE-DATA.md C1
(benchmarks/e2e.py). Prints TTFT and TPOT errors separately, per case and as medians; exit 1
when either median |error| exceeds 10%.

    python3 benchmarks/anchors.py [--kernels own|vllm] [--cases ID,ID] [--format json]
"""

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e

from compiler import catalog
from compiler.shapes import parse_shape

HERE = Path(__file__).resolve().parent
CASES = HERE / "anchors" / "cases.yaml"
GOAL = 0.10  # median |error| of TTFT and of TPOT (issue 16)


def load() -> dict:
    return yaml.safe_load(CASES.read_text())


def engine(case: dict) -> str:
    """The framework the case ran: the first word of its `engine`."""
    return case["engine"].split()[0]


def kernels_for(case: dict, choice: str) -> str:
    """`own`: the case's engine where rackc has its kernels for the system, else vLLM's."""
    if choice != "own":
        return choice
    own = engine(case)
    return own if catalog.calibration(case["system"], own) is not None else "vllm"


def write(case: dict, root: Path) -> Path:
    """The case as a Rack or Cluster, a pinned Deployment and, for a model file, its copy."""
    system = catalog.system(case["system"])
    gpus = sum(parse_shape(x["shape"]).gpus * x["count"] for x in case["instances"])
    if system.form == "nvl72":
        hardware = {"kind": "Rack", "spec": {"system": system.name}}
    else:
        hardware = {"kind": "Cluster",
                    "spec": {"system": system.name, "nodes": -(-gpus // system.gpus_per_tray)}}
    model = case["model"]
    if model.endswith(".yaml"):
        (root / "model.yaml").write_text((HERE / model).read_text())
        model = "model.yaml"
    w = case["workload"]
    dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
           "metadata": {"name": case["id"]},
           "spec": {"rack": "rack.yaml", "model": model,
                    "workload": {"profile": "fixed", "isl_cv": 0.0, "osl_cv": 0.0, **w},
                    "objective": {"mode": "pinned", "instances": case["instances"]},
                    "serving": {"kv_pool": {"dram": False}}}}
    if case.get("kv_cache_dtype"):
        dep["spec"]["serving"]["kv_cache_dtype"] = case["kv_cache_dtype"]
    rack = {"apiVersion": "rackc.dev/v1alpha1", "kind": hardware["kind"],
            "metadata": {"name": "hw"}, "spec": hardware["spec"]}
    (root / "rack.yaml").write_text(yaml.safe_dump(rack, sort_keys=False))
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    return root / "deployment.yaml"


def predict(case: dict, kernels: str) -> dict:
    """Predicted TTFT and TPOT (P50) of the case, by `rackc predict`'s path."""
    from compiler import api
    from compiler.pinned import predict_pinned

    with tempfile.TemporaryDirectory() as tmp:
        path = write(case, Path(tmp))
        found = predict_pinned(path, kernels)  # (prediction, warnings)
        p = found[0] if found else api.compile(path, only=(), kernels=kernels).plan.predicted
    return {"ttft_ms": p.ttft_ms_p50, "tpot_ms": p.tpot_ms_p50}


def median(values: list[float]) -> float:
    return e2e.median(values) if values else math.nan


def rows(choice: str, only: set[str] | None) -> list[dict]:
    out = []
    for case in load()["cases"]:
        if only and case["id"] not in only:
            continue
        kernels = kernels_for(case, choice)
        row = {"id": case["id"], "engine": case["engine"], "kernels": kernels}
        try:
            pred = predict(case, kernels)
        except Exception as exc:  # a case rackc refuses is reported, not hidden
            from schemas.diagnostics import CompileError

            if not isinstance(exc, CompileError):
                raise
            row["refused"] = "; ".join(f"{d.code} {d.path}: {d.got}" for d in exc.diagnostics)
            out.append(row)
            continue
        for metric in ("ttft_ms", "tpot_ms"):
            measured = case["measured"][metric]
            row[metric] = {"predicted": round(pred[metric], 3), "measured": measured,
                           "error": round(pred[metric] / measured - 1, 4)}
        out.append(row)
    return out


def summary(results: list[dict]) -> dict:
    done = [r for r in results if "refused" not in r]
    return {metric: {"cases": len(done),
                     "median_abs_error": round(median([abs(r[metric]["error"]) for r in done]), 4),
                     "within_10pct": sum(abs(r[metric]["error"]) <= GOAL for r in done)}
            for metric in ("ttft_ms", "tpot_ms")}


def print_text(results: list[dict], c1: list[tuple]) -> None:
    print(f"{'case':<34}{'engine':<26}{'kernels':<8}{'TTFT pred':>11}{'meas':>10}{'err':>8}"
          f"{'TPOT pred':>11}{'meas':>9}{'err':>8}")
    for r in results:
        head = f"{r['id']:<34}{r['engine'][:25]:<26}{r['kernels']:<8}"
        if "refused" in r:
            print(f"{head}refused: {r['refused']}")
            continue
        t, o = r["ttft_ms"], r["tpot_ms"]
        print(f"{head}{t['predicted']:>11.1f}{t['measured']:>10.1f}{t['error']:>+8.1%}"
              f"{o['predicted']:>11.2f}{o['measured']:>9.2f}{o['error']:>+8.1%}")
    for metric, s in summary(results).items():
        print(f"{metric}: median |error| {s['median_abs_error']:.1%} over {s['cases']} cases, "
              f"{s['within_10pct']} within 10%")
    skipped = load()["not_expressible"]
    print(f"not expressible: {sum(len(x['rows']) for x in skipped)} rows")
    for x in skipped:
        print(f"  rows {', '.join(map(str, x['rows']))}: {x['why']}")
    print("\nREFERENCE-DATA.md C1 (vLLM kernels; benchmarks/e2e_cases.yaml):")
    for case, metric, got, measured, err in c1:
        print(f"  {case:<16}{metric:<34}{got:>10.1f}{measured:>10.1f}{err:>+8.1%}")
    print(f"C1: median |error| {median([abs(r[4]) for r in c1]):.1%} over {len(c1)} values")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", choices=("own", *catalog.KERNEL_SOURCES), default="own",
                        help="own: each case's engine (default); or one engine's for all")
    parser.add_argument("--cases", help="comma-separated case ids (default: all)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    only = set(args.cases.split(",")) if args.cases else None
    results = rows(args.kernels, only)
    c1 = [] if only else e2e.errors()
    if args.format == "json":
        print(json.dumps({"cases": results, "summary": summary(results),
                          "c1": [dict(zip(("case", "metric", "predicted", "measured", "error"),
                                          r, strict=True)) for r in c1]}, indent=1))
    else:
        print_text(results, c1)
    s = summary(results)
    return 0 if all(s[m]["median_abs_error"] <= GOAL for m in s) else 1


if __name__ == "__main__":
    sys.exit(main())
