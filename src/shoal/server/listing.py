"""How a job listing is written on the wire: ``{"jobs": [...]}``, or for squeue's columns a table
(``form=rows``: the keys once, each job a row of values; ``form=packed``: the values many jobs
share written once), gzipped for a client that accepts it.

With 100,000 jobs queued squeue's answer was 23 MB of JSON, each job's keys repeated, and
decoding it cost a client ~190 ms: as rows it is about a third of that, and gzipped a few
percent (kube-apiserver gzips large lists the same way). Packed, the 50,000 rows a storm leaves
are a third of their rows' 4.6 MB: a client's gunzip of the answer went from 5.1 ms to 1.5, and
its JSON decoding from 33 ms to 13. The queue view (server/queueview.py) keeps what these
functions make, once per change; sinfo's nodes are kept by ``KeptAnswer``.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Iterable
from operator import add, itemgetter
from typing import Any

from fastapi.responses import Response

from shoal.server import jobs as jobsvc
from shoal.slurm.squeue import collapse_arrays

FORMS = ("jobs", "rows", "packed")

ROW_COLUMNS = (*(k for k in jobsvc.QUEUE_VIEW if k != "allocation"), "nodelist", "completing", "array_tasks")
"""A ``form=rows`` answer's columns: the queue view's keys (jobsvc.queue_view), and
``array_tasks`` for a row that stands for an array's pending tasks (``collapse``)."""

OWN_COLUMNS = ("job_id", "array_task_id", "start_time", "end_time", "nodelist")
SHARED_COLUMNS = tuple(k for k in ROW_COLUMNS if k not in OWN_COLUMNS)
"""A ``form=packed`` answer's columns: each row holds a job's own values (``OWN_COLUMNS``) and
then the index in ``shared`` of its other values (``SHARED_COLUMNS``: name, user, partition,
state, reason, ...), each combination written once however many jobs have it."""

GZIP_LEVEL = 1  # a fifth of level 6's time for most of its gain on these repetitive lists
GZIP_MIN_BYTES = 1024  # smaller answers gain nothing worth a header and a compression


def dumps(doc) -> bytes:
    """JSON as JSONResponse writes it."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def dumps_row(job: dict) -> bytes:
    """One queue-view job as a ``form=rows`` row."""
    return dumps([job.get(k) for k in ROW_COLUMNS])


def packed_row(job: dict) -> tuple[bytes, bytes]:
    """One queue-view job in ``form=packed``: its row's start, up to the index of its shared
    values (``[1,null,1796662405.3,null,"node01",``), and those values (``["train","ann",...]``)."""
    return dumps([job.get(k) for k in OWN_COLUMNS])[:-1] + b",", dumps([job.get(k) for k in SHARED_COLUMNS])


ENCODERS: dict[str, Callable[[dict], Any]] = {"jobs": dumps, "rows": dumps_row, "packed": packed_row}
"""One job's encoding in each form (what ``encode``'s ``one`` gives)."""


def packed(parts: list[tuple[bytes, bytes]]) -> bytes:
    """A ``form=packed`` answer from its jobs' ``packed_row`` parts, in their order; each shared
    combination's index is where it first appears."""
    shared: dict[bytes, bytes] = {}
    rows = packed_rows(parts, shared)
    return packed_answer(shared, rows)


def packed_rows(parts: list[tuple[bytes, bytes]], shared: dict[bytes, bytes]) -> bytes:
    """The rows of ``parts`` joined, each ending with its shared values' index in ``shared``
    (values -> ``b"<index>]"``); values not there yet get the next indices, in the order they
    first appear. Found and joined in C: a loop per row was most of a 50,000-row answer's 45 ms."""
    for values in dict.fromkeys(map(itemgetter(1), parts)):
        if values not in shared:
            shared[values] = b"%d]" % len(shared)
    return b",".join(map(add, map(itemgetter(0), parts), map(shared.__getitem__, map(itemgetter(1), parts))))


def packed_answer(shared: Iterable[bytes], rows: bytes) -> bytes:
    """A ``form=packed`` answer: the shared values in their indices' order, and the rows joined."""
    return (b'{"columns":' + dumps(OWN_COLUMNS) + b',"shared_columns":' + dumps(SHARED_COLUMNS)
            + b',"shared":[' + b",".join(shared) + b'],"rows":[' + rows + b"]}")


def encode(jobs: list[dict], form: str, one: Callable[[dict], Any] | None = None) -> bytes:
    """The answer listing ``jobs`` in ``form``, each job encoded by ``one`` (``ENCODERS``' for the
    form, or one that keeps them)."""
    if form == "packed":
        return packed(list(map(one or packed_row, jobs)))
    if form == "rows":
        head = b'{"columns":' + dumps(ROW_COLUMNS) + b',"rows":['
        one = one or dumps_row
    else:
        head = b'{"jobs":['
        one = one or dumps
    return head + b",".join([one(job) for job in jobs]) + b"]}"


def gzipped(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


def squeezed(body: bytes, accepts_gzip: bool) -> tuple[bytes, bool]:
    """``body`` gzipped for a client that accepts it when it is worth it, and whether it is."""
    squeeze = accepts_gzip and len(body) >= GZIP_MIN_BYTES
    return gzipped(body) if squeeze else body, squeeze


def response(body: bytes, accepts_gzip: bool) -> Response:
    """A JSON answer, gzipped for a client that accepts it when it is worth it."""
    return encoded_response(*squeezed(body, accepts_gzip))


def encoded_response(body: bytes, is_gzipped: bool) -> Response:
    """A JSON answer already encoded (and gzipped, when ``is_gzipped``)."""
    headers = {"Vary": "Accept-Encoding"}
    if is_gzipped:
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type="application/json", headers=headers)


class KeptAnswer:
    """One answer, encoded once per change of what it is made from and gzipped once: ``key``
    names those inputs (compared by value). One thread makes it while the others wait for it;
    an answer made again with the same bytes (an input moved, nothing shown changed) stays the
    object it was, its gzip with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: tuple[object, bytes, bytes | None] | None = None  # (key, body, its gzip once made)

    def get(self, key: object, make: Callable[[], bytes], gzip: bool) -> tuple[bytes, bool]:
        """The answer for ``key`` (``make()`` when it is not the kept one's), and whether it is
        gzipped (for a client that accepts it, when it is worth it)."""
        kept = self._kept
        if kept is None or kept[0] != key or (gzip and kept[2] is None):
            with self._lock:
                kept = self._kept
                if kept is None or kept[0] != key:
                    body = make()
                    kept = (key, kept[1], kept[2]) if kept is not None and kept[1] == body else (key, body, None)
                if gzip and kept[2] is None and len(kept[1]) >= GZIP_MIN_BYTES:
                    kept = (key, kept[1], gzipped(kept[1]))
                self._kept = kept
        if gzip and kept[2] is not None:
            return kept[2], True
        return kept[1], False


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header admits gzip (RFC 9110: ``gzip``, ``x-gzip`` or ``*``,
    with a weight above 0; an explicit ``gzip;q=0`` refuses it whatever ``*`` says)."""
    if not accept_encoding:
        return False
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        weight = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        weights[coding.strip().lower()] = weight
    for coding in ("gzip", "x-gzip"):
        if coding in weights:
            return weights[coding] > 0
    return weights.get("*", 0.0) > 0


def collapse(jobs: list[dict]) -> list[dict]:
    """Each array's pending tasks merged into one row, as squeue shows them without -r/--array
    (shoal.slurm.squeue.collapse_arrays: the merged row carries ``array_tasks``, ``3-9%2``)."""
    return collapse_arrays(jobs)
