"""sbatch --dependency: ``afterok:12:13,afterany:14`` (all must hold) or ``afterok:12?afterok:13`` (any).

Array task references (``12_3``) are accepted and stand for the whole array job 12:
waiting for every task of the array is never earlier than waiting for one, so the job
cannot start too soon, though it may start later than in Slurm. Per-job delays
(``after:12+10``) are refused rather than silently ignored.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

KINDS = ("after", "afterany", "afterok", "afternotok", "aftercorr", "singleton")
DEPENDENCY_FORMS = "type:job_id[:job_id...] joined by ',' (all) or '?' (any), or singleton"


class Dependency:
    """One clause of --dependency: kind is after, afterok, afternotok, afterany or singleton.

    Defined here, not in shoal.model.snapshot, so sbatch's start-up does not import the
    scheduler's snapshot types (about a fifth of its import time). A small immutable
    value class rather than a dataclass, for the same reason (dataclasses imports
    inspect): equal and hashed by (kind, job_ids), and equal only to a Dependency.
    """

    __slots__ = ("kind", "job_ids")
    __match_args__ = ("kind", "job_ids")

    kind: str
    job_ids: tuple[int, ...]

    def __init__(self, kind: str, job_ids: tuple[int, ...] = ()) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "job_ids", job_ids)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field '{name}': Dependency is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field '{name}': Dependency is immutable")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.kind, self.job_ids) == (other.kind, other.job_ids)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((self.kind, self.job_ids))

    def __repr__(self) -> str:
        return f"Dependency(kind={self.kind!r}, job_ids={self.job_ids!r})"

    def __reduce__(self):  # pickling and copying go through __init__, not __setattr__
        return (self.__class__, (self.kind, self.job_ids))


class DependencyError(ValueError):
    """A --dependency value that is not a valid list of dependency clauses."""


def parse_dependency(text: str) -> tuple[tuple[Dependency, ...], bool]:
    """The clauses and whether any one suffices (``?``) rather than all of them (``,``)."""
    value = text.strip()
    if not value:
        raise DependencyError(f"empty --dependency value: expected {DEPENDENCY_FORMS}")
    if "," in value and "?" in value:
        raise DependencyError(
            f"invalid --dependency value '{text}': ',' (all) and '?' (any) cannot be mixed"
        )
    any_of = "?" in value
    clauses = tuple(_parse_clause(c.strip(), text) for c in value.split("?" if any_of else ","))
    return clauses, any_of


def format_dependency(dependencies: Iterable[Dependency], any_of: bool = False) -> str:
    """The text form parse_dependency reads back, as squeue and scontrol show it."""
    parts = []
    for dep in dependencies:
        if dep.kind == "singleton":
            parts.append("singleton")
        else:
            parts.append(":".join([dep.kind, *(str(j) for j in dep.job_ids)]))
    return ("?" if any_of else ",").join(parts)


def _parse_clause(clause: str, text: str) -> Dependency:
    kind, _, ids_text = clause.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise DependencyError(
            f"invalid --dependency value '{text}': unknown type '{kind or clause}', expected one of "
            + ", ".join(KINDS)
        )
    if kind == "singleton":
        if ids_text:
            raise DependencyError(f"invalid --dependency value '{text}': singleton takes no job ids")
        return Dependency("singleton")
    if not ids_text:
        raise DependencyError(
            f"invalid --dependency value '{text}': '{kind}' needs at least one job id, like {kind}:12"
        )
    return Dependency(kind, tuple(_job_id(j.strip(), text) for j in ids_text.split(":")))


def _job_id(token: str, text: str) -> int:
    if "+" in token:
        raise DependencyError(
            f"invalid --dependency value '{text}': delays like '{token}' are not supported"
        )
    job, underscore, task = token.partition("_")
    if not _is_id(job) or (underscore and not _is_id(task)):
        raise DependencyError(
            f"invalid --dependency value '{text}': '{token}' is not a job id (expected 12 or 12_3)"
        )
    job_id = int(job)
    if job_id < 1:
        raise DependencyError(f"invalid --dependency value '{text}': job ids start at 1")
    return job_id


def _is_id(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 12
