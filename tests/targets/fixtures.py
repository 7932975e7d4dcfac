"""Realistic Plans built by hand, the targets' inputs until compiled plans replace them.

- `vr_nvl72_plan`: DeepSeek-V4.1-Flash on a Vera Rubin NVL72 rack (as in
  examples/vr-nvl72-deepseek-v4.1-flash): 18 prefill DEP2 instances, two per tray on trays 0-8;
  one decode DEP32 on trays 9-16; tray 17 idle. Mooncake DRAM segments on every serving tray,
  prefill Engram in host memory, decode's sharded over its own GPUs (what vLLM 0.33 runs).
- `vr_nvl72_tp8_plan`: the same rack with lowest-latency decode, four TP8 instances over two
  trays each (multi-node tensor parallelism).
- `hgx_h200_plan`: DeepSeek-V3 on two HGX H200 nodes (examples/hgx-h200-deepseek-v3): prefill
  TP8 on node 0, decode DEP8 on node 1, Mooncake DRAM pool.

Memory figures per GPU come from compiler.memory for these shapes (weights, one max-length
request's KV, Engram share, workspace) and its one budget rule (GpuBudget); they are written
out so that the fixtures, and the golden files made from them, change only when this file does.
"""

import functools
from dataclasses import dataclass
from pathlib import Path

from compiler import api, catalog, deploy, preflight, site
from compiler.memory import GpuBudget
from compiler.plan import (
    DomainMemory,
    EngramShard,
    Fleet,
    FleetGroup,
    Hardware,
    HostMemory,
    Instance,
    KvPool,
    ModelInfo,
    PhaseSolve,
    Plan,
    PoolSegment,
    Routing,
    Serving,
    SolverInfo,
    Speculative,
    Tray,
)
from compiler.resolve import HostReserve
from schemas.site import Site

GIB = 1024**3
RESERVED_GIB = 4.37  # CUDA context 3.5 + NCCL 0.37 + NIXL 0.5 (catalog/engines/vllm-0.33.yaml)
HOST_ENGINE_GIB = 24.0  # per rank: the engine process (compiler.resolve)
MOONCAKE_BUFFER_GIB = 4.0  # per rank: the Mooncake client buffer
HOST_PROCESS_GIB = HOST_ENGINE_GIB + MOONCAKE_BUFFER_GIB


@dataclass(frozen=True)
class GpuNeed:
    """What one GPU of a shape holds (GiB); the KV cache takes what is left of the budget."""

    weights: float
    kv: float
    engram: float
    workspace: float

    def budget(self, capacity: float) -> GpuBudget:
        return GpuBudget(capacity, RESERVED_GIB, self.weights, self.engram, self.workspace,
                         self.kv, pool_in_hbm=False)

    def domains(self, capacity: float, per_gpu: int) -> DomainMemory:
        b = self.budget(capacity)
        return DomainMemory(weights_gib=round(b.weights_gib / per_gpu, 3),
                            kv_gib=round(b.kv_gib / per_gpu, 3),
                            engram_gib=round(b.engram_gib / per_gpu, 3),
                            pool_gib=0.0, workspace_gib=round(b.workspace_gib / per_gpu, 3),
                            reserved_gib=round((capacity - b.budget_gib) / per_gpu, 3),
                            capacity_gib=round(capacity / per_gpu, 3))

    def utilization(self, capacity: float) -> float:
        return self.budget(capacity).utilization


# the fixtures' site: the defaults, and a router, without which lws/ serves no P/D plan
ROUTER_IMAGE = "registry.example.com/vllm-router:0.1.17"
ROUTED = Site.model_validate({"images": {"router": ROUTER_IMAGE}})


def model_info(name: str) -> ModelInfo:
    spec = catalog.model(name).spec
    return ModelInfo(
        name=name, hf_id=spec.hf_id, architecture=spec.architecture,
        attention=spec.attention.kind, sparse_attention=spec.attention.indexer is not None,
        weights_dtype=spec.dtypes.weights, experts_dtype=spec.dtypes.experts,
        expert_format="mxfp4" if spec.dtypes.experts == "fp4" else spec.dtypes.experts,
        moe=spec.moe is not None, experts=spec.moe.experts if spec.moe else 0,
        engram_tables=spec.engram.tables if spec.engram else 0,
        engram_table_bytes=round(spec.engram.table_gib * GIB) if spec.engram else 0)


