"""The glue kernels a serving engine runs between a layer's GEMMs, for measurements on a GPU.

Why: a forward written in plain PyTorch launches a dozen unfused kernels per layer for work
that vLLM does in a few (benchmarks/README.md, "Step accuracy": 40-55% of a measured step was
such glue). To time steps and kernel floors as an engine runs them, this module provides the
same fusions, written here:

* what vLLM leaves to Inductor (custom ops are off by default under `torch.compile`,
  vllm/config/compilation.py `custom_ops`): residual add + RMSNorm, per-head q/k RMSNorm with
  RoPE, SiLU x mul, MLA's latent norm with RoPE; here also `torch.compile` (`dynamic=True`,
  one compile for every token count, as vLLM compiles);
* what vLLM runs as its own kernels inside the fused MoE (vllm/model_executor/layers/
  fused_moe/: `topk_softmax`, `moe_align_block_size`, `moe_sum`): a Triton top-k softmax
  (one program per token), an align + permute that groups the routed copies by expert and
  copies their rows (three launches: zero, histogram, scatter), and an un-permute + weighted
  sum;
* MLA decode over the latent cache: a split-KV flash-decoding kernel in Triton (the shape of
  vLLM's TRITON_MLA backend, vllm/v1/attention/ops/triton_decode_attention.py), which reads
  each cached row once.

Only the calibration scripts import this module (compiler/perf/measure.py,
benchmarks/measure_steps.py); it needs torch, and Triton for the GPU kernels.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


# ---------------------------------------------------------------------------------------
# Inductor fusions (vLLM: custom ops off, Inductor generates these).


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary on the last dim of x [T, heads, D] with cos / sin [T, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def _add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float):
    s = x.float() + r.float()
    return _rms(s, w, eps).to(BF16), s.to(BF16)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms(x, w, eps).to(BF16)


def _qk_norm_rope(qkv: torch.Tensor, qn: torch.Tensor | None, kn: torch.Tensor | None,
                  cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int,
                  head_dim: int, eps: float):
    t = qkv.shape[0]
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
    q, k = q.view(t, q_heads, head_dim), k.view(t, kv_heads, head_dim)
    if qn is not None:
        q, k = _rms(q, qn, eps), _rms(k, kn, eps)
    return (_rope(q, cos, sin).to(BF16), _rope(k, cos, sin).to(BF16),
            v.reshape(t, kv_heads, head_dim))


def _latent_norm_rope(kva: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      lora: int, eps: float) -> torch.Tensor:
    """MLA's cached row: RMSNorm of the kv_lora latent, RoPE on the shared rope key."""
    lat = _rms(kva[:, :lora], w, eps)
    pe = _rope(kva[:, lora:].unsqueeze(1), cos, sin)[:, 0]
    return torch.cat([lat, pe], -1).to(BF16)


def _q_latent(q_lat: torch.Tensor, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              nope: int) -> torch.Tensor:
    """MLA decode query: the absorbed latent part [T, H, lora] beside RoPE'd q_pe."""
    return torch.cat([q_lat.float(), _rope(q[..., nope:], cos, sin)], -1).to(BF16)


def _silu_mul(gu: torch.Tensor) -> torch.Tensor:
    gate, up = gu.chunk(2, -1)
    return F.silu(gate) * up


