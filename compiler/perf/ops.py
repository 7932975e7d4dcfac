"""Operator costs: a roofline with efficiency curves, per system and dtype.

    t(op) = overhead + max(flops / (peak * e_c), bytes / (bw * e_m))

    e_c = e_max * size / (size + size_half) * depth / (depth + depth_half)
    e_m = e_mem * min(1, streams / streams_full)

* `size` is the parallel work that fills an MMA tile (GEMM rows M, tokens per expert, query
  rows per KV head, the KV length each query attends in prefill); small sizes waste the tile.
* `depth` is the reduction each output tile loops over (GEMM K, attention head_dim); a short
  loop leaves the tile's fixed prologue and epilogue unamortised.
* `streams` counts the independent memory streams (128-wide weight column tiles, (sequence,
  KV head) pairs, query heads); a kernel with fewer than `streams_full` of them cannot keep
  enough loads in flight to reach `e_mem` of the bandwidth. Streams never grow with the
  sizes that time must not fall with (M, tokens, lengths), only with the data they read.
* `e_max`, `e_mem` <= 1 and the other terms only add time, so no prediction beats the
  roofline; a system with higher peaks or bandwidth never predicts slower for the same curves.
* All terms are relative to the GPU's peaks, so another system can carry a curve as is.

The curves' parameters come from a calibration file fitted to measurements on a real GPU
(`rackc calibrate`, compiler/perf/fit.py: NVIDIA AIConfigurator's kernel tables for the GPUs
it covers, our own H200's); a system without measurements carries a kindred system's curves
on its own datasheet peaks (`assumed`; Vera Rubin: GB300's), and with no calibration at all
the defaults below (REFERENCE-DATA.md D) apply. Memory-bound ops take a `placement` for GPUs
with two memory domains (Rubin): die-local data streams at full bandwidth, interleaved and
other-domain data at the system's `hbm_interleaved_factor` / `hbm_remote_factor`.
"""

import bisect
import math
from dataclasses import dataclass, field, fields

from compiler.catalog.system import System
from compiler.perf import routing

DTYPES = ("bf16", "fp8", "fp4")
BYTES = {"fp4": 0.5625, "fp8": 1.0, "bf16": 2.0}  # fp4: 4-bit values + one fp8 scale per 16
PLACEMENTS = ("local", "interleaved", "remote")
ANY_DTYPE = "any"  # curve key of ops without a dtype (copy)
TILE = 128  # columns of one CTA output tile: the Hopper/Blackwell CUTLASS default 128x128
FULL_TILE = 1e12  # `size` of work computed in whole tiles: no small-size loss left to model


@dataclass(frozen=True)
class Work:
    """What one operator asks of a GPU. Fields may be numpy arrays (the fitter evaluates many
    measurements at once); see the module docstring for `size`, `depth` and `streams`."""

    flops: float
    nbytes: float
    size: float = 1.0
    depth: float = 1.0
    streams: float = math.inf
    free_bytes: float = 0.0  # of nbytes: activation rows, read at e_mem whatever `streams` is


@dataclass(frozen=True)
class Curve:
    """Efficiency curve of one op family and dtype (see the module docstring)."""

    e_max: float  # compute efficiency at large size and depth
    size_half: float  # size at which half of e_max is reached
    e_mem: float  # share of peak HBM bandwidth reached when memory-bound
    overhead_us: float  # launch, prologue and tail cost
    depth_half: float = 0.0  # reduction length at which half of e_max is reached
    streams_full: float = 0.0  # memory streams needed to reach e_mem; 0: any number does

    def __post_init__(self) -> None:
        if not (0 < self.e_max <= 1 and 0 < self.e_mem <= 1):
            raise ValueError(f"efficiencies must be in (0, 1]: {self}")
        if min(self.size_half, self.overhead_us, self.depth_half, self.streams_full) < 0:
            raise ValueError(f"curve terms must be >= 0: {self}")

    def compute_eff(self, size: float, depth: float) -> float:
        return (self.e_max * size / (size + self.size_half)
                * depth / (depth + self.depth_half))

    def memory_eff(self, streams: float) -> float:
        if not self.streams_full:
            return self.e_mem
        return self.e_mem * _minimum(1.0, streams / self.streams_full)

    def time_us(self, work: Work, flops_per_us: float, hbm_bytes_per_us: float) -> float:
        compute = work.flops / (flops_per_us * self.compute_eff(work.size, work.depth))
        limited = work.nbytes - work.free_bytes
        memory = (limited / (hbm_bytes_per_us * self.memory_eff(work.streams))
                  + work.free_bytes / (hbm_bytes_per_us * self.e_mem))
        return self.overhead_us + _maximum(compute, memory)


