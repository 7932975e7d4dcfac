"""The files `rackc calibrate` reads, as pydantic schemas: the raw measurements
(`rackc.calibration.raw/v1`, written by compiler/perf/measure.py and
compiler/perf/aiconfigurator.py; `--from-raw`) and a fitted calibration (`rackc.calibration/v1`;
`--scale-from`). Each is checked before it is used, so a damaged or hand-edited file is a
diagnostic, never a crash.

Measurements of the ops the fitter uses are checked field by field (the work functions of
compiler/perf/ops.py divide and multiply by them); measurements of other ops (collectives,
which the fitter leaves for later) need only an op name and a time. The bounds are far beyond
any GPU kernel's shapes and keep the fit's arithmetic finite.
"""

from itertools import pairwise
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from compiler.perf.ops import ANY_DTYPE, DTYPES, Curve

RAW_SCHEMA = "rackc.calibration.raw/v1"
SCHEMA = "rackc.calibration/v1"
MAX_MEASUREMENTS = 100_000  # measure.py writes about 1,000, AIConfigurator's tables about 7,000
MAX_DIM = 1 << 24  # rows, columns, heads, sequence lengths: far beyond any kernel's
MAX_BYTES = 1 << 44  # one copy's bytes: 16 TiB
MAX_US = 1e9  # a kernel of a thousand seconds is no measurement

Dim = Annotated[int, Field(ge=1, le=MAX_DIM, strict=True)]
Us = Annotated[float, Field(gt=0, le=MAX_US, allow_inf_nan=False)]
Dtype = Literal[DTYPES]
Text = Annotated[str, Field(max_length=1000)]


class _Measured(BaseModel):
    """Fields every measurement may carry besides its query: the median time and its spread."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    us: Us
    us_p10: Us | None = None
    us_p90: Us | None = None
    reps: Annotated[int, Field(ge=1, le=1 << 31, strict=True)] | None = None
    impl: Text = ""


class Gemm(_Measured):
    op: Literal["gemm"]
    dtype: Dtype
    m: Dim
    n: Dim
    k: Dim


class GroupedGemm(_Measured):
    op: Literal["grouped_gemm"]
    dtype: Dtype
    experts: Dim
    tokens_per_expert: Dim
    k: Dim
    n: Dim


class Moe(_Measured):
    op: Literal["moe"]
    dtype: Dtype
    tokens: Dim
    experts: Dim
    local_experts: Dim
    top_k: Dim
    hidden: Dim
    inter: Dim
    ep: Dim | None = None
    tp: Dim | None = None

    @model_validator(mode="after")
    def _experts(self) -> "Moe":
        if self.local_experts > self.experts or self.top_k > self.experts:
            raise ValueError("local_experts and top_k must be at most experts")
        return self


class _Attention(_Measured):
    dtype: Dtype
    q_heads: Dim
    kv_heads: Dim
    head_dim: Dim

    @model_validator(mode="after")
    def _heads(self) -> "_Attention":
        if self.q_heads % self.kv_heads:
            raise ValueError("q_heads must be a multiple of kv_heads")
        return self


class AttnDecode(_Attention):
    op: Literal["attn_decode"]
    batch: Dim
    kv_len: Dim


class AttnPrefill(_Attention):
    op: Literal["attn_prefill"]
    seq_len: Dim
    causal: bool
    batch: Dim = 1


class Copy(_Measured):
    op: Literal["copy"]
    bytes: Annotated[int, Field(ge=1, le=MAX_BYTES, strict=True)]


MODELS: dict[str, type[_Measured]] = {
    m.model_fields["op"].annotation.__args__[0]: m
    for m in (Gemm, GroupedGemm, Moe, AttnDecode, AttnPrefill, Copy)}


class MoeTable(BaseModel):
    """One MoE shape's measured fused-MoE times by token count (fit.moe_tables)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    dtype: Dtype
    scales: Literal["", "block", "mx"]
    hidden: Dim
    inter: Dim
    top_k: Dim
    experts: Dim
    local_experts: Dim
    tokens: Annotated[list[Dim], Field(min_length=2, max_length=MAX_DIM)]
    us: Annotated[list[Us], Field(min_length=2, max_length=MAX_DIM)]

    @model_validator(mode="after")
    def _a_table(self) -> "MoeTable":
        if len(self.us) != len(self.tokens):
            raise ValueError("a time for each token count")
        if any(a >= b for a, b in pairwise(self.tokens)):
            raise ValueError("token counts in increasing order")
        if self.top_k > self.experts or self.local_experts > self.experts:
            raise ValueError("top_k and local_experts at most experts")
        return self


