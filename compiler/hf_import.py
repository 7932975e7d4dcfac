"""`rackc import-hf`: a Hugging Face config.json to a rackc Model document."""

import json
import re
from collections.abc import Callable
from pathlib import Path

import yaml
from pydantic import ValidationError

from compiler.input_checks import check_model
from schemas import ModelV1
from schemas.diagnostics import CompileError, Diagnostic, did_you_mean, shown
from schemas.reading import FileProblem, read_regular
from schemas.source import Document, SourceMap, decode_utf8, file_error
from schemas.validate import to_diagnostics

JSON_MAX_BYTES = 1 << 20  # a config.json is a few KiB (quantization module lists: tens)

_TYPES: dict[type, tuple[str, Callable[[object], bool]]] = {
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    bool: ("true or false", lambda v: isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    list: ("a list", lambda v: isinstance(v, list)),
    dict: ("an object", lambda v: isinstance(v, dict)),
}


class _Config:
    """Reads keys of a config.json, each checked against the type rackc needs; what is missing
    or mistyped is remembered so that all of it is reported at once (E402)."""

    def __init__(self, data: dict, file: str, problems: dict | None = None, prefix: str = ""):
        self.data, self.file, self.prefix = data, file, prefix
        self.problems: dict[str, tuple[str, str]] = {} if problems is None else problems

    def __call__(self, key: str, default: object = ..., kind: type = int) -> object:
        """The value of `key` (null counts as absent when there is a default), else the
        default; a missing or mistyped key is recorded and a harmless stand-in returned."""
        value = self.data.get(key)
        if value is None:
            if default is ...:
                self.problems.setdefault(self.prefix + key, ("this key", "nothing"))
                return kind() if kind is not int else 1
            return default
        expected, check = _TYPES[kind]
        if not check(value):
            self.problems.setdefault(self.prefix + key, (expected, shown(value)))
            return default if default is not ... and default is not None else \
                (kind() if kind is not int else 1)
        return value


def _dtypes(c: _Config, kv: str = "bf16") -> dict:
    quant = _Config(c("quantization_config", {}, dict), c.file, c.problems,
                    "quantization_config.")("quant_method", "", str)
    if quant == "fp8":  # vLLM's Fp8Config quantizes linear, MoE and attention layers only:
        # the embedding and the LM head stay in the checkpoint's BF16
        return {"weights": "fp8", "experts": "fp8", "kv_cache": kv, "embedding": "bf16"}
    if quant == "mxfp4":
        return {"weights": "bf16", "experts": "fp4", "kv_cache": kv, "scales": "mx"}
    if quant in ("nvfp4", "modelopt_fp4"):
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
            "head_dim": c("head_dim", None) or c("hidden_size") // max(heads, 1)}


def _qwen3_moe(c: _Config) -> dict:
    dense = len(c("mlp_only_layers", [], list))
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
    kinds = c("layer_types", [], list)
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
    "Qwen3ForCausalLM": _llama,  # dense Qwen3: Llama's layout plus per-head q/k RMSNorm
    "GptOssForCausalLM": _gpt_oss,
}


def _error(file: str, code: str, path: str, expected: str, got: str, hint: str) -> CompileError:
    return CompileError([Diagnostic("error", code, file, 0, 0, path, expected, got, hint)])


def _read(path: Path, file: str) -> dict:
    """The config's JSON object: a regular file of at most JSON_MAX_BYTES, UTF-8, valid JSON
    (numbers Python can hold, nesting the parser can follow), or CompileError."""
    try:
        text = decode_utf8(read_regular(path, JSON_MAX_BYTES), file)
        data = json.loads(text)
    except FileProblem as problem:
        raise file_error(problem, file) from None
    except json.JSONDecodeError as exc:
        raise CompileError([Diagnostic("error", "E002", file, exc.lineno, exc.colno, "",
                                       "valid JSON", exc.msg, "check the file's syntax")]) from None
    except RecursionError:
        raise _error(file, "E002", "", "valid JSON", "nesting too deep to parse",
                     "a config.json nests a few levels") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise _error(file, "E002", "", "valid JSON", shown(str(exc), 80),
                     "check the file's numbers") from None
    if not isinstance(data, dict):
        raise _error(file, "E006", "", "a JSON object", type(data).__name__, "")
    return data


def _name(data: dict, path: Path) -> str:
    given = data.get("_name_or_path")
    raw = (given if isinstance(given, str) and given else path.parent.name or "model")
    raw = raw.split("/")[-1]
    name = re.sub(r"[^a-z0-9.-]+", "-", raw.lower()).strip("-.")
    return name or "model"


