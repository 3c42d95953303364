"""Job services: submit (validate, normalise, store), query, cancel, hold, update, finish.

Services own the transaction boundary; they take a Session and never commit themselves
except where the function says so. State changes go through `finish` and `requeue` so the
job state machine lives in one place (shoal.model.job).
"""

from __future__ import annotations

import math
import signal as signals
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shoal.model.arrays import ArraySpecError, format_array, parse_array
from shoal.model.dependency import DependencyError, parse_dependency
from shoal.model.filename import expand_pattern
from shoal.model.hostlist import HostlistError, compress, expand
from shoal.model.accounting import DEFAULT_QOS, QOS
from shoal.model.job import MAX_SCRIPT_BYTES, JobState, check_transition, script_sha256, script_too_large
from shoal.model.resources import Allocation, ResourceRequest
from shoal.model.snapshot import NodeInfo, Partition
from shoal.sched import cycle
from shoal.sched.fairshare import AccountTree
from shoal.sched.preempt import outcome as preempt_outcome
from shoal.sched.qos import max_submit_error
from shoal.server.auth import Principal
from shoal.server.schemas import JobSubmit
from shoal.store.changes import insert_rows
from shoal.store.models import CleanupRow, JobRow, StepRow

DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"


class JobError(Exception):
    """A request about a job that cannot be honoured. ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
        self.message = message


def pick_partition(partitions: tuple[Partition, ...], name: str | None) -> Partition:
    if name:
        for p in partitions:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in partitions)
        raise JobError(f"invalid partition specified: {name} (partitions: {known})")
    for p in partitions:
        if p.default:
            return p
    return partitions[0]


def normalise(body: JobSubmit, partition: Partition, def_mem_per_cpu_mb: int) -> tuple[ResourceRequest, int | None]:
    """Turn the user's options into the scheduler's per-node gang demand, as Slurm derives it."""
    n, t, tpn = body.nodes, body.ntasks, body.ntasks_per_node
    if n is None:
        n = math.ceil(t / tpn) if (t and tpn) else 1
    if t is None:
        t = n * tpn if tpn else n
    if tpn is not None and t > n * tpn:
        raise JobError(f"--ntasks={t} does not fit --nodes={n} with --ntasks-per-node={tpn}")
    if t < n:
        raise JobError(f"--ntasks={t} is fewer than --nodes={n}: every node needs at least one task")
    tasks_per_node = tpn if tpn is not None else math.ceil(t / n)
    cpt = body.cpus_per_task or 1
    cpus_per_node = tasks_per_node * cpt

    gpu_sources = [x for x in (body.gpus, body.gpus_per_node, body.gpus_per_task) if x]
    if len(gpu_sources) > 1:
        raise JobError("use only one of --gpus, --gpus-per-node and --gpus-per-task")
    if body.gpus_per_node:
        gpn = body.gpus_per_node
    elif body.gpus:
        gpn = math.ceil(body.gpus / n)
    elif body.gpus_per_task:
        gpn = body.gpus_per_task * tasks_per_node
    else:
        gpn = 0

    if body.mem_per_node_mb is not None and body.mem_per_cpu_mb is not None:
        raise JobError("--mem and --mem-per-cpu are mutually exclusive")
    if body.mem_per_node_mb is not None:
        mem = body.mem_per_node_mb
    elif body.mem_per_cpu_mb is not None:
        mem = body.mem_per_cpu_mb * cpus_per_node
    else:
        mem = def_mem_per_cpu_mb * cpus_per_node
    if body.exclusive and body.mem_per_node_mb is None and body.mem_per_cpu_mb is None:
        mem = 0  # an exclusive job owns the node's memory too

    features: tuple[str, ...] = ()
    if body.constraint:
        if "|" in body.constraint or "[" in body.constraint:
            raise JobError("--constraint supports features joined by '&' or ',' (all required); '|' and '[...]' are not supported")
        features = tuple(f.strip() for f in body.constraint.replace("&", ",").split(",") if f.strip())
    try:
        nodelist = tuple(expand(body.nodelist)) if body.nodelist else ()
        exclude = tuple(expand(body.exclude)) if body.exclude else ()
    except HostlistError as e:
        raise JobError(f"invalid --nodelist/--exclude: {e}") from None
    if len(nodelist) > n:
        n = len(nodelist)  # Slurm raises the node count to cover the requested nodes

    if body.time_limit_s == -1:  # UNLIMITED: as long as the partition allows
        time_limit = partition.max_time_s
    else:
        time_limit = body.time_limit_s or partition.default_time_s
    if time_limit is not None and partition.max_time_s is not None and time_limit > partition.max_time_s:
        from shoal.model.timefmt import format_duration

        raise JobError(
            f"requested time limit {format_duration(time_limit)} exceeds the maximum "
            f"{format_duration(partition.max_time_s)} of partition {partition.name}"
        )
    req = ResourceRequest(
        nodes=n,
        ntasks=t,
        ntasks_per_node=tpn,
        cpus_per_task=cpt,
        mem_per_node_mb=mem,
        gpus_per_node=gpn,
        gpu_type=body.gpu_type,
        exclusive=body.exclusive,
        features=features,
        nodelist=nodelist,
        exclude=exclude,
    )
    return req, time_limit


def request_to_json(req: ResourceRequest) -> dict:
    return {
        "nodes": req.nodes, "ntasks": req.ntasks, "ntasks_per_node": req.ntasks_per_node,
        "cpus_per_task": req.cpus_per_task, "mem_per_node_mb": req.mem_per_node_mb,
        "gpus_per_node": req.gpus_per_node, "gpu_type": req.gpu_type, "exclusive": req.exclusive,
        "features": list(req.features), "nodelist": list(req.nodelist), "exclude": list(req.exclude),
    }


def request_from_json(d: dict) -> ResourceRequest:
    return ResourceRequest(
        nodes=d["nodes"], ntasks=d["ntasks"], ntasks_per_node=d.get("ntasks_per_node"),
        cpus_per_task=d["cpus_per_task"], mem_per_node_mb=d["mem_per_node_mb"],
        gpus_per_node=d["gpus_per_node"], gpu_type=d.get("gpu_type"), exclusive=d["exclusive"],
        features=tuple(d.get("features", ())), nodelist=tuple(d.get("nodelist", ())),
        exclude=tuple(d.get("exclude", ())),
    )


def parse_signal(value: str | int | None) -> int | None:
    """'USR1', 'SIGUSR1', '10' or 10 -> 10."""
    if value is None or value == "":
        return None
    if isinstance(value, int) or str(value).isdigit():
        num = int(value)
        try:
            signals.Signals(num)
        except ValueError:
            raise JobError(f"invalid signal number: {num}") from None
        return num
    name = str(value).upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise JobError(f"invalid signal name: {value}") from None


def submit(session: Session, principal: Principal, body: JobSubmit, *, partitions,
           members: Callable[[Partition], Sequence[NodeInfo]], now: float, max_array_size: int,
           def_mem_per_cpu_mb: int, feasible,
           accounts: AccountTree | None = None, qos: Mapping[str, QOS] | None = None) -> dict:
    """Validate and store a submission (one row per array task). The caller commits.

    With an account tree configured the job must charge an account the user belongs to
    (its default when none is given); the QOS must exist (``normal`` by default), its
    MaxWall becomes the time limit of a job without one, and MaxSubmitJobsPerUser is
    checked here, as Slurm does.
    """
    if principal.role == "job":
        raise JobError("a job credential cannot submit new jobs", 403)
    if body.script is None and not body.interactive:
        raise JobError("a batch job needs a script (or --wrap)")
    if body.script is not None and not body.script.startswith("#!"):
        raise JobError("this does not look like a batch script: the first line must start with #! "
                       "followed by the path to an interpreter, e.g. #!/bin/sh")
    digest = checked_script_digest(body.script, body.script_sha256)
    if not body.workdir.startswith("/"):
        raise JobError(f"workdir must be an absolute path, not {body.workdir!r}")
    partition = pick_partition(partitions, body.partition)
    if partition.state in ("DRAIN", "INACTIVE"):  # DOWN: queued, pending with reason PartitionDown
        raise JobError("Required partition not available (inactive or drain)")
    req, time_limit = normalise(body, partition, def_mem_per_cpu_mb)
    on = members(partition)
    reason = feasible(req, partition, on, time_limit_s=time_limit) if on else None
    if reason:
        raise JobError(f"Requested node configuration is not available: {reason}")
    if body.container is not None:
        _check_container_runtime(on)
    deps, dep_any = _dependencies(session, body)
    task_ids, throttle = _array_tasks(body, max_array_size)
    signal_spec = None
    if body.signal:
        signal_spec = _parse_signal_option(body.signal)
    account = _resolve_account(accounts, principal.user, body.account)
    reservation = None
    if body.reservation:
        from shoal.server import reservations  # it imports this module's JobError

        reservation = reservations.check_job(session, body.reservation, principal.user, account, now)
    job_qos = _resolve_qos(qos, body.qos)
    if job_qos is not None:
        if time_limit is None and job_qos.max_wall_s is not None:
            time_limit = job_qos.max_wall_s
        if job_qos.max_submit_per_user is not None:
            queued = session.scalar(select(func.count()).select_from(JobRow).where(
                JobRow.user == principal.user,
                JobRow.state.in_(ACTIVE),
                func.coalesce(JobRow.spec["qos"].as_string(), DEFAULT_QOS) == job_qos.name)) or 0
            error = max_submit_error(job_qos, principal.user, queued,
                                     len(task_ids) if task_ids is not None else 1)
            if error:
                raise JobError(error)
    name = body.name or ("interactive" if body.interactive else "sbatch")
    spec = _spec(body, digest, task_ids, signal_spec, deps, dep_any, account, job_qos)
    common = dict(
        name=name, user=principal.user, partition=partition.name, state=JobState.PENDING.value,
        # A held job says so from the start, as Slurm's does, not from the next pass.
        reason="JobHeldUser" if body.hold else "BeginTime" if (body.begin_time or 0) > now else "None",
        held=body.hold, interactive=body.interactive,
        requeue=body.requeue,
        submit_time=now, begin_time=body.begin_time, time_limit_s=time_limit,
        request=request_to_json(req), spec=spec, workdir=body.workdir, dependency=body.dependency,
        comment=body.comment, reservation=reservation,
    )
    return _insert(session, common, task_ids, throttle)


def _dependencies(session: Session, body: JobSubmit) -> tuple[tuple, bool]:
    """--dependency parsed, every job it names known."""
    if not body.dependency:
        return (), False
    try:
        deps, dep_any = parse_dependency(body.dependency)
    except DependencyError as e:
        raise JobError(f"invalid --dependency: {e}") from None
    wanted = {j for d in deps for j in d.job_ids}
    if wanted:
        found = set(session.scalars(select(JobRow.id).where(JobRow.id.in_(wanted))))
        missing = sorted(wanted - found)
        if missing:
            raise JobError(f"Job dependency problem: no such job {', '.join(map(str, missing))}")
    return deps, dep_any


def _array_tasks(body: JobSubmit, max_array_size: int) -> tuple[list[int] | None, int | None]:
    """--array's task ids and throttle (None, None: not an array)."""
    if not body.array:
        return None, None
    try:
        task_ids, throttle = parse_array(body.array, max_size=max_array_size)
    except ArraySpecError as e:
        raise JobError(f"invalid --array: {e}") from None
    if body.interactive:
        raise JobError("--array is for batch jobs only")
    return task_ids, throttle


