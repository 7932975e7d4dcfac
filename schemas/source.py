"""Safe YAML loading that remembers where every key and value came from.

Hostile input is refused before it costs time or memory: only regular files are opened (never a
FIFO, a device or a folder), at most `cap + 1` bytes are read, and the parser's event stream is
checked (aliases, explicit tags, nesting depth) before PyYAML's recursive composer sees it. We
then build plain Python values from the nodes ourselves, so that duplicate keys, merge keys,
complex keys and scalars PyYAML cannot build (`2024-13-45`, a 5000-digit integer) are
diagnostics at their node, and every field path maps to its line and column.
"""

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from schemas.diagnostics import CompileError, Diagnostic
from schemas.reading import FileProblem, read_regular

MAX_DEPTH = 32  # inputs nest about 5 deep; the composer recurses once per level
MAX_ERRORS = 20  # per file: enough to fix, not a flood

PathKey = tuple[str | int, ...]

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present
_MERGE = "tag:yaml.org,2002:merge"


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

    root: PathKey = ()  # a group's view (`group`): where its `spec` sits in the file

    def group(self, index: int) -> "SourceMap":
        """The view of `spec.groups[index]` of a mixed-fleet Cluster as if it were `spec`."""
        root = ("spec", "groups", index)

        def view(table: dict[PathKey, Position]) -> dict[PathKey, Position]:
            out = {p: pos for p, pos in table.items() if p[:2] != ("spec", "groups")}
            out.update({("spec", *p[3:]): pos for p, pos in table.items() if p[:3] == root})
            return out
        return SourceMap(self.file, view(self.values), view(self.keys), root)

    def shown(self, path: PathKey) -> PathKey:
        """`path` as written in the file (a group's `spec.x` is `spec.groups[i].x`)."""
        return self.root + path[1:] if self.root and path[:1] == ("spec",) else path

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


def _pos(mark: yaml.Mark | None) -> Position:
    return Position(mark.line + 1, mark.column + 1) if mark else Position(1, 1)


def _short(text: str, limit: int = 60) -> str:
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- reading and parsing: events checked before composing ------------------------------------

def file_error(problem: FileProblem, file: str) -> CompileError:
    """A FileProblem blamed on the file itself."""
    return CompileError([_error(file, problem.code, Position(0, 0), "", problem.expected,
                                problem.got, problem.hint)])


