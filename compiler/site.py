"""Lower `spec.site` and the placed instances to the plan's `site`: what each pod pins on its
host, what it requests, which images, devices, cache and scheduling the cluster gives it.

Host memory of an engine pod (one node of an instance), from what vLLM 0.33 allocates there:
each rank's process, its store client's `local_buffer_size` and its `global_segment_size` share
of the tray's pool segment, and the instance's host Engram tables: the host budget of
compiler.host_memory, split per pod. Host Engram (`cpu_offload`) is shared by the co-located DP
ranks of an instance through /dev/shm (`dp_shared_memory`, vllm/config/engram.py); /dev/shm must
hold it, else vLLM falls back to one private copy per rank.
"""

import functools
import math
import re
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from compiler import arch, catalog
from compiler.catalog.engine import Engines, Vllm
from compiler.host_memory import engram_share_gib, ranks_on
from compiler.plan import (
    Count,
    Decision,
    EngineFacts,
    EngineRun,
    Env,
    Hardware,
    HybridBlock,
    Images,
    Instance,
    KvPool,
    ModelCache,
    Name,
    Names,
    Parsers,
    PodSize,
    Rdma,
    Resources,
    Security,
    Site,
    Sizes,
    Toleration,
)
from compiler.resolve import HostReserve
from schemas import site as spec
from schemas.model import ModelSpec

if TYPE_CHECKING:
    from compiler.engine_releases import ReleaseRun
    from compiler.load import Inputs

Hybrid = Callable[[Vllm], HybridBlock | None]  # a release -> how it raises the KV block
GIB = 1024**3
# vLLM's own VLLM_ENGINE_READY_TIMEOUT_S default (vllm/envs.py): engine start without loading.
ENGINE_START_S = 600
# The vLLM recipe's engine-ready allowance for DeepSeek-V4.1-Flash's 511 GB cold start
# (vllm-project/recipes models/deepseek-ai/DeepSeek-V4.1-Flash.yaml VLLM_ENGINE_READY_TIMEOUT_S):
# the least rackc gives any start, its rates being assumed.
ENGINE_READY_FLOOR_S = 3600
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


def dynamo_refusal(engines: Engines, instances: list[Instance]) -> str | None:
    """Dynamo's prefill handler resolves a P/D protocol per request from the worker's
    connector (a wrapper's one P/D member) and raises for any name it has none for."""
    worker = engines.dynamo.worker
    protocols = worker.kv_connector_protocols.value
    for i in sorted(instances, key=lambda i: i.id):
        if i.role != "aggregated" and i.kv_connectors and \
                not set(i.kv_connectors) & set(protocols):
            return (f"instances[{i.id}] hands KV off by {', '.join(i.kv_connectors)}, but "
                    f"Dynamo {engines.dynamo.version}'s prefill handler takes only "
                    f"{', '.join(protocols)} "
                    f"({worker.kv_connector_protocols.source.split(' (')[0]})")
    return None


def _fact(kind: type[Sizes | Names | Name | Env | Count], fact: Any) -> Any:
    return kind(value=fact.value, source=fact.source)


def engine_facts(engines: Engines, version: str, expert_format: str | None, dynamo: bool,
                 hybrid: Hybrid = lambda _: None) -> EngineFacts:
    """What vLLM `version` (and, for a Dynamo worker, the pinned Dynamo) can run, as far as
    validate checks the engines' flags: the plan's copy of the release's fact set. `hybrid`:
    what a release raises the model's KV block by (compiler.resolve.Resolved.hybrid_in)."""
    run = engines.release(version) or engines.vllm
    moe = (run.moe.accepts.get(expert_format), run.moe.batched.get(expert_format)) \
        if expert_format else (None, None)
    worker = engines.dynamo.worker
    return EngineFacts(
        kernel_block_sizes={k: _fact(Sizes, v)
                            for k, v in run.attention.kernel_block_sizes.items()},
        moe_backends=moe[0] and _fact(Names, moe[0]),
        moe_batched=moe[1] and _fact(Names, moe[1]),
        batched_layout=_fact(Names, run.all2all.batched_layout),
        multi_node_nvlink_env={k: _fact(Env, v)
                               for k, v in run.all2all.multi_node_nvlink_env.items()},
        pipelined_connector=_fact(Name, run.kv_connectors.disaggregated_pipelined),
        pd_connectors=_fact(Names, worker.kv_connector_protocols) if dynamo else None,
        connector_wrappers=_fact(Names, worker.multi_connector_wrappers) if dynamo else None,
        hybrid_block=hybrid(run),
        graph_components=_fact(Count, engines.dynamo.graph.max_components) if dynamo else None)


