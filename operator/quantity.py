"""Kubernetes resource quantities (`500m`, `4Gi`, `1.5e9`, `2`) as exact numbers, and back.

Needed to add the L2 pool's host memory to a container's memory request and to compare requests with
limits. Values are `Fraction`s, so arithmetic is exact.

Boundary: pure parsing and formatting.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Fraction | int] = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1, "k": 10**3,
    "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_PATTERN = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


def parse_quantity(value: int | str) -> Fraction:
    """The exact value of a quantity; ValueError naming the value if it is not one."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    match = _PATTERN.match(value.strip())
    if match is None:
        raise ValueError(f"not a quantity: {value!r} (examples: 500m, 4Gi, 2, 1.5e9)")
    number, suffix = Fraction(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def format_bytes(value: Fraction | int) -> str:
    """A byte count as the shortest exact binary quantity (`450Gi`), else plain bytes rounded up."""
    whole = -(-Fraction(value).numerator // Fraction(value).denominator)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if whole and whole % _BINARY[suffix] == 0:
            return f"{whole // _BINARY[suffix]}{suffix}"
    return str(whole)