def _moe_sum(y: torch.Tensor, inv: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Un-permute and weighted sum of each token's K routed rows (y in expert order; inv[t, j]
    is the row of token t's j-th copy; w [T, K] its routing weight)."""
    t, k = w.shape
    return (y[inv.view(-1)].view(t, k, -1).float() * w.unsqueeze(-1)).sum(1).to(BF16)


@functools.cache
def compiled(name: str, dynamic: bool | None = True):
    """The Inductor-compiled form of one fusion above: by default compiled once for every
    shape; `dynamic=None` is torch.compile's own default (a shape specialises until a second
    one is seen)."""
    fn = {"add_rms_norm": _add_rms_norm, "rms_norm": _rms_norm, "qk_norm_rope": _qk_norm_rope,
          "latent_norm_rope": _latent_norm_rope, "q_latent": _q_latent, "silu_mul": _silu_mul,
          "moe_sum": _moe_sum}[name]
    return torch.compile(fn, dynamic=dynamic, fullgraph=True)


def rope_tables(positions: int, dim: int, device: str, base: float = 10000.0):
    """cos, sin [positions, dim/2] in float32 (vLLM's cos_sin_cache, split)."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    ang = torch.arange(positions, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


# ---------------------------------------------------------------------------------------
# Triton kernels (vLLM: its own CUDA / Triton kernels in the fused MoE and MLA backends).

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only machines: the reference paths below
    triton = tl = None


if triton is not None:

    @triton.jit
    def _topk_softmax_kernel(logits, weights, ids, E: tl.constexpr, K: tl.constexpr,
                             BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
                             SOFTMAX_FIRST: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_E)
        x = tl.load(logits + t * E + offs, mask=offs < E, other=-float("inf")).to(tl.float32)
        if SOFTMAX_FIRST:
            x = tl.exp(x - tl.max(x, 0))
            x = x / tl.sum(x, 0)
        ks = tl.arange(0, BLOCK_K)
        vals = tl.full([BLOCK_K], -float("inf"), tl.float32)
        idx = tl.zeros([BLOCK_K], tl.int32)
        for j in tl.static_range(K):
            best = tl.max(x, 0)
            at = tl.argmax(x, 0)
            vals = tl.where(ks == j, best, vals)
            idx = tl.where(ks == j, at, idx)
            x = tl.where(offs == at, -float("inf"), x)
        if not SOFTMAX_FIRST:  # softmax over the K chosen logits (= softmax, renormalised)
            vals = tl.exp(vals - tl.max(vals, 0))
            vals = vals / tl.sum(vals, 0)
        tl.store(weights + t * K + ks, vals, mask=ks < K)
        tl.store(ids + t * K + ks, idx, mask=ks < K)

    @triton.jit
    def _histogram_kernel(ids, counts, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        e = tl.load(ids + offs, mask=m, other=0)
        tl.atomic_add(counts + e, 1, mask=m)

    @triton.jit
    def _permute_kernel(ids, counts, cursor, x, inv_out, xs, offs_out, n,
                        HIDDEN: tl.constexpr, K: tl.constexpr, E: tl.constexpr,
                        BLOCK_E: tl.constexpr,
                        BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
        eo = tl.arange(0, BLOCK_E)
        c = tl.load(counts + eo, mask=eo < E, other=0)
        if tl.program_id(0) == 0:
            tl.store(offs_out + eo, tl.cumsum(c, 0).to(tl.int32), mask=eo < E)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        e = tl.load(ids + offs, mask=m, other=0)
        start = tl.sum(tl.where(eo[None, :] < e[:, None], c[None, :], 0), axis=1)
        slot = start + tl.atomic_add(cursor + e, 1, mask=m)
        tok = offs // K
        tl.store(inv_out + offs, slot, mask=m)
        src = tok.to(tl.int64) * HIDDEN
        dst = slot.to(tl.int64) * HIDDEN
        for h0 in tl.static_range(0, HIDDEN, BLOCK_H):
            ho = h0 + tl.arange(0, BLOCK_H)
            mm = m[:, None] & (ho[None, :] < HIDDEN)
            row = tl.load(x + src[:, None] + ho[None, :], mask=mm)
            tl.store(xs + dst[:, None] + ho[None, :], row, mask=mm)

    @triton.jit
    def _mla_decode_split(q, cache, part_o, part_lse, kv_len, splits, scale,
                          SPLIT_LEN: tl.constexpr, H: tl.constexpr, LORA: tl.constexpr,
                          ROPE: tl.constexpr, BLOCK_N: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        sp = tl.program_id(1)
        hs = tl.arange(0, H)
        dl = tl.arange(0, LORA)
        dr = tl.arange(0, ROPE)
        row = LORA + ROPE
        qb = q + b * H * row
        ql = tl.load(qb + hs[:, None] * row + dl[None, :])
        qr = tl.load(qb + hs[:, None] * row + LORA + dr[None, :])
        m_i = tl.full([H], -float("inf"), tl.float32)
        l_i = tl.zeros([H], tl.float32)
        acc = tl.zeros([H, LORA], tl.float32)
        start = sp * SPLIT_LEN
        end = tl.minimum(start + SPLIT_LEN, kv_len)
        cb = cache + b * kv_len * row
        for n0 in range(0, SPLIT_LEN, BLOCK_N):
            ns = start + n0 + tl.arange(0, BLOCK_N)
            nm = ns < end
            kl = tl.load(cb + ns[:, None].to(tl.int64) * row + dl[None, :], mask=nm[:, None],
                         other=0.0)
            kr = tl.load(cb + ns[:, None].to(tl.int64) * row + LORA + dr[None, :],
                         mask=nm[:, None], other=0.0)
            s = (tl.dot(ql, tl.trans(kl)) + tl.dot(qr, tl.trans(kr))) * scale
            s = tl.where(nm[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(kl.dtype), kl)
            m_i = m_new
        base = (b * splits + sp) * H
        tl.store(part_o + (base + hs[:, None]) * LORA + dl[None, :], acc / l_i[:, None])
        tl.store(part_lse + base + hs, m_i + tl.log(l_i))

    @triton.jit
    def _mla_decode_merge(part_o, part_lse, out, splits, H: tl.constexpr, LORA: tl.constexpr,
                          BLOCK_S: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        ss = tl.arange(0, BLOCK_S)
        sm = ss < splits
        dl = tl.arange(0, LORA)
        lse = tl.load(part_lse + (b * splits + ss) * H + h, mask=sm, other=-float("inf"))
        w = tl.exp(lse - tl.max(lse, 0))
        w = w / tl.sum(w, 0)
        o = tl.load(part_o + ((b * splits + ss[:, None]) * H + h) * LORA + dl[None, :],
                    mask=sm[:, None], other=0.0)
        tl.store(out + (b * H + h) * LORA + dl,
                 tl.sum(o * w[:, None], 0).to(out.dtype.element_ty))


    @triton.jit
    def _add_rms_norm_kernel(x, r, w, h_out, s_out, eps, HIDDEN: tl.constexpr,
                             BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        o = tl.arange(0, BLOCK)
        m = o < HIDDEN
        v = tl.load(x + t * HIDDEN + o, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(r + t * HIDDEN + o, mask=m, other=0.0).to(tl.float32)
            tl.store(s_out + t * HIDDEN + o, v.to(s_out.dtype.element_ty), mask=m)
        inv = 1.0 / tl.sqrt(tl.sum(v * v, 0) / HIDDEN + eps)
        g = tl.load(w + o, mask=m, other=0.0).to(tl.float32)
        tl.store(h_out + t * HIDDEN + o, (v * inv * g).to(h_out.dtype.element_ty), mask=m)

    @triton.jit
    def _norm_rope_heads(src, dst, w, cos, sin, t, eps, HEADS: tl.constexpr,
                         BLOCK_HEADS: tl.constexpr, HALF: tl.constexpr, NORM: tl.constexpr):
        """Per-head RMSNorm (NORM) then neox RoPE of HEADS rows of 2 * HALF at src -> dst."""
        hs = tl.arange(0, BLOCK_HEADS)
        j = tl.arange(0, HALF)
        m = hs[:, None] < HEADS
        off = hs[:, None] * (2 * HALF) + j[None, :]
        x1 = tl.load(src + off, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src + off + HALF, mask=m, other=0.0).to(tl.float32)
        if NORM:
            inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
            x1 = x1 * inv[:, None] * tl.load(w + j).to(tl.float32)[None, :]
            x2 = x2 * inv[:, None] * tl.load(w + HALF + j).to(tl.float32)[None, :]
        c = tl.load(cos + t * HALF + j)[None, :]
        s = tl.load(sin + t * HALF + j)[None, :]
        tl.store(dst + off, (x1 * c - x2 * s).to(dst.dtype.element_ty), mask=m)
        tl.store(dst + off + HALF, (x2 * c + x1 * s).to(dst.dtype.element_ty), mask=m)

    @triton.jit
    def _qk_norm_rope_kernel(qkv, qn, kn, cos, sin, q_out, k_out, eps, QH: tl.constexpr,
                             KVH: tl.constexpr, BLOCK_QH: tl.constexpr,
                             BLOCK_KVH: tl.constexpr, HALF: tl.constexpr,
                             NORM: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        d = 2 * HALF
        row = qkv + t * (QH + 2 * KVH) * d
        _norm_rope_heads(row, q_out + t * QH * d, qn, cos, sin, t, eps, QH, BLOCK_QH, HALF,
                         NORM)
        _norm_rope_heads(row + QH * d, k_out + t * KVH * d, kn, cos, sin, t, eps, KVH,
                         BLOCK_KVH, HALF, NORM)

    @triton.jit
    def _silu_mul_kernel(gu, out, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = o < WIDTH
        g = tl.load(gu + r * 2 * WIDTH + o, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu + r * 2 * WIDTH + WIDTH + o, mask=m, other=0.0).to(tl.float32)
        tl.store(out + r * WIDTH + o, (g / (1.0 + tl.exp(-g)) * u).to(out.dtype.element_ty),
                 mask=m)

    @triton.jit
    def _moe_sum_kernel(y, inv, w, out, HIDDEN: tl.constexpr, K: tl.constexpr,
                        BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = o < HIDDEN
        acc = tl.zeros([BLOCK], tl.float32)
        for j in tl.static_range(K):
            row = tl.load(inv + t * K + j).to(tl.int64)
            acc += tl.load(w + t * K + j) * tl.load(y + row * HIDDEN + o, mask=m,
                                                    other=0.0).to(tl.float32)
        tl.store(out + t * HIDDEN + o, acc.to(out.dtype.element_ty), mask=m)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _gpu(t: torch.Tensor) -> bool:
    return triton is not None and t.is_cuda


def add_rms_norm(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float):
    """RMSNorm of x (+ r): (normed, the sum, or None without r); vLLM fused_add_rms_norm."""
    if not _gpu(x):
        if r is None:
            return compiled("rms_norm")(x, w, eps), None
        return compiled("add_rms_norm")(x, r, w, eps)
    t, hidden = x.shape
    h = torch.empty_like(x)
    s = torch.empty_like(x) if r is not None else None
    _add_rms_norm_kernel[(t,)](x, r if r is not None else x, w, h, s if s is not None else h,
                               eps, HIDDEN=hidden, BLOCK=_pow2(hidden), HAS_RES=r is not None,
                               num_warps=8 if hidden >= 4096 else 4)
    return h, s


def qk_norm_rope(qkv: torch.Tensor, qn: torch.Tensor | None, kn: torch.Tensor | None,
                 cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int,
                 head_dim: int, eps: float):
    """q [T, QH, D] and k [T, KVH, D] (per-head RMSNorm when weights are given, then RoPE) and
    v, a view of qkv: one kernel, one program per token."""
    if not _gpu(qkv):
        return compiled("qk_norm_rope")(qkv, qn, kn, cos, sin, q_heads, kv_heads, head_dim,
                                        eps)
    t = qkv.shape[0]
    q = torch.empty(t, q_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(t, kv_heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    norm = qn is not None
    _qk_norm_rope_kernel[(t,)](qkv, qn if norm else qkv, kn if norm else qkv, cos, sin, q, k,
                               eps, QH=q_heads, KVH=kv_heads, BLOCK_QH=_pow2(q_heads),
                               BLOCK_KVH=_pow2(kv_heads), HALF=head_dim // 2, NORM=norm,
                               num_warps=4)
    v = qkv[:, (q_heads + kv_heads) * head_dim:].view(t, kv_heads, head_dim)
    return q, k, v


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up of gu = [gate | up] (vLLM silu_and_mul)."""
    if not _gpu(gu):
        return compiled("silu_mul")(gu)
    rows, width = gu.shape[0], gu.shape[1] // 2
    out = torch.empty(rows, width, device=gu.device, dtype=gu.dtype)
    block = min(1024, _pow2(width))
    _silu_mul_kernel[(rows, triton.cdiv(width, block))](gu, out, WIDTH=width, BLOCK=block,
                                                        num_warps=4)
    return out


def moe_sum(y: torch.Tensor, inv: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Each token's K routed rows of y (expert order), weighted and summed (vLLM moe_sum)."""
    if not _gpu(y):
        return compiled("moe_sum")(y, inv, w)
    t, k = w.shape
    hidden = y.shape[1]
    out = torch.empty(t, hidden, device=y.device, dtype=y.dtype)
    block = min(1024, _pow2(hidden))
    _moe_sum_kernel[(t, triton.cdiv(hidden, block))](y, inv, w, out, HIDDEN=hidden, K=k,
                                                     BLOCK=block, num_warps=4)
    return out


def topk_softmax(logits: torch.Tensor, k: int, softmax_first: bool):
    """(weights float32 [T, K], expert ids int32 [T, K]): softmax over all experts then the top
    k (DeepSeek), or the top k logits then softmax over them (Qwen3, Mixtral)."""
    if not _gpu(logits):
        if softmax_first:
            w, ids = logits.float().softmax(-1).topk(k, dim=-1)
        else:
            w, ids = logits.topk(k, dim=-1)
            w = w.float().softmax(-1)
        return w, ids.to(torch.int32)
    t, e = logits.shape
    w = torch.empty(t, k, device=logits.device, dtype=torch.float32)
    ids = torch.empty(t, k, device=logits.device, dtype=torch.int32)
    _topk_softmax_kernel[(t,)](logits, w, ids, e, k, _pow2(e), _pow2(k), softmax_first,
                               num_warps=1)
    return w, ids


def moe_permute(x: torch.Tensor, ids: torch.Tensor, experts: int):
    """Group the routed copies by expert: (rows [T*K, H] in expert order, inv [T, K] each
    copy's row, offs int32 [E] cumulative row ends, as torch._grouped_mm takes them)."""
    t, k = ids.shape
    n, hidden = t * k, x.shape[1]
    if not _gpu(x):
        flat = ids.reshape(-1).long()
        order = flat.argsort(stable=True)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(n, device=x.device)
        counts = torch.bincount(flat, minlength=experts)
        return x.index_select(0, order // k), inv.view(t, k), counts.cumsum(0).to(torch.int32)
    counts = torch.zeros(2 * experts, device=x.device, dtype=torch.int32)  # counts, cursor
    block = 64
    grid = (triton.cdiv(n, block),)
    _histogram_kernel[grid](ids, counts, n, BLOCK=block, num_warps=2)
    inv = torch.empty(t, k, device=x.device, dtype=torch.int32)
    xs = torch.empty(n, hidden, device=x.device, dtype=x.dtype)
    offs = torch.empty(experts, device=x.device, dtype=torch.int32)
    _permute_kernel[grid](ids, counts, counts[experts:], x, inv, xs, offs, n, hidden,
                          K=k, E=experts, BLOCK_E=_pow2(experts), BLOCK=block, BLOCK_H=128,
                          num_warps=4)
    return xs, inv, offs


MLA_SPLIT_TARGET_PROGRAMS = 264  # two waves of the H200's 132 SMs


def mla_decode(q: torch.Tensor, cache: torch.Tensor, lora: int, scale: float,
               block_n: int = 64) -> torch.Tensor:
    """Absorbed MLA decode: q [B, H, lora + rope] over cache [B, L, lora + rope] (one latent row
    per token, the values its first `lora` dims); out [B, H, lora]. Split-KV flash decoding:
    each (sequence, split) program reads its rows once, a second kernel merges the splits."""
    b, h, row = q.shape
    length = cache.shape[1]
    if not _gpu(q):
        scores = torch.bmm(q, cache.transpose(1, 2)).float() * scale
        return torch.bmm(scores.softmax(-1).to(q.dtype), cache[..., :lora])
    want = max(1, min(triton.cdiv(length, block_n), triton.cdiv(MLA_SPLIT_TARGET_PROGRAMS, b)))
    split_len = triton.cdiv(triton.cdiv(length, want), block_n) * block_n
    splits = triton.cdiv(length, split_len)  # every split holds at least one row
    part_o = torch.empty(b, splits, h, lora, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(b, splits, h, device=q.device, dtype=torch.float32)
    out = torch.empty(b, h, lora, device=q.device, dtype=q.dtype)
    _mla_decode_split[(b, splits)](q, cache, part_o, part_lse, length, splits, scale,
                                   SPLIT_LEN=split_len, H=h, LORA=lora, ROPE=row - lora,
                                   BLOCK_N=block_n, num_warps=4, num_stages=2)
    _mla_decode_merge[(b, h)](part_o, part_lse, out, splits, H=h, LORA=lora,
                              BLOCK_S=_pow2(splits), num_warps=4)
    return out