def _spec(body: JobSubmit, digest, task_ids: list[int] | None, signal_spec, deps, dep_any: bool,
          account, job_qos) -> dict:
    """The job's spec column: what it runs and how, as submitted."""
    spec = {
        "script": body.script,
        "script_sha256": digest,
        "argv": body.argv,
        "environment": body.environment,
        "stdout": body.stdout or (DEFAULT_ARRAY_OUTPUT if task_ids is not None else DEFAULT_OUTPUT),
        "stderr": body.stderr,
        "stdin": body.stdin,
        "open_mode": body.open_mode or "truncate",
        "signal": signal_spec,
        "dependency_any": dep_any,
        "dependencies": [{"kind": d.kind, "job_ids": list(d.job_ids)} for d in deps],
        "command": body.environment.get("SHOAL_SUBMIT_COMMAND") or ("srun" if body.interactive else "(script)"),
        "account": account,
        "qos": job_qos.name if job_qos is not None else body.qos,
        "time_min_s": body.time_min_s,
        **({"container": body.container} if body.container is not None else {}),
        "recorded_options": body.recorded_options,
    }
    if task_ids is not None:
        spec["array_env"] = array_env(task_ids)
    return spec


def _insert(session: Session, common: dict, task_ids: list[int] | None, throttle: int | None) -> dict:
    """The job's row, or one per array task; the submit's answer."""
    # Core INSERTs (insert_rows): the version column starts at 1, as the ORM's would.
    if task_ids is None:
        first = insert_rows(session, JobRow, [{**common, "version": 1}])[0]
        return {"job_id": first, "array_job_id": None, "array_task_ids": None}
    # The first task's id names the array: it goes in first, then the rest in one statement.
    first = insert_rows(session, JobRow, [{**common, "version": 1, "array_task_id": task_ids[0],
                                           "array_throttle": throttle}])[0]
    # On the connection: the change counts know the row from its INSERT, and a session-level
    # UPDATE counted as one that may change any job, so every array made the scheduler and
    # squeue's view read the whole queue again.
    session.connection().execute(update(JobRow.__table__).where(JobRow.id == first).values(array_job_id=first))
    rest = [{**common, "version": 1, "array_task_id": tid, "array_throttle": throttle, "array_job_id": first}
            for tid in task_ids[1:]]
    if rest:
        insert_rows(session, JobRow, rest)
    return {"job_id": first, "array_job_id": first, "array_task_ids": task_ids}


