"""Partitions changed at run time (``scontrol update PartitionName=...``).

The cluster file defines the partitions; an administrator's changes are kept in the store
(``PartitionRow``: only the keys changed) and laid over them, so they survive a restart and
every server sharing the store sees them. ``apply_changes`` is the pure part.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.hostlist import HostlistError, compress, expand
from shoal.model.snapshot import Partition
from shoal.server.jobs import JobError
from shoal.server.schemas import PartitionUpdate
from shoal.store.models import NodeRow, PartitionRow

if TYPE_CHECKING:
    from shoal.server.core import Server

STATES = ("UP", "DOWN", "DRAIN", "INACTIVE")
# The Partition fields an update may set, and the API's names for them.
FIELDS = ("state", "max_time_s", "default_time_s", "max_nodes", "default", "priority_job_factor", "nodes")


def apply_changes(configured: tuple[Partition, ...], changes: dict[str, dict[str, Any]]) -> tuple[Partition, ...]:
    """The partitions as they stand: the cluster file's, with each one's stored changes over
    it. A partition made the default takes that from the others, as Slurm has only one."""
    out = []
    for part in configured:
        changed = changes.get(part.name) or {}
        values = {k: v for k, v in changed.items() if k in FIELDS}
        if "nodes" in values:
            values["nodes"] = tuple(values["nodes"])
        out.append(replace(part, **values))
    defaults = [p.name for p in out if changes.get(p.name, {}).get("default")]
    if defaults:  # the latest change wins; changes are ordered oldest first
        newest = defaults[-1]
        out = [replace(p, default=p.name == newest) for p in out]
    return tuple(out)


def load(session: Session, configured: tuple[Partition, ...]) -> tuple[Partition, ...]:
    rows = session.scalars(select(PartitionRow).order_by(PartitionRow.updated)).all()
    return apply_changes(configured, {r.name: r.changes for r in rows})


def update(session: Session, current: tuple[Partition, ...], name: str, body: dict[str, Any],
           known_nodes: set[str], now: float) -> dict[str, Any]:
    """Record an update of partition ``name``; return the changes now stored for it."""
    if not any(p.name == name for p in current):
        raise JobError("Invalid partition name specified", 404)
    unknown = set(body) - set(FIELDS)
    if unknown:
        raise JobError(f"Update of this parameter is not supported: {sorted(unknown)[0]}")
    if not body:
        raise JobError(f"nothing to update for partition {name}")
    if "state" in body and body["state"] not in STATES:
        raise JobError(f"Invalid input: State={body['state']} (acceptable State values are UP, DOWN, DRAIN and "
                       "INACTIVE)")
    if "nodes" in body:
        try:
            names = expand(body["nodes"]) if body["nodes"] else []
        except HostlistError as e:
            raise JobError(f"Invalid node name specified: {e}") from None
        missing = [n for n in names if n not in known_nodes]
        if missing:
            raise JobError(f"Invalid node name specified: {compress(missing)}")
        body = {**body, "nodes": names}
    if body.get("default") is False:
        raise JobError("Default=NO: make another partition the default instead (Default=YES on it)")
    row = session.get(PartitionRow, name)
    if row is None:
        row = PartitionRow(name=name, changes={}, updated=now)
        session.add(row)
    row.changes = {**row.changes, **body}
    row.updated = now
    return dict(row.changes)


_encoded: tuple[tuple[Partition, ...], bytes] | None = None  # the last partitions listed, and their JSON


def list_encoded(partitions: tuple[Partition, ...]) -> bytes:
    """list_json's JSON, made again only when the partitions are (read again at most once a
    second): a thousand nodes' names and hostlist per sinfo, else."""
    global _encoded
    kept = _encoded
    if kept is None or kept[0] is not partitions:
        kept = (partitions, json.dumps(list_json(partitions), ensure_ascii=False, separators=(",", ":")).encode())
        _encoded = kept
    return kept[1]


def list_json(partitions: tuple[Partition, ...]) -> dict:
    """The partitions as sinfo and scontrol show partition read them."""
    return {"partitions": [
        {"name": pt.name, "nodes": compress(pt.nodes) if pt.nodes else "", "node_names": list(pt.nodes),
         "default": pt.default, "default_time_s": pt.default_time_s, "max_time_s": pt.max_time_s,
         "max_nodes": pt.max_nodes, "state": pt.state, "priority_job_factor": pt.priority_job_factor}
        for pt in partitions
    ]}


def change(server: Server, s: Session, name: str, body: PartitionUpdate) -> dict:
    """scontrol update partition: stored, then every server's partitions refreshed."""
    changes = body.model_dump(exclude_unset=True)
    for key in ("state", "default", "priority_job_factor", "nodes"):  # these have no "unlimited"
        if key in changes and changes[key] is None:
            raise JobError(f"{key} may not be null")
    with s.begin():
        known = set(s.scalars(select(NodeRow.name)))
        stored = update(s, server.partitions, name, changes, known, server.clock())
    server.refresh_partitions()
    server.controller.wake()
    return {"name": name, "changes": stored}
