"""Lower `spec.site` and the placed instances to the plan's `site`: what each pod pins on its
host, what it requests, which images, devices, cache and scheduling the cluster gives it.

Host memory of an engine pod (one node of an instance), from what vLLM 0.33 allocates there:
- each rank registers `global_segment_size` bytes of the embedded Mooncake store plus a
  `local_buffer_size` staging buffer (vllm/distributed/mooncake_store.py: 4 GiB default);
- Engram tables kept in host memory (`cpu_offload`) are shared by the co-located DP ranks of an
  instance through /dev/shm (`dp_shared_memory`, vllm/config/engram.py); /dev/shm must hold
  them, else vLLM falls back to one private copy per rank;
- the process itself (`site.host.memory_gib_per_gpu` per rank, assumed).
"""

import functools
import math
import re
from importlib import resources
from typing import TYPE_CHECKING

import yaml

from compiler import arch
from compiler.plan import (
    Decision,
    EngramShard,
    Hardware,
    Images,
    Instance,
    KvPool,
    ModelCache,
    ModelInfo,
    Parsers,
    PodSize,
    Rdma,
    Resources,
    Site,
    Toleration,
)
from schemas import site as spec
from schemas.model import ModelSpec

if TYPE_CHECKING:
    from compiler.load import Inputs

GIB = 1024**3
# vLLM's own VLLM_ENGINE_READY_TIMEOUT_S default (vllm/envs.py): engine start without loading.
ENGINE_START_S = 600
MOONCAKE_LOCAL_BUFFER_BYTES = 4 * GIB  # vllm/distributed/mooncake_store.py default
OS_RESERVE_FRACTION = 0.05  # assumed: a tray's DRAM left to the OS and the kubelet
DEFAULT_CACHE_DIR = "/var/cache/rackc/huggingface"
# assumed: the frontend tokenizes every request (long agentic prompts), the master keeps only
# object metadata in memory.
FRONTEND = Resources(cpu=8, memory_gib=16.0, shm_gib=0.0, rdma_devices=0, registers_memory=False)
MOONCAKE_MASTER = Resources(cpu=4, memory_gib=8.0, shm_gib=0.0, rdma_devices=0,
                            registers_memory=False)


