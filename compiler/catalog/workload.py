"""Workload profiles: the request mix a deployment is planned for, each number sourced."""

from pydantic import BaseModel, ConfigDict

from compiler.catalog.system import Sourced


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str
    description: str
    isl: Sourced
    osl: Sourced
    isl_cv: Sourced
    osl_cv: Sourced
    concurrency: Sourced
    prefix_reuse: Sourced
    shared_prefix_tokens: Sourced
    sessions: Sourced
