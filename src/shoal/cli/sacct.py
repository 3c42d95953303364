"""sacct: accounting records of jobs and their steps, printed the way Slurm's sacct does.

Columns follow Slurm's print_fields: each field has a default width (negative: left-
justified), values too long end in ``+``, every column is followed by a space; -p ends
each value with ``|``, -P joins them with ``|``. ``render_sacct(jobs, options, now)``
is pure; ``main`` fetches GET /shoal/v1/jobs?all=true and prints.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import namedtuple

from shoal.api_client import Client, ClientError, fail
from shoal.slurm.fmt import FormatError, argument_parser, emit, format_hms, split_list
from shoal.slurm.squeue import STATE_CODES, collapse_arrays, elapsed, job_id_text
from shoal.slurm.tresusage import consumed_energy, count_text, energy_text, node_text, usage_text
from shoal.model.hostlist import expand
from shoal.model.job import exit_code_text
from shoal.model.timefmt import TimeFormatError, format_timestamp, parse_begin_time

DEFAULT_FIELDS = "jobid,jobname,partition,account,alloccpus,state,exitcode"
BRIEF_FIELDS = "jobid,state,exitcode"
LONG_FIELDS = ("jobid,jobidraw,jobname,partition,user,account,alloccpus,ncpus,nnodes,nodelist,"
               "state,exitcode,derivedexitcode,submit,start,end,elapsed,elapsedraw,timelimit,"
               "reqtres,alloctres,restarts,workdir")

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs sacct's start-up time
    from collections.abc import Mapping
    from typing import Any

    Row = Mapping[str, Any]  # {"job": Job, "step": Step | None}


# A namedtuple, not a dataclass: dataclasses imports inspect, ~30 ms of start-up.
class Column(namedtuple("Column", "name width get")):
    """A sacct field: its ``name`` as Slurm spells it, default ``width``, and ``get(row, now)``."""

    __slots__ = ()


def _job(get):
    """A field that only job lines carry (step lines print it blank)."""
    return lambda row, now: None if row["step"] else get(row["job"], now)


def _either(job_get, step_get):
    return lambda row, now: step_get(row["step"], row["job"], now) if row["step"] else job_get(row["job"], now)


def _step_elapsed(step: Mapping[str, Any], job: Mapping[str, Any], now: float) -> float:
    start = step.get("start_time")
    if not start:
        return 0
    return (step.get("end_time") or now) - start


def _state(job: Mapping[str, Any], now: float) -> str:
    return job["state"]


def _alloc_cpus(job: Mapping[str, Any], now: float) -> int:
    return 0 if job["state"] == "PENDING" else job.get("cpus") or 0


def _step_cpus(step: Mapping[str, Any], job: Mapping[str, Any], now: float) -> int:
    if step.get("cpus"):
        return step["cpus"]
    if step.get("step_id") in ("batch", "extern"):
        return _alloc_cpus(job, now) if step["step_id"] == "extern" else job.get("cpus_per_task") or 1
    return (step.get("ntasks") or 1) * (job.get("cpus_per_task") or 1)


def _mem_text(mb: int) -> str:
    """Slurm's TRES memory: ``512M``, ``16G``, ``2T``."""
    if mb and mb % (1024 * 1024) == 0:
        return f"{mb // (1024 * 1024)}T"
    if mb and mb % 1024 == 0:
        return f"{mb // 1024}G"
    return f"{mb}M"


def tres(job: Mapping[str, Any], allocated: bool) -> dict[str, str]:
    """A job's TRES as name -> value (cpu, mem, node, billing, gres/gpu)."""
    nodes = job.get("nodes") or 1
    mem = (job.get("mem_per_node_mb") or 0) * nodes
    alloc_nodes = (job.get("allocation") or {}).get("nodes") or []
    if allocated and not mem and alloc_nodes:
        mem = sum(n.get("memory_mb") or 0 for n in alloc_nodes)
    out = {"cpu": str(job.get("cpus") or 0)}
    if mem:
        out["mem"] = _mem_text(mem)
    out["node"] = str(nodes)
    out["billing"] = str(job.get("cpus") or 0)
    gpus = (job.get("gpus_per_node") or 0) * nodes
    if gpus:
        out["gres/gpu"] = str(gpus)
    return out


