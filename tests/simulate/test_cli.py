"""`rackc simulate` end to end on the Vera Rubin example's plan (the real perf model)."""

import json
from pathlib import Path

import pytest
import yaml

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
CASE = "vr-nvl72-deepseek-v4.1-flash"
PLAN = str(ROOT / "tests" / "golden" / CASE / "plan" / "plan.yaml")
DEP = str(ROOT / "examples" / CASE / "deployment.yaml")


def _run(capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["simulate", PLAN, "--deployment", DEP, "--requests", "400", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_is_byte_identical_for_a_seed_and_compares_policies(capsys):
    code, a, _ = _run(capsys, "--format", "json", "--policy", "kv,session", "--seed", "3")
    assert code == 0
    _, b, _ = _run(capsys, "--format", "json", "--policy", "kv,session", "--seed", "3")
    assert a == b
    data = json.loads(a)
    assert list(data["policies"]) == ["kv", "session"]
    kv = data["policies"]["kv"]
    assert kv["finished"] == 400 and kv["prefix_hit_rate"] > 0.9  # the warm rack-wide pool
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert kv[key]["p50"] <= kv[key]["p90"] <= kv[key]["p99"]
    # decode steps come from the perf model: near the closed form's step at this batch
    assert 1.5 < kv["tpot_ms"]["p50"] < 4.0
    # the closed-form figures are the plan's own
    predicted = yaml.safe_load(Path(PLAN).read_text())["predicted"]
    assert data["closed_form"]["tpot_ms_p50"] == predicted["tpot_ms_p50"]
    _, c, _ = _run(capsys, "--format", "json", "--seed", "4")
    assert json.loads(c)["policies"]["kv"] != kv


def test_text_report_and_fault(capsys):
    code, out, _ = _run(capsys, "--fail", "r0-t17@0.2")
    assert code == 0
    instances = yaml.safe_load(Path(PLAN).read_text())["instances"]
    down = sum("r0-t17" in i["trays"] for i in instances)
    assert down >= 1
    assert f"fault r0-t17 at 0.2 s: {down} instance(s) down" in out
    assert "closed form (rackc predict)" in out


def test_plots(capsys, tmp_path: Path):
    code, _, _ = _run(capsys, "--plot", str(tmp_path / "plots"))
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "hit_rate.png", "latency_cdf.png", "rank_load.png"]


@pytest.mark.parametrize(("extra", "code_", "needle"), [
    (["--fail", "r9-t00@1"], "E753", "a GPU, tray or rack id"),
    (["--fail", "r0-t00"], "E753", "ID@SECONDS"),
    (["--policy", "kv,least-uncahced"], "E753", "did you mean `least-uncached`"),
    (["--trace", "/nonexistent.jsonl"], "E752", "no such file"),
])
def test_bad_arguments_get_diagnostics(capsys, extra, code_, needle):
    code, out, err = _run(capsys, *extra)
    assert code == 2 and out == ""
    assert code_ in err and needle in err and "Traceback" not in err


def test_a_plan_of_other_inputs_is_refused(capsys):
    other = str(ROOT / "examples" / "hgx-h200-deepseek-v3" / "deployment.yaml")
    code = main(["simulate", PLAN, "--deployment", other])
    err = capsys.readouterr().err
    assert code == 2 and "E751" in err and "a plan of other inputs" in err


def test_trace_replay(capsys, tmp_path: Path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"session": s, "think_s": 0.5, "input_tokens": 8192,
                                         "output_tokens": 64, "prefix_tokens": 7168 * (t > 0)})
                             + "\n" for s in range(40) for t in range(3)))
    code = main(["simulate", PLAN, "--deployment", DEP, "--trace", str(trace),
                 "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["policies"]["kv"]["finished"] == 120
