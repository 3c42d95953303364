"""Job traces: the Standard Workload Format and the public deep-learning GPU cluster traces.

Every reader yields ``TraceJob``s, one shape for all formats: what a job asked for (GPUs,
CPUs, nodes, a time limit), who submitted it (user, account) and how long it really ran.
Submit times are shifted so the first job arrives at 0; jobs are numbered 1..N in submit
order (ties in file order) and keep the trace's own id as their name. Rows that cannot be
replayed (no run time, cancelled before they started, no resources) are skipped and
counted by reason in ``Trace.skipped``. Column mappings: docs/SIMULATOR.md.
"""

from __future__ import annotations

import calendar
import csv
import io
import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator

from shoal.model.job import JobState

FORMATS = ("swf", "philly", "helios", "pai")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. Totals are for the whole job; None means "not recorded"."""

    id: int
    submit: float  # seconds since the first submit of the trace
    duration: float  # seconds it ran in the traced cluster
    gpus: int = 0
    cpus: int | None = None
    nodes: int | None = None
    mem_mb: int | None = None
    time_limit_s: int | None = None
    user: str = ""
    account: str = ""
    name: str = ""  # the trace's own job id
    partition: str | None = None
    state: JobState = JobState.COMPLETED  # how it ended in the traced cluster
    gpu_type: str | None = None


@dataclass
class Trace:
    format: str
    jobs: list[TraceJob]
    skipped: Counter = field(default_factory=Counter)  # reason -> rows
    origin: float = 0.0  # the trace's clock at the first submit (epoch seconds where known)
    header: dict[str, str] = field(default_factory=dict)


def read_trace(path: str | Path, format: str = "auto", limit: int | None = None) -> Trace:
    """Read ``path`` in ``format`` (``auto``: from the extension and the header line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror}") from None
    fmt = detect_format(path, text) if format == "auto" else format
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}: use one of {', '.join(FORMATS)} or auto")
    reader: Callable[[str, Path], Trace] = _READERS[fmt]
    return _finish(reader(text, path), limit)


def detect_format(path: Path, text: str) -> str:
    if path.suffix.lower() == ".swf":
        return "swf"
    head = text.lstrip()[:1]
    if head == ";":
        return "swf"
    if head in ("[", "{"):
        return "philly"
    first = next(csv.reader(io.StringIO(text.split("\n", 1)[0])), [])
    cols = {c.strip().lower() for c in first}
    if "plan_gpu" in cols or "task_name" in cols or len(first) == 10 and "job_name" not in cols:
        return "pai"
    if "node_num" in cols or "jobname" in cols:
        return "helios"
    if cols & {"num_gpu", "num_gpus", "jobid", "submitted_time"}:
        return "philly"
    raise TraceError(
        f"{path}: cannot tell the trace format from its first line {first[:6]!r}: "
        f"pass --format {'|'.join(FORMATS)}"
    )


def _finish(trace: Trace, limit: int | None) -> Trace:
    """Sort by submit, number 1..N, shift the clock to 0, apply --limit."""
    order = sorted(range(len(trace.jobs)), key=lambda i: (trace.jobs[i].submit, i))
    jobs = [trace.jobs[i] for i in order]
    if limit is not None:
        jobs = jobs[:limit]
    t0 = jobs[0].submit if jobs else 0.0
    trace.jobs = [replace(j, id=n, submit=j.submit - t0) for n, j in enumerate(jobs, start=1)]
    trace.origin += t0
    return trace


# --- Standard Workload Format (Parallel Workloads Archive) ---------------------------------

_SWF_STATUS = {0: JobState.FAILED, 1: JobState.COMPLETED, 5: JobState.CANCELLED}


def read_swf(text: str, path: Path) -> Trace:
    """18 whitespace-separated fields per line; ``;`` lines are the header (``; MaxNodes: 128``)."""
    trace = Trace("swf", [])
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(";"):
            key, sep, value = stripped[1:].partition(":")
            if sep:
                trace.header[key.strip()] = value.strip()
            continue
        rows.append((lineno, stripped.split()))
    ppn = _swf_procs_per_node(trace.header)
    trace.origin = float(_num(trace.header.get("UnixStartTime", "0"), 0))
    for lineno, f in rows:
        if len(f) < 18:
            raise TraceError(f"{path}:{lineno}: expected 18 SWF fields, found {len(f)}")
        try:
            v = [float(x) for x in f[:18]]
        except ValueError:
            raise TraceError(f"{path}:{lineno}: SWF fields must be numbers") from None
        run_time, status = v[3], int(v[10])
        procs = int(v[4]) if v[4] > 0 else int(v[7])
        if run_time < 0:
            trace.skipped["no run time"] += 1
            continue
        if status == 5 and run_time == 0:
            trace.skipped["cancelled before it started"] += 1
            continue
        if procs <= 0:
            trace.skipped["no processors"] += 1
            continue
        trace.jobs.append(TraceJob(
            id=0,
            submit=v[1],
            duration=run_time,
            cpus=procs,
            nodes=math.ceil(procs / ppn) if ppn else None,
            time_limit_s=int(v[8]) if v[8] > 0 else None,
            user=f"u{int(v[11])}" if v[11] >= 0 else "",
            account=f"g{int(v[12])}" if v[12] >= 0 else "",
            name=str(int(v[0])),
            state=_SWF_STATUS.get(status, JobState.COMPLETED),
        ))
    return trace