def _tres_text(job: Mapping[str, Any], allocated: bool) -> str | None:
    if allocated and job["state"] == "PENDING":
        return None
    return ",".join(f"{k}={v}" for k, v in sorted(tres(job, allocated).items()))


def cpu_time_text(seconds: float | None) -> str | None:
    """Slurm's CPU times (TotalCPU, UserCPU, SystemCPU): ``MM:SS.mmm`` under an hour (``00:MM:SS``
    with no milliseconds), ``HH:MM:SS`` under a day, then ``D-HH:MM:SS``."""
    if seconds is None:
        return None
    secs, ms = int(seconds), int(round((seconds - int(seconds)) * 1e6)) // 1000
    days, hours, minutes, secs = secs // 86400, secs // 3600 % 24, secs // 60 % 60, secs % 60
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{minutes:02d}:{secs:02d}.{ms:03d}" if ms else f"00:{minutes:02d}:{secs:02d}"


def size_text(kb: int | None) -> str | None:
    """Slurm's sizes (MaxRSS) from KiB: ``1234K``, ``196M``, ``2.50G`` (tresusage.count_text)."""
    return None if kb is None else count_text(kb * 1024)


def _job_cpu(key: str):
    """A job line's CPU time: the sum of its steps' (0 until one has ended)."""
    return lambda job, now: cpu_time_text(sum(s.get(key) or 0 for s in job.get("steps") or ()))


def usage_columns(line) -> tuple[Column, ...]:
    """ConsumedEnergy and the TRESUsageIn* fields (shoal.slurm.tresusage) of sacct and sstat;
    ``line(row)`` gives the row as sacct's (step or None, job) pair."""
    def tres(stat: str, text=usage_text):
        return lambda row, now: text(*line(row), stat)

    def energy(text):
        return lambda row, now: text(consumed_energy(*line(row)))

    return (
        Column("ConsumedEnergy", 14, energy(energy_text)),
        Column("ConsumedEnergyRaw", 17, energy(lambda j: None if j is None else int(j))),
        Column("TRESUsageInAve", 14, tres("ave")),
        Column("TRESUsageInMax", 14, tres("max")),
        Column("TRESUsageInMaxNode", 18, tres("max", node_text)),
        Column("TRESUsageInMin", 14, tres("min")),
        Column("TRESUsageInMinNode", 18, tres("min", node_text)),
        Column("TRESUsageInTot", 14, tres("tot")),
    )