def decode_utf8(raw: bytes, file: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CompileError([_error(file, "E002", Position(0, 0), "", "UTF-8 text",
                                   f"undecodable byte at offset {exc.start}",
                                   "save the file as UTF-8")]) from None


def _tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,") \
        else tag


def _scan(events: Iterable[yaml.Event], file: str) -> tuple[list[yaml.Event], list[Diagnostic]]:
    """The events, with the aliases, explicit tags and nesting beyond MAX_DEPTH among them,
    found in one pass without composing (so nothing recurses); stops at the first node too
    deep, before the parser reads further."""
    kept: list[yaml.Event] = []
    errors: list[Diagnostic] = []
    depth = 0
    for event in events:
        kept.append(event)
        if isinstance(event, yaml.AliasEvent):
            errors.append(_error(file, "E006", _pos(event.start_mark), "",
                                 "plain YAML without aliases", f"alias *{_short(event.anchor)}",
                                 "write the value out in full"))
        elif isinstance(event, yaml.NodeEvent) and event.tag is not None:
            errors.append(_error(file, "E007", _pos(event.start_mark), "",
                                 "plain YAML without tags", f"tag {_short(_tag(event.tag))}",
                                 "remove the tag: rackc reads plain strings, numbers, booleans, "
                                 "lists and mappings"))
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                errors.append(_error(file, "E012", _pos(event.start_mark), "",
                                     f"nesting at most {MAX_DEPTH} deep", "deeper nesting",
                                     "rackc inputs nest a few levels; check the brackets"))
                break
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if len(errors) >= MAX_ERRORS:
            break
    return kept, errors


class _Replay(yaml.composer.Composer, yaml.resolver.Resolver):
    """PyYAML's composer over events already parsed and checked."""

    def __init__(self, events: list[yaml.Event]):
        yaml.composer.Composer.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._events, self._next = events, 0

    def check_event(self, *choices: type) -> bool:
        if self._next >= len(self._events):
            return False
        return not choices or isinstance(self._events[self._next], choices)

    def peek_event(self) -> yaml.Event:
        return self._events[self._next]

    def get_event(self) -> yaml.Event:
        self._next += 1
        return self._events[self._next - 1]


def checked_events(text: str, file: str, loader: type = _LOADER) -> list[yaml.Event]:
    """The parse events of one YAML document, or CompileError: syntax (E002), no document
    (E004), several documents (E006), aliases (E006), tags (E007), depth (E012)."""
    here = Position(1, 1)
    if not text.strip():
        raise CompileError([_error(file, "E004", here, "", "a YAML document", "an empty file",
                                   "start from an example in examples/")])
    try:
        events, errors = _scan(yaml.parse(text, Loader=loader), file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        if "nesting depth" in problem:  # libyaml's own limit, met while it scans ahead
            raise CompileError([_error(file, "E012", _pos(mark), "",
                                       f"nesting at most {MAX_DEPTH} deep", problem,
                                       "rackc inputs nest a few levels; check the brackets")]) \
                from None
        raise CompileError([_error(file, "E002", _pos(mark), "", "valid YAML", problem,
                                   "check indentation, colons and quotes near this line")]) \
            from None
    except (yaml.YAMLError, ValueError) as exc:
        raise CompileError([_error(file, "E002", here, "", "valid YAML", _short(str(exc)),
                                   "check the file's syntax")]) from None
    if errors:
        raise CompileError(errors)
    documents = sum(isinstance(e, yaml.DocumentStartEvent) for e in events)
    if documents != 1:
        got = "no document" if not documents else f"{documents} documents"
        raise CompileError([_error(file, "E004" if not documents else "E006", here, "",
                                   "exactly one YAML document", got,
                                   "put each document in its own file")])
    return events


def data_of(events: list[yaml.Event]) -> object:
    """The data of one document's events as checked_events returned them (no aliases, no
    tags), what `yaml.load` builds from the same text, without parsing it again: plain
    scalars resolved and built as PyYAML's safe loader does, quoted ones strings. A key that
    is a list or mapping raises TypeError, as a mapping cannot hold it."""
    resolver, constructor = yaml.resolver.Resolver(), yaml.constructor.SafeConstructor()
    built: dict[str, object] = {}  # plain scalar -> its value (plans repeat ids and numbers)
    stack: list[list | dict] = []
    keys: list[object] = []  # per open mapping, the key waiting for its value (or _NO_KEY)
    root: list[object] = []

    def add(value: object) -> None:
        if not stack:
            root.append(value)
        elif isinstance(stack[-1], list):
            stack[-1].append(value)
        elif keys[-1] is _NO_KEY:
            hash(value)  # TypeError for a complex key, as yaml.load's constructor
            keys[-1] = value
        else:
            stack[-1][keys[-1]] = value
            keys[-1] = _NO_KEY

    for event in events:
        if isinstance(event, yaml.ScalarEvent):
            if not event.implicit[0]:  # quoted
                add(event.value)
                continue
            value = built.get(event.value, _NO_KEY)
            if value is _NO_KEY:
                node = yaml.ScalarNode(resolver.resolve(yaml.ScalarNode, event.value,
                                                        (True, False)), event.value)
                value = built[event.value] = constructor.construct_object(node)
            add(value)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            stack.append([] if isinstance(event, yaml.SequenceStartEvent) else {})
            keys.append(_NO_KEY)
        elif isinstance(event, yaml.CollectionEndEvent):
            done = stack.pop()
            keys.pop()
            add(done)
    return root[0] if root else None


_NO_KEY = object()


class _Builder:
    def __init__(self, file: str):
        self.source = SourceMap(file)
        self.errors: list[Diagnostic] = []
        self.scalar = yaml.SafeLoader("")  # only its scalar constructors are used

    def fail(self, node: yaml.Node, code: str, path: PathKey, expected: str, got: str,
             hint: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(_error(self.source.file, code, _pos(node.start_mark),
                                      format_path(path), expected, got, hint))

    def build(self, node: yaml.Node, path: PathKey) -> object:
        self.source.values[path] = _pos(node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        return self._scalar(node, path)

    def _scalar(self, node: yaml.ScalarNode, path: PathKey) -> object:
        try:
            return self.scalar.construct_object(node)
        except (ValueError, OverflowError, yaml.YAMLError) as exc:
            if node.tag.endswith(":int"):
                limit = sys.get_int_max_str_digits()
                expected = f"an integer of at most {limit} digits"
                got = f"{sum(c.isdigit() for c in node.value)} digits"
            else:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                expected, got = "a value YAML can build", _short(f"{node.value!r}: {reason}")
            self.fail(node, "E013", path, expected, got,
                      "quote it if it is text; counts and sizes are small numbers")
            return None

    def _mapping(self, node: yaml.MappingNode, path: PathKey) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            kpos = _pos(key_node.start_mark)
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(key_node, "E009", path, "a plain key",
                          "a mapping or sequence as key", "keys are field names")
                continue
            if key_node.tag == _MERGE:
                self.fail(key_node, "E008", path, "plain keys", "a merge key `<<`",
                          "write the merged keys out in full")
                continue
            key = self._scalar(key_node, path)
            key = key if isinstance(key, str) else str(key)
            if key in out:
                first = self.source.keys[(*path, key)]
                self.fail(key_node, "E005", (*path, key), "each key once", f"a second `{key}`",
                          f"`{key}` is already set on line {first.line}; keep one of them")
                continue
            self.source.keys[(*path, key)] = kpos
            out[key] = self.build(value_node, (*path, key))
        return out


def load_yaml_text(text: str, file: str) -> Document:
    """Parse one YAML document into plain values and a source map, or raise CompileError."""
    events = checked_events(text, file)
    try:
        node = _Replay(events).get_single_node()
    except yaml.MarkedYAMLError as exc:  # e.g. an anchor defined twice
        problem = "; ".join(p for p in (exc.context, exc.problem) if p) or "invalid YAML"
        raise CompileError([_error(file, "E002", _pos(exc.problem_mark), "", "valid YAML",
                                   _short(problem.strip(), 80),
                                   "check the file's syntax")]) from None
    builder = _Builder(file)
    data = builder.build(node, ())
    if builder.errors:
        raise CompileError(builder.errors)
    return Document(data, builder.source)


def load_yaml_bytes(raw: bytes, file: str) -> Document:
    return load_yaml_text(decode_utf8(raw, file), file)


def load_yaml_file(path: Path, shown_as: str | None = None) -> Document:
    """Read and parse a file; `shown_as` is the name diagnostics use (relative, stable)."""
    file = shown_as or str(path)
    try:
        raw = read_regular(path)
    except FileProblem as problem:
        raise file_error(problem, file) from None
    return load_yaml_bytes(raw, file)
