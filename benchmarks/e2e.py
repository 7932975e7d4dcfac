"""End-to-end predictions for the calibration points in e2e_cases.yaml (REFERENCE-DATA.md C1).

Each case becomes a real Rack + Deployment in a temporary folder and goes through the same
path as `rackc predict` with a pinned layout; prefill-only cases time one prefill chunk.
"""

import math
import tempfile
from pathlib import Path

import yaml

from compiler.load import load_inputs
from compiler.perf.predict import Layout, context, predict_layout, workload
from compiler.perf.step import prefill_step
from compiler.shapes import parse_shape

HERE = Path(__file__).resolve().parent
CASES = HERE / "e2e_cases.yaml"


def load_cases() -> list[dict]:
    return yaml.safe_load(CASES.read_text())


def _write(case: dict, root: Path) -> Path:
    nodes = 4 if "prefill" in case else 1
    rack = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "hw"},
            "spec": {"system": case["system"], "nodes": nodes}}
    model = case["model"]
    if model.endswith(".yaml"):
        (root / "model.yaml").write_text((HERE / model).read_text())
        model = "model.yaml"
    serving: dict = {}
    if case.get("speculative"):
        serving["speculative"] = case["speculative"]
    if case.get("kv_cache_dtype"):
        serving["kv_cache_dtype"] = case["kv_cache_dtype"]
    w = case.get("workload", {"isl": case.get("prefill", {}).get("isl", 1024), "osl": 1})
    dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
           "metadata": {"name": case["id"].lower()},
           "spec": {"rack": "rack.yaml", "model": model,
                    "workload": {"profile": "fixed", **w}, "serving": serving}}
    (root / "rack.yaml").write_text(yaml.safe_dump(rack))
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep))
    return root / "deployment.yaml"


def predict_case(case: dict) -> dict[str, float]:
    """The case's predicted values, keyed like its `measured` block."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs = load_inputs(_write(case, Path(tmp)))
    if "prefill" in case:
        pf = case["prefill"]
        shape = parse_shape(pf["shape"])
        ctx = context(inputs, shape.gpus)
        step = prefill_step(ctx, shape, pf["chunk_tokens"], pf["isl"], 0.0)
        per_node = inputs.system.gpus_per_tray * pf["chunk_tokens"] / step.us * 1e6
        return {"prefill_tokens_per_s_per_node": per_node}
    layout = [Layout(x["role"], parse_shape(x["shape"]), x["count"], x.get("max_batch"))
              for x in case["layout"]]
    w = workload(inputs)
    p = predict_layout(inputs, layout, w)
    per_user = p.output_tokens_per_s_per_gpu * sum(x.shape.gpus * x.count for x in layout) \
        / w.concurrency
    return {"output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
            "tokens_per_s_per_user": per_user if w.concurrency > 1
            else p.tokens_per_s_per_user_p50}


def errors() -> list[tuple[str, str, float, float, float]]:
    """(case, metric, predicted, measured, relative error) for every measured value."""
    rows = []
    for case in load_cases():
        pred = predict_case(case)
        for metric, measured in case["measured"].items():
            got = pred[metric]
            rows.append((case["id"], metric, got, measured, got / measured - 1))
    return rows


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def log_error(rows) -> float:
    return math.sqrt(sum(math.log1p(r[4]) ** 2 for r in rows) / len(rows))
