"""Sizes as administrators write them in node definitions: 2T, 512G, 4096M, 4096 (MiB)."""

from __future__ import annotations

import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}


def parse_size_mb(text: str | int) -> int:
    """'2T', '512G', '4096M', '4096' or an int (MiB) -> MiB, as slurm.conf's RealMemory takes sizes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE.fullmatch(str(text))
        if not m:
            raise ValueError(f"invalid size {text!r}: expected a number with an optional K, M, G or T suffix")
        value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 MiB")
    return int(value)
