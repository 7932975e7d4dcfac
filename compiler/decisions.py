"""Why the plan is what it is: every choice with its source (user, default, catalog, solver,
rule). Each pass makes its decisions where it makes the choice (resolve, the candidates, lower,
the host budget); this module only gathers them."""

from compiler.load import Inputs
from compiler.plan import Decision, Instance
from compiler.solve import Solution


def _given(inputs: Inputs, *path: str) -> bool:
    return tuple(path) in inputs.sources["deployment"].values


def _shapes_decision(inputs: Inputs, sol: Solution) -> Decision:
    searched = sorted({f"{c.role}:{c.shape.name}" for c in sol.problem.candidates})
    value = ", ".join(searched)
    if sol.problem.mode == "pinned":
        return Decision(path="objective.shapes", value=value, source="user",
                        why="the pinned instances")
    usable = sum(1 for c in sol.problem.candidates if c.requests_per_s > 0)
    space = (f"{len(searched)} candidates searched, {usable} of them able to meet the SLO; "
             f"{sol.counts.status} means over all of them")
    if _given(inputs, "spec", "objective", "shapes"):
        return Decision(path="objective.shapes", value=value, source="user",
                        why=f"written in the deployment ({space})")
    return Decision(path="objective.shapes", value=value, source="default",
                    why=f"every shape that fits, as `rackc check` lists them ({space})")


def _layout_decision(inputs: Inputs, sol: Solution) -> Decision:
    roles = sorted({c.role for c in sol.problem.candidates})
    value = inputs.resolved.layout
    if sol.problem.mode == "pinned":
        return Decision(path="objective.layout", value=value, source="user",
                        why="the pinned instances' roles: " + ", ".join(roles))
    source = "user" if _given(inputs, "spec", "objective", "layout") else "default"
    why = ("latency mode: disaggregated, batch-1 sessions on tensor-parallel decode"
           if sol.problem.mode == "latency" else
           "written in the deployment" if source == "user" else
           "aggregated and disaggregated serving both searched")
    return Decision(path="objective.layout", value=value, source=source,
                    why=f"{why} (roles searched: {', '.join(roles)})")


def _instance(inputs: Inputs, sol: Solution, inst: Instance) -> list[Decision]:
    c = next(x for x in sol.problem.candidates
             if x.shape.name == inst.shape and x.role == inst.role)
    if inst.id in {k.id for k in sol.problem.kept}:
        source, why = "rule:kept", ("kept from the running plan (--from): its GPUs are all "
                                    "still available")
    elif sol.problem.mode == "pinned":
        source, why = "user", "pinned in objective.instances"
    else:
        source = "solver"
        why = (f"goodput-maximal layout; one {inst.shape} {inst.role} instance sustains "
               f"{c.requests_per_s:.2f} requests/s at the SLO")
    out = [Decision(path=f"instances.{inst.id}", value=f"{inst.shape} on " + ",".join(inst.trays),
                    source=source, why=why)]
    if inst.role == "prefill":
        out.append(Decision(path=f"instances.{inst.id}.max_batched_tokens",
                            value=str(inst.max_batched_tokens), source="rule:prefill-chunk",
                            why=c.why))
    else:
        out.append(Decision(path=f"instances.{inst.id}.max_batch", value=str(inst.max_batch),
                            source="rule:slo-batch", why=c.why))
    return out


def decisions(inputs: Inputs, sol: Solution, instances: list[Instance],
              made: list[Decision]) -> list[Decision]:
    """`made`: the decisions lower and the host budget took while building the plan; one on
    a path resolve chose for replaces resolve's (the engines' KV block, set by their TPs)."""
    refined = {d.path for d in made}
    out = [c.decision() for c in inputs.resolved.choices() if c.path not in refined]
    out.append(_shapes_decision(inputs, sol))
    out.append(_layout_decision(inputs, sol))
    for inst in instances:
        out += _instance(inputs, sol, inst)
    return sorted(out + made, key=lambda d: d.path)