def _minimum(a, b):
    """Elementwise for the fitter's numpy arrays, plain (and fast, with no numpy import) for
    the predictor's floats."""
    if hasattr(a, "__array__") or hasattr(b, "__array__"):
        import numpy as np

        return np.minimum(a, b)
    return min(a, b)


def _maximum(a, b):
    if hasattr(a, "__array__") or hasattr(b, "__array__"):
        import numpy as np

        return np.maximum(a, b)
    return max(a, b)


CURVE_FIELDS = tuple(f.name for f in fields(Curve))
# a measured fused-MoE table's shape on one rank (fit.moe_tables writes them, fused_moe reads)
MOE_TABLE_KEY = ("dtype", "scales", "hidden", "inter", "top_k", "experts", "local_experts")

# REFERENCE-DATA.md D: prefill FP8 GEMM ~55-65% of peak, memory-bound ops 80% of HBM BW + 3 us
# (aiconfigurator); grouped GEMM 55-66% at large token counts; FlashMLA ~90% BW.
DEFAULT_CURVES: dict[str, Curve] = {
    "gemm": Curve(0.65, 64.0, 0.80, 3.0),
    "grouped_gemm": Curve(0.60, 128.0, 0.70, 5.0),
    "attn_decode": Curve(0.60, 8.0, 0.85, 4.0),
    "attn_prefill": Curve(0.60, 512.0, 0.80, 5.0),
    "copy": Curve(1.0, 1.0, 0.80, 3.0),
}
# An op without curves of its own borrows a kindred op's: the indexer streams a key cache
# against a few query rows, as decode attention does, and linear attention streams each
# sequence's state.
KINDRED = {"indexer": "attn_decode", "linear_attention": "attn_decode"}
# Tokens per chunk of the chunked linear-attention prefill: assumed 64, as vLLM's chunked
# delta-rule kernels take (model_executor/layers/mamba/ops/gdn_chunk_cutedsl/__init__.py
# chunk_size 64); the KDA ones read FLA_CHUNK_SIZE (models/kimi_k3/nvidia/ops/third_party/kda/
# chunk.py l.289) from a module this install lacks
LINEAR_CHUNK = 64
# State bytes per element of the linear attention's recurrent state (FP32: compiler.arch)
STATE_BYTES = 4


def _act_bytes(dtype: str) -> float:
    """fp4 weights multiply fp8 activations (block-scaled MMA); others keep their dtype."""
    return BYTES["fp8"] if dtype == "fp4" else BYTES[dtype]


def gemm_work(dtype: str, m: float, n: int, k: int) -> Work:
    """y[M,N] = x[M,K] @ W[N,K]^T with a bf16 output."""
    rows = m * k * _act_bytes(dtype) + m * n * 2
    return Work(2.0 * m * n * k, n * k * BYTES[dtype] + rows, size=m, depth=k,
                streams=math.ceil(n / TILE), free_bytes=rows)


