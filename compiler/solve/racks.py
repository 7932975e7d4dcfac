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
g >= s GPUs covers g / s of them). Where the rack an instance lands in matters (prefill and
decode, where routing groups follow NVLink domains: compiler/solve/locality.py), sub-tray
instances are counted per rack like whole-tray ones (`Item.per_rack`): a pattern holds them
beside its whole-tray instances (in GPUs: they pack the trays left whole, their sizes dividing a
tray's), a rack counted directly holds them in its own free blocks.

The free aligned blocks of a tray (`free_blocks`) are the one capacity rule: the count model
counts them, the per-rack split (`split`) fills them first-fit, and placement
(compiler/solve/place.py) chooses among them.
"""

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from compiler.cpsat import cp_model
from compiler.solve.problem import Domain, Problem

MAX_PATTERNS = 4000  # beyond this a class falls back to direct per-rack counts


@dataclass(frozen=True)
class Item:
    """One kind of instance to fit: `trays` whole trays each, or `gpus` inside one tray."""

    trays: int  # 0: a sub-tray instance
    gpus: int
    per_rack: bool = False  # a sub-tray instance counted per rack, not over the fleet

    def units(self, per: int) -> int:
        """GPUs it takes on racks of `per` GPUs per tray."""
        return self.trays * per if self.trays else self.gpus


@dataclass
class Capacity:
    whole: list[int]  # indices of the items counted per rack: whole-tray ones, `per_rack` ones
    # per class of identical untouched racks: its domains and [(pattern, racks using it)]
    patterns: list[tuple[tuple[Domain, ...], list[tuple[tuple[int, ...], cp_model.IntVar]]]]
    direct: dict[str, dict[int, cp_model.IntVar]]  # domain id -> whole item -> count there


def down_gpus(p: Problem) -> set[str]:
    """GPUs no new instance may take: unavailable ones, and those kept instances hold."""
    down = set().union(*p.unavailable.values()) if p.unavailable else set()
    return down | p.occupied


def free_blocks(gpus: Sequence[str], down: set[str], size: int) -> list[tuple[str, ...]]:
    """The aligned blocks of `size` GPUs of a tray (`gpus`, in order) with none of them down:
    a sub-tray instance of `size` GPUs takes one; at the tray's size, the tray itself when it
    is usable whole. The one capacity rule of the count model (`add_capacity`), the per-rack
    split (`split`) and placement (compiler/solve/place.py `add_options`, `unplaceable`)."""
    return [tuple(gpus[k:k + size]) for k in range(0, len(gpus) - size + 1, size)
            if down.isdisjoint(gpus[k:k + size])]


def touched(p: Problem, d: Domain, down: set[str]) -> bool:
    return any(g in down for t in d.trays for g in p.gpus_of(t))


@functools.lru_cache(maxsize=64)
def patterns(room: int, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every vector a with sum(a_j * sizes_j) <= room, in lexicographic order (MAX_PATTERNS
    and one more at most); remembered, since every count model of a compile asks the same."""
    if not sizes:
        return ((),)
    out = []
    for a in range(room // sizes[0] + 1):
        for rest in patterns(room - a * sizes[0], sizes[1:]):
            out.append((a, *rest))
            if len(out) > MAX_PATTERNS:
                return tuple(out)
    return tuple(out)


@dataclass
class _Room:
    """What add_capacity gathers: per whole-tray item the instances each class or rack holds,
    per sub-tray size the aligned blocks of that size left for sub-tray instances."""

    items: Sequence[Item]
    whole: list[int]  # indices of the items counted per rack
    placed: dict[int, list]  # such an item -> its instances, per class and rack
    sub: dict[int, list]  # sub-tray size -> GPUs in free blocks of that size, per class and rack


def add_capacity(m: cp_model.CpModel, p: Problem, items: Sequence[Item],
                 counts: Sequence[cp_model.LinearExprT],
                 tray_free: dict[str, cp_model.LinearExprT],
                 fewer: Callable[[int], tuple[tuple[int, ...], ...]] | None = None
                 ) -> Capacity:
    """counts[j] instances of items[j] fit the domains. `tray_free[t]` (a literal) says whether
    tray t of a touched rack is whole-tray usable; trays missing from it are free. `fewer`:
    the patterns worth counting for racks of so many trays, where every pattern would be too
    many (compiler/solve/routed_patterns.py)."""
    down = down_gpus(p)
    whole = [j for j, it in enumerate(items) if it.trays or it.per_rack]
    sub = [j for j, it in enumerate(items) if j not in whole]
    room = _Room(items, whole, {j: [] for j in whole},
                 {size: [] for size in sorted({items[j].gpus for j in sub})})
    per = p.domains[0].gpus_per_tray
    classes, direct = _classes(p, down, tuple(items[j].units(per) for j in whole), fewer)
    cap = Capacity(whole, [], {})
    for doms, pats in classes:
        cap.patterns.append((doms, _add_class(m, room, doms, pats)))
    for d in direct:
        cap.direct[d.id] = _add_rack(m, p, room, d, tray_free, down)
    for j in whole:
        m.add(counts[j] == sum(room.placed[j]))
    for size, terms in room.sub.items():
        m.add(sum(counts[j] * items[j].gpus for j in sub if items[j].gpus >= size)
              <= sum(terms))
    return cap


def _classes(p: Problem, down: set[str], sizes: tuple[int, ...],
             fewer: Callable[[int], tuple[tuple[int, ...], ...]] | None = None
             ) -> tuple[list[tuple[tuple[Domain, ...], tuple[tuple[int, ...], ...]]],
                        list[Domain]]:
    """The classes of identical untouched racks counted by pattern (with their patterns, or
    `fewer`'s where they are too many), and the racks counted directly (touched ones, a class
    of one, a class with too many patterns), in domain order."""
    by_size: dict[int, list[Domain]] = {}
    direct = []
    for d in p.domains:
        if touched(p, d, down):
            direct.append(d)
        else:
            by_size.setdefault(len(d.trays), []).append(d)
    classes = []
    per = p.domains[0].gpus_per_tray
    for ntrays, doms in sorted(by_size.items()):
        pats = () if len(doms) == 1 else patterns(ntrays * per, sizes)
        if len(pats) > MAX_PATTERNS and fewer is not None:
            pats = fewer(ntrays)
        if len(doms) == 1 or len(pats) > MAX_PATTERNS:
            direct += doms
        else:
            classes.append((tuple(doms), pats))
    return classes, sorted(direct, key=p.domains.index)


def _add_class(m: cp_model.CpModel, room: _Room, doms: tuple[Domain, ...],
               pats: tuple[tuple[int, ...], ...]) -> list[tuple[tuple[int, ...], cp_model.IntVar]]:
    """How many racks of the class use each pattern; what is left of their trays (free, so
    every aligned block of each size) holds the sub-tray instances counted over the fleet."""
    ntrays, per = len(doms[0].trays), doms[0].gpus_per_tray
    sizes = [room.items[j].units(per) for j in room.whole]
    ys = [(a, m.new_int_var(0, len(doms), f"racks[{doms[0].id},{k}]"))
          for k, a in enumerate(pats)]
    m.add(sum(y for _, y in ys) == len(doms))
    for col, j in enumerate(room.whole):
        room.placed[j] += [a[col] * y for a, y in ys if a[col]]
    for terms in room.sub.values():
        terms += [(per * ntrays - sum(x * s for x, s in zip(a, sizes, strict=True))) * y
                  for a, y in ys]
    return ys


def _add_rack(m: cp_model.CpModel, p: Problem, room: _Room, d: Domain,
              tray_free: dict[str, cp_model.LinearExprT], down: set[str]
              ) -> dict[int, cp_model.IntVar]:
    """Whole-tray instances of one rack counted directly, on its trays usable whole; sub-tray
    ones also take the free aligned blocks of its trays that are not (`free_blocks`): its own
    (`per_rack`) first, the fleet's in what they leave."""
    items, per = room.items, d.gpus_per_tray
    free = [tray_free.get(t, 1) for t in d.trays]
    here = {j: m.new_int_var(0, len(d.trays) * per // items[j].units(per), f"w[{j},{d.id}]")
            for j in room.whole}
    whole = [j for j in room.whole if items[j].trays]
    own = [j for j in room.whole if not items[j].trays]
    used = sum(here[j] * items[j].trays for j in whole)
    m.add(used <= sum(free))
    for j in room.whole:
        room.placed[j].append(here[j])

    def blocks(size: int) -> cp_model.LinearExprT:
        """GPUs in the rack's free aligned blocks of `size` beside its whole-tray instances."""
        partial = [(1 - f) * size * len(free_blocks(p.gpus_of(t), down, size))
                   for t, f in zip(d.trays, free, strict=True) if t in tray_free]
        return per * (sum(free) - used) + sum(partial)

    for size in sorted({items[j].gpus for j in own}):
        m.add(sum(here[j] * items[j].gpus for j in own if items[j].gpus >= size)
              <= blocks(size))
    taken = sum(here[j] * items[j].gpus for j in own)
    for size, terms in room.sub.items():
        # what its own instances leave of the blocks of `size`; never below none: GPUs they
        # take outside such blocks (one beside a down GPU) leave the other racks' room as it was
        left = m.new_int_var(0, len(d.trays) * per, f"left[{size},{d.id}]")
        m.add_max_equality(left, [0, blocks(size) - taken])
        terms.append(left)
    return here


def split(p: Problem, items: Sequence[Item], totals: Sequence[int], cap: Capacity,
          s: cp_model.CpSolver) -> dict[str, dict[int, int]]:
    """Instances per domain after a solve: whole-tray ones as the solver chose (the racks of a
    class take its patterns in order), sub-tray ones filling what is left, domain by domain,
    largest first, each in the first free aligned block (`free_blocks`, as placement takes
    them). The count model holds exactly this room, so a sub-tray instance left without it is
    a bug in rackc, not an infeasible deployment: RuntimeError."""
    out = _whole_split(p, cap, s)
    taken = down_gpus(p)
    trays = {d.id: _trays_left(p, d, items, out[d.id], taken) for d in p.domains}
    for d in p.domains:
        _fill_own(p, d, items, out[d.id], trays[d.id], taken)
    sub = sorted((j for j, it in enumerate(items) if not it.trays and j not in cap.whole),
                 key=lambda j: (-items[j].gpus, j))
    for j in sub:
        need, size = totals[j], items[j].gpus
        for d in p.domains:
            for t in trays[d.id]:
                for block in free_blocks(p.gpus_of(t), taken, size)[:need]:
                    taken.update(block)
                    out[d.id][j] = out[d.id].get(j, 0) + 1
                    need -= 1
        if need:
            raise RuntimeError(f"the count model holds {totals[j]} instances of {size} GPUs "
                               f"inside a tray, the per-rack split finds room for "
                               f"{totals[j] - need}: the two disagree (a bug in rackc)")
    return out


def _fill_own(p: Problem, d: Domain, items: Sequence[Item], here: dict[int, int],
              trays: list[str], taken: set[str]) -> None:
    """The blocks of a rack's own sub-tray instances (`per_rack`, counted by the solver),
    largest first, each in its rack's first free aligned block."""
    for j in sorted((j for j in here if not items[j].trays), key=lambda j: (-items[j].gpus, j)):
        need, size = here[j], items[j].gpus
        for t in trays:
            for block in free_blocks(p.gpus_of(t), taken, size)[:need]:
                taken.update(block)
                need -= 1
        if need:
            raise RuntimeError(f"the count model holds {here[j]} instances of {size} GPUs in "
                               f"{d.id}, the per-rack split finds room for {here[j] - need}: "
                               "the two disagree (a bug in rackc)")


def _whole_split(p: Problem, cap: Capacity, s: cp_model.CpSolver) -> dict[str, dict[int, int]]:
    """The instances counted per rack, per domain, as the solver chose them."""
    out: dict[str, dict[int, int]] = {d.id: {} for d in p.domains}
    for doms, ys in cap.patterns:
        racks = iter(doms)
        for a, y in ys:
            for _ in range(int(s.value(y))):
                d = next(racks)
                out[d.id] = {j: x for j, x in zip(cap.whole, a, strict=True) if x}
    for dom, here in cap.direct.items():
        out[dom] = {j: int(s.value(x)) for j, x in here.items() if s.value(x)}
    return out


def _trays_left(p: Problem, d: Domain, items: Sequence[Item], whole: dict[int, int],
                down: set[str]) -> list[str]:
    """A domain's trays for sub-tray instances: the trays usable whole that its whole-tray
    instances leave (they take the first), then its partly available ones."""
    usable = [t for t in d.trays if free_blocks(p.gpus_of(t), down, d.gpus_per_tray)]
    taken = sum(items[j].trays * n for j, n in whole.items())
    return usable[taken:] + [t for t in d.trays if t not in usable]
