"""Hostile input: files that are not regular, too large or too deep, YAML that builds objects,
numbers beyond any domain, odd JSON for import-hf and perf ops: a diagnostic, quickly, never a
traceback or a hang."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compiler import api
from compiler.hf_import import import_hf
from compiler.perf import query
from schemas.diagnostics import CompileError
from schemas.source import MAX_DEPTH, load_yaml_file, load_yaml_text
from tests.builders import write_case

ROOT = Path(__file__).resolve().parents[2]
VR = ROOT / "examples" / "vr-nvl72-deepseek-v4.1-flash" / "deployment.yaml"
HF = ROOT / "tests" / "inputs" / "hf" / "deepseek-v3.json"


def _line(path: Path, starts: str) -> int:
    """The 1-based line of `path` that begins with `starts` (the example's header may grow)."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.startswith(starts))


def _codes(call) -> list[str]:
    with pytest.raises(CompileError) as info:
        call()
    return [d.code for d in info.value.diagnostics]


@pytest.mark.parametrize(("text", "code"), [
    ("a: !foo x\n", "E007"),
    ("a: !!python/object/apply:os.system [ls]\n", "E007"),
    ("a: !!binary aGk=\n", "E007"),
    ("a: !!int 'abc'\n", "E007"),
    ("a: !!timestamp x\n", "E007"),
    ("a: ! x\n", "E007"),
    ("<<: {b: 1}\n", "E008"),
    ("? [a, b]\n: 1\n", "E009"),
    ("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n", "E012"),
    ("a: 2024-13-45\n", "E013"),
    ("a: " + "9" * 5000 + "\n", "E013"),
    ("a: =\n", "E013"),
    ("a: &x 1\nb: *x\n", "E006"),
])
def test_yaml_that_is_not_plain_data_is_a_diagnostic_at_its_node(text: str, code: str):
    with pytest.raises(CompileError) as info:
        load_yaml_text(text, "f.yaml")
    d = info.value.diagnostics[0]
    assert d.code == code and d.line >= 1 and d.expected and d.got


def test_deep_nesting_never_recurses():
    """Far deeper than the interpreter's recursion limit: stopped at the first node too deep."""
    start = time.perf_counter()
    assert _codes(lambda: load_yaml_text("a: " + "[" * 30000 + "]" * 30000, "f")) == ["E012"]
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("size", [64 * 1024 + 1, 1 << 20])
def test_large_files_are_refused_in_milliseconds(tmp_path: Path, size: int):
    path = tmp_path / "deployment.yaml"
    path.write_bytes(b"#" * size)
    start = time.perf_counter()
    assert _codes(lambda: api.check(path)) == ["E003"]
    assert time.perf_counter() - start < 0.05


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero", "loop", "nul", "long"])
def test_only_regular_files_are_read(tmp_path: Path, kind: str):
    path = tmp_path / "deployment.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would block: it is never opened
    elif kind == "dir":
        path.mkdir()
    elif kind == "zero":
        path = Path("/dev/zero")
    elif kind == "loop":
        os.symlink(path.name, path)
    elif kind == "nul":
        path = tmp_path / "a\0b.yaml"
    else:
        path = tmp_path / ("x" * 300)
    assert _codes(lambda: load_yaml_file(path, "d.yaml")) == ["E001"]


@pytest.mark.parametrize(("rack", "got"), [
    ("/dev/zero", "character device"), (".", "directory"), ("fifo.yaml", "FIFO"),
    ("loop.yaml", "symlink loop"), ("big.yaml", "64 KiB"), ("x" * 300, "255 bytes"),
    ("rack.yaml/x", "not a folder"),
])
def test_reference_problems_are_blamed_on_the_rack_field(tmp_path: Path, rack: str, got: str):
    text = VR.read_text().replace("rack: rack.yaml", f"rack: {json.dumps(rack)}")
    (tmp_path / "deployment.yaml").write_text(text)
    (tmp_path / "rack.yaml").write_text((VR.parent / "rack.yaml").read_text())
    os.mkfifo(tmp_path / "fifo.yaml")
    os.symlink("loop.yaml", tmp_path / "loop.yaml")
    (tmp_path / "big.yaml").write_bytes(b"#" * (1 << 20))
    with pytest.raises(CompileError) as info:
        api.check(tmp_path / "deployment.yaml")
    d = info.value.diagnostics[0]
    rack = _line(VR, "  rack:")
    assert (d.code, d.path, d.line) in (("E204", "spec.rack", rack), ("E003", "spec.rack", rack))
    assert got in d.got + d.expected


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("tokens_per_s_per_user_p90", ".inf", "a number > 0 and <= 10000"),
    ("tokens_per_s_per_user_p90", ".nan", "a number > 0 and <= 10000"),
    ("tokens_per_s_per_user_p90", "1.0e+308", "a number > 0 and <= 10000"),
    ("tokens_per_s_per_user_p90", "-1.0e+999", "a number > 0 and <= 10000"),
])
def test_numbers_beyond_the_domain_are_refused_at_the_field(tmp_path: Path, field: str,
                                                            value: str, expected: str):
    text = VR.read_text().replace(f"{field}: 387", f"{field}: {value}")
    (tmp_path / "deployment.yaml").write_text(text)
    (tmp_path / "rack.yaml").write_text((VR.parent / "rack.yaml").read_text())
    with pytest.raises(CompileError) as info:
        api.check(tmp_path / "deployment.yaml")
    d = info.value.diagnostics[0]
    assert (d.code, d.path, d.expected) == ("E104", f"spec.slo.{field}", expected)


