"""DeepSeek-V4.1-Flash from its published config and vLLM 0.33's code: the catalog entry's
parameter and byte totals against the vLLM recipe's checkpoint table, and its KV bytes against
the cache records vLLM allocates."""

import pytest

from compiler import arch, catalog

GIB = arch.GIB
SPEC = catalog.model("deepseek-v4.1-flash").spec

# vllm-project/recipes models/deepseek-ai/DeepSeek-V4.1-Flash.yaml, guide "Memory": the
# checkpoint's entries (billions) and stored GiB per component, about 511 GB (476 GiB) in all.
RECIPE = {
    "experts": (557.2, 259.5),  # routed + DSpark experts (MXFP4)
    "engram": (196.6, 183.1),  # Engram tables (FP8)
    "linears": (7.4, 6.9),  # attention, dense projections (FP8)
    "bf16": (2.0, 3.9),  # embedding + LM head (BF16), norms (FP32)
    "scales": (23.6, 21.9),  # UE8M0 block scales
}
RECIPE_TOTAL_GIB = 476


def _breakdown() -> dict[str, tuple[float, float]]:
    """The recipe's rows recomputed from the entry: (entries, bytes)."""
    s, p = SPEC, arch.params(SPEC)
    h, d = s.hidden_size, s.draft
    shared = 3 * h * s.moe.expert_intermediate * s.moe.shared_experts
    quant_side, bf16_side = arch.csa_side_params(s)
    draft_quant = d.layers * (arch.attention_params_per_layer(s) + shared) + d.target_layers * h * h
    experts = p.routed_experts + p.draft_experts
    engram = arch.engram_entries(s)
    linears = (arch.csa_layer_params(s) * s.layers + quant_side + p.shared_experts
               + arch.engram_proj_params(s) + draft_quant)
    fp32 = arch.hc_params(s, s.layers + d.layers)
    routers = p.router + d.layers * h * d.experts
    bf16 = (p.embedding + p.lm_head + p.vision + routers + bf16_side
            + 2 * s.vocab_size * arch.DSPARK_MARKOV_RANK)
    scales = (experts + engram) / arch.MX_BLOCK + linears / arch.MX_BLOCK ** 2
    return {"experts": (experts, experts / 2), "engram": (engram, engram),
            "linears": (linears, linears), "bf16": (bf16 + fp32, 2 * bf16 + 4 * fp32),
            "scales": (scales, scales)}


@pytest.mark.parametrize("row", sorted(RECIPE))
def test_checkpoint_rows_match_the_recipe(row):
    entries, nbytes = _breakdown()[row]
    want_entries, want_gib = RECIPE[row]
    assert entries / 1e9 == pytest.approx(want_entries, rel=0.01)
    # the BF16/FP32 row: the recipe does not say which small tensors are FP32 (norms, the
    # hyper-connection mixes); counting only those FP32 leaves it 1.6% short
    assert nbytes / GIB == pytest.approx(want_gib, rel=0.02 if row == "bf16" else 0.01)


def test_checkpoint_total_matches_the_recipe():
    rows = _breakdown()
    assert sum(b for _, b in rows.values()) / GIB == pytest.approx(RECIPE_TOTAL_GIB, rel=0.01)
    # what the cold-start timeout reads (compiler/site.py) is that checkpoint
    assert arch.checkpoint_bytes(SPEC) / GIB == pytest.approx(RECIPE_TOTAL_GIB, rel=0.01)


def test_draft_is_about_14b_parameters():
    """Recipe: 'The drafter's experts add roughly 14B parameters to the load.'"""
    assert arch.params(SPEC).draft / 1e9 == pytest.approx(14, rel=0.05)


def test_active_parameters_per_output_and_per_prompt_token():
    """Recipe: '8B active per prompt token and 16B per output token': decode runs all 40
    layers; prefill runs the layers before the last KV source on every token."""
    assert arch.active_params(SPEC) / 1e9 == pytest.approx(16, rel=0.03)
    s = SPEC
    per_layer = arch.csa_layer_params(s) + arch.expert_params(s) * (s.moe.top_k + 1)
    encoder = max(s.attention.kv_sharing.source_layers)
    assert encoder * per_layer / 1e9 == pytest.approx(8, rel=0.07)


# vLLM 0.33 models/deepseek_v41/attention.py: on SM100 an fp8_ds_mla record is 512 FP8 dims +
# 16 UE8M0 scales = 528 B (l.131-137, 522); the FP8 indexer key 128 + 4 (l.107-109). Layers 2, 8
# and 14 keep one state per 2 tokens, layer 20 one per token (tokens_per_state, l.1221).
VLLM_FP8_KV_PER_TOKEN = 3 * (528 + 132) / 2 + (528 + 132)


def test_kv_bytes_per_token_follow_vllms_records():
    assert arch.kv_bytes_per_token(SPEC, "fp8") == pytest.approx(VLLM_FP8_KV_PER_TOKEN, rel=0.01)


def test_deepseeks_890_bytes_are_the_fp4_records_over_the_same_sources():
    """DeepSeek's 890 B of global KV per token (recipe) is vLLM's nvfp4_ds_mla record (288 B,
    attention.py l.523-527) plus the MXFP4 indexer key (68 B, l.103-106) over the same KV
    sources: the sharing, not the record, is what the entry encodes."""
    assert arch.csa_states_per_token(SPEC) * (288 + 68) == pytest.approx(890, rel=0.01)


def test_window_is_bounded_per_request():
    """Every layer keeps a 128-token window of 528 B records, whatever the context."""
    assert arch.kv_window_bytes_per_request(SPEC, "fp8") == 40 * 128 * 528


def test_engram_tables_follow_vllms_storage():
    """FP8 rows plus a UE8M0 scale per 32 (common/engram.py), 94.4 GiB a table."""
    assert arch.engram_bytes(SPEC) / GIB == pytest.approx(2 * 94.4, rel=0.001)


def test_no_number_is_assumed():
    assert not any(v.startswith("assumed") for v in SPEC.sources.values())