COLUMNS: dict[str, Column] = {c.name.lower(): c for c in (
    Column("Account", 10, _either(lambda j, now: j.get("account"), lambda s, j, now: j.get("account"))),
    Column("AdminComment", 15, _job(lambda j, now: j.get("admin_comment"))),
    Column("AllocCPUS", 10, _either(_alloc_cpus, _step_cpus)),
    Column("AllocTRES", 10, _job(lambda j, now: _tres_text(j, True))),
    Column("Comment", 14, _job(lambda j, now: j.get("comment"))),
    Column("DerivedExitCode", 15, _job(lambda j, now: j.get("derived_exit_code") or "0:0")),
    Column("Elapsed", 10, _either(lambda j, now: format_hms(elapsed(j, now)),
                                  lambda s, j, now: format_hms(_step_elapsed(s, j, now)))),
    Column("ElapsedRaw", 10, _either(lambda j, now: int(elapsed(j, now)),
                                     lambda s, j, now: int(_step_elapsed(s, j, now)))),
    Column("End", 19, _either(lambda j, now: format_timestamp(j.get("end_time")),
                              lambda s, j, now: format_timestamp(s.get("end_time")))),
    Column("ExitCode", 8, _either(lambda j, now: exit_code_text(j.get("exit_code"), j.get("signal")),
                                  lambda s, j, now: exit_code_text(s.get("exit_code"), s.get("signal")))),
    Column("JobID", -12, _either(lambda j, now: job_id_text(j),
                                 lambda s, j, now: f"{job_id_text(j)}.{s['step_id']}")),
    Column("JobIDRaw", -12, _either(lambda j, now: j["job_id"], lambda s, j, now: f"{j['job_id']}.{s['step_id']}")),
    Column("JobName", 10, _either(lambda j, now: j.get("name"), lambda s, j, now: s.get("name"))),
    Column("MaxRSS", 10, _either(lambda j, now: None, lambda s, j, now: size_text(s.get("max_rss_kb")))),
    Column("MaxRSSNode", 10, _either(lambda j, now: None, lambda s, j, now: s.get("max_rss_node"))),
    Column("NCPUS", 10, _either(_alloc_cpus, _step_cpus)),
    Column("NNodes", 8, _either(lambda j, now: j.get("nodes"),
                                lambda s, j, now: len(expand(s["nodelist"])) if s.get("nodelist") else 1)),
    Column("NodeList", 15, _either(lambda j, now: j.get("nodelist") or "None assigned",
                                   lambda s, j, now: s.get("nodelist") or j.get("nodelist"))),
    Column("Partition", 10, _job(lambda j, now: j.get("partition"))),
    Column("Reason", 22, _job(lambda j, now: j.get("reason") or "None")),
    Column("ReqTRES", 10, _job(lambda j, now: _tres_text(j, False))),
    Column("Restarts", 8, _job(lambda j, now: j.get("restart_count") or 0)),
    Column("Start", 19, _either(lambda j, now: format_timestamp(j.get("start_time")),
                                lambda s, j, now: format_timestamp(s.get("start_time")))),
    Column("State", 10, _either(_state, lambda s, j, now: s.get("state"))),
    Column("Submit", 19, _either(lambda j, now: format_timestamp(j.get("submit_time")),
                                 lambda s, j, now: format_timestamp(s.get("start_time")))),
    Column("SystemCPU", 10, _either(_job_cpu("system_cpu_s"), lambda s, j, now: cpu_time_text(s.get("system_cpu_s")))),
    Column("Timelimit", 10, _job(lambda j, now: format_hms(j.get("time_limit_s")))),
    Column("TotalCPU", 10, _either(_job_cpu("cpu_s"), lambda s, j, now: cpu_time_text(s.get("cpu_s")))),
    Column("User", 9, _job(lambda j, now: j.get("user"))),
    Column("UserCPU", 10, _either(_job_cpu("user_cpu_s"), lambda s, j, now: cpu_time_text(s.get("user_cpu_s")))),
    Column("WorkDir", 20, _job(lambda j, now: j.get("workdir"))),
    *usage_columns(lambda row: (row["step"], row["job"])),
)}


def parse_fields(text: str, columns: Mapping[str, Column] | None = None) -> list[tuple[Column, int]]:
    """``jobid,jobname%30,state%-12``: columns (case-insensitive; sacct's unless ``columns``
    names others) with their widths."""
    columns = COLUMNS if columns is None else columns
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, pct, width_text = item.partition("%")
        column = columns.get(name.lower())
        if column is None:
            raise FormatError(
                f"Invalid field requested: \"{name}\" (valid fields: "
                f"{', '.join(c.name for c in columns.values())})"
            )
        width = column.width
        if pct:
            try:
                width = int(width_text)
            except ValueError:
                raise FormatError(f"invalid width in field \"{item}\": expected a number after %") from None
        out.append((column, width))
    return out


def _cell(value: Any, width: int) -> str:
    """print_fields_str: cut with ``+``, right-justified unless the width is negative."""
    size = abs(width)
    text = " " if value is None or value == "" else str(value)
    if len(text) > size:
        text = text[: size - 1] + "+"
    return text.ljust(size) if width < 0 else text.rjust(size)


def step_filter(options) -> dict[str, set[str]]:
    """-j's ``JOB.STEP`` entries (``12.0``, ``12.batch``): per job id, the only steps to show."""
    wanted: dict[str, set[str]] = {}
    for part in split_list(options.jobs):
        job, dot, step = part.partition(".")
        if dot:
            wanted.setdefault(job, set()).add(step)
    return wanted


def job_rows(jobs: list[dict], options) -> list[dict]:
    rows: list[dict] = []
    only_steps = step_filter(options)
    for job in collapse_arrays(jobs):
        steps = only_steps.get(job_id_text(job)) or only_steps.get(str(job["job_id"]))
        if steps is not None:  # -j 12.0: that step's line alone (none if it has no such step)
            rows.extend({"job": job, "step": s} for s in job.get("steps") or () if str(s["step_id"]) in steps)
            continue
        rows.append({"job": job, "step": None})
        if not options.allocations and not job.get("array_tasks"):
            rows.extend({"job": job, "step": s} for s in job.get("steps") or ())
    return rows


