"""Pass 1's cross-field rules: what one input says against another, or against the model,
that no schema can (the model's attention layout, the requests' lengths within its context,
speculative decoding against its draft layers, the pool, expert options, pins). Each problem is
a diagnostic at the field that states it; `compiler.load` collects them all.
"""

from compiler import catalog
from compiler.catalog.system import System
from schemas import DeploymentV1, ModelV1
from schemas.diagnostics import Diagnostic
from schemas.source import PathKey, SourceMap, format_path


def diag(src: SourceMap, path: PathKey, code: str, expected: str, got: str, hint: str,
         key: bool = False) -> Diagnostic:
    """An error at `path` of the file `src` maps."""
    pos = src.locate(path, prefer_key=key)
    return Diagnostic("error", code, src.file, pos.line, pos.column,
                      format_path(src.shown(path)), expected, got, hint)


def check_model(model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    """Architecture numbers that bound each other (each blamed on the one that is too large)."""
    spec, out = model.spec, []
    limits = [(("dense_layers",), spec.dense_layers, ("layers",), spec.layers),
              (("attention", "sliding_layers"), spec.attention.sliding_layers, ("layers",),
               spec.layers),
              (("attention", "kv_heads"), spec.attention.kv_heads, ("attention", "heads"),
               spec.attention.heads)]
    if spec.attention.qk_rope_head_dim is not None:
        limits.append((("attention", "qk_rope_head_dim"), spec.attention.qk_rope_head_dim,
                       ("attention", "head_dim"), spec.attention.head_dim))
    if spec.moe is not None:
        limits.append((("moe", "top_k"), spec.moe.top_k, ("moe", "experts"), spec.moe.experts))
    for path, value, bound_path, bound in limits:
        if value > bound:
            out.append(diag(src, ("spec", *path), "E104",
                             f"at most {format_path(bound_path)} ({bound})", str(value),
                             f"{path[-1]} cannot exceed {bound_path[-1]}"))
    dense = spec.layers if spec.moe is None else spec.dense_layers
    if dense and not spec.dense_intermediate:
        out.append(diag(src, ("spec", "dense_intermediate"), "E104",
                         f"the width of the dense FFN of {dense} layers", "0",
                         "give the config's intermediate_size (a model without experts runs "
                         "a dense FFN in every layer)"))
    return out + _check_csa(spec, src)


def _check_csa(spec, src: SourceMap) -> list[Diagnostic]:
    """Compressed sparse attention names layers: each must exist, and every layer needs a
    compression ratio."""
    a, out = spec.attention, []
    if (a.kind == "csa") != (a.kv_sharing is not None) or (a.kind == "csa" and not a.q_lora_rank):
        return [diag(src, ("spec", "attention", "kind"), "E104",
                      "csa together with kv_sharing and q_lora_rank", a.kind,
                      "compressed sparse attention (DeepSeek V4) needs both; other kinds neither")]
    named = []
    if a.kv_sharing is not None:
        sh = a.kv_sharing
        if len(sh.compress_ratios) < spec.layers:
            out.append(diag(src, ("spec", "attention", "kv_sharing", "compress_ratios"),
                             "E104", f"one ratio per layer ({spec.layers})",
                             str(len(sh.compress_ratios)), "list the config's compress_ratios"))
        named.append((("kv_sharing", "source_layers"), sh.source_layers))
    if a.indexer and a.indexer.source_layers is not None:
        ids = a.indexer.source_layers
        named.append((("indexer", "source_layers"), ids))
        if a.kind != "csa" and (not ids or min(ids) != 0 or len(set(ids)) != len(ids)):
            out.append(diag(src, ("spec", "attention", "indexer", "source_layers"), "E104",
                             "distinct layer ids from 0", str(ids)[:60],
                             "layer 0 runs its own indexer; the others reuse the last one "
                             "below them (the config's indexer_types 'full' layers)"))
    for path, ids in named:
        if ids and max(ids) >= spec.layers:
            out.append(diag(src, ("spec", "attention", *path), "E104",
                             f"layer ids below layers ({spec.layers})", str(max(ids)),
                             "layer ids count from 0"))
    return out


def _check_images(w, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    if not w.images_per_request:
        return []
    vision = model.spec.vision
    if vision is None:
        return [diag(src, ("spec", "workload", "images_per_request"), "E105",
                      "a model with a vision tower", f"{w.images_per_request:g}",
                      f"{model.metadata.name} reads text only: set 0")]
    if w.tokens_per_image is None:
        return [diag(src, ("spec", "workload", "images_per_request"), "E104",
                      "workload.tokens_per_image beside it", "no tokens_per_image",
                      "give the mean tokens an image becomes (pixels / (patch x merge)^2)")]
    cap = vision.max_tokens_per_image
    if cap and w.tokens_per_image > cap:
        return [diag(src, ("spec", "workload", "tokens_per_image"), "E104",
                      f"at most the model's {cap} tokens per image", str(w.tokens_per_image),
                      "its processor resizes larger images down to the cap")]
    return []


def check_serving(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    """The deployment's cross-field rules against the model: lengths, images, speculative
    decoding, the pool, expert options and pinned batch limits."""
    return [*_check_lengths(dep, model, src), *_check_images(dep.spec.workload, model, src),
            *_check_speculative(dep, model, src), *_check_pool(dep, src),
            *_check_experts(dep, model, src), *_check_pin_limits(dep, src)]


def _check_lengths(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    out = []
    serving, mspec = dep.spec.serving, model.spec
    if serving.max_model_len and serving.max_model_len > mspec.max_context_tokens:
        out.append(diag(src, ("spec", "serving", "max_model_len"), "E104",
                         f"at most the model's context ({mspec.max_context_tokens})",
                         str(serving.max_model_len), "lower max_model_len"))
    length = serving.max_model_len or mspec.max_context_tokens
    w = dep.spec.workload
    profile = catalog.workload(w.profile)
    if w.isl is not None or w.osl is not None:
        isl = w.isl if w.isl is not None else profile.isl.value
        osl = w.osl if w.osl is not None else profile.osl.value
        if isl + osl > length:
            field = "isl" if w.isl is not None else "osl"
            out.append(diag(src, ("spec", "workload", field), "E104",
                             f"isl + osl within the context ({length} tokens)",
                             f"{isl:g} + {osl:g}", "raise serving.max_model_len (up to the "
                             f"model's {mspec.max_context_tokens}) or shorten the requests"))
    elif profile.isl.value + profile.osl.value > length:
        out.append(diag(src, ("spec", "serving", "max_model_len"), "E104",
                         f"room for the {w.profile} profile's requests", f"{length} tokens",
                         "raise serving.max_model_len or set workload.isl/osl"))
    return out


def _check_speculative(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    out = []
    spec_cfg, mspec = dep.spec.serving.speculative, model.spec
    if spec_cfg and spec_cfg.acceptance > spec_cfg.draft_tokens + 1:
        out.append(diag(src, ("spec", "serving", "speculative", "acceptance"), "E104",
                         f"at most draft_tokens + 1 = {spec_cfg.draft_tokens + 1}",
                         str(spec_cfg.acceptance), "acceptance counts emitted tokens per step"))
    if spec_cfg and spec_cfg.method in ("mtp", "dspark") and (
            not mspec.draft or mspec.draft.method != spec_cfg.method):
        have = mspec.draft.method if mspec.draft else "none"
        out.append(diag(src, ("spec", "serving", "speculative", "method"), "E105",
                         f"the model's built-in draft ({have})", repr(spec_cfg.method),
                         f"{model.metadata.name} has no {spec_cfg.method} layers"))
    return out


def _check_pool(dep: DeploymentV1, src: SourceMap) -> list[Diagnostic]:
    out = []
    pool = dep.spec.serving.kv_pool
    if pool and pool.dram and pool.dram_fraction == 0:
        out.append(diag(src, ("spec", "serving", "kv_pool", "dram_fraction"), "E104",
                         "a share above 0 for a DRAM pool that is on", "0",
                         "raise dram_fraction, or set `dram: false`"))
    if pool and pool.hbm and not pool.dram:
        out.append(diag(src, ("spec", "serving", "kv_pool", "hbm"), "E105",
                         "the HBM pool on top of the DRAM pool", "hbm without dram",
                         "set `dram: true`: the HBM segments join the DRAM store"))
    return out


def _check_experts(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    out = []
    serving, mspec = dep.spec.serving, model.spec
    if serving.redundant_experts and mspec.moe is None:
        out.append(diag(src, ("spec", "serving", "redundant_experts"), "E105",
                         "redundant experts for a mixture-of-experts model",
                         str(serving.redundant_experts),
                         f"{mspec.architecture} has no routed experts: remove the field"))
    offload = serving.weight_offload
    if offload and offload.experts_only and mspec.moe is None:
        out.append(diag(src, ("spec", "serving", "weight_offload", "experts_only"), "E105",
                         "expert offload for a mixture-of-experts model", "true",
                         f"{mspec.architecture} has no routed experts: set `experts_only: "
                         "false`"))
    return out


def _check_pin_limits(dep: DeploymentV1, src: SourceMap) -> list[Diagnostic]:
    """Instances of one role and shape share one engine configuration."""
    out = []
    limits: dict[tuple[str, str], tuple] = {}
    for j, pin in enumerate(dep.spec.objective.instances):
        mine = (pin.max_batch, pin.max_batched_tokens)
        if limits.setdefault((pin.role, pin.shape), mine) != mine:
            out.append(diag(src, ("spec", "objective", "instances", j), "E105",
                             f"the batch limits of the other {pin.role} {pin.shape} entry",
                             f"max_batch {pin.max_batch}, max_batched_tokens "
                             f"{pin.max_batched_tokens}",
                             "instances of one role and shape share one engine "
                             "configuration: give them the same limits, or merge the entries"))
    return out


def check_fleet_objective(dep: DeploymentV1, systems: list[System],
                          src: SourceMap) -> list[Diagnostic]:
    """E211: pinned counts on a mixed fleet are refused. Every group is solved with the whole
    deployment, so each would place every pin (the counts multiplied by the groups), and no
    rule says which group an entry belongs to."""
    obj = dep.spec.objective
    if obj.mode != "pinned" or len(systems) < 2:
        return []
    return [diag(src, ("spec", "objective", "mode"), "E211",
                  "a goodput mode (throughput, latency) on a mixed fleet; `pinned` on one system",
                  f"mode pinned over {len(systems)} groups "
                  f"({', '.join(s.name for s in systems)})",
                  "let the solver size each group (mode throughput), or pin each group's "
                  "instances in its own deployment of a one-system Cluster")]


def check_objective(dep: DeploymentV1, src: SourceMap) -> list[Diagnostic]:
    obj = dep.spec.objective
    if obj.mode == "pinned" and not obj.instances:
        return [diag(src, ("spec", "objective", "mode"), "E209", "`instances:` with mode pinned",
                      "no instances", "list {role, shape, count} entries under objective")]
    if obj.mode != "pinned" and obj.instances:
        return [diag(src, ("spec", "objective", "instances"), "E209",
                      "instances only with `mode: pinned`", f"mode {obj.mode}",
                      "set `mode: pinned` or remove `instances`", key=True)]
    roles = {i.role for i in obj.instances}
    if "aggregated" in roles and roles - {"aggregated"}:
        return [diag(src, ("spec", "objective", "instances"), "E209",
                      "either aggregated instances or prefill + decode", "both",
                      "disaggregated serving needs prefill and decode; aggregated neither")]
    if roles and "aggregated" not in roles and roles != {"prefill", "decode"}:
        missing = ({"prefill", "decode"} - roles).pop()
        return [diag(src, ("spec", "objective", "instances"), "E209",
                      "prefill and decode instances", f"no {missing}",
                      f"add a {missing} entry, or use role aggregated")]
    return []