def _check_container_runtime(members: Sequence[NodeInfo]) -> None:
    """--container-image needs a node with a container runtime (its agent's --runtime)."""
    from shoal.model.container import RUNTIME_LABEL

    if not any(n.labels.get(RUNTIME_LABEL) for n in members):
        raise JobError("--container-image: no node of this partition has a container runtime "
                       "(start its agents with --runtime podman, enroot, apptainer or docker)")


def _resolve_account(tree: AccountTree | None, user: str, account: str | None) -> str | None:
    """The account a job charges: as given, else the user's default; checked against the tree."""
    if tree is None or tree.empty:
        return account
    assoc = tree.association(user, account)
    if assoc is None:
        if account is None:
            raise JobError(f"Invalid account or account/partition combination specified: user {user} "
                           f"belongs to no account (ask an administrator to add them to one)")
        mine = sorted({a.name for a in tree.accounts.values() if tree.has(a.name, user)}
                      | ({"root"} if tree.has("root", user) else set()))
        raise JobError(f"Invalid account or account/partition combination specified: user {user} "
                       f"is not in account {account} (their accounts: {', '.join(mine) or 'none'})")
    return assoc[0]


def _resolve_qos(table: Mapping[str, QOS] | None, name: str | None) -> QOS | None:
    if table is None:
        return None
    found = table.get(name or DEFAULT_QOS)
    if found is None:
        raise JobError(f"Invalid qos specification: {name} (QOS: {', '.join(sorted(table))})")
    return found


