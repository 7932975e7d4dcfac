"""Pass 2: every default and catalog choice, made once, with its decision.

`load` checks what the user wrote; `resolve` fills in what they did not (the model's KV dtype,
the attention backend's block size, the catalog's NIC rate...) and holds the engine
capabilities (`catalog/engines/`) the later passes obey. Where the system design (SYSTEM.md)
asks for more than the pinned engine runs, the choice is the engine's fallback, and its
decision says so (`rule:engine-capability`). No other pass re-derives any of these.
"""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from compiler import catalog, engine_choices
from compiler.catalog.engine import Engines, Vllm
from compiler.catalog.system import System
from compiler.choice import Choice
from compiler.plan import HybridBlock
from compiler.shapes import Shape
from schemas import ClusterV1, DeploymentV1, ModelV1, RackV1
from schemas.deployment import (
    PinnedInstances,
    ShapeSearch,
    Slo,
    Speculative,
    WeightOffload,
)
from schemas.model import ModelSpec
from schemas.site import Site
from schemas.source import SourceMap


@dataclass(frozen=True)
class OffloadAsk:
    """What the deployment asks one role (or the pinned instances of one role and shape) to
    offload; compiler.offload turns it into each instance's offload."""

    backend: str  # uva | prefetch
    gib_per_gpu: float | None
    experts_only: bool
    group_size: int | None
    num_in_group: int | None
    prefetch_step: int | None
    field: tuple[str | int, ...]  # where the deployment writes it

    def __str__(self) -> str:
        parts = [self.backend] + [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                  for k in ("gib_per_gpu", "group_size", "num_in_group",
                                            "prefetch_step")
                                  if (v := getattr(self, k)) is not None]
        return " ".join(parts + (["experts only"] if self.experts_only else []))


@dataclass(frozen=True)
class HostReserve:
    """Host memory that is not the pool's, per tray (GiB)."""

    reserved_gib: float  # capacity less allocatable: kubelet and system reserves, DaemonSets
    process_gib_per_rank: float  # one engine process: Python, CUDA host state, pinned staging
    mooncake_buffer_gib_per_rank: float  # the store client's transfer buffer


@dataclass(frozen=True)
class PinnedPoint:
    """A pinned entry's role predicted alone at a fixed batch and context
    (`objective.instances[].operating_point`: phase-isolated, compiler.prediction)."""

    entry: int  # its index in objective.instances
    role: str  # prefill | decode
    shape: str
    batch_per_rank: int
    context_tokens: int
    cached_tokens: int = 0  # prefill: of each prompt, already in the prefix cache

    @property
    def new_tokens(self) -> int:
        return self.context_tokens - self.cached_tokens

    def step_tokens(self, draft_tokens: int) -> int:
        """Tokens per DP rank in its step: decode verifies 1 + k per request, prefill
        computes each prompt's uncached tokens."""
        return self.batch_per_rank * (1 + draft_tokens if self.role == "decode"
                                      else self.new_tokens)

    def __str__(self) -> str:
        if self.role == "decode":
            return (f"{self.shape} decode: {self.batch_per_rank} requests per rank at "
                    f"{self.context_tokens} tokens of context")
        cached = f", {self.cached_tokens} of them cached" if self.cached_tokens else ""
        return (f"{self.shape} prefill: {self.batch_per_rank} prompts per rank of "
                f"{self.context_tokens} tokens{cached}")


def pinned_point(j: int, entry: PinnedInstances) -> PinnedPoint | None:
    """The entry's operating point, its cached share in whole tokens (at least one new)."""
    op = entry.operating_point
    if op is None:
        return None
    cached = min(int(op.context_tokens * (op.cached_share or 0.0)), op.context_tokens - 1)
    return PinnedPoint(j, entry.role, entry.shape, op.batch_per_rank, op.context_tokens,
                          cached)


