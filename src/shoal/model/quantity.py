"""Kubernetes resource quantities as manifests write them: ``500m``, ``2``, ``200Gi``, ``1e3``.

The grammar is Kubernetes' own (``resource.Quantity``): a signed decimal number, then one
suffix, binary (Ki..Ei), decimal (m, k, M..E) or an exponent (``e3``, ``E-2``). Parsing goes
through ``Decimal`` so that ``0.1`` cores or ``1G`` bytes round the way the API server does.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(.*)")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_MIB = Decimal(2) ** 20
EXAMPLES = "500m, 2, 200Gi"


def parse_decimal(value: str | int | float) -> Decimal:
    """A quantity as an exact ``Decimal`` (the base unit: cores, bytes, GPUs)."""
    if isinstance(value, bool):
        raise _error(value)
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _error(value)
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise _error(value)
    m = _NUMBER.fullmatch(value)
    if not m:
        raise _error(value)
    number, suffix = m.groups()
    try:
        base = Decimal(number)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        raise _error(value) from None
    if suffix in _SUFFIXES:
        return base * _SUFFIXES[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp and abs(int(exp.group(1))) <= 64:
        return base.scaleb(int(exp.group(1)))
    raise _error(value)


def parse_quantity(value: str | int | float) -> float:
    """``'500m'`` -> 0.5, ``'2Ki'`` -> 2048.0, ``'1e3'`` -> 1000.0; ints and floats as they are."""
    return float(parse_decimal(value))


def parse_cpu(value: str | int | float) -> float:
    """CPU cores: ``'500m'`` -> 0.5, ``2`` -> 2.0. Negative amounts are refused."""
    cores = parse_decimal(value)
    if cores < 0:
        raise ValueError(f"{value!r} is negative: a CPU amount must be at least 0")
    return float(cores)


def parse_memory_mb(value: str | int | float) -> int:
    """Memory in MiB, rounded up (a request is never shrunk): ``'200Gi'`` -> 204800,
    ``'1G'`` -> 954; a bare number is bytes, as in Kubernetes."""
    size = parse_decimal(value)
    if size < 0:
        raise ValueError(f"{value!r} is negative: a memory amount must be at least 0")
    return int((size / _MIB).to_integral_value(rounding="ROUND_CEILING"))


def _error(value: object) -> ValueError:
    return ValueError(f"{value!r} is not a quantity (expected e.g. {EXAMPLES})")
