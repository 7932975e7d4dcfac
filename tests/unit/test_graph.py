"""The hardware graph has the right shape for every system, and its helpers answer correctly."""

from pathlib import Path

import pytest

from compiler import graph
from compiler.graph import build_graph
from compiler.load import load_inputs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

RACK = """apiVersion: rackc.dev/v1alpha1
kind: {kind}
metadata: {{name: hw}}
spec:
  system: {system}
{extra}"""
DEPLOYMENT = """apiVersion: rackc.dev/v1alpha1
kind: Deployment
metadata: {name: d}
spec:
  rack: rack.yaml
  model: qwen3-30b-a3b
  workload: {profile: chat}
"""


def _graph(tmp_path: Path, system: str, kind: str = "Rack", extra: str = ""):
    (tmp_path / "rack.yaml").write_text(RACK.format(kind=kind, system=system, extra=extra))
    (tmp_path / "deployment.yaml").write_text(DEPLOYMENT)
    return build_graph(load_inputs(tmp_path / "deployment.yaml"))


@pytest.mark.parametrize(("system", "gpus", "trays", "domains", "nvl"), [
    ("vera-rubin-nvl72", 72, 18, 144, 1),
    ("gb300-nvl72", 72, 18, 72, 1),
    ("gb200-nvl72", 72, 18, 72, 1),
    ("hgx-h200", 8, 1, 8, 1),
    ("hgx-b200", 8, 1, 8, 1),
    ("hgx-b300", 8, 1, 8, 1),
])
def test_graph_shape_per_system(tmp_path: Path, system, gpus, trays, domains, nvl):
    g = _graph(tmp_path, system)
    assert len(graph.gpus(g)) == gpus
    assert len(graph.trays(g)) == trays
    assert len(graph.memory_domains(g)) == domains
    assert len(graph.nvlink_domains(g)) == nvl
    assert all(len(graph.gpus_of_tray(g, t)) == gpus // trays for t in graph.trays(g))


def test_cluster_of_two_racks_has_two_nvlink_domains(tmp_path: Path):
    g = _graph(tmp_path, "gb200-nvl72", "Cluster", "  racks: 2\n")
    assert len(graph.gpus(g)) == 144
    assert graph.nvlink_domains(g) == ["nvl0", "nvl1"]
    assert graph.nvlink_domain_of(g, "r1-t17-g3") == "nvl1"


def test_bandwidth_nvlink_inside_rdma_across(tmp_path: Path):
    g = _graph(tmp_path, "hgx-h200", "Cluster", "  nodes: 2\n")
    assert graph.bandwidth_gbytes_per_s(g, "r0-t00-g0", "r0-t00-g7") == 450
    assert graph.bandwidth_gbytes_per_s(g, "r0-t00-g0", "r0-t01-g0") == 50


def test_unavailable_tray_and_gpu_are_marked(tmp_path: Path):
    g = _graph(tmp_path, "vera-rubin-nvl72", extra="  unavailable:\n    trays: [7]\n"
               "    gpus: [r0-t03-g1]\n")
    down = set(graph.gpus(g)) - set(graph.available_gpus(g))
    assert down == {f"r0-t07-g{i}" for i in range(4)} | {"r0-t03-g1"}


def test_rubin_gpu_has_two_domains_with_half_the_hbm(tmp_path: Path):
    g = _graph(tmp_path, "vera-rubin-nvl72")
    doms = graph.domains_of_gpu(g, "r0-t00-g0")
    assert doms == ["r0-t00-g0-d0", "r0-t00-g0-d1"]
    assert g.nodes[doms[0]]["hbm_gib"] == pytest.approx(268.2 / 2)
    assert g.nodes[doms[0]]["sms"] == 100


def test_examples_counts():
    g = build_graph(load_inputs(EXAMPLES / "hgx-h200-deepseek-v3" / "deployment.yaml"))
    assert len(graph.gpus(g)) == 16 and len(graph.nvlink_domains(g)) == 2
    assert g.nodes["r0-t01"]["node_name"] == "h200-node-1"
