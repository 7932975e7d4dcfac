"""Step models: the time of one decode step and of one prefill chunk under an engine shape.

Composed per layer from operator costs (ops.py) and collectives (comm.py). A decode step runs
`batch` requests per DP rank, each verifying 1 + k draft tokens; a prefill step runs a chunk of
new tokens per DP rank whose attention also spans the request's cached prefix.

A pipelined prefill (shape.pp > 1) runs each chunk through the stages in turn: a stage computes
its layers (compiler.shapes stage_layer_mix; the LM head on the last), then its TP ranks each
send 1/tp of the chunk's activations to the next stage, which all-gathers them over its TP
group before it starts (catalog/engines/vllm-0.33.yaml pipeline.stage_send). vLLM keeps pp batches
in flight and schedules a prompt's next chunk while the previous one is in the pipeline, so a
new chunk enters every slowest-stage time (the step's `us`), and each chunk also spends the
other stages' time in the pipeline (`fill_us`: what a request waits beyond its chunks' turns).

One module past 500 lines on purpose: a step is the composition of every layer kind (MLA,
compressed sparse attention, sliding windows, MoE, Engram, hyper-connections, the draft, the
vision tower, pipeline stages), and each composition rule reads the others' breakdown keys.
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

from compiler import arch, memory
from compiler.catalog.system import System
from compiler.offload import Offload
from compiler.perf import comm, offload, routing
from compiler.perf.ops import BYTES as OP_BYTES
from compiler.perf.ops import OpModel
from compiler.shapes import Shape, stage_layer_mix
from schemas.model import ModelSpec, Moe

DECODE_OVERHEAD_US = 25.0  # assumed: scheduler + graph launch per decode step (CUDA graphs)
PREFILL_OVERHEAD_US = 200.0  # assumed: scheduler, input prep, no CUDA graph for big chunks
# DeepGEMM (deepseek-ai/DeepGEMM@54e2261, csrc/jit_kernels/heuristics): prefill's contiguous
# layout aligns each expert's rows to 128 (runtime.hpp kLegacyMKAlignmentForContiguousLayout);
# decode's masked layout (DEP, DeepEP low-latency) takes block M 64 or 128 (sm90.hpp), the
# smaller when rows are few
PREFILL_EXPERT_TILE_ROWS = 128
DECODE_EXPERT_TILE_ROWS = 64
# Without DP every rank runs a fused MoE over all tokens (vLLM's Triton fused_moe, block M 16
# up to 512 tokens: fused_moe/configs/E=256,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,
# block_shape=[128,128].json), whose small-M tile cost the fitted curve already holds: rows
# as routed at random, no padding modelled on top
FUSED_DECODE_TILE_ROWS = 1
# DeepEP's normal (prefill) kernels take 20 SMs by default (deepseek-ai/DeepEP@dd758ca,
# deep_ep/buffers/legacy.py `Buffer.num_sms = 20`); compute overlapped with them runs on the rest
COMM_SMS = 20


@dataclass(frozen=True)
class PerfContext:
    """Everything the step models need besides the shape and the batch."""

    model: ModelSpec
    system: System
    ops: OpModel
    kv_dtype: str
    stage_tensors: int  # activations a pipeline stage sends per token (the engine's fact)
    draft_tokens: int = 0  # k speculative tokens verified per step (0: none)
    acceptance: float = 1.0  # tokens emitted per step per request
    die_local: bool = True  # expert weights and LM head split by columns over memory domains
    engram_gpus: int = 1  # GPUs the Engram tables are spread over (the rest read over NVLink)
    engram_host: bool = False  # tables in pinned host memory, read over C2C (compiler.resolve)
    moe_weight_only: bool = False  # expert kernels dequantize to BF16 (Marlin): BF16 math
    # the all-to-all lays tokens out per expert and sums the weighted copies itself (DeepEP
    # low-latency: compiler.resolve batched): no permute and no moe_sum kernel
    batched_experts: bool = False
    offload: Offload | None = None  # the instance's weight offload (compiler.offload)
    nic_gbps: float | None = None
    image_token_share: float = 0.0  # prompt tokens that are image tokens (workload)
    tokens_per_image: int = 0
    # results of pure functions of this (frozen) context by their exact arguments (`_memo`)
    _memo: dict[tuple, object] = field(default_factory=dict, init=False, repr=False,
                                       compare=False)


@dataclass
class StepTime:
    breakdown: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # pipelined prefill: the other stages' time a chunk passes through besides the slowest
    # one (`us`, the interval between chunks); 0 without pipeline stages
    fill_us: float = 0.0

    @property
    def us(self) -> float:
        return sum(self.breakdown.values())

    def add(self, key: str, us: float) -> None:
        self.breakdown[key] += us

    def scaled(self, factor: float) -> "StepTime":
        out = StepTime()
        for k, v in self.breakdown.items():
            out.add(k, v * factor)
        return out

    def copy(self) -> "StepTime":
        return StepTime(defaultdict(float, self.breakdown), self.fill_us)

    def merge(self, other: "StepTime") -> None:
        for k, v in other.breakdown.items():
            self.add(k, v)

    def rounded(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in sorted(self.breakdown.items()) if v > 0}


def _memo(ctx: PerfContext, fn, *args):
    """fn(ctx, *args), computed once per context: the serving fixed points and the solver's
    search over shapes and batches ask for the same steps and layers again and again, and the
    same arithmetic on the same arguments gives the same number."""
    key = (fn, *args)
    out = ctx._memo.get(key)
    if out is None:
        out = ctx._memo[key] = fn(ctx, *args)
    return out


def _expert_placement(ctx: PerfContext) -> str:
    return "local" if ctx.die_local else "interleaved"


def _link(ctx: PerfContext, shape: Shape) -> comm.Link:
    """The links of one stage's collectives (the whole instance without pipeline stages)."""
    return comm.instance_link(ctx.system, shape.stage_gpus, ctx.nic_gbps)


