"""Per-job GPU accounting, as a user asks "how did my job use its GPUs?": a 2-node cluster of
fake A100s (each as busy as the processes holding it keep a CPU, its memory what they keep
resident); a 2-node job keeps one GPU busy on each node and ~200 MB resident, and sstat,
sacct and the API show its gres/gpuutil, gres/gpumem and energy, kept after it ends."""

from __future__ import annotations

import json

import pytest

from tests.integration.cluster import LocalCluster, wait_until

ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
# One core busy and ~200 MB touched, for ``SECONDS``, under srun on each node.
BURN = ("import time; b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
        "t = time.time()\nwhile time.time() - t < {seconds}: pass")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpuacct")
    config = root / "cluster.yaml"
    config.write_text(json.dumps({
        "cluster_name": "gpuacct", "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
        "nodes": {"heartbeat_interval_s": 1.0, "kill_wait_s": 2.0}}))
    c = LocalCluster(root / "cluster", nodes=2, gpus_per_node=2, config=str(config)).up()
    yield c
    c.down()


def _tres(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",")) if text else {}


def _bytes(text: str) -> float:
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    return float(text[:-1]) * scale[text[-1]] if text[-1] in scale else float(text)


def test_a_jobs_gpu_use_is_in_sstat_sacct_and_the_api_and_kept_after_it_ends(cluster: LocalCluster):
    burn = BURN.format(seconds=12)
    job_id = cluster.sbatch("-N2", "--gres=gpu:1", "--wrap", f"srun python3 -c \"{burn}\"")

    def busy_in_sstat():
        out = cluster.run(["sstat", "-j", f"{job_id}.batch", "-n", "-P", "-o", "TRESUsageInMax,ConsumedEnergyRaw"],
                          check=False).stdout.strip()
        tres = _tres(out.split("|")[0]) if out else {}
        return out if float(tres.get("gres/gpuutil", 0)) >= 20 else None

    line = wait_until(busy_in_sstat, timeout=60, what=f"sstat -j {job_id}.batch never showed a busy GPU")
    assert int(line.split("|")[1]) > 0, line

    job = cluster.wait_for(job_id, states=ENDED, timeout=90)
    assert job["state"] == "COMPLETED", cluster.diagnostics(job)
    gpu = job["gpu_usage"]
    assert gpu["gpus"] == 2 and gpu["samples"] >= 4, gpu
    assert gpu["gpuutil"]["max"] >= 20 and gpu["gpumem_bytes"]["max"] >= 150 * 1024 ** 2, gpu
    assert gpu["gpuutil"]["max_node"] in ("node01", "node02") and gpu["energy_j"]["tot"] > 0, gpu
    assert gpu["busy_gpu_s"] > 0, gpu

    out = cluster.run(["sacct", "-j", str(job_id), "-n", "-P", "-o",
                       "JobID,TRESUsageInAve,TRESUsageInMax,TRESUsageInMaxNode,TRESUsageInTot,ConsumedEnergyRaw"]
                      ).stdout.split()
    lines = {f.split("|")[0]: f.split("|")[1:] for f in out}
    ave, top, top_node, tot, energy = lines[f"{job_id}.batch"]
    assert lines[str(job_id)][:4] == ["", "", "", ""], f"a job line has no TRESUsageIn*, as in Slurm: {out}"
    assert lines[str(job_id)][4] == energy and int(energy) > 0, out
    top, ave, tot = _tres(top), _tres(ave), _tres(tot)
    assert {"energy", "gres/gpumem", "gres/gpuutil"} <= set(top), out
    assert float(top["gres/gpuutil"]) >= 20 and _bytes(top["gres/gpumem"]) >= 150 * 1024 ** 2, out
    assert float(ave["gres/gpuutil"]) <= float(top["gres/gpuutil"]), out
    # Two GPUs: the total is the sum of the two GPUs' averages.
    assert float(ave["gres/gpuutil"]) <= float(tot["gres/gpuutil"]) <= 2 * float(ave["gres/gpuutil"]) + 1, out
    assert _tres(top_node)["gres/gpuutil"] in ("node01", "node02"), out

    detail = cluster.api("GET", f"/shoal/v1/jobs/{job_id}/gpu-usage")
    assert [n["node"] for n in detail["nodes"]] == ["node01", "node02"], detail
    assert all(len(n["points"]) >= 2 for n in detail["nodes"]), detail
    assert max(p[1] for n in detail["nodes"] for p in n["points"]) >= 20, detail
    assert detail["summary"] == gpu


