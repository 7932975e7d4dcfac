"""A rack's overrides of the catalog (`dram_gib_per_tray`, `rdma_devices_per_tray`) reach every
consumer: the plan's hardware record, the host budget, the pods' RDMA requests and the
controller-level rules that `rackc compile` enforces (which read the plan, not the catalog)."""

import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import api
from compiler.plan import Plan
from compiler.validate import pods
from schemas.diagnostics import CompileError
from tests.builders import write_case

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RDMA = "rdma/ib"


def _decision(plan: Plan, path: str) -> str:
    [d] = [d for d in plan.decisions if d.path == path]
    return d.value


def check_overrides_reach_consumers(plan: Plan, dram: float | None, rdma: int | None) -> None:
    """Every consumer of a tray's DRAM and RDMA devices sees the value the plan records, and
    the plan records the override where one is written."""
    for hw in plan.fleet:
        if dram is not None:
            assert hw.dram_gib_per_tray == dram
        if rdma is not None:
            assert hw.rdma_devices_per_tray == rdma
        reserve = plan.site.host_reserved_gib
        assert hw.allocatable_gib_per_tray == pytest.approx(hw.dram_gib_per_tray - reserve)
        assert float(_decision(plan, "hardware.allocatable_gib_per_tray")) == pytest.approx(
            hw.allocatable_gib_per_tray)
        for node in pods.nodes(plan, (RDMA,)):
            assert node.capacity[pods.MEMORY] == Fraction(str(hw.allocatable_gib_per_tray)) * 2**30
            assert node.capacity[RDMA] == hw.rdma_devices_per_tray
        for tray, host in plan.host_memory.items():
            assert host.capacity_gib == hw.dram_gib_per_tray, tray
            assert host.reserved_gib == reserve, tray
            used = host.pool_gib + host.engram_gib + host.process_gib + host.weights_gib
            assert used <= hw.allocatable_gib_per_tray + 1e-6, tray
        for size in plan.site.pods:
            inst = next(i for i in plan.instances if i.id == size.instance)
            if size.resources.rdma_devices:
                ranks = max(sum(1 for g in inst.gpus if g.startswith(t + "-")) for t in inst.trays)
                share = hw.rdma_devices_per_tray * ranks // hw.gpus_per_tray
                assert size.resources.rdma_devices == max(1, share)


def rdma_asked_per_tray(plan: Plan) -> dict[str, int]:
    """Tray -> the RDMA devices its pods ask for (one pod per instance and tray)."""
    sizes = {s.instance: s.resources.rdma_devices for s in plan.site.pods}
    out: dict[str, int] = {}
    for inst in plan.instances:
        for tray in inst.trays:
            out[tray] = out.get(tray, 0) + sizes[inst.id]
    return out


@pytest.mark.slow
def test_a_larger_tray_dram_passes_the_enforced_rules(tmp_path: Path):
    """The review's F2: 4,096 GiB per node on the HGX H200 example, with the DRAM pool sized
    from it, compiled to exit 3 (E826) because the rules read the catalog's 2,048 GiB."""
    case = tmp_path / "ex"
    shutil.copytree(EXAMPLES / "hgx-h200-deepseek-v3", case)
    with open(case / "cluster.yaml", "a") as f:
        f.write("  dram_gib_per_tray: 4096\n")
    plan = api.compile(case / "deployment.yaml").plan
    assert max(h.pool_gib for h in plan.host_memory.values()) > 2048 * 0.9 - 5.617
    check_overrides_reach_consumers(plan, 4096.0, None)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dram=st.sampled_from([None, 640.0, 1500.0, 4096.0]),
       rdma=st.sampled_from([None, 1, 2, 8]), pool=st.booleans())
def test_every_rack_override_reaches_every_consumer(tmp_path_factory, dram, rdma, pool):
    """Drawn overrides on one HGX node, compiled with every target and the enforced rules: the
    compile succeeds, and the plan, the host budget, the pods and the rules' node model all
    carry the override."""
    hardware: dict = {"nodes": 1}
    if dram is not None:
        hardware["dram_gib_per_tray"] = dram
    if rdma is not None:
        hardware["rdma_devices_per_tray"] = rdma
    path = write_case(tmp_path_factory.mktemp("override"), system="hgx-h200", kind="Cluster",
                      hardware=hardware, model="qwen3-30b-a3b",
                      serving={"kv_pool": {"dram": True}} if pool else None)
    try:
        plan = api.compile(path).plan
    except CompileError as exc:
        # the one justified refusal: more pods on a tray than it has RDMA devices, each pod
        # needing one (the oracle reads the plan compiled without targets)
        assert {d.code for d in exc.diagnostics} == {"E824"}, [d.render() for d in exc.diagnostics]
        plan = api.compile(path, only=()).plan
        assert max(rdma_asked_per_tray(plan).values()) > plan.fleet[0].rdma_devices_per_tray
    check_overrides_reach_consumers(plan, dram, rdma)
