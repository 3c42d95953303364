"""The per-run supervisor alone: it keeps a batch script's exit code and how it died, writes
it so no reader sees half of it, passes on a kill sent before its task started, and outlives
the process that started it, which a new agent then re-adopts by the run's directory.

Each story runs under both supervisors, the compiled ``shoal-stepd`` (skipped when it is not
installed: ``make frontend``) and ``python -m shoal.agent.supervise`` (``SHOAL_STEPD=python``):
the agent cannot tell which one ran."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shoal.agent import supervise
from shoal.agent.identity import OpenAs, output_flags
from shoal.agent.runtime import Supervised


def _launch(tmp_path: Path, script: str) -> tuple[Path, supervise.Launch]:
    jobdir = tmp_path / "jobs" / "7.0"
    jobdir.mkdir(parents=True)
    out = tmp_path / "slurm-7.out"
    launch = supervise.Launch(key="7.0", job_id=7, run=0, user="alice", argv=["/bin/sh", "-c", script],
                              env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path), cwd_fallback="/tmp",
                              files=[OpenAs(1, str(out), output_flags(False)), OpenAs(2, same_as=1)], identity=None)
    return jobdir, launch


@pytest.fixture(params=["shoal-stepd", "python"])
def supervisor(request, monkeypatch) -> str:
    if request.param == "python":
        monkeypatch.setenv("SHOAL_STEPD", "python")
    else:
        monkeypatch.delenv("SHOAL_STEPD", raising=False)
        if supervise.stepd() is None:
            pytest.skip("shoal-stepd is not installed next to this Python (make frontend)")
    return request.param


def _wait_for(predicate, timeout: float = 10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_the_exit_code_and_the_output_are_kept(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "echo to stdout; echo to stderr >&2; exit 3")
    before = time.time()
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert (status.exit_code, status.signal, status.reason) == (3, 0, None)
    assert before <= status.end_time <= time.time()
    assert (tmp_path / "slurm-7.out").read_text() == "to stdout\nto stderr\n"
    assert not supervise.supervisor_alive(jobdir)
    for name in (supervise.LAUNCH, supervise.LAUNCH_BIN):  # they hold the job's token
        assert not (jobdir / name).exists() or oct((jobdir / name).stat().st_mode & 0o777) == "0o600"
    assert (jobdir / supervise.LAUNCH_BIN).exists() == (supervisor == "shoal-stepd")


def test_a_task_killed_by_a_signal_ends_with_that_signal(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "echo started; exec sleep 60")
    task = Supervised(jobdir, supervise.start(jobdir, launch))
    _wait_for(lambda: task.pid is not None)
    assert not (jobdir / supervise.STATUS).exists()  # no status while it runs
    task.send(signal.SIGTERM)
    status = task.wait()
    assert (status.exit_code, status.signal) == (0, signal.SIGTERM)


def test_a_kill_sent_before_the_task_started_is_passed_on(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "exec sleep 60")
    task = Supervised(jobdir, supervise.start(jobdir, launch))
    # Nearly always the supervisor is still starting here, and the signal goes to it; the
    # compiled one is sometimes quicker than this line, and then the task gets it directly.
    # Either way the task must end by that signal.
    task.send(signal.SIGTERM)
    status = task.wait()
    assert (status.exit_code, status.signal) == (0, signal.SIGTERM)


def test_a_launch_that_fails_says_why(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "true")
    launch = supervise.Launch(**{**launch.__dict__, "files": [OpenAs(1, "/nonexistent/dir/out", output_flags(False))]})
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert status.exit_code == 1
    assert status.reason == "launch failed: No such file or directory: /nonexistent/dir/out"


def test_the_task_has_a_session_of_its_own_and_no_signal_blocked(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "exec cat /proc/self/stat /proc/self/status")
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert (status.exit_code, status.reason) == (0, None)
    out = (tmp_path / "slurm-7.out").read_text()
    pid, _, rest = out.partition(" (")
    pgrp, session = rest.rsplit(") ", 1)[1].split()[2:4]
    assert pid == pgrp == session == str(supervise.read_task_pid(jobdir))
    assert "SigBlk:\t0000000000000000\n" in out


def test_a_command_is_found_on_the_jobs_path_and_one_that_is_not_says_so(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "exit 4")
    launch = supervise.Launch(**{**launch.__dict__, "argv": ["sh", "-c", "exit 4"]})
    assert Supervised(jobdir, supervise.start(jobdir, launch)).wait().exit_code == 4
    jobdir = tmp_path / "jobs" / "8.0"
    jobdir.mkdir()
    launch = supervise.Launch(**{**launch.__dict__, "argv": ["no-such-command-anywhere"]})
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert (status.exit_code, status.reason) == (1, "launch failed: execve(): No such file or directory")


def test_a_working_directory_that_cannot_be_entered_sends_the_job_to_tmp_with_a_note(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "pwd")
    launch = supervise.Launch(**{**launch.__dict__, "cwd": str(tmp_path / "gone")})
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert (status.exit_code, status.reason) == (0, None)
    assert (tmp_path / "slurm-7.out").read_text() == (
        f"slurmstepd: error: couldn't chdir to `{tmp_path}/gone': No such file or directory: going to /tmp instead\n"
        "/tmp\n")


def test_a_launch_holding_a_nul_never_runs(tmp_path, supervisor):
    """A NUL cannot reach an exec; nor may it shift shoal-stepd's fields (into "no identity")."""
    ran = tmp_path / "ran"
    jobdir, launch = _launch(tmp_path, f"touch {ran}")
    launch = supervise.Launch(**{**launch.__dict__, "env": {"PATH": os.environ["PATH"], "X": "a\0/\0/tmp\0"}})
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert status.exit_code == 1 and status.reason in ("launch failed: unreadable launch file",
                                                       "supervisor lost: exit status unknown")
    assert not ran.exists()