def _parse_signal_option(text: str) -> dict:
    """--signal=[{R|B}:]<sig>[@sig_time] -> {"signal": n, "time": s, "batch_only": bool}."""
    batch_only = False
    body = text
    if ":" in body:
        flags, _, body = body.partition(":")
        if not set(flags.upper()) <= {"B", "R"}:
            raise JobError(f"invalid --signal {text!r}: expected [{{R|B}}:]<sig>[@<secs>]")
        batch_only = "B" in flags.upper()
    sig_s, _, at = body.partition("@")
    try:
        when = int(at) if at else 60
    except ValueError:
        raise JobError(f"invalid --signal {text!r}: the time after @ must be whole seconds") from None
    return {"signal": parse_signal(sig_s), "time": when, "batch_only": batch_only}


# ---------------------------------------------------------------- state changes


def finish(session: Session, row: JobRow, state: JobState, now: float, *, exit_code: int | None = None,
           signal: int | None = None, reason: str | None = None, kill_signal: str = "TERM",
           skip_nodes: frozenset[str] = frozenset()) -> None:
    """End a job's run: record the state, and hold its resources as cleanups until its processes are gone."""
    current = JobState(row.state)
    check_transition(current, state)
    _count_end(session, row, state, now)
    row.state = state.value
    row.end_time = now
    if exit_code is not None:
        row.exit_code = exit_code
    if signal is not None:
        row.signal = signal
    if reason is not None:
        row.reason = reason
    if current is JobState.RUNNING:
        _hold_for_cleanup(session, row, now, kill_signal, skip_nodes)


