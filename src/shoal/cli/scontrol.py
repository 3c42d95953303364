"""scontrol: show and change jobs, nodes and partitions in Slurm's ``Key=Value`` layout.

``show hostnames`` and ``show hostlist`` run without the server and import nothing but the
hostlist module, since job scripts call them on every launch. The other subcommands
fetch from /shoal/v1; ``render_job``/``render_node``/``render_partition`` are pure.
"""

from __future__ import annotations

import os
import sys

from shoal.model.hostlist import HostlistError, compress, expand

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing costs the command's start-up time
    from collections.abc import Mapping
    from typing import Any

SHOW_ENTITIES = ("job", "node", "partition", "reservation", "hostnames", "hostlist", "config", "step")
# Slurm's scontrol takes any prefix of an entity's full word down to a minimum length, so
# `show hostname`, `show jobs` and `show part` work as there: (entity, full word, shortest).
_SHOW_PREFIXES = (("hostnames", "hostnames", 5), ("hostlist", "hostlist", 5), ("job", "jobs", 1),
                  ("node", "nodes", 1), ("partition", "partitions", 2), ("config", "config", 1),
                  ("reservation", "reservations", 3), ("step", "steps", 2))
INVALID_JOB_ID = "Invalid job id specified"
MIN_JOB_AGE_S = 300  # as the server's show config says: how long an ended job stays in the listing
COMMANDS = ("show", "update", "create", "delete", "hold", "release", "requeue", "ping", "version", "write")
JOB_UPDATE_KEYS = {"timelimit": "time_limit_s", "jobname": "name", "name": "name",
                   "partition": "partition", "numnodes": "nodes", "comment": "comment",
                   "arraytaskthrottle": "array_throttle"}
NODE_STATES = ("DRAIN", "RESUME", "DOWN", "UNDRAIN", "IDLE")

# The Node object's display_state as scontrol's State= word.
NODE_STATE_WORDS = {"idle": "IDLE", "mix": "MIXED", "alloc": "ALLOCATED", "drain": "IDLE+DRAIN",
                    "drng": "MIXED+DRAIN", "down": "DOWN"}


class UsageError(ValueError):
    """A command line scontrol does not understand; the message says what was expected."""


def _fail(message: str):
    from shoal.api_client import fail

    fail(message)


def _user_id(name: str | None) -> str:
    """``alice(1000)`` as Slurm prints UserId; the uid comes from the local passwd."""
    if not name:
        return "(null)"
    try:
        import pwd

        return f"{name}({pwd.getpwnam(name).pw_uid})"
    except (KeyError, ImportError):
        return name


def _group_id(name: str | None) -> str:
    if not name:
        return "(null)"
    try:
        import grp
        import pwd

        gid = pwd.getpwnam(name).pw_gid
        return f"{grp.getgrgid(gid).gr_name}({gid})"
    except (KeyError, ImportError):
        return name


def _text(value: Any) -> str:
    return "(null)" if value is None or value == "" else str(value)


def _layout(lines: list[list[tuple[str, Any]]], oneliner: bool) -> str:
    """Slurm's layout: first line flush left, the rest indented three spaces; -o: one line."""
    rendered = [" ".join(f"{k}={v}" for k, v in line) for line in lines if line]
    if oneliner:
        return " ".join(rendered) + "\n"
    return rendered[0] + "\n" + "".join(f"   {line}\n" for line in rendered[1:])


def _num_nodes(job: Mapping[str, Any], state: str) -> str:
    """A pending job's node range (``2-2``, ``2-4``), a started job's count, as Slurm prints NumNodes."""
    low = job.get("nodes") or 1
    if state == "PENDING":
        return f"{low}-{job.get('nodes_max') or low}"
    return str(low)


