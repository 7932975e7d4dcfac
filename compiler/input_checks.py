"""Pass 1's cross-field rules: what one input says against another, or against the model,
that no schema can (the model's attention layout, the requests' lengths within its context,
speculative decoding against its draft layers, the pool, expert options, weight offload,
pins). Each problem is a diagnostic at the field that states it; `compiler.load` collects
them all.
"""

from compiler import catalog
from compiler.catalog.system import System
from compiler.resolve import PinnedPoint, pinned_point
from schemas import DeploymentV1, ModelV1
from schemas.deployment import MAX_BATCHED_TOKENS, PinnedInstances, WeightOffload
from schemas.diagnostics import Diagnostic
from schemas.source import PathKey, SourceMap, format_path

ROLES = ("prefill", "decode", "aggregated")


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
    if spec.moe is None and spec.dense_layers != spec.layers:
        out.append(diag(src, ("spec", "dense_layers"), "E104",
                         f"{spec.layers} (layers: a model without experts runs a dense FFN in "
                         "every layer)", str(spec.dense_layers),
                         f"write dense_layers: {spec.layers}, or give the model's moe block"))
    dense = spec.layers if spec.moe is None else spec.dense_layers
    if dense and not spec.dense_intermediate:
        out.append(diag(src, ("spec", "dense_intermediate"), "E104",
                         f"the width of the dense FFN of {dense} layers", "0",
                         "give the config's intermediate_size (a model without experts runs "
                         "a dense FFN in every layer)"))
    return out + _check_csa(spec, src) + _check_named_layers(spec, src)


