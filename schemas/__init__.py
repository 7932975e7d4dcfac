"""Input contracts of rackc: the four document kinds users write, and their loader."""

from schemas.base import StrictModel
from schemas.deployment import DeploymentV1
from schemas.model import ModelV1
from schemas.rack import ClusterV1, RackV1

API_VERSION = "rackc.dev/v1alpha1"
KINDS: dict[str, type[StrictModel]] = {"Rack": RackV1, "Cluster": ClusterV1, "Model": ModelV1,
                                       "Deployment": DeploymentV1}

__all__ = ["API_VERSION", "KINDS", "ClusterV1", "DeploymentV1", "ModelV1", "RackV1"]