def test_the_supervisor_outlives_the_agent_that_started_it_and_is_adopted(tmp_path, supervisor):
    """An 'agent' process starts the supervisor and dies at once; the run goes on, and a
    handle made from the directory alone (a new agent's) sees it end with its exit code."""
    go = tmp_path / "go"
    jobdir, launch = _launch(tmp_path, f"while [ ! -e {go} ]; do sleep 0.05; done; exit 5")
    (jobdir / supervise.LAUNCH).write_text(json.dumps(launch.to_json()))
    subprocess.run([sys.executable, "-c", (
        "import sys; from pathlib import Path; from shoal.agent import supervise; "
        "d = Path(sys.argv[1]); supervise.start(d, supervise.read_launch(d)); sys.exit(0)"), str(jobdir)],
        check=True, timeout=30)
    assert supervise.supervisor_alive(jobdir)
    adopted = Supervised(jobdir)
    assert supervise.read_launch(jobdir).key == "7.0"
    go.touch()
    status = adopted.wait(poll_s=0.05)
    assert (status.exit_code, status.signal, status.reason) == (5, 0, None)


def test_a_supervisor_gone_without_a_status_is_reported_failed(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "exec sleep 60")
    popen = supervise.start(jobdir, launch)
    task = Supervised(jobdir, popen)
    _wait_for(lambda: task.pid is not None)
    pid = task.pid
    popen.kill()  # the supervisor, not the task
    popen.wait()
    try:
        status = Supervised(jobdir).wait(poll_s=0.05)
        assert status.exit_code == 1 and status.reason == "supervisor lost: exit status unknown"
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_the_status_file_is_never_seen_half_written(tmp_path):
    path = tmp_path / supervise.STATUS
    big = {"exit_code": 0, "signal": 0, "end_time": 1.0, "reason": "x" * 200_000}
    seen: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(json.loads(path.read_text())["reason"][:1])
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(50):
            supervise.write_json_atomic(path, {**big, "exit_code": i})
    finally:
        stop.set()
        reader.join()
    assert seen and set(seen) == {"x"}  # json.loads never met a part
    assert json.loads(path.read_text())["exit_code"] == 49
    assert [p.name for p in tmp_path.iterdir()] == [supervise.STATUS]  # no temp file left behind


def _lease(tmp_path: Path, expires_in: float, grace_s: float = 1.0, check_s: float = 0.1) -> Path:
    path = tmp_path / supervise.LEASE
    supervise.write_lease(path, supervise.Lease(supervise.boottime() + expires_in, grace_s, check_s))
    return path