def _tag(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def runtime_version_override(images: spec.Images) -> str | None:
    """DGD admission reads the main image's tag as the Dynamo runtime version; say the real one
    unless the tag is exactly it (`1.6.1` or `v1.6.1`)."""
    if images.runtime_version_override:
        return images.runtime_version_override
    return None if re.fullmatch(rf"v?{re.escape(images.dynamo_version)}",
                                _tag(images.dynamo)) else images.dynamo_version


def _ranks_on(instance: Instance, hardware: Hardware, tray: str) -> int:
    gpus = next(t.gpus for t in hardware.trays if t.id == tray)
    return sum(g in gpus for g in instance.gpus)


def pool_bytes_per_rank(instances: list[Instance], kv_pool: KvPool,
                        hardware: Hardware) -> dict[str, int]:
    """Tray -> the DRAM bytes each rank there registers: the tray's segment split evenly over
    the ranks (GPUs) running on it, whatever their instances. Trays without one get 0."""
    if not kv_pool.enabled:
        return {}
    dram = {s.location: s.gib for s in kv_pool.segments if s.kind == "dram"}
    ranks: dict[str, int] = {}
    for i in instances:
        for t in i.trays:
            ranks[t] = ranks.get(t, 0) + _ranks_on(i, hardware, t)
    return {t: int(dram.get(t, 0.0) * GIB) // n for t, n in sorted(ranks.items())}


def engram_host_gib(model: ModelInfo, instance: Instance, shards: list[EngramShard],
                    placement: str) -> float:
    """Host Engram of the instance: tables whose shards are not the instance's own group stay in
    pinned host memory (all of them: one copy of every TP shard)."""
    if not model.engram_tables:
        return 0.0
    if placement == "hbm" and any(s.group == instance.id for s in shards):
        return 0.0
    return round(model.engram_tables * model.engram_table_bytes / GIB, 3)


def pinned_besides_pool_gib(cfg: spec.Site, hardware: Hardware, model: ModelInfo,
                            instances: list[Instance], shards: list[EngramShard],
                            placement: str, pool: bool, dram_gib: float) -> dict[str, float]:
    """Tray -> what stays off the pool's DRAM segment: the OS reserve and what its engine pods
    pin besides their segments (processes, staging buffers, host Engram, /dev/shm). The segment
    gets at most the rest, so that the pods' memory requests fit the tray."""
    buffer = MOONCAKE_LOCAL_BUFFER_BYTES / GIB if pool else 0.0
    out: dict[str, float] = {}
    for i in instances:
        size = _pod(cfg, hardware, model, i, shards, placement, {}).resources
        for t in i.trays:
            out[t] = out.get(t, OS_RESERVE_FRACTION * dram_gib) + size.memory_gib \
                + _ranks_on(i, hardware, t) * buffer
    return dict(sorted(out.items()))


def _pod(cfg: spec.Site, hardware: Hardware, model: ModelInfo, instance: Instance,
         shards: list[EngramShard], placement: str, pool: dict[str, int]) -> PodSize:
    per_node = max(_ranks_on(instance, hardware, t) for t in instance.trays)
    per_rank = max((pool.get(t, 0) for t in instance.trays), default=0)
    engram = engram_host_gib(model, instance, shards, placement)
    shared = instance.dp > 1  # dp_shared_memory: one copy per node in /dev/shm
    shm = cfg.host.shm_gib + (engram if shared else 0.0)
    private_engram = 0.0 if shared else engram * per_node / instance.tp  # its ranks' TP shards
    buffer = MOONCAKE_LOCAL_BUFFER_BYTES if pool else 0
    memory = (per_node * (cfg.host.memory_gib_per_gpu + (per_rank + buffer) / GIB)
              + private_engram + shm)
    rdma = cfg.rdma.transport == "rdma"
    devices = math.ceil(hardware.rdma_devices_per_tray * per_node / hardware.gpus_per_tray)
    registers = rdma and (bool(pool) or instance.role != "aggregated")
    return PodSize(
        instance=instance.id, pool_bytes_per_rank=per_rank, engram_host_gib=engram,
        resources=Resources(cpu=per_node * cfg.host.cpu_per_gpu,
                            memory_gib=math.ceil(memory), shm_gib=math.ceil(shm),
                            rdma_devices=devices if rdma else 0, registers_memory=registers))


def checkpoint_bytes(model: ModelSpec) -> float:
    """What a cold start reads: the served weights and the Engram tables."""
    engram = model.engram.tables * model.engram.table_gib * GIB if model.engram else 0.0
    return arch.weight_bytes(model) + engram


def engine_ready_timeout_s(cache: spec.ModelCache, checkpoint_bytes: float,
                           pods: int, pods_per_node: int) -> int:
    """A cold start: one download of the checkpoint (per node for a host path), then every pod
    reading it from the cache (all pods share a PVC's bandwidth, a host path's readers are the
    node's pods), on top of vLLM's own start-up allowance; whole minutes."""
    if cache.engine_ready_timeout_s:
        return cache.engine_ready_timeout_s
    gbytes = checkpoint_bytes / 1e9
    readers = pods if cache.pvc else pods_per_node
    seconds = (ENGINE_START_S + gbytes / cache.download_gbytes_per_s
               + readers * gbytes / cache.read_gbytes_per_s)
    return 60 * math.ceil(seconds / 60)


def _cache(cache: spec.ModelCache, checkpoint_bytes: float,
           instances: list[Instance]) -> ModelCache:
    pods = sum(len(i.trays) for i in instances)
    per_node: dict[str, int] = {}
    for i in instances:
        for t in i.trays:
            per_node[t] = per_node.get(t, 0) + 1
    timeout = engine_ready_timeout_s(cache, checkpoint_bytes, pods,
                                     max(per_node.values(), default=1))
    kind, source = ("pvc", cache.pvc) if cache.pvc else ("host_path",
                                                          cache.host_path or DEFAULT_CACHE_DIR)
    return ModelCache(kind=kind, source=source, mount_path=cache.mount_path,
                      hf_home=f"{cache.mount_path.rstrip('/')}/huggingface",
                      engine_ready_timeout_s=timeout)


def lower_site(cfg: spec.Site, checkpoint_bytes: float, hardware: Hardware, model: ModelInfo,
               instances: list[Instance], kv_pool: KvPool, shards: list[EngramShard],
               engram_placement: str) -> Site:
    pool = pool_bytes_per_rank(instances, kv_pool, hardware)
    pods = [_pod(cfg, hardware, model, i, shards, engram_placement, pool)
            for i in sorted(instances, key=lambda i: i.id)]
    images = cfg.images
    return Site(
        images=Images(dynamo=images.dynamo, vllm=images.vllm,
                      runtime_version_override=runtime_version_override(images),
                      router=images.router),
        rdma=Rdma(transport=cfg.rdma.transport, resource=cfg.rdma.resource,
                  hca_names=list(cfg.rdma.hca_names)),
        model_cache=_cache(cfg.model_cache, checkpoint_bytes, instances),
        hf_token_secret=cfg.secrets.hf_token,
        pin_by_hostname=cfg.scheduling.hostnames_equal_node_names,
        tolerations=[Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
                     for t in cfg.scheduling.tolerations],
        priority_class=cfg.scheduling.priority_class,
        pods=pods, mooncake_segment_bytes=pool, mooncake_local_buffer_bytes=MOONCAKE_LOCAL_BUFFER_BYTES,
        frontend=FRONTEND, mooncake_master=MOONCAKE_MASTER)


@functools.cache
def _parser_table() -> dict:
    path = resources.files("compiler.catalog") / "data" / "parsers" / "parsers.yaml"
    return yaml.safe_load(path.read_text())


def parsers(model_name: str) -> Parsers:
    """The catalog's parsers of a model; an imported model has none (plain completions)."""
    row = _parser_table().get(model_name, {})
    v, d = row.get("vllm", {}), row.get("dynamo", {})
    return Parsers(vllm_tool_call=v.get("tool_call"), vllm_reasoning=v.get("reasoning"),
                   dynamo_tool_call=d.get("tool_call"), dynamo_reasoning=d.get("reasoning"))


def decisions(inputs: "Inputs", site: Site) -> list[Decision]:
    """Why each site choice is what it is: the user's, or the default and where it is from."""
    from compiler.decisions import user_or_default

    path = ("spec", "site")
    cache, images = site.model_cache, site.images
    given_timeout = inputs.deployment.spec.site.model_cache.engine_ready_timeout_s
    out = [
        user_or_default(inputs, images.dynamo, "Dynamo's NGC vLLM runtime of dynamo_version; it "
                        "must hold vLLM serving.vllm_version (the stock 1.6.1 image has 0.31.0)",
                        *path, "images", "dynamo"),
        user_or_default(inputs, images.vllm, "the vLLM release the flags are written for",
                        *path, "images", "vllm"),
        user_or_default(inputs, site.rdma.transport, "KV transfer and the pool over RDMA; TCP "
                        "only by choice", *path, "rdma", "transport"),
        user_or_default(inputs, site.rdma.resource, "the RDMA device plugin resource of Dynamo's "
                        "wide-EP recipes and llm-d", *path, "rdma", "resource"),
        user_or_default(inputs, f"{cache.kind}:{cache.source}", "a host directory per node, "
                        "filled once per node", *path, "model_cache"),
        Decision(path="site.model_cache.engine_ready_timeout_s",
                 value=str(cache.engine_ready_timeout_s),
                 source="user" if given_timeout else "rule:cold-start",
                 why="written in the deployment" if given_timeout else
                     "vLLM's 600 s + one download of the checkpoint + its reads from the cache "
                     "at the site's assumed rates"),
    ]
    if images.runtime_version_override:
        out.append(Decision(path="site.images.runtime_version_override",
                            value=images.runtime_version_override, source="rule:dgd-admission",
                            why="the Dynamo image's tag is not the Dynamo version"))
    return out