def render_job(job: Mapping[str, Any], now: float, oneliner: bool = False) -> str:
    """``scontrol show job``: one job in Slurm's key order."""
    from shoal.slurm.fmt import format_hms
    from shoal.cli.sacct import tres
    from shoal.slurm.squeue import display_state, elapsed
    from shoal.model.job import exit_code_text
    from shoal.model.timefmt import format_timestamp

    first: list[tuple[str, Any]] = [("JobId", job["job_id"])]
    if job.get("array_job_id") is not None:
        task = job.get("array_tasks") or job.get("array_task_id")
        first += [("ArrayJobId", job["array_job_id"]), ("ArrayTaskId", task)]
        if job.get("array_throttle"):
            first.append(("ArrayTaskThrottle", job["array_throttle"]))
    first.append(("JobName", _text(job.get("name"))))
    ts = lambda key: format_timestamp(job.get(key))  # noqa: E731
    limit = job.get("time_limit_s")
    end = job.get("end_time") or (job["start_time"] + limit if job.get("start_time") and limit else None)
    ntpn = job.get("ntasks_per_node")
    cpt = job.get("cpus_per_task") or 1
    state = display_state(job)
    lines = [
        first,
        [("UserId", _user_id(job.get("user"))), ("GroupId", _group_id(job.get("user"))),
         ("MCS_label", "N/A")],
        [("Priority", job.get("priority") or 0), ("Nice", 0), ("Account", _text(job.get("account"))),
         ("QOS", job.get("qos") or "normal")],
        [("JobState", state), ("Reason", job.get("reason") or "None"),
         ("Dependency", _text(job.get("dependency")))],
        [("Requeue", int(bool(job.get("requeue")))), ("Restarts", job.get("restart_count") or 0),
         ("BatchFlag", int(job.get("command") not in ("srun", None) and not job.get("interactive"))),
         ("Reboot", 0), ("ExitCode", exit_code_text(job.get("exit_code"), job.get("signal")))],
        [("RunTime", format_hms(elapsed(job, now))), ("TimeLimit", format_hms(limit)), ("TimeMin", "N/A")],
        [("SubmitTime", ts("submit_time")), ("EligibleTime", ts("eligible_time"))],
        [("StartTime", ts("start_time")), ("EndTime", format_timestamp(end)), ("Deadline", "N/A")],
        [("Partition", _text(job.get("partition")))],
        [("Reservation", job["reservation"])] if job.get("reservation") else [],
        [("NodeList", _text(job.get("nodelist")))],
        [("BatchHost", job["batch_host"])] if job.get("batch_host") else [],
        [("NumNodes", _num_nodes(job, state)), ("NumCPUs", job.get("cpus") or 0),
         ("NumTasks", job.get("ntasks") or 1), ("CPUs/Task", cpt)],
        [("TRES", ",".join(f"{k}={v}" for k, v in tres(job, state != "PENDING").items()))],
        [("NtasksPerN:B:S:C", f"{ntpn or 0}:0:*:*"), ("CoreSpec", "*")],
        [("MinCPUsNode", cpt * (ntpn or 1)), ("MinMemoryNode", job.get("mem_per_node_mb") or 0),
         ("MinTmpDiskNode", 0)],
        [("OverSubscribe", "NO" if job.get("exclusive") else "OK"), ("Contiguous", 0),
         ("Licenses", "(null)"), ("Network", "(null)")],
        [("Command", _text(job.get("command")))],
        [("WorkDir", _text(job.get("workdir")))],
        [("AdminComment", job["admin_comment"])] if job.get("admin_comment") else [],
        [("Comment", job["comment"])] if job.get("comment") else [],
        [("StdErr", _text(job.get("stderr")))],
        [("StdIn", "/dev/null")],
        [("StdOut", _text(job.get("stdout")))],
    ]
    if job.get("gpus_per_node"):
        kind = f"{job['gpu_type']}:" if job.get("gpu_type") else ""
        lines.append([("TresPerNode", f"gres/gpu:{kind}{job['gpus_per_node']}")])
    return _layout(lines, oneliner)


def node_state_word(node: Mapping[str, Any]) -> str:
    from shoal.cli.sinfo import responding

    word = NODE_STATE_WORDS.get(node.get("display_state") or "", (node.get("state") or "UNKNOWN").upper())
    return word if responding(node) else word + "*"


