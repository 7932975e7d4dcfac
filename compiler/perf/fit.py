"""Fit the op model's efficiency curves to raw operator measurements (numpy only).

Input: a raw calibration file written by compiler/perf/measure.py: {"schema":
"rackc.calibration.raw/v1", "device": {...}, "measurements": [{query fields..., "us", ...}]}.
Each (op, dtype) gets the `Curve` whose predictions minimise a robust loss on the log of
predicted over measured time, i.e. on relative error: soft-L1 with a 5% knee, so the few
points where a library picked a poor kernel do not drag the rest. The search is Nelder-Mead
over transformed parameters (logistic for efficiencies, so they stay in (0, 1) and no
prediction beats the roofline; log for the positive terms), restarted from its best point.

Which parameters each op fits, and why others are fixed, is in `SPECS`.
"""

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from compiler.catalog.system import System
from compiler.perf import ops
from compiler.perf.calibration_files import RAW_SCHEMA, SCHEMA
from compiler.perf.ops import ANY_DTYPE, MOE_TABLE_KEY, Curve, Work

LOSS_KNEE = 0.05  # relative error where the loss turns from quadratic to linear
DIGITS = 4  # significant digits of fitted parameters in the calibration file
RESTARTS = 3  # Nelder-Mead runs, each from the previous best with a smaller simplex
MAX_EVALS = 4000  # loss evaluations per Nelder-Mead run
# REFERENCE-DATA.md D: FlashMLA decode reaches 580-660 TFLOPS of H800's 989 BF16 dense when
# compute-bound; the middle, 620/989, is decode attention's compute efficiency.
DECODE_E_MAX = 0.63
# SDPA backends that are fused flash-attention kernels, as serving engines run. The unfused
# math path and the memory-efficient kernel only run where no fused kernel takes the shape
# (MLA's 576-wide latent heads) and are 5-30x slower than FlashMLA: not representative.
FUSED_ATTENTION = ("flash_attention", "cudnn_attention")
# Tables measured inside serving frameworks (compiler/perf/aiconfigurator.py) are the
# engines' own kernels: all representative.
SERVING_KERNELS = "aiconfigurator "

EFFICIENCIES = ("e_max", "e_mem")


class FitProblem(ValueError):
    """Measurements that pass the raw schema but cannot be fitted (told as a diagnostic)."""

    def __init__(self, field: str, expected: str, got: str, hint: str = ""):
        super().__init__(f"{field}: expected {expected}, got {got}")
        self.field, self.expected, self.got, self.hint = field, expected, got, hint


@dataclass(frozen=True)
class Point:
    """One measured query: the op whose curve it fits, dtype, the query (with its own `op`
    and `impl`) and the median time."""

    op: str
    dtype: str
    query: dict
    us: float


@dataclass(frozen=True)
class Spec:
    """What is fitted for one op: `free` parameters, fixed values, and values borrowed from
    another op's fitted curve of the same dtype (or bf16)."""

    free: tuple[str, ...]
    fixed: dict[str, float] = field(default_factory=dict)
    borrow: dict[str, str] = field(default_factory=dict)


ALL_TERMS = ("e_max", "size_half", "e_mem", "overhead_us", "depth_half", "streams_full")
OPTIONAL_TERMS = ("depth_half", "streams_full")  # 0 (neutral) where an op does not fit them
NEUTRAL_TERMS = ("size_half", "depth_half", "streams_full")  # 0 means "no such effect"
PRUNE_TOLERANCE = 1e-3  # loss increase accepted when a term is set to 0
# Fitted in this order, so an op can borrow from one fitted before it.
SPECS: dict[str, Spec] = {
    "copy": Spec(("e_mem", "overhead_us"), {"e_max": 1.0, "size_half": 0.0}),
    "gemm": Spec(ALL_TERMS),
    "grouped_gemm": Spec(ALL_TERMS),
    # GQA decode never becomes compute-bound, so its compute side cannot be fitted from it.
    "attn_decode": Spec(("e_mem", "overhead_us", "streams_full"),
                        {"e_max": DECODE_E_MAX, "size_half": 0.0}),
    # Prefill is compute-bound on every measured shape; its memory side streams the same
    # K/V as decode does, with the same kernels.
    "attn_prefill": Spec(("e_max", "size_half", "overhead_us", "depth_half"),
                         borrow={"e_mem": "attn_decode"}),
}
START = {"e_max": 0.7, "size_half": 16.0, "e_mem": 0.85, "overhead_us": 5.0,
         "depth_half": 64.0, "streams_full": 32.0}


