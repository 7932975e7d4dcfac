"""`Deployment`: what to serve on which hardware, for which workload, under which SLOs."""

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import (
    PATH_MAX,
    Fraction,
    Metadata,
    Name,
    StrictModel,
    bounded,
    positive,
)
from schemas.model import LAYERS
from schemas.site import Site

Role = Literal["prefill", "decode", "aggregated"]
TOKENS = 1 << 24  # longer than any model's context
MAX_BATCHED_TOKENS = 1 << 20  # tokens per DP rank per step
# ...PPm: m pipeline stages (prefill only; compiler/shapes.py)
SHAPE = r"^(DEP[0-9]{1,3}|TP[0-9]{1,3}|TP[0-9]{1,3}EP[0-9]{1,3})(PP[0-9]{1,2})?$"
# vLLM 0.33 takes any positive --block-size, but its CUDA attention kernels take multiples of
# 16 (flash_attn, triton), 32 or 64 (FlashInfer MLA), 64 (FlashMLA) or 128 (CUTLASS MLA):
# vllm/v1/attention/backends/**/get_supported_kernel_block_sizes.
BlockSize = Literal[16, 32, 64, 128, 256]


class Workload(StrictModel):
    """A catalog profile, with any of its parameters overridden."""

    profile: Literal["fixed", "chat", "agentx"]
    isl: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Mean input tokens per request")
    osl: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Mean output tokens per request")
    isl_cv: Annotated[float, Field(ge=0, le=10)] | None = Field(
        None, description="Coefficient of variation of input lengths (0: all alike)")
    osl_cv: Annotated[float, Field(ge=0, le=10)] | None = Field(
        None, description="Coefficient of variation of output lengths (0: all alike)")
    concurrency: Annotated[int, bounded(1 << 20)] | None = Field(
        None, description="Requests in flight")
    prefix_reuse: Fraction | None = Field(
        None, description="Share of input tokens that repeat an earlier request's prefix"
    )
    shared_prefix_tokens: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Distinct prefix tokens per session (the pool's working set)"
    )
    sessions: Annotated[int, bounded(1 << 20)] | None = Field(
        None, description="Concurrent sessions")
    images_per_request: Annotated[float, Field(ge=0, le=4096)] = Field(
        0, description="Mean images per request; 0: text only (a model's vision tower is then "
                       "not loaded, vLLM --language-model-only)")
    tokens_per_image: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Mean prompt tokens one image becomes (its patches / merge^2); "
                          "needed with images_per_request, at most the model's cap")


class OperatingPoint(StrictModel):
    """A pinned entry's role predicted alone at a fixed batch and context (phase-isolated, as
    published decode and prefill results are measured: the other phase runs elsewhere): one
    step of the step model, without the serving model's queueing, admission or hand-off."""

    batch_per_rank: Annotated[int, Field(ge=1, le=1 << 16)] = Field(
        description="decode: requests decoding at once per DP rank; prefill: prompts "
                    "prefilled together in one step per DP rank")
    context_tokens: Annotated[int, bounded(TOKENS)] = Field(
        description="decode: tokens of context each request attends over (its KV length: "
                    "prompt plus output so far); prefill: each prompt's length")
    cached_share: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        None, description="prefill only: share of each prompt already in the prefix cache "
                          "(its KV read, not computed); default 0")


class WeightOffload(StrictModel):
    """Keep part of each GPU's decoder weights in pinned host memory, so that a model too large
    for HBM still fits. Backend `uva` (vLLM --cpu-offload-gb): the kernels read the offloaded
    weights over the GPU-CPU link (NVLink-C2C or PCIe) on every use, in every forward pass.
    Backend `prefetch` (--offload-backend prefetch): the last `num_in_group` of every
    `group_size` decoder layers live in host memory, and each is copied into a GPU buffer
    `prefetch_step` offloaded layers ahead, while the layers between compute: the copy costs
    only what that compute does not hide, and the buffers take HBM. `none`: no offload (for a
    role or pinned entry under a deployment-wide offload)."""

    backend: Literal["uva", "prefetch", "none"] = Field(
        "uva", description="uva (read over the link on every use), prefetch (copied a few "
                           "layers ahead) or none")
    gib_per_gpu: Annotated[float, positive(4096)] | None = Field(
        None, description="Weights per GPU kept in host memory. uva: required (at most the "
                          "offloadable weights); prefetch: rackc picks the layer groups that "
                          "offload at least this much (or give group_size instead)")
    experts_only: bool = Field(
        False, description="Offload only routed-expert weights (vLLM --cpu-offload-params / "
                           "--offload-params experts); default: any weights")
    group_size: Annotated[int, bounded(LAYERS)] | None = Field(
        None, description="prefetch: offload the last num_in_group of every group_size decoder "
                          "layers (vLLM --offload-group-size)")
    num_in_group: Annotated[int, bounded(LAYERS)] | None = Field(
        None, description="prefetch, with group_size: layers offloaded per group (default 1, "
                          "at most group_size)")
    prefetch_step: Annotated[int, bounded(LAYERS)] | None = Field(
        None, description="prefetch: offloaded layers copied ahead, each with its own GPU "
                          "buffer (default 1)")


class RoleOffload(StrictModel):
    """Weight offload per role; each replaces serving.weight_offload for its role."""

    prefill: WeightOffload | None = None
    decode: WeightOffload | None = None
    aggregated: WeightOffload | None = None


