"""submitit (Meta's job submitter, from PyPI) drives a Shoal cluster unchanged, as it drives Slurm.

submitit writes `#SBATCH --wckey=submitit` and other directives Shoal records but does not use,
submits with `sbatch --parsable`, polls `sacct`, cancels with `scancel`, and runs the function
under `srun` inside the batch script.
"""

from __future__ import annotations

import time

import pytest

submitit = pytest.importorskip("submitit")  # in pyproject's test extras


def add(a: int, b: int) -> int:
    return a + b


def fail_loudly() -> None:
    raise ValueError("the loss went to NaN")


def sleep(seconds: float) -> None:
    time.sleep(seconds)


@pytest.fixture
def executor(cluster, monkeypatch, tmp_path):
    for key in ("PATH", "SHOAL_CONFIG", "SHOAL_STATE_DIR"):
        monkeypatch.setenv(key, cluster.env[key])
    for key in ("SLURM_JOB_ID", "SLURM_CONF"):
        monkeypatch.delenv(key, raising=False)
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=5)
    return ex


@pytest.mark.slow
def test_a_researcher_submits_maps_cancels_and_reads_a_traceback_with_submitit(cluster, executor):
    job = executor.submit(add, 2, 3)
    assert job.result() == 5
    # result() returns once the function has written its result file, from inside the job's step:
    # the step, the batch script and the epilog still have to end, so the job may still be
    # RUNNING (or COMPLETING) at that moment, on Slurm too. Wait for it to settle.
    assert cluster.wait_for(int(job.job_id))["state"] == "COMPLETED"

    executor.update_parameters(slurm_array_parallelism=2)
    jobs = executor.map_array(add, [1, 2, 3], [10, 20, 30])
    assert [j.result() for j in jobs] == [11, 22, 33]
    assert cluster.job(int(jobs[0].job_id.split("_")[0]))["array_throttle"] == 2

    failing = executor.submit(fail_loudly)
    with pytest.raises(submitit.core.utils.FailedJobError) as info:
        failing.result()
    assert "ValueError: the loss went to NaN" in str(info.value)  # the job's own traceback

    executor.update_parameters(slurm_array_parallelism=256)
    sleeper = executor.submit(sleep, 120)
    cluster.wait_for(int(sleeper.job_id), states=("RUNNING",), settled=False)
    sleeper.cancel()
    cluster.wait_for(int(sleeper.job_id), states=("CANCELLED",))
    deadline = time.time() + 30
    while sleeper.state != "CANCELLED" and time.time() < deadline:  # submitit reads it from sacct
        time.sleep(0.5)
    assert sleeper.state == "CANCELLED"
