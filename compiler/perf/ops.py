"""Operator costs: a roofline with efficiency curves, per system and dtype.

t(op) = overhead + max(flops / (peak * e_c(size)), bytes / (bw * e_m))

e_c(size) = e_max * size / (size + size_half) rises with the op's parallel work (GEMM rows,
tokens per expert, query rows) and saturates; e_m is the share of HBM bandwidth a streaming
kernel reaches. Both are <= 1, so no prediction beats the roofline. The curves' parameters come
from a calibration file measured on a real GPU (`rackc calibrate`); systems without one use the
H200's fitted curves scaled by their datasheet peaks (`assumed`), and with no calibration at all
the defaults below (REFERENCE-DATA.md D) apply.
"""

from dataclasses import dataclass, field

from compiler.catalog.system import System

BYTES = {"fp4": 0.5625, "fp8": 1.0, "bf16": 2.0}


@dataclass(frozen=True)
class Curve:
    """Efficiency curve of one op family and dtype."""

    e_max: float  # compute efficiency at large sizes
    size_half: float  # size at which half of e_max is reached
    e_mem: float  # share of peak HBM bandwidth reached when memory-bound
    overhead_us: float  # launch and tail cost

    def compute_eff(self, size: float) -> float:
        return self.e_max * size / (size + self.size_half)


# REFERENCE-DATA.md D: prefill FP8 GEMM ~55-65% of peak, memory-bound ops 80% of HBM BW + 3 us
# (aiconfigurator); grouped GEMM 55-66% at large token counts; FlashMLA ~90% BW.
DEFAULT_CURVES: dict[str, Curve] = {
    "gemm": Curve(0.65, 64.0, 0.80, 3.0),
    "grouped_gemm": Curve(0.60, 128.0, 0.70, 5.0),
    "attn_decode": Curve(0.60, 8.0, 0.85, 4.0),
    "attn_prefill": Curve(0.60, 512.0, 0.80, 5.0),
    "copy": Curve(1.0, 1.0, 0.80, 3.0),
}


