"""Compiled examples as rule fixtures: the plan and the emitted files, and helpers that edit one
object of a bundle the way a defect would."""

import copy
import functools
from collections.abc import Callable
from pathlib import Path

import yaml

from compiler import api
from compiler.plan import Plan
from tests.conftest import EXAMPLES

VR = "vr-nvl72-deepseek-v4.1-flash"
GB300 = "gb300-nvl72-deepseek-v4.1-flash"
HGX = "hgx-h200-deepseek-v3"
HGX_PP = "hgx-h200-x4-deepseek-v3-128k-pp"
EXAMPLE_NAMES = (VR, GB300, HGX)


@functools.cache
def _compiled(name: str) -> tuple[Plan, dict[str, str | bytes]]:
    result = api.compile(EXAMPLES / name / "deployment.yaml")
    return result.plan, result.artifacts


def compiled(name: str) -> tuple[Plan, dict[str, str | bytes]]:
    """The plan and a copy of the files `rackc compile` emits for an example."""
    plan, files = _compiled(name)
    return plan, dict(files)


def edit(files: dict[str, str | bytes], path: str, kind: str, name_part: str,
         change: Callable[[dict], None]) -> None:
    """Apply `change` to the first object of `kind` in `path` whose name contains `name_part`."""
    docs = list(yaml.safe_load_all(files[path]))
    target = next(d for d in docs if d["kind"] == kind and name_part in d["metadata"]["name"])
    change(target)
    files[path] = yaml.safe_dump_all(docs, sort_keys=False)


def component(dgd: dict, name_part: str) -> dict:
    return next(c for c in dgd["spec"]["components"] if name_part in c["name"])


def pod_spec(dgd: dict, name_part: str) -> dict:
    return component(dgd, name_part)["podTemplate"]["spec"]


def main(spec: dict) -> dict:
    return spec["containers"][0]


def write(files: dict[str, str | bytes], root: Path) -> Path:
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (root / path).write_bytes(content)
        else:
            (root / path).write_text(content)
    return root


def deep(value: dict) -> dict:
    return copy.deepcopy(value)
