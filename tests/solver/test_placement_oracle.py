"""Oracle: on racks small enough to enumerate, the solver places a set of instances exactly
when a brute-force search over every aligned block and whole-tray choice finds room, and
what it places keeps the geometry rules (no feasible set refused, no infeasible one placed)."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.shapes import parse_shape
from compiler.solve.place import place, unplaceable
from tests.builders import problem_at, write_case
from tests.oracles import placeable
from tests.solver.test_constraints import _wanted

pytestmark = pytest.mark.solver

HARDWARE = [("Rack", {"trays": 1}), ("Rack", {"trays": 2}), ("Rack", {"trays": 3}),
            ("Cluster", {"racks": 2, "trays": 1}), ("Cluster", {"racks": 2, "trays": 2})]
SHAPES = ["TP1", "DEP2", "TP2", "DEP4", "TP4", "TP8", "DEP8"]


class _Problems(list):
    """The HARDWARE problems, shown briefly in a falsifying example."""

    def __repr__(self) -> str:
        return f"<problems of {HARDWARE}>"


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    root = tmp_path_factory.mktemp("oracle")
    return _Problems(problem_at(write_case(root / str(i), kind=kind, hardware=hw))
                     for i, (kind, hw) in enumerate(HARDWARE))


def _layout(p) -> list[list[list[str]]]:
    return [[list(p.gpus_of(t)) for t in d.trays] for d in p.domains]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_placement_agrees_with_brute_force(problems, data):
    p = problems[data.draw(st.integers(0, len(HARDWARE) - 1), label="hardware")]
    layout = _layout(p)
    gpus = [g for rack in layout for tray in rack for g in tray]
    down = set(data.draw(st.lists(st.sampled_from(gpus), max_size=4, unique=True), label="down"))
    shapes = data.draw(st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5), label="shapes")
    p = replace(p, unavailable={"unavailable:drawn": frozenset(down)})
    got = place(p, _wanted(*shapes))
    assert (got is not None) == placeable(layout, down, shapes)
    if got is None:
        return
    assert unplaceable(p, _wanted(*shapes)) == []  # no reason for a placement that exists
    per = len(layout[0][0])
    rack_of = {g: r for r, rack in enumerate(layout) for tray in rack for g in tray}
    taken = [g for inst in got.gpus for g in inst]
    assert len(taken) == len(set(taken)) and not down.intersection(taken)
    for shape, inst in zip(shapes, got.gpus, strict=True):
        assert len(inst) == parse_shape(shape).gpus
        assert len({rack_of[g] for g in inst}) == 1  # one NVLink domain
        if len(inst) < per:  # one aligned block of one tray
            tray = next(t for rack in layout for t in rack if inst[0] in t)
            start = tray.index(inst[0])
            assert start % len(inst) == 0 and tuple(tray[start:start + len(inst)]) == inst


def test_brute_force_itself():
    racks = [[["a0", "a1", "a2", "a3"], ["b0", "b1", "b2", "b3"]]]
    assert placeable(racks, set(), ["DEP8"])
    assert not placeable(racks, {"b3"}, ["DEP8"])
    assert placeable(racks, {"a1"}, ["DEP2", "TP4"])
    assert not placeable(racks, {"a1", "b2"}, ["DEP2", "DEP2", "DEP2"])
    assert placeable([[["a0", "a1", "a2", "a3"]], [["b0", "b1", "b2", "b3"]]], set(),
                       ["TP4", "TP4"])
    assert not placeable([[["a0", "a1", "a2", "a3"]], [["b0", "b1", "b2", "b3"]]], set(),
                           ["TP8"])