def tray_id(tray: int) -> str:
    return f"r0-t{tray:02d}"


def gpu_ids(tray: int, gpus: range) -> list[str]:
    return [f"{tray_id(tray)}-g{g}" for g in gpus]


def domain_ids(gpus: list[str], per_gpu: int) -> list[str]:
    return [f"{g}-d{d}" for g in gpus for d in range(per_gpu)]


@dataclass(frozen=True)
class Engine:
    """An instance's engine choices (compiler.resolve picks them for compiled plans)."""

    all2all: str | None
    moe: str | None
    engram: str
    env: tuple[tuple[str, str], ...] = ()


def instance(role: str, index: int, shape: str, gpus: list[str], dp: int, ep: int, tp: int,
             max_batch: int, max_batched_tokens: int, util: float, engine: Engine) -> Instance:
    trays = sorted({g.rsplit("-", 1)[0] for g in gpus})
    return Instance(id=f"{role}-{index:02d}", role=role, shape=shape, gpus=gpus, trays=trays,
                    dp=dp, ep=ep, tp=tp, max_batch=max_batch,
                    max_batched_tokens=max_batched_tokens, gpu_memory_utilization=util,
                    all2all_backend=engine.all2all, moe_backend=engine.moe,
                    engram=engine.engram, env=dict(engine.env),
                    kv_connectors=["NixlConnector", "MooncakeStoreConnector"],  # P/D + the pool
                    connector_env=["MOONCAKE_CONFIG_PATH", "VLLM_NIXL_SIDE_CHANNEL_HOST"])


def engram_shards(model: ModelInfo, inst: Instance, per_gpu: int) -> list[EngramShard]:
    """Each table cut into one contiguous byte range per memory domain of the instance."""
    domains = domain_ids(inst.gpus, per_gpu)
    base, extra = divmod(model.engram_table_bytes, len(domains))
    shards = []
    for table in range(model.engram_tables):
        offset = 0
        for k, domain in enumerate(domains):
            size = base + (1 if k < extra else 0)
            shards.append(EngramShard(table=table, shard=k, domain=domain, offset_bytes=offset,
                                      bytes=size, group=inst.id))
            offset += size
    return shards


def memory_map(placed: list[tuple[Instance, DomainMemory]], per_gpu: int
               ) -> dict[str, DomainMemory]:
    return {d: m for inst, m in placed for d in domain_ids(inst.gpus, per_gpu)}


def kv_pool(trays: list[str], dram_gib: float) -> KvPool:
    segments = [PoolSegment(kind="dram", location=t, gib=dram_gib) for t in trays]
    return KvPool(enabled=True, segments=segments, total_gib=round(sum(s.gib for s in segments), 3))


def host(instances: list[Instance], model: ModelInfo, pool_gib: float, capacity: float
         ) -> dict[str, HostMemory]:
    """Per tray: the pool segment, one host copy of the Engram tables per host-Engram instance,
    the ranks' processes, the node reserve (10% of DRAM, at least 32 GiB)."""
    tables = model.engram_tables * model.engram_table_bytes / GIB
    out = {}
    for tray in sorted({t for i in instances for t in i.trays}):
        on = [i for i in instances if tray in i.trays]
        ranks = sum(1 for i in on for g in i.gpus if g.startswith(tray + "-"))
        engram = tables * sum(1 for i in on if i.engram == "host")
        out[tray] = HostMemory(pool_gib=pool_gib, engram_gib=round(engram, 3),
                               process_gib=ranks * HOST_PROCESS_GIB,
                               reserved_gib=round(max(32.0, 0.1 * capacity), 3),
                               capacity_gib=capacity)
    return out


def host_reserve(capacity: float) -> HostReserve:
    return HostReserve(reserved_gib=max(32.0, 0.1 * capacity), process_gib_per_rank=HOST_ENGINE_GIB,
                       mooncake_buffer_gib_per_rank=MOONCAKE_BUFFER_GIB)


def _allocatable(tray_dram_gib: float) -> float:
    return round(tray_dram_gib - host_reserve(tray_dram_gib).reserved_gib, 3)


