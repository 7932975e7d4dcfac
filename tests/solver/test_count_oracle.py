"""Oracle: on racks small enough to enumerate, the count phase (solve_counts) finds instance
counts exactly when a brute-force search over every vector of counts finds one (tests/oracles.py
CountOracle, whose docstring lists the rules it is written from), with the brute-force maximum
goodput; every exit 3 it gives names requirements that conflict, each of them needed (drop one
and counts exist).

Hypothesis draws the hardware, the SLO, up to two candidates per role with their supplies
(own, missed, below a micro-request, small), unavailable trays and GPUs, pins and a kept
instance; CASES add fixed variants the draws reach only in thousands of examples.

Left out: the Engram peer group (idle with vLLM 0.33, docs/constraints.md; the fixture
asserts engram_gib == 0), the `only` restriction of best_with, time limits (the models here
are proven in milliseconds), mixed fleets (solved group by group), and how the per-rack split
(racks.split) places sub-tray instances beyond checking that each rack's share fits it.
"""

from dataclasses import replace
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.solve.counts import Counts, solve_counts
from compiler.solve.problem import SCALE, Kept, Pin, Problem, Requirement
from tests.builders import problem_at, write_case
from tests.oracles import SLO_ROLES, CountOracle, fits, micro

pytestmark = pytest.mark.solver

GB200, HGX = ("gb200-nvl72", "qwen3-30b-a3b"), ("hgx-h200", "qwen3-32b")
HARDWARE = [(GB200, "Rack", {"trays": 1}), (GB200, "Rack", {"trays": 2}),
            (GB200, "Rack", {"trays": 3}), (GB200, "Cluster", {"racks": 2, "trays": 1}),
            (GB200, "Cluster", {"racks": 2, "trays": 2}), (HGX, "Cluster", {"nodes": 1}),
            (HGX, "Cluster", {"nodes": 2})]
# per system: no SLO, SLOs some shapes of a role miss, one every decode shape misses
SLOS = {GB200: [None, {"ttft_ms_p90": 25}, {"ttft_ms_p90": 40, "tokens_per_s_per_user_p90": 150},
                {"tokens_per_s_per_user_p90": 250}],
        HGX: [None, {"tokens_per_s_per_user_p90": 60, "ttft_ms_p90": 150}]}
# the roles a drawn variant has at least one candidate of (up to two of each role are drawn;
# "any": maybe none, so that counts are refused whatever the requirements)
WAYS = {"disaggregated": ("prefill", "decode"), "aggregated": ("aggregated",), "any": ()}
# a supply as drawn: the candidate's own (most often), missed, below one micro-request, small;
# a pinned candidate misses rarely (build: pinned_candidate falls back to the batch its KV holds)
SUPPLIES = {False: [None] * 4 + [0.0, 1e-7, 0.016], True: [None] * 9 + [0.0, 1e-7, 0.016]}
COUNTS = st.sampled_from([1, 1, 2, 3])  # a pinned entry's count


class _Problems:
    """The (hardware, SLO) problems, built when first drawn; shown briefly when falsified."""

    def __init__(self, root):
        self.root, self.built = root, {}

    def get(self, hw: int, slo: int) -> Problem:
        if (hw, slo) not in self.built:
            (system, model), kind, hardware = HARDWARE[hw]
            path = write_case(self.root / f"{hw}-{slo}", system=system, model=model, kind=kind,
                              hardware=hardware, slo=SLOS[system, model][slo])
            p = problem_at(path)
            assert p.engram_gib == 0 and not p.kept and not p.unavailable
            self.built[hw, slo] = p
        return self.built[hw, slo]

    def __repr__(self) -> str:
        return "<count-oracle problems>"


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    return _Problems(tmp_path_factory.mktemp("count-oracle"))


def _requirement(key: str, file_role: str, path: tuple) -> Requirement:
    return Requirement(key, file_role, path, key)