NODE_RESERVE_FRACTION = 0.10  # assumed: a GPU node's capacity less its allocatable memory
NODE_RESERVE_MIN_GIB = 32.0  # assumed: the floor of that on small nodes
PROCESS_GIB_PER_RANK = 24.0  # assumed: a vLLM rank's host RSS (weights staging, CUDA, Python)


@dataclass(frozen=True)
class Resolved:
    kv_cache_dtype: Choice[str]
    max_model_len: Choice[int]
    block_size: Choice[int]  # the kernel's or the user's; block_for: what the engines run
    hybrid: HybridBlock | None  # what vLLM raises a hybrid model's block by (None: not hybrid)
    attention_backend: Choice[str]
    attention_options: Choice[dict[str, str]]  # -ac.KEY=VALUE
    expert_format: Choice[str]
    linear_backend: Choice[str | None]
    draft_moe_backend: Choice[str] | None  # how the draft's experts get their kernels
    engram_placement: Choice[str]  # what the deployment asks for
    engram_prefill: Choice[str]  # where prefill instances keep Engram: hbm | host | none
    engram_decode: Choice[str]
    kv_pool_dram: Choice[bool]
    kv_pool_hbm: Choice[bool]
    dram_fraction: Choice[float]
    nic_gbps_per_gpu: Choice[float]
    dram_gib_per_tray: Choice[float]
    rdma_devices_per_tray: Choice[int]
    gpu_reserve_gib: Choice[float]  # per GPU, outside --gpu-memory-utilization
    workload: tuple[Choice[float], ...]  # the request mix: the profile's, or the user's
    image_tokens: float  # prompt tokens per request that images bring (included in isl)
    tokens_per_image: int
    objective_mode: Choice[str]
    layout: str  # objective.layout: any | disaggregated | aggregated
    shape_search: ShapeSearch  # the user's shapes per role (None: every shape that fits)
    pins: tuple[PinnedInstances, ...]  # objective.instances (pinned mode), limits filled
    operating_points: tuple[Choice[PinnedPoint], ...]  # at most one per role
    slo: Slo
    routing_policy: Choice[str]
    overlap_score_credit: float
    speculative: Speculative | None
    # per role (`weight_offload.<role>`), then per pinned role and shape
    # (`weight_offload.<role>.<shape>`); empty when the deployment offloads nothing
    weight_offload: tuple[Choice[OffloadAsk | None], ...]
    host_reserved_gib: Choice[float]  # per tray, not allocatable to pods
    host: HostReserve
    uses_draft: bool
    language_model_only: Choice[bool] | None  # skip the vision tower (None: the model has none)
    model_flags: Choice[list[str]] | None  # the architecture's own flags (None: it needs none)
    engines: Engines
    site: Site  # what the cluster decides: images, RDMA, model cache (compiler.site lowers it)
    name: str  # the deployment's
    namespace: str
    vllm_version: str
    digest: str  # the inputs and every catalog file used

    def choices(self) -> list[Choice]:
        out = []
        for v in vars(self).values():
            out += [v] if isinstance(v, Choice) else \
                [c for c in v if isinstance(c, Choice)] if isinstance(v, tuple) else []
        return out

    def hybrid_in(self, vllm: Vllm, spec: ModelSpec) -> HybridBlock | None:
        """`hybrid` as release `vllm` has it (a Dynamo worker's other release)."""
        return engine_choices.hybrid_facts(
            vllm, spec, self.attention_backend.value, self.kv_cache_dtype.value,
            self.speculative.draft_tokens if self.speculative else 0)

    def block_for(self, tps: Iterable[int]) -> Choice[int]:
        """The KV block every engine runs and the router hashes in, for instances of `tps`."""
        return engine_choices.served_block(self.block_size, self.hybrid, tps)

    def workload_value(self, name: str) -> float:
        return next(c.value for c in self.workload if c.path == f"workload.{name}")

    @property
    def stated_concurrency(self) -> int | None:
        """The requests in flight the deployment states (None: the profile's, not stated)."""
        c = next(c for c in self.workload if c.path == "workload.concurrency")
        return int(c.value) if c.source == "user" else None

    @property
    def loads_vision(self) -> bool:
        return self.language_model_only is not None and not self.language_model_only.value

    def offload_ask(self, role: str, shape: str) -> OffloadAsk | None:
        """What instances of `role` and `shape` are asked to offload (None: nothing)."""
        by_path = {c.path: c.value for c in self.weight_offload}
        return by_path.get(f"weight_offload.{role}.{shape}", by_path.get(
            f"weight_offload.{role}"))

    def engram_in_hbm(self, role: str) -> bool:
        placement = self.engram_prefill if role == "prefill" else self.engram_decode
        return placement.value == "hbm"


