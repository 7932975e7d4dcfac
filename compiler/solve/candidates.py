"""Candidate engine shapes per role (the catalog's engine shapes, the user's, or a whole
family) and what one instance of each sustains at the SLO (compiler/perf/capacity.py)."""

from compiler.load import Inputs
from compiler.perf.capacity import Candidate, decode_candidate, prefill_candidate
from compiler.perf.serving import Workload
from compiler.precheck import Precheck
from compiler.shapes import Shape


def searched_kinds(inputs: Inputs, role: str, mode: str) -> tuple[str, ...]:
    """Shape families the solver searches (SYSTEM.md engine shapes): MoE models serve prefill
    and high-concurrency decode data-parallel with wide expert parallelism (DEPn) and the
    lowest-latency decode tensor-parallel (TPn); dense models are tensor-parallel throughout.
    Other families (TPnEPn) are used when pinned."""
    if not inputs.model.spec.moe:
        return ("TP",)
    if role == "decode" and mode == "latency":
        return ("TP",)
    return ("DEP",)


def searched_names(inputs: Inputs, role: str, mode: str, recipe_ok: bool = True
                   ) -> list[str] | None:
    """Shape names to search for `role`: the deployment's objective.shapes, else the system's
    engine shapes from the catalog (MoE models, while `recipe_ok`), else None (every shape
    of the family)."""
    user = getattr(inputs.deployment.spec.objective.shapes, role)
    if user is not None:
        return user
    recipe = inputs.system.engine_shapes
    if recipe is None or not inputs.model.spec.moe or not recipe_ok:
        return None
    if role == "decode" and mode == "latency":
        return recipe.latency.value
    return getattr(recipe, role).value


def _searched(inputs: Inputs, shapes: list[Shape], role: str, mode: str,
              recipe_ok: bool) -> list[Shape]:
    names = searched_names(inputs, role, mode, recipe_ok)
    if names is not None:
        return [s for s in shapes if s.name in names]
    return [s for s in shapes if s.kind in searched_kinds(inputs, role, mode)]


def uses_recipe(inputs: Inputs) -> bool:
    """Whether the catalog's engine shapes narrow the search for this deployment."""
    shapes = inputs.deployment.spec.objective.shapes
    return inputs.system.engine_shapes is not None and inputs.model.spec.moe is not None \
        and (shapes.prefill is None or shapes.decode is None)


def candidates(inputs: Inputs, pre: Precheck, w: Workload, hit: float, mode: str,
               prefill_gpus_guess: int, recipe_ok: bool = True) -> list[Candidate]:
    """Usable and unusable candidates (the latter with `why_not`), in a stable order."""
    out = []
    for shape in _searched(inputs, pre.feasible("prefill"), "prefill", mode, recipe_ok):
        out.append(prefill_candidate(inputs, shape, w, hit, prefill_gpus_guess))
    decode_shapes = _searched(inputs, pre.feasible("decode"), "decode", mode, recipe_ok)
    for shape in decode_shapes:
        out.append(decode_candidate(inputs, shape, w, 1 if mode == "latency" else None))
    return out
