"""YAML text that remembers what it was written from.

A target's multi-document YAML file is a `Documents`: a `str` (the file's exact text, written
and hashed as any other) that also holds the data each document was dumped from and the line
it starts at. A reader in the same process, the compile-time bundle rules, takes the data
instead of parsing megabytes back (a 64-rack fleet's bundles: about 36 CPU s of libyaml
parsing); text read from a file is a plain `str` and is parsed. Imports nothing of ours, so
the targets may use it.
"""

from collections.abc import Mapping
from typing import Any


class Documents(str):
    """`docs[k]` is the data of the k-th document, which starts at line `lines[k]`."""

    docs: tuple[Mapping[str, Any], ...]
    lines: tuple[int, ...]

    def __new__(cls, parts: list[str], docs: list[Mapping[str, Any]],
                separator: str = "---\n") -> "Documents":
        """`parts[k]`: document k's text (ending in a newline), joined by `separator`."""
        text = super().__new__(cls, separator.join(parts))
        lines, at = [], 1
        for part in parts:
            lines.append(at)
            at += part.count("\n") + separator.count("\n")
        text.docs, text.lines = tuple(docs), tuple(lines)
        return text

    def __reduce__(self):  # pickled (the emitter process sends it) as a plain str is not
        return _rebuild, (str(self), self.docs, self.lines)


def _rebuild(text: str, docs: tuple, lines: tuple) -> Documents:
    out = str.__new__(Documents, text)
    out.docs, out.lines = docs, lines
    return out
