"""squeue: the job queue, printed the way Slurm's squeue prints it.

Fetching (GET /shoal/v1/jobs) is kept apart from rendering: ``render_jobs(jobs, options,
now)`` is a pure function over Job dicts (docs/API.md) that the tests call directly.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable

from shoal.api_client import ClientError, RunLocally, print_error, program_name
from shoal.slurm.fmt import (
    Field,
    FormatError,
    argument_parser,
    UsageError,
    emit,
    parse_format,
    parse_long_format,
    render,
    split_list,
)
from shoal.model.arrays import format_array
from shoal.model.timefmt import format_duration, format_timestamp

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the command's start-up time
    from collections.abc import Callable, Mapping
    from typing import Any, TextIO

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"

# Slurm's compact state codes; COMPLETING is a flag on a finished job, shown as CG.
STATE_CODES = {
    "PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA",
    "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR", "OUT_OF_MEMORY": "OOM",
    "COMPLETING": "CG",
}  # fmt: skip
_STATE_BY_CODE = {code: name for name, code in STATE_CODES.items()}
_FINISHED = frozenset(STATE_CODES) - {"PENDING", "RUNNING", "COMPLETING"}
# squeue shows the reason in NODELIST(REASON) for these states, the node list otherwise.
_REASON_STATES = frozenset({"PENDING", "TIMEOUT", "FAILED"})


class StateError(ValueError):
    """A --states value that names no job state."""


def parse_states(values: list[str]) -> set[str] | None:
    """``-t pd,R,completing`` to long state names; None for ``all``."""
    states: set[str] = set()
    for value in values:
        word = value.upper()
        if word == "ALL":
            return None
        if word in STATE_CODES:
            states.add(word)
        elif word in _STATE_BY_CODE:
            states.add(_STATE_BY_CODE[word])
        else:
            raise StateError(
                f"Invalid job state specified: {value} (expected a name or code from "
                f"{', '.join(f'{n}/{c}' for n, c in STATE_CODES.items())}, or all)"
            )
    return states


def display_state(job: Mapping[str, Any]) -> str:
    """The state squeue shows: COMPLETING while a finished job is being cleaned up."""
    return "COMPLETING" if job.get("completing") else job["state"]


def job_matches_states(job: Mapping[str, Any], states: set[str]) -> bool:
    """Slurm matches a completing job both as CG and as its base state."""
    return job["state"] in states or ("COMPLETING" in states and bool(job.get("completing")))


def elapsed(job: Mapping[str, Any], now: float) -> float:
    """Slurm's job_time_used: 0 while pending, up to now while running, else end - start."""
    start = job.get("start_time")
    if not start or job["state"] == "PENDING":
        return 0
    end = job.get("end_time") if job["state"] != "RUNNING" else None
    return (end or now) - start


def job_id_text(job: Mapping[str, Any]) -> str:
    """%i: ``12``, an array task ``10_2``, or pending tasks collapsed as ``10_[3-9%2]``."""
    if job.get("array_tasks"):
        return f"{job['array_job_id']}_[{job['array_tasks']}]"
    if job.get("array_task_id") is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def _reason_list(job: Mapping[str, Any], now: float) -> str:
    if not job.get("completing") and job["state"] in _REASON_STATES:
        return f"({job.get('reason') or 'None'})"
    return job.get("nodelist") or ""


def _time_left(job: Mapping[str, Any], now: float) -> str:
    limit = job.get("time_limit_s")
    return format_duration(None if limit is None else limit - elapsed(job, now))


def _end_time(job: Mapping[str, Any], now: float) -> str:
    if job.get("end_time"):
        return format_timestamp(job["end_time"])
    if job["state"] in ("PENDING", "RUNNING"):
        if job.get("time_limit_s") is None:
            return "NONE"
        if job.get("start_time"):
            return format_timestamp(job["start_time"] + job["time_limit_s"])
    return "N/A"


def _when(key: str):
    return lambda j, now: format_timestamp(j[key]) if j.get(key) else "N/A"


def _start_time(job: Mapping[str, Any], now: float) -> str:
    """%S: when it started, or for a pending job when backfill expects it to (N/A: unknown)."""
    when = job.get("expected_start") if job.get("state") == "PENDING" else job.get("start_time")
    return format_timestamp(when) if when else "N/A"


def _tres_per_node(job: Mapping[str, Any], now: float) -> str:
    gpus = job.get("gpus_per_node")
    if not gpus:
        return "N/A"
    kind = f"{job['gpu_type']}:" if job.get("gpu_type") else ""
    return f"gres/gpu:{kind}{gpus}"


