"""Nodes: as sinfo and scontrol show them, as administrators change them (scontrol update
node), and what agents say about their own node's health: GPU faults drain it, a fenced
agent's runs fail.

The agent watches NVML (critical XIDs, uncorrected ECC, lost GPUs) and reports what it finds
with each heartbeat; here that becomes node state, as Slurm's HealthCheckProgram (NHC) does
with ``scontrol update state=drain reason=...``: the node takes no new work and its running
jobs go on, except those holding a GPU that is gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.model.gpu import gpu_gres
from shoal.model.job import JobState, LateExit, check_correction, exit_code_text, late_exit
from shoal.model.node import NodeState, display_state
from shoal.model.resources import GPU, Allocation
from shoal.model.timefmt import format_timestamp
from shoal.server import jobs as jobsvc
from shoal.server import reservations as resvsvc
from shoal.server.retry import retry_on_conflict
from shoal.server.schemas import NodeUpdate
from shoal.store.models import CleanupRow, JobRow, NodeRow

if TYPE_CHECKING:
    from shoal.server.core import Server

log = logging.getLogger("shoal.controller")

_REASON_WIDTH = 255  # NodeRow.reason


def gpu_health_reason(problems: list[dict]) -> str:
    """``GPU 1 XID 79 (GPU has fallen off the bus); GPU 1 is lost``: each problem once."""
    return "; ".join(dict.fromkeys(p["reason"] for p in problems))[:_REASON_WIDTH]


def apply_images(node: NodeRow, images: list[dict]) -> None:
    """The node's cached images as its agent reports them (written only when they changed)."""
    if (node.images or []) != images:
        node.images = images


def apply_gpu_health(session, controller, node: NodeRow, problems: list[dict], now: float) -> set[str]:
    """Record a report's GPU problems on ``node``; drain it if it is up and any is found,
    and fail the jobs holding a lost GPU. Returns the nodes whose work changed."""
    lasting = [p for p in problems if p["kind"] != "xid"]
    if node.gpu_health != lasting:
        node.gpu_health = lasting
    if not problems:
        return set()
    touched: set[str] = set()
    if node.state == NodeState.UP.value:
        node.state, node.reason, node.reason_time = NodeState.DRAIN.value, gpu_health_reason(problems), now
        log.warning("node %s: %s: DRAIN", node.name, node.reason)
        touched.add(node.name)
    lost = {p["index"] for p in problems if p["kind"] == "lost"}
    if lost:
        def holds_lost(row: JobRow) -> bool:
            return any(name == node.name and lost & set(a.gpus)
                       for name, a in Allocation.from_json(row.allocation).nodes)

        failed = controller.fail_node_jobs(session, node.name, now, only=holds_lost)
        if failed:
            log.warning("node %s: GPU %s lost: its jobs fail over", node.name, ",".join(map(str, sorted(lost))))
        touched |= failed
    return touched


def resume_refusal(node: NodeRow) -> str | None:
    """Why ``node`` may not be resumed yet (a GPU still lost or with ECC errors), or None."""
    if not node.gpu_health:
        return None
    return (f"node {node.name} still reports {gpu_health_reason(node.gpu_health)}; it stays drained "
            "until NVML finds the GPU healthy (after a GPU reset or a reboot)")


def fail_fenced_runs(session, controller, node: str, keys: list[str], now: float) -> set[str]:
    """An agent stopped these runs when its lease ran out: any the server still thinks are
    running there (it had not noticed the node's silence yet) fail over as on a node failure."""
    fenced = set(keys)

    def was_fenced(row: JobRow) -> bool:
        return jobsvc.job_run_key(row.id, row.restart_count) in fenced

    touched = controller.fail_node_jobs(session, node, now, only=was_fenced)
    if touched:
        log.warning("node %s fenced runs the server still counted as running: they fail over", node)
    return touched


def late_exit_of_lost_run(row: JobRow, node: str, run: int, exit_code: int, signal: int, end_time: float,
                          ended_by_itself: bool) -> LateExit:
    """A node back from silence reports how a run the server gave up with it really ended:
    correct the job as ``model.job.late_exit`` decides, and say so in its AdminComment."""
    outcome = late_exit(JobState(row.state), row.restart_count, row.lost_run, node, run, ended_by_itself)
    if outcome is LateExit.IGNORE:
        return outcome
    lost = row.lost_run
    ok = exit_code == 0 and not signal
    end = JobState.COMPLETED if ok else JobState.FAILED
    what = (f"run {run} on {node}, given up at {format_timestamp(lost['time'])} as its node was not responding, "
            f"had ended by itself at {format_timestamp(end_time)} with ExitCode {exit_code_text(exit_code, signal)}")
    if outcome is LateExit.NOTE:
        what += f": the job had started again (run {row.restart_count}), which stands"
    else:
        was = row.state
        row.state = check_correction(JobState(row.state), end).value
        if outcome is LateExit.TAKE_BACK:  # undo the requeue: the run that ended is the job's last
            row.restart_count, row.start_time = run, lost["start_time"]
            row.allocation, row.batch_host = lost["allocation"], node
        row.exit_code, row.signal, row.end_time, row.reason = exit_code, signal, end_time, "None"
        what += f": corrected from {'NODE_FAIL' if was == JobState.NODE_FAIL.value else 'requeued'} to {end.value}"
    row.lost_run = None
    row.admin_comment = f"{row.admin_comment}; {what}" if row.admin_comment else what
    log.warning("job %d: %s", row.id, what)
    return outcome