def test_five_thousand_digits_are_refused_at_the_field(tmp_path: Path):
    text = VR.read_text().replace("tokens_per_s_per_user_p90: 387",
                                  "tokens_per_s_per_user_p90: " + "9" * 4000)
    (tmp_path / "deployment.yaml").write_text(text)
    (tmp_path / "rack.yaml").write_text((VR.parent / "rack.yaml").read_text())
    with pytest.raises(CompileError) as info:
        api.check(tmp_path / "deployment.yaml")
    d = info.value.diagnostics[0]
    assert d.path == "spec.slo.tokens_per_s_per_user_p90" \
        and d.line == _line(VR, "    tokens_per_s_per_user_p90:")
    assert d.got.startswith("an integer of about 400") and d.got.endswith(" digits")


def _plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "code"), [
    ("a: &x [1]\nb: *x\n", "E006"), ("a: !!python/name:os.system x\n", "E007"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "E012"), ("a: 1\n", "E701"), ("", "E004"),
])
def test_plan_loader_has_the_input_caps(tmp_path: Path, text: str, code: str):
    assert set(_codes(lambda: api.read_plan(_plan(tmp_path, text)))) == {code}


def test_plan_loader_reads_regular_files_only(tmp_path: Path):
    os.mkfifo(tmp_path / "plan.yaml")
    assert _codes(lambda: api.read_plan(tmp_path / "plan.yaml")) == ["E001"]
    assert _codes(lambda: api.read_plan(Path("/dev/zero"))) == ["E001"]