def plan(hardware: Hardware, model: ModelInfo, serving: Serving,
         placed: list[tuple[Instance, DomainMemory]], dram_gib: float,
         tray_dram_gib: float) -> Plan:
    per_gpu = hardware.domains_per_gpu
    memory = memory_map(placed, per_gpu)
    instances = deploy.with_rank_groups(hardware.trays,
                                        sorted((i for i, _ in placed), key=lambda i: i.id))
    shards = [s for i in instances if i.engram == "hbm"
              for s in engram_shards(model, i, per_gpu)]
    used_trays = sorted({t for i in instances for t in i.trays})
    pool = kv_pool(used_trays, dram_gib)
    return preflight.with_notices(Plan(
        inputs_digest="sha256:fixture-" + serving.name,
        hardware=Fleet(groups=[FleetGroup(name="fixture", hardware=hardware)]), model=model,
        serving=serving, instances=instances,
        memory=dict(sorted(memory.items())),
        host_memory=host(instances, model, dram_gib, tray_dram_gib), engram_shards=shards,
        kv_pool=pool,
        routing=Routing(policy="kv", overlap_score_credit=1.0, block_size=serving.block_size),
        solver=SolverInfo(status="OPTIMAL", objective=1.0, bound=1.0, seconds=0.0,
                          counts=PhaseSolve(status="OPTIMAL", objective=1.0, bound=1.0, gap=0.0,
                                            seconds=0.0),
                          placement=PhaseSolve(status="OPTIMAL", objective=0.0, bound=0.0,
                                               gap=0.0, seconds=0.0), racks=[],
                          considered=[]),
        predicted=None, decisions=[],
        site=site.lower_site(ROUTED, catalog.model(model.name).spec, hardware, instances, pool,
                             host_reserve(tray_dram_gib), serving.vllm_version, None,
                             catalog.engines(),
                             expert_format=model.expert_format if model.moe else None),
        parsers=site.parsers(model.name)), catalog.engines())


# --- Vera Rubin NVL72 + DeepSeek-V4.1-Flash ----------------------------------------------------

VR_HBM_GIB = 268.2
VR_WORKSPACE = 6.87
# compiler.memory for DeepSeek-V4.1-Flash (FP8 weights, FP4 experts, FP8 KV, 131,072 tokens).
VR_PREFILL_DEP2 = GpuNeed(weights=131.184, kv=4.136, engram=0.0, workspace=VR_WORKSPACE)
VR_DECODE_DEP32 = GpuNeed(weights=19.057, kv=4.136, engram=5.9, workspace=VR_WORKSPACE)
VR_DECODE_TP8 = GpuNeed(weights=31.348, kv=4.136, engram=23.6, workspace=VR_WORKSPACE)
VR_DRAM_POOL_GIB = 698.5  # half of a tray's 1,397 GiB LPDDR5X
VR_TRAY_DRAM_GIB = 1397.0
VR_PREFILL = Engine("deepep_high_throughput", "flashinfer_trtllm", "host")
VR_DECODE = Engine("deepep_low_latency", "marlin", "hbm",
                   (("VLLM_DEEPEP_LOW_LATENCY_USE_MNNVL", "1"),))
VR_DECODE_TP = Engine(None, "flashinfer_trtllm", "hbm")


def vr_hardware() -> Hardware:
    trays = [Tray(id=tray_id(t), node_name=f"vr-a-r0-t{t:02d}", nvlink_domain="nvl0",
                  gpus=gpu_ids(t, range(4)), available=True) for t in range(18)]
    return Hardware(system="vera-rubin-nvl72", form="nvl72", gpu_family="rubin",
                    arch="arm64", gpus_per_tray=4, domains_per_gpu=2,
                    hbm_gib_per_gpu=VR_HBM_GIB, dram_gib_per_tray=VR_TRAY_DRAM_GIB,
                    allocatable_gib_per_tray=_allocatable(VR_TRAY_DRAM_GIB),
                    rdma_devices_per_tray=4,
                    node_labels={}, trays=trays,
                    unavailable_gpus=[])