def _variant(p: Problem, data, pinned: bool) -> Problem:
    """`p` with a few of its candidates (at most two per role, supplies maybe changed),
    unavailable trays and GPUs, pins (pinned mode) and a kept instance, as drawn."""
    # pinned entries serve one way (E209); otherwise any mix, roles missing now and then
    way = data.draw(st.sampled_from(["disaggregated", "aggregated"] * (1 + pinned) + ["any"]
                                    * (not pinned)), label="serving")
    picked = set()
    for role in ("prefill", "decode", "aggregated"):
        of_role = [i for i, c in enumerate(p.candidates) if c.role == role]
        need = role in WAYS[way]
        if of_role:
            picked |= set(data.draw(st.lists(st.sampled_from(of_role), min_size=int(need),
                                             max_size=2, unique=True), label=role))
    if not picked:
        picked = {data.draw(st.integers(0, len(p.candidates) - 1), label="candidate")}
    cands = []
    for i in sorted(picked):
        c = p.candidates[i]
        rate = data.draw(st.sampled_from(SUPPLIES[pinned]),
                         label=f"supply {c.role} {c.shape.name}")
        if rate == 0.0:  # missed: the SLOs its role can miss, one or (aggregated) both
            can = [k for k, roles in SLO_ROLES.items() if c.role in roles]
            misses = data.draw(st.lists(st.sampled_from(can), min_size=1, max_size=len(can),
                                        unique=True), label="misses")
            c = replace(c, misses=tuple(sorted(misses)))
        cands.append(c if rate is None else replace(c, requests_per_s=rate))
    trays = [t for d in p.domains for t in d.trays]
    gpus = [g for t in trays for g in p.gpus_of(t)]
    # a tray, a GPU, or a few GPUs of one tray (an entry each), so that trays are left with
    # free GPUs that do or do not form aligned blocks
    some_of_a_tray = st.sampled_from(trays).flatmap(
        lambda t: st.lists(st.sampled_from(p.gpus_of(t)), min_size=2, max_size=3, unique=True))
    groups = data.draw(st.lists(st.one_of(st.sampled_from(trays).map(lambda t: [("trays", t)]),
                                          st.sampled_from(gpus).map(lambda g: [("gpus", g)]),
                                          some_of_a_tray.map(lambda gs: [("gpus", g) for g in gs])),
                                max_size=3), label="unavailable")
    drawn = [entry for group in groups for entry in group]
    reqs = {k: r for k, r in p.requirements.items() if k in SLO_ROLES}
    unavailable = {}
    for j, (what, name) in enumerate(drawn):
        key = f"unavailable:{what}:{j:02d}"
        reqs[key] = _requirement(key, "hardware", ("spec", "unavailable", what, j))
        unavailable[key] = frozenset(p.gpus_of(name) if what == "trays" else [name])
    mode, pins = p.mode, ()
    if pinned:
        mode = "pinned"
        reqs = {k: r for k, r in reqs.items() if k not in SLO_ROLES}  # as build.requirements
        # one entry of each role the serving way needs, then maybe more of those roles
        served = [i for i, c in enumerate(cands) if c.role in WAYS[way]]
        entries = [(data.draw(st.sampled_from([i for i in served if cands[i].role == role]),
                              label=f"pinned {role}"), data.draw(COUNTS))
                   for role in WAYS[way]]
        entries += data.draw(st.lists(st.tuples(st.sampled_from(served), COUNTS), max_size=2),
                             label="pins")
        pins = []
        for j, (i, count) in enumerate(entries):
            key = f"pin:{j:02d}"
            reqs[key] = _requirement(key, "deployment", ("spec", "objective", "instances", j))
            pins.append(Pin(cands[i].role, cands[i].shape, count, reqs[key]))
        pins = tuple(pins)
    kept = ()
    of_way = [i for i, c in enumerate(cands) if way == "any" or c.role in WAYS[way]]
    which = data.draw(st.none() | st.sampled_from(of_way), label="kept")
    if which is not None:
        down = set().union(*unavailable.values())
        where = _first_room(p, cands[which].shape.gpus, down)
        if where is not None:
            kept = (Kept("kept-0", cands[which].role, cands[which].shape, where),)
    return replace(p, candidates=tuple(cands), pins=pins, mode=mode,
                   unavailable=MappingProxyType(unavailable),
                   requirements=MappingProxyType(reqs), kept=kept)


