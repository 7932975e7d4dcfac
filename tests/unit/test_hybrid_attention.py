"""Linear attention, block-sparse GQA and latent MoE: sizes recomputed from the tensors vLLM
0.33 allocates (an oracle written from the shapes, not from compiler.arch's formulas), the
memory budget's per-request state, and step costs that grow as the kernels do."""

import dataclasses
import math
from pathlib import Path

import pytest

from compiler import arch, memory
from compiler.load import load_inputs
from compiler.perf import ops as perf_ops
from compiler.perf.predict import context
from compiler.perf.step import decode_step, prefill_step
from compiler.shapes import parse_shape
from schemas.model import ModelSpec

H, LAYERS, HEADS, D, K = 512, 8, 4, 32, 4  # hidden, layers, KDA heads x head_dim, conv width
LINEAR = [0, 1, 2, 4, 5, 6]  # the KDA layers; 3 and 7 run MLA
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3"


def _spec(**over) -> ModelSpec:
    doc = {
        "architecture": "KimiK3ForConditionalGeneration", "hf_id": "test/hybrid",
        "hidden_size": H, "layers": LAYERS, "dense_layers": 1, "dense_intermediate": 1024,
        "vocab_size": 1000, "max_context_tokens": 1 << 20,
        "attention": {"kind": "mla", "heads": 8, "kv_heads": 8, "head_dim": 96,
                      "v_head_dim": 64, "q_lora_rank": 128, "kv_lora_rank": 64,
                      "qk_rope_head_dim": 32, "output_gate": True},
        "linear_attention": {"kind": "kda", "layers": LINEAR, "heads": HEADS, "head_dim": D,
                             "conv_kernel": K},
        "moe": {"experts": 16, "top_k": 2, "shared_experts": 2, "expert_intermediate": 128,
                "latent_dim": 256},
        "dtypes": {"weights": "bf16", "experts": "bf16", "kv_cache": "bf16"},
    }
    doc.update(over)
    return ModelSpec(**doc)


def _numel(*shapes: tuple[int, ...]) -> int:
    return sum(math.prod(s) for s in shapes)


def test_linear_state_is_per_request_from_vllm_state_tensors():
    """kda_state_shape (mamba_utils.py): conv (3 x heads x head_dim, K - 1 + spec) in BF16,
    recurrent (heads, head_dim, head_dim) in FP32, one of each per KDA layer and request."""
    spec = _spec()
    for spec_tokens in (0, 3):
        conv = (3 * HEADS * D, K - 1 + spec_tokens)
        recurrent = (HEADS, D, D)
        per_layer = _numel(conv) * 2 + _numel(recurrent) * 4
        assert arch.state_bytes_per_request(spec, spec_tokens) == per_layer * len(LINEAR)


def test_kv_cache_holds_only_the_attention_layers():
    """Two MLA layers cache latent + rope per token; the six KDA layers cache nothing."""
    spec = _spec()
    assert arch.kv_bytes_per_token(spec, "bf16") == 2 * (64 + 32) * 2
    assert arch.kv_bytes_per_token(spec, "fp8") == 2 * (64 + 32)


def test_kda_and_gated_mla_parameters_from_their_tensors():
    """KimiK3DeltaAttention's tensors (kda.py) and the gated MLA's (mla.py), layer by layer."""
    spec = _spec()
    width = HEADS * D
    kda = _numel((4 * width + D + HEADS, H),  # in_proj_qkvgfab: q, k, v, g, f_a, beta
                 (width, D),  # f_b_proj
                 (3 * width, 1, K),  # q/k/v conv1d
                 (width,), (HEADS,), (D,),  # dt_bias, A_log, o_norm
                 (H, width))  # o_proj
    heads, nope, rope, v = 8, 64, 32, 64
    mla = _numel((128, H), (heads * (nope + rope), 128),  # q_a, q_b
                 (64 + rope, H), (heads * (nope + v), 64),  # kv_a, kv_b
                 (heads * v, H),  # the output gate (fused with q_a / kv_a)
                 (H, heads * v))  # o_proj
    assert arch.linear_attention_params_per_layer(spec) == kda
    assert arch.params(spec).attention == len(LINEAR) * kda + (LAYERS - len(LINEAR)) * mla


