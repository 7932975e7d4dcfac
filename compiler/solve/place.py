"""Phase 2 of the solve: which GPUs each instance takes (CP-SAT).

Sub-tray instances (DEP2, TP2, ...) take one aligned block of GPUs inside one tray; larger ones
take whole trays (TP8 on a 4-GPU tray: exactly two), all inside one NVLink domain (HGX: one
RDMA cluster). The objective keeps prefill and decode on separate trays where possible, packs
prefill from the first tray and decode from the last, and orders identical instances.
"""

from dataclasses import dataclass

from ortools.sat.python import cp_model

from compiler.plan import DomainMemory
from compiler.shapes import Shape
from compiler.solve.memory_map import total_gib
from compiler.solve.params import solver
from compiler.solve.problem import Problem

MIXED_TRAY_COST = 1000
SPAN_COST = 10


@dataclass(frozen=True)
class Wanted:
    """One instance to place."""

    role: str
    shape: Shape
    need: DomainMemory  # per memory domain of each of its GPUs


@dataclass
class PlaceVars:
    # instance -> list of (var, tray, gpus it covers)
    options: dict[int, list[tuple[cp_model.IntVar, str, tuple[str, ...]]]]
    in_domain: dict[tuple[int, str], cp_model.IntVar]


@dataclass(frozen=True)
class Placement:
    gpus: list[tuple[str, ...]]  # per wanted instance, in rank order
    status: str
    objective: float
    bound: float
    deterministic_seconds: float


def _blocks(gpus: list[str], size: int) -> list[tuple[str, ...]]:
    return [tuple(gpus[i:i + size]) for i in range(0, len(gpus) - size + 1, size)]


def add_options(m: cp_model.CpModel, p: Problem, wanted: list[Wanted]) -> PlaceVars:
    """One boolean per way an instance may sit: an aligned block of a tray, or a whole tray."""
    opts: dict[int, list] = {}
    per = p.domains[0].gpus_per_tray
    for i, w in enumerate(wanted):
        opts[i] = []
        for d in p.domains:
            for t in d.trays:
                gpus = p.gpus_of(t)
                blocks = _blocks(gpus, w.shape.gpus) if w.shape.gpus < per else [tuple(gpus)]
                for b, block in enumerate(blocks):
                    opts[i].append((m.new_bool_var(f"x[{i},{t},{b}]"), t, block))
    in_domain = {(i, d.id): m.new_bool_var(f"dom[{i},{d.id}]")
                 for i in range(len(wanted)) for d in p.domains}
    return PlaceVars(opts, in_domain)


def add_shape_on_trays(m: cp_model.CpModel, p: Problem, wanted: list[Wanted],
                       v: PlaceVars) -> None:
    """A sub-tray instance takes exactly one block; a larger one exactly gpus/tray whole trays
    (TP8 on 4-GPU trays: two; DEP16: four)."""
    per = p.domains[0].gpus_per_tray
    for i, w in enumerate(wanted):
        count = 1 if w.shape.gpus < per else w.shape.gpus // per
        m.add(sum(x for x, _, _ in v.options[i]) == count)


def add_one_nvlink_domain(m: cp_model.CpModel, p: Problem, wanted: list[Wanted],
                          v: PlaceVars) -> None:
    dom_of = {t: d.id for d in p.domains for t in d.trays}
    for i in range(len(wanted)):
        m.add_exactly_one(v.in_domain[i, d.id] for d in p.domains)
        for x, t, _ in v.options[i]:
            m.add_implication(x, v.in_domain[i, dom_of[t]])


def add_gpu_exclusive(m: cp_model.CpModel, v: PlaceVars) -> None:
    """Each GPU serves at most one instance."""
    covering: dict[str, list] = {}
    for opts in v.options.values():
        for x, _, gpus in opts:
            for g in gpus:
                covering.setdefault(g, []).append(x)
    for g in sorted(covering):
        m.add_at_most_one(covering[g])


def add_unavailable_unused(m: cp_model.CpModel, p: Problem, v: PlaceVars) -> None:
    down = set().union(*p.unavailable.values()) if p.unavailable else set()
    for opts in v.options.values():
        for x, _, gpus in opts:
            if down.intersection(gpus):
                m.add(x == 0)


