"""Convert NVIDIA AIConfigurator's measured kernel tables into rackc raw measurements.

Why: rackc has one GPU (an H200) to measure on. AIConfigurator (the `aiconfigurator-core`
wheel, Apache-2.0) ships kernel latencies that NVIDIA measured inside serving frameworks on
each GPU it supports: GEMMs, fused MoE, decode and prefill attention, MLA and NCCL
collectives, per framework version. `rackc calibrate --from-aiconfigurator` turns them into
the raw format compiler/perf/measure.py writes, and compiler/perf/fit.py fits rackc's curves
to them, so every listed system gets curves from real silicon instead of the H200's on
datasheet peaks.

What is read (`systems/data/<gpu>/<op>/<framework>/<version>/*.parquet`), newest version of
the first framework in FRAMEWORKS that has the table (vLLM first: rackc deploys vLLM; with
`--framework sglang|trtllm` that framework first, for the what-if calibrations `rackc predict
--kernels` reads). A table that gives no point rackc takes (TRT-LLM 1.3.0rc23's B200 MoE table
holds only one MXFP4 dtype: a partial re-collection) passes to the next older version:
* gemm_perf: bf16 (`torch.nn.functional.linear`), fp8 and nvfp4 (Blackwell) GEMMs -> `gemm`
  points. fp8 is the faster of the per-tensor scaled and the block-scaled (DeepGEMM, CUTLASS,
  FlashInfer) kernels for each shape: the checkpoint decides which one an engine runs, and
  rackc's fp8 stands for either.
* moe_perf, balanced routing only: the whole fused MoE (both expert GEMMs, activation,
  routing bookkeeping) at num_tokens, hidden, inter, top-k, experts and the moe TP / EP split
  -> `moe` points, fitted as the sum of rackc's two grouped GEMMs (fit.py).
* generation_attention_perf (window 0) -> `attn_decode`; the cache holds isl + step tokens.
* context_attention_perf (window 0) -> `attn_prefill`, causal, per batch of sequences.
* generation_mla_perf (pure MLA decode kernel; vLLM only has whole-module MLA tables, so
  SGLang's), bf16 cache -> `attn_decode` with one 576-wide latent head (DeepSeek-V3's 512 +
  64).
* nccl_perf and vLLM's custom all-reduce -> `nccl` / `custom_all_reduce` points, kept in the
  raw file as measured (message_size in elements of the stated dtype); the op model does not
  fit them yet.
Where a table has several kernels for one shape, the fastest is kept, as an engine picks it.
A point faster than the datasheet roofline of its shape's work is dropped (`physical`; the
count is in the file's table list): some fused-MoE points stream more expert weights than
the HBM can deliver in their time, so they did not do the work their shape names.
Latencies are milliseconds in the tables and microseconds here. Each (op, dtype) is thinned
to at most MAX_POINTS shapes, chosen by a hash of the shape, so the same wheel always gives
the same file.

Needs the `calibrate` extra (`pip install 'rackc[calibrate]'`: aiconfigurator-core, pandas,
pyarrow); imported only by `rackc calibrate --from-aiconfigurator`.
"""

import hashlib
import importlib.metadata
import importlib.resources
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from compiler import catalog
from compiler.catalog.system import System
from compiler.perf import fit, ops

PACKAGE = "aiconfigurator-core"
LICENCE = "Apache-2.0"
NOTICE = ("Contains data from NVIDIA AIConfigurator (aiconfigurator-core), Copyright (c) "
          "2025-2026 NVIDIA CORPORATION & AFFILIATES, licensed under the Apache License 2.0 "
          "(http://www.apache.org/licenses/LICENSE-2.0; the text is in compiler/catalog/"
          "calibration/AICONFIGURATOR-LICENSE.txt); converted to rackc's raw format and fitted "
          "by rackc calibrate --from-aiconfigurator")
# rackc catalog system -> AIConfigurator's system folder
SYSTEMS = {"hgx-h100": "h100_sxm", "hgx-h200": "h200_sxm", "hgx-b200": "b200_sxm",
           "hgx-b300": "b300_sxm", "gb200-nvl72": "gb200", "gb300-nvl72": "gb300"}
