"""One broken rule of one object: what every check returns."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    rule: str
    file: str
    line: int
    where: str  # the object and field path
    expected: str
    got: str
    hint: str = ""