def test_an_idle_gpu_job_shows_an_idle_gpu(cluster: LocalCluster):
    job_id = cluster.sbatch("--gres=gpu:1", "--wrap", "sleep 4")
    job = cluster.wait_for(job_id, states=ENDED, timeout=60)
    assert job["state"] == "COMPLETED", cluster.diagnostics(job)
    gpu = job["gpu_usage"]
    assert gpu is not None and gpu["gpus"] == 1, job
    assert gpu["gpuutil"]["max"] <= 10 and gpu["gpumem_bytes"]["max"] < 50 * 1024 ** 2, gpu


def test_a_cpu_only_job_has_no_gpu_figures(cluster: LocalCluster):
    job_id = cluster.sbatch("--wrap", "sleep 2")
    job = cluster.wait_for(job_id, states=ENDED, timeout=60)
    assert job["gpu_usage"] is None, job
    out = cluster.run(["sacct", "-j", str(job_id), "-n", "-P", "-o", "JobID,TRESUsageInMax,ConsumedEnergy"]).stdout
    for line in out.split():
        jid, tres, energy = line.split("|")
        assert "gres/" not in tres and energy == "", out


def test_an_agent_accounts_only_for_gpus_its_node_gives_the_jobs_current_run(tmp_path):
    from shoal.server import gpuacct
    from shoal.server.config import parse_cluster_config
    from shoal.server.core import Server
    from shoal.server.schemas import GPUUsageSample
    from shoal.store.models import JobGPUUsageRow, JobRow

    server = Server(f"sqlite:///{tmp_path}/shoal.db", parse_cluster_config(
        {"partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]}), tmp_path)
    try:
        alloc = {"exclusive": False, "nodes": [{"name": "node01", "cpus": 1, "memory_mb": 1, "gpus": [2, 3]}]}
        with server.sessions() as s, s.begin():
            for job_id, state in ((1, "RUNNING"), (2, "COMPLETED")):
                s.add(JobRow(id=job_id, name="train", user="ada", partition="gpu", state=state, submit_time=0.0,
                             start_time=1.0, restart_count=1, request={}, spec={}, workdir="/", allocation=alloc))

        def report(node, job_id, run, gpu, now):
            with server.sessions() as s, s.begin():
                return gpuacct.record(s, node, [GPUUsageSample(job_id=job_id, run=run, gpu=gpu, util=90.0, mem_mib=10)],
                                      now)

        assert report("node01", 1, 1, 2, 10.0) == 1
        assert report("node01", 1, 1, 3, 11.0) == 1
        assert report("node01", 1, 1, 0, 12.0) == 0, "a GPU the job does not hold there"
        assert report("node02", 1, 1, 2, 12.0) == 0, "a node the job is not on"
        assert report("node01", 1, 0, 2, 12.0) == 0, "a run before a requeue"
        assert report("node01", 2, 1, 2, 12.0) == 0, "a job no longer running"
        assert report("node01", 9, 0, 2, 12.0) == 0, "no such job"
        with server.sessions() as s:
            rows = s.query(JobGPUUsageRow).all()
            assert [(r.job_id, r.run, r.node, sorted(r.record["gpus"])) for r in rows] == [(1, 1, "node01", ["2", "3"])]
            summary = gpuacct.summaries(s, s.query(JobRow).all())
        assert list(summary) == [1] and summary[1]["gpus"] == 2 and summary[1]["gpuutil"]["max"] == 90.0
    finally:
        server.engine.dispose()
