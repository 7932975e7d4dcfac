"""The rack patterns worth counting where routing groups follow NVLink domains
(compiler/solve/locality.py), when every pattern would be too many (racks.MAX_PATTERNS).

Under that rule a rack serves one of four ways, and what it adds depends on a few sums only:
prefill and decode (its own supplies, the smaller of which it serves), prefill alone or decode
alone (its supplies to the shared group, and its own for the tie-break), aggregated instances
(their supply, and the trays left for sub-tray ones), or nothing. A pattern no better in every
sum than another of the same way is never needed: swapping it for the better one keeps every
rule and loses no goodput or spare supply. So each role's sub-patterns are kept per trays
used where no other beats them (a knapsack over Pareto sets), combined, and filtered again.

Only candidates that may have instances are counted (`allowed`); one with no supply (it misses
an SLO, usable only while an explanation relaxes it) stands alone, so that a role nothing
else serves is still present. Pinned layouts count every pattern (their counts are exact).
"""

from collections.abc import Iterable

from compiler.solve.problem import Problem, scaled_supply

Point = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]  # (sums, (item, count) pairs)
FAMILIES = ("prefill", "decode", "aggregated")


def _sums(p: Problem, j: int) -> tuple[int, ...]:
    c = p.candidates[j]
    own = scaled_supply(c.requests_per_s) if c.requests_per_s > 0 else 0
    if c.role == "aggregated":
        return (own,)
    return own, scaled_supply(c.remote) if c.remote > 0 else 0


def _front(points: Iterable[Point]) -> list[Point]:
    """The points no other beats in every sum (the first of equals kept)."""
    out: list[Point] = []
    for pt in points:
        if not any(all(a >= b for a, b in zip(q[0], pt[0], strict=True)) for q in out):
            out = [q for q in out if not all(a >= b for a, b in zip(pt[0], q[0], strict=True))]
            out.append(pt)
    return out


def _by_usage(p: Problem, family: list[int], trays: int) -> list[list[Point]]:
    """Per GPUs used exactly (`trays`: the rack's GPUs), the best sub-patterns of one role's
    items (`family`): a whole-tray instance takes its trays' GPUs, a sub-tray one its own."""
    per = p.domains[0].gpus_per_tray
    size = {j: p.whole_trays(p.candidates[j].shape.gpus) * per or p.candidates[j].shape.gpus
            for j in family}
    width = 1 if family and p.candidates[family[0]].role == "aggregated" else 2
    exact: list[list[Point]] = [[((0,) * width, ())]] + [[] for _ in range(trays)]
    served = [j for j in family if any(_sums(p, j))]
    for j in served:
        for u in range(size[j], trays + 1):
            grown = [(tuple(a + b for a, b in zip(s, _sums(p, j), strict=True)),
                      _add(counts, j)) for s, counts in exact[u - size[j]]]
            exact[u] = _front([*exact[u], *grown])
    for j in family:
        if j not in served and size[j] <= trays and not any(c for _, c in exact[size[j]]):
            exact[size[j]].append(((0,) * width, ((j, 1),)))  # a role present, no supply
    return exact


def _add(counts: tuple[tuple[int, int], ...], j: int) -> tuple[tuple[int, int], ...]:
    d = dict(counts)
    d[j] = d.get(j, 0) + 1
    return tuple(sorted(d.items()))


def _within(exact: list[list[Point]], u: int) -> list[Point]:
    """The best sub-patterns using at most `u` trays, holding at least one instance."""
    return _front(pt for k in range(1, u + 1) for pt in exact[k])


def routed_patterns(p: Problem, whole: list[int], allowed: frozenset[int] | None,
                    ntrays: int) -> tuple[tuple[int, ...], ...]:
    """Pattern vectors over the items counted per rack `whole` (candidate indices, in order)
    for racks of `ntrays` trays: nothing, each way's best sub-patterns, and the best pairs of
    a prefill and a decode sub-pattern (by their own supplies). Sizes in GPUs."""
    trays = ntrays * p.domains[0].gpus_per_tray  # the rack's room, in GPUs
    ok = [j for j in whole if allowed is None or j in allowed]
    exact = {f: _by_usage(p, [j for j in ok if p.candidates[j].role == f], trays)
             for f in FAMILIES}
    chosen: list[tuple[tuple[int, int], ...]] = [()]
    for role in ("prefill", "decode"):
        chosen += [c for _, c in _within(exact[role], trays)]
    pairs = _front(((sp[0], sd[0]), cp + cd)
                   for u in range(1, trays) for sp, cp in exact["prefill"][u]
                   for sd, cd in _within(exact["decode"], trays - u))
    chosen += [c for _, c in pairs]
    # aggregated: more supply or more trays left for sub-tray instances
    aggregated = _front(((s[0], trays - u), c) for u in range(1, trays + 1)
                        for s, c in exact["aggregated"][u])
    chosen += [c for _, c in aggregated]
    column = {j: k for k, j in enumerate(whole)}
    out = []
    for counts in dict.fromkeys(chosen):
        vector = [0] * len(whole)
        for j, n in counts:
            vector[column[j]] = n
        out.append(tuple(vector))
    return tuple(out)
