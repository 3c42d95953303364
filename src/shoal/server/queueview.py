"""squeue's view of the queue, kept in memory (in the spirit of the Kubernetes API server's
watch cache): the pending, running and completing jobs with the columns squeue's default
table shows, brought up to date from the jobs this process's commits changed
(``store.changes.ChangeCount``) instead of read whole from the store on every call.

With 10,000 jobs queued, reading the queue from SQLite took ~45 ms a call, and users'
scripts call squeue in loops; a listing from memory is a filter over dicts. Only a
server that sees every write to its store may keep one (not several servers on one
PostgreSQL: ``available`` is False there, and callers read the store).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.server import jobs as jobsvc
from shoal.store.changes import ALL, ChangeCount
from shoal.store.models import CleanupRow, JobRow

_BATCH = 500  # ids per IN (...) when re-reading changed jobs


class QueueView:
    def __init__(self, sessions: Callable[[], Session], changes: ChangeCount) -> None:
        self.sessions = sessions
        self.changes = changes
        self._jobs: dict[int, dict] = {}  # job id -> its queue-view dict (replaced, never changed, when it changes)
        self._json: dict[int, tuple[dict, bytes]] = {}  # job id -> that dict and its JSON, made once
        self._synced_at: int | None = None  # changes.value the jobs are current for
        # The listing jobs() gave for _synced_at, and its whole encoding once asked for: with
        # 100,000 jobs queued, sorting them and joining their encodings was ~100 ms a call,
        # for an answer that is the same until the next commit changes a job.
        self._listing: list[dict] = []
        self._whole: tuple[list[dict], bytes] | None = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self.changes.enabled

    def jobs(self) -> list[dict]:
        """The pending, running and completing jobs, by id, as ``jobsvc.queue_view`` makes them."""
        with self._lock:
            at = self.changes.value
            if at != self._synced_at:
                keys = self.changes.take()
                if self._synced_at is None or ALL in keys:
                    self._reload()
                elif keys:
                    self._refresh(keys)
                self._synced_at = at
                self._listing, self._whole = [self._jobs[jid] for jid in sorted(self._jobs)], None
            return self._listing  # the caller must not change it: filters make new lists

    def _reload(self) -> None:
        with self.sessions() as s:
            rows = s.execute(select(*jobsvc.QUEUE_VIEW.values()).where(jobsvc.listed(s))).all()
            self._jobs = {job["job_id"]: job for job in jobsvc.queue_view(s, rows)}
            self._json = {}

    def _refresh(self, ids: Iterable[int]) -> None:
        ids = sorted(ids)
        jobs = self._jobs
        with self.sessions() as s:
            for i in range(0, len(ids), _BATCH):
                chunk = ids[i:i + _BATCH]
                completing = set(s.scalars(select(CleanupRow.job_id).where(CleanupRow.job_id.in_(chunk))))
                rows = s.execute(select(*jobsvc.QUEUE_VIEW.values()).where(JobRow.id.in_(chunk))).all()
                for jid in chunk:
                    jobs.pop(jid, None)
                    self._json.pop(jid, None)
                for job in jobsvc.queue_view(s, rows, completing):
                    if job["state"] in jobsvc.ACTIVE or job["completing"]:
                        jobs[job["job_id"]] = job

    def encoded(self, jobs: list[dict]) -> bytes:
        """``{"jobs": [...]}`` as JSONResponse writes it, each job's JSON made once and kept:
        the listing of a long queue, asked for in loops, was mostly its encoding. The whole
        listing (unfiltered squeue) is encoded once per change."""
        whole = self._whole
        if whole is not None and whole[0] is jobs:
            return whole[1]
        out = []
        for job in jobs:
            kept = self._json.get(job["job_id"])
            if kept is None or kept[0] is not job:
                kept = (job, _dumps(job))
                if self._jobs.get(job["job_id"]) is job:
                    self._json[job["job_id"]] = kept
            out.append(kept[1])
        body = b'{"jobs":[' + b",".join(out) + b"]}"
        if jobs is self._listing:
            self._whole = (jobs, body)
        return body


def _dumps(doc) -> bytes:
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
