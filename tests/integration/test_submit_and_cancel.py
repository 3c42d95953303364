"""sbatch --test-only plans without submitting; scancel by name cancels only that name."""


def test_test_only_plans_the_job_without_submitting_it(cluster):
    out = cluster.run(["sbatch", "--test-only", "-N2", "--gpus-per-node=4", "--wrap", "true"])
    assert out.returncode == 0
    assert "to start at" in out.stderr and "on nodes" in out.stderr
    names = cluster.node_names()
    assert f"{names[0][:-2]}[{names[0][-2:]}-{names[1][-2:]}]" in out.stderr
    assert cluster.jobs() == []  # rolled back: no job was stored

    bad = cluster.run(["sbatch", "--test-only", "--gpus-per-node=16", "--wrap", "true"], check=False)
    assert bad.returncode == 1 and "16" in bad.stderr and "Traceback" not in bad.stderr


def test_scancel_by_name_cancels_only_that_name(cluster):
    keep = cluster.sbatch("--hold", "-J", "keep", "--wrap", "true")
    gone = [cluster.sbatch("--hold", "-J", "sweep", "--wrap", "true") for _ in range(2)]
    cluster.run(["scancel", "--name", "sweep"])
    for job_id in gone:
        assert cluster.job(job_id)["state"] == "CANCELLED"
    assert cluster.job(keep)["state"] == "PENDING"
