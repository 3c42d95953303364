"""Administrator stories about QOS preemption, told on a real local cluster of 2 nodes x 4 GPUs.

Scavenger jobs fill the idle GPUs; a job of the high QOS that needs them stops the scavengers
(signalled first, as their --signal asks, so they can checkpoint), and they come back later.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.cluster import LocalCluster, wait_until

QOS = [
    {"name": "normal"},
    {"name": "scavenger", "preempt_mode": "requeue"},
    {"name": "spot", "preempt_mode": "cancel"},
    {"name": "high", "priority": 100, "preempt": ["scavenger", "spot"]},
]

# Trains "forever" on its first run; on USR1 it writes a checkpoint and carries on (or, with
# CHECKPOINT_AND_EXIT=1, exits at once). A second run resumes from the checkpoint and ends. Once
# its trap is set it touches ready-<job id>: a preemptor submitted before then could signal a
# script that has no trap yet, which bash would end at once.
TRAINER = """#!/bin/bash
echo "run $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" != "0" ]; then
  echo "resumed from $(cat ckpt-$SLURM_JOB_ID)"
  exit 0
fi
checkpoint() {
  python3 -c 'import time; print(time.time())' > ckpt-$SLURM_JOB_ID
  [ "$CHECKPOINT_AND_EXIT" = 1 ] && exit 0
}
trap checkpoint USR1
touch ready-$SLURM_JOB_ID
while true; do sleep 0.2 & wait $!; done
"""


def wait_until_trapping(cluster: LocalCluster, job: int) -> None:
    """The trainer's first run is RUNNING and has set its USR1 trap."""
    cluster.wait_for(job, states=("RUNNING",), timeout=20)
    wait_until(lambda: (cluster.workdir / f"ready-{job}").exists(), 20, f"job {job} to set its trap")


def qos_cluster(tmp_path, qos: list[dict], name: str = "story") -> LocalCluster:
    """Two nodes of 4 GPUs in one partition, with the administrator's QOS list; started."""
    doc = {"cluster_name": name, "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
           "nodes": {"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 30.0, "kill_wait_s": 2.0},
           "qos": qos}
    path = tmp_path / "cluster.yaml"
    path.write_text(json.dumps(doc))
    return LocalCluster(tmp_path / "cluster", nodes=2, gpus_per_node=4, config=str(path)).up()


@pytest.fixture
def cluster(tmp_path):
    c = qos_cluster(tmp_path, QOS)
    yield c
    c.down()


def test_a_scavenger_gang_checkpoints_on_its_signal_makes_way_and_comes_back(cluster):
    victim = cluster.sbatch("--qos=scavenger", "--requeue", "--signal=B:USR1@3", "--nodes=2",
                            "--gpus-per-node=4", script=TRAINER)
    wait_until_trapping(cluster, victim)
    urgent = cluster.sbatch("--qos=high", "--gpus-per-node=4", "--wrap", "sleep 5")
    first = cluster.wait_for(urgent, states=("RUNNING",), timeout=20)
    # The scavenger had its 3 s grace, then KillWait at most; the urgent job started right after.
    assert first["start_time"] - first["submit_time"] <= 3 + 2 + 3, first
    marker = cluster.workdir / f"ckpt-{victim}"
    assert marker.exists(), "the victim never got USR1"
    assert float(marker.read_text()) < first["start_time"], "it was stopped before it could checkpoint"
    requeued = cluster.job(victim)
    assert (requeued["state"], requeued["restart_count"]) == ("PENDING", 1), requeued
    cluster.wait_for(urgent, timeout=30)
    done = cluster.wait_for(victim, states=("COMPLETED",), timeout=30)
    assert done["restart_count"] == 1 and done["start_time"] >= first["start_time"] + 5 - 1
    out = (cluster.workdir / f"slurm-{victim}.out").read_text()
    assert "run 1" in out and "resumed from" in out, out
    assert "Restarts=1" in cluster.run(["scontrol", "show", "job", str(victim)]).stdout


def test_a_scavenger_that_exits_in_its_grace_is_still_requeued_and_the_preemptor_starts_at_once(cluster):
    victim = cluster.sbatch("--qos=scavenger", "--requeue", "--signal=B:USR1@30", "--gpus-per-node=4",
                            "--nodelist=node01", script=TRAINER, env={"CHECKPOINT_AND_EXIT": "1"})
    filler = cluster.sbatch("--qos=normal", "--gpus-per-node=4", "--nodelist=node02", "--wrap", "sleep 60")
    wait_until_trapping(cluster, victim)
    cluster.wait_for(filler, states=("RUNNING",), timeout=20)
    urgent = cluster.sbatch("--qos=high", "--gpus-per-node=4", "--wrap", "sleep 3")
    first = cluster.wait_for(urgent, states=("RUNNING",), timeout=20)
    assert first["start_time"] - first["submit_time"] <= 5, "the preemptor waited for the whole grace"
    assert first["nodelist"] == "node01"
    assert cluster.job(filler)["state"] == "RUNNING", "a normal job was preempted"
    requeued = cluster.job(victim)
    assert (requeued["state"], requeued["restart_count"]) == ("PENDING", 1), requeued
    cluster.run(["scancel", str(filler)])
    done = cluster.wait_for(victim, states=("COMPLETED",), timeout=30)
    assert done["restart_count"] == 1


def test_a_spot_job_without_a_signal_is_cancelled_and_ends_preempted(cluster):
    spot = cluster.sbatch("--qos=spot", "--requeue", "--gpus-per-node=4", "--nodes=2", "--wrap", "sleep 300")
    cluster.wait_for(spot, states=("RUNNING",), timeout=20)
    urgent = cluster.sbatch("--qos=high", "--gpus-per-node=4", "--wrap", "sleep 1")
    first = cluster.wait_for(urgent, states=("RUNNING",), timeout=20)
    assert first["start_time"] - first["submit_time"] <= 2 + 3, first  # KillWait, and a pass or two
    gone = cluster.wait_for(spot, states=("PREEMPTED",), timeout=10)
    assert gone["restart_count"] == 0 and gone["reason"] == "Preempted"
    assert wait_until(lambda: cluster.job(urgent)["state"] == "COMPLETED", 30, "the urgent job ending")
    time.sleep(1.5)
    assert cluster.job(spot)["state"] == "PREEMPTED", "a cancelled victim must not come back"