def grouped_gemm_work(dtype: str, experts: int, tokens_per_expert: float, k: int, n: int,
                      skew: float = 1.0, tile_rows: int = 0) -> Work:
    """E expert GEMMs [T,K] x [K,N]; only experts that receive a token are read. `skew` >= 1
    scales every expert's tokens to the busiest rank's (critical path). `tile_rows` 0: exactly
    T rows per expert, routed evenly (as the kernel tables measure it: fewer than one token
    per expert touches E*T experts). `tile_rows` >= 1: tokens arrive by random routing
    (Poisson per expert), so E (1 - e^-T) experts receive any, and each expert's rows are
    computed in M tiles of that many rows (routing.padded_rows; 1: no padding beyond what
    the fitted curve already holds)."""
    t = tokens_per_expert * skew
    rows = experts * t * (k * _act_bytes(dtype) + n * 2)
    if tile_rows:
        active = experts * -math.expm1(-t)
        padded = routing.padded_rows(t, tile_rows)
        size = FULL_TILE if tile_rows > 1 else _maximum(t, 1.0)
    else:
        active, padded, size = experts * _minimum(1.0, t), t, _maximum(t, 1.0)
    flops = 2.0 * experts * padded * n * k
    return Work(flops, active * n * k * BYTES[dtype] + rows, size=size, depth=k,
                streams=active * math.ceil(n / TILE), free_bytes=rows)


def attn_decode_work(dtype: str, batch: int, q_heads: int, kv_heads: int, head_dim: int,
                     kv_len: int, q_len: int = 1, v_head_dim: int | None = None,
                     topk: int | None = None) -> Work:
    """`batch` sequences attend `q_len` new tokens each over `kv_len` cached tokens (capped at
    `topk` by a sparse indexer). MLA: kv_heads 1, head_dim = latent + rope and v_head_dim =
    latent; V is a slice of the cached latent, which is read once."""
    v_dim = v_head_dim or head_dim
    attended = min(kv_len, topk) if topk else kv_len
    latent = v_head_dim is not None and kv_heads == 1
    row = head_dim if latent else head_dim + v_dim
    kv_bytes = batch * attended * kv_heads * row * BYTES[dtype]
    q_bytes = batch * q_len * q_heads * (head_dim + v_dim) * 2  # queries in, outputs out
    flops = 2.0 * batch * q_len * q_heads * attended * (head_dim + v_dim)
    return Work(flops, kv_bytes + q_bytes, size=q_len * q_heads / kv_heads, depth=head_dim,
                streams=batch * kv_heads)


def attn_prefill_work(dtype: str, seq_len: int, q_heads: int, kv_heads: int, head_dim: int,
                      causal: bool = True, kv_len: int = 0,
                      v_head_dim: int | None = None) -> Work:
    """`seq_len` new tokens attending themselves (causal or not) plus `kv_len` cached ones."""
    v_dim = v_head_dim or head_dim
    pairs = seq_len * kv_len + (seq_len * (seq_len + 1) / 2 if causal else seq_len ** 2)
    nbytes = (seq_len * (q_heads + 2 * kv_heads) * head_dim * 2
              + kv_len * kv_heads * (head_dim + v_dim) * BYTES[dtype]
              + seq_len * q_heads * v_dim * 2)
    return Work(2.0 * q_heads * pairs * (head_dim + v_dim), nbytes, size=pairs / seq_len,
                depth=head_dim, streams=q_heads)


def indexer_work(dtype: str, batch: int, q_len: int, heads: int, head_dim: int,
                 kv_len: int) -> Work:
    """Sparse attention's lightning indexer: MQA logits of `heads` query heads against one
    key per cached token, then a top-k over the float32 logits (written and read back)."""
    flops = 2.0 * batch * q_len * heads * kv_len * head_dim
    nbytes = (batch * kv_len * head_dim * BYTES[dtype] + batch * q_len * heads * head_dim * 2
              + 2 * batch * q_len * kv_len * 4)
    return Work(flops, nbytes, size=q_len * heads, depth=head_dim, streams=batch)


