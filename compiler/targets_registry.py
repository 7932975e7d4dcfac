"""Targets are found through the `rackc.targets` entry-point group, so the compiler never
imports them (imports flow schemas <- compiler <- targets)."""

from collections.abc import Callable
from importlib.metadata import entry_points

from compiler.plan import Plan

Emit = Callable[[Plan], dict[str, str | bytes]]


def targets() -> dict[str, Emit]:
    found = entry_points(group="rackc.targets")
    return {ep.name: ep.load() for ep in sorted(found, key=lambda e: e.name)}
