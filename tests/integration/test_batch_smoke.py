"""The first story: a newcomer submits a two-node GPU job and it runs across both nodes."""

import re


def test_two_node_gpu_job_runs_a_step_on_every_node_with_its_own_ranks(cluster):
    job_id = cluster.sbatch(script="""#!/bin/bash
#SBATCH --job-name=smoke
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
srun bash -c 'echo rank=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES'
""")
    job = cluster.wait_for(job_id)
    assert job["state"] == "COMPLETED", job
    lines = sorted((cluster.workdir / f"slurm-{job_id}.out").read_text().split())
    ranks = sorted(line for line in lines if line.startswith("rank="))
    assert ranks == ["rank=0", "rank=1", "rank=2", "rank=3"]
    out = (cluster.workdir / f"slurm-{job_id}.out").read_text()
    names = cluster.node_names()
    for rank, node in ((0, 0), (1, 0), (2, 1), (3, 1)):
        assert f"rank={rank} local={rank % 2} node={node}" in out
    assert f"host={names[0]}" in out and f"host={names[1]}" in out
    sacct = cluster.run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode"])
    assert sacct.stdout.strip() == "COMPLETED|0:0"


def test_a_failed_task_is_reported_when_it_ends_and_kill_on_bad_exit_stops_the_step(cluster):
    """srun names each failed task as it ends, grouped per node in Slurm's words; with
    --kill-on-bad-exit (-K) one failure ends the step at once: the rest are Killed, and srun
    exits with the failed task's code. Without it, srun waits for every task."""
    job_id = cluster.sbatch(script="""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
start=$SECONDS
srun -K bash -c 'if [ $SLURM_PROCID = 3 ]; then sleep 1; exit 3; fi; exec sleep 60'
echo "K rc=$? after $((SECONDS - start))s"
srun bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 4; fi; sleep 2; echo done $SLURM_PROCID'
echo "plain rc=$?"
""")
    job = cluster.wait_for(job_id, timeout=60)
    out = (cluster.workdir / f"slurm-{job_id}.out").read_text()
    first, second = cluster.node_names()
    assert f"srun: error: {second}: task 3: Exited with exit code 3\n" in out, out
    assert f"srun: launch/slurm: _step_signal: Terminating StepId={job_id}.0\n" in out, out
    assert f"srun: error: {first}: tasks 0-1: Killed\n" in out, out
    assert f"srun: error: {second}: task 2: Killed\n" in out, out
    k_rc, seconds = re.search(r"^K rc=(\d+) after (\d+)s$", out, re.M).groups()
    assert k_rc == "3" and int(seconds) < 30, out  # not the 60 s the other tasks would sleep
    assert f"srun: error: {first}: task 1: Exited with exit code 4\n" in out, out
    assert sorted(re.findall(r"^done (\d)$", out, re.M)) == ["0", "2", "3"], out
    assert "plain rc=4" in out, out
    assert job["state"] == "COMPLETED", job  # the script's own exit (its last echo) decides
