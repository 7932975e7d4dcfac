"""Architecture arithmetic: parameter counts, weight bytes, KV-cache and Engram bytes.

Formulas follow REFERENCE-DATA.md B2/B3 (e.g. DeepSeek-V3 attention 187.1M per layer, routed
experts 653.9B, MLA cache (512 + 64) x 61 bytes per token at FP8).
"""

from dataclasses import dataclass

from schemas.model import ModelSpec

GIB = 1 << 30

# NVFP4 stores 4-bit values plus one FP8 scale per 16 (4.5 bits); FP8 block scales are negligible.
WEIGHT_BYTES = {"fp4": 0.5625, "fp8": 1.0, "bf16": 2.0}
KV_BYTES = {"fp8": 1, "bf16": 2}


@dataclass(frozen=True)
class Params:
    """Parameter counts by where they live; sharding rules differ per group."""

    attention: int  # all layers, incl. the sparse indexer
    dense_ffn: int  # dense layers' FFN
    shared_experts: int
    routed_experts: int
    router: int
    embedding: int
    lm_head: int
    draft: int  # MTP / DSpark layers, not counted in total

    @property
    def total(self) -> int:
        return (self.attention + self.dense_ffn + self.shared_experts + self.routed_experts
                + self.router + self.embedding + self.lm_head)

    @property
    def non_expert(self) -> int:
        return self.total - self.routed_experts


def moe_layers(spec: ModelSpec) -> int:
    return spec.layers - spec.dense_layers if spec.moe else 0


def attention_params_per_layer(spec: ModelSpec) -> int:
    a, h = spec.attention, spec.hidden_size
    if a.kind == "mla":
        rope = a.qk_rope_head_dim or 0
        lora, v = a.kv_lora_rank or 0, a.v_head_dim or a.head_dim
        q = h * a.q_lora_rank + a.q_lora_rank * a.heads * a.head_dim if a.q_lora_rank \
            else h * a.heads * a.head_dim
        kv = h * (lora + rope) + lora * a.heads * (a.head_dim - rope + v)
        out = a.heads * v * h
        params = q + kv + out
    else:
        params = h * a.heads * a.head_dim * 2 + h * a.kv_heads * a.head_dim * 2
    if a.indexer:
        ix = a.indexer
        q_in = a.q_lora_rank or h
        params += q_in * ix.heads * ix.head_dim + h * ix.head_dim + h * ix.heads
    return params


def expert_params(spec: ModelSpec) -> int:
    """One routed (or shared) expert: gate, up and down projections."""
    return 3 * spec.hidden_size * spec.moe.expert_intermediate if spec.moe else 0


def params(spec: ModelSpec) -> Params:
    h, n_moe = spec.hidden_size, moe_layers(spec)
    moe = spec.moe
    shared = 0
    if moe:
        shared = round(n_moe * moe.shared_expert_layer_fraction) * moe.shared_experts \
            * expert_params(spec)
    layer = attention_params_per_layer(spec) + (
        3 * h * moe.expert_intermediate * (moe.top_k + moe.shared_experts) if moe else 0)
    return Params(
        attention=attention_params_per_layer(spec) * spec.layers,
        dense_ffn=spec.dense_layers * 3 * h * spec.dense_intermediate,
        shared_experts=shared,
        routed_experts=n_moe * moe.experts * expert_params(spec) if moe else 0,
        router=n_moe * h * moe.experts if moe else 0,
        embedding=spec.vocab_size * h,
        lm_head=0 if spec.tie_embeddings else spec.vocab_size * h,
        draft=spec.draft.layers * (layer + 2 * h * h) if spec.draft else 0,
    )


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: everything but the unrouted experts and the embedding."""
    p = params(spec)
    routed = moe_layers(spec) * spec.moe.top_k * expert_params(spec) if spec.moe else 0
    return p.attention + p.dense_ffn + p.shared_experts + routed + p.router + p.lm_head


def weight_bytes(spec: ModelSpec, dtype: str | None = None) -> float:
    """Served weight bytes; `dtype` forces one dtype for everything instead of the spec's mix."""
    p = params(spec)
    expert_dtype = dtype or spec.dtypes.experts
    other_dtype = dtype or spec.dtypes.weights
    return p.routed_experts * WEIGHT_BYTES[expert_dtype] + p.non_expert * WEIGHT_BYTES[other_dtype]


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | None = None, draft: bool = False) -> int:
    """KV-cache bytes per token of context, whole model, one copy (REFERENCE-DATA.md B2).

    Sliding-window layers are excluded: their cost is bounded per request (see
    `kv_window_bytes_per_request`). With `draft`, the MTP/DSpark layers' cache is included.
    """
    a = spec.attention
    dt = kv_dtype or spec.dtypes.kv_cache
    b = KV_BYTES[dt]
    layers = spec.layers - a.sliding_layers + (spec.draft.layers if draft and spec.draft else 0)
    if a.kind == "mla":
        lora, rope = a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
        if a.indexer and dt == "fp8":
            # vLLM's DSA layout: FP8 latent + 4 FP32 scales + BF16 rope; FP8 indexer key + scale
            per_layer = lora + 4 * (lora // 128) + 2 * rope + a.indexer.head_dim + 4
        else:
            per_layer = (lora + rope) * b + (a.indexer.head_dim * b if a.indexer else 0)
        return per_layer * layers
    return 2 * a.kv_heads * a.head_dim * b * layers


def kv_window_bytes_per_request(spec: ModelSpec, kv_dtype: str | None = None) -> int:
    a = spec.attention
    if not a.sliding_layers or not a.sliding_window:
        return 0
    b = KV_BYTES[kv_dtype or spec.dtypes.kv_cache]
    return 2 * a.kv_heads * a.head_dim * b * a.sliding_layers * a.sliding_window


def engram_bytes(spec: ModelSpec) -> float:
    return spec.engram.tables * spec.engram.table_gib * GIB if spec.engram else 0.0