FRAMEWORKS = ("vllm", "sglang", "trtllm")
MAX_POINTS = 600  # per (op, dtype)
MLA_LATENT_DIM = 576  # DeepSeek-V3: kv_lora_rank 512 + qk_rope_head_dim 64
# Table dtype -> rackc dtype. fp8 takes both per-tensor and block-scaled kernels (the
# checkpoint decides which an engine runs; rackc's fp8 is either), the faster per shape.
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
MOE_DTYPES = GEMM_DTYPES
MOE_SCALES = {"fp8_block": "block"}  # a table dtype's scales, as a model's dtypes.scales says
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
NOTES = (
    "aiconfigurator: a fused MoE call is fitted as rackc's two grouped GEMMs (gate+up, down) "
    "on one rank's experts (num_experts / moe_ep) and width (inter / moe_tp), balanced "
    "routing; its routing and activation time goes into the grouped GEMM overhead",
    "aiconfigurator: decode attention attends isl + step cached tokens; MLA decode points "
    "are SGLang's pure MLA kernel on DeepSeek-V3's 576-wide latent (vLLM tables only time "
    "the whole MLA module); prefill attention is causal, per batch of sequences",
    "aiconfigurator: fp8 GEMM / MoE are the faster of the per-tensor and the block-scaled "
    "kernels per shape; fp4 curves are fitted to the nvfp4 tables where the GPU has them, "
    "else they are the fp8 curves",
    "aiconfigurator: no memory-copy table; copy keeps the default curve (80% of HBM "
    "bandwidth + 3 us, AIConfigurator's own memory-op model), unless merged measurements "
    "(--from-raw) bring copy points",
)


class SourceMissing(Exception):
    """The wheel, or a table in it, is not there; the message says which."""


def data_root() -> Path:
    """The wheel's systems/data folder."""
    try:
        root = importlib.resources.files("aiconfigurator_core") / "systems" / "data"
    except ModuleNotFoundError:
        raise SourceMissing(f"{PACKAGE} is not installed "
                            "(pip install 'rackc[calibrate]')") from None
    return Path(str(root))


def version() -> str:
    return importlib.metadata.version(PACKAGE)


def _version_key(text: str) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(text))
    except InvalidVersion:
        return (0, text)


def find_tables(gpu_dir: Path, op_dir: str, filename: str,
                frameworks: Iterable[str] = FRAMEWORKS) -> Iterator[tuple[str, str, Path]]:
    """(framework, version, path) of every `filename`: the frameworks in order, each newest
    version first."""
    for framework in frameworks:
        folder = gpu_dir / op_dir / framework
        if not folder.is_dir():
            continue
        versions = sorted((v.name for v in folder.iterdir() if (v / filename).is_file()),
                          key=_version_key)
        for v in reversed(versions):
            yield framework, v, folder / v / filename


def find_table(gpu_dir: Path, op_dir: str, filename: str,
               frameworks: Iterable[str] = FRAMEWORKS) -> tuple[str, str, Path] | None:
    """(framework, version, path) of the newest `filename` of the first framework having it."""
    return next(find_tables(gpu_dir, op_dir, filename, frameworks), None)


def _fastest(df, keys: list[str]):
    """One row per shape: the kernel with the lowest latency (ties: the first kernel name)."""
    df = df.sort_values([*keys, "latency", "kernel_source"], kind="stable")
    return df.drop_duplicates(keys, keep="first")


def _thin(rows: list[dict], cap: int = MAX_POINTS) -> list[dict]:
    """At most `cap` rows: those whose shape hashes lowest, a sample with no pattern across
    the grid (a stride would keep every n-th M, e.g. only odd ones) that is the same on every
    machine; kept in their original order."""
    if len(rows) <= cap:
        return rows

    def digest(row: dict) -> str:
        shape = {k: v for k, v in row.items() if k not in ("us", "impl")}
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()

    keep = set(sorted(range(len(rows)), key=lambda i: digest(rows[i]))[:cap])
    return [row for i, row in enumerate(rows) if i in keep]


def _impl(framework: str, kernel: str) -> str:
    """A point's kernel, prefixed so fit.py knows it ran in a serving framework."""
    return f"{fit.SERVING_KERNELS}{framework}: {kernel}"


def _us(ms: float) -> float:
    return round(float(ms) * 1e3, 3)


def _rackc_dtype(df, column: str, names: dict[str, str]):
    """Rows of a table dtype rackc takes, with that dtype in column `dtype`."""
    df = df[df[column].isin(list(names))]
    return df.assign(dtype=df[column].map(names))


