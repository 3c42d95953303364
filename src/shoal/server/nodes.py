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

from sqlalchemy.orm import Session

from shoal.model.job import JobState, LateExit, check_correction, exit_code_text, late_exit
from shoal.model.node import NodeState
from shoal.model.resources import Allocation
from shoal.model.timefmt import format_timestamp
from shoal.server import jobs as jobsvc
from shoal.server import listing
from shoal.server.retry import retry_on_conflict
from shoal.server.schemas import NodeUpdate
from shoal.store.models import JobRow, NodeRow

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


NODE_VIEWS = ("sinfo",)  # nodelist.SINFO_VIEW's keys, the answer kept whole (NodeListing.sinfo)


def list_encoded(server: Server, s: Session, view: str | None, gzip: bool) -> tuple[bytes, bool]:
    """``{"nodes": [...]}``, every node as docs/API.md's Node objects (server/nodelist.py), encoded
    and gzipped when ``gzip`` (the client accepts it) and it is worth it; with ``view=sinfo`` only
    the keys sinfo reads, that answer kept until what it shows may change. Whether it is gzipped."""
    if view is not None and view not in NODE_VIEWS:
        raise jobsvc.JobError(f"unknown view {view!r} (expected {', '.join(NODE_VIEWS)})")
    if view == "sinfo":
        return server.node_listing.sinfo(s, gzip)
    return listing.squeezed(listing.dumps({"nodes": server.node_listing.all_json(s)}), gzip)


def nodes_json(server: Server, s: Session, rows: list[NodeRow]) -> list[dict]:
    """Nodes as docs/API.md's Node objects: with what their running jobs and cleanups hold."""
    return server.node_listing.rows_json(s, rows)


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
            if row.state == NodeState.DOWN.value and \
                    now - server.heartbeats.latest(name, row.last_heartbeat) > server.config.nodes.heartbeat_timeout_s:
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
