"""Kernel-level accuracy of rackc's op model (compiler/perf/ops.py, fitted by fit.py).

(a) Held-out H200 measurements. For every (op, dtype), each shape group is held out in turn
    (a GEMM's (n, k), an expert GEMM's (k, n), an attention head layout and causality, one
    copy size); the curve is fitted on the other groups and predicts every point of the
    held-out one, across all M / tokens / batch / length values. Points measured through
    unfused attention fallbacks are excluded from the fit (fit.representative) and shown
    apart, predicted by the full fit, not counted.
(b) REFERENCE-DATA.md D: achieved rates published for H800 kernels (DeepGEMM, FlashMLA),
    against the rates the H200 curves predict on an H800 (the H200 system with H800's 3.35
    TB/s HBM; same GH100 SMs and peaks). The distance outside the published range is shown.

    python3 benchmarks/accuracy_ops.py [--raw compiler/catalog/calibration/hgx-h200.raw.json]

Exit status 1 when the overall median |error| of (a) exceeds 10%.
"""

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler import catalog
from compiler.catalog.system import Sourced, System
from compiler.perf import fit, ops

GOAL = 0.10  # median |error| at kernel level (the goal)
RAW = catalog.calibration_path("hgx-h200", "raw.json")
GROUP_KEYS = {
    "copy": ("bytes",),
    "gemm": ("n", "k"),
    "grouped_gemm": ("k", "n"),
    "attn_decode": ("q_heads", "kv_heads", "head_dim"),
    "attn_prefill": ("q_heads", "kv_heads", "head_dim", "causal"),
}


@dataclass(frozen=True)
class Row:
    label: str
    folds: int
    errors: np.ndarray

    def line(self) -> str:
        a = np.abs(self.errors)
        return (f"{self.label:<36}{self.folds:>6}{len(a):>7}{np.median(a):>9.1%}"
                f"{np.percentile(a, 90):>9.1%}")


def group_of(p: fit.Point) -> tuple:
    return tuple(p.query[key] for key in GROUP_KEYS[p.op])


def held_out_errors(op: str, dtype: str, pts: list[fit.Point], system: System,
                    fitted: dict[str, dict[str, ops.Curve]]) -> tuple[int, np.ndarray]:
    """(folds, errors of every point predicted by a fit that did not see its group)."""
    groups = sorted({group_of(p) for p in pts}, key=str)
    errors = []
    for held in groups:
        train = [p for p in pts if group_of(p) != held]
        test = [p for p in pts if group_of(p) == held]
        curve = fit.fit_group(op, dtype, train, system, fitted).curve
        errors.append(fit.Batch.of(test, system).errors(curve))
    return len(groups), np.concatenate(errors)


def held_out(raw_path: Path = RAW) -> tuple[list[Row], list[Row]]:
    """(counted rows per op/dtype, rows of excluded points) for a raw measurement file."""
    system = catalog.system("hgx-h200")
    all_points = fit.points(fit.load_raw(raw_path))
    full = fit.fit_all(all_points, system)
    fitted = {op: {dt: r.curve for dt, r in by_dt.items()} for op, by_dt in full.items()}
    counted, excluded = [], []
    for (op, dtype), pts in fit.group_points(all_points).items():
        used = [p for p in pts if fit.representative(p.query)]
        folds, errors = held_out_errors(op, dtype, used, system, fitted)
        counted.append(Row(f"{op} {dtype}", folds, errors))
        left = [p for p in pts if not fit.representative(p.query)]
        if left:
            errs = fit.Batch.of(left, system).errors(fitted[op][dtype])
            excluded.append(Row(f"{op} {dtype} unfused SDPA (MLA)", 0, errs))
    return counted, excluded


# ---------------------------------------------------------------------------------------
# (b) REFERENCE-DATA.md D


def h800(system: System) -> System:
    """H800 SXM: the H100's GH100 (132 SMs, 989/1979 TF dense) with 3.35 TB/s HBM3."""
    hbm = Sourced(value=3.35, source="REFERENCE-DATA.md A1: H100 SXM 3.35 TB/s (H800 alike)")
    return system.model_copy(update={"gpu": system.gpu.model_copy(
        update={"name": "H800", "hbm_tbytes_per_s": hbm})})


DSV3_DENSE_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                 (7168, 2048))  # DeepSeek-V3 projections, as DeepGEMM's README benchmarks
DSV3_EXPERT_KN = ((7168, 4096), (2048, 7168))  # routed expert gate+up and down
MASKED = ((1, 1024), (2, 512), (4, 256))  # assumed: 1-4 local experts at 1024-256 tokens each
CONTIGUOUS = ((4, 8192), (8, 4096))  # assumed: 4-8 local experts at 8192-4096 tokens each
FLASHMLA = {"batch": 128, "kv_len": 4096}  # assumed: a FlashMLA README-style decode batch

