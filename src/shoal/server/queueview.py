"""squeue's view of the queue, kept in memory (in the spirit of the Kubernetes API server's
watch cache): the pending, running and completing jobs with the columns squeue's default
table shows, brought up to date from the jobs the servers' commits changed
(``store.changes.ChangeCount``; with several servers on one PostgreSQL, the others' keys
come on the change feed) instead of read whole from the store on every call.

With 10,000 jobs queued, reading the queue from SQLite took ~45 ms a call, and users'
scripts call squeue in loops; a listing from memory is a filter over dicts. With the count
disabled ``available`` is False, and callers read the store.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable
from itertools import chain
from operator import itemgetter
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.server import jobs as jobsvc
from shoal.server import listing
from shoal.model.arrays import TaskRanges
from shoal.slurm.squeue import array_group, merged, task_reason
from shoal.store.changes import ALL, ChangeCount
from shoal.store.models import CleanupRow, JobRow

_BATCH = 500  # ids per IN (...) when re-reading changed jobs


class _Group:
    """One group of pending array tasks (``array_group``), with what its merged row is made
    of kept as tasks come and go: its job ids and each reason's in order, its task ids as
    ranges. With 92,000 pending tasks in one group, one of which starts at every scheduling
    pass, making the merged row from the tasks took 30 ms a change; now it is a dict copy."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict] = {}  # job id -> task
        self.ids: list[int] = []  # their job ids, sorted
        self.reasons: dict[str, list[int]] = {}  # reason -> its tasks' job ids, sorted
        self.tasks = TaskRanges()
        self.row: dict | None = None  # made once asked for, until the group changes

    def put(self, job: dict) -> None:
        jid = job["job_id"]
        self.jobs[jid] = job
        insort(self.ids, jid)
        insort(self.reasons.setdefault(task_reason(job), []), jid)
        self.tasks.add(job["array_task_id"])
        self.row = None

    def drop(self, job: dict) -> bool:
        """Drop ``job`` (as it was put); whether it was here."""
        jid = job["job_id"]
        if self.jobs.pop(jid, None) is None:
            return False
        _remove(self.ids, jid)
        reason = task_reason(job)
        ids = self.reasons[reason]
        _remove(ids, jid)
        if not ids:
            del self.reasons[reason]
        self.tasks.remove(job["array_task_id"])
        self.row = None
        return True

    def merged(self) -> tuple[int, dict]:
        """(the first task's job id, the group's row): ``merged_row`` of its tasks in id order."""
        first = self.jobs[self.ids[0]]
        if self.row is None:
            self.row = first if len(self.ids) == 1 else merged(
                first, sorted(self.reasons, key=lambda r: self.reasons[r][0]),
                self.tasks.text(first.get("array_throttle")))
        return first["job_id"], self.row


def _remove(ids: list[int], jid: int) -> None:
    del ids[bisect_left(ids, jid)]


