"""Job array specifications: sbatch --array (``0-15``, ``1,3,5-7``, ``0-15:4``, ``0-15%2``).

Task ids are a set, as in Slurm's bitmap: they come back sorted and without duplicates.
Every id must be below MaxArraySize (Slurm's default is 1001, so 0-1000 are allowed).
"""

from __future__ import annotations

from bisect import bisect_right

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

ARRAY_FORMS = "ids and ranges like 0-15, 1,3,5-7 or 0-15:4, optionally followed by %N"


class ArraySpecError(ValueError):
    """An --array value that is not a valid list of task ids."""


def parse_array(spec: str, max_size: int = 1001) -> tuple[list[int], int | None]:
    """Task ids and the throttle (the ``%N``: at most N tasks run at once; None: no limit)."""
    text = spec.strip()
    body, pct, throttle_text = text.partition("%")
    throttle: int | None = None
    if pct:
        if not _is_count(throttle_text) or int(throttle_text) < 1:
            raise ArraySpecError(
                f"invalid --array value '{spec}': the throttle after '%' must be a positive "
                "number, like 0-15%4"
            )
        throttle = int(throttle_text)
    if not body:
        raise ArraySpecError(f"invalid --array value '{spec}': expected {ARRAY_FORMS}")
    ids: set[int] = set()
    for piece in body.split(","):
        ids.update(_parse_piece(piece.strip(), spec, max_size))
    return sorted(ids), throttle


def format_array(task_ids: Iterable[int], throttle: int | None = None) -> str:
    """The compact form parse_array reads back: ``0-15%2``, ``1,3,5-7``.

    squeue shows a pending array as ``<job>_[<this>]``; the brackets are the caller's.
    """
    ids = sorted(set(task_ids))
    ranges: list[tuple[int, int]] = []
    start = prev = None
    for i in ids:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None and prev is not None:
            ranges.append((start, prev))
        start = prev = i
    if start is not None and prev is not None:
        ranges.append((start, prev))
    return format_ranges(ranges, throttle)


def format_ranges(ranges: Iterable[tuple[int, int]], throttle: int | None = None) -> str:
    """format_array's text for ids given as sorted, disjoint, non-adjacent ``(lo, hi)`` ranges."""
    text = ",".join([_range_text(lo, hi) for lo, hi in ranges])
    return f"{text}%{throttle}" if throttle is not None else text


class TaskRanges:
    """A multiset of task ids kept as sorted ranges, for format_array's text without sorting
    them all: adding or removing an id costs a binary search (a pending array of 92,000 tasks,
    one of which starts at each scheduling pass, was 20 ms a pass to format whole)."""

    def __init__(self) -> None:
        self._lo: list[int] = []  # each range's first id, sorted
        self._hi: list[int] = []  # and its last
        self._count: dict[int, int] = {}  # id -> times added and not removed (a set when all are 1)

    def __len__(self) -> int:
        return len(self._count)

    def add(self, i: int) -> None:
        n = self._count.get(i, 0)
        self._count[i] = n + 1
        if n:
            return
        lo, hi = self._lo, self._hi
        k = bisect_right(lo, i)  # the ranges before k start at or below i (and end below it)
        left = k > 0 and hi[k - 1] == i - 1
        right = k < len(lo) and lo[k] == i + 1
        if left and right:
            hi[k - 1] = hi[k]
            del lo[k], hi[k]
        elif left:
            hi[k - 1] = i
        elif right:
            lo[k] = i
        else:
            lo.insert(k, i)
            hi.insert(k, i)

    def remove(self, i: int) -> None:
        n = self._count.pop(i)
        if n > 1:
            self._count[i] = n - 1
            return
        lo, hi = self._lo, self._hi
        k = bisect_right(lo, i) - 1  # the range holding i
        first, last = lo[k], hi[k]
        if first == last:
            del lo[k], hi[k]
        elif i == first:
            lo[k] = i + 1
        elif i == last:
            hi[k] = i - 1
        else:
            hi[k] = i - 1
            lo.insert(k + 1, i + 1)
            hi.insert(k + 1, last)

    def text(self, throttle: int | None = None) -> str:
        """format_array's text for the ids held."""
        return format_ranges(zip(self._lo, self._hi), throttle)


def _range_text(lo: int, hi: int) -> str:
    return str(lo) if hi == lo else f"{lo}-{hi}"


def _parse_piece(piece: str, spec: str, max_size: int) -> range:
    bounds, colon, step_text = piece.partition(":")
    lo_text, dash, hi_text = bounds.partition("-")
    if not _is_count(lo_text) or (dash and not _is_count(hi_text)) or (
        colon and (not dash or not _is_count(step_text))
    ):
        raise ArraySpecError(f"invalid --array value '{spec}' at '{piece}': expected {ARRAY_FORMS}")
    lo = int(lo_text)
    hi = int(hi_text) if dash else lo
    step = int(step_text) if colon else 1
    if hi < lo:
        raise ArraySpecError(
            f"invalid --array value '{spec}': range '{bounds}' is reversed, the low id comes first"
        )
    if step < 1:
        raise ArraySpecError(f"invalid --array value '{spec}': the step in '{piece}' must be at least 1")
    if hi >= max_size:
        raise ArraySpecError(
            f"invalid --array value '{spec}': task id {hi} is too large; ids must be below "
            f"MaxArraySize={max_size}"
        )
    return range(lo, hi + 1, step)


def _is_count(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 12