def requeue(session: Session, row: JobRow, now: float, *, via: JobState, reason: str,
            skip_nodes: frozenset[str] = frozenset()) -> None:
    """Put a running job back in the queue (NODE_FAIL with --requeue, scontrol requeue)."""
    current = JobState(row.state)
    check_transition(current, via)
    if current is JobState.RUNNING:
        _count_end(session, row, via, now)
        _hold_for_cleanup(session, row, now, "TERM", skip_nodes)
    check_transition(via, JobState.PENDING)
    row.state = JobState.PENDING.value
    row.restart_count += 1
    row.reason = reason
    row.allocation = None
    row.batch_host = None
    row.start_time = None
    row.end_time = None
    row.exit_code = None
    row.signal = None
    row.begin_time = now  # Slurm holds a requeued job back briefly; BeginTime shows why it waits


def preemption_grace_s(row: JobRow, cap_s: float) -> float:
    """How long a preempted job runs on after its --signal: the signal's @secs, at most
    ``cap_s`` (GraceTime); 0 when it asked for no signal (SIGTERM, then SIGKILL after KillWait)."""
    sig = row.spec.get("signal")
    return cycle.preemption_grace_s(sig["time"] if sig else None, cap_s)


def end_preempted(session: Session, row: JobRow, now: float, qos: Mapping[str, QOS], *,
                  exit_code: int | None = None, signal: int | None = None) -> str:
    """A preempted job's grace is over, or its processes exited first: requeue it (restart
    count + 1) or end it PREEMPTED, as its QOS's preempt_mode says. Returns which."""
    how = preempt_outcome(qos.get(row.spec.get("qos") or DEFAULT_QOS),
                          requeueable=row.requeue and not row.interactive)
    if how == "requeue":
        requeue(session, row, now, via=JobState.PREEMPTED, reason="BeginTime")
    else:
        finish(session, row, JobState.PREEMPTED, now, exit_code=exit_code, signal=signal,
               reason="Preempted")
    return how


def _count_end(session: Session, row: JobRow, state: JobState, now: float) -> None:
    """Tell the server's metrics (shoal.server.metrics) that a run ends, once the session commits."""
    metrics = session.info.get("server_metrics")
    if metrics is not None:
        metrics.run_ended(session, row, state.value, now)


