"""salloc: an allocation with a command (or a shell) in it, srun inside, over when the command exits."""

from __future__ import annotations

import time

from tests.integration.terminal import Terminal


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


def test_srun_pty_in_salloc_gives_task_zero_a_terminal_of_sruns_size(cluster):
    """``salloc -N2`` then ``srun --pty bash``, driven through a pseudo-terminal: task 0's shell
    runs on a terminal of srun's terminal's size that follows its resizes, every key (^C
    included) reaches it, the other task's output is discarded, srun exits as the shell did and
    leaves its terminal as it found it."""
    term = Terminal(["salloc", "-N2", "sh", "-c", 'srun --pty bash --norc --noprofile; echo "srun=$?"; '
                     'stty -a | tr " " "\\n" | grep -x -- "-*icanon"'], {**cluster.env, "PS1": "$ "}, 33, 101)
    try:
        term.read_until(b"$ ")
        term.write(b'tty; stty size; echo "task-$SLURM_PROCID-of-$SLURM_NTASKS-$SLURM_PTY_WIN_ROW"\n')
        text = term.read_until(b"task-0-of-2-33")
        assert "/dev/pts/" in text and "33 101\r\n" in text
        term.resize(20, 70)  # srun gets SIGWINCH and sends the new size on
        time.sleep(1)
        term.write(b"stty size\n")
        term.read_until(b"20 70\r\n")
        term.write(b"sleep 60; echo slept\n")
        time.sleep(1)
        term.write(b"\x03")  # raw mode: ^C is a key for the remote terminal, not srun's SIGINT
        term.write(b"echo after-$((1+1))\n")
        term.read_until(b"after-2", timeout=30)
        term.write(b"exit 7\n")
        text = term.read_until(b"icanon")
        lines = text.replace("\r", "").splitlines()
        assert "srun=7" in lines and "icanon" in lines, text  # srun's status; the terminal cooked again
        assert "slept" not in lines and not any(line.startswith("task-1") for line in lines), text
        assert term.wait() == 0
    finally:
        term.close()


def test_srun_pty_in_a_batch_job_and_outside_an_allocation_runs_task_zero_on_a_terminal(cluster):
    """In a batch script srun has no terminal of its own: task 0 still gets one (its output, a
    terminal's, ends lines with CR LF); the other tasks' output goes to /dev/null, as Slurm's."""
    job_id = cluster.sbatch("-N2", "-n2", "--output=pty.out", "--wrap",
                            "srun --pty sh -c 'tty >/dev/null && echo \"pty-$SLURM_PROCID\"; "
                            "echo \"out-$SLURM_PROCID\" | tee -a both.txt; echo \"$SLURM_PTY_WIN_ROW\" >>both.txt'")
    job = cluster.wait_for(job_id, timeout=60)
    assert job["state"] == "COMPLETED", cluster.diagnostics(job)
    assert (cluster.workdir / "pty.out").read_bytes() == b"pty-0\r\nout-0\r\n"
    # Both tasks ran, and both see the terminal's size (24x80: srun itself has no terminal here).
    assert sorted((cluster.workdir / "both.txt").read_text().split()) == ["24", "24", "out-0", "out-1"]
    # Outside an allocation, srun --pty gets one of its own first (the everyday `srun --pty bash`).
    out = cluster.run(["srun", "-N1", "--pty", "sh", "-c", 'tty >/dev/null && echo "own-$SLURM_PROCID"'])
    assert out.stdout.replace("\r\n", "\n") == "own-0\n"