# a Hub repository id as vLLM downloads it (huggingface_hub's repo-id rule, in short)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def _hub_id(data: dict, given: str | None, file: str) -> tuple[str, Diagnostic | None]:
    """The Model's hf_id: `--hf-id`, else the config's `_name_or_path` when it is a Hub id
    (owner/name; a local folder is not something vLLM can download), else E404."""
    if given is not None:
        if _HUB_ID.match(given):
            return given, None
        return "", Diagnostic("error", "E404", "<argument>", 0, 0, "--hf-id",
                              "a Hugging Face repository id OWNER/NAME", shown(given),
                              "e.g. --hf-id Qwen/Qwen3-8B")
    saved = data.get("_name_or_path")
    if isinstance(saved, str) and _HUB_ID.match(saved):
        return saved, None
    got = f"_name_or_path {shown(saved)}" if saved is not None else "no _name_or_path"
    return "", Diagnostic("error", "E404", file, 0, 0, "_name_or_path",
                          "a Hugging Face repository id (OWNER/NAME) for spec.hf_id", got,
                          "pass --hf-id OWNER/NAME, the repository vLLM downloads the "
                          "weights from (e.g. Qwen/Qwen3-8B)")


def import_hf(path: Path, file: str, name: str | None = None, hf_id: str | None = None) -> str:
    """Model YAML text for the config at `path`; raises CompileError for what it cannot map.
    `hf_id`: the Hub repository to serve (default: the config's `_name_or_path`)."""
    data = _read(path, file)
    archs = data.get("architectures") or []
    if not isinstance(archs, list):
        raise _error(file, "E402", "architectures", "a list", shown(archs),
                     'write e.g. "architectures": ["LlamaForCausalLM"]')
    arch = archs[0] if archs else None
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise _error(file, "E401", "architectures[0]", "a supported architecture", shown(arch),
                     did_you_mean(arch if isinstance(arch, str) else "", ARCHITECTURES))
    c = _Config(data, file)
    hf_id, no_id = _hub_id(data, hf_id, file)
    spec = {"architecture": arch, "hf_id": hf_id, "hidden_size": c("hidden_size"),
            "layers": c("num_hidden_layers"), "vocab_size": c("vocab_size"),
            "tie_embeddings": c("tie_word_embeddings", False, bool),
            "max_context_tokens": c("max_position_embeddings")}
    spec.update(ARCHITECTURES[arch](c))
    if c.problems or no_id:
        raise CompileError([Diagnostic("error", "E402", file, 0, 0, key, expected, got,
                                       f"{arch} configs carry `{key}`" if got == "nothing"
                                       else f"{arch} configs give `{key}` as {expected}")
                            for key, (expected, got) in sorted(c.problems.items())]
                           + ([no_id] if no_id else []))
    spec["sources"] = {"": f"imported from {path.name} by rackc import-hf"}
    doc = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Model",
           "metadata": {"name": name or _name(data, path)}, "spec": spec}
    _check_values(doc, data, file)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


# Model field -> the config keys it is read from (the first present is named in E403).
HF_KEYS = {
    "metadata.name": ("_name_or_path",), "spec.hf_id": ("_name_or_path",),
    "spec.hidden_size": ("hidden_size",), "spec.layers": ("num_hidden_layers",),
    "spec.vocab_size": ("vocab_size",), "spec.max_context_tokens": ("max_position_embeddings",),
    "spec.dense_layers": ("first_k_dense_replace", "mlp_only_layers", "num_hidden_layers"),
    "spec.dense_intermediate": ("intermediate_size",),
    "spec.attention.heads": ("num_attention_heads",),
    "spec.attention.kv_heads": ("num_key_value_heads", "num_attention_heads"),
    "spec.attention.head_dim": ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim",
                                "hidden_size"),
    "spec.attention.v_head_dim": ("v_head_dim",),
    "spec.attention.q_lora_rank": ("q_lora_rank",),
    "spec.attention.kv_lora_rank": ("kv_lora_rank",),
    "spec.attention.qk_rope_head_dim": ("qk_rope_head_dim",),
    "spec.attention.indexer.heads": ("index_n_heads",),
    "spec.attention.indexer.head_dim": ("index_head_dim",),
    "spec.attention.indexer.topk": ("index_topk",),
    "spec.attention.sliding_window": ("sliding_window",),
    "spec.attention.sliding_layers": ("layer_types",),
    "spec.moe.experts": ("n_routed_experts", "num_experts", "num_local_experts"),
    "spec.moe.top_k": ("num_experts_per_tok",),
    "spec.moe.shared_experts": ("n_shared_experts",),
    "spec.moe.expert_intermediate": ("moe_intermediate_size", "intermediate_size"),
    "spec.draft.layers": ("num_nextn_predict_layers",),
}


def _check_values(doc: dict, data: dict, file: str) -> None:
    """The Model's schema and cross-field rules, each failure named by the config key it came
    from (E403), all at once."""
    try:
        model = ModelV1.model_validate(doc)
    except ValidationError as exc:
        found = to_diagnostics(exc, Document(doc, SourceMap(file)), ModelV1)
    else:
        found = check_model(model, SourceMap(file))
    if not found:
        return
    out = []
    for d in found:
        keys = HF_KEYS.get(d.path, ())
        key = next((k for k in keys if k in data), d.path)
        out.append(Diagnostic("error", "E403", file, 0, 0, key, d.expected, d.got,
                              f"read into the Model's {d.path}"))
    raise CompileError(out)
