"""Property tests: any valid rack/model/workload either compiles to a plan whose invariants
hold, or stops with diagnostics (exit 2 or 3), never a crash; shuffled input keys give the
same plan."""

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import api
from schemas.diagnostics import CompileError
from tests.builders import write_case
from tests.invariants import check_plan

SYSTEMS = {"vera-rubin-nvl72": 18, "gb300-nvl72": 18, "gb200-nvl72": 18, "hgx-h200": 4,
           "hgx-b200": 4}
MODELS = ["qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "llama-3.1-70b",
          "deepseek-v4.1-flash", "glm-4.5"]


@st.composite
def cases(draw):
    system = draw(st.sampled_from(sorted(SYSTEMS)))
    trays = draw(st.integers(1, SYSTEMS[system]))
    per = 8 if system.startswith("hgx") else 4
    down = draw(st.lists(st.tuples(st.integers(0, trays - 1), st.integers(0, per - 1)),
                         max_size=3, unique=True))
    hardware = {"trays": trays}
    if down:
        hardware["unavailable"] = {"gpus": [f"r0-t{t:02d}-g{g}" for t, g in down]}
    workload = {"profile": draw(st.sampled_from(["fixed", "chat", "agentx"]))}
    slo = draw(st.one_of(st.none(), st.builds(lambda r: {"tokens_per_s_per_user_p90": r},
                                              st.sampled_from([5.0, 20.0, 60.0]))))
    return dict(system=system, model=draw(st.sampled_from(MODELS)), hardware=hardware,
                workload=workload, slo=slo)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_compiles_or_explains(tmp_path_factory, case):
    path = write_case(tmp_path_factory.mktemp("case"), **case)
    try:
        plan = api.compile(path, only=()).plan
    except CompileError as exc:
        assert exc.exit_code in (2, 3) and exc.diagnostics
        assert all(d.code and d.expected for d in exc.diagnostics)
        return
    check_plan(plan)


@pytest.mark.parametrize("example", ["vr-nvl72-deepseek-v4.1-flash", "hgx-h200-deepseek-v3"])
def test_key_order_does_not_change_the_plan(tmp_path: Path, example: str):
    src = Path(__file__).resolve().parents[2] / "examples" / example
    for f in src.glob("*.yaml"):
        doc = yaml.safe_load(f.read_text())
        doc["spec"] = dict(reversed(list(doc["spec"].items())))
        (tmp_path / f.name).write_text(yaml.safe_dump(dict(reversed(list(doc.items()))),
                                                      sort_keys=False))
    a = api.compile(src / "deployment.yaml", only=()).plan.model_copy(
        update={"inputs_digest": ""})
    b = api.compile(tmp_path / "deployment.yaml", only=()).plan.model_copy(
        update={"inputs_digest": ""})
    assert a == b
