"""The packaged catalog: systems, models, workload profiles and calibration files.

Everything is read from YAML/JSON data inside the package once and cached.
"""

import functools
import json
from importlib import resources
from pathlib import Path

import yaml

from compiler.catalog.engine import Dynamo, Engines, Mooncake, Vllm
from compiler.catalog.system import System
from compiler.catalog.workload import Profile
from schemas import ModelV1

_DATA = resources.files("compiler.catalog") / "data"
_CALIBRATION = resources.files("compiler.catalog") / "calibration"
_ENGINES = resources.files("compiler.catalog") / "engines"
# One fact set per vLLM release (vllm-<release>.yaml); PLAN_VLLM is the one the plan's kernels
# are chosen for (schemas' serving.vllm_version), the others are the releases a target runs.
VLLM_RELEASES = ("0.33", "0.31")
PLAN_VLLM = "0.33"
ENGINE_FILES = (*(f"vllm-{r}" for r in VLLM_RELEASES), "dynamo", "mooncake")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 5-10x faster


def read_yaml(text: str) -> object:
    """A packaged YAML file's data (safe tags only), through libyaml when it is there."""
    return yaml.load(text, Loader=_LOADER)


def _names(kind: str) -> tuple[str, ...]:
    return tuple(sorted(Path(str(p)).stem for p in (_DATA / kind).iterdir()
                        if str(p).endswith(".yaml")))


def system_names() -> tuple[str, ...]:
    return _names("systems")


def model_names() -> tuple[str, ...]:
    return _names("models")


def workload_names() -> tuple[str, ...]:
    return _names("workloads")


@functools.cache
def system(name: str) -> System:
    return System.model_validate(read_yaml(system_text(name)))


@functools.cache
def model(name: str) -> ModelV1:
    return ModelV1.model_validate(read_yaml((_DATA / "models" / f"{name}.yaml").read_text()))


def model_text(name: str) -> str:
    return (_DATA / "models" / f"{name}.yaml").read_text()


@functools.cache
def workload(name: str) -> Profile:
    return Profile.model_validate(read_yaml(workload_text(name)))


def engine_text(name: str) -> str:
    return (_ENGINES / f"{name}.yaml").read_text()


@functools.cache
def engines() -> Engines:
    """The pinned engines' capabilities (catalog/engines/)."""
    data = {n: read_yaml(engine_text(n)) for n in ENGINE_FILES}
    releases = {r: Vllm.model_validate(data[f"vllm-{r}"]) for r in VLLM_RELEASES}
    assert all(v.version == r for r, v in releases.items()), "vllm-<release>.yaml's version"
    return Engines(vllm=releases[PLAN_VLLM], vllm_releases=releases,
                   dynamo=Dynamo.model_validate(data["dynamo"]),
                   mooncake=Mooncake.model_validate(data["mooncake"]))


def system_text(name: str) -> str:
    return (_DATA / "systems" / f"{name}.yaml").read_text()


def workload_text(name: str) -> str:
    return (_DATA / "workloads" / f"{name}.yaml").read_text()


def calibration_path(system_name: str, suffix: str = "json") -> Path:
    return Path(str(_CALIBRATION / f"{system_name}.{suffix}"))


FLOORS_MEASURED_ON = "hgx-h200"  # the one system whose CUDA-graph kernel floors we measured


@functools.cache
def floors(system_name: str) -> dict:
    """Per-kernel floors under CUDA graphs (compiler/perf/floors.py): the system's own file,
    else the H200's, marked assumed (a kernel's floor is launch and sync, not bandwidth)."""
    for name, note in ((system_name, ""), (FLOORS_MEASURED_ON, "assumed: the H200's floors; ")):
        path = calibration_path(name, "floors.json")
        if path.exists():
            data = json.loads(path.read_text())
            return {**data, "source": note + data["source"]}
    return {"floors": {}, "source": "none: the curves' fitted overheads"}


KERNEL_SOURCES = ("vllm", "sglang", "trtllm")  # whose measured kernels a prediction may use
DEPLOYED_KERNELS = "vllm"  # what the bundle runs; the others are what-ifs (`predict --kernels`)


def kernels_path(system_name: str, kernels: str = DEPLOYED_KERNELS) -> Path:
    """A system's calibration file fitted to `kernels`' measured tables (vLLM's: the one
    every compile uses)."""
    return calibration_path(system_name, "json" if kernels == DEPLOYED_KERNELS
                            else f"{kernels}.json")


@functools.cache
def calibration(system_name: str, kernels: str = DEPLOYED_KERNELS) -> dict | None:
    """The fitted calibration of a system, or None when it only scales from datasheets (or,
    for another engine's kernels, when none was converted for it)."""
    path = kernels_path(system_name, kernels)
    return json.loads(path.read_text()) if path.exists() else None

