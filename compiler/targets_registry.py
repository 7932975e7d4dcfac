"""Targets are found through the `rackc.targets` entry-point group, so the compiler never
imports them (imports flow schemas <- compiler <- targets)."""

from collections.abc import Callable
from importlib.metadata import entry_points

from compiler.plan import Plan

Emit = Callable[[Plan], dict[str, str | bytes]]


def target_names() -> tuple[str, ...]:
    """The installed targets' names, without importing them."""
    return tuple(sorted(ep.name for ep in entry_points(group="rackc.targets")))


def targets(only: tuple[str, ...] | None = None) -> dict[str, Emit]:
    """The installed targets by name; with `only`, just those (the others' modules, which
    import the Kubernetes models, are not loaded)."""
    found = entry_points(group="rackc.targets")
    return {ep.name: ep.load() for ep in sorted(found, key=lambda e: e.name)
            if only is None or ep.name in only}
