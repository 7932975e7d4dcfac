"""`Deployment`: what to serve on which hardware, for which workload, under which SLOs."""

from typing import Annotated, Literal

from pydantic import Field

from schemas.site import Site
from schemas.base import (
    Fraction,
    Metadata,
    Name,
    PositiveFloat,
    PositiveInt,
    StrictModel,
)

Role = Literal["prefill", "decode", "aggregated"]


class Workload(StrictModel):
    """A catalog profile, with any of its parameters overridden."""

    profile: Literal["fixed", "chat", "agentx"]
    isl: PositiveInt | None = Field(None, description="Mean input tokens per request")
    osl: PositiveInt | None = Field(None, description="Mean output tokens per request")
    concurrency: PositiveInt | None = Field(None, description="Requests in flight")
    prefix_reuse: Fraction | None = Field(
        None, description="Share of input tokens that repeat an earlier request's prefix"
    )
    shared_prefix_tokens: PositiveInt | None = Field(
        None, description="Distinct prefix tokens per session (the pool's working set)"
    )
    sessions: PositiveInt | None = Field(None, description="Concurrent sessions")


class PinnedInstances(StrictModel):
    role: Role
    shape: str = Field(pattern=r"^(DEP[0-9]+|TP[0-9]+|TP[0-9]+EP[0-9]+)$")
    count: PositiveInt


ShapeName = Annotated[str, Field(pattern=r"^(DEP[0-9]+|TP[0-9]+|TP[0-9]+EP[0-9]+)$")]


class ShapeSearch(StrictModel):
    """Engine shapes the solver may use per role (default: the system's, from the catalog)."""

    prefill: list[ShapeName] | None = None
    decode: list[ShapeName] | None = None


class Objective(StrictModel):
    mode: Literal["throughput", "latency", "pinned"] = "throughput"
    shapes: ShapeSearch = Field(default_factory=ShapeSearch)
    instances: list[PinnedInstances] = Field(
        default_factory=list,
        description="mode pinned: the instance counts and shapes; the solver places them",
    )


class Slo(StrictModel):
    tokens_per_s_per_user_p50: PositiveFloat | None = None
    tokens_per_s_per_user_p90: PositiveFloat | None = None
    ttft_ms_p50: PositiveFloat | None = None
    ttft_ms_p90: PositiveFloat | None = None


class Speculative(StrictModel):
    method: Literal["dspark", "mtp", "eagle3"]
    draft_tokens: PositiveInt
    acceptance: PositiveFloat = Field(
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


class Serving(StrictModel):
    speculative: Speculative | None = None
    kv_cache_dtype: Literal["fp8", "bf16"] | None = Field(None, description="Default: the model's")
    kv_pool: KvPool | None = None
    engram_placement: Literal["hbm", "dram"] = "hbm"
    routing: Routing = Routing()
    block_size: PositiveInt = 64
    max_model_len: PositiveInt | None = Field(None, description="Default: the model's context")
    vllm_version: Literal["0.33.0"] = "0.33.0"
    namespace: Name = "rackc"


class DeploymentSpec(StrictModel):
    rack: str = Field(description="Path of the Rack or Cluster file, relative to this file")
    model: str = Field(description="Catalog model name, or path of a Model file (*.yaml)")
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
