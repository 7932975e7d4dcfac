"""engine-matches-plan: every engine the bundle starts is one of the plan's instances and runs
with the plan's numbers. A bundle edited after compile (or written from another plan) starts
engines that the plan's memory map, batch sizing and prediction do not describe: a
--gpu-memory-utilization above the plan's eats the reserve vLLM's start-up check needs free
(bundle review 3, S3-11), a --speculative-config without the plan's sampling options drafts
greedily (S3-13), a missing --language-model-only loads the vision tower into HBM the plan gave
the KV cache (S3-15); a startup probe shorter than the cold start the plan sized restarts it
(S3-14); an image other than the plan's runs another vLLM (S3-03); weight offload flags other
than the instance's keep weights in HBM the plan gave the KV cache, or read them at another
cost than the plan predicted.

Engines are matched to instances by what the plan records: a launch script's folder is the
instance id (`vllm/<id>/<tray>.sh`), a DGD component is named by `Instance.workload`, a
LeaderWorkerSet by `<serving name>-<workload>` (compiler.names)."""

import json
from typing import Any

from compiler.names import leader_worker_set_name
from compiler.plan import Instance, Plan
from compiler.validate.finding import Finding
from compiler.validate.pods import Engine

RULE = "engine-matches-plan"
HINT = "compile again (rackc compile -o OUT) rather than editing the engines' flags"


def _instances(plan: Plan) -> dict[tuple[str, str], Instance]:
    """Each instance by where its engines run: its launch folder (`vllm/<id>/<tray>.sh`), its
    DynamoGraphDeployment component, its LeaderWorkerSet."""
    out = {}
    for i in plan.instances:
        out["script", i.id] = i
        out["DynamoGraphDeployment", i.workload] = i
        out["LeaderWorkerSet", leader_worker_set_name(plan.serving.name, i.workload)] = i
    return out


def _instance(by: dict[tuple[str, str], Instance], e: Engine) -> Instance | None:
    if e.group is None:
        parts = e.file.split("/")
        return by.get(("script", parts[-2])) if len(parts) >= 3 else None
    kind = e.group.obj.kind
    name = e.group.name if kind == "DynamoGraphDeployment" else e.group.obj.name
    return by.get((kind, name))


def _speculative(plan: Plan) -> dict[str, Any] | None:
    spec = plan.serving.speculative
    if spec is None:
        return None
    return {"method": spec.method, "num_speculative_tokens": spec.draft_tokens, **spec.options}


def _expected(plan: Plan, i: Instance) -> dict[str, str | None]:
    """Flag -> the plan's value (None: the flag must be absent)."""
    return {
        "--tensor-parallel-size": str(i.tp),
        "--data-parallel-size": str(i.dp) if i.dp > 1 else None,
        "--pipeline-parallel-size": str(i.pp) if i.pp > 1 else None,
        "--max-num-seqs": str(i.max_batch),
        "--max-num-batched-tokens": str(i.max_batched_tokens),
        "--max-model-len": str(plan.serving.max_model_len),
        "--block-size": str(plan.serving.block_size),
        "--gpu-memory-utilization": f"{i.gpu_memory_utilization:.2f}",
        **_offload(i),
    }


OFFLOAD_FLAGS = ("--offload-backend", "--cpu-offload-gb", "--cpu-offload-params",
                 "--offload-group-size", "--offload-num-in-group", "--offload-prefetch-step",
                 "--offload-params")


def _offload(i: Instance) -> dict[str, str | None]:
    """The instance's weight offload flags (the first parameter segment of a list); every
    offload flag absent when it offloads nothing, or where its backend ignores it."""
    want: dict[str, str | None] = dict.fromkeys(OFFLOAD_FLAGS)
    o = i.weight_offload
    if o is None:
        return want
    params = o.params[0] if o.params else None
    if o.backend == "uva":
        return want | {"--offload-backend": "uva", "--cpu-offload-gb": f"{o.gib_per_gpu:g}",
                       "--cpu-offload-params": params}
    return want | {"--offload-backend": "prefetch", "--offload-group-size": str(o.group_size),
                   "--offload-num-in-group": str(o.num_in_group),
                   "--offload-prefetch-step": str(o.prefetch_step), "--offload-params": params}


