"""Kubernetes resource quantities (`500m`, `64Gi`, `1e3`, `4`) as exact numbers
(k8s.io/apimachinery/pkg/api/resource)."""

import re
from fractions import Fraction

_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
           "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
           "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15),
           "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
           "Ei": Fraction(2**60)}
_FORM = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))"
                   r"(?:[eE]([+-]?\d{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?")


def parse(text: object) -> Fraction:
    """ValueError when `text` is not a quantity."""
    match = _FORM.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, suffix = match.groups()
    scale = Fraction(10) ** int(exponent) if exponent else _SUFFIX[suffix or ""]
    return Fraction(number) * scale
