"""Architecture arithmetic: parameter counts, weight bytes, KV-cache and Engram bytes.

Formulas follow REFERENCE-DATA.md B2/B3 (e.g. DeepSeek-V3 attention 187.1M per layer, routed
experts 653.9B, MLA cache (512 + 64) x 61 bytes per token at FP8). DeepSeek V4.1's compressed
sparse attention follows vLLM 0.33 `models/deepseek_v41/` (attention.py, compressor.py,
common/engram.py, nvidia/model.py, nvidia/dspark.py) and `models/deepseek_v4/common/vision.py`;
MiniMax M3's block-sparse attention `models/minimax_m3/` (nvidia/model.py, common/indexer.py)
and Kimi K3's linear attention, gated MLA and latent MoE `models/kimi_k3/nvidia/` (kda.py,
mla.py, model.py) with `model_executor/layers/mamba/mamba_utils.py` (the KDA state).
"""

from dataclasses import dataclass

from schemas.model import ModelSpec

GIB = 1 << 30

# NVFP4 stores 4-bit values plus one FP8 scale per 16 (4.5 bits); FP8 block scales are negligible.
WEIGHT_BYTES = {"fp4": 0.5625, "fp8": 1.0, "bf16": 2.0}
# OCP microscaling: one UE8M0 byte per 32 values (MXFP4), per 32x32 block (MXFP8 linears).
MX_WEIGHT_BYTES = {"fp4": 0.5 + 1 / 32, "fp8": 1.0 + 1 / 1024, "bf16": 2.0}
KV_BYTES = {"fp8": 1, "bf16": 2}
MX_BLOCK = 32
# vLLM's DeepSeek V4.1 cache records (models/deepseek_v41/attention.py): an fp8_ds_mla record is
# all head_dim dims in FP8 with one UE8M0 scale per 32 (l.131-137, 522: 528 B on SM100); the FP8
# indexer key is head_dim FP8 + one FP32 scale per 128 (_indexer_k_cache_head_dim, l.101-109).
CSA_INDEX_SCALE_BLOCK = 128
# The KDA state's dtypes (mamba_utils.py MambaStateDtypeCalculator.kda_state_dtype l.133-148):
# the recurrent state FP32 under the default mamba_ssm_cache_dtype 'auto', the convolution
# state in the model dtype (BF16)
KDA_RECURRENT_BYTES = 4
KDA_CONV_BYTES = 2


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
    draft_experts: int = 0  # the draft's routed experts (in `draft`), stored like the target's
    vision: int = 0  # the vision tower, not counted in total (--language-model-only skips it)
    latent_proj: int = 0  # latent MoE: each MoE layer's hidden <-> latent projections

    @property
    def total(self) -> int:
        return (self.attention + self.dense_ffn + self.shared_experts + self.routed_experts
                + self.router + self.embedding + self.lm_head + self.latent_proj)

    @property
    def non_expert(self) -> int:
        return self.total - self.routed_experts


def moe_layers(spec: ModelSpec) -> int:
    return spec.layers - spec.dense_layers if spec.moe else 0


def linear_layers(spec: ModelSpec) -> int:
    """Layers of linear attention; `attention` describes the other (full-attention) ones."""
    return len(spec.linear_attention.layers) if spec.linear_attention else 0


def attention_layers(spec: ModelSpec) -> int:
    return spec.layers - linear_layers(spec)


def linear_attention_params_per_layer(spec: ModelSpec) -> int:
    """One KDA layer (kimi_k3/nvidia/kda.py KimiK3DeltaAttention): in_proj_qkvgfab (q, k, v and
    the output gate, heads x head_dim each, the gate's low-rank f_a of head_dim and beta of
    one per head, l.635-662), f_b_proj (head_dim -> heads x head_dim, l.664), the q/k/v short
    convolutions (l.678), dt_bias (l.671), A_log (l.814), the output norm and o_proj (l.878)."""
    la, h = spec.linear_attention, spec.hidden_size
    if not la:
        return 0
    width = la.heads * la.head_dim
    return (h * (4 * width + la.head_dim + la.heads) + la.head_dim * width
            + 3 * width * la.conv_kernel + width + la.heads + la.head_dim + width * h)