def _hold_for_cleanup(session: Session, row: JobRow, now: float, kill_signal: str, skip_nodes) -> None:
    alloc = Allocation.from_json(row.allocation)
    for node, a in alloc.nodes:
        if node in skip_nodes:
            continue
        session.add(CleanupRow(job_id=row.id, run=row.restart_count, node=node, cpus=a.cpus,
                                 memory_mb=a.memory_mb, gpus=list(a.gpus), exclusive=alloc.exclusive,
                                 since=now, signal=kill_signal))


def cancel(session: Session, row: JobRow, principal: Principal, now: float) -> bool:
    """scancel: pending jobs end at once; running ones end and their processes are killed."""
    check_owner(row, principal)
    state = JobState(row.state)
    if state.terminal:
        return False
    # The reason stays what it was (JobHeldUser, Priority...), as Slurm's scontrol shows it.
    finish(session, row, JobState.CANCELLED, now)
    return True


def check_owner(row: JobRow, principal: Principal) -> None:
    """May this caller change the job: its user, its own job credential, an operator or admin."""
    if principal.is_operator:
        return
    if principal.role == "job":
        if principal.job_id == row.id:
            return
    elif principal.role == "read-only":
        raise JobError("Access/permission denied: a read-only token cannot change jobs", 403)
    elif principal.user == row.user:
        return
    raise JobError(f"Access/permission denied: job {row.id} belongs to {row.user}", 403)


# ---------------------------------------------------------------- views


def job_run_key(job_id: int, run: int) -> str:
    return f"{job_id}.{run}"


def output_path(row: JobRow, pattern: str | None, node: str | None) -> str | None:
    if not pattern:
        return None
    path = expand_pattern(
        pattern, job_id=row.id, job_name=row.name, user=row.user, node=node or "",
        array_job_id=row.array_job_id, array_task_id=row.array_task_id,
    )
    return path if path.startswith("/") else f"{row.workdir.rstrip('/')}/{path}"


def checked_script_digest(script: str | None, sent: str | None) -> str | None:
    """The SHA-256 of a script's bytes, checked against the one its submitter sent (if any):
    a script changed on the way is refused, never run."""
    if script is None:
        return None
    try:
        # Non-UTF-8 bytes arrive as lone surrogates (the submitter's surrogateescape).
        data = script.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise JobError("script: not valid UTF-8 text (bytes that are not UTF-8 must come as "
                       "surrogateescape's U+DC80..U+DCFF)", 422) from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise JobError(script_too_large(len(data)), 413)
    digest = script_sha256(data)
    if sent is not None and sent != digest:
        raise JobError(f"script: its SHA-256 is {digest}, not the {sent} its submitter read: "
                       f"it was changed on the way; nothing was submitted", 422)
    return digest


def _usage_of(row: JobRow) -> dict:
    """The batch run's cgroup usage (sacct's MaxRSS, TotalCPU...), if its current run reported one."""
    usage = row.usage
    if not usage or usage.get("run") != row.restart_count:
        return {}  # none, or an earlier run's (before a requeue)
    out = {k: v for k, v in usage.items() if k != "run" and v is not None}
    if out.get("max_rss_kb") is not None:
        out["max_rss_node"] = row.batch_host
    return out


USAGE_KEYS = ("max_rss_kb", "cpu_s", "user_cpu_s", "system_cpu_s")


def record_step_usage(s, row: JobRow, node: str, ev) -> None:
    """An agent's report of what an srun step used on its node (its step cgroup there), kept
    per node on the step's row; a report about an earlier run's step is dropped."""
    st = s.get(StepRow, (row.id, ev.step_id))
    if st is None or st.run != ev.run or ev.max_rss_kb is None:
        return
    st.usage = {**(st.usage or {}), node: {k: getattr(ev, k) for k in USAGE_KEYS}}