def vr_serving() -> Serving:
    return Serving(name="dsv41-flash", namespace="dsv41", vllm_version="0.33.0",
                   kv_cache_dtype="fp8",
                   block_size=128, max_model_len=131072,
                   attention_backend="FLASHINFER_MLA_SPARSE_DSV41", attention_options={},
                   linear_backend="deep_gemm",
                   speculative=Speculative(method="dspark", draft_tokens=5, acceptance=3.51),
                   engram_placement="hbm")


def vr_prefill() -> list[tuple[Instance, DomainMemory]]:
    memory = VR_PREFILL_DEP2.domains(VR_HBM_GIB, 2)
    placed = []
    for tray in range(9):
        for half in range(2):
            gpus = gpu_ids(tray, range(2 * half, 2 * half + 2))
            placed.append((instance("prefill", 2 * tray + half, "DEP2", gpus, dp=2, ep=2, tp=1,
                                    max_batch=8, max_batched_tokens=16384,
                                    util=VR_PREFILL_DEP2.utilization(VR_HBM_GIB),
                                    engine=VR_PREFILL), memory))
    return placed


def vr_nvl72_plan() -> Plan:
    memory = VR_DECODE_DEP32.domains(VR_HBM_GIB, 2)
    gpus = [g for t in range(9, 17) for g in gpu_ids(t, range(4))]
    decode = instance("decode", 0, "DEP32", gpus, dp=32, ep=32, tp=1, max_batch=64,
                      max_batched_tokens=384, util=VR_DECODE_DEP32.utilization(VR_HBM_GIB),
                      engine=VR_DECODE)
    return plan(vr_hardware(), model_info("deepseek-v4.1-flash"), vr_serving(),
                [*vr_prefill(), (decode, memory)], VR_DRAM_POOL_GIB, VR_TRAY_DRAM_GIB)


def vr_nvl72_tp8_plan() -> Plan:
    memory = VR_DECODE_TP8.domains(VR_HBM_GIB, 2)
    decode = []
    for k in range(4):
        first = 9 + 2 * k
        gpus = gpu_ids(first, range(4)) + gpu_ids(first + 1, range(4))
        decode.append((instance("decode", k, "TP8", gpus, dp=1, ep=1, tp=8, max_batch=1,
                                max_batched_tokens=6,
                                util=VR_DECODE_TP8.utilization(VR_HBM_GIB),
                                engine=VR_DECODE_TP), memory))
    return plan(vr_hardware(), model_info("deepseek-v4.1-flash"), vr_serving(),
                [*vr_prefill(), *decode], VR_DRAM_POOL_GIB, VR_TRAY_DRAM_GIB)


# --- HGX H200 + DeepSeek-V3 -------------------------------------------------------------------

H200_HBM_GIB = 140.4
H200_WORKSPACE = 5.183
# compiler.memory for DeepSeek-V3 (FP8 weights and experts, FP8 KV, 32,768 tokens).
H200_PREFILL_TP8 = GpuNeed(weights=78.198, kv=1.0, engram=0.0, workspace=H200_WORKSPACE)
H200_DECODE_DEP8 = GpuNeed(weights=92.705, kv=1.0, engram=0.0, workspace=H200_WORKSPACE)
H200_DRAM_POOL_GIB = 1024.0  # half of a node's 2 TiB
H200_NODE_DRAM_GIB = 2048.0


