"""The first story: a newcomer submits a two-node GPU job and it runs across both nodes."""


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
