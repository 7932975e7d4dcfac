"""Capacity per NVLink domain (rack) in CP-SAT, the same for 1 rack or 64.

A whole-tray instance must find all its trays in one domain, so the count model cannot treat
trays as interchangeable across racks. Racks with identical free hardware form a class; a class
of m racks gets one integer per *pattern* (how many whole-tray instances of each kind one rack
holds) saying how many of its racks use that pattern: exact, without symmetry between racks,
and of a size that does not grow with m. A rack touched by an `unavailable` entry is a class of
its own with direct counts, since which of its trays are free follows the requirement literals.
Sub-tray instances fill what is left (whole free trays, and the aligned free blocks of partly
available trays), summed over the fleet: they live inside one tray, hence one domain. For each
sub-tray size s, the instances of s GPUs or more fit the free aligned s-blocks (one instance of
g >= s GPUs covers g / s of them).
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.cpsat import cp_model
from compiler.solve.problem import Domain, Problem

MAX_PATTERNS = 4000  # beyond this a class falls back to direct per-rack counts


@dataclass(frozen=True)
class Item:
    """One kind of instance to fit: `trays` whole trays each, or `gpus` inside one tray."""

    trays: int  # 0: a sub-tray instance
    gpus: int


@dataclass
class Capacity:
    whole: list[int]  # indices of whole-tray items
    # per class of identical untouched racks: its domains and [(pattern, racks using it)]
    patterns: list[tuple[tuple[Domain, ...], list[tuple[tuple[int, ...], cp_model.IntVar]]]]
    direct: dict[str, dict[int, cp_model.IntVar]]  # domain id -> whole item -> count there


def down_gpus(p: Problem) -> set[str]:
    """GPUs no new instance may take: unavailable ones, and those kept instances hold."""
    down = set().union(*p.unavailable.values()) if p.unavailable else set()
    return down | p.occupied


def aligned_blocks_free(gpus: Sequence[str], down: set[str], size: int) -> int:
    """Aligned blocks of `size` GPUs of a tray with none of them down (a sub-tray instance
    takes one such block: compiler/solve/place.py)."""
    return sum(1 for k in range(0, len(gpus) - size + 1, size)
               if not down.intersection(gpus[k:k + size]))


def touched(p: Problem, d: Domain, down: set[str]) -> bool:
    return any(g in down for t in d.trays for g in p.gpus_of(t))


@functools.lru_cache(maxsize=64)
def patterns(trays: int, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every vector a with sum(a_j * sizes_j) <= trays, in lexicographic order (MAX_PATTERNS
    and one more at most); remembered, since every count model of a compile asks the same."""
    if not sizes:
        return ((),)
    out = []
    for a in range(trays // sizes[0] + 1):
        for rest in patterns(trays - a * sizes[0], sizes[1:]):
            out.append((a, *rest))
            if len(out) > MAX_PATTERNS:
                return tuple(out)
    return tuple(out)


def add_capacity(m: cp_model.CpModel, p: Problem, items: Sequence[Item],
                 counts: Sequence[cp_model.LinearExprT],
                 tray_free: dict[str, cp_model.LinearExprT]) -> Capacity:
    """counts[j] instances of items[j] fit the domains. `tray_free[t]` (a literal) says whether
    tray t of a touched rack is whole-tray usable; trays missing from it are free."""
    down = down_gpus(p)
    per = p.domains[0].gpus_per_tray
    whole = [j for j, it in enumerate(items) if it.trays]
    sizes = [items[j].trays for j in whole]
    classes: dict[int, list[Domain]] = {}
    direct_domains = []
    for d in p.domains:
        if touched(p, d, down):
            direct_domains.append(d)
        else:
            classes.setdefault(len(d.trays), []).append(d)
    cap = Capacity(whole, [], {})
    placed = {j: [] for j in whole}
    sub = [j for j, it in enumerate(items) if not it.trays]
    sizes_sub = sorted({items[j].gpus for j in sub})
    sub_room: dict[int, list] = {size: [] for size in sizes_sub}
    for ntrays, doms in sorted(classes.items()):
        pats = () if len(doms) == 1 else patterns(ntrays, tuple(sizes))
        if len(doms) == 1 or len(pats) > MAX_PATTERNS:
            direct_domains += doms
            continue
        ys = [(a, m.new_int_var(0, len(doms), f"racks[{doms[0].id},{k}]"))
              for k, a in enumerate(pats)]
        m.add(sum(y for _, y in ys) == len(doms))
        for col, j in enumerate(whole):
            placed[j] += [a[col] * y for a, y in ys if a[col]]
        for size in sizes_sub:
            sub_room[size] += [per * (ntrays - sum(x * s for x, s in zip(a, sizes, strict=True)))
                               * y for a, y in ys]
        cap.patterns.append((tuple(doms), ys))
    for d in sorted(direct_domains, key=lambda d: p.domains.index(d)):
        free = [tray_free.get(t, 1) for t in d.trays]
        here = {j: m.new_int_var(0, len(d.trays) // items[j].trays, f"w[{j},{d.id}]")
                for j in whole}
        used = sum(here[j] * items[j].trays for j in whole)
        m.add(used <= sum(free))
        for j in whole:
            placed[j].append(here[j])
        for size in sizes_sub:
            partial = [(1 - f) * size * aligned_blocks_free(p.gpus_of(t), down, size)
                       for t, f in zip(d.trays, free, strict=True) if t in tray_free]
            sub_room[size].append(per * (sum(free) - used) + sum(partial))
        cap.direct[d.id] = here
    for j in whole:
        m.add(counts[j] == sum(placed[j]))
    for size in sizes_sub:
        m.add(sum(counts[j] * items[j].gpus for j in sub if items[j].gpus >= size)
              <= sum(sub_room[size]))
    return cap


def split(p: Problem, items: Sequence[Item], totals: Sequence[int], cap: Capacity,
          s: cp_model.CpSolver) -> dict[str, dict[int, int]]:
    """Instances per domain after a solve: whole-tray ones as the solver chose (the racks of a
    class take its patterns in order), sub-tray ones filling what is left, domain by domain."""
    down = down_gpus(p)
    per = p.domains[0].gpus_per_tray
    out: dict[str, dict[int, int]] = {d.id: {} for d in p.domains}
    for doms, ys in cap.patterns:
        racks = iter(doms)
        for a, y in ys:
            for _ in range(int(s.value(y))):
                d = next(racks)
                out[d.id] = {j: x for j, x in zip(cap.whole, a, strict=True) if x}
    for dom, here in cap.direct.items():
        out[dom] = {j: int(s.value(x)) for j, x in here.items() if s.value(x)}
    # each domain's room for sub-tray instances: its free trays that whole-tray instances
    # left, and the free GPUs of its partly available trays; filled largest first, each
    # instance in the first aligned block that is free (as compiler/solve/place.py takes them)
    room: dict[str, list[list[bool]]] = {}
    for d in p.domains:
        full = [t for t in d.trays if not down.intersection(p.gpus_of(t))]
        whole = sum(items[j].trays * n for j, n in out[d.id].items())
        trays = [[True] * per for _ in full[whole:]]
        trays += [[g not in down for g in p.gpus_of(t)] for t in d.trays
                  if down.intersection(p.gpus_of(t))]
        room[d.id] = trays
    sub = sorted((j for j, it in enumerate(items) if not it.trays),
                 key=lambda j: (-items[j].gpus, j))
    for j in sub:
        need, size = totals[j], items[j].gpus
        for d in p.domains:
            for tray in room[d.id]:
                for k in range(0, len(tray) - size + 1, size):
                    if need and all(tray[k:k + size]):
                        tray[k:k + size] = [False] * size
                        out[d.id][j] = out[d.id].get(j, 0) + 1
                        need -= 1
        if need:
            raise ValueError(f"sub-tray item {j}: {need} instances left without room")
    return out