def node(s: Session, name: str) -> NodeRow:
    row = s.get(NodeRow, name)
    if row is None:
        raise jobsvc.JobError(f"Invalid node name specified: {name}", 404)
    return row


def list_json(server: Server, s: Session) -> list[dict]:
    return nodes_json(server, s, list(s.scalars(select(NodeRow).order_by(NodeRow.name))))


def nodes_json(server: Server, s: Session, rows: list[NodeRow]) -> list[dict]:
    """Nodes as docs/API.md's Node objects: with what their running jobs and cleanups hold."""
    # The running jobs' allocations alone: whole rows (their scripts) cost most of sinfo.
    running = s.execute(select(JobRow.id, JobRow.allocation).where(JobRow.state == JobState.RUNNING.value))
    cleanups = list(s.scalars(select(CleanupRow)))
    use: dict[str, list] = {r.name: [0, 0, 0, []] for r in rows}
    for jid, allocation in running:
        for n in (allocation or {"nodes": []})["nodes"]:
            if n["name"] in use:
                u = use[n["name"]]
                u[0] += n["cpus"]; u[1] += n["memory_mb"]; u[2] += len(n["gpus"]); u[3].append(jid)
    for c in cleanups:
        if c.node in use:
            u = use[c.node]
            u[0] += c.cpus; u[1] += c.memory_mb; u[2] += len(c.gpus)
            if c.job_id not in u[3]:
                u[3].append(c.job_id)
    maint = resvsvc.maint_nodes(s, server.clock())
    parts_of: dict[str, list[str]] = {}
    for pt in server.partitions:
        for n in pt.nodes:
            parts_of.setdefault(n, []).append(pt.name)
    return [_node_json(r, *use[r.name], maint=r.name in maint, partitions=parts_of.get(r.name, []))
            for r in rows]


def _node_json(r: NodeRow, cpus: int, mem: int, gpus: int, jobs: list[int], *, maint: bool,
               partitions: list[str]) -> dict:
    state = NodeState(r.state)
    return {
        "name": r.name, "address": r.address, "port": r.port, "state": r.state,
        "display_state": "maint" if maint and state is NodeState.UP
        else display_state(state, cpus, r.cpus, gpus, len(r.gpus), bool(jobs)),
        "reason": r.reason, "reason_time": r.reason_time, "gpu_health": r.gpu_health or [],
        "images": r.images or [],
        "cpus": r.cpus, "cpus_alloc": cpus, "memory_mb": r.memory_mb, "memory_alloc_mb": mem,
        "gpus": r.gpus, "gpus_alloc": gpus, "gres": gpu_gres(tuple(GPU(**g) for g in r.gpus)),
        "labels": r.labels, "taints": r.taints or [], "features": r.features,
        "partitions": partitions,
        "last_heartbeat": r.last_heartbeat, "boot_time": r.boot_time, "registered_at": r.registered_at,
        "jobs": sorted(jobs),
    }


@retry_on_conflict
def update(server: Server, s: Session, name: str, body: NodeUpdate) -> dict:
    """scontrol update node: state (DRAIN and DOWN with a reason; RESUME), reason, taints, labels."""
    now = server.clock()
    touched: set[str] = set()
    with s.begin():
        row = node(s, name)
        if body.state in ("DRAIN", "DOWN") and not body.reason:
            raise jobsvc.JobError(f"a reason is required to set node {name} to {body.state}")
        if body.state == "DRAIN":
            row.state, row.reason, row.reason_time = NodeState.DRAIN.value, body.reason, now
        elif body.state == "DOWN":
            row.state, row.reason, row.reason_time = NodeState.DOWN.value, body.reason, now
            touched = server.controller.fail_node_jobs(s, name, now)
        elif body.state in ("RESUME", "UP", "IDLE"):
            if row.state == NodeState.DOWN.value and now - row.last_heartbeat > server.config.nodes.heartbeat_timeout_s:
                raise jobsvc.JobError(f"node {name} is not responding; it returns when its agent does", 409)
            if (refusal := resume_refusal(row)) is not None:
                raise jobsvc.JobError(refusal, 409)
            row.state, row.reason, row.reason_time = NodeState.UP.value, None, None
        elif body.reason is not None:
            row.reason = body.reason
        if body.taints is not None:
            row.taints = [t.model_dump(exclude_defaults=False) for t in body.taints]
        if body.labels is not None:
            labels = dict(row.labels)
            for k, v in body.labels.items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
            row.labels = labels
        out = nodes_json(server, s, [row])[0]
    if body.taints is not None or body.labels is not None:
        server.kube.wake()
    server.hub.bump(touched | {name})
    server.controller.wake()
    return out