class PinnedInstances(StrictModel):
    role: Role
    shape: str = Field(pattern=SHAPE)
    count: int = Field(ge=1, le=4608, description="Instances (at most the GPUs of 64 NVL72 racks)")
    max_batch: Annotated[int, Field(ge=1, le=1 << 16)] | None = Field(
        None, description="Requests per DP rank (vLLM --max-num-seqs); default: what the KV "
                          "holds (decode, up to 1,024) or 64 (prefill)")
    max_batched_tokens: Annotated[int, Field(ge=1, le=MAX_BATCHED_TOKENS)] | None = Field(
        None, description="Tokens per DP rank per step (vLLM --max-num-batched-tokens); "
                          "default: the best prefill chunk, or the decode batch's tokens")
    operating_point: OperatingPoint | None = Field(
        None, description="predict this entry's role alone at this batch and context, besides "
                          "the serving figures (prefill or decode entries, one per role); its "
                          "batch and step tokens are the entry's max_batch and "
                          "max_batched_tokens where those are left out")
    weight_offload: WeightOffload | None = Field(
        None, description="These instances' weight offload (default: their role's); entries "
                          "of one role and shape share one")


ShapeName = Annotated[str, Field(pattern=SHAPE)]


class ShapeSearch(StrictModel):
    """Engine shapes the solver may use per role (default: every shape that fits)."""

    prefill: list[ShapeName] | None = Field(None, max_length=32)
    decode: list[ShapeName] | None = Field(None, max_length=32)
    aggregated: list[ShapeName] | None = Field(None, max_length=32)


class Objective(StrictModel):
    mode: Literal["throughput", "latency", "pinned"] = "throughput"
    shapes: ShapeSearch = Field(default_factory=ShapeSearch)
    layout: Literal["any", "disaggregated", "aggregated"] = Field(
        "any", description="what the solver searches: prefill + decode instances "
                           "(disaggregated), aggregated ones, or both (any); latency mode is "
                           "disaggregated")
    instances: list[PinnedInstances] = Field(
        default_factory=list, max_length=32,
        description="mode pinned: the instance counts and shapes; the solver places them",
    )


class Slo(StrictModel):
    tokens_per_s_per_user_p50: Annotated[float, positive(10_000)] | None = None
    tokens_per_s_per_user_p90: Annotated[float, positive(10_000)] | None = None
    ttft_ms_p50: Annotated[float, positive(3_600_000)] | None = None  # an hour
    ttft_ms_p90: Annotated[float, positive(3_600_000)] | None = None


class Speculative(StrictModel):
    method: Literal["dspark", "mtp", "eagle3"]
    draft_tokens: Annotated[int, bounded(16)]
    acceptance: float = Field(ge=1, le=17,
        description="Mean tokens emitted per verification step (accepted drafts + 1)"
    )


class KvPool(StrictModel):
    """The Mooncake store: host DRAM of every tray, optionally spare prefill HBM."""

    dram: bool = True
    hbm: bool = False
    dram_fraction: Fraction = Field(0.5, description="Share of each tray's DRAM given to it")


class Routing(StrictModel):
    policy: Literal["kv", "round-robin", "random"] = "kv"
    overlap_score_credit: Fraction = 1.0


class Checkpoint(StrictModel):
    """Serve the Model's architecture from another checkpoint (e.g. its NVFP4 or FP8
    quantisation) without copying the Model: what differs is the weights' dtypes and where
    they are downloaded from."""

    hf_id: str | None = Field(None, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$",
                              description="Hugging Face repository of the checkpoint")
    weights: Literal["fp4", "fp8", "bf16"] | None = Field(
        None, description="Attention, dense and shared weights (default: the Model's)")
    experts: Literal["fp4", "fp8", "bf16"] | None = Field(
        None, description="Routed expert weights (default: the Model's)")


class Serving(StrictModel):
    speculative: Speculative | None = None
    checkpoint: Checkpoint | None = None
    weight_offload: WeightOffload | None = Field(
        None, description="Every role's weight offload (a role's own in "
                          "weight_offload_per_role, or a pinned entry's own, replaces it)")
    weight_offload_per_role: RoleOffload | None = None
    redundant_experts: Annotated[int, bounded(4096, least=0)] | None = Field(
        None, description="EPLB: extra expert replicas over the EP ranks (vLLM --enable-eplb), "
                          "e.g. 32 so that EP48 serves 256 experts (default: the Model's, 0)")
    kv_cache_dtype: Literal["fp8", "bf16"] | None = Field(None, description="Default: the model's")
    kv_pool: KvPool | None = None
    engram_placement: Literal["hbm", "dram"] = "hbm"
    routing: Routing = Routing()
    block_size: BlockSize | None = Field(
        None, description="KV block in tokens. Default: the attention backend's kernel block")
    max_model_len: Annotated[int, bounded(TOKENS)] | None = Field(
        None, description="Default: the model's context")
    gpu_reserve_gib: Annotated[float, Field(gt=0, le=64)] | None = Field(
        None, description="GiB per GPU left outside --gpu-memory-utilization for what the "
                          "engine allocates before its memory check (CUDA context, NCCL "
                          "communicators, NIXL). Default: the catalog's figure; set it from a "
                          "measured start when vLLM reports too little free memory")
    vllm_version: Literal["0.33.0"] = "0.33.0"
    namespace: Name = "rackc"


class DeploymentSpec(StrictModel):
    rack: str = Field(min_length=1, max_length=PATH_MAX,
                      description="Path of the Rack or Cluster file, relative to this file")
    model: str = Field(min_length=1, max_length=PATH_MAX,
                       description="Catalog model name, or path of a Model file (*.yaml)")
    workload: Workload
    objective: Objective = Objective()
    slo: Slo = Slo()
    serving: Serving = Serving()
    site: Site = Field(default_factory=Site, description="What the cluster decides (images, "
                       "RDMA, model cache, secrets, scheduling)")


class DeploymentV1(StrictModel):
    apiVersion: Literal["rackc.dev/v1alpha1"]
    kind: Literal["Deployment"]
    metadata: Metadata
    spec: DeploymentSpec
