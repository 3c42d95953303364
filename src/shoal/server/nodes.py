"""What agents say about their own node's health: GPU faults drain it, a fenced agent's runs fail.

The agent watches NVML (critical XIDs, uncorrected ECC, lost GPUs) and reports what it finds
with each heartbeat; here that becomes node state, as Slurm's HealthCheckProgram (NHC) does
with ``scontrol update state=drain reason=...``: the node takes no new work and its running
jobs go on, except those holding a GPU that is gone.
"""

from __future__ import annotations

import logging

from shoal.model.node import NodeState
from shoal.model.resources import Allocation
from shoal.server import jobs as jobsvc
from shoal.store.models import JobRow, NodeRow

log = logging.getLogger("shoal.controller")

_REASON_WIDTH = 255  # NodeRow.reason


def gpu_health_reason(problems: list[dict]) -> str:
    """``GPU 1 XID 79 (GPU has fallen off the bus); GPU 1 is lost``: each problem once."""
    return "; ".join(dict.fromkeys(p["reason"] for p in problems))[:_REASON_WIDTH]


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