def attention_params_per_layer(spec: ModelSpec) -> int:
    a, h = spec.attention, spec.hidden_size
    if a.kind == "csa":
        return csa_layer_params(spec)
    if a.kind == "mla":
        rope = a.qk_rope_head_dim or 0
        lora, v = a.kv_lora_rank or 0, a.v_head_dim or a.head_dim
        q = h * a.q_lora_rank + a.q_lora_rank * a.heads * a.head_dim if a.q_lora_rank \
            else h * a.heads * a.head_dim
        kv = h * (lora + rope) + lora * a.heads * (a.head_dim - rope + v)
        out = a.heads * v * h
        gate = h * a.heads * v if a.output_gate else 0  # mla.py l.222 (KimiK3MergedQKVGate)
        params = q + kv + out + gate
    else:
        params = h * a.heads * a.head_dim * 2 + h * a.kv_heads * a.head_dim * 2
    return params + indexer_params(spec)


def indexer_params(spec: ModelSpec) -> int:
    """One sparse indexer: its query and key projections, and (DSA) its head weights; MiniMax
    M3's GQA indexer has none (its index q and k are part of the fused qkv_proj: vLLM
    model_executor/layers/linear.py MinimaxM3QKVParallelLinearWithIndexer l.1433-1445)."""
    a, h = spec.attention, spec.hidden_size
    if not a.indexer or a.kind == "csa":
        return 0
    ix = a.indexer
    weights = 0 if a.kind == "gqa" else h * ix.heads
    return (a.q_lora_rank or h) * ix.heads * ix.head_dim + h * ix.head_dim + weights


def indexer_owners(spec: ModelSpec) -> list[int] | None:
    """The layers that run their own indexer: those named (IndexShare), else the sparse layers;
    None: every layer."""
    ix = spec.attention.indexer
    if not ix:
        return []
    return ix.source_layers if ix.source_layers is not None else ix.layers


def indexer_layers(spec: ModelSpec) -> int:
    """Target layers that own an indexer: those named (IndexShare or the sparse layers), else
    every attention layer."""
    owners = indexer_owners(spec)
    return attention_layers(spec) if owners is None else len(owners)


def csa_layer_params(spec: ModelSpec) -> int:
    """DeepSeek V4 attention's quantized projections (attention.py l.371-410): fused wq_a + wkv
    (one shared KV head), wq_b, the grouped wo_a and wo_b."""
    a, h = spec.attention, spec.hidden_size
    sh = a.kv_sharing
    return (h * (a.q_lora_rank + a.head_dim) + a.q_lora_rank * a.heads * a.head_dim
            + a.heads * a.head_dim * sh.o_lora_rank + sh.o_groups * sh.o_lora_rank * h)


def csa_side_params(spec: ModelSpec) -> tuple[int, int]:
    """(quantized, BF16) parameters of the compressors and indexers over all layers: a
    KV-source layer's compressor (compressor.py l.291-303: wkv, and wgate where ratio > 1, BF16)
    and its indexer's wk (attention.py l.1418); every index source's wq_b (quantized) and
    weights_proj (BF16) (attention.py l.1385-1398)."""
    a, h = spec.attention, spec.hidden_size
    sh, ix = a.kv_sharing, a.indexer
    bf16 = sum(h * a.head_dim * (2 if sh.compress_ratios[i] > 1 else 1) for i in sh.source_layers)
    quant = 0
    if ix:
        sources = ix.source_layers if ix.source_layers is not None else range(spec.layers)
        quant = len(sources) * a.q_lora_rank * ix.heads * ix.head_dim
        bf16 += len(sources) * h * ix.heads + len(sh.source_layers) * a.head_dim * ix.head_dim
    return quant, bf16


def hc_params(spec: ModelSpec, layers: int) -> int:
    """Hyper-connection mixing weights (FP32), attention and FFN sublayer of each layer
    (nvidia/model.py l.440-480: (2 + routes) x routes rows over routes x hidden)."""
    n = spec.mhc_routes or 0
    mix = (2 + n) * n
    return layers * 2 * (mix * n * spec.hidden_size + mix) if n else 0


def engram_proj_params(spec: ModelSpec) -> int:
    """Each Engram layer's quantized wkv: (max_ngram - 1) x heads hashed rows of head_dim in,
    hidden x (routes + 1) out (common/engram.py l.1626-1637)."""
    e = spec.engram
    if not e:
        return 0
    out = spec.hidden_size * ((spec.mhc_routes or 1) + 1)
    return e.tables * (e.max_ngram - 1) * e.heads * e.head_dim * out


