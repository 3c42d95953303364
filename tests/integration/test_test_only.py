"""sbatch --test-only says where and when a job would start, and submits nothing."""


def test_test_only_plans_the_job_without_submitting_it(cluster):
    out = cluster.run(["sbatch", "--test-only", "-N2", "--gpus-per-node=4", "--wrap", "true"])
    assert out.returncode == 0
    assert "to start at" in out.stderr and "on nodes" in out.stderr
    names = cluster.node_names()
    assert f"{names[0][:-2]}[{names[0][-2:]}-{names[1][-2:]}]" in out.stderr
    assert cluster.jobs() == []  # rolled back: no job was stored

    bad = cluster.run(["sbatch", "--test-only", "--gpus-per-node=16", "--wrap", "true"], check=False)
    assert bad.returncode == 1 and "16" in bad.stderr and "Traceback" not in bad.stderr
