"""Kimi K3 from its published config and vLLM 0.33's code: the catalog entry's parameters
against the vLLM recipe's count, its KV bytes per token (24 MLA layers) and its KDA state per
request against the state tensors vLLM allocates (model_executor/layers/mamba/mamba_utils.py
kda_state_shape and kda_state_dtype)."""

import math

import pytest

from compiler import arch, catalog

SPEC = catalog.model("kimi-k3").spec

# vllm-project/recipes@8959cf6 models/moonshotai/Kimi-K3.yaml l.34 parameter_count "2.8T"
# (the recipe gives no active count: "16 experts/token + shared (of 896 routed)")
TOTAL_T = 2.8

# config.json linear_attn_config: 96 KDA heads of 128, conv width 4, in 69 layers; kv_lora_rank
# 512 + qk_rope_head_dim 64 per MLA layer, in the other 24
KDA_LAYERS, MLA_LAYERS = 69, 24
RECURRENT = math.prod((96, 128, 128)) * 4  # FP32 (kda_state_dtype 'auto')
CONV = math.prod((3 * 96 * 128, 4 - 1)) * 2  # the model dtype, BF16


def test_total_parameters_match_the_recipe():
    p = arch.params(SPEC)
    assert (p.total + p.vision) / 1e12 == pytest.approx(TOTAL_T, rel=0.01)


def test_kv_bytes_per_token_are_the_mla_layers_only():
    assert arch.kv_bytes_per_token(SPEC, "fp8") == MLA_LAYERS * (512 + 64)
    assert arch.kv_bytes_per_token(SPEC, "bf16") == MLA_LAYERS * (512 + 64) * 2


def test_kda_state_per_request_follows_vllms_tensors():
    assert arch.state_bytes_per_request(SPEC) == KDA_LAYERS * (RECURRENT + CONV)
    # verifying k draft tokens keeps k more convolution inputs (kda_state_shape num_spec)
    assert arch.state_bytes_per_request(SPEC, 3) - arch.state_bytes_per_request(SPEC) \
        == KDA_LAYERS * 3 * 96 * 128 * 3 * 2


def test_layers_split_as_the_config_says():
    assert arch.linear_layers(SPEC) == KDA_LAYERS
    assert arch.attention_layers(SPEC) == MLA_LAYERS
    mla = sorted(set(range(SPEC.layers)) - set(SPEC.linear_attention.layers))
    assert mla == [*range(3, 92, 4), 92]  # full_attn_layers 4, 8, ..., 92, 93 counted from 1


def test_no_number_is_assumed():
    assert not any(v.startswith("assumed") for v in SPEC.sources.values())