def linear_attention_work(batch: int, q_len: int, heads: int, head_dim: int) -> Work:
    """Linear attention (gated delta rule) of `batch` sequences, `q_len` new tokens each, at
    any context length: per token and head, four head_dim x head_dim passes over the state
    (its decay, its prediction of the key's value, the rank-1 update, the query's read),
    and within a chunk the tokens' keys against the chunk's other queries and keys; each
    sequence's FP32 state is read and written once, the tokens' q, k, v, gate and output
    stream through in BF16."""
    d, tokens = head_dim, batch * q_len
    chunk = min(q_len, LINEAR_CHUNK)
    flops = 2.0 * tokens * heads * (4 * d * d + 2 * chunk * d)
    nbytes = 2 * batch * heads * d * d * STATE_BYTES + tokens * heads * d * 5 * 2
    return Work(flops, nbytes, size=chunk, depth=d, streams=batch * heads)


def copy_work(nbytes: float) -> Work:
    """A device copy; `nbytes` counts bytes read plus bytes written."""
    return Work(0.0, nbytes)


@dataclass(frozen=True)
class OpModel:
    """Costs of operators on one GPU (or one memory domain: see `bw_scale`) of a system."""

    system: System
    curves: dict[str, dict[str, Curve]] = field(default_factory=dict)  # op -> dtype -> curve
    source: str = "defaults (REFERENCE-DATA.md D)"
    bw_scale: float = 1.0  # <1 when an op only reaches part of the GPU's HBM (remote domain)
    floors: dict[str, dict[str, float]] = field(default_factory=dict)  # op -> dtype -> us
    # measured fused MoE per shape (MOE_TABLE_KEY) -> (token counts, us), ascending
    moe_tables: dict[tuple, tuple[tuple[int, ...], tuple[float, ...]]] = field(
        default_factory=dict)
    # time_us by its exact arguments: the solver's search asks for the same kernels (rounded
    # token counts) many thousand times; the model is frozen, so a hit is the same number
    _times: dict[tuple, float] = field(default_factory=dict, init=False, repr=False,
                                       compare=False)

    def curve(self, op: str, dtype: str) -> Curve:
        """The op's curve for `dtype`; fp4 falls back to fp8 (same MMA path on fp8 hardware,
        assumed elsewhere), any dtype to bf16, an uncalibrated op to its kindred op."""
        for name in (op, KINDRED.get(op)):
            by_dtype = self.curves.get(name or "", {})
            for key in (dtype, "fp8" if dtype == "fp4" else dtype, "bf16", ANY_DTYPE):
                if key in by_dtype:
                    return by_dtype[key]
        return DEFAULT_CURVES[KINDRED.get(op, op)]

    def peak_tflops(self, dtype: str) -> float:
        return self.system.tflops(dtype)

    def hbm_bytes_per_us(self, placement: str = "local") -> float:
        """HBM bandwidth reachable for data placed `placement` relative to the reading SMs."""
        gpu = self.system.gpu
        factor = {"local": 1.0, "interleaved": gpu.hbm_interleaved_factor.value,
                  "remote": gpu.hbm_remote_factor.value}[placement]
        return gpu.hbm_tbytes_per_s.value * 1e6 * self.bw_scale * factor

    def roofline_us(self, flops: float, nbytes: float, dtype: str) -> float:
        return max(flops / (self.peak_tflops(dtype) * 1e6), nbytes / self.hbm_bytes_per_us())

    def floor_us(self, op: str, dtype: str = ANY_DTYPE) -> float | None:
        """The op's measured per-call floor under CUDA graphs (floors.py), with the curves'
        dtype fallbacks; None when not measured."""
        for name in (op, KINDRED.get(op)):
            by_dtype = self.floors.get(name or "", {})
            for key in (dtype, "fp8" if dtype == "fp4" else dtype, "bf16", ANY_DTYPE):
                if key in by_dtype:
                    return by_dtype[key]
        return None

    def kernel_floor(self, kernel: str) -> float:
        """A small elementwise kernel's cost: its measured floor, else a copy's."""
        floor = self.floor_us(kernel, "bf16")
        return floor if floor is not None else self.copy(0)

    def time_us(self, op: str, dtype: str, work: Work, placement: str = "interleaved") -> float:
        """The curve's time, its fitted overhead replaced by the op's measured floor where the
        calibration has one (the fixed cost of one call inside a CUDA graph)."""
        key = (op, dtype, work, placement)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = self._time_us(op, dtype, work, placement)
        return t

    def _time_us(self, op: str, dtype: str, work: Work, placement: str) -> float:
        peak = self.peak_tflops("bf16" if dtype == ANY_DTYPE else dtype) * 1e6
        curve = self.curve(op, dtype)
        t = float(curve.time_us(work, peak, self.hbm_bytes_per_us(placement)))
        floor = self.floor_us(op, dtype) if self.floors else None
        return t if floor is None else t - curve.overhead_us + floor

    def gemm(self, dtype: str, m: int, n: int, k: int, placement: str = "interleaved") -> float:
        """y[M,N] = x[M,K] @ W[N,K]^T; activations in the weight dtype (fp4: fp8 activations)."""
        return self.time_us("gemm", dtype, gemm_work(dtype, m, n, k), placement)

    def grouped_gemm(self, dtype: str, experts: int, tokens_per_expert: float, k: int, n: int,
                     skew: float = 1.0, placement: str = "interleaved",
                     weight_only: bool = False, tile_rows: int = 0) -> float:
        """E expert GEMMs [T,K] x [K,N]. `skew` >= 1: the busiest rank's load over the mean,
        which sets the step's critical path when routing is uneven; `tile_rows`: see
        grouped_gemm_work. No tokens: no launch. `weight_only`: `dtype` weights are read, but
        the math runs on BF16 tensor cores."""
        if tokens_per_expert <= 0:
            return 0.0
        work = grouped_gemm_work(dtype, experts, tokens_per_expert, k, n, skew, tile_rows)
        return self.time_us("grouped_gemm", "bf16" if weight_only else dtype, work, placement)

    def fused_moe(self, dtype: str, scales: str, tokens: float, hidden: int, inter: int,
                  top_k: int, experts: int, local_experts: int) -> float | None:
        """A measured fused MoE on one rank (`tokens` before routing, `inter` the rank's
        width; `scales` the checkpoint's: FP8 block-scaled and per-tensor kernels differ) from
        the calibration's tables: linear between measured token counts, the first count's time
        below them, the last two counts' slope beyond them. A width the tables lack (e.g. TP8
        where only TP1-4 were measured) is taken linearly from the two nearest measured widths
        of the same experts at that token count (the call's bytes and flops are affine in its
        width); below the narrowest, never under its time in proportion to width. None when
        no table has these experts."""
        if tokens <= 0:
            return None
        key = (dtype, scales, hidden, inter, top_k, experts, local_experts)
        if key in self.moe_tables:
            return _interpolated(*self.moe_tables[key], tokens)
        widths = sorted(k[3] for k in self.moe_tables
                        if k[:3] == key[:3] and k[4:] == key[4:])
        if len(widths) < 2:
            return None
        i = min(max(bisect.bisect_left(widths, inter), 1), len(widths) - 1)
        (w0, w1) = widths[i - 1:i + 1]
        u0, u1 = (_interpolated(*self.moe_tables[(*key[:3], w, *key[4:])], tokens)
                  for w in (w0, w1))
        affine = u0 + (u1 - u0) * (inter - w0) / (w1 - w0)
        return max(affine, u0 * inter / w0) if inter < w0 else affine

    def attn_decode(self, dtype: str, batch: int, q_heads: int, kv_heads: int, head_dim: int,
                    kv_len: int, q_len: int = 1, v_head_dim: int | None = None,
                    topk: int | None = None, placement: str = "interleaved") -> float:
        """Each of `batch` sequences attends `q_len` new tokens over `kv_len` cached tokens
        (MLA: kv_heads 1, head_dim = latent + rope, v_head_dim = latent; sparse attention:
        `topk` caps the attended tokens, the indexer is costed by `indexer`)."""
        work = attn_decode_work(dtype, batch, q_heads, kv_heads, head_dim, kv_len, q_len,
                                v_head_dim, topk)
        attended = min(kv_len, topk) if topk else kv_len
        return self.softmax_bound(self.time_us("attn_decode", dtype, work, placement),
                                  batch * q_len * q_heads * attended)

    def attn_prefill(self, dtype: str, seq_len: int, q_heads: int, kv_heads: int, head_dim: int,
                     causal: bool = True, kv_len: int = 0, v_head_dim: int | None = None) -> float:
        """`seq_len` new tokens attending themselves (causal) plus `kv_len` cached tokens."""
        work = attn_prefill_work(dtype, seq_len, q_heads, kv_heads, head_dim, causal, kv_len,
                                 v_head_dim)
        pairs = seq_len * kv_len + (seq_len * (seq_len + 1) / 2 if causal else seq_len ** 2)
        return self.softmax_bound(self.time_us("attn_prefill", dtype, work), q_heads * pairs)

    def softmax_bound(self, t_us: float, exps: float) -> float:
        """An attention kernel computes one exponential per (query head, query, key) scored
        and overlaps them with its matrix products (FlashAttention-3's ping-pong softmax), so
        it lasts at least as long as the special function units need for them: a bound that
        binds at short head dims, low-precision products or many query heads per KV read
        (MLA decode with speculative tokens), and that Blackwell Ultra and Rubin relax."""
        return max(t_us, exps / (self.system.gpu.exp_tera_per_s.value * 1e6))

    def indexer(self, dtype: str, batch: int, q_len: int, heads: int, head_dim: int,
                kv_len: int, placement: str = "interleaved") -> float:
        """The sparse-attention indexer's logits and top-k over all `kv_len` cached tokens."""
        work = indexer_work(dtype, batch, q_len, heads, head_dim, kv_len)
        return self.time_us("indexer", dtype, work, placement)

    def linear_attention(self, batch: int, q_len: int, heads: int, head_dim: int) -> float:
        """The linear-attention core of `batch` sequences of `q_len` new tokens each: its
        cost grows with the new tokens, never with the context."""
        return self.time_us("linear_attention", "bf16",
                            linear_attention_work(batch, q_len, heads, head_dim))

    def copy(self, nbytes: float, placement: str = "interleaved") -> float:
        """Device-to-device copy; `nbytes` counts bytes read plus bytes written."""
        return self.time_us("copy", ANY_DTYPE, copy_work(nbytes), placement)


