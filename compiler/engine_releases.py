"""The plan's engine choices under the vLLM release a target runs (issue 18).

The plan's kernels are chosen for serving.vllm_version (compiler.resolve, from that release's
fact set). A target whose image runs another release (Dynamo 1.6.1's worker imports vLLM 0.31:
catalog/engines/dynamo.yaml worker.vllm) gets, per instance, the same choice where that
release's fact set (catalog/engines/vllm-<release>.yaml) has it, else that release's own pick
by the same rules (a `rule:engine-release` decision says why), or a refusal that names both
releases and the fact. Serving-wide settings (attention backend and kernel block, linear
backend, speculative options, the checkpoint's FP4 format, the KV connectors) are not
re-picked: the router and every instance share them, so a release that lacks one refuses; so
does one whose memory, Engram or pipeline facts differ, since the plan was sized by them, and
for an instance that offloads weights, one whose offload facts differ or lack its backend.
"""

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from compiler import engine_choices, engine_policy
from compiler.catalog.engine import Vllm, release_of
from compiler.choice import Choice
from compiler.plan import Decision, Instance, ReleaseKernels
from compiler.resolve import Resolved, is_multi_node_nvlink

if TYPE_CHECKING:
    from compiler.load import Inputs

RULE = "rule:engine-release"


@dataclass(frozen=True)
class ReleaseRun:
    kernels: list[ReleaseKernels]
    refused: str | None
    decisions: list[Decision]


def _versions(plan: Vllm, run: Vllm) -> str:
    return f"vLLM {plan.version} (the plan's) and vLLM {run.version} (the target's)"


# Fact classes the plan's sizes and layout were derived from (memory budget, Engram
# placement, pipeline stages): a release whose values differ cannot run the plan's numbers.
SIZED_BY = ("memory", "engram", "pipeline")


def sized_refusal(plan: Vllm, run: Vllm) -> str | None:
    """Why the plan's sizes do not hold under `run` (None: its facts' values are the plan's)."""
    for name in SIZED_BY:
        ours, theirs = (getattr(v, name).model_dump(mode="json") for v in (plan, run))
        for key in sorted(ours):
            if ours[key]["value"] != theirs[key]["value"]:
                return (f"vLLM {run.version}'s {name}.{key} is {theirs[key]['value']} "
                        f"({theirs[key]['source']}), the plan was sized for "
                        f"{ours[key]['value']}; {_versions(plan, run)}")
    return None


def serving_refusal(r: Resolved, architecture: str, speculative: str | None,
                    run: Vllm) -> str | None:
    """Why `run` cannot serve the plan's serving-wide choices (None: it can)."""
    plan, both = r.engines.vllm, _versions(r.engines.vllm, run)
    backend, block = r.attention_backend.value, r.block_size.value
    names = {n for p in run.attention.select for n in (p.blackwell, p.hopper)}
    if backend not in names:
        return (f"serving.attention_backend {backend} is not among vLLM {run.version}'s "
                f"attention backends ({run.attention.select[0].source}); {both}")
    kernel = run.attention.kernel_block_sizes.get(backend)
    if kernel and not any(block % k == 0 for k in kernel.value):
        return (f"serving.block_size {block} is no multiple of {backend}'s kernel blocks "
                f"{kernel.value} in vLLM {run.version} ({kernel.source}); {both}")
    linear = r.linear_backend.value
    if linear and linear not in run.linear.backends.value:
        return (f"serving.linear_backend {linear} is not in vLLM {run.version}'s "
                f"--linear-backend names ({run.linear.backends.source}); {both}")
    theirs = run.moe.fp4_format.get(architecture, run.moe.fp4_format_default)
    if r.expert_format.value in ("mxfp4", "nvfp4") and r.expert_format.value != theirs.value:
        return (f"{architecture}'s FP4 experts load as {theirs.value} in vLLM {run.version} "
                f"({theirs.source}), as {r.expert_format.value} in the plan's; {both}")
    if speculative is not None:
        ours = plan.speculative.options.get(speculative)
        other = run.speculative.options.get(speculative)
        if (ours and ours.value) != (other and other.value):
            return (f"serving.speculative {speculative}'s options "
                    f"{ours.value if ours else {}} are not vLLM {run.version}'s "
                    f"{other.value if other else {}} ({(other or ours).source}); {both}")
    return None


def hybrid_refusal(inputs: "Inputs", run: Vllm, instances: list[Instance]) -> str | None:
    """Why `run` would run another KV block than the plan's engines and router (None: it runs
    the same), for a model whose linear-attention state sizes the block."""
    r, tps = inputs.resolved, [i.tp for i in instances]
    ours = r.block_for(tps).value
    theirs = engine_choices.served_block(r.block_size, r.hybrid_in(run, inputs.model.spec),
                                         tps).value
    if ours == theirs:
        return None
    return (f"vLLM {run.version} raises the KV block to {theirs} tokens, the plan's engines "
            f"and router run {ours} ({run.attention.hybrid_mla_block.source}); "
            f"{_versions(r.engines.vllm, run)}")


