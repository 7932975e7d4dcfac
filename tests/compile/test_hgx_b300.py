"""HGX B300 (catalog `hgx-b300`): one node of a catalog model compiles, and its prediction runs
on B300's own kernel curves (compiler/catalog/calibration/hgx-b300.json, converted from
AIConfigurator's b300_sxm tables), not on another system's curves."""

import dataclasses
from pathlib import Path

from compiler import api, catalog
from compiler.load import load_inputs
from compiler.perf.ops import op_model
from compiler.perf.predict import context
from compiler.perf.step import decode_step, prefill_step
from compiler.shapes import parse_shape
from tests.builders import write_case


def test_one_hgx_b300_node_compiles_on_b300s_own_curves(tmp_path: Path):
    path = write_case(tmp_path, system="hgx-b300", model="qwen3-30b-a3b", kind="Cluster",
                      hardware={"nodes": 1})
    plan = api.compile(path, only=()).plan
    assert plan.hardware.system == "hgx-b300"
    assert plan.instances and plan.prediction.requests_per_s > 0
    assert {g for i in plan.instances for g in i.gpus} <= {f"r0-t00-g{n}" for n in range(8)}

    shape = parse_shape(plan.instances[0].shape)
    ctx = context(load_inputs(path), shape.gpus, plan.instances[0].role, shape)
    b300 = catalog.system("hgx-b300")

    def steps(calibration: dict | None) -> tuple[float, float]:
        other = dataclasses.replace(ctx, ops=op_model(b300, calibration, ctx.ops.floors))
        return (decode_step(other, shape, 16, 2048).us,
                prefill_step(other, shape, 8192, 1024, 0).us)

    own = (decode_step(ctx, shape, 16, 2048).us, prefill_step(ctx, shape, 8192, 1024, 0).us)
    calibration = catalog.calibration("hgx-b300")
    assert calibration["system"] == "hgx-b300" and "on NVIDIA B300" in calibration["source"]
    assert steps(calibration) == own
    # neither the datasheet peaks alone nor a neighbour's curves give the same steps
    assert steps(None) != own
    for neighbour in ("hgx-b200", "gb300-nvl72"):
        assert steps(catalog.calibration(neighbour)) != own, neighbour