# ---------------------------------------------------------------------------------------
# Measurements


def batched(work: Work, count: int) -> Work:
    """`count` independent copies of `work` in one launch (prefill of a batch of sequences)."""
    return replace(work, flops=work.flops * count, nbytes=work.nbytes * count,
                   streams=work.streams * count, free_bytes=work.free_bytes * count)


def moe_work(q: dict) -> tuple[Work, Work]:
    """A fused MoE as rackc's two grouped GEMMs on one rank: gate+up [hidden -> 2 inter] and
    down [inter -> hidden] over its local experts, routing balanced."""
    per_expert = q["tokens"] * q["top_k"] / q["experts"]
    return (ops.grouped_gemm_work(q["dtype"], q["local_experts"], per_expert, q["hidden"],
                                  2 * q["inter"]),
            ops.grouped_gemm_work(q["dtype"], q["local_experts"], per_expert, q["inter"],
                                  q["hidden"]))


# Each raw op's work, as the kernels that one measured call ran (a fused MoE is two).
WORK: dict[str, Callable[[dict], tuple[Work, ...]]] = {
    "gemm": lambda q: (ops.gemm_work(q["dtype"], q["m"], q["n"], q["k"]),),
    "grouped_gemm": lambda q: (ops.grouped_gemm_work(
        q["dtype"], q["experts"], q["tokens_per_expert"], q["k"], q["n"]),),
    "moe": moe_work,
    # measure.py: a single KV head is MLA's latent, and V is the same tensor as K
    "attn_decode": lambda q: (ops.attn_decode_work(
        q["dtype"], q["batch"], q["q_heads"], q["kv_heads"], q["head_dim"], q["kv_len"],
        v_head_dim=q["head_dim"] if q["kv_heads"] == 1 else None),),
    "attn_prefill": lambda q: (batched(ops.attn_prefill_work(
        q["dtype"], q["seq_len"], q["q_heads"], q["kv_heads"], q["head_dim"], q["causal"]),
        q.get("batch", 1)),),
    "copy": lambda q: (ops.copy_work(q["bytes"]),),
}
FITS = {"moe": "grouped_gemm"}  # raw op -> the curve it fits, where they differ


def load_raw(path: Path) -> dict:
    raw = json.loads(Path(path).read_text())
    if raw.get("schema") != RAW_SCHEMA:
        raise ValueError(f"{path}: schema is {raw.get('schema')!r}, expected {RAW_SCHEMA!r}")
    return raw


def dtype_of(query: dict) -> str:
    return query.get("dtype", ANY_DTYPE)


def representative(query: dict) -> bool:
    """False for attention measured through an unfused fallback (see FUSED_ATTENTION)."""
    impl = query.get("impl", "")
    if not query["op"].startswith("attn_") or impl.startswith(SERVING_KERNELS):
        return True
    return any(name in impl for name in FUSED_ATTENTION)


def points(raw: dict) -> list[Point]:
    """The raw file's measurements of ops the model fits (others are left for later)."""
    return [Point(FITS.get(m["op"], m["op"]), dtype_of(m), m, float(m["us"]))
            for m in raw["measurements"] if m["op"] in WORK]


NO_WORK = Work(0.0, 0.0)


def stacked_work(works: Sequence[Work]) -> Work:
    """The works as one Work of arrays, to evaluate a curve on all at once."""
    return Work(**{f.name: np.array([getattr(w, f.name) for w in works], dtype=float)
                   for f in fields(Work)})


