"""The one error a target raises: the plan asks for something the target cannot express."""


class TargetError(ValueError):
    """A plan that the emitted configs cannot honour (named field, what is needed, why)."""
