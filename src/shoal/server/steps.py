"""Job steps (srun): lay tasks out over the allocation and sign each node's launch."""

from __future__ import annotations

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from shoal.model.hostlist import HostlistError, compress, expand
from shoal.model.job import JobState
from shoal.server.auth import step_credential
from shoal.server.jobs import JobError
from shoal.server.schemas import StepCreate
from shoal.server.work import slurm_environment, task_layout, tasks_per_node_text
from shoal.store.models import JobRow, NodeRow, StepRow


def _step_shape(job: JobRow, body: StepCreate, alloc: list[dict]) -> tuple[list[str], int, int | None]:
    """The step's nodes (--nodelist, --exclude, --nodes over the allocation), its task count
    and tasks per node, from its options or else the job's."""
    names = [n["name"] for n in alloc]
    if body.nodelist:
        try:
            wanted = set(expand(body.nodelist))
        except HostlistError as e:
            raise JobError(f"invalid --nodelist: {e}") from None
        unknown = wanted - set(names)
        if unknown:
            raise JobError(f"--nodelist {compress(unknown)} is not part of job {job.id}'s allocation")
        names = [n for n in names if n in wanted]
    if body.exclude:
        excluded = set(expand(body.exclude))
        names = [n for n in names if n not in excluded]
    req = job.request
    if body.nodes is not None:
        if body.nodes > len(names):
            raise JobError(f"step asks for {body.nodes} nodes but the allocation has {len(names)}")
        names = names[: body.nodes]
    tpn = body.ntasks_per_node
    if body.ntasks is not None:
        ntasks = body.ntasks
    elif tpn is not None:
        ntasks = tpn * len(names)
    elif len(names) == len(alloc):
        ntasks = req["ntasks"]
        tpn = req.get("ntasks_per_node")
    else:
        ntasks = len(names) * (req.get("ntasks_per_node") or 1)
    return names, ntasks, tpn


def create_step(session: Session, server, job: JobRow, body: StepCreate, nodes: dict[str, NodeRow],
                now: float) -> dict:
    if job.state != JobState.RUNNING.value:
        raise JobError(f"job {job.id} is {job.state}, not RUNNING: a step can only start inside a running job", 409)
    alloc = job.allocation["nodes"]
    req = job.request
    names, ntasks, tpn = _step_shape(job, body, alloc)
    if ntasks < len(names):
        names = names[:ntasks]
    counts = task_layout(ntasks, len(names), tpn)
    names = names[: len(counts)]
    by_name = {n["name"]: n for n in alloc}
    cpt = body.cpus_per_task or req["cpus_per_task"]
    for name, count in zip(names, counts):
        if count * cpt > by_name[name]["cpus"]:
            raise JobError(f"step needs {count * cpt} CPUs on {name} but the job holds {by_name[name]['cpus']} there")
    _serialise_step_ids(session, job.id)
    last = session.scalar(select(func.max(StepRow.step_id)).where(StepRow.job_id == job.id))
    step_id = 0 if last is None else last + 1  # not `last or -1`: step 0 is falsy
    layout = []
    procid = 0
    for nodeid, (name, count) in enumerate(zip(names, counts)):
        node_gpus = by_name[name]["gpus"]
        tasks = []
        for localid in range(count):
            if body.gpus_per_task:
                lo = localid * body.gpus_per_task
                gpus = node_gpus[lo: lo + body.gpus_per_task]
                if len(gpus) < body.gpus_per_task:
                    raise JobError(f"--gpus-per-task={body.gpus_per_task} with {count} tasks needs "
                                   f"{count * body.gpus_per_task} GPUs on {name}; the job holds {len(node_gpus)}")
            else:
                gpus = node_gpus
            tasks.append({"procid": procid, "localid": localid, "gpus": gpus})
            procid += 1
        node = nodes.get(name)
        layout.append({
            "name": name, "address": node.address if node else name, "port": node.port if node else 0,
            "tls": bool(node and node.tls),  # srun verifies the agent against the cluster CA, as `name`
            "nodeid": nodeid,
            "credential": step_credential(server.secret, name, job.id, job.restart_count, step_id,
                                          node.credential_gen if node else 0),
            "tasks": tasks,
        })
    step_nodelist = compress(names)
    session.add(StepRow(job_id=job.id, step_id=step_id, run=job.restart_count,
                        name=body.name or body.argv[0].rsplit("/", 1)[-1], state=JobState.RUNNING.value,
                        ntasks=ntasks, nodelist=step_nodelist, start_time=now))
    env = slurm_environment(job, server.config.cluster_name, server.submit_host, server.secret)
    env.update({
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEPID": str(step_id),
        "SLURM_STEP_NODELIST": step_nodelist,
        "SLURM_STEP_NUM_NODES": str(len(names)),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node_text(counts),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_TASKS_PER_NODE": tasks_per_node_text(counts),
        # A step's tasks see its node count here (SLURM_NODELIST, as SLURM_JOB_*, stays the job's).
        "SLURM_NNODES": str(len(names)),
    })
    if cpt:
        env["SLURM_CPUS_PER_TASK"] = str(cpt)
    return {"job_id": job.id, "run": job.restart_count, "step_id": step_id, "nodes": layout, "env": env}


def _serialise_step_ids(session: Session, job_id: int) -> None:
    """Make concurrent sruns of one job take step ids one after another.

    ``srun a & srun b`` both read max(step_id) and both insert the same key. Writing the job
    row (a no-op write: the version, and so optimistic checks elsewhere, stay as they are)
    makes the second wait for the first to commit, on SQLite (database write lock) and on
    PostgreSQL (row lock) alike, and then read the step id the first one took.

    On the session's connection, not through the ORM: a statement run through the session
    counts as one that may have changed any job (``store.changes.ALL``), and each srun made
    the queue view read the whole queue again (1.2 s of CPU with 100,000 jobs queued).
    """
    jobs = JobRow.__table__
    session.connection().execute(update(jobs).where(jobs.c.id == job_id).values(version=jobs.c.version))


def complete_step(step: StepRow, exit_code: int, signal: int, now: float) -> None:
    step.state = (JobState.COMPLETED if exit_code == 0 and signal == 0 else JobState.FAILED).value
    if signal == 9 or signal == 15:
        step.state = JobState.CANCELLED.value
    step.exit_code, step.signal, step.end_time = exit_code, signal, now
