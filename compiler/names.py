"""Kubernetes object names: DNS-1123 labels of at most 63 characters.

Model and deployment names carry dots and capitals (deepseek-v4.1-flash); every name a target
emits goes through `dns_label`, which keeps it readable and, when it must shorten it, stable:
as cdk8s' `Names.toDnsLabel` does, it trims from the LEFT (the last parts, a component or
role name, tell objects of one deployment apart; the first, the deployment's name, is the same
for all of them) and ends with 8 hex digits of a hash of the full name, so two long names
never collide.
"""

import hashlib
import re

MAX_LABEL = 63
_HASH_HEX = 8
_INVALID = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def dns_label(*parts: str) -> str:
    """Joins `parts` with '-', maps every other character to '-', shortens from the left and
    appends a hash."""
    full = "-".join(p for p in parts if p)
    name = _DASHES.sub("-", _INVALID.sub("-", full.lower())).strip("-")
    if not name:
        raise ValueError(f"no DNS-1123 label can be made from {parts!r}")
    if len(name) <= MAX_LABEL:
        return name
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_HEX]
    tail = name[len(name) - (MAX_LABEL - _HASH_HEX - 1):].lstrip("-")
    return f"{tail}-{digest}"


def graph_name(deployment: str, group: str | None) -> str:
    """The DynamoGraphDeployment of a fleet group (one group: the deployment's name alone)."""
    return dns_label(deployment, group or "")


def router_name(deployment: str, group: str | None) -> str:
    """lws/'s vllm-router of a fleet group (one group: `<deployment>-router`)."""
    return dns_label(deployment, group or "", "router")


def workload_name(instance_id: str, shape: str) -> str:
    """One Kubernetes workload per instance, named `<id>-<shape>` (targets/_components.py)."""
    return dns_label(instance_id, shape)


def leader_worker_set_name(deployment: str, workload: str) -> str:
    """The LeaderWorkerSet of an instance's workload (`Instance.workload`)."""
    return dns_label(deployment, workload)
