"""Routing groups larger than one Dynamo graph (compiler/routes.py `parts`): a graph holds at
most 25 components, its frontend and one per instance, so a group of more instances is dealt
into parts of at most 24 that each hold every role the group holds: whole NVLink domains where
they can be dealt so, else trays, and alike domains or trays go round the parts in turn."""

from compiler.routes import Route, members, parts
from compiler.shapes import parse_shape

P = ("prefill", "DEP8", 1, 16384)
D = ("decode", "DEP64", 256, 0)
D8 = ("decode", "TP8EP8", 64, 0)


def _units(layout: dict[str, list[list]]) -> dict:
    """{domain: [instances of tray 0, of tray 1, ...]} as route units."""
    return {(d, f"{d}-t{k:02}"): keys for d, trays in layout.items()
            for k, keys in enumerate(trays)}


def test_a_group_that_fits_one_graph_stays_whole():
    units = _units({"nvl0": [[P] * 3], "nvl1": [[D, D8]] * 10})
    r = Route("shared", ("nvl0", "nvl1"), 1.0)
    assert parts(r, units, 24) == [r]


def test_alike_racks_are_dealt_whole_into_alike_parts():
    """Two prefill racks of three instances, fourteen decode racks of two: 34 instances, two
    parts of one prefill rack and seven decode racks each."""
    layout = {f"nvl{n}": [[P, P, P]] for n in range(2)}
    layout |= {f"nvl{n}": [[D], [D8]] for n in range(2, 16)}
    units = _units(layout)
    r = Route("shared", tuple(layout), 1.0)
    split = parts(r, units, 24)
    assert [p.name for p in split] == ["shared-1", "shared-2"]
    assert all(not p.trays and p.cross == 1.0 for p in split)
    assert sorted(sorted(members(p, units)) for p in split)[0] == \
        sorted(sorted(members(p, units)) for p in split)[1]
    assert sorted(d for p in split for d in p.domains) == sorted(layout)


def test_one_rack_of_a_role_is_dealt_by_tray():
    """Every prefill on one rack (four trays of four): no dealing of whole racks gives each part
    a prefill, so its trays are dealt."""
    layout = {"nvl0": [[P] * 4] * 4} | {f"nvl{n}": [[D], [D]] for n in range(1, 6)}
    units = _units(layout)
    split = parts(Route("shared", tuple(layout), 1.0), units, 24)
    assert len(split) == 2 and all(p.trays for p in split)
    for p in split:
        mine = members(p, units)
        assert len(mine) <= 24 and {k[0] for k in mine} == {"prefill", "decode"}
    assert sorted(k for p in split for k in members(p, units)) == \
        sorted(k for keys in units.values() for k in keys)


def test_a_group_no_dealing_can_split_stays_whole():
    """One prefill instance: no two parts can both hold one."""
    units = _units({"nvl0": [[P]], "nvl1": [[D]] * 30})
    r = Route("shared", ("nvl0", "nvl1"), 1.0)
    assert parts(r, units, 24) == [r]


def _served(parts_, units) -> float:
    """What the parts serve together, as shares of the group's GPUs of each role: each part
    the smaller of its shares (its supply of a role scales with its GPUs of it)."""
    def gpus(keys, role):
        return sum(parse_shape(k[1]).gpus for k in keys if k[0] == role)
    every = [k for keys in units.values() for k in keys]
    return sum(min(gpus(members(p, units), r) / gpus(every, r) for r in ("prefill", "decode"))
               for p in parts_)


def test_parts_keep_what_the_group_serves_where_a_role_is_on_few_domains():
    """Eight HGX nodes, every prefill on two of them (bundle review 12: dealt in turn, the parts
    served 0.72 of the group, 870 of its 1,165 requests/s): each decode node goes where it
    raises what the parts serve, so the node of eight prefill gets four decode nodes."""
    tp1_p, tp1_d, dep2 = ("prefill", "TP1", 64, 16384), ("decode", "TP1", 64, 0), \
        ("decode", "DEP2", 64, 0)
    layout = {"nvl0": [[tp1_p] * 3 + [dep2] * 2 + [tp1_d]], "nvl1": [[tp1_p] * 8]}
    layout |= {f"nvl{n}": [[dep2] * 4] for n in range(2, 8)}
    units = _units(layout)
    split = parts(Route("all", tuple(layout), 1.0), units, 24)
    assert len(split) == 2 and all(len(members(p, units)) <= 24 for p in split)
    assert _served(split, units) >= 0.85
    with_eight = next(p for p in split if "nvl1" in p.domains)
    assert len(members(with_eight, units)) == 24  # nvl1 and four decode nodes


def test_a_recompile_keeps_the_parts_and_deals_afresh_only_when_they_cannot_hold_it():
    """Kept instances stay in their part, also once the group would fit one graph; where the
    kept part cannot take what a tray holds now, the group is dealt afresh rather than left
    whole (which no graph could hold)."""
    p, d = ("prefill", "TP1", 64, 16384), ("decode", "TP1", 64, 0)
    layout = {"nvl0": [[p] * 4, [d] * 4, [d] * 4], "nvl1": [[p] * 4, [d] * 4, [d] * 4]}
    units = _units(layout)
    previous = {u: "all-1" if u[0] == "nvl0" else "all-2" for u in units}
    kept = parts(Route("all", ("nvl0", "nvl1"), 1.0), units, 24, previous)
    assert [(r.name, r.domains) for r in kept] == [("all-1", ("nvl0",)), ("all-2", ("nvl1",))]
    grown = _units({"nvl0": [[p] * 4, [d] * 4, [d] * 4] + [[d] * 4] * 4,
                    "nvl1": [[p] * 4, [d] * 4, [d] * 4]})
    previous = {u: "all-1" for u in grown if u[0] == "nvl0"}  # 28 would stay in all-1
    split = parts(Route("all", ("nvl0", "nvl1"), 1.0), grown, 24, previous)
    assert len(split) >= 2 and all(len(members(r, grown)) <= 24 for r in split)
