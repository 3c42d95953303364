"""Story: on a one-node cluster a job holds the node for up to ten minutes; the next job
needs the whole node, so ``squeue --start`` says it starts when the first one's time limit
is up, as Slurm's backfill does."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.integration.cluster import LocalCluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("estimates"), nodes=1, gpus_per_node=4)
    c.up()
    yield c
    c.down()


def test_squeue_start_shows_the_pending_job_starting_when_the_running_one_must_end(cluster):
    first = cluster.sbatch("--time=10", "--gres=gpu:4", "--wrap", "sleep 300")
    second = cluster.sbatch("--time=5", "--gres=gpu:4", "--wrap", "true")
    started = wait_until(lambda: cluster.job(first)["start_time"], 30, "the first job to start")
    expected = wait_until(lambda: cluster.job(second)["expected_start"], 30,
                          "a start estimate for the second job")
    assert cluster.job(second)["state"] == "PENDING"
    assert abs(expected - (started + 600)) < 2

    out = cluster.run(["squeue", "--start", "--noheader", "-o", "%i %S"]).stdout.split()
    assert out[0] == str(second)
    shown = datetime.strptime(out[1], "%Y-%m-%dT%H:%M:%S").timestamp()
    assert abs(shown - (started + 600)) < 2

    # Once it runs, squeue shows its real start, and a running job never shows an estimate.
    cluster.run(["scancel", str(first)])
    wait_until(lambda: cluster.job(second)["state"] != "PENDING", 30, "the second job to start")
    assert cluster.job(second)["expected_start"] is None
    cluster.run(["scancel", str(second)], check=False)
