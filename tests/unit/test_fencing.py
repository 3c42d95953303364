"""The fence's arithmetic and what a late exit of a run given up with its silent node does
(docs/FENCING.md): pure policy, no processes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shoal.model.job import JobState, LateExit, late_exit
from shoal.model.node import fence_timing
from shoal.server.config import NodeLifecycleConfig


@pytest.mark.parametrize("timeout,kill_wait", [(300, 30), (60, 30), (30, 5), (4, 2), (3, 2), (6, 0)])
def test_lease_grace_check_and_skew_end_within_the_heartbeat_timeout(timeout, kill_wait):
    f = fence_timing(timeout, kill_wait)
    assert f.lease_s + f.check_s + f.grace_s + f.skew_s == pytest.approx(timeout)
    assert f.lease_s > timeout / 2 and 0 < f.check_s <= 1.0 and f.grace_s <= kill_wait
    assert f.skew_s >= 0.25 + 0.01 * timeout - 1e-9


def test_defaults_keep_most_of_a_minute_as_lease_and_slurms_killwait_at_slurmds_timeout():
    assert fence_timing(60, 30).lease_s == pytest.approx(48.15)
    assert fence_timing(300, 30).grace_s == 30


def test_a_timeout_too_short_for_two_heartbeats_in_the_lease_is_refused_in_one_line():
    with pytest.raises(ValidationError) as e:
        NodeLifecycleConfig(heartbeat_timeout_s=3, heartbeat_interval_s=2)
    msg = str(e.value)
    assert "heartbeat_timeout_s 3 leaves agents a lease of 2.1s" in msg and "docs/FENCING.md" in msg
    NodeLifecycleConfig(heartbeat_timeout_s=3, heartbeat_interval_s=2, fencing=False)  # no lease: no limit


LOST = {"run": 0, "node": "node03", "start_time": 1.0, "allocation": None, "time": 5.0}


@pytest.mark.parametrize("state,restarts,outcome", [
    (JobState.NODE_FAIL, 0, LateExit.CORRECT),  # no --requeue: NODE_FAIL becomes its real end
    (JobState.PENDING, 1, LateExit.TAKE_BACK),  # requeued, not started again
    (JobState.RUNNING, 1, LateExit.NOTE),  # started again elsewhere: that run stands
    (JobState.COMPLETED, 1, LateExit.NOTE),
    (JobState.CANCELLED, 1, LateExit.NOTE),
])
def test_a_run_that_ended_by_itself_while_its_node_was_silent(state, restarts, outcome):
    assert late_exit(state, restarts, LOST, "node03", 0, ended_by_itself=True) is outcome


def test_a_fenced_or_killed_run_another_nodes_report_or_a_job_never_given_up_changes_nothing():
    assert late_exit(JobState.NODE_FAIL, 0, LOST, "node03", 0, ended_by_itself=False) is LateExit.IGNORE
    assert late_exit(JobState.NODE_FAIL, 0, LOST, "node01", 0, ended_by_itself=True) is LateExit.IGNORE
    assert late_exit(JobState.PENDING, 2, {**LOST, "run": 1}, "node03", 0, True) is LateExit.IGNORE
    assert late_exit(JobState.PENDING, 1, None, "node03", 0, ended_by_itself=True) is LateExit.IGNORE