def engram_entries(spec: ModelSpec) -> int:
    return sum(spec.engram.rows) * spec.engram.head_dim if spec.engram else 0


def vision_params(spec: ModelSpec) -> int:
    """ViT blocks (fused qkv and out; a gated or plain MLP), patch embedding (3 channels x
    frames x patch^2 in), the position table, a per-patch projector and the mergers' two
    linears (DeepSeek V4.1: models/deepseek_v4/common/vision.py l.81-216, 341-362; Qwen3-VL:
    model_executor/models/qwen3_vl.py l.378-560, 617-655; MiniMax M3:
    models/minimax_m3/common/vision_tower.py l.101-115, 204-220, 527-610; Kimi K3:
    model_executor/models/kimi_k25_vit.py l.413-430, 894-940)."""
    v = spec.vision
    if not v:
        return 0
    h, text = v.hidden_size, spec.hidden_size
    qkv = v.attention_width or h
    block = 4 * h * qkv + (3 if v.mlp == "swiglu" else 2) * h * v.intermediate
    projector = h * v.projector_hidden + v.projector_hidden * text
    merged = text if v.projector_hidden else h  # what the mergers read per patch
    merger = merged * v.merge ** 2 * v.merger_hidden + v.merger_hidden * text
    return (v.layers * block + 3 * v.temporal_patch * v.patch ** 2 * h
            + v.position_embeddings * h + projector + v.mergers * merger)


def expert_params(spec: ModelSpec) -> int:
    """One routed expert: gate, up and down projections, on the latent width where the model
    has one (kimi_k3/nvidia/model.py KimiMoE l.383-385, 477-505)."""
    moe = spec.moe
    return 3 * (moe.latent_dim or spec.hidden_size) * moe.expert_intermediate if moe else 0


def shared_expert_params(spec: ModelSpec) -> int:
    """One shared expert: gate, up and down projections on the hidden width."""
    return 3 * spec.hidden_size * spec.moe.expert_intermediate if spec.moe else 0


def params(spec: ModelSpec) -> Params:
    h, n_moe = spec.hidden_size, moe_layers(spec)
    moe = spec.moe
    shared = 0
    if moe:
        shared = round(n_moe * moe.shared_expert_layer_fraction) * moe.shared_experts \
            * shared_expert_params(spec)
    layer = attention_params_per_layer(spec) + (
        3 * h * moe.expert_intermediate * (moe.top_k + moe.shared_experts) if moe else 0)
    full = attention_layers(spec)
    attention = attention_params_per_layer(spec) * full \
        - indexer_params(spec) * (full - indexer_layers(spec)) \
        + linear_attention_params_per_layer(spec) * linear_layers(spec)
    if spec.attention.kind == "csa":
        attention += sum(csa_side_params(spec)) + hc_params(spec, spec.layers) \
            + engram_proj_params(spec)
    return Params(
        attention=attention,
        dense_ffn=spec.dense_layers * 3 * h * spec.dense_intermediate,
        shared_experts=shared,
        routed_experts=n_moe * moe.experts * expert_params(spec) if moe else 0,
        router=n_moe * h * moe.experts if moe else 0,
        embedding=spec.vocab_size * h,
        lm_head=0 if spec.tie_embeddings else spec.vocab_size * h,
        draft=_draft_params(spec, layer),
        draft_experts=_draft_expert_params(spec),
        vision=vision_params(spec),
        latent_proj=n_moe * 2 * h * moe.latent_dim if moe and moe.latent_dim else 0,
    )


def _draft_expert_params(spec: ModelSpec) -> int:
    d = spec.draft
    if not (d and d.experts and spec.moe):
        return 0
    return d.layers * d.experts * expert_params(spec)


def _draft_params(spec: ModelSpec, layer: int) -> int:
    """MTP: each layer plus its 2h x h projection. DSpark (nvidia/dspark.py l.92-150): its
    layers with their own routed experts, a main projection over the target layers' hidden
    states and the Markov head (two vocab x rank tables); the embedding is the target's."""
    d, h = spec.draft, spec.hidden_size
    if not d:
        return 0
    if d.method != "dspark" or not d.experts:
        return d.layers * (layer + 2 * h * h)
    moe = spec.moe
    per_layer = attention_params_per_layer(spec) \
        + 3 * h * moe.expert_intermediate * moe.shared_experts + h * d.experts
    markov = 2 * spec.vocab_size * DSPARK_MARKOV_RANK
    return d.layers * per_layer + _draft_expert_params(spec) + hc_params(spec, d.layers) \
        + d.target_layers * h * h + markov