def engine_runs(engines: Engines, images: spec.Images, vllm_version: str,
                instances: list[Instance], dynamo_run: "ReleaseRun | None",
                expert_format: str | None, hybrid: Hybrid = lambda _: None
                ) -> dict[str, EngineRun]:
    """The Dynamo target runs the vLLM its release imports (any image of it: dynamo.vllm does
    not import under another), with that release's kernels (`dynamo_run`,
    compiler.engine_releases; None: the plan's own, for plans built without inputs); the plain
    vLLM image runs the release the plan is read for. `expert_format`: how the routed experts
    load (None: a dense model)."""
    worker_vllm = engines.dynamo.worker.vllm.value
    return {"dynamo": EngineRun(image=images.dynamo, vllm=worker_vllm,
                                dynamo=images.dynamo_version,
                                refused=dynamo_refusal(engines, instances)
                                or (dynamo_run.refused if dynamo_run else None),
                                facts=engine_facts(engines, worker_vllm, expert_format,
                                                   dynamo=True, hybrid=hybrid),
                                kernels=dynamo_run.kernels if dynamo_run else []),
            "vllm": EngineRun(image=images.vllm, vllm=vllm_version, dynamo=None, refused=None,
                              facts=engine_facts(engines, vllm_version, expert_format,
                                                 dynamo=False, hybrid=hybrid))}


