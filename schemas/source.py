"""Safe YAML loading that remembers where every key and value came from.

PyYAML's composer gives nodes with marks; we build plain Python values from them ourselves so
that duplicate keys, aliases (billion-laughs) and multi-document files are rejected and every
field path maps to its line and column.
"""

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from schemas.diagnostics import CompileError, Diagnostic

MAX_BYTES = 1 << 20  # a deployment file is a few KiB; anything this large is a mistake

PathKey = tuple[str | int, ...]


@dataclass(frozen=True)
class Position:
    line: int
    column: int


@dataclass
class SourceMap:
    """Field path -> position of its value (`values`) and of its key (`keys`)."""

    file: str
    values: dict[PathKey, Position] = field(default_factory=dict)
    keys: dict[PathKey, Position] = field(default_factory=dict)

    def locate(self, path: PathKey, prefer_key: bool = False) -> Position:
        """Closest known position of `path`, walking up to its parents when needed."""
        for n in range(len(path), -1, -1):
            sub = path[:n]
            table = (self.keys, self.values) if prefer_key else (self.values, self.keys)
            for t in table:
                if sub in t:
                    return t[sub]
        return Position(1, 1)


@dataclass(frozen=True)
class Document:
    data: object
    source: SourceMap


def format_path(path: PathKey) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _error(file: str, code: str, pos: Position, path: str, expected: str, got: str, hint: str):
    return Diagnostic("error", code, file, pos.line, pos.column, path, expected, got, hint)


class _Builder:
    def __init__(self, file: str):
        self.source = SourceMap(file)
        self.errors: list[Diagnostic] = []
        self.scalar = yaml.SafeLoader("")  # only its scalar constructors are used

    def build(self, node: yaml.Node, path: PathKey) -> object:
        pos = Position(node.start_mark.line + 1, node.start_mark.column + 1)
        self.source.values[path] = pos
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        return self.scalar.construct_object(node, deep=True)

    def _mapping(self, node: yaml.MappingNode, path: PathKey) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            kpos = Position(key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(_error(self.source.file, "E103", kpos, format_path(path),
                                          "a plain key", "a mapping or sequence as key",
                                          "keys are field names"))
                continue
            key = self.scalar.construct_object(key_node)
            key = key if isinstance(key, str) else str(key)
            if key in out:
                first = self.source.keys[(*path, key)]
                self.errors.append(_error(
                    self.source.file, "E005", kpos, format_path((*path, key)),
                    "each key once", f"a second `{key}`",
                    f"`{key}` is already set on line {first.line}; keep one of them"))
                continue
            self.source.keys[(*path, key)] = kpos
            out[key] = self.build(value_node, (*path, key))
        return out


def load_yaml_text(text: str, file: str) -> Document:
    """Parse one YAML document into plain values and a source map, or raise CompileError."""
    here = Position(1, 1)
    if not text.strip():
        raise CompileError([_error(file, "E004", here, "", "a YAML document", "an empty file",
                                   "start from an example in examples/")])
    try:
        alias = next((e for e in yaml.parse(text, Loader=yaml.SafeLoader)
                      if isinstance(e, yaml.AliasEvent)), None)
        if alias is not None:
            pos = Position(alias.start_mark.line + 1, alias.start_mark.column + 1)
            raise CompileError([_error(file, "E006", pos, "", "plain YAML without aliases",
                                       f"alias *{alias.anchor}", "write the value out in full")])
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = Position(mark.line + 1, mark.column + 1) if mark else here
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        hint = "check indentation, colons and quotes near this line"
        raise CompileError([_error(file, "E002", pos, "", "valid YAML", problem, hint)]) from None
    except yaml.YAMLError as exc:
        raise CompileError([_error(file, "E002", here, "", "valid YAML", str(exc).strip(),
                                   "check the file's syntax")]) from None
    nodes = [n for n in nodes if n is not None]
    if len(nodes) != 1:
        got = "no document" if not nodes else f"{len(nodes)} documents"
        raise CompileError([_error(file, "E004" if not nodes else "E006", here, "",
                                   "exactly one YAML document", got,
                                   "put each document in its own file")])
    builder = _Builder(file)
    data = builder.build(nodes[0], ())
    if builder.errors:
        raise CompileError(builder.errors)
    return Document(data, builder.source)


def load_yaml_file(path: Path, shown_as: str | None = None) -> Document:
    """Read and parse a file; `shown_as` is the name diagnostics use (relative, stable)."""
    file = shown_as or str(path)
    here = Position(0, 0)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise CompileError([_error(file, "E003", here, "", f"a file under {MAX_BYTES} bytes",
                                       f"{size} bytes", "this is not a rackc input")])
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CompileError([_error(file, "E001", here, "", "an existing file", "no such file",
                                   "check the path")]) from None
    except IsADirectoryError:
        raise CompileError([_error(file, "E001", here, "", "a file", "a directory",
                                   "name the YAML file inside it")]) from None
    except OSError as exc:
        raise CompileError([_error(file, "E001", here, "", "a readable file",
                                   exc.strerror or str(exc), "check permissions")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CompileError([_error(file, "E002", here, "", "UTF-8 text",
                                   f"undecodable byte at offset {exc.start}",
                                   "save the file as UTF-8")]) from None
    return load_yaml_text(text, file)