def _connector_refusal(instance: Instance, plan: Vllm, run: Vllm) -> str | None:
    c = run.kv_connectors
    known = {c.disaggregated.value, c.disaggregated_pipelined.value, c.store.value}
    for name in instance.kv_connectors:
        if name not in known:
            return (f"instances[{instance.id}] hands KV off by {name}, which vLLM "
                    f"{run.version} has no fact for ({c.disaggregated.source.split(' (')[0]}); "
                    f"{_versions(plan, run)}")
        ours, theirs = plan.kv_connectors.env.get(name), c.env.get(name)
        if (ours and ours.value) != (theirs and theirs.value):
            return (f"instances[{instance.id}]: {name} reads {theirs.value if theirs else []} "
                    f"in vLLM {run.version} ({(theirs or ours).source}), the targets set "
                    f"{ours.value if ours else []}; {_versions(plan, run)}")
    return None


def _offload_refusal(instance: Instance, plan: Vllm, run: Vllm) -> str | None:
    """An instance that offloads weights runs only where the release has its backend and
    offloads, schedules and buffers as the plan's release does (the plan was sized and timed
    by those facts)."""
    o = instance.weight_offload
    if o is None:
        return None
    if o.backend not in run.offload.backends.value:
        return (f"instances[{instance.id}] offloads weights with the {o.backend} backend, which "
                f"vLLM {run.version} lacks ({run.offload.backends.source}); "
                f"{_versions(plan, run)}")
    ours, theirs = (v.offload.model_dump(mode="json") for v in (plan, run))
    for key in sorted(ours):
        if key != "backends" and _values(ours[key]) != _values(theirs[key]):
            return (f"instances[{instance.id}] offloads weights, and vLLM {run.version}'s "
                    f"offload.{key} is not the plan's; {_versions(plan, run)}")
    return None


def _values(fact: dict) -> object:
    """A fact's value, or each value of a table of facts."""
    return fact["value"] if "value" in fact else {k: v["value"] for k, v in fact.items()}


def instance_kernels(r: Resolved, run: Vllm, instance: Instance, family: str, moe: bool,
                     multi: bool
                     ) -> tuple[ReleaseKernels | None, list[Choice], str | None]:
    """One instance under `run`'s release: its kernels where they differ (None: the plan's),
    the choices that differ, or why the release cannot run it."""
    nodes = len(instance.trays)
    a2a, changed = instance.all2all_backend, []
    if a2a is not None and a2a not in run.all2all.backends.value:
        pick = engine_policy.all2all(run, instance.role, nodes, multi)
        if pick.value not in run.all2all.backends.value:
            return None, [], (f"instances[{instance.id}]: --all2all-backend {a2a} is not in vLLM "
                              f"{run.version} ({run.all2all.backends.source}), nor a pick of "
                              f"its own; {_versions(r.engines.vllm, run)}")
        a2a = pick.value
        changed.append(dataclasses.replace(
            pick, why=f"vLLM {run.version} has no {instance.all2all_backend} "
                      f"({run.all2all.backends.source}); its own pick: {pick.why}"))
    env = engine_policy.all2all_env(run, a2a, nodes, multi).value
    backend, fmt = instance.moe_backend, r.expert_format.value
    if backend is not None and not engine_policy.moe_accepts(
            run, fmt, backend, engine_policy.batched(run, a2a)):
        pick = engine_policy.moe_backend(run, fmt, moe, family, a2a)
        if pick.value is None:
            return None, [], (f"instances[{instance.id}]: --moe-backend {backend} does not run "
                              f"{fmt} experts in vLLM {run.version} "
                              f"({run.moe.accepts[fmt].source}), which lists no backend of "
                              f"its own for them; {_versions(r.engines.vllm, run)}")
        backend = pick.value
        changed.append(dataclasses.replace(
            pick, why=f"vLLM {run.version} has no --moe-backend {instance.moe_backend} for "
                      f"{fmt} experts ({run.moe.accepts[fmt].source}); its own pick: "
                      f"{pick.why}"))
    same = (a2a, backend, env) == (instance.all2all_backend, instance.moe_backend,
                                   instance.env)
    kernels = None if same else ReleaseKernels(instance=instance.id, all2all_backend=a2a,
                                               moe_backend=backend, env=dict(sorted(env.items())))
    return kernels, changed, None


def release_run(inputs: "Inputs", target: str, version: str,
                instances: list[Instance]) -> ReleaseRun:
    """What target `target`'s vLLM `version` runs of the plan (nothing to change when it is
    the plan's own release)."""
    r, system, model = inputs.resolved, inputs.system, inputs.model.spec
    plan, spec = r.engines.vllm, r.speculative
    if release_of(version) == plan.version:
        return ReleaseRun([], None, [])
    run = r.engines.release(version)
    if run is None:
        return ReleaseRun([], f"rackc has no fact set for vLLM {version} (catalog/engines/"
                              f"vllm-<release>.yaml), so it cannot choose its flags; "
                              f"the plan's are vLLM {plan.version}'s", [])
    refused = serving_refusal(r, model.architecture, spec.method if spec else None, run) \
        or sized_refusal(plan, run) or hybrid_refusal(inputs, run, instances)
    kernels, decisions = [], []
    for i in sorted(instances, key=lambda i: i.id):
        if refused:
            break
        multi = is_multi_node_nvlink(system, len(i.trays))
        k, changed, refused = instance_kernels(r, run, i, system.gpu.family,
                                               model.moe is not None, multi)
        refused = refused or _connector_refusal(i, plan, run) or _offload_refusal(i, plan, run)
        kernels += [k] if k else []
        decisions += [Decision(path=f"site.engines.{target}.kernels[{i.id}].{c.path}",
                               value=str(c.value), source=RULE, why=c.why) for c in changed]
    return ReleaseRun([] if refused else kernels, refused, [] if refused else decisions)
