"""The solver's view of a deployment: placement domains, candidates and user requirements.

Built once from the validated inputs, the graph and the perf model; pure data afterwards, so the
CP-SAT models in this package are deterministic functions of it.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import networkx as nx

from compiler import arch, graph, routes
from compiler.load import Inputs
from compiler.memory import gpu_budget
from compiler.perf.capacity import Candidate
from compiler.shapes import Shape

SCALE = 1_000_000  # capacities enter CP-SAT as integer micro-requests per second
DECIMALS = 6  # goodputs in the plan keep SCALE's resolution
GOODPUT_TOP = 10**12  # the count model's bound on goodput, in SCALE's units


def scaled_supply(requests_per_s: float) -> int:
    """A candidate's capacity in CP-SAT units, rounded down: the plan never promises more
    than the SLO allows (a 128K-prompt prefill sustains ~0.016 requests/s, where rounding to
    the nearest milli-request overshot its TTFT by 2%)."""
    return max(1, math.floor(requests_per_s * SCALE))


@dataclass(frozen=True)
class Domain:
    """Where an instance may live: one NVLink rack (NVL72) or the whole RDMA cluster (HGX)."""

    id: str
    trays: tuple[str, ...]  # in order
    gpus_per_tray: int


@dataclass(frozen=True)
class Requirement:
    """A user requirement that an explanation can name: a field and where it was written."""

    key: str  # stable id, e.g. "pin:0", "slo", "unavailable:gpus:2"
    file_role: str  # "deployment" | "hardware"
    path: tuple[str | int, ...]
    text: str


@dataclass(frozen=True)
class Pin:
    role: str
    shape: Shape
    count: int
    requirement: Requirement
    max_batch: int | None = None  # the user's per-rank limits (None: rackc's default)
    max_batched_tokens: int | None = None


@dataclass(frozen=True)
class Kept:
    """An instance of the running plan (`--from`) that stays where it is, with its id."""

    id: str
    role: str
    shape: Shape
    gpus: tuple[str, ...]
    route: str | None = None  # the routing group that served it (its Dynamo graph)


@dataclass(frozen=True)
class Problem:
    """What the solver solves, built once (solve.build) and never changed: a variant (one
    domain, the kept instances) is a new Problem (`dataclasses.replace`)."""

    inputs: Inputs
    graph: nx.Graph
    domains: tuple[Domain, ...]
    candidates: tuple[Candidate, ...]
    pins: tuple[Pin, ...]
    mode: str
    unavailable: Mapping[str, frozenset[str]]  # requirement key -> GPUs
    requirements: Mapping[str, Requirement]
    kept: tuple[Kept, ...] = ()  # incremental recompile: fixed instances
    next_id: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({}))  # role -> first unused id number

    @property
    def routed(self) -> bool:
        """Routing groups follow NVLink domains (compiler.routes): the count model prices
        each domain's own group and the shared one (compiler/solve/locality.py)."""
        return routes.by_domain(self.inputs)

    @property
    def occupied(self) -> set[str]:
        """GPUs the kept instances hold: unavailable to new instances."""
        return {g for k in self.kept for g in k.gpus}

    def kept_counts(self) -> dict[int, int]:
        """Candidate index -> kept instances of its role and shape."""
        index = {(c.role, c.shape.name): i for i, c in enumerate(self.candidates)}
        out: dict[int, int] = {}
        for k in self.kept:
            i = index[k.role, k.shape.name]
            out[i] = out.get(i, 0) + 1
        return out

    def whole_trays(self, gpus: int) -> int:
        """Trays an instance of `gpus` GPUs takes whole (0: it fits inside one tray): the one
        rule the count model, the per-rack split and placement share."""
        per = self.domains[0].gpus_per_tray
        return gpus // per if gpus >= per else 0

    def gpus_of(self, tray: str) -> list[str]:
        return graph.gpus_of_tray(self.graph, tray)

    def prefill_base_gib(self, shape: Shape) -> float:
        """Per-GPU need of a prefill rank before its Engram shard: weights, one max-length
        request's KV (the HBM pool keeps only that), workspace."""
        mem = gpu_budget(self.inputs, "prefill", shape, 1)
        return mem.total_gib - mem.engram_gib

    @property
    def engram_gib(self) -> float:
        if not self.inputs.resolved.engram_in_hbm("prefill"):
            return 0.0  # the engine keeps prefill's tables in host memory (compiler.resolve)
        return arch.engram_bytes(self.inputs.model.spec) / arch.GIB

    @property
    def hbm_gib(self) -> float:
        return self.inputs.system.gpu.hbm_gib.value


def domains(inputs: Inputs, g: nx.Graph) -> list[Domain]:
    per_tray = inputs.system.gpus_per_tray
    trays = graph.trays(g)
    if inputs.system.form == "hgx":
        return [Domain("cluster", tuple(trays), per_tray)]
    by_fabric: dict[str, list[str]] = {}  # a rack's NVLink domain (its id: graph.build_graph)
    for t in trays:
        by_fabric.setdefault(g.nodes[graph.gpus_of_tray(g, t)[0]]["nvlink_domain"], []).append(t)
    return [Domain(f, tuple(ts), per_tray) for f, ts in by_fabric.items()]