def render_node(node: Mapping[str, Any], oneliner: bool = False) -> str:
    """``scontrol show node``: one node in Slurm's key order."""
    from shoal.model.timefmt import format_timestamp

    cpus = node.get("cpus") or 0
    features = ",".join(node.get("features") or ()) or "(null)"
    mem_mb = node.get("memory_mb") or 0
    gpus = len(node.get("gpus") or ()) or None
    cfg = f"cpu={cpus},mem={mem_mb}M,billing={cpus}" + (f",gres/gpu={gpus}" if gpus else "")
    alloc = [f"cpu={node['cpus_alloc']}"] if node.get("cpus_alloc") else []
    if node.get("memory_alloc_mb"):
        alloc.append(f"mem={node['memory_alloc_mb']}M")
    if node.get("gpus_alloc"):
        alloc.append(f"gres/gpu={node['gpus_alloc']}")
    lines = [
        [("NodeName", node["name"]), ("Arch", node.get("arch") or "x86_64"),
         ("CoresPerSocket", node.get("cores_per_socket") or cpus)],
        [("CPUAlloc", node.get("cpus_alloc") or 0), ("CPUEfctv", cpus), ("CPUTot", cpus), ("CPULoad", "N/A")],
        [("AvailableFeatures", features)],
        [("ActiveFeatures", features)],
        [("Gres", node.get("gres") or "(null)")],
        [("NodeAddr", node.get("address") or node["name"]), ("NodeHostName", node["name"]),
         ("Port", node.get("port") or 0)],
        [("RealMemory", mem_mb), ("AllocMem", node.get("memory_alloc_mb") or 0), ("FreeMem", "N/A"),
         ("Sockets", node.get("sockets") or 1), ("Boards", 1)],
        [("State", node_state_word(node)), ("ThreadsPerCore", node.get("threads_per_core") or 1),
         ("TmpDisk", 0), ("Weight", 1), ("Owner", "N/A"), ("MCS_label", "N/A")],
        [("Partitions", ",".join(node.get("partitions") or ()) or "(null)")],
        [("BootTime", format_timestamp(node.get("boot_time")) if node.get("boot_time") else "None"),
         ("LastHeartbeat", format_timestamp(node.get("last_heartbeat")))],
        [("CfgTRES", cfg)],
        [("AllocTRES", ",".join(alloc))],
    ]
    if node.get("images"):  # Shoal's: the node's image cache, most recently used first
        lines.append([("Images", ",".join(i["names"][0] for i in node["images"] if i.get("names")))])
    if node.get("reason"):
        lines.append([("Reason", node["reason"])])
    return _layout(lines, oneliner)


def render_partition(part: Mapping[str, Any], nodes: list[dict], oneliner: bool = False) -> str:
    """``scontrol show partition``: one partition; TotalCPUs from its nodes."""
    from shoal.slurm.fmt import format_hms

    names = set(part.get("node_names") or expand(part.get("nodes") or ""))
    total_cpus = sum(n.get("cpus") or 0 for n in nodes if n["name"] in names)
    default_time = part.get("default_time_s")
    lines = [
        [("PartitionName", part["name"])],
        [("AllowGroups", "ALL"), ("AllowAccounts", "ALL"), ("AllowQos", "ALL")],
        [("AllocNodes", "ALL"), ("Default", "YES" if part.get("default") else "NO"), ("QoS", "N/A")],
        [("DefaultTime", "NONE" if default_time is None else format_hms(default_time)),
         ("DisableRootJobs", "NO"), ("ExclusiveUser", "NO"), ("GraceTime", 0), ("Hidden", "NO")],
        [("MaxNodes", part.get("max_nodes") or "UNLIMITED"), ("MaxTime", format_hms(part.get("max_time_s"))),
         ("MinNodes", 0), ("LLN", "NO"), ("MaxCPUsPerNode", "UNLIMITED")],
        [("Nodes", part.get("nodes") or "(null)")],
        [("PriorityJobFactor", part.get("priority_job_factor", 1)), ("PriorityTier", 1), ("RootOnly", "NO"), ("ReqResv", "NO"),
         ("OverSubscribe", "NO")],
        [("OverTimeLimit", "NONE"), ("PreemptMode", "OFF")],
        [("State", part.get("state") or "UP"), ("TotalCPUs", total_cpus), ("TotalNodes", len(names)),
         ("SelectTypeParameters", "NONE")],
        [("JobDefaults", "(null)")],
        [("DefMemPerNode", "UNLIMITED"), ("MaxMemPerNode", "UNLIMITED")],
    ]
    return _layout(lines, oneliner)


# scontrol's reservation keys (case-insensitive) and the body field each sets.
RESERVATION_KEYS = {"reservationname": "name", "reservation": "name", "starttime": "start_time",
                    "endtime": "end_time", "duration": "duration_s", "nodes": "nodes",
                    "nodecnt": "node_count", "nodecount": "node_count", "users": "users",
                    "accounts": "accounts", "flags": "flags", "partitionname": "partition",
                    "partition": "partition"}
_RESERVATION_KEY_NAMES = ("ReservationName, StartTime, EndTime, Duration, Nodes, NodeCnt, Users, "
                          "Accounts, Flags, PartitionName")