def _same(flag: str, got: str, want: str) -> bool:
    if flag in ("--gpu-memory-utilization", "--cpu-offload-gb"):
        try:
            return abs(float(got) - float(want)) < 5e-3
        except ValueError:
            return False
    return got == want


def _mismatches(plan: Plan, i: Instance, e: Engine) -> list[tuple[str, str]]:
    """(expected, got) for each flag that departs from the plan."""
    out = []
    for flag, want in _expected(plan, i).items():
        got = e.flag(flag)
        if want is None and got is not None:
            out.append((f"no {flag} (plan.yaml instances.{i.id})", f"{flag} {got}"))
        elif want is not None and (got is None or not _same(flag, got, want)):
            out.append((f"{flag} {want} (plan.yaml instances.{i.id})",
                        f"{flag} {got}" if got is not None else f"no {flag}"))
    if plan.serving.language_model_only != e.has("--language-model-only"):
        want = "--language-model-only" if plan.serving.language_model_only else \
            "no --language-model-only"
        out.append((f"{want} (plan.yaml serving.language_model_only)",
                    "present" if e.has("--language-model-only") else "absent"))
    spec, text = _speculative(plan), e.flag("--speculative-config")
    try:
        got_spec = json.loads(text) if text else None
    except ValueError:
        got_spec = text
    if got_spec != spec:
        out.append((f"--speculative-config {json.dumps(spec, sort_keys=True)} "
                    "(plan.yaml serving.speculative)", f"{text}"))
    return out


def _start_budget(plan: Plan, e: Engine) -> list[tuple[str, str]]:
    """S3-14: the engine waits for its cold start as long as the plan sized it, and a pod's
    startup probe waits at least as long (else the kubelet restarts a start that is still
    downloading)."""
    want = plan.site.model_cache.engine_ready_timeout_s
    got = e.env.get("VLLM_ENGINE_READY_TIMEOUT_S")
    out = []
    if got is not None and got != str(want):
        out.append((f"VLLM_ENGINE_READY_TIMEOUT_S={want} (plan.yaml "
                    "site.model_cache.engine_ready_timeout_s)",
                    f"VLLM_ENGINE_READY_TIMEOUT_S={got}"))
    if e.group is None:
        return out
    for c in e.group.spec.get("containers") or []:
        probe = c.get("startupProbe") if isinstance(c, dict) else None
        if isinstance(probe, dict):
            waits = int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10)) \
                + int(probe.get("initialDelaySeconds", 0))
            if waits < want:
                out.append((f"a startupProbe that waits at least the engine's {want} s cold "
                            "start", f"{waits} s (failureThreshold x periodSeconds)"))
    return out


def _image(plan: Plan, e: Engine) -> list[tuple[str, str]]:
    """S3-03: Dynamo's workers run the plan's Dynamo runtime (the vLLM its release imports),
    the other engines the plan's vLLM image."""
    if e.group is None:
        return []
    want = plan.site.images.dynamo if e.launcher == "dynamo" else plan.site.images.vllm
    got = {c.get("image") for c in e.group.spec.get("containers") or [] if isinstance(c, dict)}
    if want not in got:
        return [(f"image {want} (plan.yaml site.images)", ", ".join(sorted(map(str, got))))]
    return []


def engine_matches_plan(ctx: Any) -> list[Finding]:
    out = []
    engines = [e for b in ctx.bundles for e in b.engines] + ctx.scripts
    by = _instances(ctx.plan)
    for e in engines:
        i = _instance(by, e)
        if i is None:
            out.append(Finding(RULE, e.file, e.line, e.where, "an engine of one of the plan's "
                               "instances (by launch folder or workload name)", "none matches",
                               HINT))
            continue
        found = _mismatches(ctx.plan, i, e) + _start_budget(ctx.plan, e) + _image(ctx.plan, e)
        out += [Finding(RULE, e.file, e.line, e.where, want, got, HINT) for want, got in found]
    return out