# nvidia/dspark.py l.141-146: DSparkMarkovHead(vocab, vocab, config.dspark_markov_rank = 256).
DSPARK_MARKOV_RANK = 256


def dtype_bytes(spec: ModelSpec, group: str) -> float:
    """Stored bytes per parameter of `group` (weights | experts | embedding), with its scales."""
    d = spec.dtypes
    dtype = {"weights": d.weights, "experts": d.experts,
             "embedding": d.embedding or d.weights}[group]
    table = MX_WEIGHT_BYTES if d.scales == "mx" and group != "embedding" else WEIGHT_BYTES
    return table[dtype]


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: everything but the unrouted experts and the embedding."""
    p = params(spec)
    routed = moe_layers(spec) * spec.moe.top_k * expert_params(spec) if spec.moe else 0
    return (p.attention + p.dense_ffn + p.shared_experts + routed + p.router + p.lm_head
            + p.latent_proj)


def weight_bytes(spec: ModelSpec, dtype: str | None = None, vision: bool = False) -> float:
    """Served weight bytes (the draft aside); `dtype` forces one dtype for everything instead
    of the spec's mix; `vision` adds the vision tower (BF16)."""
    p = params(spec)
    tower = p.vision * WEIGHT_BYTES["bf16"] if vision else 0.0
    if dtype:
        return p.total * WEIGHT_BYTES[dtype] + tower
    head = p.embedding + p.lm_head
    return (p.routed_experts * dtype_bytes(spec, "experts")
            + (p.non_expert - head) * dtype_bytes(spec, "weights")
            + head * dtype_bytes(spec, "embedding") + tower)


def draft_bytes(spec: ModelSpec) -> tuple[float, float]:
    """(routed experts, the rest) of the draft model's weights."""
    p = params(spec)
    return (p.draft_experts * dtype_bytes(spec, "experts"),
            (p.draft - p.draft_experts) * dtype_bytes(spec, "weights"))


