"""A job never runs twice at once, and what really happened wins (docs/FENCING.md).

A --requeue job records every run's start, ticks and end in a file. Its node's agent is cut
off by a downed veth link, killed -9 and SIGSTOPped in turn: each time the run's supervisor
stops it by itself when the node's lease runs out, before the server restarts the job
elsewhere, and no two runs ever overlap. Jobs that end by themselves while their agent is
dead are corrected when it returns: NODE_FAIL becomes their real end, a requeued job not yet
restarted is taken back, a restarted one is left to stand, and AdminComment says why.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.integration.cluster import LocalCluster, agent_argv, wait_until
from tests.integration.test_agent_restart import _kill_agent, _start_agent
from tests.integration.test_partition import partitioned  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


def _ticking(log) -> str:
    """A script that writes `start`, a tick every 0.1 s and `end` lines (RUN NODE TIME), and
    runs an srun step that ticks into the same file: a step left alive extends its run."""
    note = f'echo "$1 $SLURM_RESTART_COUNT $SLURMD_NODENAME $(date +%s.%N)" >> {log}'
    return f"""#!/bin/bash
note() {{ {note}; }}
trap 'note end; exit 143' TERM
note start
srun bash -c 'while :; do {note.replace("$1", "step")}; sleep 0.1; done' &
while [ ! -e {log}.done ]; do note tick; sleep 0.1; done
note end
"""


def _runs(log) -> dict[int, tuple[str, float, float]]:
    """Each run's node and the first and last moment it was seen alive."""
    runs: dict[int, tuple[str, float, float]] = {}
    for line in log.read_text().splitlines():
        if len(line.split()) != 4:
            continue  # a line still being written
        _, run, node, t = line.split()
        r, t = int(run), float(t)
        n, first, last = runs.get(r, (node, t, t))
        runs[r] = (n, min(first, t), max(last, t))
    return runs


def _assert_never_overlapped(log) -> dict[int, tuple[str, float, float]]:
    runs = _runs(log)
    spans = sorted(runs.items(), key=lambda r: r[1][1])
    for (a, (na, _, end_a)), (b, (nb, start_b, _)) in zip(spans, spans[1:]):
        assert end_a < start_b, \
            f"run {a} on {na} was alive until {end_a:.2f}, after run {b} on {nb} began at {start_b:.2f}"
    return runs


def _restarted(cluster: LocalCluster, job: int, log, after: int) -> dict:
    """The job running again, in a run later than ``after`` that has begun its log."""
    def again():
        j = cluster.job(job)
        started = j["restart_count"] > after and j["state"] == "RUNNING" and j["restart_count"] in _runs(log)
        return j if started else None

    return wait_until(again, 60, f"job {job} to run again (after run {after})")


def test_a_requeue_job_never_runs_twice_at_once_when_its_agent_is_cut_off_killed_or_stopped(partitioned):  # noqa: F811
    cluster = partitioned
    log = cluster.workdir / "runs.log"
    for n in ("node01", "node02"):  # the first run on node03, the node behind the veth link
        cluster.run(["scontrol", "update", f"nodename={n}", "state=drain", "reason=test"])
    job = cluster.sbatch("--requeue", "--output=/dev/null", script=_ticking(log))
    assert cluster.wait_for(job, states=("RUNNING",), timeout=20)["nodelist"] == "node03"
    wait_until(lambda: log.exists() and 0 in _runs(log), 15, "the first run to start")
    for n in ("node01", "node02"):
        cluster.run(["scontrol", "update", f"nodename={n}", "state=resume"])

    cluster.cut()  # a network partition: the agent lives, cut off
    try:
        again = _restarted(cluster, job, log, 0)
        host, run = again["batch_host"], again["restart_count"]
    finally:
        cluster.heal()
    _assert_never_overlapped(log)
    agents: dict[str, subprocess.Popen] = {}  # node -> its agent, started again here

    def agent_pid(node: str) -> int:
        return agents[node].pid if node in agents else cluster.agent_pid(node)

    try:
        # kill -9 of the agent (its supervisor is alone), SIGSTOP (the agent neither reports
        # nor fences), twice each, wherever the job runs by then.
        for fault in ("kill", "stop", "kill", "stop"):
            if fault == "kill":
                cmd = agent_argv(agent_pid(host))
                os.kill(agent_pid(host), signal.SIGKILL)
                again = _restarted(cluster, job, log, run)
                agents[host] = _start_agent(cluster, cmd)
            else:
                pid = agent_pid(host)
                os.kill(pid, signal.SIGSTOP)
                try:
                    again = _restarted(cluster, job, log, run)
                finally:
                    os.kill(pid, signal.SIGCONT)
            moved, run = again["batch_host"], again["restart_count"]
            assert moved != host
            wait_until(lambda: next(n for n in cluster.nodes_json() if n["name"] == host)["state"] == "UP", 30,
                       f"{host}'s agent to be back")
            _assert_never_overlapped(log)
            host = moved
        (log.parent / f"{log.name}.done").touch()
        done = cluster.wait_for(job, timeout=30)
        # Five faults, five restarts (more only if a loaded machine delayed a report past a lease).
        assert done["state"] == "COMPLETED" and done["restart_count"] >= 5, done
        runs = _assert_never_overlapped(log)
        assert sorted(runs) == list(range(done["restart_count"] + 1)) and runs[0][0] == "node03", runs
        stepped = {int(line.split()[1]) for line in log.read_text().splitlines() if line.startswith("step")}
        assert 0 in stepped, "the first run's srun step never ticked"
    finally:
        for agent in agents.values():
            agent.terminate()
            agent.wait(timeout=30)


