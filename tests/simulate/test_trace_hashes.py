"""Traces with block hashes (`hash_ids`, Mooncake's trace format): each request continues the
earlier one with the longest run of shared leading blocks; the run reads those tokens from
the prefix caches and the pool."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.cli import main
from compiler.simulate.workload import hash_prefixes, read_trace
from schemas.diagnostics import CompileError
from tests.simulate.test_cli import DEP, PLAN

# Dynamo's benchmarks/data_generator/README.md example lines (Mooncake's format)
MOONCAKE = [{"timestamp": 0, "input_length": 6755, "output_length": 500,
             "hash_ids": list(range(14))},
            {"timestamp": 0, "input_length": 7319, "output_length": 490,
             "hash_ids": [0, *range(14, 28)]},
            {"timestamp": 3052, "input_length": 7234, "output_length": 794,
             "hash_ids": [0, *range(28, 42)]},
            {"timestamp": 3052, "input_length": 2287, "output_length": 316,
             "hash_ids": [0, 42, 43, 44, 45]}]


def _write(tmp_path: Path, lines: list) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_a_mooncake_trace_reads_as_arrivals_and_shared_blocks(tmp_path: Path):
    r = read_trace(_write(tmp_path, MOONCAKE), "t.jsonl")
    assert list(r.arrival_us) == [0, 0, 3052e3, 3052e3] and (r.client == -1).all()
    assert list(r.isl) == [6755, 7319, 7234, 2287]
    # each later request shares block 0 with the first: 512 tokens of it
    assert list(r.reuse) == [0, 512, 512, 512] and (r.parent[1:] != r.session[1:]).all()
    assert not r.warm.any()  # nothing of a hashed trace is cached before it starts


def test_a_conversation_continues_one_entry_and_a_branch_gets_its_own(tmp_path: Path):
    lines = [{"arrival_s": 0, "input_tokens": 1024, "output_tokens": 8, "hash_ids": [1, 2]},
             {"arrival_s": 1, "input_tokens": 2000, "output_tokens": 8,
              "hash_ids": [1, 2, 3, 4]},  # the next turn: all of the first, and more
             {"arrival_s": 2, "input_tokens": 1500, "output_tokens": 8,
              "hash_ids": [1, 2, 9]}]  # a branch off the first two blocks
    r = read_trace(_write(tmp_path, lines), "t.jsonl", block_size=512)
    assert r.session[1] == r.session[0] and r.reuse[1] == 1024
    assert r.parent[2] == r.session[1] and r.reuse[2] == 1024
    assert r.session[2] != r.session[1]


@pytest.mark.parametrize("line, field", [
    ({"arrival_s": 0, "input_tokens": 600, "output_tokens": 1, "hash_ids": [1, 2, 3]},
     "hash_ids"),  # 3 blocks for 600 tokens of 512
    ({"arrival_s": 0, "input_tokens": 600, "output_tokens": 1, "hash_ids": [1],
      "prefix_tokens": 10}, "hash_ids"),
    ({"arrival_s": 0, "input_tokens": 600, "output_tokens": 1, "hash_ids": ["a"]},
     "hash_ids"),
    ({"timestamp": 0, "arrival_s": 0, "input_tokens": 6, "output_tokens": 1}, "timestamp")])
def test_bad_hash_lines_are_diagnosed(tmp_path: Path, line: dict, field: str):
    with pytest.raises(CompileError) as e:
        read_trace(_write(tmp_path, [line]), "t.jsonl")
    (d,) = e.value.diagnostics
    assert d.code == "E752" and d.line == 1 and d.path == field


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=5), min_size=1, max_size=12))
def test_the_match_is_the_longest_shared_run_of_leading_blocks(seqs):
    """Oracle: brute force over every earlier request's blocks."""
    n = len(seqs)
    isl = np.array([len(s) * 16 for s in seqs])
    own = -1 - np.arange(n)
    key, parent, reuse = hash_prefixes(seqs, isl, own, own.copy(), np.zeros(n, dtype=int), 16)
    for i, s in enumerate(seqs):
        best = 0
        for e in seqs[:i]:
            k = 0
            while k < min(len(s), len(e)) and s[k] == e[k]:
                k += 1
            best = max(best, k)
        assert reuse[i] == best * 16
        if best:  # the request it continues holds (at least) those blocks
            j = max(j for j in range(i) if key[j] == parent[i])
            assert seqs[j][:best] == s[:best]


def test_shared_blocks_are_read_from_the_caches(tmp_path: Path, capsys):
    base = [{"arrival_s": 0.01 * k, "input_tokens": 4096, "output_tokens": 16,
             "hash_ids": [0, 1, 2, 3, 4, 5, 6, 100 + k]} for k in range(60)]
    hashed = _write(tmp_path, base)
    assert main(["simulate", PLAN, "--deployment", DEP, "--trace", str(hashed),
                 "--format", "json"]) == 0
    with_hashes = json.loads(capsys.readouterr().out)["policies"]["kv"]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in x.items() if k != "hash_ids"})
                             + "\n" for x in base))
    assert main(["simulate", PLAN, "--deployment", DEP, "--trace", str(plain),
                 "--format", "json"]) == 0
    without = json.loads(capsys.readouterr().out)["policies"]["kv"]
    assert with_hashes["finished"] == without["finished"] == 60
    assert without["prefix_hit_rate"] == 0
    # 7 of 8 blocks shared once the first request's prefill has stored them
    assert 0.5 < with_hashes["prefix_hit_rate"] <= 7 * 512 / 4096


def test_the_block_size_comes_from_the_command_line(tmp_path: Path, capsys):
    lines = [{"arrival_s": 0.01 * k, "input_tokens": 4096, "output_tokens": 16,
              "hash_ids": [0, 1, 2, 3, 4, 5, 6, 100 + k]} for k in range(60)]
    trace = _write(tmp_path, lines)
    assert main(["simulate", PLAN, "--deployment", DEP, "--trace", str(trace),
                 "--trace-block-size", "256", "--format", "json"]) == 0
    hit = json.loads(capsys.readouterr().out)["policies"]["kv"]["prefix_hit_rate"]
    assert 0.3 < hit <= 7 * 256 / 4096  # 7 shared blocks of 256 tokens, not of 512