def _min_cpus(job: Mapping[str, Any], now: float) -> int:
    return (job.get("cpus_per_task") or 1) * (job.get("ntasks_per_node") or 1)


def _min_memory(job: Mapping[str, Any], now: float) -> str:
    mem = job.get("mem_per_node_mb") or 0
    return f"{mem}M" if mem else "0"


def _array_task(job: Mapping[str, Any], now: float) -> str:
    if job.get("array_tasks"):
        return job["array_tasks"]
    task = job.get("array_task_id")
    return "N/A" if task is None else str(task)


def _account_id(job: Mapping[str, Any], kind: str) -> str | int | None:
    """The job user's uid (``uid``), group name (``group``) or gid (``gid``) from this host's passwd."""
    import pwd

    try:
        entry = pwd.getpwnam(job.get("user") or "")
    except KeyError:
        return None
    if kind == "uid":
        return entry.pw_uid
    if kind == "gid":
        return entry.pw_gid
    import grp

    try:
        return grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        return entry.pw_gid


FIELDS: dict[str, Field] = {
    "A": Field("JOBID", lambda j, now: j["array_job_id"] if j.get("array_tasks") else j["job_id"]),
    "a": Field("ACCOUNT", lambda j, now: j.get("account")),
    "B": Field("EXEC_HOST", lambda j, now: j.get("batch_host") or "n/a"),
    "b": Field("TRES_PER_NODE", _tres_per_node),
    "C": Field("CPUS", lambda j, now: j.get("cpus")),
    "c": Field("MIN_CPUS", _min_cpus),
    "D": Field("NODES", lambda j, now: j.get("nodes")),
    "E": Field("DEPENDENCY", lambda j, now: j.get("dependency")),
    "e": Field("END_TIME", _end_time),
    "F": Field("ARRAY_JOB_ID", lambda j, now: j.get("array_job_id") or j["job_id"]),
    "i": Field("JOBID", lambda j, now: job_id_text(j)),
    "j": Field("NAME", lambda j, now: j.get("name")),
    "K": Field("ARRAY_TASK_ID", _array_task),
    "k": Field("COMMENT", lambda j, now: j.get("comment")),
    "L": Field("TIME_LEFT", _time_left, cut=False),
    "l": Field("TIME_LIMIT", lambda j, now: format_duration(j.get("time_limit_s")), cut=False),
    "M": Field("TIME", lambda j, now: format_duration(elapsed(j, now)), cut=False),
    "m": Field("MIN_MEMORY", _min_memory),
    "N": Field("NODELIST", lambda j, now: j.get("nodelist") or "", cut=False, cut_header=False),
    "o": Field("COMMAND", lambda j, now: j.get("command")),
    "P": Field("PARTITION", lambda j, now: j.get("partition")),
    "p": Field("PRIORITY", lambda j, now: f"{(j.get('priority') or 0) / 0xFFFFFFFF:16.14f}"),
    "Q": Field("PRIORITY", lambda j, now: j.get("priority")),
    "q": Field("QOS", lambda j, now: j.get("qos") or "normal"),
    "R": Field("NODELIST(REASON)", _reason_list, cut=False, cut_header=False),
    "r": Field("REASON", lambda j, now: j.get("reason") or "None"),
    "S": Field("START_TIME", _start_time),
    "T": Field("STATE", lambda j, now: display_state(j)),
    "t": Field("ST", lambda j, now: STATE_CODES.get(display_state(j), display_state(j))),
    "u": Field("USER", lambda j, now: j.get("user")),
    "U": Field("UID", lambda j, now: _account_id(j, "uid")),
    "g": Field("GROUP", lambda j, now: _account_id(j, "group")),
    "G": Field("GID", lambda j, now: _account_id(j, "gid")),
    "V": Field("SUBMIT_TIME", _when("submit_time")),
    "Y": Field("SCHEDNODES", lambda j, now: j.get("sched_nodes"), cut=False, cut_header=False),
    "y": Field("NICE", lambda j, now: j.get("nice", 0)),
    "Z": Field("WORK_DIR", lambda j, now: j.get("workdir")),
    "z": Field("S:C:T", lambda j, now: "*:*:*"),
}

