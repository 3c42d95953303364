"""A GPU breaks under a running cluster: the agent's NVML watch sees it, the node drains with a
reason naming the GPU and the fault, the scheduler sends new work elsewhere, and the node
comes back only when the administrator resumes it and NVML finds the GPU healthy again.

Faults are injected through the fake NVML's fault file (WORKDIR/fake-gpu-faults): the agent
runs the same health code it runs on real GPUs.
"""

from __future__ import annotations

from tests.integration.cluster import LocalCluster, wait_until


def break_gpu(cluster: LocalCluster, node: str, fault: str) -> None:
    with (cluster.root / "state" / "nodes" / node / "fake-gpu-faults").open("a") as f:
        f.write(fault + "\n")


def reasons(cluster: LocalCluster) -> dict[str, tuple[str, str]]:
    """sinfo -R: node -> (state, reason)."""
    out = cluster.run(["sinfo", "-h", "-R", "-N", "-o", "%N|%t|%E"]).stdout
    return {n: (t, e) for n, t, e in (line.split("|", 2) for line in out.splitlines() if line)}


def gpus_of(cluster: LocalCluster, job_id: int) -> str:
    path = cluster.workdir / f"gpus-{job_id}"
    wait_until(lambda: path.exists() and path.read_text().strip(), 10, f"job {job_id} to write its GPUs")
    return path.read_text().strip()


def test_a_double_bit_ecc_error_drains_the_node_until_the_gpu_is_reset(make_cluster):
    cluster = make_cluster(nodes=2, gpus_per_node=4)
    sick, well = cluster.node_names()
    running = cluster.sbatch("--nodelist", sick, "--gpus=1", "--output=/dev/null",
                             "--wrap", "echo $CUDA_VISIBLE_DEVICES > gpus-$SLURM_JOB_ID; sleep 120")
    cluster.wait_for(running, states=("RUNNING",), timeout=20)
    held = int(gpus_of(cluster, running))
    broken = (held + 1) % 4

    break_gpu(cluster, sick, f"xid {broken} 48")
    expected = f"GPU {broken} XID 48 (double-bit ECC error); GPU {broken} has 1 uncorrected ECC error(s)"
    wait_until(lambda: reasons(cluster).get(sick) == ("drng", expected), 10,
               f"sinfo -R to show {sick} draining for the ECC error")
    show = cluster.run(["scontrol", "show", "node", sick]).stdout
    assert f"Reason={expected}" in show, show

    # Drained, not down: the running job goes on; new work goes to the healthy node.
    assert cluster.job(running)["state"] == "RUNNING"
    elsewhere = cluster.sbatch("--gpus=1", "--output=/dev/null", "--wrap", "sleep 120")
    assert cluster.wait_for(elsewhere, states=("RUNNING",), timeout=20)["nodelist"] == well

    # The ECC counter lasts until the GPU is reset: resuming before that is refused, with why.
    refused = cluster.run(["scontrol", "update", f"nodename={sick}", "state=resume"], check=False)
    assert refused.returncode == 1, refused
    assert f"still reports GPU {broken} has 1 uncorrected ECC error(s)" in refused.stderr, refused.stderr
    assert reasons(cluster)[sick][0] == "drng"

    break_gpu(cluster, sick, f"reset {broken}")
    def node():
        return next(n for n in cluster.nodes_json() if n["name"] == sick)

    wait_until(lambda: node()["gpu_health"] == [], 10, "the agent to report the GPU healthy again")
    assert node()["state"] == "DRAIN"  # healthy again, but only the administrator undrains
    cluster.run(["scontrol", "update", f"nodename={sick}", "state=resume"])
    assert (node()["state"], node()["reason"]) == ("UP", None)
    assert sick not in reasons(cluster)
    back = cluster.sbatch("--nodelist", sick, "--gpus=1", "--output=/dev/null", "--wrap", "true")
    assert cluster.wait_for(back, timeout=20)["state"] == "COMPLETED"
    cluster.run(["scancel", str(running), str(elsewhere)])


def test_a_gpu_fallen_off_the_bus_fails_over_only_the_jobs_holding_it(make_cluster):
    cluster = make_cluster(nodes=2, gpus_per_node=2)
    on_lost = cluster.sbatch("--gpus=1", "--requeue", "--output=/dev/null",
                             "--wrap", "echo $CUDA_VISIBLE_DEVICES > gpus-$SLURM_JOB_ID; sleep 120")
    sick = cluster.wait_for(on_lost, states=("RUNNING",), timeout=20)["batch_host"]
    well = next(n for n in cluster.node_names() if n != sick)
    lost = int(gpus_of(cluster, on_lost))
    neighbour = cluster.sbatch("--nodelist", sick, "--gpus=1", "--output=/dev/null", "--wrap", "sleep 120")
    cluster.wait_for(neighbour, states=("RUNNING",), timeout=20)

    break_gpu(cluster, sick, f"xid {lost} 79")
    expected = f"GPU {lost} XID 79 (GPU has fallen off the bus); GPU {lost} is lost"
    wait_until(lambda: reasons(cluster).get(sick, ("", ""))[1] == expected, 10,
               f"sinfo -R to show {sick} drained for the lost GPU")

    # The job on the lost GPU cannot go on: it asked for --requeue, so it runs again on the
    # healthy node; the job on the other GPU keeps running (drain semantics).
    wait_until(lambda: cluster.job(on_lost)["restart_count"] == 1 and cluster.job(on_lost)["state"] == "RUNNING",
               20, "the job on the lost GPU to run again")
    again = cluster.job(on_lost)
    assert again["nodelist"] == well, again
    assert cluster.job(neighbour)["state"] == "RUNNING"
    # Its first run's processes on the lost GPU were stopped: only the neighbour is left there.
    wait_until(lambda: next(n for n in cluster.nodes_json() if n["name"] == sick)["jobs"] == [neighbour], 15,
               f"the first run to leave {sick}")
    refused = cluster.run(["scontrol", "update", f"nodename={sick}", "state=resume"], check=False)
    assert refused.returncode == 1 and f"GPU {lost} is lost" in refused.stderr, refused.stderr
    cluster.run(["scancel", str(on_lost), str(neighbour)])
