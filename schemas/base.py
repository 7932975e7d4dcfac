"""Shared building blocks: strict frozen models, the document envelope, common field types."""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

PositiveInt = Annotated[int, Field(gt=0)]
PATH_MAX = 4096  # bytes, Linux


def bounded(most: int | float, least: int = 1) -> Any:
    """`Annotated[int, bounded(most)]`: an integer count or size in [least, most]: every number
    users write is bounded by its domain, so nothing downstream meets 1e308 or a 5000-digit
    integer. (A Field, not the Annotated type, so that type checkers read the annotation.)"""
    return Field(ge=least, le=most)


def positive(most: float) -> Any:
    """`Annotated[float, positive(most)]`: a positive finite number of at most `most`."""
    return Field(gt=0, le=most)


NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS1123)]
SubdomainName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]
LabelKey = Annotated[str, Field(max_length=316, pattern=LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]


class StrictModel(BaseModel):
    """Unknown keys are errors, values are not coerced ("3" is not 3), objects are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Metadata(StrictModel):
    name: SubdomainName
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, str] = Field(default_factory=dict)
