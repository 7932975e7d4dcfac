"""`rackc import-hf`: a Hugging Face config.json to a rackc Model document."""

import json
import re
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import ValidationError

from schemas import ModelV1
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean


class _Config:
    """Reads keys of a config.json, remembering what was missing so all are reported at once."""

    def __init__(self, data: dict, file: str):
        self.data, self.file, self.missing = data, file, []

    def __call__(self, key: str, default: object = ...) -> object:
        if key in self.data:
            return self.data[key]
        if default is ...:
            self.missing.append(key)
            return 1
        return default


def _dtypes(c: _Config, kv: str = "bf16") -> dict:
    quant = (c("quantization_config", {}) or {}).get("quant_method", "")
    if quant == "fp8":
        return {"weights": "fp8", "experts": "fp8", "kv_cache": kv}
    if quant in ("mxfp4", "nvfp4", "modelopt_fp4"):
        return {"weights": "bf16", "experts": "fp4", "kv_cache": kv}
    return {"weights": "bf16", "experts": "bf16", "kv_cache": kv}


def _deepseek(c: _Config) -> dict:
    nope, rope = c("qk_nope_head_dim"), c("qk_rope_head_dim")
    attention = {"kind": "mla", "heads": c("num_attention_heads"),
                 "kv_heads": c("num_key_value_heads", c("num_attention_heads")),
                 "head_dim": nope + rope, "v_head_dim": c("v_head_dim"),
                 "kv_lora_rank": c("kv_lora_rank"), "qk_rope_head_dim": rope}
    if c("q_lora_rank", None):
        attention["q_lora_rank"] = c("q_lora_rank")
    if c("index_topk", None):
        attention["indexer"] = {"heads": c("index_n_heads"), "head_dim": c("index_head_dim"),
                                "topk": c("index_topk")}
    spec = {
        "dense_layers": c("first_k_dense_replace", 0),
        "dense_intermediate": c("intermediate_size"),
        "attention": attention,
        "moe": {"experts": c("n_routed_experts"), "top_k": c("num_experts_per_tok"),
                "shared_experts": c("n_shared_experts", 0),
                "expert_intermediate": c("moe_intermediate_size")},
        "dtypes": _dtypes(c, "fp8" if c("index_topk", None) else "bf16"),
    }
    if c("num_nextn_predict_layers", 0):
        spec["draft"] = {"method": "mtp", "layers": c("num_nextn_predict_layers")}
    return spec


def _gqa(c: _Config) -> dict:
    heads = c("num_attention_heads")
    return {"kind": "gqa", "heads": heads, "kv_heads": c("num_key_value_heads", heads),
            "head_dim": c("head_dim", None) or c("hidden_size") // heads}


def _qwen3_moe(c: _Config) -> dict:
    dense = len(c("mlp_only_layers", []) or [])
    return {"dense_layers": dense, "dense_intermediate": c("intermediate_size") if dense else 0,
            "attention": _gqa(c),
            "moe": {"experts": c("num_experts"), "top_k": c("num_experts_per_tok"),
                    "expert_intermediate": c("moe_intermediate_size")},
            "dtypes": _dtypes(c)}


def _glm4_moe(c: _Config) -> dict:
    spec = {"dense_layers": c("first_k_dense_replace", 0),
            "dense_intermediate": c("intermediate_size"), "attention": _gqa(c),
            "moe": {"experts": c("n_routed_experts"), "top_k": c("num_experts_per_tok"),
                    "shared_experts": c("n_shared_experts", 0),
                    "expert_intermediate": c("moe_intermediate_size")},
            "dtypes": _dtypes(c)}
    if c("num_nextn_predict_layers", 0):
        spec["draft"] = {"method": "mtp", "layers": c("num_nextn_predict_layers")}
    return spec


def _llama(c: _Config) -> dict:
    return {"dense_layers": c("num_hidden_layers"), "dense_intermediate": c("intermediate_size"),
            "attention": _gqa(c), "dtypes": _dtypes(c)}


def _gpt_oss(c: _Config) -> dict:
    attention = _gqa(c)
    kinds = c("layer_types", []) or []
    sliding = sum(1 for k in kinds if k == "sliding_attention")
    if sliding and c("sliding_window", None):
        attention.update(sliding_window=c("sliding_window"), sliding_layers=sliding)
    return {"attention": attention,
            "moe": {"experts": c("num_local_experts"), "top_k": c("num_experts_per_tok"),
                    "expert_intermediate": c("intermediate_size")},
            "dtypes": _dtypes(c)}


ARCHITECTURES: dict[str, Callable[[_Config], dict]] = {
    "DeepseekV3ForCausalLM": _deepseek,
    "DeepseekV32ForCausalLM": _deepseek,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "Glm4MoeForCausalLM": _glm4_moe,
    "LlamaForCausalLM": _llama,
    "GptOssForCausalLM": _gpt_oss,
}


def _error(file: str, code: str, path: str, expected: str, got: str, hint: str) -> CompileError:
    return CompileError([Diagnostic("error", code, file, 0, 0, path, expected, got, hint)])


def _read(path: Path, file: str) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _error(file, "E001", "", "an existing file", "no such file", "check the path") \
            from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(file, "E001", "", "a readable UTF-8 file", str(exc), "check the file") \
            from None
    except json.JSONDecodeError as exc:
        raise CompileError([Diagnostic("error", "E002", file, exc.lineno, exc.colno, "",
                                       "valid JSON", exc.msg, "check the file's syntax")]) from None
    if not isinstance(data, dict):
        raise _error(file, "E006", "", "a JSON object", type(data).__name__, "")
    return data


def _name(data: dict, path: Path) -> str:
    raw = str(data.get("_name_or_path") or path.parent.name or "model").split("/")[-1]
    name = re.sub(r"[^a-z0-9.-]+", "-", raw.lower()).strip("-.")
    return name or "model"


def import_hf(path: Path, file: str, name: str | None = None) -> str:
    """Model YAML text for the config at `path`; raises CompileError for what it cannot map."""
    data = _read(path, file)
    archs = data.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in ARCHITECTURES:
        raise _error(file, "E401", "architectures[0]", "a supported architecture", repr(arch),
                     did_you_mean(str(arch), ARCHITECTURES))
    c = _Config(data, file)
    hf_id = str(data.get("_name_or_path") or name or _name(data, path))
    spec = {"architecture": arch, "hf_id": hf_id, "hidden_size": c("hidden_size"),
            "layers": c("num_hidden_layers"), "vocab_size": c("vocab_size"),
            "tie_embeddings": bool(c("tie_word_embeddings", False)),
            "max_context_tokens": c("max_position_embeddings")}
    spec.update(ARCHITECTURES[arch](c))
    if c.missing:
        raise CompileError([Diagnostic("error", "E402", file, 0, 0, key, "this key",
                                       "nothing", f"{arch} configs carry `{key}`")
                            for key in sorted(set(c.missing))])
    spec["sources"] = {"": f"imported from {path.name} by rackc import-hf"}
    doc = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Model",
           "metadata": {"name": name or _name(data, path)}, "spec": spec}
    try:
        ModelV1.model_validate(doc)
    except ValidationError as exc:
        raise _error(file, "E403", "", "values rackc can model", str(exc).splitlines()[0],
                     "check the config's numbers") from None
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