class Collapsed:
    """The listing with each array's pending tasks merged (``listing.collapse``), kept as its
    pieces and brought up to date by the jobs that changed: the rows shown alone, and each
    group of pending tasks with its merged row, remade only when one of its tasks changed.
    With 92,000 pending tasks and 8,000 running jobs, collapsing the whole listing took
    ~70 ms after every change of the queue (each scheduling pass that starts a job), for
    an answer of 8,001 rows.

    The rows are kept in pages of job ids (``2 ** page_bits`` ids each; a group's row is at its
    first task's id), a page's list made again only when a row in it changed: with the 50,000
    rows a submission storm leaves, sorting them all again after each change took 15 to 80 ms
    of the server, and the pages' own answers (``PackedPages``) are kept with them."""

    def __init__(self, page_bits: int = 10) -> None:
        self._alone: dict[int, dict] = {}  # job id -> a job shown on its own row
        self._groups: dict[tuple, _Group] = {}  # array_group -> its tasks
        self._first: dict[int, _Group] = {}  # a group's first job id -> the group (where its row is)
        self._bits = page_bits
        self._ids: dict[int, set[int]] = {}  # page -> the ids its rows are at
        self._pages: dict[int, list[dict]] = {}  # page -> its rows in id order (replaced, never changed)
        self._dirty: set[int] = set()  # pages whose rows changed since their list was made

    def _moved(self, before: int | None, after: int | None, group: _Group | None = None) -> None:
        """A row left id ``before`` and is now at ``after`` (either may be None), or changed in place."""
        if before is not None and before != after:
            page = before >> self._bits
            self._ids[page].discard(before)
            self._dirty.add(page)
            self._first.pop(before, None)
        if after is not None:
            page = after >> self._bits
            self._ids.setdefault(page, set()).add(after)
            self._dirty.add(page)
            if group is not None:
                self._first[after] = group

    def put(self, job: dict) -> None:
        key = array_group(job)
        if key is None:
            self._alone[job["job_id"]] = job
            self._moved(None, job["job_id"])
            return
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        before = group.ids[0] if group.ids else None
        group.put(job)
        self._moved(before, group.ids[0], group)

    def drop(self, job: dict) -> None:
        key = array_group(job)
        if key is None:
            if self._alone.pop(job["job_id"], None) is not None:
                self._moved(job["job_id"], None)
            return
        group = self._groups.get(key)
        if group is None:
            return
        before = group.ids[0]
        if group.drop(job):
            if not group.jobs:
                del self._groups[key]
            self._moved(before, group.ids[0] if group.ids else None, group)

    def pages(self) -> list[tuple[int, list[dict]]]:
        """Each page that holds rows, in order, with its rows in id order; a page's list is the
        same object until a row in it changes."""
        for page in self._dirty:
            ids = self._ids.get(page)
            if ids:
                ordered = sorted(ids)
                rows = list(map(self._alone.get, ordered))  # None where a group's row goes
                for i in self._first.keys() & ids:
                    rows[bisect_left(ordered, i)] = self._first[i].merged()[1]
                self._pages[page] = rows
            else:
                self._ids.pop(page, None)
                self._pages.pop(page, None)
        self._dirty.clear()
        return sorted(self._pages.items(), key=itemgetter(0))

    def rows(self) -> list[dict]:
        """What ``listing.collapse`` makes of every job put and not dropped, in id order."""
        return list(chain.from_iterable(rows for _, rows in self.pages()))


class PackedPages:
    """Plain squeue's answer (the collapsed listing in ``form=packed``) kept page by page
    (``Collapsed.pages``): after a change only the pages that changed are encoded again, the
    others' bytes joined as they were. Their shared values' indices are kept from one answer to
    the next (an answer lists every combination seen, used or not), and all are made again once
    the combinations outnumber twice the rows (plus 1,024): each page's bytes name indices that
    must not move. With the 50,000 rows of a storm's queue, making the whole answer again after
    each change was 40 to 50 ms of the server."""

    def __init__(self) -> None:
        self._shared: dict[bytes, bytes] = {}  # shared values -> b"<index>]"
        self._pages: dict[int, tuple[list[dict], bytes]] = {}  # page -> (its rows, their encoding)

    def answer(self, pages: list[tuple[int, list[dict]]], encode: Callable[[dict], tuple[bytes, bytes]]) -> bytes:
        """The answer listing ``pages``' rows, each row's parts made by ``encode``
        (``listing.packed_row``, or one that keeps them)."""
        self.update(pages, encode)
        return listing.packed_answer(self._shared, b",".join([body for _, body in self._pages.values() if body]))

    def update(self, pages: list[tuple[int, list[dict]]], encode: Callable[[dict], tuple[bytes, bytes]]) -> None:
        """Encode the pages that changed (the follower does it after each sync, so that the
        next squeue only joins and gzips them)."""
        if len(self._shared) > 2 * sum(len(rows) for _, rows in pages) + 1024:
            self._shared, self._pages = {}, {}
        kept, made = self._pages, {}
        for page, rows in pages:
            entry = kept.get(page)
            if entry is None or entry[0] is not rows:
                entry = (rows, listing.packed_rows(list(map(encode, rows)), self._shared))
            made[page] = entry
        self._pages = made


