"""How a job listing is written on the wire: ``{"jobs": [...]}``, or for squeue's columns a table
(``form=rows``: the keys once, each job a row of values), gzipped for a client that accepts it.

With 100,000 jobs queued squeue's answer was 23 MB of JSON, each job's keys repeated, and
decoding it cost a client ~190 ms: as rows it is about a third of that, and gzipped a few
percent (kube-apiserver gzips large lists the same way). The queue view (server/queueview.py)
keeps what these functions make, once per change; sinfo's nodes are made per call.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable

from fastapi.responses import Response

from shoal.server import jobs as jobsvc
from shoal.slurm.squeue import collapse_arrays

FORMS = ("jobs", "rows")

ROW_COLUMNS = (*(k for k in jobsvc.QUEUE_VIEW if k != "allocation"), "nodelist", "completing", "array_tasks")
"""A ``form=rows`` answer's columns: the queue view's keys (jobsvc.queue_view), and
``array_tasks`` for a row that stands for an array's pending tasks (``collapse``)."""

GZIP_LEVEL = 1  # a fifth of level 6's time for most of its gain on these repetitive lists
GZIP_MIN_BYTES = 1024  # smaller answers gain nothing worth a header and a compression


def dumps(doc) -> bytes:
    """JSON as JSONResponse writes it."""
    return json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def dumps_row(job: dict) -> bytes:
    """One queue-view job as a ``form=rows`` row."""
    return dumps([job.get(k) for k in ROW_COLUMNS])


def encode(jobs: list[dict], form: str, one: Callable[[dict], bytes] | None = None) -> bytes:
    """The answer listing ``jobs`` in ``form``, each job encoded by ``one`` (which may keep them)."""
    if form == "rows":
        head = b'{"columns":' + dumps(ROW_COLUMNS) + b',"rows":['
        one = one or dumps_row
    else:
        head = b'{"jobs":['
        one = one or dumps
    return head + b",".join([one(job) for job in jobs]) + b"]}"


def gzipped(body: bytes) -> bytes:
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


def response(body: bytes, accepts_gzip: bool) -> Response:
    """A JSON answer, gzipped for a client that accepts it when it is worth it."""
    squeeze = accepts_gzip and len(body) >= GZIP_MIN_BYTES
    return encoded_response(gzipped(body) if squeeze else body, squeeze)


def encoded_response(body: bytes, is_gzipped: bool) -> Response:
    """A JSON answer already encoded (and gzipped, when ``is_gzipped``)."""
    headers = {"Vary": "Accept-Encoding"}
    if is_gzipped:
        headers["Content-Encoding"] = "gzip"
    return Response(body, media_type="application/json", headers=headers)


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
