"""The watch cache: every served object as Kubernetes JSON, its resourceVersion, and the
recent changes as watch events (the API server's watch cache, fed by reading Shoal's store).

Shoal's rows carry per-row versions for optimistic concurrency; Kubernetes clients need one
ordered position to list at and watch from. The cache gives it: each resource's objects
are read again when a cheap fingerprint of their rows moves, compared with the last read,
and each object that changed gets the next number of one counter as its resourceVersion
and an ADDED, MODIFIED or DELETED event. The counter starts from the clock in
milliseconds, so a restarted server's positions are above the old ones: a client that
watches from an old position gets 410 Gone and lists again, as after etcd compaction.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shoal import __version__
from shoal.kube.nodeview import node_object
from shoal.server.kube import objects as objs
from shoal.server.kube import pods as podsvc
from shoal.server.kube.service import owner_of
from shoal.server.kubeapi.registry import Resource
from shoal.server.nodes import nodes_json
from shoal.store.models import EventRow, NodeRow, ObjectRow

EVENTS_KEPT = 20_000  # watch events kept for clients resuming from a position
POLL_S = 0.25  # how often a watcher looks for changes
UNWATCHED_READ_S = 0.5  # without change counts (HA), a resource read at most this old is current


@dataclass(frozen=True)
class Entry:
    rv: int
    owner: str | None  # who applied it (RBAC's owner rule), None for everyone's objects
    obj: dict


@dataclass(frozen=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED MODIFIED DELETED
    entry: Entry


Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects


class WatchCache:
    def __init__(self, sessions: Callable[[], Session], server) -> None:
        self.sessions = sessions
        self.server = server
        self.created = time.time()  # the built-in namespaces' creation time
        self.rv = int(self.created * 1000)
        self.lock = threading.Lock()
        self.state: dict[str, dict[Key, Entry]] = {}
        self.fingerprints: dict[str, tuple] = {}
        self.events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self.oldest = self.rv  # events after this position are all still kept
        self._reads: dict[str, asyncio.Future] = {}  # each resource's read in flight or last done
        self._read_at: dict[str, float] = {}

    # -- reading

    def sync(self, resource: Resource) -> int:
        """Bring one resource up to date; return the current position."""
        with self.lock:
            with self.sessions() as s:
                mark = self._fingerprint(s, resource)
                if mark is not None and self.fingerprints.get(resource.resource) == mark:
                    return self.rv
                items = _read(s, resource, self.server, self.created)
            self._apply(resource.resource, items)
            self.fingerprints[resource.resource] = mark
            return self.rv

    async def poll(self, resource: Resource) -> None:
        """``sync`` for watchers: however many watch a resource, it is read at most once per
        ``POLL_S``, and every watcher waits on that one read."""
        loop = asyncio.get_running_loop()
        name = resource.resource
        read = self._reads.get(name)
        if read is None or (read.done() and loop.time() - self._read_at.get(name, 0.0) >= POLL_S):
            read = self._reads[name] = asyncio.ensure_future(run_in_threadpool(self.sync, resource))
            self._read_at[name] = loop.time()
        await asyncio.shield(read)

    def items(self, resource: Resource) -> tuple[int, list[Entry]]:
        """(position, every object) after bringing the resource up to date."""
        rv = self.sync(resource)
        entries = self.state.get(resource.resource, {})
        return rv, list(entries.values())  # in the source's order (events oldest first)

    def get(self, resource: Resource, namespace: str, name: str) -> Entry | None:
        self.sync(resource)
        return self.state.get(resource.resource, {}).get((namespace, name))

    def since(self, resource: Resource, rv: int) -> Iterator[Event]:
        """The events of ``resource`` after position ``rv``, oldest first."""
        return iter(self.since_at(resource, rv)[0])

    def since_at(self, resource: Resource, rv: int) -> tuple[list[Event], int]:
        """The events of ``resource`` after position ``rv``, oldest first, and the position
        they bring a watcher to: the cache's, every change of ``resource`` up to it included
        (a bookmark's)."""
        with self.lock:
            recent = []
            for e in reversed(self.events):
                if e.rv <= rv:
                    break
                if e.resource == resource.resource:
                    recent.append(e)
            return recent[::-1], self.rv

    def too_old(self, rv: int) -> bool:
        return rv < self.oldest

    # -- keeping

    def _apply(self, resource: str, items: dict[Key, tuple[str | None, dict]]) -> None:
        old = self.state.get(resource)
        new: dict[Key, Entry] = {}
        for key, (owner, obj) in items.items():
            before = old.get(key) if old is not None else None
            if before is not None and before.obj == obj and before.owner == owner:
                new[key] = before
                continue
            self.rv += 1
            new[key] = entry = Entry(self.rv, owner, obj)
            if old is not None:
                self._event(Event(self.rv, resource, "ADDED" if before is None else "MODIFIED", entry))
        if old is not None:
            for key in old.keys() - new.keys():
                self.rv += 1
                self._event(Event(self.rv, resource, "DELETED", Entry(self.rv, old[key].owner, old[key].obj)))
        self.state[resource] = new

    def _event(self, event: Event) -> None:
        if len(self.events) == self.events.maxlen:
            self.oldest = self.events[0].rv
        self.events.append(event)

    def _fingerprint(self, s: Session, resource: Resource) -> tuple | None:
        """A cheap mark that moves when the resource's rows may have changed (None: read anyway)."""
        jobs, nodes = self.server.job_changes, self.server.node_changes
        if not (jobs.enabled and nodes.enabled):
            return ("time", int(time.monotonic() / UNWATCHED_READ_S))
        if resource.source == "pods":  # (a node's address, which pods show, changes only as it joins again)
            return (jobs.value,)
        if resource.source == "nodes":
            return (jobs.value, nodes.value, int(time.monotonic() / 2))  # heartbeats: no count watches them
        if resource.source == "events":
            return tuple(s.execute(select(func.max(EventRow.id), func.sum(EventRow.count))).one())
        return tuple(s.execute(select(func.count(), func.sum(ObjectRow.version), func.max(ObjectRow.version))
                               .where(ObjectRow.kind == resource.kind)).one())


# ---------------------------------------------------------------- sources


def _read(s: Session, resource: Resource, server, created: float) -> dict[Key, tuple[str | None, dict]]:
    if resource.source == "pods":
        addresses = {n.name: n.address for n in s.scalars(select(NodeRow))}
        return {(r.namespace, r.name): (r.user, _typed_pod(podsvc.to_json(r, addresses)))
                for r in podsvc.visible(s)}
    if resource.source == "nodes":
        rows = list(s.scalars(select(NodeRow).order_by(NodeRow.name)))
        return {("", n["name"]): (None, node_object(n, f"v{__version__}")) for n in nodes_json(server, s, rows)}
    if resource.source == "events":
        out = {}
        for e in objs.events_for(s, None, limit=EVENTS_KEPT // 4):
            obj = objs.event_json(e)
            out[(e.namespace, obj["metadata"]["name"])] = (None, obj)
        return out
    out = {(r.namespace, r.name): (owner_of(r), _no_nulls(quantities_as_strings(_job_selector(
        copy.deepcopy(objs.to_json(r)))))) for r in objs.list_rows(s, resource.kind)}
    if resource.kind == "Namespace":
        for name in objs.BUILTIN_NAMESPACES:
            out.setdefault(("", name), (None, {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": name, "uid": name,
                                                            "creationTimestamp": objs.rfc3339(created)},
                                               "spec": {"finalizers": ["kubernetes"]},
                                               "status": {"phase": "Active"}}))
        out = dict(sorted(out.items()))  # by name, as the API server lists
    return out


def quantities_as_strings(obj: dict) -> dict:
    """Kubernetes writes every resource quantity as a string (``"4"``, not 4): typed clients
    refuse numbers there. Changes the pod spec (or template's) of ``obj`` in place."""
    spec = obj.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") if "template" in spec else spec
    for c in (pod_spec or {}).get("containers") or ():
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            if isinstance(res.get(part), dict):
                res[part] = {k: str(v) for k, v in res[part].items()}
    return obj


def _job_selector(obj: dict) -> dict:
    """A Job shows the selector its controller uses (its pods' controller-uid label), as
    Kubernetes defaults it: ``kubectl logs job/NAME`` finds the pods by it."""
    if obj.get("kind") == "Job":
        label = {"batch.kubernetes.io/controller-uid": obj["metadata"]["uid"]}
        spec = obj.setdefault("spec", {})
        spec.setdefault("selector", {"matchLabels": label})
        tmeta = spec.setdefault("template", {}).setdefault("metadata", {})
        tmeta["labels"] = {**(tmeta.get("labels") or {}), **label}
    return obj


def _typed_pod(obj: dict) -> dict:
    """A pod as typed clients read it: required strings present (an agent reports no image
    ID for a process), no nulls."""
    for cs in (obj.get("status") or {}).get("containerStatuses") or ():
        cs["imageID"] = cs.get("imageID") or ""
        cs["image"] = cs.get("image") or ""
    return _no_nulls(quantities_as_strings(obj))


def _no_nulls(value):
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def with_rv(entry: Entry) -> dict:
    """The object as served: its resourceVersion is the cache's position of its last change."""
    obj = dict(entry.obj)
    obj["metadata"] = {**obj.get("metadata", {}), "resourceVersion": str(entry.rv)}
    return obj