def parse_reservation(args: list[str], now: float) -> tuple[str, dict]:
    """``ReservationName=maint StartTime=now Duration=2:00:00 ...`` to (name, request body)."""
    from shoal.model.timefmt import TimeFormatError, parse_begin_time, parse_time_limit

    if args and show_entity(args[0]) == "reservation" and "=" not in args[0]:
        args = args[1:]  # `scontrol create reservation Key=Value ...`
    name = None
    body: dict[str, Any] = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        field = RESERVATION_KEYS.get(key.lower())
        if not eq or field is None:
            raise UsageError(f"Invalid reservation parameter: {arg} (expected Key=Value with keys "
                             f"{_RESERVATION_KEY_NAMES})")
        if field == "name":
            name = value
        elif field in ("start_time", "end_time"):
            try:
                body[field] = parse_begin_time(value, now)
            except TimeFormatError:
                raise UsageError(f"Invalid {key}={value}: expected now, now+1hour, HH:MM or "
                                 f"YYYY-MM-DDTHH:MM:SS") from None
        elif field == "duration_s":
            try:
                body[field] = parse_time_limit(value)
            except TimeFormatError:
                raise UsageError(f"Invalid {key}={value}: expected minutes or [days-]hours:minutes:seconds, "
                                 f"e.g. 2:00:00") from None
            if not body[field]:
                raise UsageError(f"Invalid {key}={value}: a reservation needs a duration of at least a minute")
        elif field == "node_count":
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"Invalid {key}={value}: expected a node count like 2")
            body[field] = int(value)
        elif field in ("users", "accounts", "flags"):
            body[field] = [v.strip() for v in value.split(",") if v.strip()]
        else:
            body[field] = value
    if not name:
        raise UsageError("a reservation needs ReservationName=NAME first, e.g. 'scontrol create "
                         "reservation ReservationName=maint StartTime=now Duration=2:00:00 "
                         "Nodes=node[01-02] Users=root Flags=MAINT'")
    return name, body


def render_reservation(resv: Mapping[str, Any], oneliner: bool = False) -> str:
    """``scontrol show reservation``: one reservation in Slurm's key order."""
    from shoal.slurm.fmt import format_hms
    from shoal.model.timefmt import format_timestamp

    def names(key: str) -> str:
        return ",".join(resv.get(key) or ()) or "(null)"

    lines = [
        [("ReservationName", resv["name"]), ("StartTime", format_timestamp(resv["start_time"])),
         ("EndTime", format_timestamp(resv["end_time"])), ("Duration", format_hms(resv["duration_s"]))],
        [("Nodes", resv.get("nodes") or "(null)"), ("NodeCnt", resv.get("node_count") or 0),
         ("CoreCnt", resv.get("core_count") or 0), ("Features", "(null)"),
         ("PartitionName", _text(resv.get("partition"))), ("Flags", ",".join(resv.get("flags") or ()))],
        [("TRES", f"cpu={resv.get('core_count') or 0}")],
        [("Users", names("users")), ("Groups", "(null)"), ("Accounts", names("accounts")),
         ("Licenses", "(null)"), ("State", resv.get("state") or "INACTIVE"), ("BurstBuffer", "(null)")],
        [("MaxStartDelay", "(null)")],
    ]
    return _layout(lines, oneliner)


def show_entity(word: str) -> str | None:
    """The entity a `scontrol show WORD` names ("hostname" -> "hostnames"), or None."""
    word = word.lower()
    for entity, full, shortest in _SHOW_PREFIXES:
        if len(word) >= shortest and full.startswith(word):
            return entity
    return None


def show_hostnames(args: list[str]) -> str:
    """One name per line, from the argument or $SLURM_JOB_NODELIST; never asks the server."""
    text = args[0] if args else os.environ.get("SLURM_JOB_NODELIST", "")
    if not text:
        raise UsageError("no hostlist given and SLURM_JOB_NODELIST is not set "
                         "(usage: scontrol show hostnames [HOSTLIST])")
    return "".join(name + "\n" for name in expand(text))


def show_hostlist(args: list[str]) -> str:
    if not args:
        raise UsageError("no host names given (usage: scontrol show hostlist NAME[,NAME...])")
    names: list[str] = []
    for arg in args:
        names.extend(expand(arg))
    return compress(names) + "\n"


