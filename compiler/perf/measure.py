"""Measure the cost of the operators rackc's perf model is built from, on the local GPU.

Why: the perf model answers ``rackc perf ops`` queries (GEMM, MoE grouped GEMM, decode and
prefill attention, device copies) by interpolating inside a grid measured on real silicon,
as AIConfigurator does, and falls back to "utilisation = speed-of-light / measured" outside
it. This script produces that grid for one GPU, as raw JSON that the catalog's calibration
loader reads. It needs only PyTorch and the standard library, so it runs unchanged on a bare
GPU machine.

What: every grid point is one query in exactly the ``rackc perf ops`` form plus ``us`` (median
microseconds per call), ``us_p10``, ``us_p90``, ``reps`` (timed samples) and ``impl`` (the
kernel path that ran). Shapes come from DeepSeek-V3, Qwen3-235B, Llama-3.1-70B, gpt-oss-120b
and GLM-4.5 (REFERENCE-DATA.md section B): the dense projections and LM head, the routed
experts' gate+up and down GEMMs at 8..256 local experts, GQA / MHA / MLA-latent decode
attention, causal prefill attention, and copies of 1 MiB to 8 GiB.

``--grid floors`` measures per-kernel floors instead: the same ops at batch 1 and tiny shapes
(GEMM M 1-128 on router, projection and square shapes; grouped GEMM at 1-4 tokens per
expert; decode attention at batch 1-4 over 16-1024 cached tokens, MLA's 576-wide latent
heads included; copies of 1 KiB to 1 MiB) and the elementwise kernels around a layer's GEMMs
over a size sweep of 1 to 32k tokens: RMSNorm, residual add + RMSNorm, SiLU x mul and the
router's top-k + softmax, and the engine kernels of compiler/perf/engine_kernels.py (q/k norm
+ RoPE, align + permute of the routed rows, the weighted un-permute sum). Add + RMSNorm and
SiLU x mul are timed both as PyTorch's separate kernels and fused by ``torch.compile`` (one
Triton kernel, as engines fuse them), top-k + softmax as PyTorch's two kernels and as one
Triton kernel, and the faster is kept. Every call is inside a CUDA graph, as engines decode.

How:
* Inputs are random (zeros run measurably faster), generated on the GPU from a fixed seed.
* A point whose inputs and outputs are small is given several input sets whose total passes
  ``ROTATE_BYTES`` (about four times the 60 MB L2), and each call uses the next set, so
  weights are read from HBM as they are in serving.
* After a warm-up pass, one pass over all sets is captured in a CUDA graph and each replay
  is timed with CUDA events; a sample is a replay's time over the calls in it. Graph replay
  removes host launch gaps, as serving engines' decode graphs do.
* Where PyTorch has several kernels for an op, each is timed and the fastest kept, as an
  engine would pick it: the SDPA backends (flash, cuDNN, memory-efficient, and at decode the
  unfused math path; at prefill math only where no fused backend runs), and for copies both
  ``cudaMemcpyAsync`` and an SM copy kernel. A variant that raises (out of memory, shape
  declined, capture refused) is dropped and logged once; a point left with none is skipped
  and logged.
* fp8 means e4m3 operands with row-wise float32 scales and a bf16 output
  (``torch._scaled_mm`` / ``torch._scaled_grouped_mm`` with fast accumulation).
* Grouped GEMM uses ``torch._grouped_mm`` / ``torch._scaled_grouped_mm`` on one [E*T, K]
  activation and [E, N, K] weights with equal tokens per expert.
* Decode attention packs the H/G query heads that share a KV head into the query-length axis
  (one SDPA call over [B, G, H/G, D] against [B, G, L, D]), as FlashInfer and FlashMLA do; with
  one KV head the cache is MLA's shared latent, so V is the same tensor as K.

Run from the repository root on the target machine (about two minutes on an H200)::

    PYTHONUNBUFFERED=1 python3 -m compiler.perf.measure -o $OUT/hgx-h200.raw.json

``--dry-run`` lists the grid without a GPU. The committed result for HGX H200 is
``compiler/catalog/calibration/hgx-h200.raw.json``; the floors (``--grid floors -o
$OUT/hgx-h200.floors.raw.json``) are ``compiler/catalog/calibration/hgx-h200.floors.raw.json``.

One module past 500 lines on purpose: it runs as one script on the device machine, which
receives the working tree and runs ``python3 -m compiler.perf.measure`` with PyTorch and the
kernel choices of compiler.perf.engine_kernels alone; each operator's benchmark sits beside
the grid that names it.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from compiler.perf import engine_kernels

SCHEMA = "rackc.calibration.raw/v1"

# ---------------------------------------------------------------------------------------
# Grid. Every tuple is iterated in the order written, so the output order is deterministic.

GEMM_M = (1, 2, 4, 8, 16, 32, 64, 96, 128, 256, 512, 1024, 2048, 3072, 4096, 8192, 16384)
GEMM_NK = (
    (2112, 7168),  # DeepSeek-V3 fused q_a + kv_a projection (1536 + 512 + 64)
    (24576, 1536),  # DeepSeek-V3 q_b (128 heads x 192)
    (32768, 512),  # DeepSeek-V3 kv_b (128 heads x (128 + 128))
    (7168, 16384),  # DeepSeek-V3 o_proj
    (4096, 7168),  # DeepSeek-V3 shared expert gate+up (2 x 2048)
    (7168, 2048),  # DeepSeek-V3 shared expert down
    (129280, 7168),  # DeepSeek-V3 LM head
    (10240, 8192),  # Llama-3.1-70B qkv ((64 + 2 x 8) heads x 128)
    (57344, 8192),  # Llama-3.1-70B gate+up (2 x 28672)
    (8192, 28672),  # Llama-3.1-70B down
    (9216, 4096),  # Qwen3-235B qkv ((64 + 2 x 4) heads x 128)
    (5120, 2880),  # gpt-oss-120b qkv ((64 + 2 x 8) heads x 64)
    (14336, 5120),  # GLM-4.5 qkv ((96 + 2 x 8) heads x 128)
)
GROUPED_KN = (
    (7168, 4096),  # DeepSeek-V3 routed expert gate+up (2 x 2048)
    (2048, 7168),  # DeepSeek-V3 routed expert down
    (4096, 3072),  # Qwen3-235B expert gate+up (2 x 1536)
    (1536, 4096),  # Qwen3-235B expert down
)
GROUPED_EXPERTS = (8, 16, 32, 64, 128, 256)
GROUPED_TOKENS_PER_EXPERT = (1, 4, 16, 64, 256, 1024, 4096)
MAX_ROUTED_TOKENS = 131072  # experts x tokens_per_expert: a 16k-token prefill step, top-8
ATTN_HEADS = (  # (q_heads, kv_heads, head_dim)
    (64, 8, 128),  # Llama-3.1-70B
    (64, 4, 128),  # Qwen3-235B
    (32, 8, 128),  # Llama-3.1-8B
    (32, 32, 128),  # MHA
    (64, 8, 64),  # gpt-oss-120b
)
DECODE_MLA_HEADS = ((128, 1, 576), (16, 1, 576))  # DeepSeek-V3 latent (512 + 64), TP1 / TP8
PREFILL_MLA_HEADS = ((128, 128, 192),)  # DeepSeek-V3 prefill, latent expanded (qk 128 + 64)
DECODE_BATCH = (1, 4, 16, 64, 256)
DECODE_KV_LEN = (512, 2048, 8192, 32768, 131072)
MAX_KV_BYTES = 16 << 30  # one decode step's cache; bigger would not fit a serving GPU anyway
PREFILL_SEQ = (512, 1024, 2048, 4096, 8192, 16384, 32768)
PREFILL_NONCAUSAL_HEADS = ((64, 8, 128),)
COPY_BYTES = tuple(1 << p for p in range(20, 34))  # 1 MiB .. 8 GiB, read + written

# Floors (``--grid floors``): the same ops at batch 1 and tiny shapes, where a kernel's time is
# its launch floor inside a CUDA graph, plus the elementwise kernels around a layer's GEMMs
# (norm, residual add, SiLU x mul, router top-k), each over a size sweep up to where it turns
# bandwidth-bound. Shapes from Qwen3-30B-A3B, DeepSeek-V2-Lite / V3, Mixtral-8x7B, gpt-oss.
FLOOR_GEMM_M = (1, 2, 4, 8, 16, 32, 64, 128)
FLOOR_GEMM_NK = (
    (128, 2048),  # Qwen3-30B-A3B router
    (64, 2048),  # DeepSeek-V2-Lite router
    (8, 4096),  # Mixtral router
    (576, 2048),  # DeepSeek-V2-Lite kv_a (512 + 64)
    (3072, 2048),  # DeepSeek-V2-Lite q (16 heads x 192)
    (5120, 2048),  # Qwen3-30B-A3B qkv
    (2048, 4096),  # Qwen3-30B-A3B o_proj
    (6144, 4096),  # Mixtral qkv
    (512, 512),
    (1024, 1024),
)
FLOOR_GROUPED_KN = (
    (2048, 1536),  # Qwen3-30B-A3B gate+up (2 x 768)
    (768, 2048),  # Qwen3-30B-A3B down
    (2048, 2816),  # DeepSeek-V2-Lite gate+up (2 x 1408)
    (1408, 2048),  # DeepSeek-V2-Lite down
)
FLOOR_GROUPED_EXPERTS = (8, 64, 128)
FLOOR_GROUPED_TOKENS = (1, 2, 4)
FLOOR_ATTN_HEADS = ((32, 4, 128), (32, 8, 128), (64, 8, 64), (16, 1, 576), (128, 1, 576))
FLOOR_DECODE_BATCH = (1, 4)
FLOOR_DECODE_KV_LEN = (16, 128, 1024)
FLOOR_TOKENS = (1, 8, 64, 512, 4096, 32768)
FLOOR_HIDDEN = (2048, 4096, 7168)
FLOOR_ACT_WIDTH = (768, 1408, 14336)  # SiLU x mul on [tokens, width] (gate+up halves)
FLOOR_ROUTER = ((128, 8), (64, 6), (8, 2), (256, 8))  # (experts, top_k)
FLOOR_QK = ((32, 4, 128, True), (32, 8, 128, False))  # q / kv heads, head_dim, q/k norm
FLOOR_MOE_ROWS = ((128, 8, 2048), (8, 2, 4096))  # experts, top_k, hidden: permute, moe_sum
FLOOR_COPY_BYTES = tuple(1 << p for p in range(10, 21, 2))  # 1 KiB .. 1 MiB

# ---------------------------------------------------------------------------------------
# Timing parameters.

ROTATE_BYTES = 256 << 20  # about four times the H200's 60 MB L2
MAX_SETS = 128
TARGET_SECONDS = 0.05  # of timed replays per variant
MIN_REPS, MAX_REPS = 5, 100
BIG_CASE_BYTES = 1 << 30  # release the allocator's cache after points this large
SPIN_UP_SECONDS = 2.0

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
DTYPE_BYTES = {"bf16": 2, "fp8": 1}
SDPA_FUSED = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
)

Query = dict[str, object]


def gemm_grid() -> Iterator[Query]:
    for dtype in ("bf16", "fp8"):
        for n, k in GEMM_NK:
            for m in GEMM_M:
                yield {"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k}


def grouped_gemm_grid() -> Iterator[Query]:
    for dtype in ("bf16", "fp8"):
        for k, n in GROUPED_KN:
            for experts in GROUPED_EXPERTS:
                for tokens in GROUPED_TOKENS_PER_EXPERT:
                    if experts * tokens <= MAX_ROUTED_TOKENS:
                        yield {
                            "op": "grouped_gemm",
                            "dtype": dtype,
                            "experts": experts,
                            "tokens_per_expert": tokens,
                            "k": k,
                            "n": n,
                        }


def attn_decode_grid() -> Iterator[Query]:
    for heads, kv_heads, head_dim in ATTN_HEADS + DECODE_MLA_HEADS:
        for batch in DECODE_BATCH:
            for kv_len in DECODE_KV_LEN:
                query = {
                    "op": "attn_decode",
                    "dtype": "bf16",
                    "batch": batch,
                    "q_heads": heads,
                    "kv_heads": kv_heads,
                    "head_dim": head_dim,
                    "kv_len": kv_len,
                }
                if kv_cache_bytes(query) <= MAX_KV_BYTES:
                    yield query


def attn_prefill_grid() -> Iterator[Query]:
    causal = [(h, True) for h in ATTN_HEADS + PREFILL_MLA_HEADS]
    noncausal = [(h, False) for h in PREFILL_NONCAUSAL_HEADS]
    for (heads, kv_heads, head_dim), is_causal in causal + noncausal:
        for seq_len in PREFILL_SEQ:
            yield {
                "op": "attn_prefill",
                "dtype": "bf16",
                "seq_len": seq_len,
                "q_heads": heads,
                "kv_heads": kv_heads,
                "head_dim": head_dim,
                "causal": is_causal,
            }


def copy_grid() -> Iterator[Query]:
    for n in COPY_BYTES:
        yield {"op": "copy", "bytes": n}


def elementwise_grid() -> Iterator[Query]:
    for tokens in FLOOR_TOKENS:
        for hidden in FLOOR_HIDDEN:
            yield {"op": "rms_norm", "dtype": "bf16", "tokens": tokens, "hidden": hidden}
            yield {"op": "add_rms_norm", "dtype": "bf16", "tokens": tokens, "hidden": hidden}
        for width in FLOOR_ACT_WIDTH:
            yield {"op": "silu_mul", "dtype": "bf16", "tokens": tokens, "width": width}
        for experts, top_k in FLOOR_ROUTER:
            yield {"op": "topk_softmax", "dtype": "bf16", "tokens": tokens, "experts": experts,
                   "top_k": top_k}
        for q_heads, kv_heads, head_dim, norm in FLOOR_QK:
            yield {"op": "qk_norm_rope", "dtype": "bf16", "tokens": tokens, "q_heads": q_heads,
                   "kv_heads": kv_heads, "head_dim": head_dim, "norm": norm}
        for experts, top_k, hidden in FLOOR_MOE_ROWS:
            yield {"op": "moe_permute", "dtype": "bf16", "tokens": tokens, "experts": experts,
                   "top_k": top_k, "hidden": hidden}
            yield {"op": "moe_sum", "dtype": "bf16", "tokens": tokens, "top_k": top_k,
                   "hidden": hidden}


def floor_grid() -> list[Query]:
    """Batch-1 / tiny shapes of the modelled ops, and the elementwise kernels (see FLOOR_*)."""
    gemm = [{"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k}
            for dtype in ("bf16", "fp8") for n, k in FLOOR_GEMM_NK for m in FLOOR_GEMM_M]
    grouped = [{"op": "grouped_gemm", "dtype": dtype, "experts": e, "tokens_per_expert": t,
                "k": k, "n": n}
               for dtype in ("bf16", "fp8") for k, n in FLOOR_GROUPED_KN
               for e in FLOOR_GROUPED_EXPERTS for t in FLOOR_GROUPED_TOKENS]
    decode = [{"op": "attn_decode", "dtype": "bf16", "batch": b, "q_heads": h,
               "kv_heads": g, "head_dim": d, "kv_len": n}
              for h, g, d in FLOOR_ATTN_HEADS for b in FLOOR_DECODE_BATCH
              for n in FLOOR_DECODE_KV_LEN]
    copies = [{"op": "copy", "bytes": n} for n in FLOOR_COPY_BYTES]
    return [*copies, *gemm, *grouped, *decode, *elementwise_grid()]


GRIDS = {"kernels": lambda: build_grid(), "floors": lambda: floor_grid()}


def build_grid() -> list[Query]:
    return [
        *copy_grid(),
        *gemm_grid(),
        *grouped_gemm_grid(),
        *attn_decode_grid(),
        *attn_prefill_grid(),
    ]


# ---------------------------------------------------------------------------------------
# Work counted per query: floating-point operations and the fewest bytes through HBM
# (each input read once, each output written once). Used to size input rotation and to
# report achieved TFLOP/s and TB/s.


ELEMENTWISE_BYTES: dict[str, Callable[[Query], int]] = {
    "rms_norm": lambda q: 2 * q["tokens"] * q["hidden"] * 2,  # x in, y out
    "add_rms_norm": lambda q: 4 * q["tokens"] * q["hidden"] * 2,  # x, residual in; both out
    "silu_mul": lambda q: 3 * q["tokens"] * q["width"] * 2,  # gate, up in; product out
    "topk_softmax": lambda q: q["tokens"] * (q["experts"] * 2 + q["top_k"] * 12),
    # q and k read from the fused QKV output and written back, bf16
    "qk_norm_rope": lambda q: 2 * q["tokens"] * (q["q_heads"] + q["kv_heads"]) * q["head_dim"]
    * 2,
    # each token's row read once (its other copies hit the L2), every routed copy written
    "moe_permute": lambda q: q["tokens"] * (q["top_k"] + 1) * q["hidden"] * 2,
    "moe_sum": lambda q: q["tokens"] * (q["top_k"] + 1) * q["hidden"] * 2,  # K rows in, 1 out
}


def kv_cache_bytes(q: Query) -> int:
    tensors = 1 if q["kv_heads"] == 1 else 2  # one KV head: MLA latent, V is K
    return tensors * q["batch"] * q["kv_heads"] * q["kv_len"] * q["head_dim"] * 2


def flops(q: Query) -> float:
    op = q["op"]
    if op == "gemm":
        return 2.0 * q["m"] * q["n"] * q["k"]
    if op == "grouped_gemm":
        return 2.0 * q["experts"] * q["tokens_per_expert"] * q["n"] * q["k"]
    if op == "attn_decode":
        return 4.0 * q["batch"] * q["q_heads"] * q["kv_len"] * q["head_dim"]
    if op == "attn_prefill":
        full = 4.0 * q["seq_len"] ** 2 * q["q_heads"] * q["head_dim"]
        return full / 2 if q["causal"] else full
    return 0.0


def bytes_moved(q: Query) -> int:
    op = q["op"]
    if op == "copy":
        return q["bytes"]
    if op == "gemm":
        width = DTYPE_BYTES[q["dtype"]]
        return (q["m"] * q["k"] + q["n"] * q["k"]) * width + q["m"] * q["n"] * 2
    if op == "grouped_gemm":
        width = DTYPE_BYTES[q["dtype"]]
        rows = q["experts"] * q["tokens_per_expert"]
        weights = q["experts"] * q["n"] * q["k"]
        return (rows * q["k"] + weights) * width + rows * q["n"] * 2
    if op == "attn_decode":
        return kv_cache_bytes(q) + 2 * q["batch"] * q["q_heads"] * q["head_dim"] * 2
    if op in ELEMENTWISE_BYTES:
        return ELEMENTWISE_BYTES[op](q)
    heads = 2 * q["q_heads"] + 2 * q["kv_heads"]  # q and out, k and v
    return heads * q["seq_len"] * q["head_dim"] * 2


# ---------------------------------------------------------------------------------------
# Variants. A variant is (impl, make): make() draws one fresh set of random inputs on the
# GPU and returns a call that runs the operator once on that set. Each op gives tiers of
# variants; the fastest variant of the first tier in which any runs is kept, the way a
# serving engine picks its fastest kernel.

Call = Callable[[], torch.Tensor]
Variant = tuple[str, Callable[[], Call]]
Tiers = list[list[Variant]]


def rand(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(shape, device="cuda", dtype=BF16).to(dtype)


def scales(*shape: int) -> torch.Tensor:
    """Positive float32 dequantisation scales, as a quantised checkpoint would carry."""
    return torch.rand(shape, device="cuda", dtype=torch.float32) + 0.5


def copy_tiers(q: Query) -> Tiers:
    """A copy engine (memcpy) and an SM kernel can differ; either may move a KV block."""
    elements = q["bytes"] // 2 // 4

    def memcpy() -> Call:
        src = torch.randn(elements, device="cuda")
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    def kernel() -> Call:
        src = torch.randn(elements, device="cuda")
        dst = torch.empty_like(src)
        return lambda: torch.mul(src, 1, out=dst)

    return [[("Tensor.copy_ (cudaMemcpyAsync)", memcpy), ("torch.mul(x, 1) (SM kernel)", kernel)]]


def gemm_tiers(q: Query) -> Tiers:
    m, n, k = q["m"], q["n"], q["k"]

    def bf16() -> Call:
        x, w = rand(m, k), rand(n, k)
        return lambda: F.linear(x, w)

    def fp8() -> Call:
        x, w = rand(m, k, dtype=FP8), rand(n, k, dtype=FP8)
        sx, sw = scales(m, 1), scales(1, n)
        return lambda: torch._scaled_mm(x, w.t(), sx, sw, out_dtype=BF16, use_fast_accum=True)

    if q["dtype"] == "bf16":
        return [[("F.linear", bf16)]]
    return [[("torch._scaled_mm rowwise fast_accum", fp8)]]


def grouped_gemm_tiers(q: Query) -> Tiers:
    experts, tokens, k, n = q["experts"], q["tokens_per_expert"], q["k"], q["n"]
    rows = experts * tokens

    def offsets() -> torch.Tensor:
        """End row of each expert's tokens in the stacked activation."""
        return torch.arange(tokens, rows + 1, tokens, device="cuda", dtype=torch.int32)

    def bf16() -> Call:
        x, w, offs = rand(rows, k), rand(experts, n, k), offsets()
        return lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)

    def fp8() -> Call:
        x, w, offs = rand(rows, k, dtype=FP8), rand(experts, n, k, dtype=FP8), offsets()
        sx, sw = scales(rows), scales(experts, n)
        return lambda: torch._scaled_grouped_mm(
            x, w.transpose(-2, -1), sx, sw, offs=offs, out_dtype=BF16, use_fast_accum=True
        )

    if q["dtype"] == "bf16":
        return [[("torch._grouped_mm", bf16)]]
    return [[("torch._scaled_grouped_mm rowwise fast_accum", fp8)]]


