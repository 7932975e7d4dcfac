"""MiniMax M3 from its published config and vLLM 0.33's code: the catalog entry's parameters
against the vLLM recipe's checkpoint figures, and its KV bytes against the caches vLLM
allocates (models/minimax_m3/nvidia/model.py, common/indexer.py)."""

import pytest

from compiler import arch, catalog

SPEC = catalog.model("minimax-m3").spec

# vllm-project/recipes@8959cf6 models/MiniMaxAI/MiniMax-M3.yaml l.30-34: "427.04B total from
# safetensors metadata (BF16: 426.99B + F32: 46.3M)"; active "57 MoE layers x (4 routed + 1
# shared) x 56.6M + 60-layer attn 6.6B + 3 dense FFN 0.68B + embeddings 2.46B = 25.9B"
CHECKPOINT_B = 427.04
ACTIVE_B = 25.9
ROWS_B = {"expert": 0.0566, "attention": 6.6, "dense_ffn": 0.68, "embeddings": 2.46}

# config.json (aiconfigurator copy): 60 layers of 4 KV heads x 128 (K and V, BF16), one BF16
# index key of 128 in each of the 57 sparse layers
KV_BF16 = 60 * 2 * 4 * 128 * 2 + 57 * 128 * 2


def test_checkpoint_total_matches_the_recipe():
    """The language model and the vision tower: everything the safetensors hold (no MTP)."""
    p = arch.params(SPEC)
    assert (p.total + p.vision) / 1e9 == pytest.approx(CHECKPOINT_B, rel=0.01)
    assert arch.checkpoint_bytes(SPEC) / 1e9 == pytest.approx(2 * CHECKPOINT_B, rel=0.01)


def test_active_parameters_match_the_recipe():
    """The recipe counts both embedding tables as active; rackc's active count leaves the
    input embedding out (a lookup, not a matmul)."""
    p = arch.params(SPEC)
    assert (arch.active_params(SPEC) + p.embedding) / 1e9 == pytest.approx(ACTIVE_B, rel=0.01)


def test_recipe_rows():
    p = arch.params(SPEC)
    got = {"expert": arch.expert_params(SPEC), "attention": p.attention,
           "dense_ffn": p.dense_ffn, "embeddings": p.embedding + p.lm_head}
    for row, want in ROWS_B.items():
        assert got[row] / 1e9 == pytest.approx(want, rel=0.01), row


def test_kv_bytes_per_token_follow_vllms_caches():
    assert arch.kv_bytes_per_token(SPEC, "bf16") == KV_BF16
    # an FP8 KV cache halves K and V; the index key stays BF16 (indexer_kv_dtype)
    assert arch.kv_bytes_per_token(SPEC, "fp8") == KV_BF16 - 60 * 2 * 4 * 128
    assert arch.state_bytes_per_request(SPEC) == 0


def test_sparse_layers_attend_2048_tokens():
    ix = SPEC.attention.indexer
    assert ix.topk * ix.block == 2048
    assert len(ix.layers) == 57 and arch.indexer_layers(SPEC) == 57


def test_no_number_is_assumed():
    assert not any(v.startswith("assumed") for v in SPEC.sources.values())
