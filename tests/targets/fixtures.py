"""The plans the target tests read, each compiled by rackc from a deployment on disk: the
examples (examples/) and the layouts and site inputs no example has (tests/inputs/):

- `vr-nvl72-pinned-site`: DeepSeek-V4.1-Flash on a Vera Rubin NVL72 rack with a pinned layout,
  two DEP2 prefill instances on each of two trays and TP8 decode instances over two trays each,
  idle trays, on a site that sets the inputs the examples leave at their defaults (Dynamo image,
  SR-IOV RDMA with named HCAs, a PVC cache, a token Secret, a priority class, tolerations).
"""

import functools
import shutil
from pathlib import Path

import yaml

from compiler import api
from compiler.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INPUTS = Path(__file__).resolve().parents[1] / "inputs"
INPUT_CASES = ("vr-nvl72-pinned-site",)


def case_folder(case: str) -> Path:
    """The folder of a case's deployment.yaml: tests/inputs/ for INPUT_CASES, else examples/."""
    return (INPUTS if case in INPUT_CASES else EXAMPLES) / case


def compile_case(case: str) -> Plan:
    """The plan `rackc compile` makes for one of examples/ or INPUT_CASES (targets not emitted)."""
    return api.compile(case_folder(case) / "deployment.yaml", only=()).plan


@functools.cache
def compiled_plan(case: str) -> Plan:
    """`compile_case`, once per process: plans are frozen, a test copies one to change it."""
    return compile_case(case)


def compiled_with_site(case: str, site: dict, folder: Path) -> Plan:
    """The case compiled again in `folder` (a copy of its inputs) with the top-level keys of its
    `spec.site` replaced by those of `site`."""
    shutil.copytree(case_folder(case), folder, dirs_exist_ok=True)
    path = folder / "deployment.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["spec"]["site"] = {**doc["spec"].get("site", {}), **site}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return api.compile(path, only=()).plan


# fleet-sized examples: every target of every instance would make megabytes of goldens and
# minutes of conformance runs; tests/compile/test_golden_fleet.py checks a summary instead
FLEET_EXAMPLES = ("vr-nvl72-x16-deepseek-v4.1-flash",)
EXAMPLE_CASES = {p.parent.name: functools.partial(compiled_plan, p.parent.name)
                 for p in sorted(EXAMPLES.glob("*/deployment.yaml"))
                 if p.parent.name not in FLEET_EXAMPLES}
# every plan the consistency, site and conformance tests run
ALL_CASES = {**EXAMPLE_CASES, **{c: functools.partial(compiled_plan, c) for c in INPUT_CASES}}
# served without the Mooncake pool (a pipelined prefill: vLLM 0.33's store connector takes no
# stages); tests/targets/test_consistency.py checks that they emit none of it
POOL_FREE = frozenset({"hgx-h200-x4-deepseek-v3-128k-pp"})
POOL_CASES = sorted(set(ALL_CASES) - POOL_FREE)