class Other(BaseModel):
    """A measurement the fitter does not use (collectives): kept as written."""

    model_config = ConfigDict(extra="allow", frozen=True)
    op: Annotated[str, Field(min_length=1, max_length=100)]
    us: Us

    @model_validator(mode="after")
    def _not_fitted(self) -> "Other":
        if self.op in MODELS:  # reached only when the op's own schema failed
            raise ValueError(f"a {self.op} measurement with its fields")
        return self


class Device(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    gpu: Annotated[str, Field(min_length=1, max_length=200)]


class RawFile(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    schema_: Literal[RAW_SCHEMA] = Field(alias="schema")
    device: Device
    measurements: Annotated[list[dict], Field(min_length=1, max_length=MAX_MEASUREMENTS)]  # each
    # checked on its own (below), so that a bad one is named by its index and its op's fields
    source: dict | None = None
    moe_tables: Annotated[list[MoeTable], Field(max_length=MAX_MEASUREMENTS)] = []


class CalibrationFile(BaseModel):
    """A fitted calibration; `--scale-from` carries its curves onto another system."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    schema_: Literal[SCHEMA] = Field(alias="schema")
    system: Annotated[str, Field(min_length=1, max_length=200)]
    curves: dict[Literal[(*MODELS, "attn_decode", "indexer")],
                 dict[Literal[(*DTYPES, ANY_DTYPE)], Curve]]  # Curve checks its own terms
    notes: list[Text] = []
    moe_tables: Annotated[list[MoeTable], Field(max_length=MAX_MEASUREMENTS)] = []


def calibration_errors(document: object) -> list[tuple[str, str, str]]:
    """(field path, expected, got) of each problem of a calibration document (at most 20)."""
    try:
        CalibrationFile.model_validate(document)
    except ValidationError as exc:
        return [_problem(err, ()) for err in exc.errors(include_url=False)[:20]]
    return []


def validation_errors(raw: object) -> list[tuple[str, str, str]]:
    """(field path, expected, got) of each problem of a raw document (at most 20), none when
    it is a valid raw calibration file."""
    try:
        doc = RawFile.model_validate(raw)
    except ValidationError as exc:
        return [_problem(err, ()) for err in exc.errors(include_url=False)[:20]]
    problems = []
    for i, m in enumerate(doc.measurements):
        op = m.get("op")
        model = MODELS.get(op, Other) if isinstance(op, str) else Other
        try:
            model.model_validate(m)
        except ValidationError as exc:
            problems += [_problem(err, ("measurements", i)) for err in exc.errors(
                include_url=False)]
        if len(problems) >= 20:
            break
    return problems[:20]


def _problem(err: dict, prefix: tuple) -> tuple[str, str, str]:
    loc = [*prefix, *(p for p in err["loc"] if not str(p).startswith("function-"))]
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    expected = err["msg"].replace("Input should be ", "").replace("Value error, ", "")
    got = "nothing" if err["type"] == "missing" else repr(err.get("input"))[:60]
    if err["type"] == "extra_forbidden":
        expected, got = "a known field", f"unknown key {loc[-1]!r}"
    return path, expected, got
