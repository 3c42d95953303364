"""Stories about ending jobs: time limits (TERM, then KILL after KillWait), scancel of
pending and running jobs, signals to a batch script, other users' jobs, hold and release.

One 2-node cluster (KillWait 2 s) serves the module; each test waits for its own jobs.
"""

from __future__ import annotations

import os
import shlex
import time

import pytest

from tests.integration.cluster import LocalCluster, pid_alive, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> LocalCluster:
    c = LocalCluster(tmp_path_factory.mktemp("limits"), nodes=2, gpus_per_node=4, kill_wait=2.0)
    c.up()
    yield c
    c.down()


@pytest.fixture(scope="module")
def alice(cluster) -> dict:
    token = cluster.run(["shoal", "token", "create", "--user", "alice"]).stdout.strip()
    return {"SHOAL_TOKEN": token}


def test_time_limit_sends_term_then_kill_and_ends_timeout(cluster):
    # The trap's clock is bash's own ($EPOCHREALTIME): a $(date) subshell forked in the trap
    # was seen, rarely, to die before printing (a TERM reaching it too), leaving "TERM" alone.
    marker = cluster.workdir / "timeout.marks"
    job_id = cluster.sbatch("--time=0:03", script=f"""#!/bin/bash
echo $$ > {marker}.pid
trap 'echo "TERM $EPOCHREALTIME" >> {marker}' TERM
echo "START $EPOCHREALTIME" >> {marker}
while true; do sleep 0.2; done
""")
    job = cluster.wait_for(job_id, timeout=30)
    assert job["state"] == "TIMEOUT", job
    assert job["reason"] == "TimeLimit"
    marks = dict(line.split() for line in marker.read_text().splitlines())
    assert "TERM" in marks, "the script's TERM trap never ran: no SIGTERM before SIGKILL"
    start, term = float(marks["START"]), float(marks["TERM"])
    assert 2.0 <= term - start <= 8.0, f"SIGTERM came {term - start:.1f}s after start for a 3 s limit"
    pid = int((cluster.workdir / "timeout.marks.pid").read_text())
    assert not pid_alive(pid), "the script ignored TERM and must have been killed after KillWait"
    # It stayed alive through TERM, so it was killed with SIGKILL.
    sacct = cluster.run(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode"]).stdout.strip()
    assert sacct.split("|")[0] == "TIMEOUT", sacct


def test_scancel_pending_and_running_jobs_kills_their_processes(cluster):
    pidfile = cluster.workdir / "running.pid"
    running = cluster.sbatch("--wrap", f"echo $$ > {pidfile}; sleep 300 & echo $! >> {pidfile}; wait")
    cluster.wait_for(running, states=("RUNNING",), timeout=15)
    pids = wait_until(lambda: [int(x) for x in pidfile.read_text().split()] if pidfile.exists()
                      and len(pidfile.read_text().split()) == 2 else None, 10, "the job to write its pids")
    assert all(pid_alive(p) for p in pids)
    pending = cluster.sbatch("--hold", "--wrap", "true")
    assert cluster.job(pending)["state"] == "PENDING"

    cluster.run(["scancel", str(pending), str(running)])
    assert cluster.wait_for(pending, timeout=10)["state"] == "CANCELLED"
    done = cluster.wait_for(running, timeout=20)
    assert done["state"] == "CANCELLED", done
    wait_until(lambda: not any(pid_alive(p) for p in pids), 10, "the cancelled job's processes to exit")
    sacct = cluster.run(["sacct", "-j", f"{pending},{running}", "-X", "-n", "-P", "-o", "JobID,State"]).stdout
    assert sorted(sacct.split()) == sorted([f"{pending}|CANCELLED", f"{running}|CANCELLED"]), sacct
    # Cancelling it again is an error message, not a failure (as in Slurm).
    again = cluster.run(["scancel", str(running)], check=False)
    assert again.returncode == 0 and "already completing or completed" in again.stderr


def test_scancel_signal_reaches_the_batch_scripts_trap(cluster):
    marker = cluster.workdir / "usr1.marks"
    job_id = cluster.sbatch(script=f"""#!/bin/bash
trap 'echo USR1 >> {marker}; exit 0' USR1
echo ready >> {marker}
while true; do sleep 0.2; done
""")
    cluster.wait_for(job_id, states=("RUNNING",), timeout=15)
    wait_until(lambda: marker.exists() and "ready" in marker.read_text(), 10, "the script to set its trap")
    cluster.run(["scancel", "--signal=USR1", "-b", str(job_id)])
    done = cluster.wait_for(job_id, timeout=15)
    assert marker.read_text().split() == ["ready", "USR1"]
    assert done["state"] == "COMPLETED", "the trap exits 0: the job ends on its own, not cancelled"


def test_other_users_cannot_cancel_or_hold_my_job(cluster, alice):
    job_id = cluster.sbatch("--wrap", "sleep 300")
    cluster.wait_for(job_id, states=("RUNNING",), timeout=15)
    refused = cluster.run(["scancel", str(job_id)], env=alice, check=False)
    assert refused.returncode == 1
    assert "Access/permission denied" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    time.sleep(0.5)
    assert cluster.job(job_id)["state"] == "RUNNING"
    cluster.run(["scancel", str(job_id)])
    assert cluster.wait_for(job_id)["state"] == "CANCELLED"


def test_hold_and_release(cluster):
    job_id = cluster.sbatch("--hold", "--wrap", "true")
    job = cluster.job(job_id)
    assert (job["state"], job["held"]) == ("PENDING", True), job
    wait_until(lambda: cluster.job(job_id)["reason"] == "JobHeldUser", 5, "reason JobHeldUser")
    time.sleep(1.5)
    assert cluster.job(job_id)["state"] == "PENDING", "a held job must not start"
    cluster.run(["scontrol", "release", str(job_id)])
    assert cluster.wait_for(job_id, timeout=15)["state"] == "COMPLETED"

    second = cluster.sbatch("--begin=now+3", "--wrap", "true")
    cluster.run(["scontrol", "hold", str(second)])
    reason = cluster.run(["squeue", "-h", "-j", str(second), "-o", "%T %r"]).stdout.split()
    assert reason == ["PENDING", "JobHeldUser"]
    time.sleep(3.5)
    assert cluster.job(second)["state"] == "PENDING", "past its begin time, a held job still waits"
    cluster.run(["scontrol", "release", str(second)])
    assert cluster.wait_for(second, timeout=15)["state"] == "COMPLETED"


def _counter(name: str, marks) -> str:
    """bash that notes each SIGTERM it gets (and SIGINT) and lives on: only SIGKILL ends it."""
    return (f"trap 'echo \"{name} TERM $EPOCHREALTIME\" >> {marks}' TERM; "
            f"trap 'echo \"{name} INT $EPOCHREALTIME\" >> {marks}' INT; "
            f"echo \"{name} ready $BASHPID\" >> {marks}; while :; do sleep 0.1; done")


def _marks(path) -> list[tuple[str, str]]:
    return [(line.split()[0], line.split()[1]) for line in path.read_text().splitlines() if len(line.split()) == 3]


def test_scancel_sends_each_process_one_sigterm_then_sigkill_after_killwait(cluster):
    """The script, a child in its process group, a process that left it (setsid: the job's
    cgroup reaches it) and an srun task each trap TERM and live on: each gets exactly one
    SIGTERM, and SIGKILL ends them KillWait later. srun, TERMed with the script, says so in
    Slurm's words."""
    marks = cluster.workdir / "oneterm.marks"
    names = ["script", "child", "task"] + (["detached"] if os.geteuid() == 0 else [])
    job_id = cluster.sbatch("--output=oneterm.out", script=f"""#!/bin/bash
({_counter("child", marks)}) &
{"setsid bash -c " + shlex.quote(_counter("detached", marks)) + " &" if "detached" in names else ""}
srun bash -c {shlex.quote(_counter("task", marks))} &
{_counter("script", marks)}
""")
    cluster.wait_for(job_id, states=("RUNNING",), timeout=15)
    wait_until(lambda: marks.exists() and {n for n, what in _marks(marks) if what == "ready"} == set(names), 20,
               "every process to set its trap")
    cluster.run(["scancel", str(job_id)])
    assert cluster.wait_for(job_id, timeout=30)["state"] == "CANCELLED"
    pids = [int(line.split()[2]) for line in marks.read_text().splitlines() if " ready " in line]
    wait_until(lambda: not any(pid_alive(p) for p in pids), 20, "the job's processes to be gone")
    time.sleep(3)  # KillWait (2 s) and more: a late second TERM would be noted by now
    terms = [n for n, what in _marks(marks) if what == "TERM"]
    assert sorted(terms) == sorted(names), f"SIGTERMs received: {terms}"
    out = (cluster.workdir / "oneterm.out").read_text()
    assert "srun: forcing job termination" in out, out
    assert "srun: Job step aborted: Waiting up to 4 seconds for job step to finish." in out, out


def test_srun_signalled_ends_its_step_with_one_sigterm_then_sigkill_after_killwait(cluster):
    """The script TERMs its own srun (as `timeout` would): srun asks the node to end the step,
    the task gets one TERM and, as it lives on, SIGKILL KillWait later; the job goes on. A
    first Ctrl-C shows the step's tasks; a second within a second passes SIGINT on and ends
    the step likewise."""
    marks = cluster.workdir / "srunterm.marks"
    job_id = cluster.sbatch("--output=srunterm.out", script=f"""#!/bin/bash
n=0
for how in TERM INT; do
  srun bash -c {shlex.quote(_counter("task-$SLURM_STEP_ID", marks))} &
  pid=$!
  until grep -q "task-$n ready" {marks} 2>/dev/null; do sleep 0.1; done
  sent=${{EPOCHREALTIME/./}}
  if [ $how = TERM ]; then kill -TERM $pid; else kill -INT $pid; sleep 0.3; kill -INT $pid; fi
  wait $pid
  echo "srun $how exit $? after $(( ${{EPOCHREALTIME/./}} - sent ))"
  n=$((n + 1))
done
echo done
""")
    done = cluster.wait_for(job_id, timeout=60)
    out = (cluster.workdir / "srunterm.out").read_text()
    assert done["state"] == "COMPLETED", out
    marks_seen = _marks(marks)
    assert sorted(what for n, what in marks_seen if n == "task-0") == ["TERM", "ready"], marks_seen
    assert sorted(what for n, what in marks_seen if n == "task-1") == ["INT", "TERM", "ready"], marks_seen
    for how in ("TERM", "INT"):
        line = next(x for x in out.splitlines() if x.startswith(f"srun {how} exit"))
        code, took = line.split()[3], int(line.split()[5]) / 1e6
        assert code == "137" and 1.8 <= took <= 15, f"{line}: the task must be KILLed KillWait (2 s) after its TERM"
    assert out.count("srun: forcing job termination") == 2, out
    assert out.count("srun: Job step aborted: Waiting up to 4 seconds for job step to finish.") == 2, out
    assert "srun: interrupt (one more within 1 sec to abort)" in out, out
    assert f"srun: StepId={job_id}.1 task 0: running" in out, out
    assert f"srun: sending Ctrl-C to StepId={job_id}.1" in out, out
    assert out.count("task 0: Killed") == 2 and out.rstrip().endswith("done"), out
