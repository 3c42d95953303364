"""Slurm hostlists: ``node[01-08,10]`` to names and back, as ``scontrol show hostnames/hostlist`` do.

A hostlist is a comma (or whitespace) separated list of items; each item is literal text
with any number of bracket groups, and an item with several groups is their cartesian
product (``rack[1-2]-gpu[01-02]``; with three or more groups in Slurm's own order, see _product). Inside a bracket the
width of a range is the width of its low bound, so ``n[008-010]`` keeps three digits
and ``n[8-10]`` gives ``n8 n9 n10``. Expansion keeps order and duplicates, as Slurm's
hostlist does; compression sorts and drops duplicates, as ``scontrol show hostlist`` does.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

MAX_NAMES = 1_000_000
"""The most names one hostlist may expand to, so a typo like ``n[1-999999999]`` fails fast."""

_SEPARATORS = ",\t\n "
_MAX_DIGITS = 18  # longer digit runs are text, not host numbers
_LAST_NUMBER = re.compile(r"^(.*?)([0-9]+)([^0-9]*)$", re.DOTALL)


class HostlistError(ValueError):
    """A hostlist that cannot be expanded or a name that cannot be put in one."""


def expand(hostlist: str) -> list[str]:
    """Every name a hostlist stands for, in order, duplicates kept (``scontrol show hostnames``)."""
    names: list[str] = []
    for item in _split_items(hostlist):
        parts = _parse_item(item, hostlist)
        count = 1
        for part in parts:
            if isinstance(part, list):
                count *= len(part)
        if len(names) + count > MAX_NAMES:
            raise HostlistError(
                f"hostlist '{_short(hostlist)}' expands to more than {MAX_NAMES:,} names"
            )
        names.extend(_product(parts))
    return names


def compress(names: Iterable[str]) -> str:
    """The shortest bracketed form of a set of names (``scontrol show hostlist``).

    Names are sorted by the text around their last number, then numerically; duplicates
    are dropped. Consecutive numbers of the same width become ranges: ``node01,node02,
    node03,node05`` gives ``node[01-03,05]``.
    """
    unique = set()
    for name in names:
        if not name or any(c in name for c in "[],\t\n "):
            raise HostlistError(
                f"cannot put {name!r} in a hostlist: a host name must be non-empty and "
                "contain no brackets, commas or whitespace"
            )
        unique.add(name)
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    plain: list[str] = []
    for name in unique:
        m = _LAST_NUMBER.match(name)
        if m is None or len(m.group(2)) > _MAX_DIGITS:
            plain.append(name)
        else:
            groups.setdefault((m.group(1), m.group(3)), []).append((int(m.group(2)), m.group(2)))
    items: list[tuple[tuple, str]] = [(sort_key(n), n) for n in plain]
    for (prefix, suffix), numbers in groups.items():
        numbers.sort(key=lambda vn: (vn[0], len(vn[1])))
        ranges = _ranges(numbers)
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            text = prefix + ranges[0][0] + suffix
        else:
            inner = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
            text = f"{prefix}[{inner}]{suffix}"
        items.append(((prefix, suffix, numbers[0][0], len(numbers[0][1])), text))
    items.sort(key=lambda kt: kt[0])
    return ",".join(text for _, text in items)


def numbered(prefix: str, count: int) -> list[str]:
    """``count`` node names ``prefix`` + a zero-padded number from 1 (node01..node04)."""
    width = max(2, len(str(count)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def compress_numbers(numbers: Iterable[int]) -> str:
    """Numbers as Slurm writes task ranks: ``[0, 1, 2, 5]`` gives ``0-2,5``."""
    ranges = _ranges([(n, str(n)) for n in sorted(set(numbers))])
    return ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def sort_key(name: str) -> tuple[str, str, int, int]:
    """The order ``compress`` puts names in: text around the last number, then the number."""
    m = _LAST_NUMBER.match(name)
    if m is None or len(m.group(2)) > _MAX_DIGITS:
        return (name, "", -1, 0)
    return (m.group(1), m.group(3), int(m.group(2)), len(m.group(2)))


def _ranges(numbers: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """Merge sorted (value, digits) pairs into (low, high) digit strings expand() reads back."""
    out: list[tuple[str, str]] = []
    lo_text = hi_text = ""
    hi = -2
    width = 0
    for value, digits in numbers:
        if out or lo_text:
            if value == hi + 1 and str(value).zfill(width) == digits:
                hi, hi_text = value, digits
                continue
            out.append((lo_text, hi_text))
        lo_text = hi_text = digits
        hi, width = value, len(digits)
    if lo_text:
        out.append((lo_text, hi_text))
    return out


def _split_items(hostlist: str) -> Iterator[str]:
    """Split at top-level separators; commas inside brackets belong to the bracket."""
    depth = 0
    start = 0
    for i, c in enumerate(hostlist):
        if c == "[":
            if depth:
                raise HostlistError(f"nested '[' at position {i + 1} in hostlist '{_short(hostlist)}'")
            depth = 1
        elif c == "]":
            if not depth:
                raise HostlistError(
                    f"']' without a matching '[' at position {i + 1} in hostlist '{_short(hostlist)}'"
                )
            depth = 0
        elif c in _SEPARATORS and not depth:
            if i > start:
                yield hostlist[start:i]
            start = i + 1
    if depth:
        raise HostlistError(f"unclosed '[' in hostlist '{_short(hostlist)}'")
    if len(hostlist) > start:
        yield hostlist[start:]


def _parse_item(item: str, hostlist: str) -> list[str | list[str]]:
    """An item as literal text pieces and lists of the numbers each bracket group gives."""
    parts: list[str | list[str]] = []
    pos = 0
    while True:
        open_at = item.find("[", pos)
        if open_at < 0:
            if pos < len(item):
                parts.append(item[pos:])
            return parts
        close_at = item.index("]", open_at)  # _split_items guarantees it
        if open_at > pos:
            parts.append(item[pos:open_at])
        parts.append(_parse_group(item[open_at + 1:close_at], hostlist))
        pos = close_at + 1


def _parse_group(body: str, hostlist: str) -> list[str]:
    """``01-03,5`` to ``['01', '02', '03', '5']``, refusing more than MAX_NAMES."""
    if not body.strip():
        raise HostlistError(f"empty brackets '[]' in hostlist '{_short(hostlist)}'")
    numbers: list[str] = []
    for piece in body.split(","):
        piece = piece.strip()
        lo_text, dash, hi_text = piece.partition("-")
        if not _is_number(lo_text) or (dash and not _is_number(hi_text)):
            raise HostlistError(
                f"range '{piece}' in hostlist '{_short(hostlist)}' is not a number or "
                "a low-high range like 01-08"
            )
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if hi < lo:
            raise HostlistError(
                f"reversed range '{piece}' in hostlist '{_short(hostlist)}': "
                "the low bound must come first"
            )
        if len(numbers) + hi - lo + 1 > MAX_NAMES:
            raise HostlistError(
                f"hostlist '{_short(hostlist)}' expands to more than {MAX_NAMES:,} names"
            )
        width = len(lo_text)
        numbers.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return numbers


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS


def _product(parts: list[str | list[str]]) -> Iterator[str]:
    """The names of one item, in Slurm 22.05's order: the last group varies fastest, then the
    first, the second, ... and the last but one slowest (``row[0,1]_rack[2-3]_blade[4,5]`` gives
    row0_rack2_blade4 row0_rack2_blade5 row1_rack2_blade4 ...); scripts index into that list."""
    import itertools

    groups = [i for i, part in enumerate(parts) if not isinstance(part, str)]
    slowest_first = groups[-2::-1] + groups[-1:]
    for choice in itertools.product(*(parts[i] for i in slowest_first)):
        chosen = dict(zip(slowest_first, choice))
        yield "".join(chosen[i] if i in chosen else part for i, part in enumerate(parts))  # type: ignore[misc]


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