def parse_update(args: list[str]) -> tuple[str, str, dict]:
    """``JobId=12 TimeLimit=2:00:00`` to (``job``, ``12``, PATCH body); keys are case-insensitive."""
    from shoal.model.timefmt import parse_time_limit

    pairs = []
    words = iter(args)
    for arg in words:
        key, eq, value = arg.partition("=")
        if not eq:  # Slurm takes `Key Value` as well as `Key=Value`
            value = next(words, None)
            if value is None:
                raise UsageError(f"update expects Key=Value pairs, got '{arg}'")
        pairs.append((key.lower(), value))
    if not pairs or pairs[0][0] not in ("jobid", "nodename", "partitionname"):
        raise UsageError("update needs JobId=ID, NodeName=HOSTLIST or PartitionName=NAME first, "
                         "e.g. 'scontrol update JobId=12 TimeLimit=2:00:00'")
    if pairs[0][0] == "partitionname":
        return "partition", pairs[0][1], _partition_update(pairs[1:])
    kind, target = ("job" if pairs[0][0] == "jobid" else "node"), pairs[0][1]
    body: dict[str, Any] = {}
    for key, value in pairs[1:]:
        if kind == "job":
            if key not in JOB_UPDATE_KEYS:
                raise UsageError(f"Update of this parameter is not supported: {key} "
                                 f"(expected TimeLimit, JobName, Partition, NumNodes, Comment or ArrayTaskThrottle)")
            if key == "timelimit":
                body["time_limit_s"] = parse_time_limit(value)
            elif key in ("numnodes", "arraytaskthrottle"):
                if not value.isdigit():
                    raise UsageError(f"{'NumNodes' if key == 'numnodes' else 'ArrayTaskThrottle'} must be a "
                                     f"number, got '{value}'")
                body[JOB_UPDATE_KEYS[key]] = int(value)
            else:
                body[JOB_UPDATE_KEYS[key]] = value
        elif key == "state":
            state = value.upper()
            if state not in NODE_STATES:
                raise UsageError(f"Invalid node state specified: {value} (expected {', '.join(NODE_STATES)})")
            body["state"] = {"UNDRAIN": "RESUME", "IDLE": "RESUME"}.get(state, state)
        elif key == "reason":
            body["reason"] = value
        else:
            raise UsageError(f"Update of this parameter is not supported: {key} (expected State or Reason)")
    if not body:
        raise UsageError(f"nothing to update for {pairs[0][0]}={target}")
    if kind == "node" and body.get("state") in ("DRAIN", "DOWN") and not body.get("reason"):
        raise UsageError("You must specify a reason when DOWNING or DRAINING a node. Request denied")
    return kind, target, body


PARTITION_UPDATE_KEYS = {"state": "state", "maxtime": "max_time_s", "defaulttime": "default_time_s",
                         "maxnodes": "max_nodes", "default": "default", "priorityjobfactor": "priority_job_factor",
                         "nodes": "nodes"}


def _partition_update(pairs: list[tuple[str, str]]) -> dict:
    """The PATCH body of ``scontrol update PartitionName=P Key=Value...``, checked as Slurm's
    scontrol checks it before asking (its messages)."""
    from shoal.model.timefmt import TimeFormatError, parse_time_limit

    body: dict[str, Any] = {}
    for key, value in pairs:
        field = PARTITION_UPDATE_KEYS.get(key)
        if field is None:
            raise UsageError(f"Update of this parameter is not supported: {key}={value} (expected State, MaxTime, "
                             "DefaultTime, MaxNodes, Default, PriorityJobFactor or Nodes). Request aborted")
        if field == "state":
            if value.upper() not in ("UP", "DOWN", "DRAIN", "INACTIVE"):
                raise UsageError(f"Invalid input: State={value} (acceptable State values are UP, DOWN, DRAIN "
                                 "and INACTIVE)")
            body[field] = value.upper()
        elif field in ("max_time_s", "default_time_s"):
            try:
                body[field] = parse_time_limit(value)
            except TimeFormatError:
                raise UsageError(f"Invalid input {'MaxTime' if key == 'maxtime' else 'DefaultTime'}={value}") from None
        elif field in ("max_nodes", "priority_job_factor"):
            if value.upper() in ("UNLIMITED", "INFINITE") and field == "max_nodes":
                body[field] = None
            elif value.isdigit():
                body[field] = int(value)
            else:
                raise UsageError(f"Invalid input: {'MaxNodes' if field == 'max_nodes' else 'PriorityJobFactor'}"
                                 f"={value} (expected a number)")
        elif field == "default":
            if value.upper() not in ("YES", "NO"):
                raise UsageError(f"Invalid input: Default={value} (expected YES or NO)")
            body[field] = value.upper() == "YES"
        else:
            body[field] = value
    if not body:
        raise UsageError("No changes specified")
    return body