def nodes_of(shape: Shape, system: System) -> int:
    """Trays an instance spans: whole trays once it outgrows one (the placement's rule)."""
    per = system.gpus_per_tray
    return max(1, -(-shape.gpus // per))


def is_multi_node_nvlink(system: System, nodes: int) -> bool:
    return system.form == "nvl72" and nodes > 1


def _given(src: SourceMap, *path: str) -> bool:
    return tuple(path) in src.values


def _user(src: SourceMap, path: str, value, why_default: str) -> Choice:
    """A deployment field with a schema default: the user's when written, else the default."""
    if _given(src, "spec", *path.split(".")):
        return Choice(path, value, "user", "written in the deployment")
    return Choice(path, value, "default", why_default)


def _pool_field(src: SourceMap, pool, name: str, value, why_absent: str) -> Choice:
    """A serving.kv_pool field: the user's only where written (a kv_pool block that leaves
    a field out takes the schema's default, which is not the user's choice)."""
    path = f"kv_pool.{name}"
    if pool is None:
        return Choice(path, value, "default", why_absent)
    if _given(src, "spec", "serving", "kv_pool", name):
        return Choice(path, value, "user", "written in the deployment")
    field = type(pool).model_fields[name]
    return Choice(path, value, "default",
                  f"the schema's default ({field.description or name}: {field.default:g})"
                  if isinstance(field.default, float) else
                  f"the schema's default ({field.default}) under the deployment's kv_pool")


def resolve(dep: DeploymentV1, hardware: RackV1 | ClusterV1, model: ModelV1, system: System,
            sources: dict[str, SourceMap], digest: str) -> Resolved:
    engines = catalog.engines()
    src = sources["deployment"]
    return Resolved(**_kernels(dep, model, system, engines),
                    **_memory(dep, hardware, model, system, engines, src),
                    **_deployment(dep, src),
                    engines=engines, digest=_digest(digest, dep, hardware, model))


def _kernels(dep: DeploymentV1, model: ModelV1, system: System, engines: Engines) -> dict:
    """The KV cache, the attention, linear and expert kernels the engine runs the model on."""
    s, m, family = dep.spec.serving, model.spec, system.gpu.family
    kv = Choice("serving.kv_cache_dtype", s.kv_cache_dtype or m.dtypes.kv_cache,
                "user" if s.kv_cache_dtype else "default",
                "written in the deployment" if s.kv_cache_dtype else "the model's KV dtype")
    length = Choice("serving.max_model_len", s.max_model_len or m.max_context_tokens,
                    "user" if s.max_model_len else "default",
                    "written in the deployment" if s.max_model_len
                    else "the model's context length")
    backend = engine_choices.attention(engines, m.architecture, m.attention.kind,
                         m.attention.indexer is not None, family)
    return dict(
        kv_cache_dtype=kv, max_model_len=length,
        block_size=engine_choices.block_size(engines, backend.value, m.architecture,
                                              s.block_size),
        hybrid=engine_choices.hybrid_facts(engines.vllm, m, backend.value, kv.value,
                                           s.speculative.draft_tokens if s.speculative else 0),
        attention_backend=backend,
        attention_options=engine_choices.attention_options(engines, m.attention.kind,
                                             m.attention.indexer is not None, family, kv.value),
        expert_format=engine_choices.expert_format(engines, model),
        linear_backend=engine_choices.linear(engines, engine_choices.linear_format(m), family),
        draft_moe_backend=engine_choices.draft_moe(engines, model, s.speculative is not None),
        uses_draft=bool(s.speculative and s.speculative.method in ("mtp", "dspark")),
        language_model_only=_language_model_only(dep, model),
        model_flags=engine_choices.model_flags(engines, m.architecture))


def _memory(dep: DeploymentV1, hardware: RackV1 | ClusterV1, model: ModelV1, system: System,
            engines: Engines, src: SourceMap) -> dict:
    """Where Engram and the pool live, the trays' DRAM, NICs and reserves."""
    s, hw, pool = dep.spec.serving, hardware.spec, dep.spec.serving.kv_pool
    reserved = _node_reserve(dep.spec.site.host.reserved_gib_per_tray,
                             hw.dram_gib_per_tray or system.tray.dram_gib.value)
    return dict(
        engram_placement=_user(src, "serving.engram_placement", s.engram_placement,
                               "Engram tables live in HBM (SYSTEM.md)"),
        engram_prefill=engine_choices.engram_prefill(engines, model, s.engram_placement),
        engram_decode=Choice("engram.decode",
                             engine_choices.engram_kind(model, s.engram_placement), "catalog",
                             "sharded over the instance's own ranks "
                             f"({engines.vllm.engram.shard_across_instances.source})"),
        kv_pool_dram=_pool_field(src, pool, "dram", bool(pool and pool.dram),
                                 "no kv_pool: no store"),
        kv_pool_hbm=engine_choices.pool_hbm(engines, bool(pool and pool.hbm)),
        dram_fraction=_pool_field(src, pool, "dram_fraction",
                                  pool.dram_fraction if pool else 0.0,
                                  "no kv_pool: no store"),
        nic_gbps_per_gpu=_override("hardware.nic_gbps_per_gpu", hw.nic_gbps_per_gpu,
                                   system.tray.nic_gbps_per_gpu),
        dram_gib_per_tray=_override("hardware.dram_gib_per_tray", hw.dram_gib_per_tray,
                                    system.tray.dram_gib),
        rdma_devices_per_tray=Choice(
            "hardware.rdma_devices_per_tray", hw.rdma_devices_per_tray or system.gpus_per_tray,
            "user" if hw.rdma_devices_per_tray else "default",
            "written in the rack" if hw.rdma_devices_per_tray else "one NIC per GPU"),
        gpu_reserve_gib=engine_choices.gpu_reserve(engines, system, s.gpu_reserve_gib),
        host_reserved_gib=reserved,
        host=HostReserve(reserved.value, PROCESS_GIB_PER_RANK,
                         engines.mooncake.store.local_buffer_gib.value))


def _deployment(dep: DeploymentV1, src: SourceMap) -> dict:
    """The workload, the objective, the SLO, routing and the deployment's own settings."""
    s, w, objective = dep.spec.serving, dep.spec.workload, dep.spec.objective
    return dict(
        workload=_workload(dep),
        image_tokens=float(w.images_per_request * (w.tokens_per_image or 0)),
        tokens_per_image=w.tokens_per_image or 0,
        objective_mode=_user(src, "objective.mode", objective.mode,
                             "throughput under the SLO is the default objective"),
        layout=objective.layout, shape_search=objective.shapes,
        **_pins(objective.instances, s.speculative.draft_tokens if s.speculative else 0),
        slo=dep.spec.slo,
        routing_policy=_user(src, "serving.routing", s.routing.policy,
                             "KV-aware routing: least uncached work (SYSTEM.md)"),
        overlap_score_credit=s.routing.overlap_score_credit,
        speculative=s.speculative, weight_offload=_weight_offload(dep),
        site=dep.spec.site, name=dep.metadata.name, namespace=s.namespace,
        vllm_version=s.vllm_version)


def _pins(entries: list[PinnedInstances], draft_tokens: int) -> dict:
    """The pinned entries, and their operating points: an entry's max_batch and
    max_batched_tokens, where left out, are its point's batch and step tokens, so that the
    engine runs the step the point predicts (compiler.input_checks refuses limits below it)."""
    pins, points = [], []
    for j, entry in enumerate(entries):
        point = pinned_point(j, entry)
        if point is None:
            pins.append(entry)
            continue
        batch = entry.max_batch or point.batch_per_rank
        tokens = entry.max_batched_tokens or point.step_tokens(draft_tokens)
        pins.append(entry.model_copy(update={"max_batch": batch, "max_batched_tokens": tokens}))
        filled = "" if entry.max_batch and entry.max_batched_tokens else \
            " (the point's where the entry leaves them out)"
        points.append(Choice(
            f"objective.operating_point.{point.role}", point, "user",
            f"written in the deployment (objective.instances[{j}]): this role is also "
            "predicted alone at this point (predicted.isolated: its step, without queueing, "
            f"admission or hand-off); the entry runs max_batch {batch}, max_batched_tokens "
            f"{tokens}{filled}"))
    return {"pins": tuple(pins), "operating_points": tuple(points)}


def _offload_choice(path: str, given: WeightOffload | None, field: tuple[str | int, ...],
                    why: str) -> Choice[OffloadAsk | None]:
    if given is None or given.backend == "none":
        return Choice(path, None, "user" if given else "default",
                      f"backend none ({why})" if given else why)
    return Choice(path, OffloadAsk(given.backend, given.gib_per_gpu, given.experts_only,
                                   given.group_size, given.num_in_group, given.prefetch_step,
                                   field), "user", why)


def _weight_offload(dep: DeploymentV1) -> tuple[Choice[OffloadAsk | None], ...]:
    """Each role's offload (its own, else the deployment-wide one), for the roles the layout
    may use, and each pinned entry's own; nothing when the deployment offloads nothing."""
    s, objective = dep.spec.serving, dep.spec.objective
    pinned = [(j, p) for j, p in enumerate(objective.instances) if p.weight_offload]
    if not (s.weight_offload or s.weight_offload_per_role or pinned):
        return ()
    roles = sorted({p.role for p in objective.instances}) if objective.mode == "pinned" else \
        LAYOUT_ROLES[objective.layout if objective.mode != "latency" else "disaggregated"]
    out = []
    for role in roles:
        own = getattr(s.weight_offload_per_role, role, None)
        if own is not None:
            out.append(_offload_choice(f"weight_offload.{role}", own,
                                       ("spec", "serving", "weight_offload_per_role", role),
                                       f"serving.weight_offload_per_role.{role}"))
        else:
            out.append(_offload_choice(
                f"weight_offload.{role}", s.weight_offload,
                ("spec", "serving", "weight_offload"),
                "serving.weight_offload, every role's" if s.weight_offload
                else f"no weight offload asked for {role}"))
    seen = set()
    for j, pin in pinned:
        if (pin.role, pin.shape) not in seen:  # entries of one role and shape agree (load)
            seen.add((pin.role, pin.shape))
            out.append(_offload_choice(f"weight_offload.{pin.role}.{pin.shape}",
                                       pin.weight_offload,
                                       ("spec", "objective", "instances", j, "weight_offload"),
                                       f"objective.instances[{j}].weight_offload"))
    return tuple(out)


LAYOUT_ROLES = {"any": ("aggregated", "decode", "prefill"),
                "disaggregated": ("decode", "prefill"), "aggregated": ("aggregated",)}
WORKLOAD_FIELDS = ("isl", "osl", "isl_cv", "osl_cv", "concurrency", "prefix_reuse",
                   "shared_prefix_tokens", "sessions")


def _workload(dep: DeploymentV1) -> tuple[Choice[float], ...]:
    """The request mix; a prompt's images add their tokens to its input length."""
    given, profile = dep.spec.workload, catalog.workload(dep.spec.workload.profile)
    images = given.images_per_request * (given.tokens_per_image or 0)
    out = []
    for name in WORKLOAD_FIELDS:
        value = getattr(given, name)
        fact = getattr(profile, name)
        choice = Choice(f"workload.{name}", float(value), "user", "written in the deployment") \
            if value is not None else Choice(f"workload.{name}", float(fact.value), "catalog",
                                             f"the {profile.name} profile: {fact.source}")
        if name == "isl" and images:
            choice = Choice(choice.path, choice.value + images, choice.source,
                            f"{choice.why}; plus {given.images_per_request:g} images x "
                            f"{given.tokens_per_image} tokens")
        out.append(choice)
    return tuple(out)


def _language_model_only(dep: DeploymentV1, model: ModelV1) -> Choice[bool] | None:
    path = "serving.language_model_only"
    if model.spec.vision is None:
        return None
    images = dep.spec.workload.images_per_request
    if images:
        return Choice(path, False, "default",
                      f"the workload sends {images:g} images per request: the vision tower loads")
    return Choice(path, True, "rule:text-only",
                  "a text-only workload (workload.images_per_request 0): the vision tower is "
                  "not loaded and its HBM goes to the KV cache (vLLM config/multimodal.py "
                  "MultiModalConfig.language_model_only: every modality limit 0, the tower's "
                  "weights skipped; vllm-project/recipes DeepSeek-V4.1-Flash text_only)")


def _node_reserve(given: float | None, dram_gib: float) -> Choice[float]:
    """Host memory of a tray the scheduler does not hand to pods: its capacity less its
    allocatable."""
    path = "site.host.reserved_gib_per_tray"
    if given is not None:
        return Choice(path, float(given), "user", "written in the deployment")
    value = round(max(NODE_RESERVE_MIN_GIB, NODE_RESERVE_FRACTION * dram_gib), 3)
    return Choice(path, value, "default",
                  f"assumed: max({NODE_RESERVE_MIN_GIB:g} GiB, {NODE_RESERVE_FRACTION:g} x "
                  f"{dram_gib:g} GiB): pods are placed against allocatable, which is capacity "
                  "less kube- and system-reserved and the eviction threshold (kubelet), less "
                  "what the GPU nodes' DaemonSets take (GPU operator: driver, toolkit, DCGM; "
                  "DRA driver, IMEX, network operator); GKE's kubelet reserve table (25% of "
                  "the first 4 GiB down to 2% above 128 GiB) keeps about 27 GiB of a 1 TiB "
                  "node, the rest is left to the DaemonSets and page cache; give the site's "
                  "own figure (capacity - allocatable of `kubectl describe node`)")


def _override(path: str, given: float | None, fact) -> Choice[float]:
    if given is not None:
        return Choice(path, float(given), "user", "written in the rack")
    return Choice(path, float(fact.value), "catalog", fact.source)


def kernel_block_problem(backend: str, block: int, architecture: str = "") -> str | None:
    """Why `block` does not run on `backend`, or on the architecture's own attention layers
    (None when it does)."""
    vllm = catalog.engines().vllm
    needs = vllm.models.get(architecture)
    for name, kernel in ((architecture, needs.block_sizes if needs else None),
                         (backend, vllm.attention.kernel_block_sizes.get(backend))):
        if kernel is not None and not any(block % k == 0 for k in kernel.value):
            return (f"{name} runs kernel blocks of {kernel.value} tokens and vLLM needs a "
                    f"multiple ({kernel.source})")
    return None


def _digest(inputs_digest: str, dep: DeploymentV1, hardware: RackV1 | ClusterV1,
            model: ModelV1) -> str:
    """The inputs' texts plus every catalog file the compile reads."""
    name = hardware.spec.system
    parts = [inputs_digest, catalog.system_text(name),
             catalog.workload_text(dep.spec.workload.profile),
             *(catalog.engine_text(n) for n in catalog.ENGINE_FILES)]
    for path in (catalog.calibration_path(name), catalog.calibration_path("serving")):
        parts.append(path.read_text() if path.exists() else "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()
