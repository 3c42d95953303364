"""Stories about placing GPU jobs: gangs start whole or not at all, a GPU is never shared,
and --exclusive means the whole node.

One 2-node x 4-GPU cluster serves the module; each test waits for its own jobs to end.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.cluster import LocalCluster, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("gang"), nodes=2, gpus_per_node=4)
    c.up()
    yield c
    c.down()


def read_intervals(paths) -> list[tuple[str, int, float, float, str]]:
    """Each job writes: host gpus start end; one (host, gpu, start, end, job) per GPU."""
    out = []
    for path in paths:
        host, gpus, start, end = path.read_text().split()
        for g in gpus.split(","):
            out.append((host, int(g), float(start), float(end), path.name))
    return out


def overlaps(a, b) -> bool:
    return a[2] < b[3] and b[2] < a[3]


def test_gang_job_waits_for_every_gpu_and_never_starts_partially(cluster):
    holder = cluster.sbatch("--gpus-per-node=1", "--job-name=holder", "--wrap", "sleep 600")
    cluster.wait_for(holder, states=("RUNNING",), timeout=15)
    gang = cluster.sbatch("--nodes=2", "--gpus-per-node=4", "--job-name=gang", "--wrap",
                          "srun bash -c 'echo $(hostname) $CUDA_VISIBLE_DEVICES'")

    def reason_is_resources():
        job = cluster.job(gang)
        assert job["state"] == "PENDING", f"the gang started while a GPU was held: {job}"
        return job["reason"] == "Resources"

    wait_until(reason_is_resources, 10, "the gang job to wait with reason Resources")
    # Several scheduling passes later it still waits, holding nothing.
    time.sleep(2.5)
    job = cluster.job(gang)
    assert (job["state"], job["reason"], job["nodelist"], job["allocation"]) == ("PENDING", "Resources", "", None)
    squeue = cluster.run(["squeue", "-h", "-j", str(gang), "-o", "%i %T %r"]).stdout.split()
    assert squeue == [str(gang), "PENDING", "Resources"]
    gpus_alloc = {n["name"]: n["gpus_alloc"] for n in cluster.nodes_json()}
    assert sorted(gpus_alloc.values()) == [0, 1], gpus_alloc

    cluster.run(["scancel", str(holder)])
    done = cluster.wait_for(gang, timeout=30)
    assert done["state"] == "COMPLETED", done
    assert done["nodes"] == 2
    lines = sorted((cluster.workdir / f"slurm-{gang}.out").read_text().split("\n"))
    assert [line for line in lines if line] == sorted(f"{n} 0,1,2,3" for n in cluster.node_names())


def test_concurrent_one_gpu_submissions_never_share_a_gpu(cluster):
    outdir = cluster.workdir / "gpu-exclusive"
    outdir.mkdir()
    script = cluster.workdir / "gpu-job.sh"
    script.write_text("""#!/bin/bash
#SBATCH --gpus=1
#SBATCH --output=gpu-exclusive/%j.out
start=$(date +%s.%N)
sleep 0.4
echo "$(hostname) $CUDA_VISIBLE_DEVICES $start $(date +%s.%N)"
""")

    def submit(_i: int) -> int:
        out = cluster.run(["sbatch", "--parsable", str(script)], timeout=60)
        return int(out.stdout.strip())

    with ThreadPoolExecutor(max_workers=12) as pool:
        ids = list(pool.map(submit, range(24)))
    assert len(set(ids)) == 24
    for job_id in ids:
        job = cluster.wait_for(job_id, timeout=60)
        assert job["state"] == "COMPLETED", job
    intervals = read_intervals(outdir / f"{j}.out" for j in ids)
    assert len(intervals) == 24, "every job must have seen exactly one GPU"
    assert {(h, g) for h, g, *_ in intervals} <= {(n, g) for n in cluster.node_names() for g in range(4)}
    clashes = [(a[4], b[4], a[0], a[1]) for i, a in enumerate(intervals) for b in intervals[i + 1:]
               if a[:2] == b[:2] and overlaps(a, b)]
    assert not clashes, f"jobs shared a GPU while both ran: {clashes}"
    # 24 jobs on 8 GPUs: the cluster really ran several at once.
    peak = max(sum(1 for b in intervals if b[2] <= a[2] < b[3]) for a in intervals)
    assert peak >= 4, f"at most {peak} jobs ran at once on 8 GPUs"


def test_exclusive_job_has_its_node_to_itself(cluster):
    outdir = cluster.workdir / "exclusive"
    outdir.mkdir()
    record = 'echo "$(hostname) $SLURM_JOB_ID $(date +%s.%N)"; sleep {t}; echo "$(hostname) $SLURM_JOB_ID $(date +%s.%N)"'
    exclusive = cluster.sbatch("--exclusive", "--output=exclusive/%j.out", "--wrap", record.format(t=3))
    job = cluster.wait_for(exclusive, states=("RUNNING",), timeout=15)
    host = job["nodelist"]
    assert job["exclusive"] is True
    assert job["allocation"]["nodes"][0]["gpus"] == [0, 1, 2, 3], "an exclusive job gets every GPU"
    small = [cluster.sbatch("--gpus=1", "--output=exclusive/%j.out", "--wrap", record.format(t=0.5))
             for _ in range(6)]
    for job_id in small:
        assert cluster.wait_for(job_id, timeout=60)["state"] == "COMPLETED"
    assert cluster.wait_for(exclusive, timeout=30)["state"] == "COMPLETED"

    def span(job_id):
        (h1, _, t1), (h2, _, t2) = (line.split() for line in (outdir / f"{job_id}.out").read_text().splitlines())
        return h1, float(t1), float(t2)

    ex_host, ex_start, ex_end = span(exclusive)
    assert ex_host == host
    for job_id in small:
        h, start, end = span(job_id)
        assert not (h == host and start < ex_end and ex_start < end), \
            f"job {job_id} ran on {host} while exclusive job {exclusive} held it"
    # While the exclusive job ran, the small jobs used the other node (three at a time there).
    others = [span(j) for j in small]
    assert any(h != host and start < ex_end for h, start, _ in others)