def _job_ids(args: list[str]) -> list[str]:
    ids = [p for arg in args for p in arg.split(",") if p]
    if not ids:
        raise UsageError("no job id given (usage: scontrol hold|release|requeue JOBID[,JOBID...])")
    return ids


def write_batch_script(client, args: list[str]) -> int:
    """``write batch_script JOBID [FILE|-]``: the script's bytes as submitted, to FILE
    (``slurm-JOBID.sh`` by default) or standard output, as Slurm's scontrol writes them."""
    from shoal.api_client import ClientError

    if not args or not "batch_script".startswith(args[0].lower()) or len(args[0]) < 5 or not 2 <= len(args) <= 3:
        raise UsageError("usage: scontrol write batch_script JOBID [FILE|-]")
    job_id = args[1]
    if not job_id.isdigit():
        raise UsageError(f"Invalid job id specified: {job_id}")
    try:
        data = client.get_bytes(f"/shoal/v1/jobs/{job_id}/script")
    except ClientError as e:
        # slurm_perror's layout, as Slurm's scontrol prints this failure.
        print(f"job script retrieval failed: {e}", file=sys.stderr)
        return 1
    target = args[2] if len(args) == 3 else f"slurm-{job_id}.sh"
    if target == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    try:
        with open(target, "wb") as f:
            f.write(data)
    except OSError as e:
        print(f"failed to open file `{target}`: {e.strerror}", file=sys.stderr)
        return 1
    print(f"batch script for job {job_id} written to {target}")
    return 0


def _show(client, entity: str, args: list[str], options) -> str:
    import json
    import time

    now = time.time()
    if entity == "job":
        params: dict[str, Any] = {"all": "true"}
        if args:
            params["job_id"] = args[0]
        else:  # the listing keeps an ended job for MinJobAge, as Slurm's does (scripts poll it)
            params["since"] = now - MIN_JOB_AGE_S
        jobs = client.get("/shoal/v1/jobs", params)["jobs"]
        if args and not jobs:
            print(f"slurm_load_jobs error: {INVALID_JOB_ID}", file=sys.stderr)  # Slurm's words, no prefix
            raise SystemExit(1)
        if options.json:
            return json.dumps({"jobs": jobs}, indent=2) + "\n"
        from shoal.slurm.squeue import collapse_arrays

        jobs = collapse_arrays(jobs)  # a pending array is one record, ArrayTaskId=0-7, as in Slurm
        if not jobs:
            return "No jobs in the system\n"
        return "\n".join(render_job(j, now, options.oneliner) for j in jobs) + ("" if options.oneliner else "\n")
    if entity == "node":
        nodes = client.get("/shoal/v1/nodes")["nodes"]
        if args:
            wanted = set(expand(args[0]))
            nodes = [n for n in nodes if n["name"] in wanted]
            if not nodes:
                raise UsageError(f"Node {args[0]} not found")
        if options.json:
            return json.dumps({"nodes": nodes}, indent=2) + "\n"
        return "\n".join(render_node(n, options.oneliner) for n in nodes) + ("" if options.oneliner else "\n")
    if entity == "partition":
        parts = client.get("/shoal/v1/partitions")["partitions"]
        if args:
            parts = [p for p in parts if p["name"] == args[0]]
            if not parts:
                raise UsageError(f"Partition {args[0]} not found")
        if options.json:
            return json.dumps({"partitions": parts}, indent=2) + "\n"
        nodes = client.get("/shoal/v1/nodes")["nodes"]
        return "\n".join(render_partition(p, nodes, options.oneliner) for p in parts) + (
            "" if options.oneliner else "\n")
    if entity == "reservation":
        resvs = client.get("/shoal/v1/reservations")["reservations"]
        if args:
            resvs = [r for r in resvs if r["name"] == args[0]]
            if not resvs:
                raise UsageError(f"Reservation {args[0]} not found")
        if options.json:
            return json.dumps({"reservations": resvs}, indent=2) + "\n"
        if not resvs:
            return "No reservations in the system\n"
        return "\n".join(render_reservation(r, options.oneliner) for r in resvs) + (
            "" if options.oneliner else "\n")
    if entity == "step":
        return _show_steps(client, args, options)
    raise UsageError(f"unknown entity '{entity}'")  # show_config is handled by the caller


