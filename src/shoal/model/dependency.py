"""sbatch --dependency: ``afterok:12:13,afterany:14`` (all must hold) or ``afterok:12?afterok:13`` (any).

Array task references (``12_3``) are accepted and stand for the whole array job 12:
waiting for every task of the array is never earlier than waiting for one, so the job
cannot start too soon, though it may start later than in Slurm. Per-job delays
(``after:12+10``) are refused rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

KINDS = ("after", "afterany", "afterok", "afternotok", "aftercorr", "singleton")
DEPENDENCY_FORMS = "type:job_id[:job_id...] joined by ',' (all) or '?' (any), or singleton"


@dataclass(frozen=True)
class Dependency:
    """One clause of --dependency: kind is after, afterok, afternotok, afterany or singleton.

    Defined here, not in shoal.model.snapshot, so sbatch's start-up does not import the
    scheduler's snapshot types (about a fifth of its import time).
    """

    kind: str
    job_ids: tuple[int, ...] = ()


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