def hgx_h200_plan() -> Plan:
    trays = [Tray(id=tray_id(n), node_name=f"h200-node-{n}", nvlink_domain=f"nvl{n}",
                  gpus=gpu_ids(n, range(8)), available=True) for n in range(2)]
    hardware = Hardware(system="hgx-h200", form="hgx", gpu_family="hopper",
                        arch="amd64", gpus_per_tray=8,
                        domains_per_gpu=1, hbm_gib_per_gpu=H200_HBM_GIB,
                        dram_gib_per_tray=H200_NODE_DRAM_GIB,
                        allocatable_gib_per_tray=_allocatable(H200_NODE_DRAM_GIB),
                        rdma_devices_per_tray=8,
                        node_labels={}, trays=trays, unavailable_gpus=[])
    serving = Serving(name="dsv3-h200", namespace="dsv3", vllm_version="0.33.0",
                      kv_cache_dtype="fp8",
                      block_size=64, max_model_len=32768, attention_backend="FLASHMLA",
                      attention_options={}, linear_backend="deep_gemm",
                      speculative=Speculative(method="mtp", draft_tokens=1, acceptance=1.8),
                      engram_placement="hbm")
    prefill_mem = H200_PREFILL_TP8.domains(H200_HBM_GIB, 1)
    decode_mem = H200_DECODE_DEP8.domains(H200_HBM_GIB, 1)
    prefill = instance("prefill", 0, "TP8", gpu_ids(0, range(8)), dp=1, ep=1, tp=8,
                       max_batch=16, max_batched_tokens=16384,
                       util=H200_PREFILL_TP8.utilization(H200_HBM_GIB),
                       engine=Engine(None, "deep_gemm", "none"))
    decode = instance("decode", 0, "DEP8", gpu_ids(1, range(8)), dp=8, ep=8, tp=1,
                      max_batch=32, max_batched_tokens=64,
                      util=H200_DECODE_DEP8.utilization(H200_HBM_GIB),
                      engine=Engine("deepep_low_latency", "deep_gemm", "none"))
    return plan(hardware, model_info("deepseek-v3"), serving,
                [(prefill, prefill_mem), (decode, decode_mem)], H200_DRAM_POOL_GIB,
                H200_NODE_DRAM_GIB)


# Golden cases (tests/golden/<case>/) and every plan the consistency and conformance tests run.
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@functools.cache
def compiled_plan(example: str) -> Plan:
    """The plan `rackc compile` makes for one of examples/ (targets not emitted)."""
    return api.compile(EXAMPLES / example / "deployment.yaml", only=()).plan


# fleet-sized examples: every target of every instance would make megabytes of goldens and
# minutes of conformance runs; tests/compile/test_golden_fleet.py checks a summary instead
FLEET_EXAMPLES = ("vr-nvl72-x16-deepseek-v4.1-flash",)
EXAMPLE_CASES = {p.parent.name: functools.partial(compiled_plan, p.parent.name)
                 for p in sorted(EXAMPLES.glob("*/deployment.yaml"))
                 if p.parent.name not in FLEET_EXAMPLES}
GOLDEN_CASES = {"fixture-vr-nvl72": vr_nvl72_plan, "fixture-hgx-h200": hgx_h200_plan,
                **EXAMPLE_CASES}
def vr_nvl72_site_plan() -> Plan:
    """`vr_nvl72_plan` on a site that sets every optional input: a custom Dynamo image, SR-IOV
    RDMA with named HCAs, a PVC cache, a token Secret, a priority class, the lws router."""
    plan = vr_nvl72_plan()
    cfg = Site.model_validate({
        "images": {"dynamo": "registry.example.com/dynamo-vllm:0.33.0-dyn1.6.1",
                   "router": ROUTER_IMAGE},
        "rdma": {"resource": "nvidia.com/cx9_rdma", "hca_names": ["mlx5_0", "mlx5_1"]},
        "model_cache": {"pvc": "models"},
        "secrets": {"hf_token": "hf-token"},
        "scheduling": {"priority_class": "inference",
                       "tolerations": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                                       {"key": "dedicated", "operator": "Equal",
                                        "value": "llm", "effect": "NoExecute"}]},
    })
    return preflight.with_notices(plan.model_copy(update={"site": site.lower_site(
        cfg, catalog.model(plan.model.name).spec, plan.fleet[0], plan.instances, plan.kv_pool,
        host_reserve(VR_TRAY_DRAM_GIB), plan.serving.vllm_version, None, catalog.engines(),
        expert_format=plan.model.expert_format if plan.model.moe else None)}),
        catalog.engines())


ALL_CASES = {**GOLDEN_CASES, "fixture-vr-nvl72-tp8": vr_nvl72_tp8_plan,
             "fixture-vr-nvl72-site": vr_nvl72_site_plan}
# served without the Mooncake pool (a pipelined prefill: vLLM 0.33's store connector takes no
# stages); tests/targets/test_consistency.py checks that they emit none of it
POOL_FREE = frozenset({"hgx-h200-x4-deepseek-v3-128k-pp"})
POOL_CASES = sorted(set(ALL_CASES) - POOL_FREE)