def _show_steps(client, args: list[str], options) -> str:
    """``scontrol show step(s) [JOBID[.STEP]]``: the running jobs' steps."""
    from shoal.slurm.fmt import format_hms
    from shoal.model.timefmt import format_timestamp

    job_id, _, step_id = (args[0] if args else "").partition(".")
    params: dict[str, Any] = {"state": "RUNNING"} if not job_id else {"job_id": job_id}
    jobs = client.get("/shoal/v1/jobs", params)["jobs"]
    steps = [(j, st) for j in jobs for st in j.get("steps") or []
             if st.get("state") == "RUNNING" and (not step_id or str(st.get("step_id")) == step_id)]
    if not steps:
        return "No job steps in the system\n"
    lines = []
    for job, step in steps:
        uid = _user_id(job.get("user")).partition("(")[2].rstrip(")") or "(null)"  # Slurm prints the number
        limit = job.get("time_limit_s")
        fields = [[("StepId", f"{job['job_id']}.{step.get('step_id')}"), ("UserId", uid),
                   ("StartTime", format_timestamp(step.get("start_time"))),
                   ("TimeLimit", format_hms(limit) if step.get("step_id") != "batch" else "UNLIMITED")],
                  [("State", step.get("state")), ("Partition", _text(job.get("partition"))),
                   ("NodeList", _text(step.get("nodelist")))],
                  [("Nodes", len(expand(step["nodelist"])) if step.get("nodelist") else 0),
                   ("Tasks", step.get("ntasks") or 1), ("Name", _text(step.get("name")))]]
        lines.append(_layout(fields, options.oneliner))
    return "\n".join(lines)


def _reservation(client, command: str, args: list[str]) -> int:
    """create / update / delete reservation (the server allows only admins)."""
    import time

    from shoal.api_client import quote

    if command != "create" and not args:
        raise UsageError(f"{command} needs ReservationName=NAME")
    if command == "delete":
        words = args[1:] if show_entity(args[0]) == "reservation" and "=" not in args[0] else args
        key, eq, value = (words[0] if words else "").partition("=")
        name = (value if RESERVATION_KEYS.get(key.lower()) == "name" else "") if eq else key
        if not name:
            raise UsageError("delete needs ReservationName=NAME, e.g. 'scontrol delete ReservationName=maint'")
        client.delete(f"/shoal/v1/reservations/{quote(name)}")
        return 0
    name, body = parse_reservation(args, time.time())
    if command == "create":
        client.post("/shoal/v1/reservations", {"name": name, **body})
        from shoal.slurm.fmt import emit

        emit(f"Reservation created: {name}\n")
    else:
        if not body:
            raise UsageError(f"nothing to update for ReservationName={name}")
        client.patch(f"/shoal/v1/reservations/{quote(name)}", body)
    return 0


def show_config(server: str, settings: Mapping[str, str], now: float) -> str:
    """``scontrol show config``: the server's settings under Slurm's names (GET /shoal/v1/config),
    with the controllers this client knows and the version, sorted as Slurm sorts them."""
    import time

    from shoal.slurm import SLURM_VERSION
    from shoal import __version__ as version

    hosts = {f"SlurmctldHost[{i}]": url.strip() for i, url in enumerate(server.split(",")) if url.strip()}
    rows = {**settings, **hosts, "SLURM_VERSION": f"{SLURM_VERSION} (shoal {version})"}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now))
    return f"Configuration data as of {stamp}\n" + "".join(
        f"{k:<23} = {rows[k]}\n" for k in sorted(rows, key=str.lower))


def render_ping(answers: list[tuple[str, Mapping[str, Any] | None]]) -> tuple[str, int]:
    """``scontrol ping`` in Slurm's words, from each configured server's ``/shoal/v1/leader``
    answer (None: it did not answer): ``Slurmctld(primary) at HOST is UP``, then the
    backups. Shoal has no fixed primary (whichever server wins the election leads, and a
    restarted one comes back as a backup), so *primary* names the leader now. Exit code 1
    when no leader answers."""
    from shoal.api_client import split_url

    leaders = [(a["self"]["term"] or 0, i) for i, (_, a) in enumerate(answers)
               if a is not None and a["self"]["role"] == "leader"]
    first = max(leaders)[1] if leaders else 0
    order = [first] + [i for i in range(len(answers)) if i != first]
    lines = []
    for n, i in enumerate(order):
        url, answer = answers[i]
        _, host, port, _ = split_url(url if "://" in url else "http://" + url)
        where = f"{host}:{port}" if port else host
        mode = "primary" if n == 0 else "backup" if len(order) == 2 else f"backup{n}"
        up = answer is not None and (n > 0 or bool(leaders))
        lines.append(f"Slurmctld({mode}) at {where} is {'UP' if up else 'DOWN'}\n")
    return "".join(lines), 0 if leaders else 1


