"""compiler/site.py: the site's choices as the plan records them."""

import pytest

from compiler import resolve, site
from schemas.site import Images, ModelCache


@pytest.mark.parametrize("image, override", [
    ("nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1", None),
    ("registry.example.com/dynamo:v1.6.1", None),
    ("registry.example.com/dynamo:0.33.0-dyn1.6.1", "1.6.1"),  # parses as 0.33.0: say 1.6.1
    ("registry.example.com/dynamo:latest", "1.6.1"),
    ("registry.example.com:5000/dynamo@sha256:" + "a" * 64, "1.6.1"),  # a port is no tag
])
def test_runtime_version_override_when_the_tag_is_not_the_dynamo_version(image, override):
    assert site.runtime_version_override(Images(dynamo=image)) == override


def test_a_given_override_wins():
    images = Images(dynamo="nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
                    runtime_version_override="1.6.0")
    assert site.runtime_version_override(images) == "1.6.0"


def test_cold_start_timeout_reads_the_checkpoint_once_per_reader():
    ckpt = 1200e9  # 1.2 TB
    host = site.engine_ready_timeout_s(ModelCache(), ckpt, pods=28, pods_per_node=2)
    # 600 s + 1200 GB / 0.5 GB/s + 2 readers x 1200 GB / 2 GB/s = 4200 s
    assert host == 600 + 2400 + 1200
    pvc = site.engine_ready_timeout_s(ModelCache(pvc="models"), ckpt, pods=28, pods_per_node=2)
    assert pvc == 600 + 2400 + 28 * 600  # every pod reads the one claim
    given = site.engine_ready_timeout_s(ModelCache(engine_ready_timeout_s=900), ckpt, 28, 2)
    assert given == 900


def test_engine_ready_timeout_is_whole_minutes_and_at_least_the_recipes():
    assert site.engine_ready_timeout_s(ModelCache(), 1e9, 1, 1) == 3600  # the recipe's floor
    assert site.engine_ready_timeout_s(ModelCache(), 700e9, 1, 1) % 60 == 0


def test_models_without_catalog_parsers_get_none():
    parsers = site.parsers("my-imported-model")
    assert parsers.vllm_tool_call is None and parsers.dynamo_reasoning is None


@pytest.mark.parametrize("given, dram, reserve, source", [
    (None, 894.0, 89.4, "default"),  # GB300 tray: 10%
    (None, 128.0, 32.0, "default"),  # a small node: the 32 GiB floor
    (120.0, 894.0, 120.0, "user"),
])
def test_node_reserve_is_the_sites_or_an_assumed_share(given, dram, reserve, source):
    choice = resolve._node_reserve(given, dram)
    assert (choice.value, choice.source) == (reserve, source)
    assert choice.path == "site.host.reserved_gib_per_tray"
    assert given is not None or choice.why.startswith("assumed")
