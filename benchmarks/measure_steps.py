"""Measure whole decode and prefill steps of MoE models on one GPU (PyTorch and Triton).

Why: rackc's step model (compiler/perf/step.py) adds up operator costs fitted to single-kernel
measurements (compiler/perf/measure.py). This script times the whole step of a real
architecture on the same GPU, so that benchmarks/accuracy_steps.py can say how far the sum
of modelled operators is from a real forward pass.

What: a faithful single-GPU bf16 forward of Qwen3-30B-A3B (hidden 2048, 48 layers, all MoE;
GQA 32 q / 4 KV heads of 128; 128 experts top-8 of width 768; vocab 151936) with random
weights (never zeros; about 61 GB). Per layer, in this order (the "stages"):

    attn_norm   RMSNorm
    qkv_proj    fused QKV projection (F.linear to 5120)
    qk_norm     Qwen3's per-head RMSNorm on q and k
    kv_write    new K/V into the cache (decode: one slot of a padded dense [B, 4, L, 128] cache;
                prefill: a token-major [S, 4, 128] cache)
    attention   F.scaled_dot_product_attention, enable_gqa=True (decode: one query token per
                sequence over kv_len cached tokens; prefill: causal over S tokens)
    o_proj      output projection (F.linear 4096 -> 2048)
    residual_1  residual add
    ffn_norm    RMSNorm
    router      F.linear to 128 experts
    topk        top-8 of the logits, softmax over the 8 (= Qwen3's softmax + renormalise)
    sort        tokens sorted by expert (stable argsort), per-expert counts, offsets, weights
    gather      index_select of the routed rows
    gate_up     torch._grouped_mm, fused gate+up [128, 1536, 2048]
    act         SiLU(gate) * up
    down        torch._grouped_mm, down [128, 2048, 768]
    combine     routed rows scaled by their weights, index_add_ back to tokens
    residual_2  residual add

plus the embedding lookup before the layers and the final RMSNorm + LM head after them (decode:
every sequence's row; prefill: the last token only). No sampling. That list is ``--glue
eager``, plain PyTorch without RoPE.

GLUE. By default (``--glue engine``) the work between the GEMMs and attention runs as a serving
engine runs it (compiler/perf/engine_kernels.py): residual adds fused into the next RMSNorm
(``attn_norm`` of layer i takes layer i-1's second residual, ``ffn_norm`` the first; no
residual stages), q/k norm with RoPE as one Inductor kernel (``qk_norm_rope``; RoPE also on
MLA's rope dims), top-k softmax as one Triton kernel, ``permute`` (align by expert and copy
the rows: three launches) in place of sort + gather, SiLU x mul and the un-permute + weighted
sum (``combine``) as Inductor kernels; MLA decode attention as a split-KV Triton kernel
(``triton latent split-kv``) beside the other variants. The GEMMs, grouped GEMMs, SDPA and the
KV write are the same in both modes.

How:
* Decode: the whole step (embedding, 48 layers, LM head) is captured in one CUDA graph and its
  replays are timed with CUDA events, one event pair a replay; the median of >= 20 replays after
  warm-up, with p10 / p90. The KV cache is random; each layer has its own cache where they fit
  in CACHE_BUDGET_BYTES, else layers share caches round-robin (shared caches are >= 1 GB
  apart in time, far past the 60 MB L2, so no layer reads another's cache from L2).
* Prefill (batch 1, no cached prefix): captured and replayed the same way (`us`), and also run
  eagerly (`us_eager`, launch gaps included).
* Per point, each stage is also timed alone: a graph of that stage for all 48 layers (each on
  its own layer's weights), so the sum of stages over the step shows the gaps between kernels.
* SDPA backend: every fused backend (flash, cuDNN, memory-efficient) is timed on the attention
  stage with enable_gqa=True and the fastest that runs is used in the step, as an engine would
  pick its fastest kernel (the math backend only where no fused one runs). At decode the
  "packed" layout of measure.py (the 8 q heads of a KV head as 8 query rows, no enable_gqa) is
  timed for information, not used.
* Routing (ROUTING below): by default whatever the random router picks; the busiest expert's
  load over the mean is recorded for the last layer. ``--routing balanced`` keeps the router's
  GEMM and top-k but sends token t to experts t*8 .. t*8+7 (mod 128), equal loads.
* A self-check compares one layer on a small decode batch with a float32 reference
  (dense attention, per-expert loop) before anything is timed.

ROUTING. With random weights and no RoPE, causal self-attention over one long sequence
averages the value vectors of all earlier tokens, and over the layers that shared component
grows until every token's residual stream points the same way (a CPU run at the real widths,
16 experts: mean pairwise cosine 0.67 after 8 layers, 0.93 after 48). Then every prefill token
picks the same 8 experts (busiest / mean = 128 / 8 = 16 on the H200), which a trained router
with a load-balancing loss does not do: the default prefill points measure that collapsed
routing (8 tall expert GEMMs, 8 experts' weights read). Decode sequences attend their own
random caches and stay near uniform (busiest / mean 2-4 at batch 8-128).

Run from the repository root on the GPU machine (about 70 s on an H200, weights included)::

    PYTHONUNBUFFERED=1 python3 benchmarks/measure_steps.py -o $OUT/h200-steps.json

``--points decode:8:1024,prefill:1024`` runs a subset; ``--tiny`` runs a shrunken model on
the CPU (no graphs, wall-clock timing) to test the code without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root
from compiler.perf import engine_kernels as ek
from compiler.perf import measure

SCHEMA = "rackc.steps/v1"
BF16 = torch.bfloat16


@dataclass(frozen=True)
class Config:
    """One MoE architecture. GQA (`attention` "gqa": q_heads x head_dim queries over kv_heads)
    or MLA ("mla": a kv_lora latent + qk_rope key per token, q_heads of qk_nope + qk_rope query
    dims and v_head_dim values; decode absorbs W_UK / W_UV, prefill expands the latent)."""

    name: str = "qwen3-30b-a3b"
    hidden: int = 2048
    layers: int = 48
    q_heads: int = 32
    kv_heads: int = 4
    head_dim: int = 128
    experts: int = 128
    top_k: int = 8
    inter: int = 768
    vocab: int = 151936
    eps: float = 1e-6
    qk_norm: bool = True  # Qwen3's per-head RMSNorm on q and k
    router_softmax_first: bool = False  # DeepSeek: softmax over all experts, then top-k
    attention: str = "gqa"
    kv_lora: int = 0
    qk_nope: int = 0
    qk_rope: int = 0
    v_head_dim: int = 0
    shared_experts: int = 0  # each of width `inter`, fused into one MLP
    dense_layers: int = 0  # the first layers are dense MLPs of width dense_inter
    dense_inter: int = 0


QWEN3_30B_A3B = Config()
# DeepSeek-V2-Lite (HF config.json): MLA without q compression, 1 dense layer, 64 routed
# experts top-6 with 2 shared, softmax routing without renormalisation.
DEEPSEEK_V2_LITE = Config(
    name="deepseek-v2-lite", hidden=2048, layers=27, q_heads=16, kv_heads=1, head_dim=192,
    experts=64, top_k=6, inter=1408, vocab=102400, qk_norm=False, router_softmax_first=True,
    attention="mla", kv_lora=512, qk_nope=128, qk_rope=64, v_head_dim=128, shared_experts=2,
    dense_layers=1, dense_inter=10944)
# Mixtral-8x7B (HF config.json): GQA 32 / 8 heads of 128, 8 experts top-2 of width 14336.
MIXTRAL_8X7B = Config(
    name="mixtral-8x7b", hidden=4096, layers=32, q_heads=32, kv_heads=8, head_dim=128,
    experts=8, top_k=2, inter=14336, vocab=32000, eps=1e-5, qk_norm=False)
MODELS = {c.name: c for c in (QWEN3_30B_A3B, DEEPSEEK_V2_LITE, MIXTRAL_8X7B)}
TINY = Config(name="tiny", hidden=256, layers=3, q_heads=8, kv_heads=2, head_dim=32, experts=8,
              top_k=2, inter=64, vocab=1000)
TINY_MLA = Config(name="tiny-mla", hidden=256, layers=3, q_heads=4, kv_heads=1, head_dim=48,
                  experts=8, top_k=3, inter=64, vocab=1000, qk_norm=False,
                  router_softmax_first=True, attention="mla", kv_lora=64, qk_nope=32,
                  qk_rope=16, v_head_dim=32, shared_experts=2, dense_layers=1, dense_inter=128)
TINY_MODELS = {"qwen3-30b-a3b": TINY, "mixtral-8x7b": TINY, "deepseek-v2-lite": TINY_MLA}

DECODE_GRID = [(b, n) for b in (1, 8, 32, 128) for n in (1024, 8192)]
PREFILL_GRID = [1024, 4096, 16384]
CACHE_BUDGET_BYTES = 40 << 30  # KV cache beside ~61 GB of weights on a 141 GB card
GPU_BYTES_FOR_WEIGHTS_AND_CACHE = 118 << 30  # of the H200's 139.8 GiB: room for activations
STEP_REPS = (20, 60, 1.0)  # min, max replays, target seconds of timed replays
STAGE_REPS = (10, 30, 0.25)
EAGER_REPS = 5
FUSED = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Model: random weights, one dict of tensors per layer.


class Model:
    def __init__(self, c: Config, device: str, seed: int = 0):
        self.c, self.device = c, device
        torch.manual_seed(seed)
        qkv = (c.q_heads + 2 * c.kv_heads) * c.head_dim

        def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
            return torch.empty(shape, device=device, dtype=BF16).normal_(0.0, std)

        def norm_weight(n: int) -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(n, device=device)).to(BF16)

        self.embed = normal(c.vocab, c.hidden, std=1.0)
        self.layers = []
        for i in range(c.layers):
            w = {"ln1": norm_weight(c.hidden), "ln2": norm_weight(c.hidden)}
            if c.attention == "mla":
                w["wq"] = normal(c.q_heads * c.head_dim, c.hidden)
                w["wkv_a"] = normal(c.kv_lora + c.qk_rope, c.hidden)
                w["kvn"] = norm_weight(c.kv_lora)
                # W_UK and W_UV of every head, [H, nope + v, lora]; decode uses them absorbed
                w["wkv_b"] = normal(c.q_heads * (c.qk_nope + c.v_head_dim), c.kv_lora)
                w["wo"] = normal(c.hidden, c.q_heads * c.v_head_dim)
            else:
                w["wqkv"] = normal(qkv, c.hidden)
                w["wo"] = normal(c.hidden, c.q_heads * c.head_dim)
                if c.qk_norm:
                    w["qn"], w["kn"] = norm_weight(c.head_dim), norm_weight(c.head_dim)
            if i < c.dense_layers:
                w["wd13"] = normal(2 * c.dense_inter, c.hidden)
                w["wd2"] = normal(c.hidden, c.dense_inter)
            else:
                w["wr"] = normal(c.experts, c.hidden)
                w["w13"] = normal(c.experts, 2 * c.inter, c.hidden)
                w["w2"] = normal(c.experts, c.hidden, c.inter)
                if c.shared_experts:
                    w["ws13"] = normal(2 * c.shared_experts * c.inter, c.hidden)
                    w["ws2"] = normal(c.hidden, c.shared_experts * c.inter)
            self.layers.append(w)
        self.lnf = norm_weight(c.hidden)
        self.lm_head = normal(c.vocab, c.hidden)

    def nbytes(self) -> int:
        tensors = [self.embed, self.lnf, self.lm_head] + [t for w in self.layers
                                                          for t in w.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------------------------------
# One step as a list of stages. A stage is fn(state, layer) mutating the dict `state`.

Stage = Callable[[dict, int], None]


class Step:
    """The stages of one decode step (`batch` sequences over `length` cached tokens) or one
    prefill (`length` new tokens, batch 1), with their caches and attention choice."""

    def __init__(self, m: Model, phase: str, batch: int, length: int, routing: str = "router",
                 glue: str = "engine"):
        self.m, self.c, self.phase, self.batch, self.length = m, m.c, phase, batch, length
        self.engine = glue == "engine"  # the glue an engine runs (GLUE), else plain PyTorch
        self.tokens = batch if phase == "decode" else batch * length
        if routing == "auto":  # a trained router's balance at prefill (see ROUTING)
            routing = "router" if phase == "decode" else "balanced"
        self.routing = routing
        # "balanced": token t goes to experts (t*K .. t*K+K-1) mod E, all distinct; the
        # router's GEMM and top-k still run, only their choice of experts is replaced.
        self.balanced_ids = (torch.arange(self.tokens * m.c.top_k, device=m.device)
                             % m.c.experts).view(self.tokens, m.c.top_k).to(torch.int32)
        # None: PyTorch's dispatcher picks; MLA decode under engine glue: the Triton kernel
        self.backend: SDPBackend | str | None = (
            "triton" if self.engine and phase == "decode" and m.c.attention == "mla" else None)
        self.packed = False  # GQA decode: the q heads of a KV head as query rows
        self.attn_name = "default"  # the attention variant kept (choose_attention)
        c = self.c
        mla = c.attention == "mla"
        row = c.kv_lora + c.qk_rope if mla else c.kv_heads * c.head_dim
        tensors = 1 if mla else 2  # MLA caches one latent row per token
        if phase == "decode":
            self.cache_shape = ((batch, length, row) if mla
                                else (batch, c.kv_heads, length, c.head_dim))
            per_layer = tensors * batch * length * row * 2
        else:
            self.cache_shape = (self.tokens, row) if mla else (self.tokens, c.kv_heads,
                                                               c.head_dim)
            per_layer = tensors * self.tokens * row * 2
        budget = min(CACHE_BUDGET_BYTES, GPU_BYTES_FOR_WEIGHTS_AND_CACHE - m.nbytes())
        self.n_caches = max(1, min(c.layers, budget // per_layer))
        self.cache_bytes = self.n_caches * per_layer
        self.caches = [tuple(torch.randn(self.cache_shape, device=m.device, dtype=BF16)
                             for _ in range(tensors)) for _ in range(self.n_caches)]
        # RoPE (engine glue only): decode tokens sit at position length - 1, prefill at 0..S-1
        rot = c.qk_rope if mla else c.head_dim
        cos, sin = ek.rope_tables(length, rot, m.device)
        pos = (torch.full((self.tokens,), length - 1, device=m.device) if phase == "decode"
               else torch.arange(self.tokens, device=m.device) % length)
        self.cos, self.sin = cos[pos].contiguous(), sin[pos].contiguous()
        gen = torch.Generator(device="cpu").manual_seed(1)
        self.state: dict = {"ids": torch.randint(0, c.vocab, (self.tokens,), generator=gen)
                            .to(m.device)}

    # -- attention, the only stage whose implementation varies
    def sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
        if self.backend is None:
            return F.scaled_dot_product_attention(q, k, v, **kw)
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    def attention_stages(self) -> list[Stage]:
        c, m = self.c, self.m
        T, D = self.tokens, c.head_dim
        QH, KVH = c.q_heads, c.kv_heads
        L = m.layers

        def qkv_proj(s, i):
            s["qkv"] = F.linear(s["h"], L[i]["wqkv"])
            if not c.qk_norm and not self.engine:
                q, k, v = s["qkv"].split([QH * D, KVH * D, KVH * D], -1)
                s["q"], s["k"], s["v"] = q.view(T, QH, D), k.view(T, KVH, D), v.view(T, KVH, D)

        def qk_norm(s, i):
            q, k, v = s["qkv"].split([QH * D, KVH * D, KVH * D], -1)
            s["q"] = F.rms_norm(q.view(T, QH, D), (D,), L[i]["qn"], c.eps)
            s["k"] = F.rms_norm(k.view(T, KVH, D), (D,), L[i]["kn"], c.eps)
            s["v"] = v.view(T, KVH, D)

        def qk_norm_rope(s, i):  # engine glue: one Inductor kernel (norms if any, RoPE)
            s["q"], s["k"], s["v"] = ek.qk_norm_rope(
                s["qkv"], L[i].get("qn"), L[i].get("kn"), self.cos, self.sin, QH, KVH, D, c.eps)

        def kv_write(s, i):
            kc, vc = self.caches[i % self.n_caches]
            if self.phase == "decode":
                pos = self.length - 1  # the new token's slot; every sequence has kv_len tokens
                kc[:, :, pos] = s["k"]
                vc[:, :, pos] = s["v"]
            else:
                kc.copy_(s["k"])
                vc.copy_(s["v"])

        def attention(s, i):
            kc, vc = self.caches[i % self.n_caches]
            if self.phase == "decode" and self.packed:
                q = s["q"].view(T, KVH, QH // KVH, D)
                o = self.sdpa(q, kc, vc)
            elif self.phase == "decode":
                q = s["q"].view(T, QH, 1, D)
                o = self.sdpa(q, kc, vc, enable_gqa=True)
            else:  # batch 1: [S, heads, D] viewed as [1, heads, S, D]
                q = s["q"].transpose(0, 1).unsqueeze(0)
                k, v = kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0)
                o = self.sdpa(q, k, v, is_causal=True, enable_gqa=True)
                o = o[0].transpose(0, 1)
            s["o"] = o.reshape(T, QH * D)

        def o_proj(s, i):
            s["a"] = F.linear(s["o"], L[i]["wo"])

        norm = [qk_norm_rope] if self.engine else ([qk_norm] if c.qk_norm else [])
        return [qkv_proj, *norm, kv_write, attention, o_proj]

    def mla_stages(self) -> list[Stage]:
        """MLA: decode attends the latent cache with W_UK absorbed into the queries and W_UV
        into the output (FlashMLA's form); prefill expands the latent into per-head K / V."""
        c, m = self.c, self.m
        T, QH, lora, rope, nope, vd = (self.tokens, c.q_heads, c.kv_lora, c.qk_rope, c.qk_nope,
                                       c.v_head_dim)
        scale = 1.0 / math.sqrt(nope + rope)
        L = m.layers

        def w_ukv(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            w = L[i]["wkv_b"].view(QH, nope + vd, lora)
            return w[:, :nope], w[:, nope:]  # W_UK [H, nope, lora], W_UV [H, v, lora]

        def q_proj(s, i):
            s["q"] = F.linear(s["h"], L[i]["wq"]).view(T, QH, nope + rope)

        def kv_a(s, i):
            s["kva"] = F.linear(s["h"], L[i]["wkv_a"])

        def kv_norm(s, i):
            if self.engine:  # one Inductor kernel: latent RMSNorm, RoPE on the rope key
                s["ckv"] = ek.compiled("latent_norm_rope")(s["kva"], L[i]["kvn"], self.cos,
                                                           self.sin, lora, c.eps)
                return
            lat = F.rms_norm(s["kva"][:, :lora], (lora,), L[i]["kvn"], c.eps)
            s["ckv"] = torch.cat([lat, s["kva"][:, lora:]], -1)  # the cached row

        def kv_write(s, i):
            (cache,) = self.caches[i % self.n_caches]
            if self.phase == "decode":
                cache[:, self.length - 1] = s["ckv"]
            else:
                cache.copy_(s["ckv"])

        def q_absorb(s, i):
            w_uk, _ = w_ukv(i)
            q_lat = torch.bmm(s["q"][..., :nope].transpose(0, 1), w_uk)  # [H, T, lora]
            if self.engine:  # RoPE on q_pe fused with the concatenation
                s["qa"] = ek.compiled("q_latent")(q_lat.transpose(0, 1), s["q"], self.cos,
                                                  self.sin, nope)
                return
            s["qa"] = torch.cat([q_lat.transpose(0, 1), s["q"][..., nope:]], -1)

        def attention(s, i):
            (cache,) = self.caches[i % self.n_caches]
            if self.phase == "decode":
                if self.backend == "triton":  # split-KV flash decoding, each row read once
                    o = ek.mla_decode(s["qa"], cache, lora, scale)
                elif self.backend == "bmm":  # scores and values as two batched GEMMs
                    scores = torch.bmm(s["qa"], cache.transpose(1, 2)) * scale
                    p = scores.float().softmax(-1).to(BF16)
                    o = torch.bmm(p, cache[..., :lora])
                else:  # one KV head: the H query heads are the query rows
                    q = s["qa"].unsqueeze(1)
                    kv = cache.unsqueeze(1)
                    o = self.sdpa(q, kv, kv[..., :lora], scale=scale)[:, 0]
                s["ol"] = o  # [T, H, lora]
            else:
                k, v = s["k"], s["v"]
                o = self.sdpa(s["q"].transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                              v.transpose(0, 1).unsqueeze(0), is_causal=True, scale=scale)
                s["o"] = o[0].transpose(0, 1).reshape(T, QH * vd)

        def kv_expand(s, i):
            if self.engine:  # RoPE on the queries' rope part (the key's is in the cache)
                s["q"] = ek.compiled("q_latent")(s["q"][..., :nope], s["q"], self.cos,
                                                 self.sin, nope)
            kv = F.linear(cache_latent(s), L[i]["wkv_b"]).view(T, QH, nope + vd)
            rope_k = s["ckv"][:, lora:].unsqueeze(1).expand(T, QH, rope)
            s["k"] = torch.cat([kv[..., :nope], rope_k], -1)
            s["v"] = kv[..., nope:]

        def cache_latent(s) -> torch.Tensor:
            return s["ckv"][:, :lora]

        def o_absorb(s, i):
            _, w_uv = w_ukv(i)
            o = torch.bmm(s["ol"].transpose(0, 1), w_uv.transpose(1, 2))  # [H, T, v]
            s["o"] = o.transpose(0, 1).reshape(T, QH * vd)

        def o_proj(s, i):
            s["a"] = F.linear(s["o"], L[i]["wo"])

        if self.phase == "decode":
            return [q_proj, kv_a, kv_norm, kv_write, q_absorb, attention, o_absorb, o_proj]
        return [q_proj, kv_a, kv_norm, kv_write, kv_expand, attention, o_proj]

    def ffn_stages(self) -> list[Stage]:
        c, m = self.c, self.m
        K, E, inter = c.top_k, c.experts, c.inter
        L = m.layers

        def moe_only(fn: Stage) -> Stage:
            def stage(s, i):
                if i >= c.dense_layers:
                    fn(s, i)
            stage.__name__ = fn.__name__
            return stage

        def dense_ffn(s, i):
            if i < c.dense_layers:
                gu = F.linear(s["h"], L[i]["wd13"])
                a = (ek.silu_mul(gu) if self.engine
                     else F.silu(gu[:, :c.dense_inter]) * gu[:, c.dense_inter:])
                s["moe"] = F.linear(a, L[i]["wd2"])

        def router(s, i):
            s["logits"] = F.linear(s["h"], L[i]["wr"])

        def topk(s, i):
            if self.engine:  # one kernel (vLLM topk_softmax)
                w, ids = ek.topk_softmax(s["logits"], K, c.router_softmax_first)
                s["tw"], s["ti"] = w, self.balanced_ids if self.routing == "balanced" else ids
                return
            if c.router_softmax_first:
                w, ids = s["logits"].float().softmax(-1).topk(K, dim=-1)
            else:
                w, ids = s["logits"].topk(K, dim=-1)
                w = w.float().softmax(-1)
            if self.routing == "balanced":
                ids = self.balanced_ids
            s["tw"], s["ti"] = w, ids

        def sort(s, i):
            flat = s["ti"].reshape(-1)
            order = flat.argsort(stable=True)
            s["tok"] = order // K
            counts = torch.zeros(E, device=flat.device, dtype=torch.int64)
            counts.scatter_add_(0, flat, torch.ones_like(flat))
            s["counts"] = counts
            s["offs"] = counts.cumsum(0).to(torch.int32)
            s["ws"] = s["tw"].reshape(-1)[order].to(BF16)

        def gather(s, i):
            s["xs"] = s["h"].index_select(0, s["tok"])

        def permute(s, i):  # engine glue: align by expert and copy the rows (three launches)
            s["xs"], s["inv"], s["offs"] = ek.moe_permute(s["h"], s["ti"], E)

        def gate_up(s, i):
            s["gu"] = torch._grouped_mm(s["xs"], L[i]["w13"].transpose(-2, -1), offs=s["offs"])

        def act(s, i):
            gu = s["gu"]
            s["act"] = (ek.silu_mul(gu) if self.engine
                        else F.silu(gu[:, :inter]) * gu[:, inter:])

        def down(s, i):
            s["y"] = torch._grouped_mm(s["act"], L[i]["w2"].transpose(-2, -1), offs=s["offs"])

        def combine(s, i):
            if self.engine:  # un-permute + weighted sum of each token's rows (vLLM moe_sum)
                s["moe"] = ek.moe_sum(s["y"], s["inv"], s["tw"])
                return
            out = torch.zeros_like(s["h"])
            s["moe"] = out.index_add_(0, s["tok"], s["y"] * s["ws"].unsqueeze(1))

        def shared_expert(s, i):
            width = c.shared_experts * inter
            gu = F.linear(s["h"], L[i]["ws13"])
            a = ek.silu_mul(gu) if self.engine else F.silu(gu[:, :width]) * gu[:, width:]
            s["moe"] = s["moe"] + F.linear(a, L[i]["ws2"])

        dense = [dense_ffn] if c.dense_layers else []
        shared = [shared_expert] if c.shared_experts else []
        routed = [permute] if self.engine else [sort, gather]
        moe = [router, topk, *routed, gate_up, act, down, combine, *shared]
        return [*dense, *(moe_only(f) for f in moe)]

    def stages(self) -> list[tuple[str, Stage]]:
        c = self.c
        H = c.hidden
        L = self.m.layers

        def attn_norm(s, i):
            if self.engine and i > 0:  # the previous layer's residual add fused in
                s["h"], s["x"] = ek.add_rms_norm(s["moe"], s["x"], L[i]["ln1"], c.eps)
            elif self.engine:
                s["h"] = ek.add_rms_norm(s["x"], None, L[i]["ln1"], c.eps)[0]
            else:
                s["h"] = F.rms_norm(s["x"], (H,), L[i]["ln1"], c.eps)

        def residual_1(s, i):
            s["x"] = s["x"] + s["a"]

        def ffn_norm(s, i):
            if self.engine:  # residual add + RMSNorm, one kernel
                s["h"], s["x"] = ek.add_rms_norm(s["a"], s["x"], L[i]["ln2"], c.eps)
            else:
                s["h"] = F.rms_norm(s["x"], (H,), L[i]["ln2"], c.eps)

        def residual_2(s, i):
            s["x"] = s["x"] + s["moe"]

        attn = self.mla_stages() if c.attention == "mla" else self.attention_stages()
        if self.engine:  # residual adds fused into the next norm
            return [(f.__name__, f) for f in (attn_norm, *attn, ffn_norm, *self.ffn_stages())]
        return [(f.__name__, f) for f in (attn_norm, *attn, residual_1, ffn_norm,
                                          *self.ffn_stages(), residual_2)]

    def embed(self, s: dict, _: int = 0) -> None:
        s["x"] = self.m.embed.index_select(0, s["ids"])

    def head(self, s: dict, _: int = 0) -> None:
        x = s["x"]
        if self.phase == "prefill":  # the last token of each sequence
            x = x.view(self.batch, self.length, -1)[:, -1]
        if self.engine:  # the last layer's residual add fused into the final norm
            last = s["moe"]
            if self.phase == "prefill":
                last = last.view(self.batch, self.length, -1)[:, -1]
            h = ek.add_rms_norm(last.contiguous(), x.contiguous(), self.m.lnf, self.c.eps)[0]
        else:
            h = F.rms_norm(x, (self.c.hidden,), self.m.lnf, self.c.eps)
        s["out"] = F.linear(h, self.m.lm_head)

    def run(self) -> None:
        """The whole step."""
        s, stages = self.state, self.stages()
        self.embed(s)
        for layer in range(self.c.layers):
            for _, fn in stages:
                fn(s, layer)
        self.head(s)

    def prime(self) -> None:
        """Fill the state with every stage's output (embedding, then the dense layers and the
        first MoE layer, eagerly)."""
        self.embed(self.state)
        for layer in range(self.c.dense_layers + 1):
            for _, fn in self.stages():
                fn(self.state, layer)

    def run_stage(self, fn: Stage) -> Callable[[], None]:
        """`fn` for every layer, each on its own weights (the state must hold its inputs)."""
        def call() -> None:
            for layer in range(self.c.layers):
                fn(self.state, layer)
        return call


# ---------------------------------------------------------------------------------------
# Timing.


class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self._graphs: list = []

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def warm(self, fn: Callable[[], None]) -> None:
        """One eager run on a side stream, as graph capture requires."""
        if not self.cuda:
            fn()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()

    def samples(self, run: Callable[[], None], reps: tuple[int, int, float]) -> list[float]:
        """Microseconds of each timed call of `run`: one untimed call, then enough timed
        calls to fill the target time, between min and max."""
        lo, hi, target = reps
        first = self._timed(run, 1)[0]
        n = min(hi, max(lo, math.ceil(target * 1e6 / max(first, 1.0))))
        return self._timed(run, n)

    def _timed(self, run: Callable[[], None], n: int) -> list[float]:
        if not self.cuda:
            out = []
            for _ in range(n):
                t = time.perf_counter()
                run()
                out.append((time.perf_counter() - t) * 1e6)
            return out
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in events]

    def graph(self, fn: Callable[[], None]) -> Callable[[], None]:
        """`fn` captured in a CUDA graph (after a warm-up run); the replay. On CPU: fn."""
        self.warm(fn)
        if not self.cuda:
            return fn
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()
        self._graphs.append(g)
        return g.replay

    def release(self) -> None:
        self._graphs.clear()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def stats(samples: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    return {"us": round(statistics.median(samples), 2), "us_p10": round(deciles[0], 2),
            "us_p90": round(deciles[-1], 2), "reps": len(samples)}


# ---------------------------------------------------------------------------------------
# Measurement of one point.


def attention_variants(step: Step) -> list[tuple[SDPBackend | str, bool]]:
    """(backend, packed) pairs to time. GQA: every fused SDPA backend with enable_gqa, and at
    decode the packed layout too. MLA decode: no fused SDPA kernel takes 576-wide heads, so the
    math backend and two plain batched GEMMs ("bmm") compete with them."""
    fused = [(b, False) for b in FUSED]
    if step.c.attention == "mla":
        extra = [(SDPBackend.MATH, False), ("bmm", False)] if step.phase == "decode" else []
        if step.engine and step.phase == "decode":
            extra.append(("triton", False))
        return fused + extra
    if step.phase == "decode":
        return fused + [(b, True) for b in FUSED]
    return fused


def variant_name(backend: SDPBackend | str, packed: bool, mla: bool) -> str:
    if backend == "bmm":
        return "bmm latent"
    if backend == "triton":
        return "triton latent split-kv"
    layout = " latent" if mla else (" packed" if packed else " enable_gqa")
    return f"{backend.name.lower()}{layout}"


def choose_attention(step: Step, timer: Timer) -> tuple[dict[str, float], dict[str, float]]:
    """Time the attention stage under each variant and keep the fastest unpacked one in
    `step` (the math backend only where nothing else runs); packed GQA is for information.
    Returns ({impl: us per step}, {impl: error})."""
    fn = dict(step.stages())["attention"]
    times, errors, mla = {}, {}, step.c.attention == "mla"
    if not timer.cuda:
        return times, errors
    kinds = {}
    for backend, packed in attention_variants(step):
        step.backend, step.packed = backend, packed
        name = variant_name(backend, packed, mla)
        kinds[name] = (backend, packed)
        try:
            times[name] = statistics.median(timer.samples(timer.graph(step.run_stage(fn)),
                                                          STAGE_REPS))
        except RuntimeError as err:
            errors[name] = (str(err).strip().splitlines() or ["?"])[0][:160]
        timer.release()
    usable = {n: t for n, t in times.items() if not kinds[n][1]}
    if not usable:  # no fused backend: the math path
        step.backend, step.packed = SDPBackend.MATH, False
        name = variant_name(SDPBackend.MATH, False, mla)
        times[name] = statistics.median(
            timer.samples(timer.graph(step.run_stage(fn)), STAGE_REPS))
        timer.release()
        kinds[name] = (SDPBackend.MATH, False)
        usable = {name: times[name]}
    best = min(usable, key=usable.get)
    step.backend, step.packed = kinds[best]
    step.attn_name = best
    return {n: round(t, 2) for n, t in times.items()}, errors


def measure_point(m: Model, timer: Timer, phase: str, batch: int, length: int,
                  stages: bool = True, routing: str = "router", glue: str = "engine") -> dict:
    started = time.monotonic()
    step = Step(m, phase, batch, length, routing, glue)
    step.prime()
    attn_times, attn_errors = choose_attention(step, timer)
    # Whole step: graph replays.
    replay = timer.graph(step.run)
    whole = timer.samples(replay, STEP_REPS)
    out = step.state["out"]
    finite = bool(torch.isfinite(out.float()).all())
    offs = step.state["offs"].long()  # of the last layer
    counts = torch.diff(offs, prepend=offs.new_zeros(1)).float()
    point = {"phase": phase, "batch": batch}
    point.update({"kv_len": length} if phase == "decode" else {"tokens": length})
    point.update(stats(whole))
    point["routing"] = step.routing
    point["glue"] = glue
    point["timing"] = "cuda-graph replay" if timer.cuda else "eager wall clock (CPU)"
    chosen = step.attn_name
    point["attn_impl"] = chosen if chosen.startswith(("bmm", "triton")) else f"sdpa:{chosen}"
    timer.release()
    if phase == "prefill":
        step.run()  # eager: same code, launches from Python
        timer.sync()
        point["us_eager"] = round(statistics.median(timer._timed(step.run, EAGER_REPS)), 2)
    # Each stage alone, for all layers; then embedding and head.
    if stages:
        comp = {}
        for name, fn in step.stages():
            comp[name] = round(statistics.median(
                timer.samples(timer.graph(step.run_stage(fn)), STAGE_REPS)), 2)
            timer.release()
        comp["embed"] = round(statistics.median(
            timer.samples(timer.graph(lambda st=step: st.embed(st.state)), STAGE_REPS)), 2)
        timer.release()
        comp["head"] = round(statistics.median(
            timer.samples(timer.graph(lambda st=step: st.head(st.state)), STAGE_REPS)), 2)
        timer.release()
        point["stages_us"] = comp
        point["stages_sum_us"] = round(sum(comp.values()), 2)
    point["attn_variants_us"] = attn_times
    if attn_errors:
        point["attn_variant_errors"] = attn_errors
    point["expert_load_max_over_mean"] = round(float(counts.max() / counts.mean()), 3)
    point["kv_caches"] = {"distinct": step.n_caches, "bytes": step.cache_bytes}
    point["output_finite"] = finite
    point["seconds"] = round(time.monotonic() - started, 1)
    del step
    timer.release()
    return point


# ---------------------------------------------------------------------------------------
# Self-check: one layer on a small decode batch against a float32 reference.


def reference_attention(m: Model, w: dict, h: torch.Tensor, cache: tuple[torch.Tensor, ...],
                        pos: int, rope: bool) -> torch.Tensor:
    """float32 decode attention of one layer, the new token written at `pos` (with RoPE at
    `pos` on its query and key when `rope`); MLA expanded (K and V rebuilt per head from the
    latent), so the absorbed forward is checked."""
    c = m.c
    B, QH = h.shape[0], c.q_heads

    def rot(x: torch.Tensor) -> torch.Tensor:  # x [B, heads, dim]
        if not rope:
            return x
        cos, sin = (t[pos].expand(B, -1) for t in ek.rope_tables(pos + 1, x.shape[-1],
                                                                  x.device))
        return ek._rope(x, cos, sin)

    if c.attention == "mla":
        lora, nope, vd = c.kv_lora, c.qk_nope, c.v_head_dim
        q = (h @ w["wq"].T).view(B, QH, nope + c.qk_rope)
        q = torch.cat([q[..., :nope], rot(q[..., nope:])], -1)
        kva = h @ w["wkv_a"].T
        lat = F.rms_norm(kva[:, :lora], (lora,), w["kvn"], c.eps)
        lc = cache[0].float().clone()
        lc[:, pos] = torch.cat([lat, rot(kva[:, None, lora:])[:, 0]], -1)
        wb = w["wkv_b"].view(QH, nope + vd, lora)
        k_nope = torch.einsum("bld,hnd->bhln", lc[..., :lora], wb[:, :nope])
        k_rope = lc[..., lora:].unsqueeze(1).expand(-1, QH, -1, -1)
        k = torch.cat([k_nope, k_rope], -1)
        v = torch.einsum("bld,hnd->bhln", lc[..., :lora], wb[:, nope:])
        scores = torch.einsum("bhd,bhld->bhl", q, k) / math.sqrt(nope + c.qk_rope)
        o = torch.einsum("bhl,bhld->bhd", scores.softmax(-1), v).reshape(B, QH * vd)
        return o @ w["wo"].T
    D, KVH = c.head_dim, c.kv_heads
    q, k, v = (h @ w["wqkv"].T).split([QH * D, KVH * D, KVH * D], -1)
    q, k = q.view(B, QH, D), k.view(B, KVH, D)
    if c.qk_norm:
        q = F.rms_norm(q, (D,), w["qn"], c.eps)
        k = F.rms_norm(k, (D,), w["kn"], c.eps)
    q, k = rot(q), rot(k)
    kc, vc = cache[0].float().clone(), cache[1].float().clone()
    kc[:, :, pos], vc[:, :, pos] = k, v.view(B, KVH, D)
    kr = kc.repeat_interleave(QH // KVH, dim=1)  # [B, QH, L, D]
    vr = vc.repeat_interleave(QH // KVH, dim=1)
    scores = torch.einsum("bhd,bhld->bhl", q, kr) / math.sqrt(D)
    o = torch.einsum("bhl,bhld->bhd", scores.softmax(-1), vr).reshape(B, QH * D)
    return o @ w["wo"].T


def reference_ffn(m: Model, w: dict, h: torch.Tensor, layer: int) -> torch.Tensor:
    """float32 FFN of one layer: dense MLP, or routed experts one by one plus shared ones."""
    c = m.c

    def mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        gu = x @ w13.T
        width = gu.shape[-1] // 2
        return (F.silu(gu[..., :width]) * gu[..., width:]) @ w2.T

    if layer < c.dense_layers:
        return mlp(h, w["wd13"], w["wd2"])
    logits = h @ w["wr"].T
    if c.router_softmax_first:
        tw, ti = logits.softmax(-1).topk(c.top_k, -1)
    else:
        tw, ti = logits.topk(c.top_k, -1)
        tw = tw.softmax(-1)
    out = torch.zeros_like(h)
    for b in range(h.shape[0]):
        for j in range(c.top_k):
            e = int(ti[b, j])
            out[b] += tw[b, j] * mlp(h[b], w["w13"][e], w["w2"][e])
    if c.shared_experts:
        out = out + mlp(h, w["ws13"], w["ws2"])
    return out


def reference_layer(m: Model, x: torch.Tensor, layer: int, cache: tuple[torch.Tensor, ...],
                    pos: int, rope: bool) -> torch.Tensor:
    c, w = m.c, {k: v.float() for k, v in m.layers[layer].items()}
    x = x.float()
    x = x + reference_attention(m, w, F.rms_norm(x, (c.hidden,), w["ln1"], c.eps), cache, pos,
                                rope)
    return x + reference_ffn(m, w, F.rms_norm(x, (c.hidden,), w["ln2"], c.eps), layer)


def self_check(m: Model, glue: str) -> float:
    """Worst relative error of the first layer and the first MoE layer (decode, batch 4,
    kv_len 64) against float32. The MoE layer runs on the dense layers' outputs. Under engine
    glue a layer's last residual add is left to the next norm, so it is added here."""
    step = Step(m, "decode", 4, 64, glue=glue)
    s = step.state
    step.embed(s)
    worst, engine = 0.0, step.engine

    def layer_out() -> torch.Tensor:
        return s["x"] + s["moe"] if engine else s["x"]

    for layer in sorted({0, m.c.dense_layers}):
        x0 = (layer_out() if layer else s["x"]).clone()
        cache0 = tuple(t.clone() for t in step.caches[layer % step.n_caches])
        for _, fn in step.stages():
            fn(s, layer)
        ref = reference_layer(m, x0, layer, cache0, 63, engine)
        worst = max(worst, float((layer_out().float() - ref).norm() / ref.norm()))
    del step
    return worst


# ---------------------------------------------------------------------------------------
# Device description: compiler/perf/measure.py's, or the CPU smoke test's.


def describe_device(device: str) -> dict:
    if device == "cuda":
        return measure.describe_device()
    return {"gpu": "none (CPU smoke test)", "torch": torch.__version__,
            "measured_on": datetime.date.today().isoformat()}


# ---------------------------------------------------------------------------------------
# Driver.


def parse_points(text: str | None, tiny: bool) -> list[tuple[str, int, int]]:
    """[(phase, batch, length)]: decode:B:L and prefill:S items, or the full grid."""
    if text:
        out = []
        for item in text.split(","):
            f = item.split(":")
            out.append(("decode", int(f[1]), int(f[2])) if f[0] == "decode"
                       else ("prefill", 1, int(f[1])))
        return out
    if tiny:
        return [("decode", 2, 64), ("decode", 8, 128), ("prefill", 1, 128)]
    return [("decode", b, n) for b, n in DECODE_GRID] + [("prefill", 1, s) for s in PREFILL_GRID]


def render(doc: dict, points: list[dict]) -> str:
    head = {k: v for k, v in doc.items() if k != "points"}
    body = json.dumps(head, indent=1)[:-2]
    rows = ",\n".join(f"  {json.dumps(p)}" for p in points)
    return f'{body},\n "points": [\n{rows}\n]}}\n'


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--points", help="e.g. decode:8:1024,prefill:4096 (default: full grid)")
    ap.add_argument("--tiny", action="store_true", help="shrunken model on the CPU")
    ap.add_argument("--no-stages", action="store_true", help="skip per-stage timings")
    ap.add_argument("--model", choices=sorted(MODELS), default=QWEN3_30B_A3B.name,
                    help="architecture (random weights)")
    ap.add_argument("--routing", choices=("router", "balanced", "auto"), default="router",
                    help="experts from the random router (default; see ROUTING), balanced, "
                    "or auto: the router at decode, balanced at prefill")
    ap.add_argument("--glue", choices=("engine", "eager"), default="engine",
                    help="engine: the fused glue kernels an engine runs (default; GLUE); "
                    "eager: plain PyTorch, a dozen unfused kernels per layer")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="skip the remaining points after this many seconds")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)
    t0 = time.monotonic()
    device = "cpu" if args.tiny else "cuda"
    cfg = TINY_MODELS[args.model] if args.tiny else MODELS[args.model]
    dev = describe_device(device)
    log(json.dumps(dev))
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        log(f"spin-up: {measure.spin_up(measure.SPIN_UP_SECONDS):.0f} TFLOP/s bf16 8192^3")
    m = Model(cfg, device)
    timer = Timer(device)
    timer.sync()
    log(f"weights: {m.nbytes() / 1e9:.1f} GB in {time.monotonic() - t0:.0f} s")
    err = self_check(m, args.glue)
    log(f"self-check (first layer, first MoE layer) vs float32: rel err {err:.2e}")
    doc = {
        "schema": SCHEMA,
        "device": dev,
        "model": {**cfg.__dict__, "dtype": "bf16", "weights_bytes": m.nbytes()},
        "method": ("whole step in one CUDA graph, replays timed with CUDA events; median, "
                   "p10, p90 of >= 20 replays after warm-up; prefill also eager (us_eager); "
                   "stages_us: each stage alone for all layers in its own graph; glue per "
                   "point (engine: fused glue and RoPE; eager: unfused, no RoPE); random "
                   "weights, caches and token ids; routing per point"),
        "self_check_rel_err": round(err, 5),
        "points": [],
    }
    if err > 3e-2 or not math.isfinite(err):
        log("self-check FAILED; timing anyway")
    for phase, batch, length in parse_points(args.points, args.tiny):
        if time.monotonic() - t0 > args.budget_s:
            log(f"budget spent: skipped {phase} {batch} {length}")
            continue
        try:
            p = measure_point(m, timer, phase, batch, length, not args.no_stages, args.routing,
                              args.glue)
        except RuntimeError as e:  # out of memory, a capture refused: log, keep going
            log(f"FAILED {phase} b={batch} len={length}: {str(e).splitlines()[0][:300]}")
            timer.release()
            continue
        doc["points"].append(p)
        log(f"{phase:7} b={batch:<4} len={length:<6} {p['us']:>10.1f} us "
            f"(p10 {p['us_p10']:.1f}, p90 {p['us_p90']:.1f}; stages sum "
            f"{p.get('stages_sum_us', 0):.1f}; {p['attn_impl']}; {p['seconds']} s)")
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(render(doc, doc["points"]))
    if device == "cuda":
        doc["device"]["sm_clock_after_run_mhz"] = next(iter(measure.nvidia_smi("clocks.sm")), None)
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(render(doc, doc["points"]))
    print(f"{'phase':8}{'batch':>6}{'len':>7}{'us':>11}{'p10':>11}{'p90':>11}{'stages':>11}")
    for p in doc["points"]:
        print(f"{p['phase']:8}{p['batch']:>6}{p.get('kv_len', p.get('tokens')):>7}"
              f"{p['us']:>11.1f}{p['us_p10']:>11.1f}{p['us_p90']:>11.1f}"
              f"{p.get('stages_sum_us', 0):>11.1f}")
    print(f"wrote {args.output} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
