"""Reservation services: create, update, delete and show advance reservations, and check a
job's ``--reservation`` at submit. Services take a Session; the caller commits, except
the API's use cases at the end (``*_reservation``), which own their transaction.

Errors follow scontrol's wording where it has one ("Requested nodes are busy",
"Requested reservation is invalid") and add what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.hostlist import HostlistError, compress, expand
from shoal.model.job import JobState
from shoal.model.reservation import FLAGS, IGNORE_JOBS, MAINT
from shoal.sched.placement import natural_key
from shoal.server.jobs import JobError
from shoal.server.retry import retry_on_conflict
from shoal.server.schemas import ReservationCreate, ReservationUpdate
from shoal.store.models import JobRow, NodeRow, ReservationRow

if TYPE_CHECKING:
    from shoal.server.core import Server

INVALID = "Requested reservation is invalid"


def live(session: Session, name: str, now: float) -> ReservationRow | None:
    """The reservation called ``name`` unless it has ended (an ended one is purged here)."""
    row = session.get(ReservationRow, name)
    if row is not None and row.end_time <= now:
        session.delete(row)
        session.flush()
        return None
    return row


def check_job(session: Session, name: str, user: str, account: str | None, now: float) -> str:
    """The reservation a job may run in, or JobError with Slurm's submit-time message."""
    row = live(session, name, now)
    if row is None:
        raise JobError(f"{INVALID}: no reservation {name} (scontrol show reservation lists them)")
    if user not in row.users and (account is None or account not in row.accounts):
        raise JobError(f"{INVALID}: reservation {name} is not for user {user}"
                       + (f" or account {account}" if account else ""))
    return row.name


def create(session: Session, body: ReservationCreate, *, creator: str, partitions, now: float) -> dict:
    if live(session, body.name, now) is not None:
        raise JobError(f"Error creating the reservation: Duplicate reservation name {body.name}", 409)
    start = now if body.start_time is None else max(body.start_time, now)
    row = ReservationRow(name=body.name, start_time=start, end_time=_end(start, body.end_time, body.duration_s),
                         nodes=[], users=list(body.users), accounts=list(body.accounts),
                         flags=_flags(body.flags), partition=body.partition, created_by=creator)
    _settle(session, row, body.nodes, body.node_count, partitions, now, "creating")
    session.add(row)
    session.flush()
    return to_json(session, row, now)


def update(session: Session, name: str, body: ReservationUpdate, *, partitions, now: float) -> dict:
    row = _get(session, name, now)
    fields = body.model_fields_set
    start = row.start_time if body.start_time is None else max(body.start_time, now)
    if body.end_time is not None or body.duration_s is not None:
        end = _end(start, body.end_time, body.duration_s)
    else:  # a moved start keeps the duration, as scontrol does
        end = start + (row.end_time - row.start_time)
    row.start_time, row.end_time = start, end
    if body.users is not None:
        row.users = list(body.users)
    if body.accounts is not None:
        row.accounts = list(body.accounts)
    if body.flags is not None:
        row.flags = _flags(body.flags)
    if "partition" in fields:
        row.partition = body.partition or None
    nodes = body.nodes if body.nodes is not None or body.node_count is not None else compress(row.nodes)
    _settle(session, row, nodes, body.node_count, partitions, now, "updating")
    session.flush()
    return to_json(session, row, now)


def delete(session: Session, name: str, now: float) -> None:
    session.delete(_get(session, name, now))


def list_json(session: Session, now: float) -> list[dict]:
    rows = session.scalars(select(ReservationRow).where(ReservationRow.end_time > now)
                           .order_by(ReservationRow.start_time, ReservationRow.name))
    return [to_json(session, r, now) for r in rows]


def get_json(session: Session, name: str, now: float) -> dict:
    return to_json(session, _get(session, name, now), now)


def to_json(session: Session, row: ReservationRow, now: float) -> dict:
    # (a comprehension, not dict(rows): typed alike under SQLAlchemy 2.0, which Snakemake's sqlmodel pins, and 2.1)
    cpus = {name: n for name, n in session.execute(select(NodeRow.name, NodeRow.cpus).where(NodeRow.name.in_(row.nodes)))}
    return {
        "name": row.name, "start_time": row.start_time, "end_time": row.end_time,
        "duration_s": int(row.end_time - row.start_time),
        "nodes": compress(row.nodes) if row.nodes else "", "node_names": list(row.nodes),
        "node_count": len(row.nodes), "core_count": sum(cpus.get(n, 0) for n in row.nodes),
        "users": list(row.users), "accounts": list(row.accounts), "flags": list(row.flags),
        "partition": row.partition, "state": "ACTIVE" if row.start_time <= now < row.end_time else "INACTIVE",
        "created_by": row.created_by,
    }


def maint_windows(session: Session, now: float) -> list[tuple[float, float, list[str]]]:
    """The start, end and nodes of every MAINT reservation not over at ``now`` (nor later)."""
    return [(r.start_time, r.end_time, list(r.nodes))
            for r in session.scalars(select(ReservationRow).where(ReservationRow.end_time > now)) if MAINT in r.flags]


