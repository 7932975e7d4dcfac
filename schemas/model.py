"""`Model`: the architecture numbers the compiler needs, and the dtypes it is served in."""

from typing import Literal

from pydantic import Field

from schemas.base import (
    Fraction,
    Metadata,
    StrictModel,
    amount,
    count,
)

Dtype = Literal["fp4", "fp8", "bf16"]
# Bounds an order of magnitude beyond today's largest models (DeepSeek: 61 layers, 7168 hidden,
# 256 experts, 128 heads; Llama 3.1 405B: 126 layers, 16384 hidden; Qwen3: 151936 vocab).
WIDTH = 1 << 17  # hidden and intermediate sizes
HEAD_DIM = 1024
HEADS = 1024
LAYERS = 1024
TOKENS = 1 << 24


class Indexer(StrictModel):
    """Sparse-attention indexer (DSA): each query attends to its top-k tokens only."""

    heads: count(HEADS)
    head_dim: count(HEAD_DIM)
    topk: count(TOKENS)


class Attention(StrictModel):
    kind: Literal["mla", "gqa", "mha"]
    heads: count(HEADS)
    kv_heads: count(HEADS)
    head_dim: count(HEAD_DIM) = Field(description="Query/key head dim (MLA: nope + rope)")
    v_head_dim: count(HEAD_DIM) | None = None
    q_lora_rank: count(WIDTH) | None = None
    kv_lora_rank: count(WIDTH) | None = Field(None, description="MLA latent width")
    qk_rope_head_dim: count(HEAD_DIM) | None = None
    indexer: Indexer | None = None
    sliding_window: count(TOKENS) | None = Field(None, description="Window of the sliding layers")
    sliding_layers: count(LAYERS, least=0) = Field(0, description="How many layers use the window")


class Moe(StrictModel):
    experts: count(4096)
    top_k: count(4096)
    shared_experts: count(64, least=0) = 0
    expert_intermediate: count(WIDTH)
    shared_expert_layer_fraction: Fraction = Field(
        1.0, description="Share of MoE layers whose sub-layer ends with the shared expert"
    )
    redundant_experts: count(4096, least=0) = Field(
        0, description="Extra replicas of routed experts spread over the EP ranks (EPLB), so "
                       "that experts + redundant divide by the EP size; a Deployment's "
                       "serving.redundant_experts sets it")

    @property
    def slots(self) -> int:
        """Expert replicas the EP ranks hold between them."""
        return self.experts + self.redundant_experts


class Engram(StrictModel):
    """Hashed n-gram lookup tables read at every step (DeepSeek V4.1)."""

    tables: count(1024)
    table_gib: amount(4096)


class Draft(StrictModel):
    """Built-in draft model for speculative decoding (MTP / DSpark layers)."""

    method: Literal["mtp", "dspark", "eagle3"]
    layers: count(16) = 1


class Dtypes(StrictModel):
    weights: Dtype = Field(description="Attention, dense and shared weights")
    experts: Dtype = Field(description="Routed expert weights")
    kv_cache: Literal["fp8", "bf16"] = "bf16"


class ModelSpec(StrictModel):
    architecture: str = Field(max_length=128,
                              description="HF architecture, e.g. DeepseekV3ForCausalLM")
    hf_id: str = Field(max_length=256,
                       description="What `vllm serve` is given, e.g. deepseek-ai/DeepSeek-V3")
    hidden_size: count(WIDTH)
    layers: count(LAYERS)
    dense_layers: count(LAYERS, least=0) = Field(0, description="Leading layers with a dense FFN")
    dense_intermediate: count(WIDTH, least=0) = 0
    vocab_size: count(1 << 22)
    tie_embeddings: bool = False
    max_context_tokens: count(TOKENS)
    attention: Attention
    moe: Moe | None = None
    engram: Engram | None = None
    mhc_routes: count(64) | None = Field(None, description="Hyper-connection residual routes")
    draft: Draft | None = None
    dtypes: Dtypes
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="Field path (relative to spec, prefixes allowed) -> source, or 'assumed'",
    )


class ModelV1(StrictModel):
    apiVersion: Literal["rackc.dev/v1alpha1"]
    kind: Literal["Model"]
    metadata: Metadata
    spec: ModelSpec