def select_jobs(jobs: list[dict], options, now: float) -> list[dict]:
    """Client-side filters: states, names, users and the -S/-E window."""
    states = parse_states(split_list(options.state)) if options.state else None
    names = set(split_list(options.name))
    users = set(split_list(options.user))
    start, end = window(options, now)
    out = []
    for job in jobs:
        if states and job["state"] not in states:
            continue
        if names and job.get("name") not in names:
            continue
        if users and not options.allusers and job.get("user") not in users:
            continue
        if start is not None and job.get("end_time") and job["end_time"] < start:
            continue
        if end is not None and (job.get("start_time") or job.get("submit_time") or 0) > end:
            continue
        out.append(job)
    return out


def parse_states(values: list[str]) -> set[str]:
    by_code = {code: name for name, code in STATE_CODES.items()}
    out = set()
    for value in values:
        word = value.upper()
        name = word if word in STATE_CODES else by_code.get(word)
        if name is None:
            raise FormatError(
                f"Invalid state: {value} (expected one of "
                f"{', '.join(f'{n}/{c}' for n, c in STATE_CODES.items())})"
            )
        out.add(name)
    return out


def window(options, now: float) -> tuple[float | None, float | None]:
    """The -S/-E window; with no -S and no -j, Slurm's default is today since midnight."""
    if options.starttime:
        start = parse_begin_time(options.starttime, now)
    elif options.jobs:
        start = None
    else:
        t = time.localtime(now)
        start = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))
    end = parse_begin_time(options.endtime, now) if options.endtime else None
    return start, end


def field_spec(options) -> str:
    if options.format or os.environ.get("SACCT_FORMAT"):  # -o, or Slurm's input variable
        return options.format or os.environ["SACCT_FORMAT"]
    if options.brief:
        return BRIEF_FIELDS
    if options.long:
        return LONG_FIELDS
    return os.environ.get("SACCT_FORMAT") or DEFAULT_FIELDS


def render_sacct(jobs: list[dict], options, now: float) -> str:
    """sacct's output for these jobs (already fetched), as of ``now``."""
    return print_fields(parse_fields(field_spec(options)), job_rows(select_jobs(jobs, options, now), options),
                        options, now)


def print_fields(columns: list[tuple[Column, int]], rows: list, options, now: float) -> str:
    """Slurm's print_fields: a header and a dashed line, then fixed-width cells; or with
    -p/-P, values joined by ``options.delimiter`` (sacct's and sstat's output)."""
    delim = options.delimiter
    lines = []
    if options.parsable or options.parsable2:
        end = delim if options.parsable else ""
        if not options.noheader:
            lines.append(delim.join(c.name for c, _ in columns) + end)
        for row in rows:
            values = (c.get(row, now) for c, _ in columns)
            lines.append(delim.join("" if v is None else str(v) for v in values) + end)
    else:
        if not options.noheader:
            lines.append("".join(
                (c.name.ljust(abs(w))[: abs(w)] if w < 0 else c.name.rjust(abs(w))[: abs(w)]) + " "
                for c, w in columns))
            lines.append("".join("-" * abs(w) + " " for _, w in columns))
        for row in rows:
            lines.append("".join(_cell(c.get(row, now), w) + " " for c, w in columns))
    return "".join(line + "\n" for line in lines)