@dataclass(frozen=True)
class Batch:
    """Points of one (op, dtype) prepared for fitting: their work (kernel j of every point in
    `parts[j]`, `used[j]` False where a point has fewer kernels), times and roofline peaks."""

    parts: tuple[Work, ...]
    used: tuple[np.ndarray, ...]
    us: np.ndarray
    flops_per_us: float
    hbm_bytes_per_us: float

    @classmethod
    def of(cls, pts: Sequence[Point], system: System) -> "Batch":
        dtype = pts[0].dtype
        peak = system.tflops("bf16" if dtype == ANY_DTYPE else dtype) * 1e6
        hbm = system.gpu.hbm_tbytes_per_s.value * 1e6
        kernels = [WORK[p.query["op"]](p.query) for p in pts]
        width = max(len(k) for k in kernels)
        parts = tuple(stacked_work([k[j] if j < len(k) else NO_WORK for k in kernels])
                      for j in range(width))
        used = tuple(np.array([j < len(k) for k in kernels]) for j in range(width))
        return cls(parts, used, np.array([p.us for p in pts]), peak, hbm)

    def predict(self, curve: Curve) -> np.ndarray:
        """Each point's time: the sum of its kernels' times on `curve`."""
        return sum(np.where(used, curve.time_us(work, self.flops_per_us, self.hbm_bytes_per_us),
                            0.0) for work, used in zip(self.parts, self.used, strict=True))

    def errors(self, curve: Curve) -> np.ndarray:
        """Relative errors, predicted over measured minus one."""
        return self.predict(curve) / self.us - 1.0


# ---------------------------------------------------------------------------------------
# Search


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float) -> np.ndarray:
    """Minimise f from x0 with the standard Nelder-Mead simplex (reflect, expand, contract,
    shrink); deterministic."""
    simplex = np.vstack([x0, x0 + step * np.eye(len(x0))])
    values = np.array([f(x) for x in simplex])
    evals = len(values)
    while evals < MAX_EVALS and np.ptp(values) > 1e-9 * (1.0 + abs(values.min())):
        order = np.argsort(values, kind="stable")
        simplex, values = simplex[order], values[order]
        centroid = simplex[:-1].mean(axis=0)
        worst = simplex[-1]
        trial = centroid + (centroid - worst)
        f_trial = f(trial)
        evals += 1
        if f_trial < values[0]:
            wide = centroid + 2.0 * (centroid - worst)
            f_wide = f(wide)
            evals += 1
            trial, f_trial = (wide, f_wide) if f_wide < f_trial else (trial, f_trial)
        elif f_trial >= values[-2]:
            trial = centroid + 0.5 * (worst - centroid)
            f_trial = f(trial)
            evals += 1
            if f_trial >= values[-1]:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [f(x) for x in simplex[1:]]
                evals += len(simplex) - 1
                continue
        simplex[-1], values[-1] = trial, f_trial
    return simplex[int(np.argmin(values))]


def to_unbounded(name: str, value: float) -> float:
    if name in EFFICIENCIES:
        return math.log(value / (1.0 - value))
    return math.log(value)


def from_unbounded(name: str, x: float) -> float:
    if name in EFFICIENCIES:
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x)


def fit_curve(batch: Batch, free: Sequence[str], fixed: dict[str, float]) -> Curve:
    """The curve with `fixed` terms whose `free` terms minimise the robust log-time loss."""
    log_us = np.log(batch.us)

    def curve_at(x: np.ndarray) -> Curve:
        return Curve(**fixed, **{n: from_unbounded(n, v) for n, v in zip(free, x, strict=True)})

    def loss(x: np.ndarray) -> float:
        try:
            return loss_of(batch, curve_at(x), log_us)
        except (ValueError, OverflowError):  # a term left its domain
            return math.inf

    x = np.array([to_unbounded(n, START[n]) for n in free])
    step = 1.0
    with np.errstate(all="ignore"):
        for _ in range(RESTARTS):
            x = nelder_mead(loss, x, step)
            step /= 3.0
        try:
            best = curve_at(x)
            return rounded(neutralised(best, lambda c: loss_of(batch, c, log_us)))
        except (ValueError, OverflowError):  # the search ran to a bound of a term
            raise FitProblem("measurements", "times a roofline curve can fit",
                             "times no curve with positive efficiencies fits",
                             "check the measurements' units (microseconds)") from None


def loss_of(batch: Batch, curve: Curve, log_us: np.ndarray) -> float:
    """Soft-L1 loss of the log-time residuals (relative errors) with a LOSS_KNEE knee."""
    residual = np.log(batch.predict(curve)) - log_us
    if not np.all(np.isfinite(residual)):
        return math.inf
    return float(np.sum(np.sqrt(1.0 + (residual / LOSS_KNEE) ** 2) - 1.0))


