"""Invariants over the compiled examples (each compiled once per session,
tests/targets/fixtures.compiled_plan): every instance carries its own decisions, and the KV
cache of every GPU of every instance holds one maximum-length request."""

import pytest

from compiler import arch, catalog
from compiler.memory import kv_bytes_per_token_per_gpu
from compiler.plan import Instance, Plan
from compiler.shapes import parse_shape, stage_layer_mix
from tests.targets.fixtures import EXAMPLE_CASES

pytestmark = pytest.mark.slow

_CASES = sorted(EXAMPLE_CASES)


@pytest.mark.parametrize("case", _CASES)
def test_every_instance_has_its_decisions(case: str):
    plan = EXAMPLE_CASES[case]()
    by_path = {d.path: d for d in plan.decisions}
    for inst in plan.instances:
        placed = by_path.get(f"instances.{inst.id}")
        assert placed is not None, f"{inst.id} has no placement decision"
        assert placed.value == f"{inst.shape} on " + ",".join(inst.trays), inst.id
        key, value = ("max_batched_tokens", inst.max_batched_tokens) if inst.role == "prefill" \
            else ("max_batch", inst.max_batch)
        limit = by_path.get(f"instances.{inst.id}.{key}")
        assert limit is not None and limit.value == str(value), f"{inst.id}.{key}"


def _kv_gib_of(plan: Plan, gpu: str) -> float:
    return sum(m.kv_gib for dom, m in plan.memory.items() if dom.rsplit("-d", 1)[0] == gpu)


def _one_request_gib(plan: Plan, inst: Instance, stage: int) -> float:
    """KV of one `max_model_len` request on one GPU of `stage` (its share of the full-attention
    layers, plus its sliding layers' windows)."""
    model = catalog.model(plan.model.name).spec
    shape = parse_shape(inst.shape)
    dtype = plan.serving.kv_cache_dtype
    per_token = kv_bytes_per_token_per_gpu(model, shape, dtype)
    window = arch.kv_window_bytes_per_request(model, dtype)
    n, _, w = stage_layer_mix(model, shape.pp)[stage]
    full, sliding = model.layers - model.attention.sliding_layers, model.attention.sliding_layers
    full_share = (n - w) / full if shape.pp > 1 and full else 1.0
    window_share = w / sliding if shape.pp > 1 and sliding else 1.0
    return (per_token * full_share * plan.serving.max_model_len + window * window_share) \
        / arch.GIB


@pytest.mark.parametrize("case", sorted(EXAMPLE_CASES))
def test_kv_holds_one_maximum_length_request_per_instance(case: str):
    plan = EXAMPLE_CASES[case]()
    for inst in plan.instances:
        per_stage = len(inst.gpus) // inst.pp
        for rank, gpu in enumerate(inst.gpus):
            need = _one_request_gib(plan, inst, rank // per_stage)
            assert _kv_gib_of(plan, gpu) >= need - 1e-3, (
                f"{inst.id} rank {rank} ({gpu}): KV {_kv_gib_of(plan, gpu):.3f} GiB < one "
                f"{plan.serving.max_model_len}-token request {need:.3f} GiB")
