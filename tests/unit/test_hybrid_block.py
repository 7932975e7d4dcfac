"""The KV block vLLM 0.33 runs for a hybrid model (compiler.engine_choices.hybrid_block),
against an oracle that recomputes vLLM's own arithmetic for Kimi K3 from its shapes:
platforms/interface.py _align_hybrid_block_size (the MLA page of one token, the KDA state page
of one layer on a rank, the alignment max(kernel block, --block-size, 128)), with the state
shapes of model_executor/layers/mamba/mamba_utils.py kda_state_shape and kda_state_dtype."""

from itertools import combinations
from math import ceil
from pathlib import Path

import pytest

from compiler import engine_choices
from compiler.choice import CAPABILITY, Choice
from compiler.load import load_inputs

KIMI = Path(__file__).resolve().parents[1] / "inputs" / "gb300-kimi-k3" / "deployment.yaml"
DEEPSEEK = Path(__file__).resolve().parents[2] / "examples" / "hgx-h200-deepseek-v3" / \
    "deployment.yaml"
HEADS, HEAD_DIM, CONV_KERNEL = 96, 128, 4  # config.json linear_attn_config
KV_LORA_RANK, ROPE_DIM = 512, 64
FLASHINFER_MLA_SMALLEST = 32  # get_supported_kernel_block_sizes -> [32, 64]


def vllm_block(tp: int, kv_bytes: int, given: int, draft_tokens: int = 0) -> int:
    """vLLM's block for Kimi K3 at `tp` ranks per DP rank, started with --block-size `given`."""
    conv = (3 * HEADS * HEAD_DIM // tp) * (CONV_KERNEL - 1 + draft_tokens) * 2  # BF16
    recurrent = (HEADS // tp) * HEAD_DIM * HEAD_DIM * 4  # FP32 ('auto' mamba_ssm_cache_dtype)
    mamba_page = conv + recurrent
    attention_page = (KV_LORA_RANK + ROPE_DIM) * kv_bytes  # one latent slot, any TP
    align = max(FLASHINFER_MLA_SMALLEST, given, 128)
    block = align * ceil(mamba_page / (align * attention_page))
    block = FLASHINFER_MLA_SMALLEST * ceil(block / FLASHINFER_MLA_SMALLEST)
    return block if given < block else given


@pytest.fixture(scope="module")
def kimi():
    return load_inputs(KIMI)


def test_kimi_k3_fp8_blocks_are_vllms(kimi):
    h = kimi.resolved.hybrid
    assert (h.page_bytes, h.kv_heads, h.alignment) == (576, 1, 128)
    # as vLLM 0.33 computes them (MambaSpec and MLAAttentionSpec page_size_bytes: 1628160,
    # 814080 and 407040 state bytes, 576 per token)
    expected = {4: 2944, 8: 1536, 16: 768}
    for tp, block in expected.items():
        assert vllm_block(tp, 1, 64) == block
        assert engine_choices.hybrid_block(h, tp, 64) == block


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("given", [64, 128, 1536, 4096])
@pytest.mark.parametrize("kv", [("fp8", 1), ("bf16", 2)])
@pytest.mark.parametrize("draft_tokens", [0, 3])
def test_the_rule_is_vllms_arithmetic(kimi, tp, given, kv, draft_tokens):
    dtype, kv_bytes = kv
    h = engine_choices.hybrid_facts(kimi.resolved.engines.vllm, kimi.model.spec,
                                    kimi.resolved.attention_backend.value, dtype, draft_tokens)
    assert engine_choices.hybrid_block(h, tp, given) == vllm_block(tp, kv_bytes, given,
                                                                   draft_tokens)


@pytest.mark.parametrize("tps", [tps for n in (1, 2, 3) for tps in
                                 combinations((1, 2, 4, 8, 16, 32), n)])
def test_every_instance_keeps_the_served_block(kimi, tps):
    """The block the engines are given is the largest any of them needs, and vLLM keeps it at
    every TP of the deployment: one block for the router."""
    r = kimi.resolved
    block = r.block_for(tps)
    assert block.value == max(vllm_block(tp, 1, r.block_size.value) for tp in tps)
    assert all(vllm_block(tp, 1, block.value) == block.value for tp in tps)
    assert (block.path, block.source) == ("serving.block_size", "rule:hybrid-block")
    assert f"--block-size {r.block_size.value} to TP{tps[0]}" in block.why


def test_a_written_block_vllm_raises_is_an_engine_capability_decision(kimi):
    r = kimi.resolved
    written = Choice("serving.block_size", 256, "user", "written in the deployment")
    raised = engine_choices.served_block(written, r.hybrid, [8, 16])
    assert (raised.value, raised.source) == (1536, CAPABILITY)
    kept = Choice("serving.block_size", 2048, "user", "written in the deployment")
    assert engine_choices.served_block(kept, r.hybrid, [8, 16]) is kept


def test_a_model_without_linear_attention_keeps_its_kernel_block():
    r = load_inputs(DEEPSEEK).resolved
    assert r.hybrid is None
    assert r.block_for([1, 8, 16]) is r.block_size
