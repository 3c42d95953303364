"""Stories about job arrays and dependencies: throttled arrays, task ids and output names,
and the afterok / afternotok / afterany / singleton chains administrators build pipelines from.

One 2-node cluster serves the module; each test waits for its own jobs to end.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster import LocalCluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("arrays"), nodes=2, gpus_per_node=4)
    c.up()
    yield c
    c.down()


def test_throttled_array_runs_at_most_two_tasks_at_once_with_its_own_ids_and_outputs(cluster):
    array_id = cluster.sbatch("--array=0-5%2", "--job-name=sweep", script="""#!/bin/bash
echo "task $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID start $(date +%s.%N)"
sleep 1
echo "task $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_JOB_ID end $(date +%s.%N)"
""")
    # While the first two run, squeue shows the rest collapsed on one line, with the throttle.
    def collapsed():
        lines = cluster.run(["squeue", "-h", "-j", str(array_id), "-o", "%i %T"]).stdout.splitlines()
        pending = [line for line in lines if line.endswith("PENDING")]
        running = [line for line in lines if line.endswith("RUNNING")]
        # squeue answers within milliseconds of sbatch: wait for the pass that starts two.
        return pending if pending and "_[" in pending[0] and running else None

    pending = wait_until(collapsed, 10, "squeue to show the pending tasks collapsed")
    assert len(pending) == 1, pending
    first = pending[0].split()[0]
    assert first.startswith(f"{array_id}_[") and first.endswith("%2]"), first
    assert first in (f"{array_id}_[2-5%2]", f"{array_id}_[3-5%2]", f"{array_id}_[4-5%2]"), first

    tasks = sorted(cluster.jobs(job_id=str(array_id)), key=lambda j: j["array_task_id"])
    assert [t["array_task_id"] for t in tasks] == [0, 1, 2, 3, 4, 5]
    spans = []
    for t in tasks:
        done = cluster.wait_for(t["job_id"], timeout=40)
        assert done["state"] == "COMPLETED", done
        out = cluster.workdir / f"slurm-{array_id}_{t['array_task_id']}.out"
        assert out.exists(), f"array task output should be slurm-%A_%a.out: {out}"
        lines = [line.split() for line in out.read_text().splitlines()]
        (_, a1, t1, j1, _, start), (_, a2, t2, j2, _, end) = lines
        assert (a1, t1, j1) == (str(array_id), str(t["array_task_id"]), str(t["job_id"]))
        assert (a1, t1, j1) == (a2, t2, j2)
        spans.append((float(start), float(end)))
    peak = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert peak <= 2, f"{peak} tasks of a %2 array ran at once: {spans}"
    assert peak == 2, "the throttle allows two at once; the array ran them one by one"


def wrap(cluster, *args: str, command: str = "true") -> int:
    return cluster.sbatch(*args, "--wrap", command)


def test_afterok_runs_after_success_and_never_after_failure(cluster):
    good = wrap(cluster, command="sleep 4")
    bad = wrap(cluster, command="sleep 4; exit 3")
    after_good = wrap(cluster, f"--dependency=afterok:{good}")
    after_bad = wrap(cluster, f"--dependency=afterok:{bad}")
    wait_until(lambda: cluster.job(after_good)["reason"] == "Dependency", 5, "reason Dependency")
    squeue = cluster.run(["squeue", "-h", "-j", str(after_good), "-o", "%T %r"]).stdout.split()
    assert squeue == ["PENDING", "Dependency"]

    first = cluster.wait_for(good)
    second = cluster.wait_for(after_good)
    assert second["state"] == "COMPLETED"
    assert second["start_time"] >= first["end_time"]

    assert cluster.wait_for(bad)["state"] == "FAILED"
    wait_until(lambda: cluster.job(after_bad)["reason"] == "DependencyNeverSatisfied", 10,
               "the dependent of a failed job to show DependencyNeverSatisfied")
    time.sleep(1.5)
    assert cluster.job(after_bad)["state"] == "PENDING"
    reason = cluster.run(["squeue", "-h", "-j", str(after_bad), "-o", "%r"]).stdout.strip()
    assert reason == "DependencyNeverSatisfied"
    cluster.run(["scancel", str(after_bad)])
    assert cluster.wait_for(after_bad)["state"] == "CANCELLED"


def test_afternotok_and_afterany_follow_the_outcome(cluster):
    bad = wrap(cluster, command="sleep 2; exit 1")
    good = wrap(cluster, command="sleep 2")
    on_failure = wrap(cluster, f"--dependency=afternotok:{bad}")
    on_success_notok = wrap(cluster, f"--dependency=afternotok:{good}")
    either = wrap(cluster, f"--dependency=afterany:{bad}:{good}")
    assert cluster.wait_for(on_failure)["state"] == "COMPLETED"
    assert cluster.wait_for(either)["state"] == "COMPLETED"
    wait_until(lambda: cluster.job(on_success_notok)["reason"] == "DependencyNeverSatisfied", 10,
               "afternotok on a successful job to be never satisfied")
    assert cluster.job(on_success_notok)["state"] == "PENDING"
    cluster.run(["scancel", str(on_success_notok)])
    ends = [cluster.job(j)["end_time"] for j in (bad, good)]
    assert cluster.job(either)["start_time"] >= max(ends)


def test_singleton_runs_one_job_of_a_name_at_a_time(cluster):
    outdir = cluster.workdir / "singleton"
    outdir.mkdir()
    cmd = 'echo "$(date +%s.%N)"; sleep 1; echo "$(date +%s.%N)"'
    ids = [wrap(cluster, "--job-name=nightly", "--dependency=singleton", "--output=singleton/%j.out", command=cmd)
           for _ in range(3)]
    other = wrap(cluster, "--job-name=other", "--dependency=singleton", command="sleep 1")

    def waiting_on_singleton():
        jobs = {j["job_id"]: j for j in cluster.jobs(job_id=[str(i) for i in ids])}
        running = [j for j in jobs.values() if j["state"] == "RUNNING"]
        dep = [j for j in jobs.values() if j["state"] == "PENDING" and j["reason"] == "Dependency"]
        return len(running) == 1 and len(dep) == 2

    wait_until(waiting_on_singleton, 10, "one nightly job running and two waiting on Dependency")
    # A job of another name is not held back by them.
    assert cluster.wait_for(other, states=("RUNNING", "COMPLETED"), timeout=10)
    spans = []
    for job_id in ids:
        assert cluster.wait_for(job_id, timeout=30)["state"] == "COMPLETED"
        start, end = map(float, (outdir / f"{job_id}.out").read_text().split())
        spans.append((start, end))
    spans.sort()
    for (_, e1), (s2, _) in zip(spans, spans[1:]):
        assert s2 >= e1, f"two singleton jobs of one name overlapped: {spans}"