@dataclass(frozen=True)
class OpModel:
    """Costs of operators on one GPU (or one memory domain: see `bw_scale`) of a system."""

    system: System
    curves: dict[str, dict[str, Curve]] = field(default_factory=dict)  # op -> dtype -> curve
    source: str = "defaults (REFERENCE-DATA.md D)"
    bw_scale: float = 1.0  # <1 when an op only reaches part of the GPU's HBM (remote domain)

    def curve(self, op: str, dtype: str) -> Curve:
        by_dtype = self.curves.get(op, {})
        return by_dtype.get(dtype) or by_dtype.get("bf16") or DEFAULT_CURVES[op]

    def peak_tflops(self, dtype: str) -> float:
        return self.system.tflops(dtype)

    def hbm_bytes_per_us(self, placement: str = "interleaved") -> float:
        """HBM bandwidth seen by a kernel whose data sits `placement` relative to its SMs:
        die-local, interleaved over the GPU's memory domains, or on the other domain."""
        gpu = self.system.gpu
        factor = {"local": 1.0, "interleaved": gpu.hbm_interleaved_factor.value,
                  "remote": gpu.hbm_remote_factor.value}[placement]
        return gpu.hbm_tbytes_per_s.value * 1e6 * self.bw_scale * factor

    def roofline_us(self, flops: float, nbytes: float, dtype: str) -> float:
        return max(flops / (self.peak_tflops(dtype) * 1e6), nbytes / self.hbm_bytes_per_us("local"))

    def _time(self, op: str, dtype: str, flops: float, nbytes: float, size: float,
              placement: str = "interleaved") -> float:
        c = self.curve(op, dtype)
        compute = flops / (self.peak_tflops(dtype) * 1e6 * c.compute_eff(size)) if flops else 0.0
        memory = nbytes / (self.hbm_bytes_per_us(placement) * c.e_mem)
        return c.overhead_us + max(compute, memory)

    def gemm(self, dtype: str, m: int, n: int, k: int, placement: str = "interleaved") -> float:
        """y[M,N] = x[M,K] @ W[N,K]^T; activations in the weight dtype (fp4: fp8 activations)."""
        act = BYTES["fp8"] if dtype == "fp4" else BYTES[dtype]
        nbytes = n * k * BYTES[dtype] + m * k * act + m * n * 2
        return self._time("gemm", dtype, 2.0 * m * n * k, nbytes, m, placement)

    def grouped_gemm(self, dtype: str, experts: int, tokens_per_expert: float, k: int, n: int,
                     skew: float = 1.0, placement: str = "interleaved") -> float:
        """E expert GEMMs [T,K] x [K,N]. `skew` >= 1: the busiest expert's load over the mean,
        which sets the step's critical path when routing is uneven."""
        t = tokens_per_expert * skew
        act = BYTES["fp8"] if dtype == "fp4" else BYTES[dtype]
        active = experts if tokens_per_expert >= 1 else experts * tokens_per_expert
        nbytes = active * n * k * BYTES[dtype] + experts * t * (k * act + n * 2)
        flops = 2.0 * experts * t * n * k
        return self._time("grouped_gemm", dtype, flops, nbytes, max(t, 1e-9), placement)

    def attn_decode(self, dtype: str, batch: int, q_heads: int, kv_heads: int, head_dim: int,
                    kv_len: int, q_len: int = 1, v_head_dim: int | None = None) -> float:
        """Each of `batch` sequences attends `q_len` new tokens over `kv_len` cached tokens
        (MLA: kv_heads 1, head_dim = latent + rope, v_head_dim = latent)."""
        v_dim = v_head_dim or head_dim
        kv_bytes = batch * kv_len * kv_heads * (head_dim + v_dim) * BYTES[dtype]
        if v_head_dim is not None and kv_heads == 1:  # MLA: V is the K latent, read once
            kv_bytes = batch * kv_len * head_dim * BYTES[dtype]
        q_bytes = batch * q_len * q_heads * (head_dim + v_dim) * 2
        flops = 2.0 * batch * q_len * q_heads * kv_len * (head_dim + v_dim)
        return self._time("attn_decode", dtype, flops, kv_bytes + q_bytes,
                          q_len * q_heads / kv_heads)

    def attn_prefill(self, dtype: str, seq_len: int, q_heads: int, kv_heads: int, head_dim: int,
                     causal: bool = True, kv_len: int = 0, v_head_dim: int | None = None) -> float:
        """`seq_len` new tokens attending themselves (causal) plus `kv_len` cached tokens."""
        v_dim = v_head_dim or head_dim
        pairs = seq_len * kv_len + (seq_len * (seq_len + 1) / 2 if causal else seq_len ** 2)
        flops = 2.0 * q_heads * pairs * (head_dim + v_dim)
        nbytes = (seq_len * (q_heads + 2 * kv_heads) * head_dim * 2
                  + kv_len * kv_heads * (head_dim + v_dim) * BYTES[dtype]
                  + seq_len * q_heads * v_dim * 2)
        return self._time("attn_prefill", dtype, flops, nbytes, seq_len)

    def indexer(self, dtype: str, batch: int, q_len: int, heads: int, head_dim: int,
                kv_len: int) -> float:
        """Sparse-attention indexer: MQA logits of each new token over every cached key
        (one shared key of `head_dim` per token), costed like attention decode without V."""
        kv_bytes = batch * kv_len * head_dim * BYTES[dtype]
        flops = 2.0 * batch * q_len * heads * kv_len * head_dim
        return self._time("attn_decode", dtype, flops, kv_bytes, q_len * heads)

    def copy(self, nbytes: float) -> float:
        """Device-to-device copy; `nbytes` counts bytes read plus bytes written."""
        return self._time("copy", "bf16", 0.0, nbytes, 1.0)


def op_model(system: System, calibration: dict | None) -> OpModel:
    """The op model of a system from its (or the H200's) calibration file, or defaults."""
    if not calibration:
        return OpModel(system)
    curves = {op: {dt: Curve(**c) for dt, c in by_dtype.items()}
              for op, by_dtype in calibration["curves"].items()}
    return OpModel(system, curves, calibration.get("source", "calibration"))
