"""The running jobs by node, kept in memory: what each agent's work answer, sinfo and /metrics read.

Every start and end wakes the long-polls of the nodes concerned, and each answer used to read
every running job (id, version, kind) to find its node's own: with 8,000 jobs running on
1,000 nodes that is O(running jobs) per answer, and sinfo decoded every running job's
allocation per call. Here the running jobs (version, kind, and what each holds on each node)
are kept by id and by node, brought up to date from the jobs the servers' commits changed
(``store.changes.ChangeCount``, one of its own; another server's keys come on the change
feed), so a node's answer costs O(its jobs).

With the count disabled the running jobs are read afresh for each call; but one read serves
every call that came before it began (``_fresh``): a pass's starts wake a thousand long-polls
at once, and each reading every running job, a pool connection checked out meanwhile, ran
PostgreSQL's pool dry (a read begun after a call came in is as fresh as the call's own would be).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.job import JobState
from shoal.store.changes import ALL, ChangeCount
from shoal.store.models import JobRow

_BATCH = 500  # ids per IN (...) when re-reading changed jobs


@dataclass(frozen=True, slots=True)
class Held:
    """What a running job holds on one node."""

    cpus: int
    memory_mb: int
    gpus: int


@dataclass(frozen=True, slots=True)
class Running:
    """A running job: its row's version, its kind, what it holds on each of its nodes, and
    whose it is since when (``/metrics``' fair-share usage: its account, user and start)."""

    id: int
    version: int
    kind: str
    nodes: dict[str, Held]
    account: str
    user: str
    start: float | None
    gpus: int  # on all its nodes together
    cpus: int


def _running(jid: int, version: int, kind: str, allocation: dict | None, account: str | None, user: str,
             start: float | None) -> Running:
    held: dict[str, Held] = {}
    for n in (allocation or {"nodes": []})["nodes"]:
        h = held.get(n["name"])  # (a node named twice: its holdings add up, as sinfo counted them)
        c, m, g = n["cpus"], n["memory_mb"], len(n["gpus"])
        held[n["name"]] = Held(c, m, g) if h is None else Held(h.cpus + c, h.memory_mb + m, h.gpus + g)
    return Running(jid, version, kind, held, account or "", user, start, sum(h.gpus for h in held.values()),
                   sum(h.cpus for h in held.values()))


_COLUMNS = (JobRow.id, JobRow.version, JobRow.kind, JobRow.allocation, JobRow.spec["account"].as_string(),
            JobRow.user, JobRow.start_time)

Use = tuple[int, int, int, tuple[int, ...]]
"""What a node's running jobs hold together: CPUs, memory (MB), GPUs, and the jobs' ids in order."""


def summed(node: str, on: Iterable[Running]) -> Use:
    """The holdings on ``node`` of the jobs ``on`` it."""
    cpus = memory_mb = gpus = 0
    ids = []
    for job in on:
        held = job.nodes[node]
        cpus, memory_mb, gpus = cpus + held.cpus, memory_mb + held.memory_mb, gpus + held.gpus
        ids.append(job.id)
    return cpus, memory_mb, gpus, tuple(sorted(ids))


class RunningJobs:
    """``changes`` watches the job rows (its own count: ``take`` hands each key out once);
    ``ended`` is told the ids of jobs that stopped running (the run entries kept for them)."""

    def __init__(self, sessions: Callable[[], Session], changes: ChangeCount,
                 ended: Callable[[Iterable[int]], None] = lambda ids: None) -> None:
        self.sessions = sessions
        self.changes = changes
        self.ended = ended
        self._jobs: dict[int, Running] = {}
        self._by_node: dict[str, dict[int, Running]] = {}
        self._use: dict[str, Use] = {}  # each node's jobs' holdings, summed again when they change
        self._synced_at: int | None = None  # changes.value the jobs are current for
        # Moved whenever a running job comes, goes or changes (not by the pending jobs' writes):
        # what is made from the running jobs (sinfo's answer) is kept by it.
        self.generation = 0
        self._lock = threading.Lock()
        # Reads shared between calls where the count is off: reads begun, and the last one done.
        self._read = threading.Condition()
        self._begun = 0
        self._reading = False
        self._done: tuple[int, dict[str, dict[int, Running]]] = (0, {})

    def on_node(self, session: Session, node: str) -> list[Running]:
        """The jobs running on ``node``, by id."""
        if not self.changes.enabled:
            on = self._fresh().get(node, {})
            return [on[jid] for jid in sorted(on)]
        with self._lock:
            self._sync()
            on = self._by_node.get(node, {})
            return [on[jid] for jid in sorted(on)]

    def all(self, session: Session) -> list[Running]:
        """Every running job (in no set order)."""
        if not self.changes.enabled:
            return list({jid: j for on in self._fresh().values() for jid, j in on.items()}.values())
        with self._lock:
            self._sync()
            return list(self._jobs.values())

    def use(self, session: Session) -> tuple[int | None, dict[str, Use]]:
        """What the running jobs hold on each node that runs any, with the generation it is for
        (None where the count is off): sinfo's allocated CPUs, memory and GPUs. Kept summed by
        node, so that after a start or an end only that job's nodes are added up again."""
        if not self.changes.enabled:
            return None, {name: summed(name, on.values()) for name, on in self._fresh().items() if on}
        with self._lock:
            self._sync()
            return self.generation, dict(self._use)

    def known(self) -> list[Running]:
        """Every running job as last read, without reading (a hint: it may be behind the store)."""
        return list(self._jobs.values())  # copied in one step under the GIL: safe beside a refresh

    def _fresh(self) -> dict[str, dict[int, Running]]:
        """The running jobs by node, from a read begun after this call (count off). A call that
        finds a read under way waits for the next one, which one of the waiters makes, in a
        session of its own: no caller holds a connection while it waits."""
        with self._read:
            want = self._begun + 1
            while self._done[0] < want:
                if not self._reading:
                    self._reading, self._begun = True, self._begun + 1
                    mine = self._begun
                    break
                self._read.wait()
            else:
                return self._done[1]
        by_node: dict[str, dict[int, Running]] | None = None
        try:
            with self.sessions() as s:
                by_node = {}
                for job in self._reload(s):
                    for name in job.nodes:
                        by_node.setdefault(name, {})[job.id] = job
        finally:
            with self._read:
                self._reading = False
                if by_node is not None:
                    self._done = (mine, by_node)
                self._read.notify_all()
        return by_node

    def sync(self) -> None:
        """Bring the index up to date now (the follower's call: server/follower.py)."""
        if self.changes.enabled and self._synced_at != self.changes.value:
            with self._lock:
                self._sync()

    def _sync(self) -> None:
        at = self.changes.value  # noted before the keys are taken: a racing commit moves it again
        if at == self._synced_at:
            return
        with self.changes.taken() as keys:  # given back if the read fails: the next sync reads them
            if self._synced_at is None or ALL in keys:
                with self.sessions() as s:
                    self._reload(s)
            elif keys:
                self._refresh(keys)
        self._synced_at = at

    def _reload(self, s: Session) -> list[Running]:
        """Every running job, read (and kept, for ``ended``: the jobs gone since the last read)."""
        jobs = {r[0]: _running(*r) for r in s.execute(select(*_COLUMNS).where(JobRow.state == JobState.RUNNING.value))}
        gone = self._jobs.keys() - jobs.keys()
        if self.changes.enabled:
            self._by_node = {}
            for job in jobs.values():
                self._put(job)
            self._use = {name: summed(name, on.values()) for name, on in self._by_node.items()}
        self._jobs = jobs
        self.generation += 1
        if gone:
            self.ended(gone)
        return list(jobs.values())

    def _refresh(self, ids: Iterable[int]) -> None:
        ids = sorted(ids)
        gone = []
        touched: set[str] = set()
        with self.sessions() as s:
            for i in range(0, len(ids), _BATCH):
                chunk = ids[i:i + _BATCH]
                now = {r[0]: _running(*r[:-1]) for r in s.execute(
                    select(*_COLUMNS, JobRow.state).where(JobRow.id.in_(chunk))) if r[-1] == JobState.RUNNING.value}
                for jid in chunk:
                    old = self._jobs.pop(jid, None)
                    if old is not None:
                        touched.update(old.nodes)
                        for name in old.nodes:
                            on = self._by_node.get(name)
                            if on is not None:
                                on.pop(jid, None)
                                if not on:
                                    del self._by_node[name]
                    if jid in now:
                        touched.update(now[jid].nodes)
                        self._put(now[jid])
                    elif old is not None:
                        gone.append(jid)
                    if old is not None or jid in now:
                        self.generation += 1
        for name in touched:
            on = self._by_node.get(name)
            if on:
                self._use[name] = summed(name, on.values())
            else:
                self._use.pop(name, None)
        if gone:
            self.ended(gone)

    def _put(self, job: Running) -> None:
        self._jobs[job.id] = job
        for name in job.nodes:
            self._by_node.setdefault(name, {})[job.id] = job
