import json
from pathlib import Path

import numpy as np
import pytest

from compiler.perf.serving import Workload
from compiler.simulate.workload import generate, read_trace
from schemas.diagnostics import CompileError

W = Workload(isl=4096, osl=256, isl_cv=0.5, osl_cv=0.5, concurrency=16, prefix_reuse=0.75,
             shared_prefix_tokens=4352, sessions=64)


@pytest.mark.parametrize("profile", ["closed", "poisson", "bursty", "agentic"])
def test_same_seed_same_requests(profile):
    a, b = generate(profile, W, 500, 3, 10.0), generate(profile, W, 500, 3, 10.0)
    for field in ("isl", "osl", "reuse", "session", "client", "arrival_us", "think_us"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    c = generate(profile, W, 500, 4, 10.0)
    assert not np.array_equal(a.osl, c.osl)


def test_closed_loop_clients_and_session_reuse():
    r = generate("closed", W, 1000, 0)
    assert set(np.unique(r.client)) == set(range(16))
    assert (r.reuse == np.rint(r.isl * 0.75)).all()
    # each session keeps one context length: its turns continue the same prefix
    for s in np.unique(r.session)[:5]:
        assert len(set(r.isl[r.session == s])) == 1
    assert abs(r.isl.mean() / 4096 - 1) < 0.15


def test_poisson_rate_and_bursty_spread():
    p = generate("poisson", W, 20000, 1, 100.0)
    b = generate("bursty", W, 20000, 1, 100.0)
    assert abs(len(p) / (p.arrival_us[-1] / 1e6) / 100.0 - 1) < 0.03
    cv = lambda x: np.diff(x).std() / np.diff(x).mean()  # noqa: E731
    assert cv(p.arrival_us) == pytest.approx(1.0, abs=0.05)
    assert cv(b.arrival_us) > 3.0


def test_agentic_contexts_grow_and_reset():
    r = generate("agentic", W, 4000, 0, max_len=32768)
    first = r.client == 0
    isl, reuse = r.isl[first], r.reuse[first]
    grew = isl[1:] > isl[:-1]
    assert grew.mean() > 0.5  # most turns append to the context
    assert (isl < 32768).all() and ((reuse == 0) | (reuse < isl)).all()
    assert (r.parent != r.session).any()  # sub-agents start from their parent's context


def _trace(tmp_path: Path, lines: list) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


def test_trace_open_and_session_lines(tmp_path: Path):
    p = _trace(tmp_path, [{"arrival_s": 0.5, "input_tokens": 100, "output_tokens": 10},
                          {"session": 3, "think_s": 1.0, "input_tokens": 200,
                           "output_tokens": 5, "prefix_tokens": 150},
                          {"arrival_s": 0.1, "input_tokens": 50, "output_tokens": 2}])
    r = read_trace(p, "t.jsonl")
    assert list(r.client) == [3, -1, -1]  # sessions first (issued from t=0), then by arrival
    assert list(r.isl) == [200, 50, 100] and list(r.reuse) == [150, 0, 0]
    assert r.think_us[0] == 1e6


def test_trace_errors_name_line_and_field(tmp_path: Path):
    p = _trace(tmp_path, ["{bad", {"arrival_s": 1, "input_tokens": 0, "output_tokens": 1},
                          {"arrival_s": 1, "input_tokens": 5, "output_tokens": 1,
                           "colour": "red"},
                          {"arrival_s": 1, "input_tokens": 5, "output_tokens": 1,
                           "prefix_tokens": 9}])
    with pytest.raises(CompileError) as e:
        read_trace(p, "t.jsonl")
    got = [(d.line, d.path) for d in e.value.diagnostics]
    assert got == [(1, ""), (2, "input_tokens"), (3, "colour"), (4, "prefix_tokens")]
    assert all(d.code == "E752" and d.file == "t.jsonl" for d in e.value.diagnostics)