def checkpoint_bytes(spec: ModelSpec) -> float:
    """What `hf download` fetches and the engine reads at cold start: weights, draft, vision
    tower and Engram tables."""
    return weight_bytes(spec, vision=True) + sum(draft_bytes(spec)) + engram_bytes(spec)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | None = None, draft: bool = False) -> int:
    """KV-cache bytes per token of context, whole model, one copy (REFERENCE-DATA.md B2).

    Sliding-window layers are excluded: their cost is bounded per request (see
    `kv_window_bytes_per_request`). With `draft`, the MTP/DSpark layers' cache is included.
    """
    a = spec.attention
    dt = kv_dtype or spec.dtypes.kv_cache
    b = KV_BYTES[dt]
    if a.kind == "csa":  # the draft's layers are window-only (compress ratio 0)
        return round(csa_kv_bytes_per_token(spec, dt))
    layers = attention_layers(spec) - a.sliding_layers \
        + (spec.draft.layers if draft and spec.draft else 0)
    if a.kind == "mla":
        lora, rope = a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
        # the indexer's key cache is FP8 with one FP32 scale per 128 whatever the KV dtype
        # (vLLM DeepseekV32IndexerCache: uint8, head_dim + head_dim / 128 * 4 bytes)
        index_key = a.indexer.head_dim + 4 * (a.indexer.head_dim // 128) if a.indexer else 0
        if a.indexer and dt == "fp8":
            # vLLM's DSA layout: FP8 latent + 4 FP32 scales + BF16 rope
            per_layer = lora + 4 * (lora // 128) + 2 * rope
        else:
            per_layer = (lora + rope) * b
        # the index key cache belongs to the indexer: only layers that own one keep it
        owners = indexer_layers(spec) + (layers - attention_layers(spec)) if a.indexer else 0
        return per_layer * layers + index_key * owners
    return 2 * a.kv_heads * a.head_dim * b * layers + index_key_bytes_per_token(spec)


def index_key_bytes_per_token(spec: ModelSpec) -> int:
    """A GQA model's index keys (MiniMax M3): one key of the indexer's head_dim per token in
    each layer that owns an indexer (common/indexer.py MiniMaxM3IndexerCache.get_kv_cache_spec
    l.145-153: one head, key only), in the indexer cache's dtype whatever the KV dtype; every
    TP rank keeps them all (the index key is one replicated head). MLA and compressed models
    count theirs with their latent."""
    ix = spec.attention.indexer
    if not ix or spec.attention.kind != "gqa":
        return 0
    record = ix.head_dim * 2 if ix.key_cache == "bf16" else \
        ix.head_dim + 4 * (ix.head_dim // CSA_INDEX_SCALE_BLOCK)
    return record * indexer_layers(spec)


def state_bytes_per_request(spec: ModelSpec, draft_tokens: int = 0) -> int:
    """The linear-attention layers' state of one request, whatever its length
    (mamba_utils.py kda_state_shape l.296-319): per head a head_dim x head_dim recurrent
    matrix, and the q, k and v short convolution's last conv_kernel - 1 inputs (plus one per
    speculative token verified)."""
    la = spec.linear_attention
    if not la:
        return 0
    width = la.heads * la.head_dim
    recurrent = la.heads * la.head_dim ** 2 * KDA_RECURRENT_BYTES
    conv = 3 * width * (la.conv_kernel - 1 + draft_tokens) * KDA_CONV_BYTES
    return (recurrent + conv) * len(la.layers)


def linear_state_bytes_per_layer(spec: ModelSpec, draft_tokens: int = 0) -> int:
    """One linear-attention layer's state of one request, all TP ranks together."""
    la = spec.linear_attention
    return state_bytes_per_request(spec, draft_tokens) // len(la.layers) if la else 0


def attention_page(spec: ModelSpec, kv_dtype: str) -> tuple[int, int]:
    """(bytes, slots): one full-attention layer's KV of one token in one KV head slot, and the
    slots TP splits, as vLLM sizes a hybrid model's attention page (vLLM 0.33
    platforms/interface.py _align_hybrid_block_size l.977-985: an MLA latent is one slot of
    kv_lora_rank + qk_rope_head_dim, whole on every rank; l.1031-1043: K and V per KV head)."""
    a, b = spec.attention, KV_BYTES[kv_dtype]
    if a.kind == "mla":
        return ((a.kv_lora_rank or 0) + (a.qk_rope_head_dim or 0)) * b, 1
    return 2 * a.head_dim * b, a.kv_heads


def csa_record_bytes(spec: ModelSpec, kv_dtype: str) -> int:
    """One compressed (or window) KV record: FP8 with UE8M0 scales per 32, or plain BF16."""
    d = spec.attention.head_dim
    return d + d // MX_BLOCK if kv_dtype == "fp8" else d * KV_BYTES[kv_dtype]


def csa_index_record_bytes(spec: ModelSpec, kv_dtype: str) -> int:
    d = spec.attention.indexer.head_dim if spec.attention.indexer else 0
    return d + d // CSA_INDEX_SCALE_BLOCK * 4 if kv_dtype == "fp8" else d * KV_BYTES[kv_dtype]


def csa_kv_bytes_per_token(spec: ModelSpec, kv_dtype: str) -> float:
    """Global KV per token: only the KV-source layers own a compressed cache (attention.py
    get_kv_cache_spec l.1206-1232, tokens_per_state = the layer's ratio), and their indexer the
    index keys (l.470-485); every other layer reads them."""
    record = csa_record_bytes(spec, kv_dtype) + csa_index_record_bytes(spec, kv_dtype)
    return record * csa_states_per_token(spec)


def csa_states_per_token(spec: ModelSpec) -> float:
    """Compressed states the KV sources keep per token of context (one per `ratio` tokens)."""
    sh = spec.attention.kv_sharing
    return sum(1 / max(1, sh.compress_ratios[i]) for i in sh.source_layers)


def kv_window_bytes_per_request(spec: ModelSpec, kv_dtype: str | None = None) -> int:
    a = spec.attention
    if not a.sliding_layers or not a.sliding_window:
        return 0
    dt = kv_dtype or spec.dtypes.kv_cache
    if a.kind == "csa":  # one window record per layer (DeepseekV4SWACache, attention.py l.562)
        return csa_record_bytes(spec, dt) * a.sliding_layers * a.sliding_window
    b = KV_BYTES[dt]
    return 2 * a.kv_heads * a.head_dim * b * a.sliding_layers * a.sliding_window


def engram_bytes(spec: ModelSpec) -> float:
    """vLLM's Engram tables: FP8 rows plus one UE8M0 scale per 32 values (common/engram.py
    l.1040-1052)."""
    return spec.engram.tables * spec.engram.table_gib * GIB if spec.engram else 0.0