def neutralised(curve: Curve, loss: Callable[[Curve], float]) -> Curve:
    """`curve` with each optional term set to 0 (no effect) where the data do not need it:
    a term the measurements cannot see drifts to a meaningless extreme during the search."""
    for name in NEUTRAL_TERMS:
        trial = replace(curve, **{name: 0.0})
        if loss(trial) <= loss(curve) * (1.0 + PRUNE_TOLERANCE):
            curve = trial
    return curve


def rounded(curve: Curve) -> Curve:
    return Curve(**{f.name: float(f"{getattr(curve, f.name):.{DIGITS}g}")
                    for f in fields(Curve)})


# ---------------------------------------------------------------------------------------
# Calibration


@dataclass(frozen=True)
class FitResult:
    curve: Curve
    points: int
    excluded: int
    errors: np.ndarray

    def summary(self) -> dict[str, float | int]:
        abs_err = np.abs(self.errors)
        return {"points": self.points, "excluded": self.excluded,
                "median_abs_err": round(float(np.median(abs_err)), 4),
                "p90_abs_err": round(float(np.percentile(abs_err, 90)), 4)}


def fixed_terms(op: str, dtype: str, fitted: dict[str, dict[str, Curve]]) -> dict[str, float]:
    """The spec's fixed terms plus those it borrows from curves already fitted."""
    spec = SPECS[op]
    values = {name: 0.0 for name in OPTIONAL_TERMS if name not in spec.free}
    values.update(spec.fixed)
    for name, source_op in spec.borrow.items():
        source = fitted.get(source_op, {})
        curve = source.get(dtype) or source.get("bf16")
        if curve is None:
            raise FitProblem("measurements", f"{source_op} measurements of {dtype} or bf16 "
                             f"(a {op} curve borrows their {name})", "none",
                             f"measure {source_op} too, or leave {op} out")
        values[name] = getattr(curve, name)
    return values


def fit_group(op: str, dtype: str, pts: Sequence[Point], system: System,
              fitted: dict[str, dict[str, Curve]]) -> FitResult:
    """Fit one (op, dtype) on its representative points."""
    used = [p for p in pts if representative(p.query)]
    if not used:
        raise FitProblem("measurements", f"a {op} {dtype} measurement of a serving kernel",
                         f"{len(pts)} through unfused fallbacks only "
                         f"({pts[0].query.get('impl')!r})",
                         "measure with a fused attention backend (FUSED_ATTENTION in fit.py)")
    batch = Batch.of(used, system)
    curve = fit_curve(batch, SPECS[op].free, fixed_terms(op, dtype, fitted))
    return FitResult(curve, len(used), len(pts) - len(used), batch.errors(curve))


def group_points(pts: Sequence[Point]) -> dict[tuple[str, str], list[Point]]:
    groups: dict[tuple[str, str], list[Point]] = {}
    for p in pts:
        groups.setdefault((p.op, p.dtype), []).append(p)
    return groups


def fit_all(pts: Sequence[Point], system: System) -> dict[str, dict[str, FitResult]]:
    """Every measured (op, dtype), in SPECS order so borrowed terms are fitted first."""
    groups = group_points(pts)
    results: dict[str, dict[str, FitResult]] = {}
    curves: dict[str, dict[str, Curve]] = {}
    for op in SPECS:
        for dtype in sorted(dt for o, dt in groups if o == op):
            result = fit_group(op, dtype, groups[op, dtype], system, curves)
            results.setdefault(op, {})[dtype] = result
            curves.setdefault(op, {})[dtype] = result.curve
    return results


def curve_dict(curve: Curve) -> dict[str, float]:
    return {f.name: getattr(curve, f.name) for f in fields(Curve)}