def attention_layer(ctx: PerfContext, st: StepTime, shape: Shape, seqs: float, q_len: float,
                    kv_len: float, prefill: bool, sliding: bool = False,
                    sparse: bool = True) -> None:
    """Projections and attention core of one layer: `seqs` sequences per DP rank, each with
    `q_len` new tokens over `kv_len` cached ones; `sparse` False: a layer that attends to
    every token though the model has an indexer (Indexer.layers)."""
    a = ctx.model.attention
    tokens = max(1, round(seqs * q_len))
    heads = max(1, a.heads // shape.tp)
    if sliding and a.sliding_window:
        kv_len = min(kv_len, a.sliding_window)
    if a.kind == "mla":
        _mla(ctx, st, seqs, q_len, kv_len, prefill, tokens, heads, sparse)
    elif a.kind == "csa":
        raise ValueError("compressed sparse attention runs per layer (csa_layers)")
    else:
        _gqa(ctx, st, shape, (seqs, q_len, kv_len), prefill, tokens, heads, sparse)
    if shape.tp > 1:
        nbytes = tokens * ctx.model.hidden_size * 2
        st.add("all_reduce", comm.all_reduce_us(ctx.system, _link(ctx, shape), shape.tp, nbytes))


def _gqa(ctx: PerfContext, st: StepTime, shape: Shape, batch: tuple[float, float, float],
         prefill: bool, tokens: int, heads: int, sparse: bool = True) -> None:
    """GQA; `batch`: (sequences, query length, KV length). With an indexer (MiniMax M3's MSA)
    a sparse layer also projects the index queries (one head per KV head) and the shared
    index key, scores every context token and attends its top-k blocks only."""
    m, ops = ctx.model, ctx.ops
    a, h, w = m.attention, m.hidden_size, m.dtypes.weights
    seqs, q_len, kv_len = batch
    kv_heads = max(1, a.kv_heads // shape.tp)
    new, n_seqs = max(1, round(q_len)), max(1, round(seqs))
    ix = a.indexer if sparse else None
    index = (max(1, ix.heads // shape.tp) + 1) * ix.head_dim if ix else 0
    st.add("attn_proj", ops.gemm(w, tokens, (heads + 2 * kv_heads) * a.head_dim + index, h))
    if ix:
        context = kv_len + (q_len if prefill else 0)
        st.add("indexer", ops.indexer("bf16" if ix.key_cache == "bf16" else "fp8", n_seqs, new,
                                      max(1, ix.heads // shape.tp), ix.head_dim,
                                      max(1, round(context))))
        attended = min(context, ix.topk * ix.block)
        st.add("attention", ops.attn_decode(ctx.kv_dtype, n_seqs, heads, kv_heads, a.head_dim,
                                            max(1, round(attended)), q_len=new))
    elif prefill:
        per_seq = ops.attn_prefill(ctx.kv_dtype, new, heads, kv_heads, a.head_dim, True,
                                   kv_len=round(kv_len))
        st.add("attention", per_seq * seqs)
    else:
        st.add("attention", ops.attn_decode(ctx.kv_dtype, n_seqs, heads, kv_heads, a.head_dim,
                                            max(1, round(kv_len)), q_len=new))
    st.add("attn_proj", ops.gemm(w, tokens, h, heads * a.head_dim))


def _mla(ctx: PerfContext, st: StepTime, seqs: float, q_len: float, kv_len: float,
         prefill: bool, tokens: int, heads: int, sparse: bool = True) -> None:
    """MLA. Decode attends the compressed latent directly (absorbed W_UK / W_UV); prefill
    expands the latent of new and cached tokens into per-head K/V (MHA). A sparse indexer
    scores every context token and caps the attended ones at its top-k; an output gate
    (Kimi K3) adds its hidden -> heads x v projection."""
    m, ops = ctx.model, ctx.ops
    a, h, w = m.attention, m.hidden_size, m.dtypes.weights
    lora, rope = a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
    nope, v = a.head_dim - rope, a.v_head_dim or a.head_dim
    new, n_seqs = max(1, round(q_len)), max(1, round(seqs))
    context = kv_len + (q_len if prefill else 0)
    if a.q_lora_rank:
        st.add("attn_proj", ops.gemm(w, tokens, a.q_lora_rank, h))
        st.add("attn_proj", ops.gemm(w, tokens, heads * a.head_dim, a.q_lora_rank))
    else:
        st.add("attn_proj", ops.gemm(w, tokens, heads * a.head_dim, h))
    st.add("attn_proj", ops.gemm(w, tokens, lora + rope, h))
    if a.output_gate:
        st.add("attn_proj", ops.gemm(w, tokens, heads * v, h))
    indexer = a.indexer if sparse else None
    attended = context
    if indexer:
        ix = indexer
        st.add("indexer", ops.indexer(ctx.kv_dtype, n_seqs, new, ix.heads, ix.head_dim,
                                      max(1, round(context))))
        attended = min(context, ix.topk)
    if prefill and not indexer:
        expand = max(1, round(seqs * context))
        st.add("attn_proj", ops.gemm(w, expand, heads * (nope + v), lora))
        per_seq = ops.attn_prefill(ctx.kv_dtype, new, heads, heads, a.head_dim, True,
                                   kv_len=round(kv_len), v_head_dim=v)
        st.add("attention", per_seq * seqs)
    else:
        st.add("attn_proj", ops.gemm(w, tokens, heads * lora, nope))
        st.add("attention", ops.attn_decode(ctx.kv_dtype, n_seqs, heads, 1, lora + rope,
                                            max(1, round(attended)), q_len=new,
                                            v_head_dim=lora))
        st.add("attn_proj", ops.gemm(w, tokens, heads * v, lora))
    st.add("attn_proj", ops.gemm(w, tokens, h, heads * v))


def _csa(ctx: PerfContext, st: StepTime, shape: Shape, seqs: float, q_len: float,
         kv_len: float, prefill: bool, layer: int) -> None:
    """DeepSeek V4's compressed sparse attention in `layer` (models/deepseek_v41/attention.py):
    the replicated fused wq_a + wkv, wq_b, the grouped wo_a and wo_b; a KV source's compressor
    (BF16) over the new tokens; an index source's indexer over the compressed states; MQA over
    the window and (where the layer has a ratio) the indexer's top-k compressed latents."""
    m, ops = ctx.model, ctx.ops
    a, h, w = m.attention, m.hidden_size, m.dtypes.weights
    sh, ix = a.kv_sharing, a.indexer
    tokens = max(1, round(seqs * q_len))
    heads, groups = max(1, a.heads // shape.tp), max(1, sh.o_groups // shape.tp)
    new, n_seqs = max(1, round(q_len)), max(1, round(seqs))
    ratio = sh.compress_ratios[layer] if layer < len(sh.compress_ratios) else 0
    context = kv_len + (q_len if prefill else 0)
    st.add("attn_proj", ops.gemm(w, tokens, a.q_lora_rank + a.head_dim, h)
           + ops.gemm(w, tokens, heads * a.head_dim, a.q_lora_rank)
           + ops.gemm(w, tokens, groups * sh.o_lora_rank, a.heads * a.head_dim // sh.o_groups)
           + ops.gemm(w, tokens, h, groups * sh.o_lora_rank))
    if layer in sh.source_layers:
        st.add("attn_proj", ops.gemm("bf16", tokens, a.head_dim * (2 if ratio > 1 else 1), h))
    attended = min(context, a.sliding_window or context)
    if ratio:
        compressed = context / ratio
        if ix and (ix.source_layers is None or layer in ix.source_layers):
            st.add("attn_proj", ops.gemm(w, tokens, ix.heads * ix.head_dim, a.q_lora_rank))
            st.add("indexer", ops.indexer(ctx.kv_dtype, n_seqs, new, ix.heads, ix.head_dim,
                                          max(1, round(compressed))))
        attended += min(compressed, ix.topk if ix else compressed)
    st.add("attention", ops.attn_decode(ctx.kv_dtype, n_seqs, heads, 1, a.head_dim,
                                        max(1, round(attended)), q_len=new,
                                        v_head_dim=a.head_dim))
    if shape.tp > 1:
        st.add("all_reduce", comm.all_reduce_us(ctx.system, _link(ctx, shape), shape.tp,
                                                tokens * h * 2))


def _csa_kinds(model, ids) -> list[tuple[int, int]]:
    """(a representative layer, how many) of `ids` per kind of compressed sparse attention
    layer: its ratio, and whether it is a KV source or an index source."""
    sh, ix = model.attention.kv_sharing, model.attention.indexer
    kinds: dict[tuple, list[int]] = {}
    for i in ids:
        ratio = sh.compress_ratios[i] if i < len(sh.compress_ratios) else 0
        index = bool(ix and (ix.source_layers is None or i in ix.source_layers))
        kinds.setdefault((ratio, i in sh.source_layers, index), []).append(i)
    return [(layers[0], len(layers)) for layers in kinds.values()]


def replays_decoder(model, shape: Shape) -> bool:
    """Whether vLLM runs SWA bounded replay for `shape`: the model has it, and neither sequence
    parallelism (EP with TP > 1 and DP > 1) nor pipeline stages turn it off
    (models/deepseek_v41/nvidia/model.py _decoder_replay_supported, _use_sequence_parallel)."""
    sh = model.attention.kv_sharing
    return bool(sh and sh.decoder_replay and shape.pp == 1
                and not (shape.ep > 1 and shape.tp > 1 and shape.dp > 1))


def moe_layer(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int,
              shared_fraction: float, decode: bool = False) -> None:
    """Router, expert GEMMs on the busiest rank, expert-parallel all-to-all or TP all-reduce,
    and the shared expert in `shared_fraction` of MoE layers. A latent MoE (Kimi K3) projects
    every token to the latent and back on each rank (replicated, kimi_k3/nvidia/model.py
    l.477-505) and its experts and all-to-all work on the latent width."""
    m, ops = ctx.model, ctx.ops
    moe, h = m.moe, moe_width(m)
    e_dtype, place = m.dtypes.experts, _expert_placement(ctx)
    st.add("router", ops.gemm("bf16", tokens, moe.experts, m.hidden_size))
    if moe.latent_dim:
        st.add("latent_proj", ops.gemm(m.dtypes.weights, tokens, h, m.hidden_size)
               + ops.gemm(m.dtypes.weights, tokens, m.hidden_size, h))
    slots, per_expert = _moe_traffic(ctx, st, shape, tokens, h)
    local = slots // shape.ep
    # the step waits for the busiest expert-parallel rank (routing.py)
    skew = routing.rank_imbalance(per_expert * slots, shape.ep)
    if not decode:
        tile = PREFILL_EXPERT_TILE_ROWS
    else:
        tile = DECODE_EXPERT_TILE_ROWS if shape.dp > 1 else FUSED_DECODE_TILE_ROWS
    inter = _expert_width(moe, shape)
    measured = _measured_moe(ctx, shape, tokens * skew, per_expert * skew)
    if measured is not None:
        st.add("moe_experts", measured)
    else:
        for k, n in ((h, 2 * inter), (inter, h)):
            st.add("moe_experts", ops.grouped_gemm(e_dtype, local, per_expert, k, n, skew=skew,
                                                   placement=place, tile_rows=tile,
                                                   weight_only=ctx.moe_weight_only))
    if moe.shared_experts and shared_fraction > 0:
        width = _shared_width(moe, shape)
        w, hidden = m.dtypes.weights, m.hidden_size
        shared = ops.gemm(w, tokens, 2 * width, hidden) + ops.gemm(w, tokens, hidden, width)
        st.add("shared_expert", shared * shared_fraction)


def _moe_traffic(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int,
                 h: int) -> tuple[int, float]:
    """How tokens reach their experts (the all-to-all under DEP, the TP all-reduce), and the
    expert slots that share them with the tokens each slot gets."""
    m, moe, link = ctx.model, ctx.model.moe, _link(ctx, shape)
    if shape.dp > 1:  # DEP: tokens of every rank meet their experts through all-to-all
        slots = moe.slots  # experts plus their EPLB replicas, which share their tokens
        nodes = max(1, shape.gpus // ctx.system.gpus_per_tray)
        st.add("dispatch", comm.all_to_all_us(ctx.system, link, shape.ep,
                                              tokens * moe.top_k * h * 1.0, False, nodes,
                                              moe.top_k))
        st.add("combine", comm.all_to_all_us(ctx.system, link, shape.ep,
                                             tokens * moe.top_k * h * 2.0, True, nodes,
                                             moe.top_k))
        return slots, tokens * shape.dp * moe.top_k / slots
    # TP or TPxEP: every rank sees all tokens; experts sliced (TP) or distributed (EP)
    slots = moe.slots if shape.ep > 1 else moe.experts
    if shape.tp > 1:
        st.add("all_reduce", comm.all_reduce_us(ctx.system, link, shape.tp,
                                                tokens * m.hidden_size * 2))
    return slots, tokens * moe.top_k / slots


def _table_moe(ctx: PerfContext, shape: Shape, tokens: float) -> float | None:
    """The calibration's measured fused MoE of this rank's shape at `tokens` (before routing;
    ops.OpModel.fused_moe), or None. Only without DP: there every rank runs the MoE over all
    of the instance's tokens, as the tables time `num_tokens`. Under DEP vLLM dispatches
    through DeepEP to other kernels (DeepGEMM's masked and contiguous layouts) than the
    tables' fused MoE with an expert map, and the curve is used; so too with EPLB replicas
    and with weight-only (Marlin) experts."""
    m = ctx.model
    moe = m.moe
    if shape.dp > 1 or moe.slots != moe.experts or ctx.moe_weight_only:
        return None
    return ctx.ops.fused_moe(m.dtypes.experts, m.dtypes.scales or "", tokens, moe_width(m),
                             _expert_width(moe, shape), moe.top_k, moe.experts,
                             moe.experts // shape.ep)


def _measured_moe(ctx: PerfContext, shape: Shape, tokens: float,
                  per_expert: float) -> float | None:
    """`_table_moe` for served tokens. The tables route evenly (E min(1, t) of E experts
    receive tokens at t copies per expert); served tokens route at random, which leaves
    E e^-t of them idle. Their weight reads, at the curve's memory efficiency, come off the
    measured time, but never the call's fixed part (its time at one token), and the result is
    never below reading the experts that do receive tokens at the datasheet's bandwidth."""
    measured = _table_moe(ctx, shape, tokens)
    if measured is None:
        return None
    m = ctx.model
    local = m.moe.experts // shape.ep
    even = local * min(1.0, per_expert)
    random = local * -math.expm1(-per_expert)
    if even <= random:
        return measured
    expert_bytes = 3 * moe_width(m) * _expert_width(m.moe, shape) * OP_BYTES[m.dtypes.experts]
    hbm = ctx.ops.hbm_bytes_per_us(_expert_placement(ctx))
    saved = (even - random) * expert_bytes / (hbm * ctx.ops.curve(
        "grouped_gemm", m.dtypes.experts).e_mem)
    fixed = _table_moe(ctx, shape, 1.0) or 0.0
    return max(measured - min(saved, max(0.0, measured - fixed)),
               random * expert_bytes / hbm)


def _moe_layer(ctx: PerfContext, shape: Shape, tokens: int, shared_fraction: float,
               decode: bool) -> StepTime:
    """One MoE layer on its own (memoised by `_layers`; read, never added to)."""
    one = StepTime()
    moe_layer(ctx, one, shape, tokens, shared_fraction, decode)
    return one


def moe_width(m: ModelSpec) -> int:
    """The width routed experts read and write: the latent, else the hidden."""
    return m.moe.latent_dim or m.hidden_size


def _expert_width(moe: Moe, shape: Shape) -> int:
    """One rank's share of an expert's intermediate: whole under DEP and TPxEP, 1/tp under TP."""
    return moe.expert_intermediate if shape.dp > 1 else \
        moe.expert_intermediate // (shape.tp // shape.ep)


def _shared_width(moe: Moe, shape: Shape) -> int:
    """One rank's share of the shared experts' (fused) intermediate."""
    return moe.shared_experts * moe.expert_intermediate // shape.tp


def dense_ffn(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int) -> None:
    m, ops = ctx.model, ctx.ops
    width = m.dense_intermediate // shape.tp
    w = m.dtypes.weights
    st.add("dense_ffn", ops.gemm(w, tokens, 2 * width, m.hidden_size)
           + ops.gemm(w, tokens, m.hidden_size, width))
    if shape.tp > 1:
        st.add("all_reduce", comm.all_reduce_us(ctx.system, _link(ctx, shape), shape.tp,
                                                tokens * m.hidden_size * 2))


def _layers(ctx: PerfContext, st: StepTime, shape: Shape, seqs: float, q_len: float,
            kv_len: float, prefill: bool, count: int | None = None,
            mix: tuple[int, int, int] | None = None, layers: range | None = None) -> None:
    """`count` layers (default: all) of attention + FFN; the first dense_layers are dense.
    `mix`: (layers, dense, sliding) of one pipeline stage instead; `layers`: those layers.
    `count` alone means the draft's layers (past the target's)."""
    m = ctx.model
    tokens = max(1, round(seqs * q_len))
    n = m.layers if count is None else count
    sliding = m.attention.sliding_layers if count is None else 0
    dense = m.dense_layers if count is None else 0
    if mix is not None:
        n, dense, sliding = mix
    if m.attention.kind == "csa" and count is None and prefill and mix is None \
            and layers is None and replays_decoder(m, shape):
        # prefill runs the layers from the last KV source on each request's last window only;
        # that layer first writes the KV (its compressor and wkv) of every token
        cut = max(m.attention.kv_sharing.source_layers)
        window = min(q_len, m.attention.sliding_window)
        _layers(ctx, st, shape, seqs, q_len, kv_len, prefill, layers=range(cut))
        _layers(ctx, st, shape, seqs, window, kv_len + q_len - window, prefill,
                layers=range(cut, m.layers))
        st.add("attn_proj", ctx.ops.gemm("bf16", tokens, m.attention.head_dim, m.hidden_size)
               + ctx.ops.gemm(m.dtypes.weights, tokens, m.attention.head_dim, m.hidden_size))
        return
    if layers is not None:
        n, dense, sliding = len(layers), sum(1 for i in layers if i < m.dense_layers), 0
    _attention_layers(ctx, st, shape, (seqs, q_len, kv_len), prefill, (n, sliding),
                      count, layers, mix)
    _ffn_layers(ctx, st, shape, tokens, n, dense, prefill)


def _attention_layers(ctx: PerfContext, st: StepTime, shape: Shape,
                      batch: tuple[float, float, float], prefill: bool,
                      n_sliding: tuple[int, int], count: int | None, layers: range | None,
                      mix: tuple[int, int, int] | None) -> None:
    """The attention of `n` layers, `sliding` of them sliding-window (a compressed-attention
    model: each layer by its kind); `batch`: (sequences, query length, KV length)."""
    m = ctx.model
    seqs, q_len, kv_len = batch
    n, sliding = n_sliding
    if m.attention.kind == "csa":  # per layer: ratios, KV and index sources differ
        ids = layers if layers is not None else range(m.layers, m.layers + n) \
            if count is not None else range(n)
        for layer, times in _csa_kinds(m, ids):
            one = StepTime()
            _csa(ctx, one, shape, seqs, q_len, kv_len, prefill, layer)
            st.merge(one.scaled(times))
        return
    linear = _among(ctx.model.linear_attention.layers if m.linear_attention else [], n, m.layers,
                    (count, layers, mix), draft=0)
    if linear:
        st.merge(_memo(ctx, _linear_layer, shape, seqs, q_len).scaled(linear))
    full = n - linear - sliding
    ix = m.attention.indexer
    sparse = _among(ix.layers if ix else None, full, m.layers, (count, layers, mix), draft=full)
    one_full, one_sliding = StepTime(), StepTime()
    attention_layer(ctx, one_full, shape, seqs, q_len, kv_len, prefill)
    index_us = one_full.breakdown.pop("indexer", 0.0)
    st.merge(one_full.scaled(sparse))
    if index_us:
        owners = arch.indexer_owners(m)
        st.add("indexer", index_us * _among(owners, full, m.layers, (count, layers, mix),
                                            draft=full))
    if full > sparse:  # the layers that attend to every token (Indexer.layers)
        dense = StepTime()
        attention_layer(ctx, dense, shape, seqs, q_len, kv_len, prefill, sparse=False)
        st.merge(dense.scaled(full - sparse))
    if sliding:
        attention_layer(ctx, one_sliding, shape, seqs, q_len, kv_len, prefill, sliding=True)
        st.merge(one_sliding.scaled(sliding))


def _ffn_layers(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int, n: int, dense: int,
                prefill: bool) -> None:
    """The FFNs of `n` layers (`dense` of them dense in a MoE model), their glue kernels and
    the hyper-connections' residual stream."""
    m = ctx.model
    moe_n = n - dense if m.moe else 0
    if dense or not m.moe:
        one = StepTime()
        dense_ffn(ctx, one, shape, tokens)
        st.merge(one.scaled(dense if m.moe else n))
    if moe_n:
        one = _memo(ctx, _moe_layer, shape, tokens, m.moe.shared_expert_layer_fraction,
                    not prefill)
        st.merge(one.scaled(moe_n))
    glue = _memo(ctx, _attention_glue_us, shape, tokens) * n
    if moe_n:
        glue += _memo(ctx, _moe_glue_us, shape, tokens) * moe_n
    if dense or not m.moe:
        glue += _memo(ctx, _dense_glue_us, shape, tokens) * (dense if m.moe else n)
    st.add("glue", glue)
    if m.mhc_routes:  # the residual stream is routes x hidden wide: read and written per layer
        st.add("mhc", ctx.ops.copy(tokens * m.mhc_routes * m.hidden_size * 2 * 2) * n)


def _among(ids: list[int] | None, n: int, total: int,
           which: tuple[int | None, range | None, tuple[int, int, int] | None],
           draft: float) -> float:
    """How many of `_layers`' `n` layers are among `ids` (None: all of them): the layers that
    run their own indexer (IndexShare names them: the others reuse the previous one's top-k),
    attend sparsely, or run linear attention. `which`: `_layers`' (count, layers, mix); draft
    layers (`count`) count as `draft`, a pipeline stage (`mix`, counts without ids) takes its
    share of the model's `total`."""
    count, layers, mix = which
    if ids is None:
        return n
    if count is not None:
        return draft
    if layers is not None:
        return sum(1 for i in layers if i in ids)
    return n * len(ids) / total if mix is not None else len(ids)


def _linear_layer(ctx: PerfContext, shape: Shape, seqs: float, q_len: float) -> StepTime:
    """One linear-attention layer (Kimi Delta Attention, models/kimi_k3/nvidia/kda.py): the
    fused q, k, v, gate, f_a and beta projection, f_b, the core over each sequence's state
    (as long at any context), o_proj and its all-reduce. Memoised by `_attention_layers`."""
    m, ops, st = ctx.model, ctx.ops, StepTime()
    la, h, w = m.linear_attention, m.hidden_size, m.dtypes.weights
    tokens = max(1, round(seqs * q_len))
    heads = max(1, la.heads // shape.tp)
    width = heads * la.head_dim
    st.add("attn_proj", ops.gemm(w, tokens, 4 * width + la.head_dim + heads, h)
           + ops.gemm(w, tokens, width, la.head_dim) + ops.gemm(w, tokens, h, width))
    st.add("linear_attention", ops.linear_attention(max(1, round(seqs)), max(1, round(q_len)),
                                                    heads, la.head_dim))
    if shape.tp > 1:
        st.add("all_reduce", comm.all_reduce_us(ctx.system, _link(ctx, shape), shape.tp,
                                                tokens * h * 2))
    return st


def _kernel(ctx: PerfContext, name: str, nbytes: float) -> float:
    """A glue kernel: its measured CUDA-graph floor (floors.py), then its bytes at copy rate."""
    return ctx.ops.kernel_floor(name) + ctx.ops.copy(nbytes) - ctx.ops.copy(0)


def _attention_glue_us(ctx: PerfContext, shape: Shape, tokens: int) -> float:
    """The kernels around a layer's attention that the ops above leave out, as vLLM runs them
    (and compiler/perf/engine_kernels.py, measured): the residual add + RMSNorm before
    attention and after it, q/k norm + RoPE over the new tokens' q and k (MLA: RoPE on the rope
    dims and the latent's norm, and the compressed query's norm), and the KV write
    (`reshape_and_cache`: BF16 keys and values in, the cache's dtype out)."""
    m = ctx.model
    a = m.attention
    heads = max(1, a.heads // shape.tp)
    if a.kind in ("mla", "csa"):  # csa: RoPE on q's and the one KV head's rope dims, kv norm
        rope = a.qk_rope_head_dim or 0
        qk = heads * rope + (a.kv_lora_rank or a.head_dim if a.kind == "csa" else
                             a.kv_lora_rank or 0) + rope
    else:
        qk = (heads + max(1, a.kv_heads // shape.tp)) * a.head_dim
    norms = 2 * _kernel(ctx, "add_rms_norm", 4 * tokens * m.hidden_size * 2)
    if a.kind in ("mla", "csa") and a.q_lora_rank:
        norms += _kernel(ctx, "rms_norm", 2 * tokens * a.q_lora_rank * 2)
    kv = tokens * memory.kv_bytes_per_token_per_gpu(m, shape, ctx.kv_dtype) / m.layers
    if a.kind == "csa":  # every layer also writes each token's window record
        kv += tokens * arch.csa_record_bytes(m, ctx.kv_dtype)
    written = kv * (1 + 2 / arch.KV_BYTES[ctx.kv_dtype])  # a BF16 read per element written
    return (norms + _kernel(ctx, "qk_norm_rope", 2 * tokens * qk * 2)
            + _kernel(ctx, "copy", written))


def _moe_glue_us(ctx: PerfContext, shape: Shape, tokens: int) -> float:
    """The kernels around a MoE layer's expert GEMMs: the router's top-k softmax, the align +
    permute of the routed copies (each token's row read once, every copy written), SiLU x mul
    on the copies' intermediate and the weighted un-permute sum (vLLM `moe_sum`). Where the
    layer is costed as a measured fused call (`_table_moe`) those are in its time (the
    collector times FusedMoE's whole forward); the shared expert's SiLU x mul is not."""
    moe, h = ctx.model.moe, moe_width(ctx.model)
    shared = moe.shared_expert_layer_fraction * _kernel(
        ctx, "silu_mul", 3 * tokens * _shared_width(moe, shape) * 2) if moe.shared_experts \
        else 0.0
    if _table_moe(ctx, shape, tokens) is not None:
        return shared
    copies = tokens * moe.top_k  # DEP: the rank's share after dispatch; TP: every copy
    if shape.dp == 1 and shape.ep > 1:  # TPxEP: every rank sees all tokens, keeps its experts'
        copies /= shape.ep
    us = shared + _kernel(ctx, "topk_softmax", tokens * moe.experts * 2) \
        + _kernel(ctx, "silu_mul", 3 * copies * _expert_width(moe, shape) * 2)
    if ctx.batched_experts:  # vllm fused_moe/prepare_finalize/deepep_ll.py
        return us
    rows = (copies + tokens) * h * 2
    return us + _kernel(ctx, "moe_permute", rows) + _kernel(ctx, "moe_sum", rows)


def _dense_glue_us(ctx: PerfContext, shape: Shape, tokens: int) -> float:
    """SiLU x mul on a dense FFN's intermediate."""
    return _kernel(ctx, "silu_mul", 3 * tokens * ctx.model.dense_intermediate // shape.tp * 2)


def _lm_head(ctx: PerfContext, st: StepTime, shape: Shape, rows: int) -> None:
    m = ctx.model
    st.add("lm_head", ctx.ops.gemm(m.dtypes.weights, max(1, rows), m.vocab_size // shape.tp,
                                   m.hidden_size, placement=_expert_placement(ctx)))


def _engram(ctx: PerfContext, st: StepTime, tokens: int) -> None:
    """Engram rows for every token: the local shard from HBM, the rest from peers over NVLink;
    or, when the tables are in host memory, all of them over the CPU-GPU link (UVA reads)."""
    e = ctx.model.engram
    if not e:
        return
    # each table: (max_ngram - 1) x heads hashed rows per token, FP8 with UE8M0 scales per 32
    # (common/engram.py l.1626-1628)
    row = e.head_dim + e.head_dim // arch.MX_BLOCK
    nbytes = tokens * e.tables * (e.max_ngram - 1) * e.heads * row
    if ctx.engram_host:
        st.add("engram", comm.transfer_us(ctx.system, nbytes, "c2c"))
        return
    local = nbytes / max(1, ctx.engram_gpus)
    st.add("engram", ctx.ops.copy(2 * local)
           + comm.transfer_us(ctx.system, nbytes - local, "nvlink"))


def _vision(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int) -> None:
    """The vision tower over the images among a chunk's `tokens`: every ViT block over
    merge^2 patches per image token (weights split by TP, vLLM's default
    --mm-encoder-tp-mode weights), full attention within each image, the per-patch
    projector where there is one, then the mergers."""
    v, share = ctx.model.vision, ctx.image_token_share
    if not (v and share and ctx.tokens_per_image):
        return
    ops, h, tp, text = ctx.ops, v.hidden_size, shape.tp, ctx.model.hidden_size
    qkv = v.attention_width or h
    image_tokens = tokens * share
    per_image = ctx.tokens_per_image * v.merge ** 2  # patches of one image
    patches = max(1, round(image_tokens * v.merge ** 2))
    heads = max(1, v.heads // tp)
    gate = 2 if v.mlp == "swiglu" else 1
    block = (ops.gemm("bf16", patches, 3 * qkv // tp, h) + ops.gemm("bf16", patches, h, qkv // tp)
             + ops.gemm("bf16", patches, gate * v.intermediate // tp, h)
             + ops.gemm("bf16", patches, h, v.intermediate // tp)
             + image_tokens / ctx.tokens_per_image
             * ops.attn_prefill("bf16", per_image, heads, heads, qkv // v.heads, causal=False))
    projector = 0.0
    if v.projector_hidden:
        projector = (ops.gemm("bf16", patches, v.projector_hidden // tp, h)
                     + ops.gemm("bf16", patches, text, v.projector_hidden // tp))
    rows = max(1, round(image_tokens))
    merged = text if v.projector_hidden else h
    merger = (ops.gemm("bf16", rows, v.merger_hidden // tp, merged * v.merge ** 2)
              + ops.gemm("bf16", rows, text, v.merger_hidden // tp))
    st.add("vision", v.layers * block + projector + v.mergers * merger)


def _offload(ctx: PerfContext, st: StepTime, shape: Shape, tokens: int, layers_us: float,
             stage: int = 0) -> None:
    """The offloaded weights' reads (UVA) or the waits for their copies (prefetch) of a step
    whose decoder layers compute for `layers_us` (compiler.perf.offload); the vision tower's
    only in a step that ran it (`_vision` added its time)."""
    us = offload.offload_us(ctx, shape, tokens, layers_us, stage,
                            vision=st.breakdown.get("vision", 0.0) > 0)
    if us:
        st.add("weight_offload", us)


def decode_step(ctx: PerfContext, shape: Shape, batch: float, kv_len: float) -> StepTime:
    """One decode step on each DP rank: `batch` requests verify 1 + k tokens over `kv_len`
    cached tokens on average, then the draft model proposes the next k tokens. Memoised on
    the context (frozen) by the exact arguments; a copy, since callers add to it."""
    return _memo(ctx, _decode_step, shape, batch, kv_len).copy()


def _decode_step(ctx: PerfContext, shape: Shape, batch: float, kv_len: float) -> StepTime:
    st = StepTime()
    q = 1 + ctx.draft_tokens
    _layers(ctx, st, shape, batch, q, kv_len, prefill=False)
    layers_us = st.us
    _lm_head(ctx, st, shape, round(batch * q))
    _engram(ctx, st, max(1, round(batch * q)))
    _offload(ctx, st, shape, max(1, round(batch * q)), layers_us)
    if ctx.draft_tokens and ctx.model.draft:
        st.add("draft", _draft_us(ctx, shape, batch, kv_len))
    st.add("overhead", DECODE_OVERHEAD_US)
    return st


def _draft_us(ctx: PerfContext, shape: Shape, batch: float, kv_len: float) -> float:
    """The draft's proposal of k tokens. MTP / EAGLE: k passes of one token. DSpark
    (v1/worker/gpu/spec_decode/dspark/speculator.py): one pass of its layers over the k-token
    query block, with its own routed experts, then the Markov head's vocab x rank bias for each
    position in turn."""
    d, k = ctx.model.draft, ctx.draft_tokens
    draft = StepTime()
    if d.method != "dspark":
        _layers(ctx, draft, shape, batch, 1, kv_len, prefill=False, count=d.layers)
        _lm_head(ctx, draft, shape, round(batch))
        # index_share_for_mtp_iteration: pass 0 computes the MTP layer's own top-k and the
        # later passes skip its indexer (vLLM v1/spec_decode/llm_base_proposer.py set_skip_topk)
        shared = (k - 1) * draft.breakdown["indexer"] if d.index_share else 0.0
        return draft.us * k - shared
    m = ctx.model
    moe = m.moe.model_copy(update={"experts": d.experts or m.moe.experts,
                                   "top_k": d.top_k or m.moe.top_k, "redundant_experts": 0})
    own = replace(ctx, model=m.model_copy(update={"moe": moe}))
    _layers(own, draft, shape, batch, k, kv_len, prefill=False, count=d.layers)
    _lm_head(ctx, draft, shape, round(batch * k))
    draft.add("lm_head", k * ctx.ops.gemm("bf16", max(1, round(batch)), m.vocab_size,
                                          arch.DSPARK_MARKOV_RANK))
    return draft.us


def prefill_step(ctx: PerfContext, shape: Shape, tokens: int, new_per_seq: float,
                 cached_per_seq: float) -> StepTime:
    """One prefill chunk of `tokens` new tokens per DP rank, cut from requests that each bring
    `new_per_seq` new tokens after `cached_per_seq` cached ones (their attention spans both).
    With pipeline stages: the slowest stage, and the others as `fill_us`."""
    if shape.pp > 1:
        stages = prefill_stages(ctx, shape, tokens, new_per_seq, cached_per_seq)
        slowest = max(stages, key=lambda st: st.us)
        out = slowest.scaled(1.0)
        out.fill_us = sum(st.us for st in stages) - slowest.us
        return out
    st = StepTime()
    seqs = tokens / max(1.0, new_per_seq)
    _layers(ctx, st, shape, seqs, new_per_seq, cached_per_seq, prefill=True)
    layers_us = st.us
    _vision(ctx, st, shape, tokens)
    _lm_head(ctx, st, shape, max(1, math.ceil(seqs)))
    _engram(ctx, st, tokens)
    _offload(ctx, st, shape, tokens, layers_us)
    _overlap_communication(ctx, st)
    st.add("overhead", PREFILL_OVERHEAD_US)
    return st


def prefill_stages(ctx: PerfContext, shape: Shape, tokens: int, new_per_seq: float,
                   cached_per_seq: float) -> list[StepTime]:
    """Each pipeline stage's time for one chunk: its layers, the LM head on the last, the
    activations received from the previous stage, and the engine's per-step overhead (each
    stage's worker prepares its inputs). No dual-batch overlap: vLLM 0.33 refuses it with
    pipeline parallelism (catalog/engines/vllm-0.33.yaml pipeline.dual_batch_overlap)."""
    seqs = tokens / max(1.0, new_per_seq)
    mixes = stage_layer_mix(ctx.model, shape.pp)
    out = []
    for s, mix in enumerate(mixes):
        st = StepTime()
        _layers(ctx, st, shape, seqs, new_per_seq, cached_per_seq, prefill=True, mix=mix)
        layers_us = st.us
        if s == 0:
            _vision(ctx, st, shape, tokens)
        if s == shape.pp - 1:
            _lm_head(ctx, st, shape, max(1, math.ceil(seqs)))
        engram = StepTime()
        _engram(ctx, engram, tokens)
        st.merge(engram.scaled(mix[0] / ctx.model.layers))  # the stage's share of the lookups
        _offload(ctx, st, shape, tokens, layers_us, s)  # each stage's own offloaded layers
        if s > 0:
            st.add("stage_recv", stage_transfer_us(ctx, shape, tokens, s))
        st.add("overhead", PREFILL_OVERHEAD_US)
        out.append(st)
    return out


def stage_transfer_us(ctx: PerfContext, shape: Shape, tokens: int, stage: int) -> float:
    """Activations of `tokens` into `stage` from the one before: two hidden-wide BF16 tensors
    per token (hidden states and residual; the mHC residual stream is routes wide), each TP
    rank sending 1/tp over its own link (NVLink inside a node or NVLink domain, its NIC
    between HGX nodes), then an all-gather over the receiving stage's TP group."""
    m, system = ctx.model, ctx.system
    tensors = ctx.stage_tensors
    nbytes = tokens * m.hidden_size * (m.mhc_routes or 1) * 2 * tensors
    first_rank = stage * shape.stage_gpus
    per = system.gpus_per_tray
    across = system.form != "nvl72" and first_rank // per != (first_rank - 1) // per
    send = comm.transfer_us(system, nbytes / shape.tp, "rdma" if across else "nvlink",
                            ctx.nic_gbps)
    return send + comm.all_gather_us(system, _link(ctx, shape), shape.tp, nbytes)


ATTENTION_SIDE = ("attn_proj", "attention", "indexer", "linear_attention", "all_reduce",
                  "router", "glue", "mhc")
EXPERT_SIDE = ("moe_experts", "shared_expert")


def _overlap_communication(ctx: PerfContext, st: StepTime) -> None:
    """Dual-batch overlap in prefill (REFERENCE-DATA.md C1 V1/V2): of two micro-batches, one's
    dispatch runs under the other's attention and its combine under the other's experts, per
    MoE layer. While a communication kernel runs it holds COMM_SMS of the GPU's SMs, so the
    compute under it slows by sms / (sms - COMM_SMS); what communication does not hide, and
    the slowdown it causes, stay on the critical path as `dispatch` and `combine`."""
    m = ctx.model
    if not (st.breakdown.get("dispatch") or st.breakdown.get("combine")):
        return
    sms = ctx.system.gpu.sm_count.value
    slow = sms / max(1.0, sms - COMM_SMS)
    moe_share = (m.layers - m.dense_layers) / m.layers
    for comm_key, side, share in (("dispatch", ATTENTION_SIDE, moe_share),
                                  ("combine", EXPERT_SIDE, 1.0)):
        comm_us = st.breakdown.get(comm_key, 0.0)
        compute = sum(st.breakdown.get(k, 0.0) for k in side) * share
        # comm runs for comm_us; compute under it advances at 1/slow, the rest at full speed
        stage = comm_us + max(0.0, compute - comm_us / slow)
        st.breakdown[comm_key] = stage - compute


def kv_bytes_per_token(ctx: PerfContext) -> int:
    return arch.kv_bytes_per_token(ctx.model, ctx.kv_dtype)