def test_a_run_whose_lease_runs_out_is_fenced_by_its_supervisor_alone(tmp_path, supervisor):
    """No agent watches: the supervisor reads the node's lease itself. Renewed, the run goes on;
    run out, the job gets SIGTERM (which this one ignores), then SIGKILL after the grace, and
    the status says it was fenced."""
    lease = _lease(tmp_path, 0.6, grace_s=1.0)
    jobdir, launch = _launch(tmp_path, "trap 'echo got TERM' TERM; while :; do sleep 0.05; done")
    task = Supervised(jobdir, supervise.start(jobdir, launch, lease))
    for _ in range(4):  # an agent that reports keeps the lease ahead
        time.sleep(0.3)
        supervise.write_lease(lease, supervise.Lease(supervise.boottime() + 0.6, 1.0, 0.1))
    assert not (jobdir / supervise.STATUS).exists()
    ran_out = time.monotonic() + 0.6
    status = task.wait()
    ended = time.monotonic()
    assert status.fenced and (status.exit_code, status.signal) == (0, signal.SIGKILL), status
    assert ran_out + 0.9 <= ended <= ran_out + 1.0 + 0.1 + 1.0, (ended - ran_out)  # grace, check period, slack
    assert "got TERM" in (tmp_path / "slurm-7.out").read_text()
    assert "fenced: the node's lease ran out" in (jobdir / supervise.LOG).read_text()


def test_a_fenced_job_that_ends_on_sigterm_ends_within_the_grace(tmp_path, supervisor):
    lease = _lease(tmp_path, -1.0, grace_s=30.0)  # run out already: fenced at its first check
    jobdir, launch = _launch(tmp_path, "exec sleep 60")
    before = time.monotonic()
    status = Supervised(jobdir, supervise.start(jobdir, launch, lease)).wait()
    assert status.fenced and status.signal == signal.SIGTERM
    assert time.monotonic() - before < 5


def test_a_run_that_ends_before_its_lease_is_not_fenced_and_no_lease_means_no_fence(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "exit 3")
    status = Supervised(jobdir, supervise.start(jobdir, launch, _lease(tmp_path, 30.0))).wait()
    assert (status.exit_code, status.fenced) == (3, False)
    jobdir = tmp_path / "jobs" / "8.0"
    jobdir.mkdir()
    launch = supervise.Launch(**{**launch.__dict__, "argv": ["/bin/sh", "-c", "sleep 1; exit 4"]})
    status = Supervised(jobdir, supervise.start(jobdir, launch, tmp_path / "no-lease")).wait()
    assert (status.exit_code, status.fenced) == (4, False)  # fencing off: nothing to read


def test_the_fence_kills_what_the_jobs_cgroups_list(tmp_path, supervisor):
    """The cgroup work writes JOBDIR/cgroups; the fence kills every pid its cgroup.procs list,
    here a process that left the job's process group (setsid); where the kernel has
    cgroup.kill (v2), it writes 1 there. Stand-in directories play the cgroups."""
    escaped = subprocess.Popen(["setsid", "sleep", "60"])
    v1, v2 = tmp_path / "cg1", tmp_path / "cg2"
    for d in (v1, v2):
        d.mkdir()
    (v1 / "cgroup.procs").write_text(f"{escaped.pid}\n")
    (v2 / "cgroup.procs").write_text("")
    (v2 / "cgroup.kill").write_text("")
    try:
        lease = _lease(tmp_path, -1.0, grace_s=0.2)
        jobdir, launch = _launch(tmp_path, "exec sleep 60")
        (jobdir / supervise.CGROUPS).write_text(f"{v1}\n{v2}\n")
        status = Supervised(jobdir, supervise.start(jobdir, launch, lease)).wait()
        assert status.fenced
        assert escaped.wait(timeout=5) in (-signal.SIGTERM, -signal.SIGKILL)
        assert (v2 / "cgroup.kill").read_text() == "1"
    finally:
        escaped.kill()