def add_domain_memory(m: cp_model.CpModel, p: Problem, wanted: list[Wanted],
                      v: PlaceVars) -> None:
    """Every memory domain's weights + KV + Engram + pool + workspace within its capacity."""
    cap = p.hbm_gib / p.inputs.system.domains_per_gpu
    for i, w in enumerate(wanted):
        if total_gib(w.need) > cap + 1e-6:
            for x, _, _ in v.options[i]:
                m.add(x == 0)


def add_symmetry_breaking(m: cp_model.CpModel, p: Problem, wanted: list[Wanted],
                          v: PlaceVars) -> None:
    """Identical instances are interchangeable: order them by where they start."""
    index = gpu_index(p)
    starts = {i: sum(x * index[gpus[0]] for x, _, gpus in v.options[i])
              for i in range(len(wanted))}
    for i in range(len(wanted) - 1):
        a, b = wanted[i], wanted[i + 1]
        if (a.role, a.shape) == (b.role, b.shape):
            m.add(starts[i] <= starts[i + 1])


def gpu_index(p: Problem) -> dict[str, int]:
    gpus = [g for d in p.domains for t in d.trays for g in p.gpus_of(t)]
    return {g: k for k, g in enumerate(gpus)}


def add_objective(m: cp_model.CpModel, p: Problem, wanted: list[Wanted], v: PlaceVars) -> None:
    trays = [t for d in p.domains for t in d.trays]
    position = {t: k for k, t in enumerate(trays)}
    mixed = []
    for t in trays:
        roles = {}
        for role in ("prefill", "decode", "aggregated"):
            here = [x for i, w in enumerate(wanted) if w.role == role
                    for x, tt, _ in v.options[i] if tt == t]
            if here:
                r = m.new_bool_var(f"has[{t},{role}]")
                m.add_max_equality(r, here)
                roles[role] = r
        if len(roles) > 1:
            mix = m.new_bool_var(f"mixed[{t}]")
            m.add(sum(roles.values()) - 1 <= mix * len(roles))
            mixed.append(mix)
    last = len(trays) - 1
    placement = sum(x * (position[t] if w.role == "prefill" else last - position[t])
                    for i, w in enumerate(wanted) for x, t, _ in v.options[i])
    m.minimize(MIXED_TRAY_COST * sum(mixed) + SPAN_COST * _spans(m, wanted, v, position)
               + placement)


def _spans(m: cp_model.CpModel, wanted: list[Wanted], v: PlaceVars,
           position: dict[str, int]) -> cp_model.LinearExpr:
    """Trays between the first and last tray of each multi-tray instance: contiguous is best."""
    spans = []
    for i in range(len(wanted)):
        trays = {t for _, t, _ in v.options[i]}
        if sum(1 for _ in v.options[i]) == len(trays) and wanted[i].shape.gpus > len(
                v.options[i][0][2]):
            lo = m.new_int_var(0, len(position), f"lo[{i}]")
            hi = m.new_int_var(0, len(position), f"hi[{i}]")
            for x, t, _ in v.options[i]:
                m.add(lo <= position[t]).only_enforce_if(x)
                m.add(hi >= position[t]).only_enforce_if(x)
            spans.append(hi - lo)
    return sum(spans)


def place(p: Problem, wanted: list[Wanted]) -> Placement | None:
    m = cp_model.CpModel()
    v = add_options(m, p, wanted)
    add_shape_on_trays(m, p, wanted, v)
    add_one_nvlink_domain(m, p, wanted, v)
    add_gpu_exclusive(m, v)
    add_unavailable_unused(m, p, v)
    add_domain_memory(m, p, wanted, v)
    add_symmetry_breaking(m, p, wanted, v)
    add_objective(m, p, wanted, v)
    s = solver()
    status = s.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    chosen = []
    for i in range(len(wanted)):
        gpus = [g for x, _, block in v.options[i] if s.value(x) for g in block]
        chosen.append(tuple(sorted(gpus, key=gpu_index(p).__getitem__)))
    return Placement(chosen, s.status_name(status), s.objective_value, s.best_objective_bound,
                     round(s.deterministic_time, 3))
