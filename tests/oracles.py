"""Brute-force oracles for the solver's two phases, on racks small enough to enumerate: the
count phase (`CountOracle`: every vector of instance counts the rules allow) and placement
(`placeable`: every aligned block and whole-tray choice). The solver oracle tests
(tests/solver/test_count_oracle.py, test_placement_oracle.py) hold the solver to them, and the
property tests (tests/compile/test_properties.py) justify each exit 3 of the solver with them.

`CountOracle` is written from the documented rules (docs/constraints.md, "Rules of the CP-SAT
models"), not from compiler/solve/constraints.py or racks.py; it enumerates every vector of
new instances per candidate within the GPUs and keeps those where

* a candidate with no supply (requests_per_s <= 0) has no new instances while an SLO it
  misses (`misses`: "slo", the per-user rate; "ttft") holds, always where that SLO is no
  requirement, and always where it misses none (docs: "a shape that misses an SLO unused
  while that SLO holds ...");
* pinned mode: a pinned (role, shape) has, kept instances included, the sum of its entries
  while every entry holds (a relaxed entry leaves it free); nothing unpinned is new;
* prefill and decode are both present, or aggregated instances alone;
* every new instance has GPUs of its own, none unavailable, none a kept instance holds: a
  whole-tray one (gpus >= GPUs per tray) gpus / tray whole trays of one NVLink domain, each
  with every GPU available; a sub-tray one an aligned block of free GPUs of one tray
  (searched instance by instance, not by a counting formula);

goodput = min(prefill supply, decode supply) + aggregated supply, kept instances included
(constraints.add_goodput takes the aggregated supply or the smaller one, whichever way the
layout serves: the same, since a layout serves one way), and the tie-break after it is the
most supply of all instances (counts._best).

Where routing groups follow NVLink domains (NVL72 racks, more than one: docs/constraints.md,
compiler/routes.py), the P/D goodput is instead the best, over every way to put the new
instances in racks (each rack's share fitting it), of: for each rack holding prefill and
decode, the smaller of its own prefill and decode supply; plus the smaller of the prefill and
the decode supply of the racks holding one role, each instance there at its supply with every
hand-off across racks (`Candidate.remote`); where racks hold prefill alone, some rack holds
decode alone, and the other way round; where they do not and the instances are fixed
(pinned, or kept), one router serves all: the smaller of all prefill and all decode supply at
`remote`. Kept instances count in the rack they run in.

Each candidate's supply enters CP-SAT as whole micro-requests per second, rounded down, at
least 1 (problem.py SCALE, scaled_supply's docstring): the goodput is compared in requests/s
within that rounding, and in those units exactly.

Where the count model is deliberately not placement, the oracle follows the count model:

* memory is neither phase's rule: precheck keeps only shapes whose budget holds a request
  (E301, E302) and a kind's need per memory domain is the domain's capacity by construction
  (docs/constraints.md, "Rules of the CP-SAT models"), so the oracle counts GPUs and never
  memory;
* the other way round (stricter, and only for explanations): while an explanation relaxes an
  `unavailable` entry, a tray another (active) entry touches keeps every entry's GPUs out of
  its sub-tray blocks ("aligned blocks of partly available trays count conservatively: every
  unavailable entry active", constraints.add_gpu_capacity's docstring; docs/constraints.md
  does not say it); a tray only relaxed entries touch is whole again. With every requirement
  active (the counts themselves) this is exact.
"""

import functools
import math
from collections.abc import Iterator, Sequence
from itertools import combinations, product

from compiler import routes
from compiler.shapes import parse_shape
from compiler.solve.problem import SCALE, Problem

# the SLOs a candidate of each role can miss
SLO_ROLES = {"slo": ("decode", "aggregated"), "ttft": ("prefill", "aggregated")}


def micro(requests_per_s: float) -> int:
    """A supply in whole micro-requests per second, rounded down, at least 1 (problem.py)."""
    return max(1, math.floor(requests_per_s * SCALE))