def _config(tmp_path: Path, **changes) -> Path:
    data = {**json.loads(HF.read_text()), **changes}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("changes", "code", "key", "expected"), [
    ({"num_hidden_layers": "61"}, "E402", "num_hidden_layers", "an integer"),
    ({"num_attention_heads": True}, "E402", "num_attention_heads", "an integer"),
    ({"vocab_size": 1.5}, "E402", "vocab_size", "an integer"),
    ({"quantization_config": [1]}, "E402", "quantization_config", "an object"),
    ({"quantization_config": {"quant_method": 8}}, "E402", "quantization_config.quant_method",
     "a string"),
    ({"tie_word_embeddings": "no"}, "E402", "tie_word_embeddings", "true or false"),
    ({"architectures": "DeepseekV3ForCausalLM"}, "E402", "architectures", "a list"),
    ({"architectures": [{}]}, "E401", "architectures[0]", "a supported architecture"),
    ({"num_attention_heads": 0}, "E403", "num_attention_heads", "an integer from 1 to 1024"),
    ({"hidden_size": 10**100}, "E403", "hidden_size", "an integer from 1 to 131072"),
    ({"num_experts_per_tok": 1000}, "E403", "num_experts_per_tok", "at most moe.experts (256)"),
    ({"first_k_dense_replace": 100}, "E403", "first_k_dense_replace", "at most layers (61)"),
])
def test_import_hf_names_the_key_and_the_expected_type(tmp_path: Path, changes: dict,
                                                       code: str, key: str, expected: str):
    with pytest.raises(CompileError) as info:
        import_hf(_config(tmp_path, **changes), "config.json")
    found = [(d.code, d.path, d.expected) for d in info.value.diagnostics]
    assert (code, key, expected) in found


@pytest.mark.parametrize("text", ['{"a": ' + "9" * 5000 + "}", "[" * 100_000, "{]", '"x"'])
def test_import_hf_json_failures_are_diagnostics(tmp_path: Path, text: str):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert _codes(lambda: import_hf(path, "config.json"))[0] in ("E002", "E006")


def test_import_hf_reads_regular_files_of_at_most_a_mebibyte(tmp_path: Path):
    os.mkfifo(tmp_path / "fifo.json")
    assert _codes(lambda: import_hf(tmp_path / "fifo.json", "f")) == ["E001"]
    (tmp_path / "big.json").write_text(" " * (2 << 20) + "{}")
    assert _codes(lambda: import_hf(tmp_path / "big.json", "f")) == ["E003"]


@pytest.mark.parametrize("line", [
    '{"op": ["gemm"]}', '{"op": {"a": 1}}', '{"op": 5}', "[1]", "null",
    '{"op": "copy", "bytes": ' + "9" * 5000 + "}", "[" * 50_000, "x" * (query.MAX_LINE + 10),
])
def test_perf_ops_bad_lines_get_an_e601_line_and_the_stream_goes_on(line: str):
    good = '{"op": "copy", "bytes": 1024}'
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "perf", "ops", "--system",
                           "hgx-h200"], input=f"{line}\n{good}\n", capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error[E601] <stdin>:1 ")
    assert json.loads(proc.stdout)["op"] == "copy"


def test_over_long_perf_ops_line_is_never_held_whole():
    """Only MAX_LINE + 1 characters of a line are read at once; the rest is skipped."""
    class Stream:
        def __init__(self):
            self.parts, self.reads = ["next\n", "end of the long line\n"], []

        def readline(self, limit: int) -> str:
            self.reads.append(limit)
            if len(self.reads) <= 1000:
                return "x" * limit
            return self.parts.pop() if self.parts else ""

    stream = Stream()
    lines = list(query.capped_lines(stream))
    assert [len(x) for x in lines] == [query.MAX_LINE + 1, 5]
    assert max(stream.reads) == query.MAX_LINE + 1


def test_hardware_too_small_for_both_roles_blames_the_count(tmp_path: Path):
    """Not spec.system: the number of nodes the user wrote is what to change (one node holds
    one aggregated DeepSeek-V3, not a prefill and a decode instance)."""
    path = write_case(tmp_path, system="hgx-h200", kind="Cluster", hardware={"nodes": 1},
                      model="deepseek-v3", workload={"profile": "chat"},
                      objective={"layout": "disaggregated"})
    with pytest.raises(CompileError) as info:
        api.compile(path, only=())
    d = info.value.diagnostics[0]
    assert (info.value.exit_code, d.code, d.path, d.line) == (3, "E501", "spec.nodes", 7)