def test_latent_moe_parameters():
    """Routed experts on the latent, shared ones on the hidden, two projections a layer."""
    spec = _spec()
    moe_layers, latent = LAYERS - 1, 256
    p = arch.params(spec)
    assert p.routed_experts == moe_layers * 16 * _numel((2 * 128, latent), (latent, 128))
    assert p.shared_experts == moe_layers * 2 * _numel((2 * 128, H), (H, 128))
    assert p.latent_proj == moe_layers * _numel((latent, H), (H, latent))
    routed_active = moe_layers * 2 * _numel((2 * 128, latent), (latent, 128))
    assert arch.active_params(spec) == (p.attention + p.dense_ffn + p.shared_experts
                                        + routed_active + p.router + p.lm_head + p.latent_proj)


def _budget(**over) -> memory.GpuBudget:
    base = dict(capacity_gib=100.0, reserved_gib=0.0, weights_gib=40.0, engram_gib=0.0,
                workspace_gib=0.0, kv_min_gib=0.0, pool_in_hbm=False)
    return memory.GpuBudget(**{**base, **over})


def test_a_request_takes_its_state_whatever_its_length():
    state = 64 * 2 ** 20
    budget = _budget(kv_token_bytes=1000.0, state_bytes=state)
    free = budget.kv_gib * arch.GIB
    for tokens in (1, 1000, 100_000):
        assert budget.requests_at(tokens) == int(free / (1000 * tokens + state))
    assert _budget(state_bytes=state).requests_at(10 ** 6) == int(free / state)


def test_state_and_index_keys_per_gpu():
    """Per TP rank: KDA heads split; GQA K/V heads split (one per rank past kv_heads) while
    the one index-key head is whole on every rank."""
    spec = _spec()
    assert memory.state_bytes_per_gpu(spec, parse_shape("TP4"), 0) \
        == arch.state_bytes_per_request(spec) / 4
    sparse = _sparse_gqa(layers=[1, 2, 3])
    per_rank = (4 * 2 * 1 * 128 * 2  # K and V of 1 head on each of the 4 layers, BF16
                + 3 * 128 * 2)  # the index key of the 3 sparse layers, BF16
    assert memory.kv_bytes_per_token_per_gpu(sparse, parse_shape("TP8"), "bf16") == per_rank


def _sparse_gqa(layers: list[int] | None = None) -> ModelSpec:
    return _spec(
        architecture="MiniMaxM3SparseForConditionalGeneration", layers=4, dense_layers=0,
        linear_attention=None, moe=None,
        attention={"kind": "gqa", "heads": 16, "kv_heads": 4, "head_dim": 128,
                   "indexer": {"heads": 4, "head_dim": 128, "topk": 16, "block": 128,
                               "layers": layers, "key_cache": "bf16"}})


@pytest.fixture(scope="module")
def h200():
    return context(load_inputs(EXAMPLE / "deployment.yaml"), 8)


def test_linear_attention_decode_does_not_grow_with_context(h200):
    ctx = dataclasses.replace(h200, model=_spec())
    shape = parse_shape("TP4")
    short, long = (decode_step(ctx, shape, 16, kv).breakdown for kv in (1024, 200_000))
    assert short["linear_attention"] == long["linear_attention"] > 0
    assert long["attention"] > short["attention"]


def test_linear_attention_prefill_is_linear_in_new_tokens():
    """Chunked: doubling the new tokens doubles the work, the state is read once a sequence."""
    a, b = (perf_ops.linear_attention_work(2, n, HEADS, D) for n in (4096, 8192))
    assert b.flops == 2 * a.flops
    assert b.nbytes - a.nbytes == 2 * 4096 * HEADS * D * 5 * 2  # q, k, v, gate, out in BF16


def test_sparse_layers_attend_top_k_blocks_only(h200):
    """Past 16 blocks of 128 tokens a sparse layer attends no more; its indexer still scores
    every token; a layer outside Indexer.layers attends to all of them."""
    shape = parse_shape("TP4")
    sparse = dataclasses.replace(h200, model=_sparse_gqa())
    at = {kv: decode_step(sparse, shape, 8, kv).breakdown for kv in (4096, 65536)}
    assert at[4096]["attention"] == at[65536]["attention"]
    assert at[65536]["indexer"] > at[4096]["indexer"]
    mixed = dataclasses.replace(h200, model=_sparse_gqa(layers=[1, 2, 3]))
    assert decode_step(mixed, shape, 8, 65536).breakdown["attention"] \
        > decode_step(mixed, shape, 8, 4096).breakdown["attention"]
    assert prefill_step(mixed, shape, 4096, 4096, 0).us > 0