def _interpolated(counts: tuple[int, ...], times: tuple[float, ...], tokens: float) -> float:
    """A table's time at `tokens`: linear between measured counts, the first count's time
    below them, the last two counts' slope beyond them."""
    i = bisect.bisect_left(counts, tokens)
    if i == 0:
        return times[0]
    i = min(i, len(counts) - 1)
    (t0, t1), (u0, u1) = counts[i - 1:i + 1], times[i - 1:i + 1]
    return u0 + (u1 - u0) * (tokens - t0) / (t1 - t0)


def curve_from_dict(data: dict) -> Curve:
    """A curve from a calibration file's entry; an unknown key is an error, not ignored."""
    unknown = sorted(set(data) - set(CURVE_FIELDS))
    if unknown:
        raise ValueError(f"unknown curve terms {unknown}; known: {', '.join(CURVE_FIELDS)}")
    return Curve(**{name: float(value) for name, value in data.items()})


def op_model(system: System, calibration: dict | None,
             floors: dict[str, dict[str, float]] | None = None) -> OpModel:
    """The op model of a system from its (or the H200's) calibration file, or defaults;
    `floors` (op -> dtype -> us) replaces the curves' fitted per-call overheads."""
    if not calibration:
        return OpModel(system, floors=floors or {})
    curves = {op: {dt: curve_from_dict(c) for dt, c in by_dtype.items()}
              for op, by_dtype in calibration["curves"].items()}
    tables = {tuple(t[k] for k in MOE_TABLE_KEY): (tuple(t["tokens"]), tuple(t["us"]))
              for t in calibration.get("moe_tables", ())}
    return OpModel(system, curves, calibration.get("source", "calibration"),
                   floors=floors or {}, moe_tables=tables)