def with_fp4(curves: dict[str, dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """fp4 takes the fp8 curve where it has none (see ops.py: fp4 runs as fp8-rate MMA on
    fp8 hardware; on FP4 hardware without fp4 measurements the efficiencies are assumed
    equal)."""
    return {op: {**({"fp4": by_dtype["fp8"]} if "fp8" in by_dtype else {}), **by_dtype}
            for op, by_dtype in curves.items()}


def describe(device: dict) -> str:
    return (f"measured on {device.get('gpu', 'an unnamed GPU')} (compute capability "
            f"{device.get('capability', '?')}, {device.get('sm_count', '?')} SMs, driver "
            f"{device.get('driver', '?')}, torch {device.get('torch', '?')}, CUDA "
            f"{device.get('cuda', '?')}) on {device.get('measured_on', '?')}, "
            "fitted by rackc calibrate")


NOTES = (
    "curves: t = overhead_us + max(flops / (peak * e_c), bytes / (bw * e_m)); e_c = e_max * "
    "size/(size+size_half) * depth/(depth+depth_half); e_m = e_mem * min(1, streams/"
    "streams_full); 0 turns a term off (compiler/perf/ops.py)",
    f"attn_decode compute side fixed: GQA decode is never compute-bound; e_max {DECODE_E_MAX}"
    " from FlashMLA's 580-660 TFLOPS of 989 (REFERENCE-DATA.md D)",
    "attn_prefill e_mem is attn_decode's: prefill is compute-bound on every measured shape",
    "attention measured through unfused SDPA fallbacks (math, memory-efficient: MLA's "
    "576-wide heads) is excluded as not representative of serving kernels (FlashMLA)",
    "fp4 curves are the fp8 curves (assumed); fp8 attention uses the bf16 curves on fp8 "
    "peaks and bytes (assumed)",
)


MIN_TABLE_COUNTS = 4  # fewer token counts would be extrapolated over decades


def moe_tables(calls: Sequence[dict]) -> list[dict]:
    """Measured fused-MoE calls (raw `moe` measurements) as tables: for each MoE shape on one
    rank (MOE_TABLE_KEY: dtype and its scales, hidden, per-rank intermediate, top-k, experts,
    local experts) the times by token count, the fastest where several calls share one. A
    shape with fewer than MIN_TABLE_COUNTS token counts gives no table. The step model
    interpolates them where a model's MoE is one of these shapes (ops.OpModel.fused_moe): the
    curve, fitted to every shape at once, misses single shapes by 14-33% (median) there."""
    best: dict[tuple, dict[int, float]] = {}
    for m in calls:
        by_tokens = best.setdefault(tuple(m[k] for k in MOE_TABLE_KEY), {})
        by_tokens[m["tokens"]] = min(float(m["us"]), by_tokens.get(m["tokens"], math.inf))
    return [{**dict(zip(MOE_TABLE_KEY, key, strict=True)), "tokens": sorted(times),
             "us": [times[t] for t in sorted(times)]}
            for key, times in sorted(best.items()) if len(times) >= MIN_TABLE_COUNTS]


def calibration(raw: dict, system: System) -> dict:
    """The calibration document (compiler/catalog/calibration/<system>.json) for a raw file.
    A raw file converted from published tables (compiler/perf/aiconfigurator.py) carries its
    provenance under "source": its description, licence, notice, notes and tables."""
    results = fit_all(points(raw), system)
    curves = {op: {dt: curve_dict(r.curve) for dt, r in by_dtype.items()}
              for op, by_dtype in results.items()}
    provenance = raw.get("source")
    document = {
        "schema": SCHEMA,
        "system": system.name,
        "source": describe(raw.get("device", {})),
        "notes": list(NOTES),
        "curves": with_fp4(curves),
        "fit": {op: {dt: r.summary() for dt, r in by_dtype.items()}
                for op, by_dtype in results.items()},
    }
    if raw.get("moe_tables"):
        document["moe_tables"] = raw["moe_tables"]
    if provenance:
        document.update(source=provenance["description"], licence=provenance["licence"],
                        notice=provenance["notice"], tables=provenance["tables"],
                        notes=[*NOTES, *provenance["notes"]])
    return document


def dumps(document: dict) -> str:
    """Canonical JSON: sorted keys, two-space indent, final newline; the measured MoE tables
    last, one a line."""
    rest = {key: value for key, value in document.items() if key != "moe_tables"}
    text = json.dumps(rest, indent=2, sort_keys=True)
    if not document.get("moe_tables"):
        return text + "\n"
    return f"{text[:-2]},\n{table_lines(document['moe_tables'], '  ')}\n}}\n"


def table_lines(tables: list[dict], indent: str) -> str:
    """`"moe_tables": [...]` with one table a line (thousands of numbers stay readable)."""
    rows = ",\n".join(f"{indent}  {json.dumps(t, sort_keys=True)}" for t in tables)
    return f'{indent}"moe_tables": [\n{rows}\n{indent}]'