# squeue -O/--Format names for the same fields.
LONG_FIELDS: dict[str, Field] = {
    name: FIELDS[letter]
    for name, letter in {
        "jobid": "A", "account": "a", "exechost": "B", "tres-per-node": "b", "numcpus": "C",
        "mincpus": "c", "numnodes": "D", "dependency": "E", "endtime": "e", "arrayjobid": "F",
        "jobarrayid": "i", "name": "j", "arraytaskid": "K", "comment": "k", "timeleft": "L",
        "timelimit": "l", "timeused": "M", "minmemory": "m", "nodelist": "N", "command": "o",
        "partition": "P", "priority": "p", "prioritylong": "Q", "qos": "q", "reasonlist": "R",
        "reason": "r", "starttime": "S", "state": "T", "statecompact": "t", "username": "u",
        "submittime": "V", "schednodes": "Y", "nice": "y", "workdir": "Z", "userid": "U", "groupname": "g",
        "groupid": "G",
    }.items()
}  # fmt: skip


def collapse_arrays(jobs: list[dict]) -> list[dict]:
    """Merge pending tasks of one array (same name and partition) into one row, as Slurm does.

    The merged row is the first task's, with ``array_tasks`` holding ``3-9%2``; a lone
    pending task keeps its own ``10_3`` id. Running and finished tasks stay one per line.
    """
    groups: dict[tuple, list[dict]] = {}
    for job in jobs:
        key = array_group(job)
        if key is not None:
            groups.setdefault(key, []).append(job)
    rows: list[dict] = []
    for job in jobs:
        key = array_group(job)
        group = groups[key] if key is not None else None
        if not group or len(group) == 1:
            rows.append(job)
        elif group[0] is job:
            rows.append(merged_row(group))
    return rows


def array_group(job: dict) -> tuple | None:
    """The group of pending array tasks ``job`` is shown in (``collapse_arrays``), or None."""
    if job["state"] == "PENDING" and job.get("array_job_id") is not None and job.get("array_task_id") is not None:
        return (job["array_job_id"], job.get("name"), job.get("partition"))
    return None


def merged_row(group: list[dict]) -> dict:
    """The one row of a group of two or more pending tasks (in listing order): the first's,
    its reasons joined, ``array_tasks`` the tasks' ids (``3-9%2``)."""
    first = group[0]
    return merged(first, dict.fromkeys(task_reason(t) for t in group),
                  format_array((t["array_task_id"] for t in group), first.get("array_throttle")))


def task_reason(task: dict) -> str:
    """A pending task's reason as its group's merged row lists it."""
    return task.get("reason") or "None"


def merged(first: dict, reasons: Iterable[str], tasks: str) -> dict:
    """A group's merged row: its first task's, with the group's reasons (in order of their
    first task) and ``array_tasks``, the tasks' ids as format_array writes them."""
    return {**first, "reason": ",".join(reasons), "array_tasks": tasks}


def row_specs(options):
    """The parsed -o/-O format, or the default for --start / --long / plain squeue."""
    if options.Format:
        return parse_long_format(options.Format, LONG_FIELDS)
    fmt = options.format or (START_FORMAT if options.start else LONG_FORMAT if options.long
                             else DEFAULT_FORMAT)
    return parse_format(fmt, FIELDS)


def select_jobs(jobs: list[dict], options) -> list[dict]:
    """The client-side filters (the server already applied those it knows)."""
    states = parse_states(split_list(options.states)) if options.states else (
        {"PENDING"} if options.start else {"PENDING", "RUNNING", "COMPLETING"})
    users = set(split_list(options.user))
    parts = set(split_list(options.partition))
    names = set(split_list(options.name))
    out = []
    for job in jobs:
        if states is not None and not job_matches_states(job, states):
            continue
        if users and job.get("user") not in users:
            continue
        if parts and job.get("partition") not in parts:
            continue
        if names and job.get("name") not in names:
            continue
        out.append(job)
    if options.start:
        out.sort(key=lambda j: (j.get("start_time") is None, j.get("start_time") or 0, j["job_id"]))
    return out


def render_jobs(jobs: list[dict], options, now: float) -> str:
    """squeue's table for these jobs (already fetched), as of ``now``."""
    rows = select_jobs(jobs, options)
    if not options.array:
        rows = collapse_arrays(rows)
    out = render(row_specs(options), rows, now, header=not options.noheader)
    if options.long and not options.noheader:
        out = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "\n" + out
    return out


STEP_FORMAT = "%.15i %.8j %.9P %.8u %.9M %N"  # Slurm's default for squeue --steps
STEP_FIELDS: dict[str, Field] = {
    "i": Field("STEPID", lambda st, now: st["step"]),
    "A": Field("JOBID", lambda st, now: st["job_id"]),
    "j": Field("NAME", lambda st, now: st.get("name")),
    "P": Field("PARTITION", lambda st, now: st.get("partition")),
    "u": Field("USER", lambda st, now: st.get("user")),
    "M": Field("TIME", lambda st, now: format_duration(max(0, int(now - (st.get("start_time") or now)))), cut=False),
    "N": Field("NODELIST", lambda st, now: st.get("nodelist") or "", cut=False, cut_header=False),
}