@pytest.mark.parametrize("supervisor", ["shoal-stepd", "python"])
def test_jobs_that_ended_while_their_agent_was_dead_are_corrected_when_it_returns(make_cluster, monkeypatch,
                                                                                  supervisor):
    """Under either supervisor (the agents inherit SHOAL_STEPD); the cut, kill and stop rounds
    above run under the compiled one."""
    if supervisor == "python":
        monkeypatch.setenv("SHOAL_STEPD", "python")
    cluster: LocalCluster = make_cluster(nodes=2, gpus_per_node=0, heartbeat_timeout=4)
    w = cluster.workdir
    go, log = w / "go", w / "fenced.log"
    cluster.run(["scontrol", "update", "nodename=node02", "state=drain", "reason=test"])
    wait = f"while [ ! -e {go} ]; do sleep 0.1; done"
    plain = cluster.sbatch("-w", "node01", "--output=/dev/null", "--wrap", f"{wait}; exit 0")
    taken_back = cluster.sbatch("-w", "node01", "--requeue", "--output=/dev/null",
                                "--wrap", f"echo ran >> {w}/taken_back; {wait}; exit 3")
    fenced = cluster.sbatch("-w", "node01", "--requeue", "--output=/dev/null", script=_ticking(log))
    rerun = cluster.sbatch("--requeue", "--output=/dev/null",
                           "--wrap", f"echo $SLURM_RESTART_COUNT >> {w}/rerun; {wait}")
    for j in (plain, taken_back, fenced, rerun):
        assert cluster.wait_for(j, states=("RUNNING",), timeout=20)["nodelist"] == "node01"
    wait_until(lambda: (w / "taken_back").exists() and (w / "rerun").exists() and log.exists(), 15, "all to start")
    cluster.run(["scontrol", "update", "nodename=node02", "state=resume"])

    cmd = _kill_agent(cluster, "node01")
    go.touch()  # three end by themselves, unseen; the ticking one goes on until the fence
    assert cluster.wait_for(plain, timeout=30)["state"] == "NODE_FAIL"
    assert cluster.wait_for(rerun, timeout=30)["restart_count"] == 1  # ran again on node02, and ended
    for j in (taken_back, fenced):
        assert (cluster.job(j)["state"], cluster.job(j)["restart_count"]) == ("PENDING", 1)
    agent = _start_agent(cluster, cmd)
    try:
        a = wait_until(lambda: (j := cluster.job(plain))["state"] == "COMPLETED" and j, 30, "the correction")
        assert a["exit_code"] == 0 and "corrected from NODE_FAIL to COMPLETED" in a["admin_comment"], a
        b = wait_until(lambda: (j := cluster.job(taken_back))["state"] != "PENDING" and j, 30, "the take-back")
        assert (b["state"], b["exit_code"], b["restart_count"], b["nodelist"]) == ("FAILED", 3, 0, "node01"), b
        assert "corrected from requeued to FAILED" in b["admin_comment"]
        assert (w / "taken_back").read_text() == "ran\n"  # never run again
        d = wait_until(lambda: (j := cluster.job(rerun))["admin_comment"] and j, 30, "the rerun's note")
        assert (d["state"], d["restart_count"]) == ("COMPLETED", 1) and "which stands" in d["admin_comment"], d
        assert (w / "rerun").read_text().split() == ["0", "1"]
        # The fenced run is not corrected: the job runs again, after the fence, never alongside.
        _restarted(cluster, fenced, log, 0)
        (log.parent / f"{log.name}.done").touch()
        assert cluster.wait_for(fenced, timeout=30)["state"] == "COMPLETED"
        runs = _assert_never_overlapped(log)
        assert sorted(runs) == [0, 1] and cluster.job(fenced)["admin_comment"] is None
        sacct = cluster.run(["sacct", "-j", str(plain), "-X", "-n", "-P", "-o", "State,ExitCode,AdminComment"])
        state, code, comment = sacct.stdout.strip().split("|")
        assert (state, code) == ("COMPLETED", "0:0") and "node01" in comment
        show = cluster.run(["scontrol", "show", "job", str(taken_back)]).stdout
        assert "AdminComment=run 0 on node01" in show and "JobState=FAILED" in show
    finally:
        agent.terminate()
        agent.wait(timeout=30)
