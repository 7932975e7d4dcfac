"""Why the plan is what it is: every choice with its source (user, default, solver, rule)."""

from compiler.load import Inputs
from compiler.plan import Decision, Instance
from compiler.solve import Solution


def _given(inputs: Inputs, *path: str) -> bool:
    return tuple(path) in inputs.sources["deployment"].values


def user_or_default(inputs: Inputs, value: object, why_default: str, *path: str) -> Decision:
    given = _given(inputs, *path)
    return Decision(path=".".join(path[1:]), value=str(value),
                    source="user" if given else "default",
                    why="written in the deployment" if given else why_default)


def _shapes_decision(inputs: Inputs, sol: Solution) -> Decision:
    searched = sorted({f"{c.role}:{c.shape.name}" for c in sol.problem.candidates})
    value = ", ".join(searched)
    if sol.problem.mode == "pinned":
        return Decision(path="objective.shapes", value=value, source="user",
                        why="the pinned instances")
    if sol.problem.recipe:
        recipe = inputs.system.engine_shapes
        return Decision(path="objective.shapes", value=value, source="rule:engine-shapes",
                        why=f"the engine shapes {inputs.system.name} serves with "
                            f"({recipe.prefill.source}; {recipe.decode.source})")
    if _given(inputs, "spec", "objective", "shapes"):
        return Decision(path="objective.shapes", value=value, source="user",
                        why="written in the deployment")
    return Decision(path="objective.shapes", value=value, source="default",
                    why="every shape of the model's family that fits (the system's usual "
                        "engine shapes, if any, could not serve this deployment)")


def decisions(inputs: Inputs, sol: Solution, instances: list[Instance]) -> list[Decision]:
    s = inputs.deployment.spec.serving
    out = [
        user_or_default(inputs, inputs.deployment.spec.objective.mode,
                         "throughput under the SLO is the default objective",
                         "spec", "objective", "mode"),
        user_or_default(inputs, s.kv_cache_dtype or inputs.model.spec.dtypes.kv_cache,
                         "the model's KV dtype", "spec", "serving", "kv_cache_dtype"),
        user_or_default(inputs, s.max_model_len or inputs.model.spec.max_context_tokens,
                         "the model's context length", "spec", "serving", "max_model_len"),
        user_or_default(inputs, s.engram_placement, "Engram tables live in HBM (SYSTEM.md)",
                         "spec", "serving", "engram_placement"),
        user_or_default(inputs, s.routing.policy,
                         "KV-aware routing: least uncached work (SYSTEM.md)",
                         "spec", "serving", "routing"),
    ]
    out.append(_shapes_decision(inputs, sol))
    for inst in instances:
        c = next(x for x in sol.problem.candidates
                 if x.shape.name == inst.shape and x.role == inst.role)
        if sol.problem.mode == "pinned":
            source, why = "user", "pinned in objective.instances"
        else:
            source = "solver"
            why = (f"goodput-maximal layout; one {inst.shape} {inst.role} instance sustains "
                   f"{c.requests_per_s:.2f} requests/s at the SLO")
        out.append(Decision(path=f"instances.{inst.id}", value=f"{inst.shape} on "
                            + ",".join(inst.trays), source=source, why=why))
        if inst.role == "decode":
            why = ("largest batch per DP rank whose per-user rate meets the SLO, within the KV "
                   "that fits" if sol.problem.mode != "pinned" else "the KV that fits")
            out.append(Decision(path=f"instances.{inst.id}.max_batch", value=str(inst.max_batch),
                                source="rule:slo-batch", why=why))
        else:
            out.append(Decision(path=f"instances.{inst.id}.max_batched_tokens",
                                value=str(inst.max_batched_tokens), source="rule:prefill-chunk",
                                why="16,384 tokens per device per prefill chunk "
                                    "(REFERENCE-DATA.md C1 V2)"))
    return sorted(out, key=lambda d: d.path)