class QueueView:
    def __init__(self, sessions: Callable[[], Session], changes: ChangeCount) -> None:
        self.sessions = sessions
        self.changes = changes
        self._jobs: dict[int, dict] = {}  # job id -> its queue-view dict (replaced, never changed, when it changes)
        # form (listing.FORMS) -> job id -> that dict and its encoding in the form, made once
        self._kept: dict[str, dict[int, tuple[dict, Any]]] = {form: {} for form in listing.FORMS}
        self._synced_at: int | None = None  # changes.value the jobs are current for
        # For _synced_at, once asked for: the listing jobs() gives, its arrays collapsed, and
        # their whole answers, by (id of the listing, form, gzip): with 100,000 jobs queued,
        # sorting them and joining their encodings was ~100 ms a call, and compressing them
        # more, for answers that are the same until the next commit changes a job.
        self._listing: list[dict] | None = None
        self._arrays = Collapsed()  # _jobs collapsed, kept in pieces
        self._collapsed: list[dict] | None = None
        # The collapsed listings last made (newest last), each with the pages it was made of.
        self._paged: deque[tuple[list[dict], list[tuple[int, list[dict]]]]] = deque(maxlen=4)
        self._packed = PackedPages()
        self._answers: dict[tuple[int, str, bool], tuple[list[dict], bytes]] = {}
        self._lock = threading.Lock()
        self._encoding = threading.RLock()  # one thread builds a kept answer; the others wait for it

    @property
    def available(self) -> bool:
        return self.changes.enabled

    @property
    def current(self) -> bool:
        """Whether the view has seen every commit counted so far."""
        return self._synced_at == self.changes.value

    def jobs(self) -> list[dict]:
        """The pending, running and completing jobs, by id, as ``jobsvc.queue_view`` makes them."""
        with self._lock:
            self._sync()
            if self._listing is None:
                self._listing = [self._jobs[jid] for jid in sorted(self._jobs)]
            return self._listing  # the caller must not change it: filters make new lists

    def collapsed_jobs(self) -> list[dict]:
        """``listing.collapse(self.jobs())``, made from its kept pieces (unfiltered squeue's
        listing: the whole one is not made for it)."""
        with self._lock:
            self._sync()
            if self._collapsed is None:
                pages = self._arrays.pages()
                self._collapsed = list(chain.from_iterable(rows for _, rows in pages))
                self._paged.append((self._collapsed, pages))
            return self._collapsed

    def _sync(self) -> list[dict]:
        """Bring the view up to date with the commits counted; the jobs it put (new or changed)."""
        at = self.changes.value
        if at == self._synced_at:
            return []
        with self.changes.taken() as keys:  # given back if the read fails: the next sync reads them
            put = self._reload() if self._synced_at is None or ALL in keys else self._refresh(keys) if keys else []
        self._synced_at = at
        self._listing = self._collapsed = None
        self._answers = {}
        return put

    def _reload(self) -> list[dict]:
        with self.sessions() as s:
            rows = s.execute(select(*jobsvc.QUEUE_VIEW.values()).where(jobsvc.listed(s))).all()
            self._jobs = {job["job_id"]: job for job in jobsvc.queue_view(s, rows)}
            self._kept = {form: {} for form in listing.FORMS}
        self._arrays, self._packed = Collapsed(), PackedPages()
        for job in self._jobs.values():
            self._arrays.put(job)
        return list(self._jobs.values())

    def sync(self) -> None:
        """Bring the view up to date now and encode the rows plain squeue shows of the jobs
        that changed (in its ``packed`` form), and the pages of its answer they are in, for the
        follower (server/follower.py): a request then finds the view synced and its answer's
        pages made, instead of the first squeue after a storm reading and encoding 50,000 new
        jobs (~50 ms) while the other clients wait for it. Each sync costs about a millisecond
        per page that changed (1,024 job ids: a storm's newest jobs are one or two)."""
        if self.current or not self.available:
            return
        with self._lock:
            put = self._sync()
        encode = self._encoding_of("packed")
        for job in put:
            if array_group(job) is None:  # shown on its own row (a pending array's tasks are merged)
                encode(job)
        with self._lock:
            pages, packed = self._arrays.pages(), self._packed
        with self._encoding:
            packed.update(pages, encode)

    def _refresh(self, ids: Iterable[int]) -> list[dict]:
        ids = sorted(ids)
        jobs = self._jobs
        put = []
        with self.sessions() as s:
            for i in range(0, len(ids), _BATCH):
                chunk = ids[i:i + _BATCH]
                completing = set(s.scalars(select(CleanupRow.job_id).where(CleanupRow.job_id.in_(chunk))))
                rows = s.execute(select(*jobsvc.QUEUE_VIEW.values()).where(JobRow.id.in_(chunk))).all()
                for jid in chunk:
                    old = jobs.pop(jid, None)
                    if old is not None:
                        self._arrays.drop(old)
                    for kept in self._kept.values():
                        kept.pop(jid, None)
                for job in jobsvc.queue_view(s, rows, completing):
                    if job["state"] in jobsvc.ACTIVE or job["completing"]:
                        jobs[job["job_id"]] = job
                        self._arrays.put(job)
                        put.append(job)
        return put

    def kept(self, jobs: list[dict]) -> bool:
        """Whether ``jobs`` is a listing whose answers are kept: the whole queue, or its arrays
        collapsed (unfiltered squeue)."""
        return jobs is self._listing or jobs is self._collapsed

    def encoded(self, jobs: list[dict], form: str = "jobs", gzip: bool = False) -> bytes:
        """The answer listing ``jobs`` in ``form`` (``listing.encode``), gzipped if asked; each
        job's encoding made once and kept, and a kept listing's whole answer made once per
        change: the listing of a long queue, asked for in loops, was mostly its encoding."""
        if not self.kept(jobs):
            body = self._made(jobs, form)
            return listing.gzipped(body) if gzip else body
        key = (id(jobs), form, gzip)
        answer = self._answers.get(key)
        if answer is not None and answer[0] is jobs:
            return answer[1]
        with self._encoding:
            answer = self._answers.get(key)
            if answer is None or answer[0] is not jobs:
                body = listing.gzipped(self.encoded(jobs, form)) if gzip else self._made(jobs, form)
                answer = (jobs, body)
                self._answers[key] = answer
            return answer[1]

    def _made(self, jobs: list[dict], form: str) -> bytes:
        """The plain answer listing ``jobs`` in ``form``: by page for a collapsed listing made
        lately in the packed form, else from each job's kept encoding."""
        return (form == "packed" and self._by_page(jobs)) or listing.encode(jobs, form, self._encoding_of(form))

    def _by_page(self, jobs: list[dict]) -> bytes | None:
        """Plain squeue's answer (``jobs`` packed) made by page when ``jobs`` is a collapsed
        listing made lately, else None. A newer change may replace a request's listing before
        it is encoded: under churn, such answers encoded whole took 60 to 70 ms each."""
        for listed, pages in list(self._paged):  # a copy: another thread may append
            if listed is jobs:
                with self._encoding:
                    return self._packed.answer(pages, self._encoding_of("packed"))
        return None

    def _encoding_of(self, form: str) -> Callable[[dict], Any]:
        """One job's encoding in ``form`` (``listing.ENCODERS``), kept for the jobs of the view."""
        kept, dumps = self._kept[form], listing.ENCODERS[form]
        view = self._jobs

        def encode(job: dict) -> Any:
            entry = kept.get(job["job_id"])
            if entry is None or entry[0] is not job:
                entry = (job, dumps(job))
                if view.get(job["job_id"]) is job:  # a merged array's row is made anew: not kept
                    kept[job["job_id"]] = entry
            return entry[1]

        return encode