def render_steps(jobs: list[dict], options, now: float) -> str:
    """squeue -s/--steps: the running steps of the running jobs (``-s 12.0,13.batch``: only those)."""
    wanted = set(split_list([options.steps])) if options.steps else set()
    rows = []
    for job in select_jobs(jobs, options):
        for st in job.get("steps") or []:
            step = f"{job_id_text(job)}.{st['step_id']}"
            if st.get("state") == "RUNNING" and (not wanted or step in wanted):
                rows.append({**st, "step": step, "job_id": job["job_id"], "partition": job.get("partition"),
                             "user": job.get("user")})
    rows.sort(key=lambda r: (r["job_id"], r["step"]))
    return render(parse_format(options.format or STEP_FORMAT, STEP_FIELDS, kind="step"), rows, now,
                  header=not options.noheader)


def render_json(jobs: list[dict], options, now: float) -> str:
    """squeue --json: a ``jobs`` list with Slurm's key names, times as epoch seconds."""
    out = []
    for job in select_jobs(jobs, options):
        limit = job.get("time_limit_s")
        out.append({
            "job_id": job["job_id"],
            "array_job_id": job.get("array_job_id") or 0,
            "array_task_id": job.get("array_task_id"),
            "name": job.get("name"),
            "user_name": job.get("user"),
            "partition": job.get("partition"),
            "job_state": display_state(job),
            "state_reason": job.get("reason") or "None",
            "nodes": job.get("nodelist") or "",
            "node_count": job.get("nodes"),
            "cpus": job.get("cpus"),
            "tasks": job.get("ntasks"),
            "cpus_per_task": job.get("cpus_per_task"),
            "tres_per_node": None if _tres_per_node(job, now) == "N/A" else _tres_per_node(job, now),
            "time_limit": None if limit is None else limit // 60,
            "submit_time": int(job.get("submit_time") or 0),
            "start_time": int(job.get("start_time") or 0),
            "end_time": int(job.get("end_time") or 0),
            "priority": job.get("priority"),
            "batch_host": job.get("batch_host"),
            "current_working_directory": job.get("workdir"),
            "command": job.get("command"),
            "standard_output": job.get("stdout"),
            "standard_error": job.get("stderr"),
            "dependency": job.get("dependency"),
            "comment": job.get("comment"),
            "exit_code": job.get("exit_code"),
        })
    return json.dumps({"jobs": out}, indent=2) + "\n"


_PARSERS: dict[bool, object] = {}


def _parser(remote: bool):
    """The argument parser, built once per process (the server parses every call with it)."""
    if remote in _PARSERS:
        return _PARSERS[remote]
    p = argument_parser("squeue", "View jobs in the queue, as Slurm's squeue.", remote=remote)
    p.add_argument("-u", "--user", action="append", help="comma list of users")
    p.add_argument("--me", action="store_true", help="only my jobs")
    p.add_argument("-p", "--partition", action="append", help="comma list of partitions")
    p.add_argument("-t", "--states", action="append", help="comma list of states, or all")
    p.add_argument("-j", "--jobs", action="append", help="comma list of job ids (12, 10_3)")
    p.add_argument("-n", "--name", action="append", help="comma list of job names")
    p.add_argument("-h", "--noheader", action="store_true", help="no header line")
    p.add_argument("-o", "--format", help="output format, e.g. '%%.18i %%.8j %%T'")
    p.add_argument("-O", "--Format", help="long-form output format, e.g. 'jobid,name:30'")
    p.add_argument("-l", "--long", action="store_true", help="long report")
    p.add_argument("--start", action="store_true", help="expected start times of pending jobs")
    p.add_argument("-r", "--array", action="store_true", help="one line per array task")
    p.add_argument("-s", "--steps", nargs="?", const="", metavar="STEPS", help="job steps instead of jobs")
    p.add_argument("-i", "--iterate", type=float, metavar="SECONDS", help="repeat every N seconds")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.add_argument("-a", "--all", action="store_true", help="accepted for compatibility")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    _PARSERS[remote] = p
    return p


def parse_args(argv: list[str] | None, *, remote: bool = False, user: str | None = None):
    """squeue's options; ``user`` is the login name ``--me`` stands for (this process's by default)."""
    options = _parser(remote).parse_args(argv)
    if not remote and not (options.format or options.Format):  # the server answers none with these set
        options.Format = os.environ.get("SQUEUE_FORMAT2") or None
        options.format = None if options.Format else os.environ.get("SQUEUE_FORMAT") or None
    if options.me:
        if user is None:
            from shoal.api_client import _login_name

            user = _login_name()
        options.user = (options.user or []) + [user]
    return options


