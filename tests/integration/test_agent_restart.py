"""An agent killed under running jobs and started again, as after a crash or an upgrade: the
jobs never notice. Each batch script runs under its own supervisor, which outlives the agent
and keeps the exit code; the new agent re-adopts the runs, reports them running, and, when
they end, their real exit codes. srun steps into them, scancel and its signals work as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.integration.cluster import LocalCluster, agent_argv, wait_until


def _kill_agent(cluster: LocalCluster, name: str) -> list[str]:
    """kill -9 the node's agent; its command line, to start it again."""
    pid = cluster.agent_pid(name)
    cmd = agent_argv(pid)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), 10, "the killed agent to be gone")
    return cmd


def _start_agent(cluster: LocalCluster, cmd: list[str]) -> subprocess.Popen:
    with open(cluster.root / "agent-restarted.log", "ab") as log:
        return subprocess.Popen(cmd, env=cluster.env, start_new_session=True, stdout=log, stderr=log)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_jobs_survive_a_restart_of_their_agent_and_end_with_their_own_exit_codes(make_cluster):
    cluster = make_cluster(nodes=1, gpus_per_node=0)
    w = cluster.workdir
    go = w / "go"
    wait_go = f"while [ ! -e {go} ]; do sleep 0.1; done"
    ok = cluster.sbatch("--output=ok.out", script=f"""#!/bin/bash
echo "launched $$" >> {w}/launches-ok
echo before the restart
{wait_go}
srun bash -c 'echo "step on $SLURMD_NODENAME"'
echo after the restart
""")
    three = cluster.sbatch("--output=three.out", "--wrap", f"echo launched >> {w}/launches-three; {wait_go}; exit 3")
    trapped = cluster.sbatch("--output=trapped.out", script=f"""#!/bin/bash
trap 'echo got USR1; exit 0' USR1
echo "$$" > {w}/trapped.pid
while true; do sleep 0.1; done
""")
    doomed = cluster.sbatch("--output=doomed.out", "--wrap", f"echo $$ > {w}/doomed.pid; exec sleep 300")
    for job in (ok, three, trapped, doomed):
        cluster.wait_for(job, states=("RUNNING",), timeout=30)
    wait_until(lambda: all((w / f).exists() for f in ("launches-ok", "launches-three", "trapped.pid", "doomed.pid")),
               20, "all four scripts to start")
    doomed_pid = int((w / "doomed.pid").read_text())
    name = cluster.node_names()[0]
    agent = _start_agent(cluster, _kill_agent(cluster, name))
    try:
        # The new agent has adopted them: they run on, reported running, not launched again.
        wait_until(lambda: "re-adopted 4 run(s)" in (cluster.root / "agent-restarted.log").read_text(), 30,
                   "the new agent to re-adopt the four runs")
        for job in (ok, three, trapped, doomed):
            assert cluster.job(job)["state"] == "RUNNING"
        assert _alive(doomed_pid)

        # scancel reaches an adopted job: its processes are killed and it ends CANCELLED.
        cluster.run(["scancel", str(doomed)])
        assert cluster.wait_for(doomed, timeout=30)["state"] == "CANCELLED"
        wait_until(lambda: not _alive(doomed_pid), 10, "the cancelled job's processes to be gone")

        # scancel -b -s USR1 reaches its batch shell, whose trap ends it normally.
        cluster.run(["scancel", "-b", "-s", "USR1", str(trapped)])
        job = cluster.wait_for(trapped, timeout=30)
        assert (job["state"], job["exit_code"]) == ("COMPLETED", 0), job
        assert (w / "trapped.out").read_text().endswith("got USR1\n")

        # The others go on to an srun step through the new agent, and end with their own codes.
        go.touch()
        job = cluster.wait_for(ok, timeout=40)
        assert (job["state"], job["exit_code"]) == ("COMPLETED", 0), job
        assert (w / "ok.out").read_text() == f"before the restart\nstep on {name}\nafter the restart\n"
        job = cluster.wait_for(three, timeout=30)
        assert (job["state"], job["exit_code"]) == ("FAILED", 3), job
        for f in ("launches-ok", "launches-three"):
            assert (w / f).read_text().count("launched") == 1  # never launched twice
        sacct = cluster.run(["sacct", "-j", f"{ok},{three}", "-X", "-n", "-P", "-o", "JobID,State,ExitCode"])
        assert sacct.stdout.split() == [f"{ok}|COMPLETED|0:0", f"{three}|FAILED|3:0"]
    finally:
        agent.terminate()  # an agent's TERM stops the node's work, as `shoal down` expects
        agent.wait(timeout=30)


def test_a_job_that_ends_while_its_agent_is_down_is_reported_when_it_comes_back(make_cluster):
    cluster = make_cluster(nodes=1, gpus_per_node=0)
    go, started = cluster.workdir / "go", cluster.workdir / "started"
    job_id = cluster.sbatch("--wrap", f"touch {started}; while [ ! -e {go} ]; do sleep 0.1; done; exit 4")
    cluster.wait_for(job_id, states=("RUNNING",), timeout=30)
    wait_until(started.exists, 20, "the script to start")
    cmd = _kill_agent(cluster, cluster.node_names()[0])
    jobdir = next((cluster.root / "state").rglob(f"jobs/{job_id}.*"))
    go.touch()
    wait_until(lambda: (jobdir / "status.json").exists(), 20, "the job to end with no agent watching")
    assert cluster.job(job_id)["state"] == "RUNNING"  # nobody has told the server yet
    agent = _start_agent(cluster, cmd)
    try:
        job = cluster.wait_for(job_id, timeout=40)
        assert (job["state"], job["exit_code"]) == ("FAILED", 4), job
        wait_until(lambda: not jobdir.exists(), 40, "the agent to forget the finished run's directory")
    finally:
        agent.terminate()
        agent.wait(timeout=30)