def maint_nodes(windows: list[tuple[float, float, list[str]]], now: float) -> set[str]:
    """Nodes under a MAINT reservation (``maint_windows``) active at ``now`` (sinfo shows them
    as ``maint``)."""
    return {n for start, end, nodes in windows if start <= now < end for n in nodes}


# ---------------------------------------------------------------- checks


def _get(session: Session, name: str, now: float) -> ReservationRow:
    row = live(session, name, now)
    if row is None:
        raise JobError(f"{INVALID}: no reservation {name}", 404)
    return row


def _end(start: float, end: float | None, duration_s: int | None) -> float:
    if end is not None and duration_s is not None:
        raise JobError("give EndTime= or Duration=, not both")
    if end is None and duration_s is None:
        raise JobError("Reservation request lacks EndTime= or Duration= (e.g. Duration=2:00:00)")
    if duration_s is not None:
        end = start + duration_s
    assert end is not None  # one of the two, checked above
    if end <= start:
        raise JobError("Reservation request has invalid time: EndTime must be after StartTime")
    return end


def _flags(flags: list[str]) -> list[str]:
    out = []
    for flag in flags:
        word = flag.strip().upper()
        if word not in FLAGS:
            raise JobError(f"Invalid reservation flag: {flag} (supported: {', '.join(FLAGS)})")
        if word not in out:
            out.append(word)
    return out


def _settle(session: Session, row: ReservationRow, nodes: str | None, node_count: int | None,
            partitions, now: float, doing: str) -> None:
    """Check users, partition and nodes, pick NodeCnt nodes, and refuse busy nodes."""
    if not row.users and not row.accounts:
        raise JobError("Reservation request lacks users or accounts (give Users= or Accounts=)")
    parts = {p.name: p for p in partitions}
    if row.partition is not None and row.partition not in parts:
        raise JobError(f"Invalid partition name specified: {row.partition} (partitions: {', '.join(parts)})")
    known = set(session.scalars(select(NodeRow.name)))
    for p in partitions:
        known.update(p.nodes)
    others = [r for r in session.scalars(select(ReservationRow).where(
        ReservationRow.name != row.name, ReservationRow.end_time > now,
        ReservationRow.start_time < row.end_time, ReservationRow.end_time > row.start_time))]
    held = {n: r.name for r in others for n in r.nodes}
    busy = {} if IGNORE_JOBS in row.flags else _busy_nodes(session, row.start_time, now)
    if nodes and node_count is not None:
        raise JobError("give Nodes= or NodeCnt=, not both")
    if node_count is not None:
        pool = parts[row.partition].nodes if row.partition else sorted(known, key=natural_key)
        free = [n for n in pool if n not in held and n not in busy]
        if len(free) < node_count:
            raise JobError(f"Error {doing} the reservation: Requested nodes are busy "
                           f"(only {len(free)} of {len(pool)} nodes are free for that time)", 409)
        row.nodes = free[:node_count]
        return
    if not nodes:
        raise JobError("Reservation request lacks Nodes= or NodeCnt=")
    try:
        names = expand(nodes)
    except HostlistError as e:
        raise JobError(f"invalid Nodes=: {e}") from None
    unknown = [n for n in names if n not in known]
    if unknown:
        raise JobError(f"Invalid node name specified: {unknown[0]}")
    for n in names:
        if n in held:
            raise JobError(f"Error {doing} the reservation: Requested nodes are busy "
                           f"({n} is in reservation {held[n]} at that time)", 409)
        if n in busy:
            raise JobError(f"Error {doing} the reservation: Requested nodes are busy (job {busy[n]} "
                           f"runs on {n} past the start; Flags=IGNORE_JOBS reserves it anyway)", 409)
    row.nodes = list(dict.fromkeys(names))


def _busy_nodes(session: Session, start: float, now: float) -> dict[str, int]:
    """Nodes whose running jobs, by their time limits, still run at ``start``: node -> job."""
    out: dict[str, int] = {}
    for job in session.scalars(select(JobRow).where(JobRow.state == JobState.RUNNING.value)):
        end = None if job.time_limit_s is None else (job.start_time or now) + job.time_limit_s
        if end is None or end > start:
            for n in (job.allocation or {"nodes": []})["nodes"]:
                out.setdefault(n["name"], job.id)
    return out


@retry_on_conflict
def create_reservation(server: Server, s: Session, body: ReservationCreate, creator: str) -> dict:
    with s.begin():
        out = create(s, body, creator=creator, partitions=server.partitions, now=server.clock())
    server.controller.wake()
    return out


@retry_on_conflict
def update_reservation(server: Server, s: Session, name: str, body: ReservationUpdate) -> dict:
    with s.begin():
        out = update(s, name, body, partitions=server.partitions, now=server.clock())
    server.controller.wake()
    return out


@retry_on_conflict
def delete_reservation(server: Server, s: Session, name: str) -> dict:
    with s.begin():
        delete(s, name, server.clock())
    server.controller.wake()
    return {"ok": True}