def _swf_procs_per_node(header: dict[str, str]) -> int | None:
    nodes = _num(header.get("MaxNodes", ""), 0)
    procs = _num(header.get("MaxProcs", ""), 0)
    if nodes > 0 and procs >= nodes:
        return int(procs // nodes)
    return None


# --- CSV traces: Philly (CSV derivative or cluster_job_log JSON), Helios, PAI ---------------

# The first column name present wins. Times are seconds or "YYYY-MM-DD HH:MM:SS".
_PHILLY_COLUMNS = {
    "id": ("jobid", "job_id"),
    "submit": ("submit_time", "submitted_time"),
    "duration": ("duration", "run_time", "runtime"),
    "start": ("start_time",),
    "end": ("end_time",),
    "gpus": ("num_gpu", "num_gpus", "gpu_num"),
    "cpus": ("num_cpu", "cpu_num"),
    "nodes": ("num_machines", "node_num"),
    "user": ("user",),
    "account": ("vc",),
    "state": ("status", "state"),
}
_HELIOS_COLUMNS = {
    **_PHILLY_COLUMNS,
    "id": ("job_id",),
    "gpus": ("gpu_num",),
    "cpus": ("cpu_num",),
    "nodes": ("node_num",),
    "state": ("state",),
}
_STATES = {
    "completed": JobState.COMPLETED, "pass": JobState.COMPLETED, "terminated": JobState.COMPLETED,
    "succeeded": JobState.COMPLETED, "failed": JobState.FAILED, "killed": JobState.CANCELLED,
    "cancelled": JobState.CANCELLED, "canceled": JobState.CANCELLED, "timeout": JobState.TIMEOUT,
    "node_fail": JobState.NODE_FAIL, "out_of_memory": JobState.OUT_OF_MEMORY,
}


def read_philly(text: str, path: Path) -> Trace:
    if text.lstrip()[:1] in ("[", "{"):
        return _read_philly_json(text, path)
    return _read_columns(text, path, "philly", _PHILLY_COLUMNS)


def read_helios(text: str, path: Path) -> Trace:
    return _read_columns(text, path, "helios", _HELIOS_COLUMNS)


def _read_columns(text: str, path: Path, fmt: str, columns: dict[str, tuple[str, ...]]) -> Trace:
    trace = Trace(fmt, [])
    reader = csv.DictReader(io.StringIO(text))
    header = {c.strip().lower(): c for c in reader.fieldnames or ()}
    pick = {k: next((header[a] for a in names if a in header), None) for k, names in columns.items()}
    for need in ("submit", "gpus"):
        if pick[need] is None:
            raise TraceError(f"{path}: a {fmt} trace needs a column {' or '.join(columns[need])}")
    if pick["duration"] is None and not (pick["start"] and pick["end"]):
        raise TraceError(f"{path}: a {fmt} trace needs duration, or start_time and end_time")
    for lineno, row in enumerate(reader, start=2):
        def get(key: str) -> str:
            col = pick.get(key)
            return (row.get(col) or "").strip() if col else ""

        submit = _time(get("submit"))
        if submit is None:
            trace.skipped["no submit time"] += 1
            continue
        duration = _num(get("duration"), None)
        if duration is None:
            start, end = _time(get("start")), _time(get("end"))
            duration = end - start if start is not None and end is not None else None
        if duration is None or duration < 0:
            trace.skipped["no run time"] += 1
            continue
        gpus = int(_num(get("gpus"), 0))
        cpus = _num(get("cpus"), None)
        if gpus <= 0 and not cpus:
            trace.skipped["no GPUs or CPUs"] += 1
            continue
        nodes = _num(get("nodes"), None)
        trace.jobs.append(TraceJob(
            id=0, submit=submit, duration=duration, gpus=gpus,
            cpus=int(cpus) if cpus else None, nodes=int(nodes) if nodes else None,
            user=get("user"), account=get("account"),
            name=get("id") or str(lineno),
            state=_STATES.get(get("state").lower(), JobState.COMPLETED),
        ))
    return trace


def _read_philly_json(text: str, path: Path) -> Trace:
    """philly-traces' cluster_job_log: a JSON list; GPUs and machines from the first attempt."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON: {e}") from None
    trace = Trace("philly", [])
    for entry in data if isinstance(data, list) else [data]:
        attempts = [a for a in entry.get("attempts") or ()
                    if _time(a.get("start_time")) is not None and _time(a.get("end_time")) is not None]
        submit = _time(entry.get("submitted_time"))
        if submit is None or not attempts:
            trace.skipped["never ran"] += 1
            continue
        first = attempts[0].get("detail") or []
        gpus = sum(len(m.get("gpus") or ()) for m in first)
        if gpus <= 0:
            trace.skipped["no GPUs or CPUs"] += 1
            continue
        start = _time(attempts[0]["start_time"])
        end = _time(attempts[-1]["end_time"])
        assert start is not None and end is not None
        trace.jobs.append(TraceJob(
            id=0, submit=submit, duration=max(0.0, end - start), gpus=gpus, nodes=len(first) or None,
            user=str(entry.get("user", "")), account=str(entry.get("vc", "")),
            name=str(entry.get("jobid", "")),
            state=_STATES.get(str(entry.get("status", "")).lower(), JobState.COMPLETED),
        ))
    return trace


_PAI_TASK = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
             "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
_PAI_JOB = ("job_name", "inst_id", "user", "status", "start_time", "end_time")


def read_pai(text: str, path: Path) -> Trace:
    """pai_task_table (tasks of a job summed into one gang); users from pai_job_table beside it.

    plan_cpu is percent of a core (600 = 6 cores), plan_mem GB, plan_gpu percent of a GPU
    (50 = half); each instance gets whole GPUs, as Shoal allocates them (50 -> 1).
    """
    trace = Trace("pai", [])
    users: dict[str, str] = {}
    job_table = path.with_name(path.name.replace("task", "job"))
    if job_table != path and job_table.exists():
        for row in _pai_rows(job_table.read_text(encoding="utf-8", errors="replace"), _PAI_JOB):
            users[row["job_name"]] = row.get("user", "")
    jobs: dict[str, dict] = {}
    for row in _pai_rows(text, _PAI_TASK):
        start, end = _time(row.get("start_time", "")), _time(row.get("end_time", ""))
        if start is None or end is None or end < start:
            trace.skipped["task without start or end"] += 1
            continue
        inst = int(_num(row.get("inst_num", ""), 1)) or 1
        job = jobs.setdefault(row["job_name"], {
            "start": start, "end": end, "gpus": 0, "cpus": 0, "mem": 0.0, "state": JobState.COMPLETED,
            "gpu_type": None, "user": row.get("user", ""),
        })
        job["start"], job["end"] = min(job["start"], start), max(job["end"], end)
        job["gpus"] += inst * math.ceil(_num(row.get("plan_gpu", ""), 0) / 100)
        job["cpus"] += inst * math.ceil(_num(row.get("plan_cpu", ""), 0) / 100)
        job["mem"] += inst * _num(row.get("plan_mem", ""), 0) * 1024
        state = _STATES.get(row.get("status", "").lower(), JobState.COMPLETED)
        if state is not JobState.COMPLETED:
            job["state"] = state
        job["gpu_type"] = job["gpu_type"] or (row.get("gpu_type") or None)
    for name, job in jobs.items():
        if job["gpus"] <= 0 and job["cpus"] <= 0:
            trace.skipped["no GPUs or CPUs"] += 1
            continue
        trace.jobs.append(TraceJob(
            id=0, submit=job["start"], duration=job["end"] - job["start"], gpus=job["gpus"],
            cpus=job["cpus"] or None, mem_mb=int(job["mem"]) or None,
            user=users.get(name) or job["user"], account=users.get(name) or job["user"],
            name=name, state=job["state"],
            gpu_type=None if job["gpu_type"] in (None, "", "MISC") else job["gpu_type"],
        ))
    return trace


def _pai_rows(text: str, names: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """Rows as dicts; the released tables have no header line, derivatives often do."""
    rows = csv.reader(io.StringIO(text))
    header: Iterable[str] = names
    first = next(rows, None)
    if first is None:
        return
    if first and first[0].strip().lower() == "job_name":
        header = [c.strip().lower() for c in first]
    else:
        rows = _chain([first], rows)
    cols = list(header)
    for r in rows:
        if r:
            yield {c: v.strip() for c, v in zip(cols, r)}


def _chain(head: list, rest: Iterator) -> Iterator:
    yield from head
    yield from rest


def _num(text: str | None, default):
    if text is None or text == "" or text.lower() in ("nan", "none", "null"):
        return default
    try:
        return float(text)
    except ValueError:
        return default


def _time(value) -> float | None:
    """Seconds (a number) or a calendar time read as UTC: only differences matter."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if not text or text.lower() in ("none", "nan", "null"):
        return None
    number = _num(text, None)
    if number is not None:
        return float(number)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return float(calendar.timegm(moment.utctimetuple())) + moment.microsecond / 1e6


_READERS: dict[str, Callable[[str, Path], Trace]] = {
    "swf": read_swf, "philly": read_philly, "helios": read_helios, "pai": read_pai,
}
