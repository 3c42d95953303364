"""The nodes as sinfo, scontrol show node, the console and the Kubernetes API list them.

Each node's own facts (its row: address, GPUs and their gres, labels, taints, state) are kept
by name until a commit changes a node row (the node rows' change count,
which heartbeats do not move: server.heartbeats), so listing a thousand nodes reads and
decodes their rows only after a change, not at every sinfo. What the running jobs hold is
kept the same way (server/running.py), and so are the clean-ups and maintenance windows (a
count of their own). sinfo's whole answer (``view=sinfo``, which shows no heartbeat time) is
kept encoded and gzipped until one of those inputs, the partitions or the nodes in
maintenance now change: with 20 clients at once, making it per call (a thousand nodes'
holdings and dicts, their JSON and its gzip) was half the server's time. With several
servers on one store the counts follow the others' commits too (the change feed carries
their keys), and the node rows are read again every FRESH_S for their heartbeat times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.gpu import gpu_gres
from shoal.model.node import NodeState, display_state
from shoal.model.resources import GPU
from shoal.server import listing
from shoal.server import reservations as resvsvc
from shoal.server.running import Use
from shoal.store.changes import ChangeCount
from shoal.store.models import CleanupRow, NodeRow


def node_facts(r: NodeRow) -> dict:
    """What a node's row alone says of it."""
    return {"name": r.name, "address": r.address, "port": r.port, "state": r.state, "reason": r.reason,
            "reason_time": r.reason_time, "gpu_health": r.gpu_health or [], "images": r.images or [], "cpus": r.cpus,
            "memory_mb": r.memory_mb, "gpus": r.gpus, "gres": gpu_gres(tuple(GPU(**g) for g in r.gpus)),
            "labels": r.labels, "taints": r.taints or [], "features": r.features,
            "last_heartbeat": r.last_heartbeat, "boot_time": r.boot_time, "registered_at": r.registered_at}


SINFO_VIEW = ("name", "address", "state", "display_state", "reason", "reason_time", "reason_user", "responding",
              "cpus", "cpus_alloc", "memory_mb", "memory_alloc_mb", "gres", "features", "partitions",
              "sockets", "cores_per_socket", "threads_per_core")
"""The keys sinfo reads of a Node (``GET /nodes?view=sinfo``; those a node has): not its GPUs one by
one, labels, images or jobs, which made a thousand nodes' listing ~3 MB of JSON per sinfo."""


FRESH_S = 2.0
"""With several servers on one store, the node rows' facts are read again at least this often."""

Holding = tuple[str, int, int, int, int]  # a clean-up's node, CPUs, memory, GPUs and job