def step_usage(per_node: dict | None) -> dict:
    """A step's usage over its nodes, as sacct shows a step's: the largest node's peak memory
    (MaxRSS, and MaxRSSNode), CPU times summed."""
    if not per_node:
        return {}
    top = max(sorted(per_node), key=lambda n: per_node[n].get("max_rss_kb") or 0)
    out = {"max_rss_kb": per_node[top].get("max_rss_kb"), "max_rss_node": top}
    for k in ("cpu_s", "user_cpu_s", "system_cpu_s"):
        out[k] = round(sum(u.get(k) or 0 for u in per_node.values()), 3)
    return out


def to_json(row: JobRow, *, steps: list[StepRow] = (), completing: bool = False,
            gpu_usage: dict | None = None) -> dict:
    req = row.request
    alloc = row.allocation
    nodelist = compress(n["name"] for n in alloc["nodes"]) if alloc else ""
    cpus = sum(n["cpus"] for n in alloc["nodes"]) if alloc else req["cpus_per_task"] * req["ntasks"]
    spec = row.spec
    stdout = output_path(row, spec.get("stdout"), row.batch_host)
    stderr = output_path(row, spec.get("stderr"), row.batch_host) or stdout
    out_steps = []
    if not row.interactive and row.start_time is not None:
        state = row.state if JobState(row.state).terminal else "RUNNING"
        if row.state == JobState.TIMEOUT.value or row.state == JobState.CANCELLED.value:
            state = "CANCELLED"
        out_steps.append({
            "step_id": "batch", "name": "batch", "state": state, "start_time": row.start_time,
            "end_time": row.end_time, "exit_code": row.exit_code, "signal": row.signal, "ntasks": 1,
            "nodelist": row.batch_host or "", "cpus": alloc["nodes"][0]["cpus"] if alloc else 0,
            **_usage_of(row),
        })
    for st in steps:
        out_steps.append({
            "step_id": str(st.step_id), "name": st.name, "state": st.state, "start_time": st.start_time,
            "end_time": st.end_time, "exit_code": st.exit_code, "signal": st.signal, "ntasks": st.ntasks,
            "nodelist": st.nodelist, **step_usage(st.usage),
        })
    return {
        "job_id": row.id,
        "array_job_id": row.array_job_id,
        "array_task_id": row.array_task_id,
        "array_throttle": row.array_throttle,
        "name": row.name,
        "user": row.user,
        "partition": row.partition,
        "state": row.state,
        "completing": completing,
        "reason": row.reason,
        "submit_time": row.submit_time,
        "eligible_time": row.begin_time or row.submit_time,
        "start_time": row.start_time,
        "expected_start": row.expected_start if row.state == JobState.PENDING.value else None,
        "end_time": row.end_time,
        "time_limit_s": row.time_limit_s,
        "nodes": len(alloc["nodes"]) if alloc else req["nodes"],
        "ntasks": req["ntasks"],
        "ntasks_per_node": req["ntasks_per_node"],
        "cpus_per_task": req["cpus_per_task"],
        "cpus": cpus,
        "mem_per_node_mb": req["mem_per_node_mb"],
        "gpus_per_node": req["gpus_per_node"],
        "gpu_type": req["gpu_type"],
        "exclusive": req["exclusive"],
        "features": req.get("features", []),
        "nodelist": nodelist,
        "allocation": alloc,
        "batch_host": row.batch_host,
        "exit_code": row.exit_code,
        "signal": row.signal,
        "workdir": row.workdir,
        "stdout": stdout,
        "stderr": stderr,
        "command": spec.get("command"),
        "dependency": row.dependency,
        "requeue": row.requeue,
        "restart_count": row.restart_count,
        "priority": row.priority,
        "held": row.held,
        "interactive": row.interactive,
        "comment": row.comment,
        "admin_comment": row.admin_comment,
        "account": spec.get("account"),
        "qos": spec.get("qos"),
        "reservation": row.reservation,
        "array_spec": None,
        "steps": out_steps,
        # The current run's GPU use from the agents' samples (shoal.model.gpuusage.summarise), or None.
        "gpu_usage": gpu_usage,
    }