def query(options) -> dict:
    """The GET /shoal/v1/jobs parameters: the server filters what it can."""
    params: dict[str, Any] = {
        "job_id": split_list(options.jobs) or None,
        "user": _only(split_list(options.user)),
        "partition": _only(split_list(options.partition)),
        "name": _only(split_list(options.name)),
    }
    if options.steps is not None:
        return {**params, "state": ["RUNNING"]}  # the steps come with the full Job objects
    if not (options.format or options.Format or options.long or options.start or options.json):
        params["view"] = "queue"  # the default table: only the columns it shows
        params["form"] = "packed"  # as a table: each job a row, what many share once (decoded by listed_jobs)
        if not (options.array or options.states):
            # The server merges each array's pending tasks as render_jobs would: with the default
            # states no filter here splits an array's pending tasks (-t could: CG among PD).
            params["collapse"] = "true"
    states = parse_states(split_list(options.states)) if options.states else set()
    if states is None or states & _FINISHED or options.jobs:
        # Finished jobs are only returned on request; a job id asked for by number is
        # looked up among all jobs so that an unknown id can be told from a finished one.
        params["all"] = "true"
    return params


def listed_jobs(answer: dict) -> list[dict]:
    """The jobs of a GET /shoal/v1/jobs answer: ``{"jobs": [...]}``, or with ``form=rows``
    ``{"columns": [...], "rows": [[...], ...]}``, or with ``form=packed`` the same with each row's
    last value the index of its other values in ``shared`` (their keys ``shared_columns``); a
    server in this process answers with the first."""
    if "rows" not in answer:
        return answer["jobs"]
    columns = answer["columns"]
    if "shared" not in answer:
        return [dict(zip(columns, row)) for row in answer["rows"]]
    shared = [dict(zip(answer["shared_columns"], values)) for values in answer["shared"]]
    jobs = []
    for row in answer["rows"]:  # a copy of the shared values updated was the quickest of the ways tried
        job = shared[row[-1]].copy()
        job.update(zip(columns, row))  # zip stops before the index: columns has one name fewer
        jobs.append(job)
    return jobs


def fetch(client, params: dict) -> list[dict]:
    """The jobs ``params`` ask for; a server older than ``form=packed`` refuses it (400,
    unknown form), and is asked again for plain rows, as are later calls (``--iterate``)."""
    try:
        return listed_jobs(client.get("/shoal/v1/jobs", params))
    except ClientError as e:
        if params.get("form") != "packed" or e.status != 400 or "unknown form" not in str(e):
            raise
    params["form"] = "rows"
    return listed_jobs(client.get("/shoal/v1/jobs", params))


def _only(values: list[str]) -> str | None:
    """A filter the server can apply: one value (several are filtered here)."""
    return values[0] if len(values) == 1 else None


def run(argv: list[str] | None, *, connect: Callable[[], Any], out: TextIO | None = None,
        err: TextIO | None = None, prog: str | None = None, user: str | None = None,
        remote: bool = False) -> int:
    """What squeue prints for ``argv``, written to ``out``/``err`` (this process's by default);
    the exit code. ``remote`` is the server answering the compiled front end: usage errors
    are printed, not exited on, and --iterate and --help raise RunLocally."""
    err = err or sys.stderr
    prog = prog or program_name()
    try:
        options = parse_args(argv, remote=remote, user=user)
        if options.iterate and remote:
            raise RunLocally("--iterate repeats until interrupted")
        row_specs(options)  # a bad format fails before the server is asked anything
        params = query(options)
        client = connect()
        while True:
            jobs = fetch(client, params)
            if options.jobs and not jobs:
                print("slurm_load_jobs error: Invalid job id specified", file=err)  # Slurm's words, no prefix
                return 1
            now = time.time()
            if options.steps is not None:
                emit(render_steps(jobs, options, now), out)
            elif options.json:
                emit(render_json(jobs, options, now), out)
            elif options.iterate and not options.noheader and not options.long:
                emit(time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now)) + "\n"
                     + render_jobs(jobs, options, now) + "\n", out)
            else:
                emit(render_jobs(jobs, options, now), out)
            if not options.iterate:
                return 0
            time.sleep(options.iterate)
    except (ClientError, FormatError, StateError, UsageError) as e:
        return print_error(err, prog, str(e))

