"""P/D hand-offs across NVLink domains priced on the NICs (compiler/perf/handoff.py), against
a hand computation: DeepSeek-V4.1-Flash's FP8 KV is 1,650 bytes per token (its four KV-source
layers of compressed sparse attention, `rackc check` kv_bytes_per_token), so a 32,768-token
prompt hands off 54,067,200 bytes; a Vera Rubin GPU's NIC carries 1,600 Gb/s, at RDMA's 95%
190,000 bytes per microsecond."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from compiler.load import load_inputs
from compiler.perf import handoff
from compiler.perf.capacity import prefill_candidate
from compiler.perf.predict import Layout, context, predict_layout, workload
from compiler.perf.serving import UNBOUNDED_CONCURRENCY, prefix_hit_rate
from compiler.shapes import parse_shape

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vr-nvl72-deepseek-v4.1-flash"
ISL = 32768
BYTES = ISL * 1650  # one request's KV
NIC = 1600 / 8 * 1e3 * 0.95  # bytes per us per GPU
NVLINK = 1800 * 0.81 * 1e3  # Vera Rubin's NVLink per direction, at DeepEP's 81%
P2P_US = 10.0  # the catalog's per-transfer latency


def _racks(root: Path, racks: int, nic_gbps: int | None = None):
    root.mkdir(parents=True, exist_ok=True)
    spec = {"system": "vera-rubin-nvl72", "racks": racks}
    if nic_gbps:
        spec["nic_gbps_per_gpu"] = nic_gbps
    (root / "cluster.yaml").write_text(yaml.safe_dump({
        "apiVersion": "rackc.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "vr"},
        "spec": spec}))
    dep = yaml.safe_load((EXAMPLE / "deployment.yaml").read_text())
    dep["spec"]["rack"] = "cluster.yaml"
    (root / "deployment.yaml").write_text(yaml.safe_dump(dep))
    return load_inputs(root / "deployment.yaml")


@pytest.fixture(scope="module")
def vr(tmp_path_factory):
    return _racks(tmp_path_factory.mktemp("vr2"), 2)


def test_a_hand_off_moves_the_prompts_kv(vr):
    ctx = context(vr, 8, "prefill", parse_shape("DEP8"))
    assert workload(vr).isl == ISL
    assert handoff.request_bytes(ctx, ISL) == BYTES
    assert handoff.nic_bytes_per_us(ctx) == pytest.approx(NIC)


def test_nic_load_and_limit_of_a_prefill_instance(vr):
    """A DEP8 prefill at 1,758.6 requests/s sending every KV across racks keeps its 8 NICs
    6.3% busy; at 95% they would carry 26,707 requests/s."""
    ctx = context(vr, 8, "prefill", parse_shape("DEP8"))
    load = handoff.nic_load(ctx, 1758.6e-6, 8, ISL, 1.0)
    assert load == pytest.approx(1758.6e-6 * BYTES / (8 * NIC))
    assert load == pytest.approx(0.06256, abs=1e-5)
    assert handoff.nic_load(ctx, 1758.6e-6, 8, ISL, 0.5) == pytest.approx(load / 2)
    assert handoff.nic_load(ctx, 1758.6e-6, 8, ISL, 0.0) == 0.0
    limit = handoff.nic_requests_per_us(ctx, 8, ISL, 1.0) * 1e6
    assert limit == pytest.approx(0.95 * 8 * NIC / BYTES * 1e6)
    assert limit == pytest.approx(26707, abs=1)
    assert handoff.nic_requests_per_us(ctx, 8, ISL, 0.0) == float("inf")


def test_hand_off_time_inside_and_across_domains(vr):
    ctx = context(vr, 8, "prefill", parse_shape("DEP8"))
    local = P2P_US + BYTES / NVLINK
    remote = P2P_US + BYTES / NIC
    assert handoff.handoff_us(ctx, ISL, 0.0) == pytest.approx(local)
    assert handoff.handoff_us(ctx, ISL, 1.0) == pytest.approx(remote)
    # at half load a transfer waits for half a transfer on average (M/D/1: rho s / 2(1-rho))
    busy = remote + 0.5 * (BYTES / NIC) / (2 * 0.5)
    assert handoff.handoff_us(ctx, ISL, 1.0, 0.5) == pytest.approx(busy)
    assert handoff.handoff_us(ctx, ISL, 0.25, 0.5) == pytest.approx(0.75 * local + 0.25 * busy)


def test_slow_nics_limit_a_prefill_whose_kv_leaves_its_rack(tmp_path: Path):
    """At 100 Gb/s per GPU a DEP8's NICs carry 90.25 GB/s at 95%: 1,669.2 requests/s, less
    than the 1,758.6 its GPUs prefill. Its own rack's decode takes its KV over NVLink, so
    there it keeps its supply."""
    inputs = _racks(tmp_path, 2, nic_gbps=100)
    w = workload(inputs)
    c = prefill_candidate(inputs, parse_shape("DEP8"), w, 0.96875, 72)
    assert c.requests_per_s == pytest.approx(1758.6, abs=0.1)
    hand = 0.95 * 8 * (100 / 8 * 1e9 * 0.95) / BYTES
    assert hand == pytest.approx(1669.2, abs=0.1)
    assert c.remote_requests_per_s == pytest.approx(hand, rel=1e-6)


def test_the_prediction_holds_the_nic_limit_and_prices_the_wait(tmp_path: Path):
    """The same prefill predicted with every hand-off across racks serves at most what its
    NICs carry, and at one rate its TTFT grows by the transfer over busy NICs."""
    inputs = _racks(tmp_path, 2, nic_gbps=100)
    w = replace(workload(inputs), concurrency=UNBOUNDED_CONCURRENCY)
    assert prefix_hit_rate(w, 1e12) == pytest.approx(0.96875)
    layout = [Layout("prefill", parse_shape("DEP8"), 1),
              Layout("decode", parse_shape("DEP64"), 1)]
    inside = predict_layout(inputs, layout, w, cross=0.0)
    across = predict_layout(inputs, layout, w, cross=1.0)
    assert inside.requests_per_s > 1700
    assert across.requests_per_s <= 1669.2 + 0.1
    at = 1500.0  # requests/s: NICs 85% busy, a 4.55 ms transfer waits 13.3 ms on average
    ctx = context(inputs, 8, "prefill", parse_shape("DEP8"))
    service = BYTES / (100 / 8 * 1e3 * 0.95)
    load = at * 1e-6 * BYTES / (8 * 100 / 8 * 1e3 * 0.95)
    extra = P2P_US + service + load * service / (2 * (1 - load)) \
        - handoff.handoff_us(ctx, ISL, 0.0)
    inside = predict_layout(inputs, layout, w, at, cross=0.0)
    across = predict_layout(inputs, layout, w, at, cross=1.0)
    assert across.requests_per_s == inside.requests_per_s == pytest.approx(at, rel=1e-3)
    assert across.ttft_ms_p50 - inside.ttft_ms_p50 == pytest.approx(extra / 1e3, abs=0.15)