def _check_named_layers(spec, src: SourceMap) -> list[Diagnostic]:
    """The sparse layers and the linear-attention layers: distinct ids of existing layers,
    and no layer both."""
    a, out = spec.attention, []
    named = [(("attention", "indexer", "layers"), a.indexer.layers if a.indexer else None),
             (("linear_attention", "layers"),
              spec.linear_attention.layers if spec.linear_attention else None)]
    for path, ids in named:
        if ids and (max(ids) >= spec.layers or len(set(ids)) != len(ids)):
            out.append(diag(src, ("spec", *path), "E104",
                             f"distinct layer ids below layers ({spec.layers})", str(ids)[:60],
                             "layer ids count from 0"))
    sparse, linear = (set(ids or ()) for _, ids in named)
    if sparse & linear:
        out.append(diag(src, ("spec", "linear_attention", "layers"), "E104",
                         "layers apart from the indexer's", str(sorted(sparse & linear))[:60],
                         "a layer runs linear attention or attention, not both"))
    return out


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
    decoding, the pool, expert options, weight offload and pinned batch limits."""
    return [*_check_lengths(dep, model, src), *_check_images(dep.spec.workload, model, src),
            *_check_speculative(dep, model, src), *_check_pool(dep, src),
            *_check_experts(dep, model, src), *_check_offload(dep, model, src),
            *_check_pin_limits(dep, src), *_check_operating_points(dep, model, src)]


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
    return out


def _written_offloads(dep: DeploymentV1) -> list[tuple[PathKey, WeightOffload]]:
    """Every weight offload the deployment writes, with its path: the deployment-wide one, each
    role's and each pinned entry's."""
    s = dep.spec.serving
    out: list[tuple[PathKey, WeightOffload]] = []
    if s.weight_offload:
        out.append((("spec", "serving", "weight_offload"), s.weight_offload))
    for role in ROLES:
        given = getattr(s.weight_offload_per_role, role, None)
        if given:
            out.append((("spec", "serving", "weight_offload_per_role", role), given))
    out += [(("spec", "objective", "instances", j, "weight_offload"), pin.weight_offload)
            for j, pin in enumerate(dep.spec.objective.instances) if pin.weight_offload]
    return out


PREFETCH_ONLY = ("group_size", "num_in_group", "prefetch_step")


def _check_offload(dep: DeploymentV1, model: ModelV1, src: SourceMap) -> list[Diagnostic]:
    """Each written offload names what its backend needs and nothing it ignores; vLLM refuses
    num_in_group above group_size (config/offload.py validate_offload_config)."""
    out = []
    for path, o in _written_offloads(dep):
        given = [name for name in ("gib_per_gpu", "experts_only", *PREFETCH_ONLY)
                 if (*path, name) in src.values]
        if o.backend == "none":
            out += [diag(src, (*path, name), "E105", "nothing beside `backend: none`", name,
                         "remove it, or choose backend uva or prefetch", key=True)
                    for name in given]
            continue
        if o.experts_only and model.spec.moe is None:
            out.append(diag(src, (*path, "experts_only"), "E105",
                            "expert offload for a mixture-of-experts model", "true",
                            f"{model.spec.architecture} has no routed experts: set "
                            "`experts_only: false`"))
        out += _check_uva(o, path, src) if o.backend == "uva" else \
            _check_prefetch(o, path, model, src)
    return out


def _check_uva(o: WeightOffload, path: PathKey, src: SourceMap) -> list[Diagnostic]:
    out = [diag(src, (*path, name), "E105", f"{name} only with backend prefetch", name,
                "set `backend: prefetch`, or remove it", key=True)
           for name in PREFETCH_ONLY if getattr(o, name) is not None]
    if o.gib_per_gpu is None:
        out.append(diag(src, path, "E102", "gib_per_gpu with backend uva", "no gib_per_gpu",
                        "add `gib_per_gpu:` (GiB of each GPU's weights kept in host memory)",
                        key=True))
    return out


def _check_prefetch(o: WeightOffload, path: PathKey, model: ModelV1,
                    src: SourceMap) -> list[Diagnostic]:
    if o.gib_per_gpu is None and o.group_size is None:
        return [diag(src, path, "E102", "gib_per_gpu or group_size with backend prefetch",
                     "neither", "give gib_per_gpu (rackc picks the layer groups) or "
                     "group_size", key=True)]
    if o.gib_per_gpu is not None and o.group_size is not None:
        return [diag(src, (*path, "group_size"), "E105", "gib_per_gpu or group_size, not both",
                     "both", "rackc picks the groups from gib_per_gpu; remove one", key=True)]
    if o.group_size is None:
        return [] if o.num_in_group is None else [
            diag(src, (*path, "num_in_group"), "E105", "num_in_group beside group_size",
                 "num_in_group with gib_per_gpu", "rackc picks both from gib_per_gpu; "
                 "give group_size instead of gib_per_gpu to choose them", key=True)]
    if o.group_size > model.spec.layers:
        return [diag(src, (*path, "group_size"), "E104",
                     f"at most the model's {model.spec.layers} layers", str(o.group_size),
                     "a longer group offloads no layer")]
    if (o.num_in_group or 1) > o.group_size:
        return [diag(src, (*path, "num_in_group"), "E104",
                     f"at most group_size ({o.group_size})", str(o.num_in_group),
                     "vLLM offloads the last num_in_group layers of each group")]
    return []


def _check_pin_limits(dep: DeploymentV1, src: SourceMap) -> list[Diagnostic]:
    """Instances of one role and shape share one engine configuration: batch limits and
    weight offload."""
    out = []
    limits: dict[tuple[str, str], tuple] = {}
    offloads: dict[tuple[str, str], WeightOffload | None] = {}
    hint = ("instances of one role and shape share one engine configuration: give them the "
            "same {}, or merge the entries")
    for j, pin in enumerate(dep.spec.objective.instances):
        mine = (pin.max_batch, pin.max_batched_tokens)
        if limits.setdefault((pin.role, pin.shape), mine) != mine:
            out.append(diag(src, ("spec", "objective", "instances", j), "E105",
                             f"the batch limits of the other {pin.role} {pin.shape} entry",
                             f"max_batch {pin.max_batch}, max_batched_tokens "
                             f"{pin.max_batched_tokens}", hint.format("limits")))
        if offloads.setdefault((pin.role, pin.shape), pin.weight_offload) != pin.weight_offload:
            out.append(diag(src, ("spec", "objective", "instances", j, "weight_offload"), "E105",
                             f"the weight offload of the other {pin.role} {pin.shape} entry",
                             str(pin.weight_offload.model_dump(exclude_defaults=True))
                             if pin.weight_offload else "none",
                             hint.format("weight_offload")))
    return out


def _check_operating_points(dep: DeploymentV1, model: ModelV1,
                            src: SourceMap) -> list[Diagnostic]:
    """A pinned entry's operating point against what it contradicts: an aggregated entry
    (both phases), a second point for the role, another entry of its role and shape (one
    engine configuration), a context beyond max_model_len, and batch limits below its step."""
    entries = dep.spec.objective.instances
    spec = dep.spec.serving.speculative
    draft = spec.draft_tokens if spec else 0
    length = dep.spec.serving.max_model_len or model.spec.max_context_tokens
    out, seen = [], set()
    for j, entry in enumerate(entries):
        point = pinned_point(j, entry)
        if point is None:
            continue
        at = ("spec", "objective", "instances", j, "operating_point")
        twins = [k for k, e in enumerate(entries)
                 if k != j and (e.role, e.shape) == (entry.role, entry.shape)]
        problem = _point_role(entry, at, src, point.role in seen, twins) or \
            _point_limits(entry, point, at, src, draft, length)
        seen.add(point.role)
        out += problem
    return out


def _point_role(entry: PinnedInstances, at: tuple, src: SourceMap, again: bool,
                twins: list[int]) -> list[Diagnostic]:
    if entry.role == "aggregated":
        return [diag(src, at, "E105", "an operating point on a prefill or decode entry",
                     "role aggregated", "an aggregated instance interleaves both phases: pin "
                     "prefill and decode entries to predict one phase alone", key=True)]
    if again:
        return [diag(src, at, "E105", "one operating point per role",
                     f"a second {entry.role} operating point",
                     f"keep the {entry.role} point on one entry", key=True)]
    if twins:
        return [diag(src, at, "E105", f"the only {entry.role} {entry.shape} entry",
                     f"also objective.instances[{twins[0]}]",
                     "instances of one role and shape share one engine configuration, which "
                     "the point sets: merge the entries", key=True)]
    if entry.role == "decode" and entry.operating_point.cached_share is not None:
        return [diag(src, (*at, "cached_share"), "E105", "cached_share on a prefill entry",
                     "a decode entry", "a decoding request attends over its whole context: "
                     "leave cached_share out", key=True)]
    return []


def _point_limits(entry: PinnedInstances, point: PinnedPoint, at: tuple, src: SourceMap,
                  draft: int, length: int) -> list[Diagnostic]:
    if point.context_tokens > length:
        return [diag(src, (*at, "context_tokens"), "E104",
                     f"at most serving.max_model_len ({length} tokens)",
                     str(point.context_tokens), "raise serving.max_model_len (up to the "
                     "model's context) or pin a shorter context")]
    if entry.max_batch is not None and entry.max_batch < point.batch_per_rank:
        return [diag(src, (*at, "batch_per_rank"), "E104",
                     f"at most the entry's max_batch ({entry.max_batch})",
                     str(point.batch_per_rank), "the engine runs at most max_batch requests "
                     "per rank: raise max_batch or leave it out (it then takes the point's)")]
    tokens = point.step_tokens(draft)
    what = (f"{point.batch_per_rank} requests x {1 + draft} tokens" if entry.role == "decode"
            else f"{point.batch_per_rank} prompts x {point.new_tokens} uncached tokens")
    limit = entry.max_batched_tokens or MAX_BATCHED_TOKENS
    if tokens > limit:
        named = f"the entry's max_batched_tokens ({limit})" if entry.max_batched_tokens \
            else f"{MAX_BATCHED_TOKENS} tokens per step (max_batched_tokens' bound)"
        lower = "batch_per_rank" if entry.role == "decode" else \
            "batch_per_rank or context_tokens"
        return [diag(src, (*at, "batch_per_rank"), "E104", f"a step within {named}",
                     f"{what} = {tokens} tokens", f"lower {lower}, or raise "
                     "max_batched_tokens: the point is one step of the engine")]
    return []


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
