"""Small deployments written into a temporary folder, for solver and compile tests."""

from pathlib import Path

import yaml

from compiler.graph import build_graph
from compiler.load import load_inputs
from compiler.precheck import precheck
from compiler.solve.build import build_problem
from compiler.solve.problem import Problem


def write_case(root: Path, system: str = "gb200-nvl72", model: str = "qwen3-30b-a3b",
               hardware: dict | None = None, kind: str = "Rack", workload: dict | None = None,
               objective: dict | None = None, slo: dict | None = None,
               serving: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rack = {"apiVersion": "rackc.dev/v1alpha1", "kind": kind, "metadata": {"name": "hw"},
            "spec": {"system": system, **(hardware or {})}}
    spec: dict = {"rack": "rack.yaml", "model": model,
                  "workload": workload or {"profile": "fixed"}}
    for key, value in (("objective", objective), ("slo", slo), ("serving", serving)):
        if value is not None:
            spec[key] = value
    dep = {"apiVersion": "rackc.dev/v1alpha1", "kind": "Deployment",
           "metadata": {"name": "case"}, "spec": spec}
    (root / "rack.yaml").write_text(yaml.safe_dump(rack, sort_keys=False))
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep, sort_keys=False))
    return root / "deployment.yaml"


def problem_at(deployment: Path) -> Problem:
    """The solver's Problem for a deployment, built as `rackc compile` builds it."""
    inputs = load_inputs(deployment)
    g = build_graph(inputs)
    return build_problem(inputs, g, precheck(inputs, g))