class NodeListing:
    """``others`` counts the commits that change the clean-ups or the reservations."""

    def __init__(self, server, others: ChangeCount) -> None:
        self.server = server
        self.others = others
        self._lock = threading.Lock()
        # (node change count, facts by name, when read: monotonic)
        self._kept: tuple[int | None, list[dict], float] = (None, [], 0.0)
        self._parts: tuple[tuple, dict[str, list[str]]] | None = None  # (partitions, each node's names)
        # (others' count, the clean-ups' holdings, the MAINT reservations' windows)
        self._others: tuple[int | None, list[Holding], list[tuple[float, float, list[str]]]] = (None, [], [])
        self._sinfo = listing.KeptAnswer()
        self._rows: dict[str, tuple[dict, tuple, bytes]] = {}  # sinfo's rows: (facts, what else, encoded)

    def all_json(self, s: Session, view: tuple[str, ...] | None = None) -> list[dict]:
        """Every node, by name; with ``view`` only those keys (SINFO_VIEW)."""
        return self._with_use(s, self._facts(s), view)

    def sinfo(self, s: Session, gzip: bool) -> tuple[bytes, bool]:
        """sinfo's answer, ``{"nodes": all_json(s, SINFO_VIEW)}`` encoded, and whether it is
        gzipped: kept (``listing.KeptAnswer``) by what it is made from, each count noted
        before its rows are read (a commit racing the read moves it again). Made again, it
        encodes only the nodes whose row, holdings, state shown or partitions moved: the
        others' encodings are kept by node (``_rows``)."""
        server = self.server
        nodes = server.node_changes
        at = nodes.value
        generation, running = server.running.use(s)
        others_at, cleanups, windows = self._others_kept(s)
        maint = resvsvc.maint_nodes(windows, server.clock())
        partitions = server.partitions

        def make() -> bytes:
            return b'{"nodes":[' + b",".join(self._sinfo_rows(self._facts(s), running, cleanups, maint)) + b"]}"

        if generation is None or not nodes.enabled or not self.others.enabled:  # counted elsewhere too
            return listing.squeezed(make(), gzip)
        return self._sinfo.get((at, generation, others_at, frozenset(maint), partitions), make, gzip)

    def _sinfo_rows(self, facts: list[dict], running: dict[str, Use], cleanups: list[Holding],
                    maint: set[str]) -> list[bytes]:
        """Each node's sinfo row encoded, kept by what it is made of (its facts, by identity: a
        node row's change makes them all anew)."""
        use = _with_cleanups(running, cleanups)
        parts_of = self._partitions_of(self.server.partitions)
        kept = self._rows
        rows, out = {}, []
        for f in facts:
            name = f["name"]
            u = use.get(name, _IDLE)
            parts = parts_of.get(name, ())
            key = (u, name in maint, parts)
            was = kept.get(name)
            if was is not None and was[0] is f and was[1] == key:
                row = was[2]
            else:
                row = listing.dumps(_in_view(f, u, name in maint, parts, SINFO_VIEW))
            rows[name] = (f, key, row)
            out.append(row)
        self._rows = rows  # replaced whole: threads racing lose only a reuse
        return out

    def _facts(self, s: Session) -> list[dict]:
        """Every node row's facts, kept while no commit changes a node row. With several
        servers on the store, read again at least every FRESH_S too: the stored
        ``last_heartbeat`` of a node reporting to another server moves with no count (each
        server adds only the reports it heard itself, ``Heartbeats.latest``)."""
        changes = self.server.node_changes
        at = changes.value  # noted before the read: a commit racing it moves the count again
        kept = self._kept
        now = time.monotonic()
        if not changes.enabled or kept[0] != at or (self.server.leader.shared and now - kept[2] > FRESH_S):
            kept = (at, [node_facts(r) for r in s.scalars(select(NodeRow).order_by(NodeRow.name))], now)
            with self._lock:
                self._kept = kept
        return kept[1]

    def _others_kept(self, s: Session):
        """The clean-ups' holdings and the MAINT windows, read again (in a session of their own,
        which sees only what is committed) after a commit changed them."""
        count = self.others
        at = count.value
        kept = self._others
        if not count.enabled or kept[0] != at:
            count.take()  # the keys are not used: only that something changed
            now = self.server.clock()
            with self.server.sessions() as own:
                kept = (at, [(c.node, c.cpus, c.memory_mb, len(c.gpus), c.job_id)
                             for c in own.scalars(select(CleanupRow))], resvsvc.maint_windows(own, now))
            with self._lock:
                self._others = kept
        return kept

    def _partitions_of(self, partitions: tuple) -> dict[str, list[str]]:
        """Each node's partitions, made again only when the partitions are (read at most once a second)."""
        kept = self._parts
        if kept is None or kept[0] is not partitions:
            parts_of: dict[str, list[str]] = {}
            for pt in partitions:
                for n in pt.nodes:
                    parts_of.setdefault(n, []).append(pt.name)
            kept = self._parts = (partitions, parts_of)
        return kept[1]

    def rows_json(self, s: Session, rows: list[NodeRow]) -> list[dict]:
        """These nodes (rows just read)."""
        return self._with_use(s, [node_facts(r) for r in rows])

    def _with_use(self, s: Session, facts: list[dict], view: tuple[str, ...] | None = None) -> list[dict]:
        server = self.server
        _, running = server.running.use(s)  # what the running jobs hold on each node, kept (server/running.py)
        _, cleanups, windows = self._others_kept(s)
        maint = resvsvc.maint_nodes(windows, server.clock())
        use = _with_cleanups(running, cleanups)
        parts_of = self._partitions_of(server.partitions)
        beats = server.heartbeats
        out = []
        for f in facts:
            name = f["name"]
            u = use.get(name, _IDLE)
            if view is not None:
                out.append(_in_view(f, u, name in maint, parts_of.get(name, ()), view))
                continue
            cpus, mem, gpus, jobs = u
            out.append({
                **f,
                "display_state": _shown(f, u, name in maint),
                "cpus_alloc": cpus, "memory_alloc_mb": mem, "gpus_alloc": gpus,
                "partitions": list(parts_of.get(name, ())),
                "last_heartbeat": beats.latest(name, f["last_heartbeat"]),
                "jobs": list(jobs),
            })
        return out


_IDLE: Use = (0, 0, 0, ())


def _with_cleanups(running: dict[str, Use], cleanups: list[Holding]) -> dict[str, Use]:
    """Each node's running jobs' holdings and its clean-ups' (a job's clean-up holds what it
    held until its node reports it done), added up."""
    if not cleanups:
        return running
    use = dict(running)
    for node, cpus, memory_mb, gpus, job_id in cleanups:
        c, m, g, jobs = use.get(node, _IDLE)
        use[node] = (c + cpus, m + memory_mb, g + gpus, jobs if job_id in jobs else tuple(sorted((*jobs, job_id))))
    return use


def _in_view(f: dict, use: Use, in_maint: bool, parts: Iterable[str], view: tuple[str, ...]) -> dict:
    """A node's row with only ``view``'s keys (sinfo's few: its answer a tenth of the whole)."""
    made = {"display_state": _shown(f, use, in_maint), "cpus_alloc": use[0], "memory_alloc_mb": use[1],
            "partitions": list(parts)}
    return {k: made[k] if k in made else f[k] for k in view if k in made or k in f}


def _shown(f: dict, use: Use, in_maint: bool) -> str:
    """The state sinfo shows for a node (its facts ``f``) holding ``use``."""
    state = NodeState(f["state"])
    if in_maint and state is NodeState.UP:
        return "maint"
    return display_state(state, use[0], f["cpus"], use[2], len(f["gpus"]), bool(use[3]))
