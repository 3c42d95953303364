"""salloc: an allocation with a command (or a shell) in it, srun inside, over when the command exits."""

from __future__ import annotations


def test_a_user_allocates_two_nodes_runs_steps_in_them_and_the_allocation_ends_with_the_shell(cluster):
    out = cluster.run(["salloc", "-N2", "--gpus-per-node=4", "sh", "-c",
                       'echo "$SLURM_JOB_ID $SLURM_NNODES $SLURM_JOB_NODELIST"; srun -N2 -l printenv SLURM_JOB_ID'])
    first, *tasks = out.stdout.splitlines()
    job_id, nodes, nodelist = first.split()
    assert (nodes, nodelist) == ("2", "node[01-02]")
    assert sorted(tasks) == [f"0: {job_id}", f"1: {job_id}"]  # the steps ran in salloc's allocation
    assert out.stderr.splitlines() == [f"salloc: Granted job allocation {job_id}",
                                       f"salloc: Relinquishing job allocation {job_id}"]
    job = cluster.wait_for(int(job_id))
    assert job["state"] == "COMPLETED" and job["nodes"] == 2


def test_salloc_exits_with_its_commands_status_and_a_shell_reads_from_standard_input(cluster):
    assert cluster.run(["salloc", "sh", "-c", "exit 3"], check=False).returncode == 3
    # No command: the user's shell, here fed from a pipe as a terminal would feed it.
    out = cluster.run(["salloc", "-N1"], env={"SHELL": "/bin/sh"}, input='echo "in $SLURM_JOB_ID"\nexit 0\n')
    job_id = out.stderr.split()[-1]
    assert out.stdout == f"in {job_id}\n"
    assert cluster.wait_for(int(job_id))["state"] == "COMPLETED"


def test_srun_in_an_allocation_gives_its_tasks_the_steps_counts_and_its_standard_input(cluster):
    """A step of one node and two tasks inside a two-node, four-task allocation: its tasks see the
    step's SLURM_NTASKS/SLURM_NNODES (the job's node list stays), their own SLURM_TASK_PID, and
    what is piped into srun (every task, as Slurm's default --input; --input=0 only task 0)."""
    show = ('echo "$SLURM_PROCID $SLURM_NTASKS $SLURM_NNODES $SLURM_JOB_NUM_NODES $SLURM_NODELIST '
            '$SLURM_STEP_NUM_TASKS $([ "$SLURM_TASK_PID" = "$$" ] && echo own-pid) $(cat)"')
    out = cluster.run(["salloc", "-N2", "-n4", "srun", "-N1", "-n2", "bash", "-c", show], input="piped\n")
    assert sorted(out.stdout.splitlines()) == ["0 2 1 2 node[01-02] 2 own-pid piped",
                                               "1 2 1 2 node[01-02] 2 own-pid piped"]
    out = cluster.run(["salloc", "-N1", "-n2", "srun", "-n2", "--input=0", "sh", "-c", 'echo "$SLURM_PROCID:$(cat)"'],
                      input="only-zero\n")
    assert sorted(out.stdout.splitlines()) == ["0:only-zero", "1:"]
