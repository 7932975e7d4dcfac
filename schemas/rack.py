"""`Rack` (one NVLink rack, or a few HGX nodes) and `Cluster` (several of them joined by RDMA)."""

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from schemas.base import (
    LabelKey,
    LabelValue,
    Metadata,
    Name,
    StrictModel,
    bounded,
    positive,
)

# GPU Feature Discovery: `nvidia.com/gpu.clique` = "<NVLink cluster UUID>.<clique id>".
GPU_CLIQUE = "nvidia.com/gpu.clique"
CLIQUE_VALUE = (r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                r"\.[0-9]+")
GpuId = Annotated[str, Field(pattern=r"^r[0-9]{1,3}-t[0-9]{2,3}-g[0-9]{1,2}$")]  # HGX: t100+
MAX_RACKS = 64  # NVL72 racks of one cluster (18 trays each)
MAX_NODES = 576  # HGX nodes of one cluster: the 4608 GPUs of 64 NVL72 racks
MAX_GPUS = MAX_RACKS * 72  # GPUs of one cluster, a mixed fleet's groups together (E212)


class Unavailable(StrictModel):
    """Hardware to leave out: whole trays (HGX: nodes) by index, single GPUs by id `r0-t07-g2`."""

    trays: list[Annotated[int, bounded(MAX_RACKS * 18 - 1, least=0)]] = Field(default_factory=list)
    gpus: list[GpuId] = Field(default_factory=list)


class HardwareSpec(StrictModel):
    system: str = Field(max_length=64,
                        description="Catalog system, e.g. vera-rubin-nvl72, gb300-nvl72, hgx-h200")
    trays: Annotated[int, bounded(MAX_NODES)] | None = Field(
        None, description="Compute trays per rack (HGX: nodes); default: the system's full count"
    )
    node_names: list[Name] | None = Field(
        None, description="Kubernetes node name of each tray, in rack-major, tray order"
    )
    node_name_template: str = Field(
        "{name}-r{rack}-t{tray:02d}", max_length=253,
        description="Used when node_names is absent; fields: name, rack, tray",
    )
    node_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, description="Extra labels every node of this hardware carries"
    )
    unavailable: Unavailable = Unavailable()
    dram_gib_per_tray: Annotated[float, positive(16384)] | None = Field(
        None, description="Override the catalog")
    nic_gbps_per_gpu: Annotated[float, positive(3200)] | None = Field(
        None, description="Override the catalog")
    rdma_devices_per_tray: Annotated[int, bounded(32)] | None = Field(
        None, description="RDMA NICs exposed to pods per tray (resource rdma/ib); default: GPUs"
    )


    @field_validator("node_labels")
    @classmethod
    def _gfd_labels(cls, labels: dict[str, str]) -> dict[str, str]:
        """Labels GPU Feature Discovery owns carry its values, never names we make up."""
        clique = labels.get(GPU_CLIQUE)
        if clique is not None and not re.fullmatch(CLIQUE_VALUE, clique):
            raise ValueError(f"{GPU_CLIQUE} as GPU Feature Discovery sets it, "
                             f"<clusterUUID>.<cliqueId> (got {clique!r}); leave it out to pin "
                             f"by node names only")
        return labels


class RackSpec(HardwareSpec):
    pass


class GroupSpec(HardwareSpec):
    """One group of a mixed fleet: racks or nodes of one system. Instances never straddle
    groups; its GPU ids continue the rack numbering of the groups before it."""

    name: Name = Field(description="Group name, unique in the cluster")
    racks: Annotated[int, bounded(MAX_RACKS)] | None = Field(
        None, description="NVL72 racks (one NVLink domain each)")
    nodes: Annotated[int, bounded(MAX_NODES)] | None = Field(
        None, description="HGX nodes (one NVLink domain each)")


class ClusterSpec(HardwareSpec):
    # a Cluster of groups names no system of its own (mypy: a narrower base field)
    system: str | None = Field(None, max_length=64,  # type: ignore[assignment]
                               description="Catalog system of a one-system cluster (else groups)")
    racks: Annotated[int, bounded(MAX_RACKS)] | None = Field(
        None, description="NVL72 racks (one NVLink domain each)")
    nodes: Annotated[int, bounded(MAX_NODES)] | None = Field(
        None, description="HGX nodes (one NVLink domain each)")
    groups: list[GroupSpec] | None = Field(
        None, min_length=1, max_length=MAX_RACKS,
        description="A mixed fleet: groups of different systems, instead of `system` and the "
                    "per-system fields above")


class RackV1(StrictModel):
    apiVersion: Literal["rackc.dev/v1alpha1"]
    kind: Literal["Rack"]
    metadata: Metadata
    spec: RackSpec


class ClusterV1(StrictModel):
    apiVersion: Literal["rackc.dev/v1alpha1"]
    kind: Literal["Cluster"]
    metadata: Metadata
    spec: ClusterSpec