def pool_bytes_per_rank(instances: list[Instance], kv_pool: KvPool) -> dict[str, int]:
    """Tray -> the DRAM bytes each rank there registers: the tray's segment split evenly over
    the ranks (GPUs) running on it, whatever their instances. Trays without one get 0."""
    if not kv_pool.enabled:
        return {}
    dram = {s.location: s.gib for s in kv_pool.segments if s.kind == "dram"}
    ranks: dict[str, int] = {}
    for i in instances:
        for t in i.trays:
            ranks[t] = ranks.get(t, 0) + ranks_on(i, t)
    return {t: int(dram.get(t, 0.0) * GIB) // n for t, n in sorted(ranks.items())}


def _pod(cfg: spec.Site, hardware: Hardware, host: HostReserve, tables_gib: float,
         instance: Instance, pool: dict[str, int]) -> PodSize:
    """The host budget's share of one pod (compiler.host_memory): its ranks' processes, store
    buffers, pool segments and offloaded weights, and its host Engram, which sits in /dev/shm
    when the ranks share it (DP > 1)."""
    per_node = max(ranks_on(instance, t) for t in instance.trays)
    per_rank = max((pool.get(t, 0) for t in instance.trays), default=0)
    engram = engram_share_gib(tables_gib, instance, per_node)
    shm = cfg.host.shm_gib + (engram if instance.dp > 1 else 0.0)
    buffer = host.mooncake_buffer_gib_per_rank if pool else 0.0
    memory = per_node * (host.process_gib_per_rank + buffer + per_rank / GIB
                         + instance.offload_gib) + engram
    rdma = cfg.rdma.transport == "rdma"
    # the pod's share of the tray's devices, rounded down so that the pods of a tray together
    # ask no more than it has; at least one (fewer devices than pods: E824 refuses the bundle)
    devices = max(1, hardware.rdma_devices_per_tray * per_node // hardware.gpus_per_tray)
    registers = rdma and (bool(pool) or instance.role != "aggregated")
    return PodSize(
        instance=instance.id, pool_bytes_per_rank=per_rank, engram_host_gib=round(engram, 3),
        resources=Resources(cpu=per_node * cfg.host.cpu_per_gpu,
                            memory_gib=math.ceil(max(memory, shm)), shm_gib=math.ceil(shm),
                            rdma_devices=devices if rdma else 0, registers_memory=registers))


# The Dynamo runtime images run as `dynamo`, UID 1000 GID 0 (ai-dynamo/dynamo
# container/templates/vllm_runtime.Dockerfile: `useradd ... -g 0 dynamo`, `id -u dynamo` = 1000);
# pods without GPUs run as that user whatever their image.
NON_ROOT_UID = 1000
_LEVELS = ("restricted", "baseline", "privileged")


def _cpu_pod(token: bool, what: str) -> Security:
    return Security(run_as_user=NON_ROOT_UID, run_as_non_root=True, capabilities_add=[],
                    drop_all_capabilities=True, seccomp_runtime_default=True,
                    service_account_token=token, level="restricted",
                    why=f"{what}: needs no privilege, so it runs at restricted")


def _engine_pod(registers: bool, host_path: bool) -> Security:
    """Engine pods run as root where a privilege needs it: Linux gives a non-root process no
    effective capability from the bounding set that Kubernetes' `capabilities.add` fills
    (kubernetes/kubernetes#56374), so IPC_LOCK lifts RLIMIT_MEMLOCK for `ibv_reg_mr` (Mooncake
    segments, NIXL buffers: Linux ib_umem_get) only for UID 0; and the kubelet creates a
    hostPath DirectoryOrCreate as root, mode 0755, which only root may then write."""
    reasons = []
    if registers:
        reasons.append("IPC_LOCK, effective for UID 0 only, lets it register its KV buffers "
                       "and pool segment with the RDMA NIC past RLIMIT_MEMLOCK")
    if host_path:
        reasons.append("UID 0 writes the model cache, a hostPath the kubelet creates as root "
                       "with mode 0755 (hostPath is outside baseline)")
    root = registers or host_path
    level = "privileged" if root else "baseline"
    return Security(
        run_as_user=0 if root else None, run_as_non_root=False,
        capabilities_add=["IPC_LOCK"] if registers else [], drop_all_capabilities=False,
        seccomp_runtime_default=False, service_account_token=False, level=level,
        why="; ".join(reasons) if reasons else
            "the image's own user and the runtime's default capabilities (vLLM images run as "
            "root): baseline")


def security(pods: list[PodSize], cache: ModelCache, router: bool,
             pool: bool) -> dict[str, Security]:
    """Every kind of pod the targets emit and how it runs: privileges only where a pod's work
    needs them, restricted everywhere else; a service-account token only where the pod calls the
    API server (Dynamo's pods, the router)."""
    host_path = cache.kind == "host_path"
    # Dynamo's pods find each other through the API server: the operator sets
    # DYN_DISCOVERY_BACKEND=kubernetes unless a graph asks for etcd (deploy/operator/internal/
    # dynamo/component_common.go getCommonContainer) and gives them its discovery service account
    # (graph.go GenerateBasePodSpec), whose token the runtime's KubeClient reads.
    out = {"frontend": _cpu_pod(True, "Dynamo's frontend (its token serves Dynamo's Kubernetes "
                                      "discovery; its tokenizer cache is an emptyDir)")}
    kinds = {p.resources.registers_memory for p in pods}
    for registers in sorted(kinds):
        engine = _engine_pod(registers, host_path)
        name = "engine-rdma" if registers else "engine"
        out[name] = engine
        # the same workers under Dynamo register through that discovery too
        out[f"dynamo-{name}"] = engine.model_copy(update={
            "service_account_token": True,
            "why": f"{engine.why}; its token serves Dynamo's Kubernetes discovery"})
    if pool:
        out["mooncake-master"] = _cpu_pod(False, "the Mooncake master")
    if router:
        out["router"] = _cpu_pod(True, "vllm-router (its token lists the engine pods it "
                                       "discovers)")
    return dict(sorted(out.items()))


def pod_security_level(kinds: dict[str, Security]) -> str:
    """The namespace's enforced Pod Security Standards level: the least that admits every pod."""
    return max((k.level for k in kinds.values()), key=_LEVELS.index, default="restricted")


def checkpoint_bytes(model: ModelSpec) -> float:
    """What a cold start downloads and reads: the whole checkpoint (weights, the draft, the
    vision tower and the Engram tables; vLLM reads the files even of what it then skips)."""
    return arch.checkpoint_bytes(model)


def engine_ready_timeout_s(cache: spec.ModelCache, checkpoint_bytes: float,
                           pods: int, pods_per_node: int) -> int:
    """A cold start: one download of the checkpoint (per node for a host path), then every pod
    reading it from the cache (all pods share a PVC's bandwidth, a host path's readers are the
    node's pods), on top of vLLM's own start-up allowance; whole minutes, and never less than
    the vLLM recipe's allowance."""
    if cache.engine_ready_timeout_s:
        return cache.engine_ready_timeout_s
    gbytes = checkpoint_bytes / 1e9
    readers = pods if cache.pvc else pods_per_node
    seconds = (ENGINE_START_S + gbytes / cache.download_gbytes_per_s
               + readers * gbytes / cache.read_gbytes_per_s)
    return max(ENGINE_READY_FLOOR_S, 60 * math.ceil(seconds / 60))


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


def lower_site(cfg: spec.Site, model: ModelSpec, hardware: Hardware,
               instances: list[Instance], kv_pool: KvPool, host: HostReserve,
               vllm_version: str, dynamo_run: "ReleaseRun | None", engines: Engines, *,
               expert_format: str | None, hybrid: Hybrid = lambda _: None) -> Site:
    pool = pool_bytes_per_rank(instances, kv_pool)
    tables = arch.engram_bytes(model) / GIB
    pods = [_pod(cfg, hardware, host, tables, i, pool)
            for i in sorted(instances, key=lambda i: i.id)]
    checkpoint = checkpoint_bytes(model)
    images = cfg.images
    cache = _cache(cfg.model_cache, checkpoint, instances)
    kinds = security(pods, cache, images.router is not None, kv_pool.enabled)
    return Site(
        images=Images(dynamo=images.dynamo, vllm=images.vllm,
                      runtime_version_override=runtime_version_override(images),
                      router=images.router),
        rdma=Rdma(transport=cfg.rdma.transport, resource=cfg.rdma.resource,
                  hca_names=list(cfg.rdma.hca_names)),
        model_cache=cache,
        hf_token_secret=cfg.secrets.hf_token,
        pin_by_hostname=cfg.scheduling.hostnames_equal_node_names,
        tolerations=[Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
                     for t in cfg.scheduling.tolerations],
        priority_class=cfg.scheduling.priority_class,
        pods=pods, mooncake_segment_bytes=pool,
        mooncake_local_buffer_bytes=round(host.mooncake_buffer_gib_per_rank * GIB),
        host_reserved_gib=host.reserved_gib,
        frontend=FRONTEND, mooncake_master=MOONCAKE_MASTER,
        engines=engine_runs(engines, images, vllm_version, instances, dynamo_run,
                            expert_format, hybrid),
        cpu_arch=cfg.scheduling.cpu_arch, security=kinds,
        pod_security_level=pod_security_level(kinds))


@functools.cache
def _parser_table() -> dict:
    path = resources.files("compiler.catalog") / "data" / "parsers" / "parsers.yaml"
    return catalog.read_yaml(path.read_text())


def parsers(model_name: str) -> Parsers:
    """The catalog's parsers of a model; an imported model has none (plain completions)."""
    row = _parser_table().get(model_name, {})
    v, d = row.get("vllm", {}), row.get("dynamo", {})
    return Parsers(vllm_tool_call=v.get("tool_call"), vllm_reasoning=v.get("reasoning"),
                   dynamo_tool_call=d.get("tool_call"), dynamo_reasoning=d.get("reasoning"))


def _from_deployment(inputs: "Inputs", path: str, value: object, why_default: str) -> Decision:
    given = ("spec", *path.split(".")) in inputs.sources["deployment"].values
    return Decision(path=path, value=str(value), source="user" if given else "default",
                    why="written in the deployment" if given else why_default)


def decisions(inputs: "Inputs", site: Site) -> list[Decision]:
    """Why each site choice is what it is: the user's, or the default and where it is from."""
    cache, images = site.model_cache, site.images
    given_timeout = inputs.resolved.site.model_cache.engine_ready_timeout_s
    out = [
        _from_deployment(inputs, "site.images.dynamo", images.dynamo,
                        "Dynamo's NGC vLLM runtime of dynamo_version; it must hold the vLLM "
                        "that release imports (1.6.1: 0.31.0, the stock image's), whose "
                        "flags the workers get (site.engines.dynamo)"),
        _from_deployment(inputs, "site.images.vllm", images.vllm,
                        "the vLLM release the flags are written for"),
        _from_deployment(inputs, "site.rdma.transport", site.rdma.transport,
                        "KV transfer and the pool over RDMA; TCP only by choice"),
        _from_deployment(inputs, "site.rdma.resource", site.rdma.resource,
                        "the RDMA device plugin resource of Dynamo's wide-EP recipes and llm-d"),
        _from_deployment(inputs, "site.model_cache", f"{cache.kind}:{cache.source}",
                        "a host directory per node, filled once per node"),
        Decision(path="site.model_cache.engine_ready_timeout_s",
                 value=str(cache.engine_ready_timeout_s),
                 source="user" if given_timeout else "rule:cold-start",
                 why="written in the deployment" if given_timeout else
                     "vLLM's 600 s + one download of the checkpoint + its reads from the cache "
                     "at the site's assumed rates, at least the vLLM recipe's 3600 s"),
    ]
    if images.runtime_version_override:
        out.append(Decision(path="site.images.runtime_version_override",
                            value=images.runtime_version_override, source="rule:dgd-admission",
                            why="the Dynamo image's tag is not the Dynamo version"))
    return out
