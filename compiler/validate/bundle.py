"""A compiled bundle read back as objects: the Kubernetes documents of each bundle folder (with
the file and line they start at) and the `vllm/` launch scripts. Pure: takes the emitted files
(path relative to OUT -> text), as `rackc compile` holds them before writing."""

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import yaml

from compiler.documents import Documents

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Folders that are deployed on their own: `kubectl apply -k k8s/` or `-k lws/`, and the
# Mooncake master's own manifests.
BUNDLES = ("k8s", "lws", "mooncake")
SCRIPTS = "vllm"


class _Nodes:
    """A file's documents as YAML nodes, composed the first time a field's line is asked for
    (text that carries its data is not parsed otherwise)."""

    def __init__(self, text: str, nodes: list[yaml.Node] | None = None):
        self.text = str(text)
        self._nodes = nodes

    def __getitem__(self, k: int) -> yaml.Node:
        if self._nodes is None:
            self._nodes = [node for node, _ in _documents(self.text)]
        return self._nodes[k]


@dataclass(frozen=True)
class Obj:
    """One Kubernetes object of the bundle and where it was written."""

    file: str
    line: int
    doc: dict[str, Any] = field(hash=False, compare=False)
    nodes: _Nodes | None = field(default=None, hash=False, compare=False)
    index: int = field(default=0, hash=False, compare=False)  # its document in the file

    @property
    def node(self) -> yaml.Node | None:
        return self.nodes[self.index] if self.nodes is not None else None

    def line_at(self, path: str) -> int:
        """The line of a field path (`spec.components[2].podTemplate`) in the file; the
        nearest parent's when the field is not written."""
        node, line = self.node, self.line
        for key, index in _SEGMENT.findall(path):
            mark = None
            if isinstance(node, yaml.MappingNode) and key:
                pair = next(((k, v) for k, v in node.value if k.value == key), None)
                node, mark = (pair[1], pair[0].start_mark) if pair else (None, None)
            elif isinstance(node, yaml.SequenceNode) and index and \
                    int(index) < len(node.value):
                node = node.value[int(index)]
                mark = node.start_mark
            else:
                node = None
            if node is None or mark is None:
                break
            line = mark.line + 1
        return line

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def name(self) -> str:
        return str((self.doc.get("metadata") or {}).get("name", "?"))

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Script:
    """A `vllm/<instance>/<tray>.sh` launch script: the process it starts on the tray's node."""

    file: str
    instance: str
    tray: str
    env: dict[str, str] = field(hash=False, compare=False)
    argv: tuple[str, ...] = ()  # from `vllm serve`


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def objects(files: Mapping[str, str | bytes], folder: str) -> list[Obj]:
    """The Kubernetes objects in a folder's YAML files (kustomization.yaml aside)."""
    out = []
    for path, text in sorted(files.items()):
        if not (path.startswith(folder + "/") and path.endswith((".yaml", ".yml"))
                and isinstance(text, str)) or PurePosixPath(path).name == "kustomization.yaml":
            continue
        if isinstance(text, Documents):  # emitted in this process: its data, lines known
            nodes = _Nodes(text)
            docs = list(zip(text.lines, text.docs, strict=True))
        else:
            parsed = _documents(text)
            nodes = _Nodes(text, [node for node, _ in parsed])
            docs = [(node.start_mark.line + 1, doc) for node, doc in parsed]
        out += [Obj(path, line, doc, nodes, k) for k, (line, doc) in enumerate(docs)
                if isinstance(doc, dict) and {"apiVersion", "kind"} <= doc.keys()]
    return out


def _documents(text: str) -> list[tuple[yaml.Node, object]]:
    """Each document's node (for line numbers) and its data, parsed once (yaml.load_all's
    loop, keeping the nodes it composes)."""
    loader = _LOADER(text)
    out = []
    try:
        while loader.check_node():
            node = loader.get_node()
            out.append((node, loader.construct_document(node)))
    finally:
        loader.dispose()
    return out


def scripts(files: Mapping[str, str | bytes]) -> list[Script]:
    """The launch scripts: their exports and the `exec vllm ...` line (shell continuations)."""
    out = []
    for path, text in sorted(files.items()):
        p = PurePosixPath(path)
        if p.parts[0] != SCRIPTS or p.suffix != ".sh" or not isinstance(text, str):
            continue
        env: dict[str, str] = {}
        command: list[str] = []
        for line in text.splitlines():
            if line.startswith("export "):
                for word in shlex.split(line[len("export "):]):
                    key, _, value = word.partition("=")
                    env[key] = value
            elif line.startswith("exec ") or command:
                command.append(line.removesuffix("\\"))
        argv = shlex.split(" ".join(command))[1:]
        out.append(Script(path, p.parent.name, p.stem, env, tuple(argv)))
    return out
