"""Shared building blocks: strict frozen models, the document envelope, common field types."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Name = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS1123)]
SubdomainName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]


class StrictModel(BaseModel):
    """Unknown keys are errors, values are not coerced ("3" is not 3), objects are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Metadata(StrictModel):
    name: SubdomainName
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
