"""Weight offload as written (compiler.input_checks) and as resolved (compiler.resolve): each
offload names what its backend needs and nothing it ignores, at the field that says it; one
ask per role (its own, else the deployment-wide one) and per pinned role and shape."""

from pathlib import Path

import pytest
import yaml

from compiler.load import load_inputs
from schemas.diagnostics import CompileError
from tests.builders import write_case

PINS = [{"role": "prefill", "shape": "DEP4", "count": 1},
        {"role": "decode", "shape": "DEP4", "count": 1}]


def _load(tmp_path: Path, serving: dict | None = None, pins: list | None = None,
          model: str = "deepseek-v3"):
    objective = {"mode": "pinned", "instances": pins} if pins else None
    return load_inputs(write_case(tmp_path, system="hgx-h200", model=model, kind="Cluster",
                                  hardware={"nodes": 1}, serving=serving, objective=objective))


def _errors(tmp_path: Path, **kw) -> list[tuple[str, str, int]]:
    with pytest.raises(CompileError) as info:
        _load(tmp_path, **kw)
    return [(d.code, d.path, d.line) for d in info.value.diagnostics]


def _line(tmp_path: Path, *path) -> int:
    """The line of `path`'s key in the written deployment (yaml.safe_dump's layout)."""
    text = (tmp_path / "deployment.yaml").read_text().splitlines()
    node = yaml.compose("\n".join(text))
    for part in path:
        node = node.value[part] if isinstance(part, int) else \
            next(v for k, v in node.value if k.value == part)
    return node.start_mark.line + 1


@pytest.mark.parametrize("offload,code,field", [
    ({"backend": "uva"}, "E102", "spec.serving.weight_offload"),
    ({"gib_per_gpu": 10, "group_size": 4}, "E105", "spec.serving.weight_offload.group_size"),
    ({"backend": "prefetch"}, "E102", "spec.serving.weight_offload"),
    ({"backend": "prefetch", "gib_per_gpu": 10, "group_size": 4}, "E105",
     "spec.serving.weight_offload.group_size"),
    ({"backend": "prefetch", "gib_per_gpu": 10, "num_in_group": 2}, "E105",
     "spec.serving.weight_offload.num_in_group"),
    ({"backend": "prefetch", "group_size": 2, "num_in_group": 3}, "E104",
     "spec.serving.weight_offload.num_in_group"),
    ({"backend": "prefetch", "group_size": 62}, "E104", "spec.serving.weight_offload.group_size"),
    ({"backend": "none", "gib_per_gpu": 10}, "E105", "spec.serving.weight_offload.gib_per_gpu"),
    ({"backend": "zero-copy", "gib_per_gpu": 10}, "E105", "spec.serving.weight_offload.backend"),
    ({"backend": "prefetch", "group_size": 0}, "E104", "spec.serving.weight_offload.group_size"),
])
def test_an_offload_its_backend_cannot_run_is_refused_at_its_field(tmp_path: Path, offload,
                                                                    code, field):
    assert (code, field) in [e[:2] for e in _errors(tmp_path, serving={"weight_offload":
                                                                         offload})]


def test_each_written_offload_is_checked_where_it_is_written(tmp_path: Path):
    pins = [PINS[0], {**PINS[1], "weight_offload": {"backend": "prefetch", "group_size": 2,
                                                    "num_in_group": 3}}]
    found = _errors(tmp_path, pins=pins, serving={
        "weight_offload_per_role": {"prefill": {"backend": "uva", "prefetch_step": 2}}})
    role = ("spec", "serving", "weight_offload_per_role", "prefill", "prefetch_step")
    pin = ("spec", "objective", "instances", 1, "weight_offload", "num_in_group")
    assert ("E105", "spec.serving.weight_offload_per_role.prefill.prefetch_step",
            _line(tmp_path, *role)) in found
    assert ("E104", "spec.objective.instances[1].weight_offload.num_in_group",
            _line(tmp_path, *pin)) in found


def test_entries_of_one_role_and_shape_share_one_offload(tmp_path: Path):
    pins = [*PINS, {"role": "decode", "shape": "DEP4", "count": 1,
                    "weight_offload": {"gib_per_gpu": 20}}]
    assert ("E105", "spec.objective.instances[2].weight_offload") in \
        [e[:2] for e in _errors(tmp_path, pins=pins)]


def test_expert_offload_of_a_dense_role_is_refused(tmp_path: Path):
    found = _errors(tmp_path, model="llama-3.1-70b", serving={"weight_offload_per_role": {
        "decode": {"backend": "prefetch", "group_size": 4, "experts_only": True}}})
    assert ("E105", "spec.serving.weight_offload_per_role.decode.experts_only") in \
        [e[:2] for e in found]


def test_no_offload_resolves_to_nothing(tmp_path: Path):
    r = _load(tmp_path).resolved
    assert r.weight_offload == () and r.offload_ask("decode", "DEP4") is None


def test_roles_take_their_own_then_the_deployment_wide_offload(tmp_path: Path):
    r = _load(tmp_path, serving={
        "weight_offload": {"gib_per_gpu": 40},
        "weight_offload_per_role": {"prefill": {"backend": "none"},
                                    "decode": {"backend": "prefetch", "group_size": 4,
                                               "prefetch_step": 2}}}).resolved
    by_path = {c.path: c for c in r.weight_offload}
    # the solver may serve either way (layout any): every role has a decision
    assert sorted(by_path) == ["weight_offload.aggregated", "weight_offload.decode",
                               "weight_offload.prefill"]
    assert r.offload_ask("prefill", "DEP8") is None
    assert str(by_path["weight_offload.prefill"].decision().why).startswith("backend none")
    assert (r.offload_ask("decode", "DEP8").group_size,
            r.offload_ask("decode", "DEP8").prefetch_step) == (4, 2)
    assert r.offload_ask("aggregated", "TP8").gib_per_gpu == 40
    assert by_path["weight_offload.decode"].decision().value == \
        "prefetch group_size=4 prefetch_step=2"