ACTIVE = (JobState.PENDING.value, JobState.RUNNING.value)


def listed(session: Session):
    """The condition for the jobs a listing shows by default: pending or running, or with a
    run's clean-up left (completing). The completing ids are read first: an OR with a
    sub-select made SQLite scan every job ever run."""
    completing = list(session.scalars(select(CleanupRow.job_id).distinct()))
    return JobRow.state.in_(ACTIVE) | JobRow.id.in_(completing) if completing else JobRow.state.in_(ACTIVE)


# squeue's default table reads only these keys of a Job (docs/API.md); GET /shoal/v1/jobs
# ?view=queue reads them from their columns, without loading and rendering whole rows.
QUEUE_VIEW = {
    "job_id": JobRow.id, "array_job_id": JobRow.array_job_id, "array_task_id": JobRow.array_task_id,
    "array_throttle": JobRow.array_throttle, "name": JobRow.name, "user": JobRow.user,
    "partition": JobRow.partition, "state": JobRow.state, "reason": JobRow.reason,
    "start_time": JobRow.start_time, "end_time": JobRow.end_time,
    "nodes": JobRow.request["nodes"].as_integer(), "allocation": JobRow.allocation,
}


def queue_view(session: Session, rows: list, completing: set[int] | None = None) -> list[dict]:
    """QUEUE_VIEW rows as Job dicts with those keys, plus ``completing`` and ``nodelist``
    (``completing``: the ids of jobs with clean-ups left, when the caller has read them)."""
    if not rows:
        return []
    if completing is None:
        completing = set(session.scalars(select(CleanupRow.job_id)))
    keys = tuple(QUEUE_VIEW)
    out = []
    for values in rows:
        job = dict(zip(keys, values))
        alloc = job.pop("allocation")
        if alloc:
            job["nodes"] = len(alloc["nodes"])
        job["nodelist"] = compress(n["name"] for n in alloc["nodes"]) if alloc else ""
        job["completing"] = job["job_id"] in completing
        out.append(job)
    return out


MIN_JOB_AGE_S = 300  # Slurm's default MinJobAge: scontrol's listing keeps an ended job this long


def slurm_config(config) -> dict[str, str]:
    """A ClusterConfig's settings as ``scontrol show config`` names and prints them, in its order."""
    def sec(value: float) -> str:
        return f"{value:g} sec"

    sched = config.scheduler
    return {
        "ClusterName": config.cluster_name,
        "DefMemPerCPU": str(sched.def_mem_per_cpu_mb),
        "KillWait": sec(config.nodes.kill_wait_s),
        "MaxArraySize": str(sched.max_array_size),
        "MinJobAge": sec(MIN_JOB_AGE_S),
        "PriorityType": "priority/multifactor",
        "SchedulerType": "sched/backfill" if sched.policy == "backfill" else "sched/builtin",
        "SelectType": "select/cons_tres",
        "SlurmdTimeout": sec(config.nodes.heartbeat_timeout_s),
    }


def array_env(task_ids: list[int]) -> dict[str, str]:
    """SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP, the same for every task of an array, as Slurm sets them."""
    gaps = {b - a for a, b in zip(task_ids, task_ids[1:])}
    return {"SLURM_ARRAY_TASK_COUNT": str(len(task_ids)), "SLURM_ARRAY_TASK_MAX": str(max(task_ids)),
            "SLURM_ARRAY_TASK_MIN": str(min(task_ids)),
            "SLURM_ARRAY_TASK_STEP": str(gaps.pop() if len(gaps) == 1 else 1)}


def array_summary(task_ids: list[int], throttle: int | None) -> str:
    return format_array(task_ids, throttle)