Rate = Callable[[ops.OpModel], Iterator[float]]


def gemm_rates(m: int, unit: str) -> Rate:
    def rates(om: ops.OpModel) -> Iterator[float]:
        for n, k in DSV3_DENSE_NK:
            work, us = ops.gemm_work("fp8", m, n, k), om.gemm("fp8", m, n, k)
            yield (work.nbytes / us / 1e6) if unit == "TB/s" else (work.flops / us / 1e6)
    return rates


def grouped_rates(configs: tuple, unit: str) -> Rate:
    def rates(om: ops.OpModel) -> Iterator[float]:
        for experts, tokens in configs:
            for k, n in DSV3_EXPERT_KN:
                work = ops.grouped_gemm_work("fp8", experts, tokens, k, n)
                us = om.grouped_gemm("fp8", experts, tokens, k, n)
                yield (work.nbytes / us / 1e6) if unit == "TB/s" else (work.flops / us / 1e6)
    return rates


def mla_rate(q_heads: int, unit: str) -> Rate:
    """DeepSeek-V3 MLA decode: 576-wide latent keys, 512-wide values, one shared KV head."""
    def rates(om: ops.OpModel) -> Iterator[float]:
        b, L = FLASHMLA["batch"], FLASHMLA["kv_len"]
        work = ops.attn_decode_work("bf16", b, q_heads, 1, 576, L, v_head_dim=512)
        us = om.attn_decode("bf16", b, q_heads, 1, 576, L, v_head_dim=512)
        yield (work.nbytes / us / 1e3) if unit == "GB/s" else (work.flops / us / 1e6)
    return rates


# (label, unit, published low, published high, rates); REFERENCE-DATA.md D, H800.
REFERENCE_D: tuple[tuple[str, str, float, float, Rate], ...] = (
    ("decode dense FP8 GEMM, M=64", "TB/s", 1.5, 2.7, gemm_rates(64, "TB/s")),
    ("decode dense FP8 GEMM, M=128", "TB/s", 1.5, 2.7, gemm_rates(128, "TB/s")),
    ("prefill dense FP8 GEMM, M=4096", "TFLOPS", 590, 1358, gemm_rates(4096, "TFLOPS")),
    ("decode MoE FP8 GEMM, masked", "TB/s", 0.92, 2.06, grouped_rates(MASKED, "TB/s")),
    ("decode MoE FP8 GEMM, masked", "TFLOPS", 815, 1233, grouped_rates(MASKED, "TFLOPS")),
    ("prefill MoE FP8 GEMM, contiguous", "TFLOPS", 1093, 1297,
     grouped_rates(CONTIGUOUS, "TFLOPS")),
    ("MLA decode, 16 heads (up to 3000)", "GB/s", 3000, 3000, mla_rate(16, "GB/s")),
    ("MLA decode, 128 heads (sets e_max)", "TFLOPS", 580, 660, mla_rate(128, "TFLOPS")),
)


def outside(value: float, low: float, high: float) -> float:
    """Relative distance of `value` outside [low, high]; 0 inside."""
    if value < low:
        return value / low - 1.0
    if value > high:
        return value / high - 1.0
    return 0.0


def fmt(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}"


def reference_lines() -> list[str]:
    system = h800(catalog.system("hgx-h200"))
    model = ops.op_model(system, catalog.calibration("hgx-h200"))
    lines = [f"{'REFERENCE-DATA.md D (H800)':<38}{'unit':<8}{'published':>13}{'predicted':>13}"
             f"{'in range':>10}{'worst':>7}"]
    for label, unit, low, high, rates in REFERENCE_D:
        values = list(rates(model))
        distances = [outside(v, low, high) for v in values]
        inside = sum(d == 0 for d in distances)
        lines.append(f"{label:<38}{unit:<8}{f'{fmt(low)}-{fmt(high)}':>13}"
                     f"{f'{fmt(min(values))}-{fmt(max(values))}':>13}"
                     f"{f'{inside}/{len(values)}':>10}{max(distances, key=abs):>+7.0%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", type=Path, default=RAW, help="raw H200 measurements")
    args = parser.parse_args(argv)
    counted, excluded = held_out(args.raw)
    print(f"{'held out by shape group':<36}{'folds':>6}{'points':>7}{'median':>9}{'p90':>9}")
    for row in counted:
        print(row.line())
    overall = np.median(np.abs(np.concatenate([r.errors for r in counted])))
    print(f"{'overall (pooled points)':<36}{'':>6}{sum(len(r.errors) for r in counted):>7}"
          f"{overall:>9.1%}")
    for row in excluded:
        print(row.line() + "   (not counted)")
    print()
    print("\n".join(reference_lines()))
    ok = overall <= GOAL
    print(f"\noverall median |error| {overall:.1%} {'<=' if ok else '>'} goal {GOAL:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