def test_the_fence_never_cgroup_kills_the_cgroup_holding_its_supervisor(tmp_path, supervisor):
    """On cgroup v2 the run's own cgroup holds its supervisor too: writing cgroup.kill there
    would end the supervisor before it wrote the run's status, so it kills pid by pid."""
    own = tmp_path / "cg-own"
    own.mkdir()
    (own / "cgroup.kill").write_text("")
    lease = _lease(tmp_path, 0.5, grace_s=0.2)
    jobdir, launch = _launch(tmp_path, "exec sleep 60")
    (jobdir / supervise.CGROUPS).write_text(f"{own}\n")
    proc = supervise.start(jobdir, launch, lease)
    (own / "cgroup.procs").write_text(f"{proc.pid}\n")  # the supervisor, as it writes itself there
    status = Supervised(jobdir, proc).wait()
    assert status.fenced
    assert (own / "cgroup.kill").read_text() == ""


def test_the_supervisor_joins_the_cgroups_its_launch_names_before_the_task_starts(tmp_path, supervisor):
    """The agent names the step's cgroup.procs files in the launch; the supervisor writes itself
    there before it forks, so the task is inside from its first line (a real v1 freezer cgroup)."""
    from shoal.agent import cgroups

    h = cgroups.detect("auto", f"supervise-test-{os.getpid()}")
    if h is None:
        pytest.skip("no cgroups here (or not root)")
    cg = cgroups.Containment(h).job("7.0", None, 1, ())
    try:
        step = cg.child("step_batch")
        jobdir, launch = _launch(tmp_path, "cat /proc/self/cgroup")
        launch = dataclasses.replace(launch, cgroups=cgroups.procs_files(step))
        status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
        assert (status.exit_code, status.reason) == (0, None)
        lines = (tmp_path / "slurm-7.out").read_text().splitlines()
        for d in step.paths:  # each hierarchy's line names the step's directory
            assert any(line.endswith(str(d).split("/shoal/", 1)[1]) for line in lines), (d, lines)
    finally:
        containment = cgroups.Containment(h)
        containment.release("7.0", cg)
        containment.close()


def test_a_cgroup_that_cannot_be_joined_fails_the_launch_saying_which(tmp_path, supervisor):
    jobdir, launch = _launch(tmp_path, "echo ran")
    missing = tmp_path / "no-such-cgroup" / "cgroup.procs"
    launch = dataclasses.replace(launch, cgroups=(str(missing),))
    status = Supervised(jobdir, supervise.start(jobdir, launch)).wait()
    assert (status.exit_code, status.reason) == (1, f"launch failed: cannot join cgroup {missing}: No such file or directory")
    assert not (tmp_path / "slurm-7.out").exists() or (tmp_path / "slurm-7.out").read_text() == ""


def _step(tmp_path: Path, lease: Path, *argv: str) -> subprocess.Popen:
    """An srun task as the step server starts it: its supervisor first, a session of its own."""
    return subprocess.Popen([*supervise.step_command(lease), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, text=True)


def test_a_step_task_under_its_supervisor_exits_and_dies_as_the_task_does(tmp_path, supervisor):
    lease = _lease(tmp_path, 30.0)
    p = _step(tmp_path, lease, "sh", "-c", "echo out; echo err >&2; exit 7")
    assert p.communicate(timeout=10) == ("out\n", "err\n") and p.returncode == 7
    p = _step(tmp_path, lease, "sh", "-c", "echo started; exec sleep 60")
    assert p.stdout.readline() == "started\n"
    os.killpg(p.pid, signal.SIGTERM)  # as the agent signals a step: its group, supervisor and task
    p.communicate(timeout=10)
    assert p.returncode == -signal.SIGTERM
    p = _step(tmp_path, lease, "no-such-command-anywhere")
    assert p.communicate(timeout=10)[1] == \
        "slurmstepd: error: execve(): no-such-command-anywhere: No such file or directory\n"
    assert p.returncode == 2


def test_a_step_task_is_fenced_by_its_supervisor_when_the_lease_runs_out(tmp_path, supervisor):
    lease = _lease(tmp_path, 1.0, grace_s=0.5)
    p = _step(tmp_path, lease, "sh", "-c", "trap '' TERM; echo started; while :; do sleep 0.05; done")
    assert p.stdout.readline() == "started\n"
    before = time.monotonic()
    p.communicate(timeout=10)
    assert p.returncode == -signal.SIGKILL and time.monotonic() - before < 5
    _wait_for(lambda: not _living_in_group(p.pid), 5)  # nothing of the group is left


def _living_in_group(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that are not zombies."""
    living = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            living.append(int(stat.parent.name))
    return living
