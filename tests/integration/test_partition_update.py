"""`scontrol update PartitionName=...` on a real cluster, in Slurm's words (checked against
Slurm 22.05): DOWN queues jobs with reason PartitionDown, DRAIN and INACTIVE refuse new ones
(DRAIN still runs what is queued), limits and the state show in sinfo and scontrol."""

from __future__ import annotations

from tests.integration.cluster import wait_until


def test_an_admin_downs_drains_and_reopens_a_partition_and_changes_its_limits(cluster):
    part = cluster.api("GET", "/shoal/v1/partitions")["partitions"][0]["name"]

    def sinfo_avail() -> str:
        return cluster.run(["sinfo", "-h", "-o", "%a"]).stdout.split()[0]

    cluster.run(["scontrol", "update", f"PartitionName={part}", "State=DOWN"])
    assert sinfo_avail() == "down"
    queued = cluster.sbatch("--wrap", "true")
    wait_until(lambda: cluster.job(queued)["reason"] == "PartitionDown", 20, "the job pending for PartitionDown")

    cluster.run(["scontrol", "update", f"PartitionName={part}", "State=DRAIN"])
    assert sinfo_avail() == "drain"
    assert cluster.wait_for(queued)["state"] == "COMPLETED"  # a drained partition runs what it holds
    refused = cluster.run(["sbatch", "--wrap", "true"], check=False)
    assert refused.returncode == 1
    assert refused.stderr == ("sbatch: error: Batch job submission failed: Required partition not available "
                              "(inactive or drain)\n")

    cluster.run(["scontrol", "update", f"PartitionName={part}", "State=INACTIVE"])
    assert sinfo_avail() == "inactive"
    assert cluster.run(["sinfo"]).stdout.splitlines()[1].split()[1] == "inact"  # %.5a, as Slurm cuts it

    cluster.run(["scontrol", "update", f"PartitionName={part}", "state=up", "MaxTime=2:00:00", "DefaultTime=5",
                 "PriorityJobFactor=7"])
    shown = cluster.run(["scontrol", "show", "partition", part]).stdout
    for field in ("State=UP", "MaxTime=02:00:00", "DefaultTime=00:05:00", "PriorityJobFactor=7"):
        assert field in shown, shown
    assert cluster.run(["sinfo", "-h", "-o", "%a %l"]).stdout.split()[:2] == ["up", "2:00:00"]
    job = cluster.wait_for(cluster.sbatch("--wrap", "true"))
    assert job["state"] == "COMPLETED" and job["time_limit_s"] == 300  # the new DefaultTime

    bad = cluster.run(["scontrol", "update", "PartitionName=nope", "State=UP"], check=False)
    assert (bad.returncode, bad.stderr) == (1, "slurm_update error: Invalid partition name specified\n")
    bad = cluster.run(["scontrol", "update", f"PartitionName={part}", "State=FOO"], check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("scontrol: error: Invalid input: State=FOO"), bad.stderr
    bad = cluster.run(["scontrol", "update", f"PartitionName={part}", "MaxTime=bogus"], check=False)
    assert (bad.returncode, bad.stderr) == (1, "scontrol: error: Invalid input MaxTime=bogus\n")
