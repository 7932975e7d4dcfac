"""`Model`: the architecture numbers the compiler needs, and the dtypes it is served in."""

from typing import Literal

from pydantic import Field

from schemas.base import (
    Fraction,
    Metadata,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    StrictModel,
)

Dtype = Literal["fp4", "fp8", "bf16"]


class Indexer(StrictModel):
    """Sparse-attention indexer (DSA): each query attends to its top-k tokens only."""

    heads: PositiveInt
    head_dim: PositiveInt
    topk: PositiveInt


class Attention(StrictModel):
    kind: Literal["mla", "gqa", "mha"]
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt = Field(description="Query/key head dim (MLA: nope + rope)")
    v_head_dim: PositiveInt | None = None
    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = Field(None, description="MLA latent width")
    qk_rope_head_dim: PositiveInt | None = None
    indexer: Indexer | None = None
    sliding_window: PositiveInt | None = Field(None, description="Window of the sliding layers")
    sliding_layers: NonNegativeInt = Field(0, description="How many layers use the window")


class Moe(StrictModel):
    experts: PositiveInt
    top_k: PositiveInt
    shared_experts: NonNegativeInt = 0
    expert_intermediate: PositiveInt
    shared_expert_layer_fraction: Fraction = Field(
        1.0, description="Share of MoE layers whose sub-layer ends with the shared expert"
    )


class Engram(StrictModel):
    """Hashed n-gram lookup tables read at every step (DeepSeek V4.1)."""

    tables: PositiveInt
    table_gib: PositiveFloat


class Draft(StrictModel):
    """Built-in draft model for speculative decoding (MTP / DSpark layers)."""

    method: Literal["mtp", "dspark", "eagle3"]
    layers: PositiveInt = 1


class Dtypes(StrictModel):
    weights: Dtype = Field(description="Attention, dense and shared weights")
    experts: Dtype = Field(description="Routed expert weights")
    kv_cache: Literal["fp8", "bf16"] = "bf16"


class ModelSpec(StrictModel):
    architecture: str = Field(description="HF architecture, e.g. DeepseekV3ForCausalLM")
    hf_id: str = Field(description="What `vllm serve` is given, e.g. deepseek-ai/DeepSeek-V3")
    hidden_size: PositiveInt
    layers: PositiveInt
    dense_layers: NonNegativeInt = Field(0, description="Leading layers with a dense FFN")
    dense_intermediate: NonNegativeInt = 0
    vocab_size: PositiveInt
    tie_embeddings: bool = False
    max_context_tokens: PositiveInt
    attention: Attention
    moe: Moe | None = None
    engram: Engram | None = None
    mhc_routes: PositiveInt | None = Field(None, description="Hyper-connection residual routes")
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
