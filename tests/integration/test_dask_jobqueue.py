"""dask-jobqueue's SLURMCluster (from PyPI) drives a Shoal cluster unchanged, as it drives Slurm.

It writes a batch script of #SBATCH directives (-J, -n 1, --cpus-per-task, --mem, -t), submits it
with sbatch, reads the job id from sbatch's "Submitted batch job N", and closes with scancel; each
job runs a dask worker that connects back to the scheduler in this process.
"""

from __future__ import annotations

import pytest

from tests.integration.cluster import wait_until

dask_jobqueue = pytest.importorskip("dask_jobqueue")  # in pyproject's test extras
distributed = pytest.importorskip("distributed")


def square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_a_data_scientist_scales_a_dask_cluster_computes_and_closes_it(cluster, monkeypatch, tmp_path):
    for key in ("PATH", "SHOAL_CONFIG", "SHOAL_STATE_DIR"):
        monkeypatch.setenv(key, cluster.env[key])
    for key in ("SLURM_JOB_ID", "SLURM_CONF"):
        monkeypatch.delenv(key, raising=False)
    with dask_jobqueue.SLURMCluster(cores=2, processes=1, memory="2GB", walltime="00:10:00",
                                    log_directory=str(tmp_path / "logs"), scheduler_options={"host": "127.0.0.1"},
                                    worker_extra_args=["--host", "127.0.0.1"]) as dask_cluster:
        assert "#SBATCH --cpus-per-task=2" in dask_cluster.job_script()
        dask_cluster.scale(jobs=2)
        with distributed.Client(dask_cluster) as client:
            client.wait_for_workers(2, timeout=120)
            jobs = [j for j in cluster.jobs() if j["state"] == "RUNNING"]
            assert len(jobs) == 2 and all(j["name"] == "dask-worker" for j in jobs)
            assert sum(client.gather(client.map(square, range(10)))) == 285
            ids = [j["job_id"] for j in jobs]
    # Closing the cluster cancels its jobs with scancel.
    wait_until(lambda: all(cluster.job(i)["state"] in ("CANCELLED", "COMPLETED") for i in ids), 60,
               "the dask workers' jobs ended when the cluster closed")