AttnInputs = tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, bool]]


def sdpa_tiers(make_inputs: Callable[[], AttnInputs], suffix: str, math_competes: bool) -> Tiers:
    """The fused SDPA backends, with the unfused math backend beside them or after them.

    At decode the math backend is two batched GEMMs over a score matrix smaller than the
    cache, and for MLA's 576-wide heads it can beat the memory-efficient kernel, so it
    competes. At prefill its S x S score matrix is slow or does not fit, so it is a last
    resort.
    """

    def variant(backend: SDPBackend) -> Variant:
        def make() -> Call:
            (query, key, value), kwargs = make_inputs()

            def call() -> torch.Tensor:
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(query, key, value, **kwargs)

            return call

        return f"sdpa:{backend.name.lower()}{suffix}", make

    fused = [variant(backend) for backend in SDPA_FUSED]
    math_backend = variant(SDPBackend.MATH)
    return [[*fused, math_backend]] if math_competes else [fused, [math_backend]]


def attn_decode_tiers(q: Query) -> Tiers:
    batch, heads, kv_heads = q["batch"], q["q_heads"], q["kv_heads"]
    head_dim, kv_len = q["head_dim"], q["kv_len"]

    def make_inputs() -> AttnInputs:
        query = rand(batch, kv_heads, heads // kv_heads, head_dim)  # GQA heads as rows
        key = rand(batch, kv_heads, kv_len, head_dim)
        value = key if kv_heads == 1 else rand(batch, kv_heads, kv_len, head_dim)
        return (query, key, value), {}

    return sdpa_tiers(make_inputs, " gqa-packed", math_competes=True)


def attn_prefill_tiers(q: Query) -> Tiers:
    seq, heads, kv_heads, head_dim = q["seq_len"], q["q_heads"], q["kv_heads"], q["head_dim"]

    def make_inputs() -> AttnInputs:
        tensors = (
            rand(1, heads, seq, head_dim),
            rand(1, kv_heads, seq, head_dim),
            rand(1, kv_heads, seq, head_dim),
        )
        return tensors, {"is_causal": q["causal"], "enable_gqa": kv_heads != heads}

    return sdpa_tiers(make_inputs, "", math_competes=False)


def rms_norm_tiers(q: Query) -> Tiers:
    tokens, hidden = q["tokens"], q["hidden"]

    def plain() -> Call:
        x, w = rand(tokens, hidden), rand(hidden)
        return lambda: F.rms_norm(x, (hidden,), w, 1e-6)

    return [[("F.rms_norm", plain)]]


def add_rms_norm_tiers(q: Query) -> Tiers:
    """Residual add then RMSNorm, as engines fuse it (vLLM fused_add_rms_norm): in place."""
    tokens, hidden = q["tokens"], q["hidden"]

    def compiled() -> Call:
        x, r, w = rand(tokens, hidden), rand(tokens, hidden), rand(hidden)
        fn = engine_kernels.compiled("add_rms_norm", dynamic=None)
        return lambda: fn(x, r, w, 1e-6)

    def unfused() -> Call:
        x, r, w = rand(tokens, hidden), rand(tokens, hidden), rand(hidden)

        def call() -> torch.Tensor:
            r.add_(x)
            return F.rms_norm(r, (hidden,), w, 1e-6)

        return call

    return [[("torch.compile add+rms_norm (one fused kernel)", compiled),
             ("add_ + F.rms_norm (two kernels)", unfused)]]


def silu_mul_tiers(q: Query) -> Tiers:
    tokens, width = q["tokens"], q["width"]

    def compiled() -> Call:
        gu = rand(tokens, 2 * width)
        fn = engine_kernels.compiled("silu_mul", dynamic=None)
        return lambda: fn(gu)

    def unfused() -> Call:
        gu = rand(tokens, 2 * width)
        return lambda: F.silu(gu[:, :width]) * gu[:, width:]

    return [[("torch.compile silu*mul (one fused kernel)", compiled),
             ("F.silu * mul (two kernels)", unfused)]]



def topk_softmax_tiers(q: Query) -> Tiers:
    tokens, experts, top_k = q["tokens"], q["experts"], q["top_k"]

    def plain() -> Call:
        logits = rand(tokens, experts)

        def call() -> torch.Tensor:
            w, ids = logits.topk(top_k, dim=-1)
            return w.float().softmax(-1), ids

        return call

    def triton() -> Call:
        logits = rand(tokens, experts)
        return lambda: engine_kernels.topk_softmax(logits, top_k, False)[0]

    return [[("topk + softmax", plain), ("Triton topk_softmax (one kernel)", triton)]]


def qk_norm_rope_tiers(q: Query) -> Tiers:
    """Per-head q/k RMSNorm and RoPE over a fused QKV output, one kernel (engine_kernels)."""
    tokens, qh, kvh, hd = q["tokens"], q["q_heads"], q["kv_heads"], q["head_dim"]

    def triton() -> Call:
        qkv = rand(tokens, (qh + 2 * kvh) * hd)
        qn, kn = (rand(hd), rand(hd)) if q["norm"] else (None, None)
        cos, sin = (torch.rand(tokens, hd // 2, device="cuda") for _ in range(2))
        return lambda: engine_kernels.qk_norm_rope(qkv, qn, kn, cos, sin, qh, kvh, hd, 1e-6)[0]

    return [[("Triton q/k norm + RoPE (one kernel)", triton)]]


def moe_permute_tiers(q: Query) -> Tiers:
    """Align the routed copies by expert and copy their rows (engine_kernels: three launches)."""
    tokens, experts, top_k, hidden = q["tokens"], q["experts"], q["top_k"], q["hidden"]

    def triton() -> Call:
        x = rand(tokens, hidden)
        ids = torch.randint(0, experts, (tokens, top_k), device="cuda", dtype=torch.int32)
        return lambda: engine_kernels.moe_permute(x, ids, experts)[0]

    return [[("Triton align + permute", triton)]]


def moe_sum_tiers(q: Query) -> Tiers:
    """Un-permute and weighted sum of each token's routed rows (vLLM moe_sum)."""
    tokens, top_k, hidden = q["tokens"], q["top_k"], q["hidden"]

    def triton() -> Call:
        y = rand(tokens * top_k, hidden)
        inv = torch.randperm(tokens * top_k, device="cuda").to(torch.int32).view(tokens, top_k)
        w = torch.rand(tokens, top_k, device="cuda")
        return lambda: engine_kernels.moe_sum(y, inv, w)

    return [[("Triton moe_sum (one kernel)", triton)]]


TIERS: dict[str, Callable[[Query], Tiers]] = {
    "rms_norm": rms_norm_tiers,
    "add_rms_norm": add_rms_norm_tiers,
    "silu_mul": silu_mul_tiers,
    "topk_softmax": topk_softmax_tiers,
    "qk_norm_rope": qk_norm_rope_tiers,
    "moe_permute": moe_permute_tiers,
    "moe_sum": moe_sum_tiers,
    "copy": copy_tiers,
    "gemm": gemm_tiers,
    "grouped_gemm": grouped_gemm_tiers,
    "attn_decode": attn_decode_tiers,
    "attn_prefill": attn_prefill_tiers,
}

# ---------------------------------------------------------------------------------------
# Timing.


def input_sets(q: Query) -> int:
    """How many input sets to rotate through so one pass over them overflows the L2."""
    return min(MAX_SETS, max(1, math.ceil(ROTATE_BYTES / max(1, bytes_moved(q)))))


def timed_passes(run_pass: Callable[[], None], reps: int) -> list[float]:
    """Seconds of each of `reps` passes, from CUDA events, with one synchronisation."""
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        run_pass()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in events]


def warm_up(calls: list[Call]) -> None:
    """One pass on a side stream, as graph capture requires (workspaces, handles, autotune)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def capture(calls: list[Call]) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def time_calls(calls: list[Call]) -> list[float]:
    """Per-call microsecond samples: graph replays of one pass over all sets, over the calls."""
    warm_up(calls)
    graph = capture(calls)
    graph.replay()  # the first replay uploads the graph
    pass_seconds = timed_passes(graph.replay, 1)[0]
    reps = min(MAX_REPS, max(MIN_REPS, round(TARGET_SECONDS / pass_seconds)))
    return [s * 1e6 / len(calls) for s in timed_passes(graph.replay, reps)]


def time_variant(q: Query, impl: str, make: Callable[[], Call]) -> dict[str, object] | None:
    """The measurement of one variant, or None (logged) where it raises."""
    try:
        samples = time_calls([make() for _ in range(input_sets(q))])
    except Exception as err:  # out of memory, a shape declined, capture or compile refused
        log_once(f"{q['op']} {impl}: {first_line(err)}")
        return None
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {
        **q,
        "impl": impl,
        "us": round(statistics.median(samples), 3),
        "us_p10": round(deciles[0], 3),
        "us_p90": round(deciles[-1], 3),
        "reps": len(samples),
    }


def measure(q: Query) -> dict[str, object] | None:
    """The fastest variant of the first tier in which any runs, or None if none does."""
    for tier in TIERS[q["op"]](q):
        results = [r for r in (time_variant(q, impl, make) for impl, make in tier) if r]
        if results:
            return min(results, key=lambda r: r["us"])
    return None


def spin_up(seconds: float) -> float:
    """Run 8192^3 bf16 products so clocks leave idle before the first point; TFLOP/s."""
    a, b = rand(8192, 8192), rand(8192, 8192)
    products, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        products += 10
    return 2 * 8192**3 * products / (time.monotonic() - started) / 1e12


# ---------------------------------------------------------------------------------------
# Device description.


def nvidia_smi(fields: str) -> list[str]:
    """Values of `fields` for GPU 0 from nvidia-smi, or [] where it is missing or refuses."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", "0", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [value.strip() for value in out.strip().split(",")]


def describe_device() -> dict[str, object]:
    props = torch.cuda.get_device_properties(0)
    fields = ("driver_version", "clocks.max.sm", "clocks.max.memory", "power.limit")
    smi = dict(
        zip(
            ("driver", "sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w"),
            nvidia_smi(",".join(fields)),
            strict=False,
        )
    )
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "total_memory_bytes": props.total_memory,
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        **smi,
        "measured_on": datetime.date.today().isoformat(),
    }


# ---------------------------------------------------------------------------------------
# Summary: the best achieved rates per operator family, checked against the ceilings
# measured on this kind of machine (METHOD.md / KINDS.md) and the datasheet.

MEASURED_CEILINGS = {"bf16_tflops": 790.0, "copy_tbps": 4.3}
DATASHEET = {"bf16": 990.0, "fp8": 1979.0, "hbm_tbps": 4.8}


def rates(m: dict[str, object]) -> tuple[float, float]:
    """(TFLOP/s, TB/s) achieved by one measurement."""
    return flops(m) / m["us"] / 1e6, bytes_moved(m) / m["us"] / 1e6


def family(m: dict[str, object]) -> str:
    return f"{m['op']}/{m.get('dtype', '-')}"


def brief(q: dict[str, object]) -> str:
    skip = {"op", "dtype", "impl", "us", "us_p10", "us_p90", "reps"}
    return " ".join(f"{key}={value}" for key, value in q.items() if key not in skip)


def summarise(measurements: list[dict[str, object]]) -> None:
    print(f"\n{'family':<18}{'best':>5}{'TFLOP/s':>10}{'TB/s':>8}{'us':>11}  at")
    for name in dict.fromkeys(family(m) for m in measurements):
        members = [m for m in measurements if family(m) == name]
        best = {
            label: max(members, key=lambda m: rates(m)[index])
            for label, index in (("flop", 0), ("byte", 1))
        }
        if rates(best["flop"])[0] == 0 or best["flop"] is best["byte"]:
            del best["flop"]
        for label, m in best.items():
            tflops, tbps = rates(m)
            print(f"{name:<18}{label:>5}{tflops:>10.1f}{tbps:>8.2f}{m['us']:>11.1f}  {brief(m)}")
    check_ceilings(measurements)


def check_ceilings(measurements: list[dict[str, object]]) -> None:
    """Flag rates above the datasheet: those would mean cached data or a counting error."""
    suspect = [
        m
        for m in measurements
        if rates(m)[1] > DATASHEET["hbm_tbps"]
        or rates(m)[0] > DATASHEET.get(m.get("dtype"), math.inf)
    ]
    gemm = [rates(m)[0] for m in measurements if m["op"] == "gemm" and m["dtype"] == "bf16"]
    copy = [rates(m)[1] for m in measurements if m["op"] == "copy"]
    if gemm:
        print(
            f"bf16 GEMM best {max(gemm):.0f} TFLOP/s vs {MEASURED_CEILINGS['bf16_tflops']:.0f}"
            " measured here before"
        )
    if copy:
        print(
            f"copy best {max(copy):.2f} TB/s vs {MEASURED_CEILINGS['copy_tbps']} measured"
            " here before"
        )
    print(f"{len(suspect)} measurements above the datasheet ceilings")
    for m in suspect[:10]:
        print(f"  suspect: {family(m)} {brief(m)} us={m['us']}")


# ---------------------------------------------------------------------------------------
# Driver.


def log(message: str) -> None:
    print(message, file=sys.stderr)


@functools.cache
def log_once(message: str) -> None:
    """Log a variant's failure once: e.g. flash attention declines every MLA point alike."""
    log(message)


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def run_grid(grid: list[Query]) -> list[dict[str, object]]:
    measurements = []
    started = time.monotonic()
    for index, q in enumerate(grid, 1):
        result = measure(q)
        if result is None:
            log(f"skipped {json.dumps(q)}: no implementation ran")
        else:
            measurements.append(result)
        if bytes_moved(q) >= BIG_CASE_BYTES:
            torch.cuda.empty_cache()
        if index % 100 == 0 or index == len(grid):
            log(f"[{index}/{len(grid)}] {time.monotonic() - started:.0f} s")
    return measurements


def render(device: dict[str, object], measurements: list[dict[str, object]]) -> str:
    """The raw JSON document, one measurement a line so that re-measurements diff cleanly."""
    rows = ",\n".join(f"  {json.dumps(m)}" for m in measurements)
    return (
        f'{{"schema": {json.dumps(SCHEMA)},\n "device": {json.dumps(device)},\n'
        f' "measurements": [\n{rows}\n]}}\n'
    )


def select(grid: list[Query], ops: list[str] | None, every: int) -> list[Query]:
    chosen = [q for q in grid if ops is None or q["op"] in ops]
    return chosen[::every]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", help="raw calibration JSON to write")
    parser.add_argument("--dry-run", action="store_true", help="list the grid; no GPU needed")
    parser.add_argument("--ops", type=lambda s: s.split(","), help="comma-separated op subset")
    parser.add_argument("--every", type=int, default=1, help="keep every N-th grid point")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="kernels",
                        help="kernels: the fitted grid (default); floors: batch-1 and tiny "
                        "shapes plus elementwise kernels, for per-kernel floors")
    args = parser.parse_args(argv)
    if not args.dry_run and not args.output:
        parser.error("-o/--output is required unless --dry-run")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    grid = select(GRIDS[args.grid](), args.ops, args.every)
    if args.dry_run:
        for q in grid:
            print(json.dumps(q))
        counts = {op: sum(q["op"] == op for q in grid) for op in TIERS}
        log(f"{len(grid)} points: {counts}")
        return 0
    warnings.simplefilter("ignore", UserWarning)  # SDPA warns for each backend that declines
    torch.manual_seed(0)
    device = {**describe_device(), "grid": args.grid}
    log(json.dumps(device))
    log(f"spin-up: {spin_up(SPIN_UP_SECONDS):.0f} TFLOP/s bf16 on 8192^3, clock ramp included")
    measurements = run_grid(grid)
    device["sm_clock_after_run_mhz"] = next(iter(nvidia_smi("clocks.sm")), None)
    with open(args.output, "w", encoding="utf-8") as out:
        out.write(render(device, measurements))
    summarise(measurements)
    print(f"{len(measurements)} of {len(grid)} points measured; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