def gemm_points(df, framework: str) -> list[dict]:
    df = _rackc_dtype(df, "gemm_dtype", GEMM_DTYPES)
    out = []
    for dtype, group in _fastest(df, ["dtype", "n", "k", "m"]).groupby("dtype", sort=True):
        rows = [{"op": "gemm", "dtype": dtype, "m": int(r.m), "n": int(r.n),
                 "k": int(r.k), "impl": _impl(framework, f"{r.gemm_dtype} {r.kernel_source}"),
                 "us": _us(r.latency)}
                for r in group.itertuples()]
        out += _thin(rows)
    return out


def _moe_call(r, framework: str) -> dict | None:
    """A fused MoE call as a raw `moe` measurement: experts and width as seen by one rank of
    the TP x EP split; None where the split does not divide them."""
    if r.num_experts % r.moe_ep_size or r.inter_size % r.moe_tp_size:
        return None
    return {"op": "moe", "dtype": r.dtype, "tokens": int(r.num_tokens),
            "hidden": int(r.hidden_size), "inter": int(r.inter_size // r.moe_tp_size),
            "top_k": int(r.topk), "experts": int(r.num_experts),
            "local_experts": int(r.num_experts // r.moe_ep_size),
            "tp": int(r.moe_tp_size), "ep": int(r.moe_ep_size),
            "impl": _impl(framework, f"{r.moe_dtype} {r.kernel_source}"), "us": _us(r.latency)}


def _balanced_moe(df):
    return _rackc_dtype(df[df.distribution == "balanced"], "moe_dtype", MOE_DTYPES)


MOE_KEYS = ["hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
            "num_tokens"]


def moe_points(df, framework: str) -> list[dict]:
    """Balanced-routing fused MoE, the fastest kernel per shape, a sample of each dtype's
    calls for the grouped GEMM curve."""
    out = []
    for _, group in _fastest(_balanced_moe(df), ["dtype", *MOE_KEYS]).groupby("dtype",
                                                                               sort=True):
        out += _thin([c for r in group.itertuples() if (c := _moe_call(r, framework))])
    return out


def catalog_moe_shapes() -> set[tuple[int, int, int, int]]:
    """(hidden, expert intermediate, experts, top-k) of the catalog's MoE models."""
    shapes = set()
    for name in catalog.model_names():
        spec = catalog.model(name).spec
        if spec.moe:
            shapes.add((spec.hidden_size, spec.moe.expert_intermediate, spec.moe.experts,
                        spec.moe.top_k))
    return shapes


def moe_table_points(df, framework: str) -> list[dict]:
    """Every call of the catalog's MoE shapes, at every TP x EP split and token count, the
    fastest kernel of each table dtype (FP8 block-scaled and per-tensor kernels apart: a
    checkpoint runs one of them): the tables the step model interpolates (fit.moe_tables)."""
    shapes = catalog_moe_shapes()
    out = []
    for r in _fastest(_balanced_moe(df), ["moe_dtype", *MOE_KEYS]).itertuples():
        call = _moe_call(r, framework)
        if call and (call["hidden"], int(r.inter_size), call["experts"], call["top_k"]) in shapes:
            out.append({**call, "scales": MOE_SCALES.get(r.moe_dtype, "")})
    return out


def whole_shapes(calls: list[dict], system: System) -> list[dict]:
    """The calls of the MoE shapes none of whose calls is faster than the roofline of the work
    it names: one such call says the collector routed fewer experts than the shape has (its
    balanced logits tie under DeepSeek's grouped top-k, so half the groups get every token),
    and then the shape's other calls read fewer weights than they name too."""
    kept = {id(c) for c in physical(calls, system)[0]}

    def shape(c: dict) -> tuple:
        return c["dtype"], c["scales"], c["hidden"], c["inter"] * c["tp"], c["experts"], \
            c["top_k"]

    bad = {shape(c) for c in calls if id(c) not in kept}
    return [c for c in calls if shape(c) not in bad]


def _attention(df):
    return df[(df.window_size == 0) & df.kv_cache_dtype.isin(list(KV_DTYPES))]


def decode_points(df, framework: str) -> list[dict]:
    keys = ["kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim", "batch_size",
            "isl", "step"]
    out = []
    for dtype, group in _fastest(_attention(df), keys).groupby("kv_cache_dtype", sort=True):
        rows = [{"op": "attn_decode", "dtype": KV_DTYPES[dtype], "batch": int(r.batch_size),
                 "q_heads": int(r.num_heads), "kv_heads": int(r.num_key_value_heads),
                 "head_dim": int(r.head_dim), "kv_len": int(r.isl + r.step),
                 "impl": _impl(framework, r.kernel_source), "us": _us(r.latency)}
                for r in group.itertuples()]
        out += _thin(rows)
    return out


def prefill_points(df, framework: str) -> list[dict]:
    keys = ["kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim", "batch_size",
            "isl"]
    out = []
    for dtype, group in _fastest(_attention(df), keys).groupby("kv_cache_dtype", sort=True):
        rows = [{"op": "attn_prefill", "dtype": KV_DTYPES[dtype], "batch": int(r.batch_size),
                 "seq_len": int(r.isl), "q_heads": int(r.num_heads),
                 "kv_heads": int(r.num_key_value_heads), "head_dim": int(r.head_dim),
                 "causal": True, "impl": _impl(framework, r.kernel_source),
                 "us": _us(r.latency)}
                for r in group.itertuples()]
        out += _thin(rows)
    return out


def mla_decode_points(df, framework: str) -> list[dict]:
    """bf16 caches only: with an fp8 cache the tabled kernel streams it at under 0.4 TB/s on
    the H200 (dequantising), which serving MLA kernels (FlashMLA) do not."""
    df = df[(df.kv_cache_dtype == "bfloat16") & (df.num_heads % df.tp_size == 0)]
    keys = ["kv_cache_dtype", "num_heads", "tp_size", "batch_size", "isl", "step"]
    out = []
    for dtype, group in _fastest(df, keys).groupby("kv_cache_dtype", sort=True):
        rows = [{"op": "attn_decode", "dtype": KV_DTYPES[dtype], "batch": int(r.batch_size),
                 "q_heads": int(r.num_heads // r.tp_size), "kv_heads": 1,
                 "head_dim": MLA_LATENT_DIM, "kv_len": int(r.isl + r.step),
                 "impl": _impl(framework, f"mla {r.kernel_source}"), "us": _us(r.latency)}
                for r in group.itertuples()]
        out += _thin(rows)
    return out


def nccl_points(df, framework: str) -> list[dict]:
    keys = ["op_name", "nccl_dtype", "num_gpus", "message_size"]
    return [{"op": "nccl", "collective": r.op_name, "dtype": r.nccl_dtype,
             "gpus": int(r.num_gpus), "message_size": int(r.message_size),
             "impl": _impl(framework, r.kernel_source), "us": _us(r.latency)}
            for r in _fastest(df, keys).itertuples()]


def custom_all_reduce_points(df, framework: str) -> list[dict]:
    """Graph-captured rows only (engines decode under CUDA graphs); a table that does not say
    how it ran (no `backend` column, TRT-LLM's) gives none, so the next framework's is taken."""
    if "backend" not in df.columns:
        return []
    df = df[df.backend.str.endswith("graph")]
    keys = ["allreduce_dtype", "num_gpus", "message_size"]
    return [{"op": "custom_all_reduce", "dtype": r.allreduce_dtype, "gpus": int(r.num_gpus),
             "message_size": int(r.message_size), "impl": _impl(framework, r.kernel_source),
             "us": _us(r.latency)}
            for r in _fastest(df, keys).itertuples()]


Convert = Callable[[object, str], list[dict]]
# (folder, file, frameworks to try, converter)
TABLES: tuple[tuple[str, str, tuple[str, ...], Convert], ...] = (
    ("gemm", "gemm_perf.parquet", FRAMEWORKS, gemm_points),
    ("moe", "moe_perf.parquet", FRAMEWORKS, moe_points),
    ("attention", "generation_attention_perf.parquet", FRAMEWORKS, decode_points),
    ("attention", "context_attention_perf.parquet", FRAMEWORKS, prefill_points),
    ("mla", "generation_mla_perf.parquet", FRAMEWORKS, mla_decode_points),
    ("comm/nccl", "nccl_perf.parquet", ("",), nccl_points),
    ("comm", "custom_allreduce_perf.parquet", FRAMEWORKS, custom_all_reduce_points),
)


def _nccl_table(gpu_dir: Path) -> tuple[str, str, Path] | None:
    """NCCL tables sit one level higher (comm/nccl/<version>): no framework folder."""
    folder = gpu_dir / "comm" / "nccl"
    if not folder.is_dir():
        return None
    versions = sorted((v.name for v in folder.iterdir() if (v / "nccl_perf.parquet").is_file()),
                      key=_version_key)
    return ("nccl", versions[-1], folder / versions[-1] / "nccl_perf.parquet") if versions \
        else None


def physical(points: list[dict], system: System) -> tuple[list[dict], int]:
    """(points no faster than the datasheet roofline of the work their shape names, how many
    were not). A faster one did less work than its shape says (weights shared between
    experts, data left in L2), so it cannot calibrate a curve of that work."""
    kept = []
    for point in points:
        work = fit.WORK.get(point["op"])
        if work is None:
            kept.append(point)
            continue
        dtype = point["dtype"]
        peak = system.tflops("bf16" if dtype == ops.ANY_DTYPE else dtype) * 1e6
        hbm = system.gpu.hbm_tbytes_per_s.value * 1e6
        floor = sum(max(w.flops / peak, w.nbytes / hbm) for w in work(point))
        if point["us"] >= floor:
            kept.append(point)
    return kept, len(points) - len(kept)


def preference(framework: str) -> tuple[str, ...]:
    """Frameworks in the order their tables are taken: `framework` first, then the others as
    FRAMEWORKS orders them (a table `framework` lacks, e.g. vLLM's pure MLA decode kernel,
    comes from the next that has it; `source.tables` names each table's framework)."""
    return (framework, *(f for f in FRAMEWORKS if f != framework))


def raw_document(system_name: str, framework: str = "vllm") -> dict:
    """rackc's raw calibration document for a catalog system, from the installed wheel, with
    `framework`'s tables where it has them."""
    import pandas as pd

    if system_name not in SYSTEMS:
        raise SourceMissing(f"AIConfigurator has no tables for {system_name!r}; it has "
                            f"{', '.join(sorted(SYSTEMS))}")
    system = catalog.system(system_name)
    gpu_dir = data_root() / SYSTEMS[system_name]
    if not gpu_dir.is_dir():
        raise SourceMissing(f"{PACKAGE} {version()} has no folder {gpu_dir.name}")
    measurements, tables, device = [], [], None
    moe_calls: list[dict] = []
    for op_dir, filename, frameworks, convert in TABLES:
        if op_dir == "comm/nccl":
            candidates = [found] if (found := _nccl_table(gpu_dir)) else []
        else:
            candidates = find_tables(gpu_dir, op_dir, filename, preference(framework)
                                     if frameworks == FRAMEWORKS else frameworks)
        for table_framework, table_version, path in candidates:
            df = pd.read_parquet(path)
            points, dropped = physical(convert(df, table_framework), system)
            if not points:  # e.g. a partial re-collection of one dtype rackc does not take:
                continue    # the next older version (or framework) has the table whole
            measurements += points
            if op_dir == "moe":
                moe_calls = whole_shapes(moe_table_points(df, table_framework), system)
            tables.append({"table": str(path.relative_to(data_root())),
                           "framework": table_framework, "version": table_version,
                           "points": len(points), "dropped_faster_than_roofline": dropped})
            device = device or str(df.device.iloc[0])
            break
    if not device:
        raise SourceMissing(f"{PACKAGE} {version()} has no kernel tables for {gpu_dir.name}")
    frameworks = sorted({f"{t['framework']} {t['version']}" for t in tables})
    description = (f"measured by NVIDIA AIConfigurator on {device} ({PACKAGE} {version()}, "
                   f"{LICENCE}; {', '.join(frameworks)}), converted and fitted by rackc "
                   "calibrate --from-aiconfigurator")
    return {
        "schema": fit.RAW_SCHEMA,
        "device": {"gpu": device, "measured_on": f"{PACKAGE} {version()}"},
        "source": {"description": description, "package": PACKAGE, "version": version(),
                   "licence": LICENCE, "notice": NOTICE, "notes": list(NOTES),
                   "tables": tables},
        "measurements": measurements,
        "moe_tables": fit.moe_tables(moe_calls),
    }


def merged(published: dict, own: dict) -> dict:
    """`published` plus the ops of `own` measurements that the published tables lack (on the
    H200: memory copies), for one calibration; the description says so."""
    have = {fit.FITS.get(m["op"], m["op"]) for m in published["measurements"]}
    extra = [m for m in own["measurements"] if fit.FITS.get(m["op"], m["op"]) not in have]
    if not extra:
        return published
    ops = sorted({m["op"] for m in extra})
    source = dict(published["source"])
    source["description"] += f"; {', '.join(ops)} {fit.describe(own.get('device', {}))}"
    return {**published, "source": source,
            "measurements": published["measurements"] + extra}