def ping(servers: str, token: str | None) -> tuple[str, int]:
    from shoal.api_client import Client, ClientError

    answers: list[tuple[str, Any]] = []
    for url in [u.strip() for u in servers.split(",") if u.strip()]:
        try:
            answers.append((url, Client(url, token, timeout=5).get("/shoal/v1/leader")))
        except ClientError:
            answers.append((url, None))
    return render_ping(answers)


def parse_args(argv: list[str] | None):
    from shoal.slurm.fmt import argument_parser

    p = argument_parser("scontrol", "Show and change jobs, nodes and partitions, as Slurm's scontrol.")
    p.add_argument("-o", "--oneliner", action="store_true", help="one line per record")
    p.add_argument("--json", action="store_true", help="JSON output for show job/node/partition")
    p.add_argument("-d", "--details", action="store_true", help="accepted for compatibility")
    p.add_argument("-a", "--all", action="store_true", help="accepted: Shoal has no hidden partitions")
    p.add_argument("-F", "--future", action="store_true", help="accepted: Shoal has no FUTURE nodes")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--help", action="help", help="show this help and exit")
    p.add_argument("command", nargs="?", help=f"one of {', '.join(COMMANDS)}")
    p.add_argument("args", nargs="*", help="the command's arguments")
    # Options may come anywhere, as in Slurm's `scontrol show job -d -o 12`.
    return p.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    # Job scripts call these in tight loops: no argparse, no client, no server.
    fast = show_entity(args[1]) if len(args) >= 2 and args[0] == "show" else None
    if fast in ("hostnames", "hostlist"):
        try:
            out = show_hostnames(args[2:]) if fast == "hostnames" else show_hostlist(args[2:])
        except (UsageError, HostlistError) as e:
            _fail(str(e))
        sys.stdout.write(out)
        return 0
    from shoal.api_client import Client, ClientError
    from shoal.slurm.fmt import emit

    try:
        options = parse_args(args)
        command = (options.command or "").lower()
        rest = options.args
        if not command:
            raise UsageError(f"no command given (expected one of {', '.join(COMMANDS)})")
        if command not in COMMANDS:
            print(f"invalid keyword: {options.command}", file=sys.stderr)  # Slurm's words, no prefix
            return 1
        if command == "show":
            entity = show_entity(rest[0]) if rest else None
            if entity is None:
                got = f"'{rest[0]}'" if rest else "nothing"
                raise UsageError(f"show expects one of {', '.join(SHOW_ENTITIES)}, got {got}")
            if entity in ("hostnames", "hostlist"):
                emit(show_hostnames(rest[1:]) if entity == "hostnames" else show_hostlist(rest[1:]))
                return 0
            if entity == "config":
                import time

                from shoal.api_client import load_config

                emit(show_config(load_config()["server"], Client.from_config().get("/shoal/v1/config")["config"],
                                 time.time()))
                return 0
            emit(_show(Client.from_config(), entity, rest[1:], options))
            return 0
        if command == "version":
            from shoal.slurm import version_line

            emit(version_line() + "\n")
            return 0
        if command == "ping":
            from shoal.api_client import load_config

            conf = load_config()
            out, code = ping(conf["server"], conf.get("token"))
            emit(out)
            return code
        if command == "write":
            return write_batch_script(Client.from_config(), rest)
        if command in ("create", "delete") or (
                command == "update" and rest and rest[0].lower().startswith("reservation")):
            return _reservation(Client.from_config(), command, rest)
        if command == "update":
            kind, target, body = parse_update(rest)
            client = Client.from_config()
            if kind == "job":
                client.patch(f"/shoal/v1/jobs/{target}", body)
            elif kind == "partition":
                try:
                    client.patch(f"/shoal/v1/partitions/{target}", body)
                except ClientError as e:  # Slurm's layout for what the controller refused
                    print(f"slurm_update error: {e}", file=sys.stderr)
                    return 1
            else:
                for name in expand(target):
                    client.patch(f"/shoal/v1/nodes/{name}", body)
            return 0
        ids = _job_ids(rest)
        client = Client.from_config()
        for job_id in ids:
            client.post(f"/shoal/v1/jobs/{job_id}/{command}")
        return 0
    except (UsageError, HostlistError, ClientError, ValueError) as e:
        _fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