def render_json(jobs: list[dict], options, now: float) -> str:
    """sacct --json: Slurm's ``jobs`` list, with ``state``, ``exit_code``, ``time`` and ``steps``."""
    out = []
    for job in select_jobs(jobs, options, now):
        out.append({
            "job_id": job["job_id"],
            "array": {"job_id": job.get("array_job_id") or 0, "task_id": job.get("array_task_id")},
            "name": job.get("name"),
            "user": job.get("user"),
            "partition": job.get("partition"),
            "nodes": job.get("nodelist") or "None assigned",
            "allocation_nodes": job.get("nodes"),
            "state": {"current": job["state"], "reason": job.get("reason") or "None"},
            "exit_code": {"return_code": job.get("exit_code") or 0, "signal": job.get("signal") or 0},
            "time": {
                "submission": int(job.get("submit_time") or 0),
                "start": int(job.get("start_time") or 0),
                "end": int(job.get("end_time") or 0),
                "elapsed": int(elapsed(job, now)),
                "limit": None if job.get("time_limit_s") is None else job["time_limit_s"] // 60,
            },
            "working_directory": job.get("workdir"),
            "tres": {"requested": tres(job, False), "allocated": {} if job["state"] == "PENDING" else tres(job, True)},
            "steps": [
                {
                    "step": {"id": f"{job['job_id']}.{s['step_id']}", "name": s.get("name")},
                    "state": s.get("state"),
                    "exit_code": {"return_code": s.get("exit_code") or 0, "signal": s.get("signal") or 0},
                    "nodes": s.get("nodelist"),
                    "tasks": s.get("ntasks"),
                    "time": {"start": int(s.get("start_time") or 0), "end": int(s.get("end_time") or 0)},
                }
                for s in job.get("steps") or ()
            ],
        })
    return json.dumps({"jobs": out}, indent=2) + "\n"


def parse_args(argv: list[str] | None):
    p = argument_parser("sacct", "Accounting data of jobs and steps, as Slurm's sacct.")
    p.add_argument("-j", "--jobs", action="append", help="comma list of job ids (12, 10_3)")
    p.add_argument("-u", "--user", "--uid", action="append", help="comma list of users")
    p.add_argument("-a", "--allusers", action="store_true", help="jobs of all users")
    p.add_argument("-X", "--allocations", action="store_true", help="no step lines")
    p.add_argument("-n", "--noheader", action="store_true", help="no header lines")
    p.add_argument("-P", "--parsable2", action="store_true", help="'|'-separated, no trailing '|'")
    p.add_argument("-p", "--parsable", action="store_true", help="'|'-separated, trailing '|'")
    p.add_argument("--delimiter", default="|", help="separator for -p/-P")
    p.add_argument("-o", "--format", help="comma list of fields, e.g. jobid,state,exitcode")
    p.add_argument("-S", "--starttime", help="jobs in any state after this time")
    p.add_argument("-E", "--endtime", help="jobs in any state before this time")
    p.add_argument("-s", "--state", action="append", help="comma list of states")
    p.add_argument("--name", action="append", help="comma list of job names")
    p.add_argument("-b", "--brief", action="store_true", help="jobid,state,exitcode")
    p.add_argument("-l", "--long", action="store_true", help="many fields")
    p.add_argument("--json", action="store_true", help="JSON output")
    # One cluster, and one record per job run: accepted as Slurm takes them (Snakemake asks --clusters all).
    p.add_argument("-M", "--clusters", help="accepted: Shoal runs one cluster")
    p.add_argument("-L", "--allclusters", action="store_true", help="accepted: Shoal runs one cluster")
    p.add_argument("-D", "--duplicates", action="store_true", help="accepted: Shoal keeps one record per job")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    return p.parse_args(argv)


def query(options, now: float) -> dict:
    from shoal.api_client import _login_name

    users = split_list(options.user)
    if not users and not options.allusers and not options.jobs:
        # Slurm's default is your own jobs, unless you named the jobs you want.
        users = [_login_name()]
    start, _ = window(options, now)
    return {
        "all": "true",
        "job_id": sorted({j.partition(".")[0] for j in split_list(options.jobs)}) or None,
        "user": users[0] if len(users) == 1 and not options.allusers else None,
        "since": None if start is None else int(start),
    }


def main(argv: list[str] | None = None) -> int:
    try:
        options = parse_args(argv)
        now = time.time()
        parse_fields(field_spec(options))
        if options.state:
            parse_states(split_list(options.state))
        params = query(options, now)
        if params["user"] and not options.user:
            options.user = [params["user"]]
        jobs = Client.from_config().get("/shoal/v1/jobs", params)["jobs"]
        emit(render_json(jobs, options, now) if options.json else render_sacct(jobs, options, now))
    except (ClientError, FormatError, TimeFormatError) as e:
        fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