def _first_room(p: Problem, size: int, down: set[str]) -> tuple[str, ...] | None:
    """The first GPUs an instance of `size` GPUs could hold, avoiding `down`."""
    per = p.domains[0].gpus_per_tray
    for d in p.domains:
        if size >= per:
            free = [t for t in d.trays if not down.intersection(p.gpus_of(t))]
            if len(free) >= size // per:
                return tuple(g for t in free[:size // per] for g in p.gpus_of(t))
            continue
        for t in d.trays:
            gpus = p.gpus_of(t)
            for b in range(0, per, size):
                if not down.intersection(gpus[b:b + size]):
                    return tuple(gpus[b:b + size])
    return None


def _check_counts(p: Problem, oracle: CountOracle, got: Counts) -> None:
    active = frozenset(p.requirements)
    found = list(oracle.vectors(active))
    assert found, "counts where the oracle finds none"
    n = tuple(got.by_candidate.get(i, 0) for i in range(len(p.candidates)))
    mine = oracle.evaluate(n, oracle.racks(active))
    assert mine is not None and n in {v for v, _ in found}, f"counts {n} break a rule"
    best = max(v["goodput"] for _, v in found)
    instances = sum(oracle.kept) + sum(d.gpus_per_tray * len(d.trays) for d in p.domains)
    assert abs(got.objective - best) <= instances / SCALE, (got.objective, best)
    assert got.status == "OPTIMAL"
    top = max(v["goodput_units"] for _, v in found)
    assert round(got.objective * SCALE) == top == mine["goodput_units"]
    # tie-break: the most supply among the vectors of that goodput
    assert mine["supply_units"] == max(v["supply_units"] for _, v in found
                                       if v["goodput_units"] >= top)
    # the split over racks: every instance in one rack, each rack's share fits it
    assert set(got.by_domain) == {d.id for d in p.domains}
    for i in range(len(p.candidates)):
        assert sum(here.get(i, 0) for here in got.by_domain.values()) == n[i]
    for d, rack in zip(p.domains, oracle.racks(active), strict=True):
        here = got.by_domain[d.id]
        sizes = sorted((p.candidates[i].shape.gpus for i, k in here.items() for _ in range(k)),
                       reverse=True)
        assert fits((rack,), oracle.per, tuple(sizes)), (d.id, here)


def _check_conflict(p: Problem, oracle: CountOracle, core: list[str]) -> None:
    active = frozenset(p.requirements)
    assert set(core) <= active
    assert not oracle.feasible(active), "exit 3 where the oracle finds counts"
    assert not oracle.feasible(frozenset(core)), f"{core} do not conflict"
    for key in core:
        assert oracle.feasible(frozenset(core) - {key}), f"{key} is not needed in {core}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_counts_agree_with_brute_force(problems, data):
    hw = data.draw(st.sampled_from(range(len(HARDWARE))), label="hardware")
    # pinned: no SLO requirement (build.requirements), and the pinned candidates' supplies are
    # those of no SLO (pinned_candidate falls back to what the KV holds where one is missed)
    pinned = data.draw(st.booleans(), label="pinned")
    slo = 0 if pinned else data.draw(st.sampled_from(range(len(SLOS[HARDWARE[hw][0]]))),
                                     label="slo")
    _check(_variant(problems.get(hw, slo), data, pinned))


def _check(p: Problem) -> None:
    oracle = CountOracle(p)
    got = solve_counts(p)
    if isinstance(got, list):
        _check_conflict(p, oracle, got)
    else:
        _check_counts(p, oracle, got)


def _case(p: Problem, shapes: list[tuple[str, str]], down: list[list[str]],
          pins: list[tuple[str, str, int]] = (), kept: tuple[str, str, list[str]] | None = None
          ) -> Problem:
    """A variant by hand: candidates (role, shape), unavailable entries (GPUs each), pinned
    entries (role, shape, count), a kept instance (role, shape, GPUs)."""
    by = {(c.role, c.shape.name): c for c in p.candidates}
    reqs = {} if pins else dict(p.requirements)  # pinned: no SLO requirement
    unavailable = {}
    for j, gpus in enumerate(down):
        key = f"unavailable:gpus:{j:02d}"
        reqs[key] = _requirement(key, "hardware", ("spec", "unavailable", "gpus", j))
        unavailable[key] = frozenset(gpus)
    entries = []
    for j, (role, shape, count) in enumerate(pins):
        key = f"pin:{j:02d}"
        reqs[key] = _requirement(key, "deployment", ("spec", "objective", "instances", j))
        entries.append(Pin(role, by[role, shape].shape, count, reqs[key]))
    kept = () if kept is None else (Kept("kept-0", kept[0], by[kept[:2]].shape, tuple(kept[2])),)
    return replace(p, candidates=tuple(by[k] for k in shapes), mode="pinned" if pins else p.mode,
                   pins=tuple(entries), unavailable=MappingProxyType(unavailable),
                   requirements=MappingProxyType(reqs), kept=kept)


def _tray(name: str, *gpus: int) -> list[str]:
    return [f"{name}-g{g}" for g in gpus]


# cases the draws above reach rarely (found by hypothesis with thousands of examples)
CASES = {
    # two free GPUs that form no aligned pair: a TP2 does not fit where two TP1 do (a model that
    # counted free GPUs for the one-GPU size alone placed the TP2 there)
    "no aligned pair": (5, 0, [("aggregated", "TP1"), ("aggregated", "TP2")],
                        [_tray("r0-t00", 0), _tray("r0-t00", 2)], (), None),
    # both one-tray racks down: either entry alone leaves no room for a prefill beside a
    # four-GPU decode, so an explanation names one (CP-SAT's first core names both)
    "core shrinks": (3, 0, [("prefill", "DEP2"), ("prefill", "DEP4"), ("decode", "DEP4"),
                            ("decode", "TP4")],
                     [_tray("r0-t00", 0, 1, 2, 3), _tray("r1-t00", 0, 1, 2, 3)], (), None),
    # two identical racks of two trays hold one DEP8 each; two racks of one tray none (the
    # explanation names the DEP8 entry)
    "one DEP8 per rack": (4, 0, [("aggregated", "DEP8")], [], [("aggregated", "DEP8", 2)], None),
    "no DEP8 across racks": (3, 0, [("aggregated", "DEP8"), ("aggregated", "DEP4")], [],
                             [("aggregated", "DEP8", 1), ("aggregated", "DEP4", 1)], None),
    # a kept decode counts toward its pin and its tray is not whole any more
    "kept counts toward its pin": (2, 0, [("prefill", "TP4"), ("decode", "DEP2")],
                                   [_tray("r0-t02", 3)],
                                   [("prefill", "TP4", 1), ("decode", "DEP2", 2)],
                                   ("decode", "DEP2", _tray("r0-t00", 0, 1))),
    # a rack's own one-GPU prefill beside a down GPU and a kept pair takes no pair block: the
    # fleet's room for pairs must not go below none for it (it did, and made the whole
    # problem infeasible, naming the other rack's down tray; fresh-clone run, 2026-12-06)
    "own instance outside the pair blocks": (3, 0, [("prefill", "TP1"), ("decode", "DEP2"),
                                                    ("aggregated", "DEP2")],
                                             [_tray("r1-t00", 0, 1, 2, 3), _tray("r0-t00", 0)],
                                             (), ("decode", "DEP2", _tray("r0-t00", 2, 3))),
    # with the SLO kept, an aggregated shape that misses it stays unused
    "aggregated shape missing the SLO": (1, 2, [("aggregated", "DEP2"), ("aggregated", "TP1")],
                                         [], (), None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_counts_agree_on_cases(problems, name):
    hw, slo, shapes, down, pins, kept = CASES[name]
    _check(_case(problems.get(hw, slo), shapes, down, pins, kept))


def test_the_oracle_itself():
    full, per = 0b1111, 4
    one_rack = (((True, full), (True, full)),)
    assert fits(one_rack, per, (8,))
    assert not fits((((True, full),), ((True, full),)), per, (8,))  # two trays, two racks
    assert fits((((True, full),), ((True, full),)), per, (4, 4))
    assert not fits((((False, 0b1101), (True, full)),), per, (4, 2, 2))  # no aligned pair left
    assert fits((((False, 0b1101), (True, full)),), per, (4, 1, 1, 1))
    assert not fits((((False, 0b0101),),), per, (2,))  # g0 and g2 are no aligned pair
    assert not fits((((False, full),),), per, (4,))  # a tray unusable whole takes no TP4
    assert fits((((False, full),),), per, (2, 2))
    assert micro(0.0) == 1 and micro(1e-7) == 1 and micro(0.016) == 16_000
