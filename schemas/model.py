"""`Model`: the architecture numbers the compiler needs, and the dtypes it is served in."""

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import (
    Fraction,
    Metadata,
    StrictModel,
    bounded,
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
    """Sparse-attention indexer: each query attends to its top-k tokens (DSA) or top-k blocks
    of `block` tokens (MiniMax M3's MSA) only."""

    heads: Annotated[int, bounded(HEADS)]
    head_dim: Annotated[int, bounded(HEAD_DIM)]
    topk: Annotated[int, bounded(TOKENS)] = Field(description="Tokens (blocks) kept per query")
    source_layers: list[Annotated[int, bounded(LAYERS, least=0)]] | None = Field(
        None, max_length=LAYERS,
        description="Layers that run an indexer (DeepSeek V4.1 index_source_layer_ids); "
                    "the rest reuse the latest one below them. None: every layer")
    block: Annotated[int, bounded(TOKENS)] = Field(
        1, description="Tokens per scored block: the indexer keeps its top-k blocks of this "
                       "many tokens (MiniMax M3 sparse_block_size 128); 1: tokens (DSA)")
    layers: list[Annotated[int, bounded(LAYERS, least=0)]] | None = Field(
        None, max_length=LAYERS,
        description="Layers that attend sparsely, each with its own indexer (MiniMax M3 "
                    "sparse_attention_freq); the others attend to every token and keep no "
                    "index key. None: every layer")
    key_cache: Literal["fp8_scaled", "bf16"] = Field(
        "fp8_scaled", description="The index key cache: FP8 with one FP32 scale per 128 "
                                  "whatever the KV dtype (vLLM's DSA indexer cache), or BF16 "
                                  "(MiniMax M3's indexer_kv_dtype default)")


class KvSharing(StrictModel):
    """Compressed sparse attention (DeepSeek V4/V4.1): every layer keeps a sliding window; the
    layers with a compression ratio also attend over compressed latents (one per `ratio`
    tokens), which only the `source_layers` write and every later layer reads."""

    compress_ratios: list[Annotated[int, bounded(128, least=0)]] = Field(
        max_length=LAYERS, description="Per layer: 0 window only, r one latent per r tokens")
    source_layers: list[Annotated[int, bounded(LAYERS, least=0)]] = Field(
        min_length=1, max_length=LAYERS, description="Layers that compress and write the KV")
    o_lora_rank: Annotated[int, bounded(WIDTH)] = Field(
        description="Grouped output projection's rank per group")
    o_groups: Annotated[int, bounded(HEADS)]
    decoder_replay: bool = Field(
        False, description="Prefill runs the layers from the last KV source on only each "
                           "request's trailing window (vLLM SWA bounded replay)")


class Attention(StrictModel):
    kind: Literal["mla", "gqa", "mha", "csa"] = Field(
        description="csa: DeepSeek V4's compressed sparse attention, one shared KV head")
    heads: Annotated[int, bounded(HEADS)]
    kv_heads: Annotated[int, bounded(HEADS)]
    head_dim: Annotated[int, bounded(HEAD_DIM)] = Field(
        description="Query/key head dim (MLA: nope + rope)")
    v_head_dim: Annotated[int, bounded(HEAD_DIM)] | None = None
    q_lora_rank: Annotated[int, bounded(WIDTH)] | None = None
    kv_lora_rank: Annotated[int, bounded(WIDTH)] | None = Field(
        None, description="MLA latent width")
    qk_rope_head_dim: Annotated[int, bounded(HEAD_DIM)] | None = None
    indexer: Indexer | None = None
    sliding_window: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Window of the sliding layers")
    sliding_layers: Annotated[int, bounded(LAYERS, least=0)] = Field(
        0, description="How many layers use the window")
    kv_sharing: KvSharing | None = None
    output_gate: bool = Field(
        False, description="MLA with a sigmoid gate on the attention output: a hidden x "
                           "heads x v_head_dim projection (Kimi K3 mla_use_output_gate)")


class LinearAttention(StrictModel):
    """Linear-attention layers (Kimi Delta Attention, vLLM models/kimi_k3/nvidia/kda.py): each
    keeps a fixed-size state per request, a head_dim x head_dim FP32 matrix per head and the
    short convolution's last conv_kernel - 1 inputs of q, k and v, instead of a KV cache per
    token; `attention` describes the other layers."""

    kind: Literal["kda"]
    layers: list[Annotated[int, bounded(LAYERS, least=0)]] = Field(
        min_length=1, max_length=LAYERS, description="The layers (from 0) that run it")
    heads: Annotated[int, bounded(HEADS)]
    head_dim: Annotated[int, bounded(HEAD_DIM)]
    conv_kernel: Annotated[int, bounded(64)] = Field(
        4, description="Short convolution width over q, k and v")


class Moe(StrictModel):
    experts: Annotated[int, bounded(4096)]
    top_k: Annotated[int, bounded(4096)]
    shared_experts: Annotated[int, bounded(64, least=0)] = 0
    expert_intermediate: Annotated[int, bounded(WIDTH)]
    shared_expert_layer_fraction: Fraction = Field(
        1.0, description="Share of MoE layers whose sub-layer ends with the shared expert"
    )
    redundant_experts: Annotated[int, bounded(4096, least=0)] = Field(
        0, description="Extra replicas of routed experts spread over the EP ranks (EPLB), so "
                       "that experts + redundant divide by the EP size; a Deployment's "
                       "serving.redundant_experts sets it")
    latent_dim: Annotated[int, bounded(WIDTH)] | None = Field(
        None, description="Width the routed experts work in (Kimi K3 "
                          "routed_expert_hidden_size): each MoE layer projects hidden -> "
                          "latent before them and back after; shared experts stay on the "
                          "hidden. None: hidden")

    @property
    def slots(self) -> int:
        """Expert replicas the EP ranks hold between them."""
        return self.experts + self.redundant_experts


class Engram(StrictModel):
    """Hashed n-gram lookup tables read at every step (DeepSeek V4.1), one per Engram layer."""

    rows: list[Annotated[int, bounded(1 << 40)]] = Field(min_length=1, max_length=1024,
                                       description="engram_num_embeddings, one per table")
    head_dim: Annotated[int, bounded(HEAD_DIM)]
    heads: Annotated[int, bounded(HEADS)]
    max_ngram: Annotated[int, bounded(16)] = Field(
        description="Largest n-gram order (orders 2..max_ngram)")

    @property
    def tables(self) -> int:
        return len(self.rows)

    @property
    def table_gib(self) -> float:
        """Mean bytes of one table in GiB: FP8 rows with one UE8M0 scale per 32 values."""
        return sum(self.rows) * (self.head_dim + self.head_dim // 32) / len(self.rows) / (1 << 30)


class Draft(StrictModel):
    """Built-in draft model for speculative decoding (MTP / DSpark layers)."""

    method: Literal["mtp", "dspark", "eagle3"]
    layers: Annotated[int, bounded(16)] = 1
    experts: Annotated[int, bounded(4096)] | None = Field(
        None, description="Routed experts per draft layer "
                                                           "(default: the target's)")
    top_k: Annotated[int, bounded(4096)] | None = None
    target_layers: Annotated[int, bounded(16, least=0)] = Field(
        0, description="Target layers whose hidden states the draft reads (main projection)")
    index_share: bool = Field(
        False, description="MTP passes after the first reuse the first pass's indexer top-k "
                           "(config.json index_share_for_mtp_iteration)")


class Vision(StrictModel):
    """The vision tower (ViT blocks, then mergers that fold merge x merge patches into one text
    token); it loads unless vLLM is given --language-model-only."""

    layers: Annotated[int, bounded(LAYERS)]
    hidden_size: Annotated[int, bounded(WIDTH)]
    heads: Annotated[int, bounded(HEADS)]
    intermediate: Annotated[int, bounded(WIDTH)]
    mlp: Literal["swiglu", "gelu"] = Field(description="Gated (3 matrices) or plain (2) MLP")
    attention_width: Annotated[int, bounded(WIDTH)] | None = Field(
        None, description="Width of q, k and v (Kimi K3 qkv_hidden_size); None: hidden")
    patch: Annotated[int, bounded(HEAD_DIM)]
    temporal_patch: Annotated[int, bounded(16)] = Field(
        1, description="Frames per patch (video-capable towers)")
    position_embeddings: Annotated[int, bounded(1 << 20, least=0)] = Field(
        0, description="Learned position table rows (0: rotary positions only)")
    merge: Annotated[int, bounded(16)] = Field(
        description="Spatial merge: merge x merge patches a token")
    mergers: Annotated[int, bounded(64)] = Field(
        1, description="Patch mergers (Qwen3-VL: 1 + deepstack levels)")
    merger_hidden: Annotated[int, bounded(WIDTH)] = Field(
        description="Width of a merger's two-layer MLP")
    projector_hidden: Annotated[int, bounded(WIDTH, least=0)] = Field(
        0, description="A two-layer projector per patch, hidden -> projector_hidden -> the "
                       "text width, before the mergers, which then merge text-width patches "
                       "(MiniMax M3 multi_modal_projector); 0: none")
    max_tokens_per_image: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="The processor's cap on one image's tokens")


class Dtypes(StrictModel):
    weights: Dtype = Field(description="Attention, dense and shared weights")
    experts: Dtype = Field(description="Routed expert weights")
    kv_cache: Literal["fp8", "bf16"] = "bf16"
    scales: Literal["block", "mx"] = Field(
        "block", description="block: FP8 128x128 block scales, FP4 as NVFP4 (an FP8 scale per "
                             "16); mx: OCP microscaling, one UE8M0 scale per 32 values (MXFP8 "
                             "32x32 blocks, MXFP4)")
    embedding: Dtype | None = Field(None, description="Embedding and LM head (default: weights)")


class ModelSpec(StrictModel):
    architecture: str = Field(max_length=128,
                              description="HF architecture, e.g. DeepseekV3ForCausalLM")
    hf_id: str = Field(max_length=256,
                       description="What `vllm serve` is given, e.g. deepseek-ai/DeepSeek-V3")
    hidden_size: Annotated[int, bounded(WIDTH)]
    layers: Annotated[int, bounded(LAYERS)]
    dense_layers: Annotated[int, bounded(LAYERS, least=0)] = Field(
        0, description="Leading layers with a dense FFN")
    dense_intermediate: Annotated[int, bounded(WIDTH, least=0)] = 0
    vocab_size: Annotated[int, bounded(1 << 22)]
    tie_embeddings: bool = False
    max_context_tokens: Annotated[int, bounded(TOKENS)]
    attention: Attention
    linear_attention: LinearAttention | None = None
    moe: Moe | None = None
    engram: Engram | None = None
    mhc_routes: Annotated[int, bounded(64)] | None = Field(
        None, description="Hyper-connection residual routes")
    draft: Draft | None = None
    vision: Vision | None = None
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