@functools.cache
def fits(racks: tuple[tuple[tuple[bool, int], ...], ...], per: int,
         sizes: tuple[int, ...]) -> bool:
    """Can instances of `sizes` GPUs (largest first) all take GPUs? Each rack is a tuple of
    trays (whole-tray usable, bit mask of its free GPUs); a whole-tray instance takes
    size / per trays of one rack that are usable whole and untouched, a sub-tray one an
    aligned block of free GPUs of one tray."""
    if not sizes:
        return True
    size, rest, full = sizes[0], sizes[1:], (1 << per) - 1
    tried = set()
    for r, rack in enumerate(racks):
        if size >= per:
            whole = [t for t, (ok, mask) in enumerate(rack) if ok and mask == full]
            options = [tuple((False, 0) if t in chosen else tray for t, tray in enumerate(rack))
                       for chosen in combinations(whole, size // per)]
        else:
            block = (1 << size) - 1
            options = [(*rack[:t], (ok, mask & ~(block << b)), *rack[t + 1:])
                       for t, (ok, mask) in enumerate(rack)
                       for b in range(0, per, size) if mask & (block << b) == block << b]
        for new in options:
            state = tuple(sorted(tuple(sorted(x)) for x in (*racks[:r], new, *racks[r + 1:])))
            if state not in tried:
                tried.add(state)
                if fits(state, per, rest):
                    return True
    return False


class CountOracle:
    """Every vector of new instance counts the documented rules allow, by enumeration."""

    def __init__(self, p: Problem):
        self.p = p
        self.per = p.domains[0].gpus_per_tray
        self.cands = p.candidates
        assert all(c.shape.gpus % self.per == 0 if c.shape.gpus >= self.per
                   else self.per % c.shape.gpus == 0 for c in self.cands)
        index = {(c.role, c.shape.name): i for i, c in enumerate(self.cands)}
        self.kept = [0] * len(self.cands)
        self.routed = routes.by_domain(p.inputs)
        rack_of = {g: r for r, d in enumerate(p.domains) for t in d.trays for g in p.gpus_of(t)}
        self.kept_in: list[list[int]] = [[] for _ in p.domains]  # per rack: candidate indices
        for k in p.kept:
            self.kept[index[k.role, k.shape.name]] += 1
            self.kept_in[rack_of[k.gpus[0]]].append(index[k.role, k.shape.name])
        self.occupied = {g for k in p.kept for g in k.gpus}

    def racks(self, active: frozenset[str]) -> tuple[tuple[tuple[bool, int], ...], ...]:
        """Each rack's trays: usable whole (no active entry's GPU, none kept), and the free
        GPUs (a tray not usable whole keeps every entry's GPUs out: the count model's
        conservative view while an explanation relaxes some)."""
        p = self.p
        down = set().union(*(g for k, g in p.unavailable.items() if k in active))
        every = set().union(*p.unavailable.values())
        out = []
        for d in p.domains:
            trays = []
            for t in d.trays:
                gpus = p.gpus_of(t)
                ok = not (down | self.occupied).intersection(gpus)
                out_of = set() if ok else every | self.occupied
                trays.append((ok, sum(1 << b for b, g in enumerate(gpus) if g not in out_of)))
            out.append(tuple(trays))
        return tuple(out)

    def vectors(self, active: frozenset[str]) -> Iterator[tuple[tuple[int, ...], dict]]:
        """(new instances per candidate, their goodput and supply) for every allowed vector."""
        p, cands = self.p, self.cands
        choices: list[Sequence[int]] = []
        racks = self.racks(active)
        budget = sum(bin(mask).count("1") for rack in racks for _, mask in rack)
        for i, c in enumerate(cands):
            missed = c.requests_per_s <= 0 and (not c.misses or any(
                key not in p.requirements or key in active for key in c.misses))
            entries = [e for e in p.pins if (e.role, e.shape.name) == (c.role, c.shape.name)]
            if p.mode == "pinned" and not entries:
                choices.append([0])
            elif p.mode == "pinned" and all(e.requirement.key in active for e in entries):
                n = sum(e.count for e in entries) - self.kept[i]
                if n < 0 or (n and missed):
                    return
                choices.append([n])
            else:
                choices.append([0] if missed else range(budget // c.shape.gpus + 1))
        for n in self._within(choices, 0, budget):
            got = self.evaluate(n, racks)
            if got is not None:
                yield n, got

    def _within(self, choices, i: int, budget: int) -> Iterator[tuple[int, ...]]:
        if i == len(choices):
            yield ()
            return
        gpus = self.cands[i].shape.gpus
        for n in choices[i]:
            if n * gpus <= budget:
                for rest in self._within(choices, i + 1, budget - n * gpus):
                    yield (n, *rest)

    def evaluate(self, n: Sequence[int], racks) -> dict | None:
        """The goodput and supply of new counts `n` (requests/s and micro-units), or None
        where the roles or the GPUs refuse them."""
        total = {"prefill": 0, "decode": 0, "aggregated": 0}
        rate, units = dict.fromkeys(total, 0.0), dict.fromkeys(total, 0)
        for i, c in enumerate(self.cands):
            k = n[i] + self.kept[i]
            total[c.role] += k
            rate[c.role] += k * c.requests_per_s
            units[c.role] += k * micro(c.requests_per_s)
        if not ((total["prefill"] and total["decode"] and not total["aggregated"])
                or (total["aggregated"] and not total["prefill"] and not total["decode"])):
            return None
        sizes = sorted((c.shape.gpus for i, c in enumerate(self.cands) for _ in range(n[i])),
                       reverse=True)
        if not fits(racks, self.per, tuple(sizes)):
            return None
        supply = sum(units.values())
        if self.routed and not total["aggregated"]:
            best = self.by_rack(n, racks)
            return None if best is None else {"goodput": best[1], "goodput_units": best[0],
                                              "supply_units": supply}
        return {"goodput": min(rate["prefill"], rate["decode"]) + rate["aggregated"],
                "goodput_units": min(units["prefill"], units["decode"]) + units["aggregated"],
                "supply_units": supply}

    def by_rack(self, n: Sequence[int], racks) -> tuple[int, float] | None:
        """The best (goodput units, goodput) over every way to put the new P/D instances in
        racks, by the routing groups' rule (module docstring); None where none is allowed."""
        new = [i for i, c in enumerate(self.cands) for _ in range(n[i])]
        best = None
        for where in product(range(len(racks)), repeat=len(new)):
            placed: list[list[int]] = [[] for _ in racks]
            for i, r in zip(new, where, strict=True):
                placed[r].append(i)
            if all(fits((rack,), self.per, tuple(sorted(
                    (self.cands[i].shape.gpus for i in mine), reverse=True)))
                   for rack, mine in zip(racks, placed, strict=True)):
                value = self._served([k + mine for k, mine in
                                      zip(self.kept_in, placed, strict=True)])
                if value is not None and (best is None or value > best):
                    best = value
        return best

    def _served(self, held: list[list[int]]) -> tuple[int, float] | None:
        """(units, requests/s) the racks serve holding these candidates' instances."""
        units, rate = 0, 0.0
        shared = {"prefill": [0, 0.0], "decode": [0, 0.0]}
        for mine in held:
            roles = {self.cands[i].role for i in mine}
            own = {role: (sum(micro(self.cands[i].requests_per_s) for i in mine
                              if self.cands[i].role == role),
                          sum(self.cands[i].requests_per_s for i in mine
                              if self.cands[i].role == role)) for role in shared}
            if roles >= {"prefill", "decode"}:
                units += min(own["prefill"][0], own["decode"][0])
                rate += min(own["prefill"][1], own["decode"][1])
            elif roles:
                (role,) = roles
                shared[role][0] += sum(micro(self.cands[i].remote) for i in mine)
                shared[role][1] += sum(self.cands[i].remote for i in mine)
        if bool(shared["prefill"][0]) == bool(shared["decode"][0]):
            return (units + min(shared["prefill"][0], shared["decode"][0]),
                    rate + min(shared["prefill"][1], shared["decode"][1]))
        if self.p.mode != "pinned" and not self.p.kept:
            return None  # the shared group holds both roles or no instance
        every = [i for mine in held for i in mine]  # one router, every hand-off across
        return tuple(min(sum(f(self.cands[i].remote) for i in every
                             if self.cands[i].role == role) for role in shared)
                     for f in (micro, float))

    def feasible(self, active: frozenset[str]) -> bool:
        return next(self.vectors(active), None) is not None


def placeable(racks: list[list[list[str]]], down: set[str], shapes: list[str]) -> bool:
    """Can every instance take its GPUs? A sub-tray instance of s GPUs takes one aligned block
    of s free GPUs of one tray; a whole-tray one takes gpus/tray fully free trays of one rack."""
    per = len(racks[0][0])
    free = {g: g not in down for rack in racks for tray in rack for g in tray}
    sizes = sorted((parse_shape(s).gpus for s in shapes), reverse=True)

    def fit(i: int) -> bool:
        if i == len(sizes):
            return True
        size = sizes[i]
        if size >= per:
            for rack in racks:
                whole = [t for t in rack if all(free[g] for g in t)]
                for chosen in combinations(whole, size // per):
                    gpus = [g for t in chosen for g in t]
                    free.update(dict.fromkeys(gpus, False))
                    if fit(i + 1):
                        return True
                    free.update(dict.fromkeys(gpus, True))
            return False
        for rack in racks:
            for tray in rack:
                for b in range(0, per - size + 1, size):
                    block = tray[b:b + size]
                    if all(free[g] for g in block):
                        free.update(dict.fromkeys(block, False))
                        if fit(i + 1):
                            return True
                        free.update(dict.fromkeys(block, True))
        return False

    return fit(0)
