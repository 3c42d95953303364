"""Crash tests: `kill -9` of the server in the middle of a stream of submissions.

The administrator's promise: a job `sbatch` (or the API) acknowledged is in the queue after
the server restarts, exactly once, whatever moment the server died at; a submission that
was never answered may or may not be there, but never twice. Several submitters write at
once, so the kills land inside shared group commits (server/groupcommit.py), on SQLite and
on PostgreSQL alike. Each round kills the server at a random moment (the seed is printed,
so a failure can be replayed), starts it again on the same store, and checks every job
ever acknowledged.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.api_client import ClientError
from tests.integration.cluster import BIN, agent_argv, wait_until
from tests.integration.test_store import ServerProcess

ROUNDS = 5
API_SUBMITTERS = 3
SBATCH_SUBMITTERS = 2


@dataclass
class Ledger:
    """What the submitters sent and what the server acknowledged, by job name (unique per submission)."""

    sent: set[str] = field(default_factory=set)
    acked: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, name: str) -> None:
        with self.lock:
            self.sent.add(name)

    def ack(self, name: str, job_id: int) -> None:
        with self.lock:
            self.acked[name] = job_id

    def acked_count(self) -> int:
        with self.lock:
            return len(self.acked)


def _sbatch_env(server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLURM_JOB_ID", "SHOAL_JOB_TOKEN", "SHOAL_SERVER", "SHOAL_TOKEN")}
    env.update({"SHOAL_SERVER": server.url, "SHOAL_TOKEN": server.client().token,
                "SHOAL_CONFIG": str(server.root / "no-client-config.yaml"),
                "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"})
    return env


def _submitter(kind: str, prefix: str, server: ServerProcess, workdir: Path, ledger: Ledger,
               stop: threading.Event) -> None:
    """Submit one job after another until told to stop; errors (the server is dead) are expected."""
    client = server.client()
    env = _sbatch_env(server)
    for i in range(10_000):
        if stop.is_set():
            return
        name = f"{prefix}-{i}"
        ledger.send(name)
        if kind == "api":
            try:
                job_id = client.request("POST", "/shoal/v1/jobs", {"name": name, "script": "#!/bin/sh\ntrue\n",
                                                                 "workdir": str(workdir), "gpus_per_node": 1})
            except ClientError:
                continue
            ledger.ack(name, job_id["job_id"])
        else:
            try:
                out = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", "--gpus=1", "--wrap", "true"],
                                     env=env, cwd=workdir, capture_output=True, text=True, timeout=60, check=False)
            except subprocess.TimeoutExpired:
                continue
            if out.returncode == 0:
                ledger.ack(name, int(out.stdout.strip().split(";")[0]))


def _stored_jobs(server: ServerProcess) -> list[tuple[str, int]]:
    jobs = server.client().request("GET", "/shoal/v1/jobs?all=true")["jobs"]
    return [(j["name"], j["job_id"]) for j in jobs]


def _check(ledger: Ledger, stored: list[tuple[str, int]]) -> int:
    """Every acknowledged job once, with its id; nothing twice; nothing never sent. Returns the
    number of submissions stored although their answer was lost with the server."""
    names = [name for name, _ in stored]
    ids = [job_id for _, job_id in stored]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"submissions stored twice: {twice}"
    assert len(set(ids)) == len(ids), "a job id was handed out twice"
    by_name = dict(stored)
    lost = {name: job_id for name, job_id in ledger.acked.items() if by_name.get(name) != job_id}
    assert not lost, f"acknowledged jobs lost (name: acknowledged id, stored as {by_name}): {lost}"
    unknown = set(by_name) - ledger.sent
    assert not unknown, f"jobs nobody submitted: {unknown}"
    return len(set(by_name) - set(ledger.acked))


def test_every_acknowledged_submission_survives_kill_9_of_the_server(db_url, tmp_path):
    seed = int(os.environ.get("SHOAL_CRASH_SEED") or time.time_ns() % 1_000_000)
    print(f"crash test seed {seed} (SHOAL_CRASH_SEED={seed} replays the kill points)")
    rng = random.Random(seed)
    workdir = tmp_path / "work"
    workdir.mkdir()
    server = ServerProcess(tmp_path, db_url)
    try:
        _rounds(server, rng, workdir)
    finally:
        server.kill()


def _rounds(server: ServerProcess, rng: random.Random, workdir: Path) -> None:
    server.start()
    ledger = Ledger()
    for rnd in range(ROUNDS):
        stop = threading.Event()
        kinds = ["api"] * API_SUBMITTERS + ["sbatch"] * SBATCH_SUBMITTERS
        threads = [threading.Thread(target=_submitter, args=(kind, f"r{rnd}-{kind}{i}", server, workdir, ledger, stop),
                                    daemon=True) for i, kind in enumerate(kinds)]
        target = ledger.acked_count() + rng.randint(1, 20)
        for t in threads:
            t.start()
        # Kill mid-stream: once submissions are flowing, after a random extra moment.
        wait_until(lambda target=target: ledger.acked_count() >= target, 60, f"round {rnd}: submissions to be acknowledged")
        time.sleep(rng.uniform(0, 0.3))
        server.kill()
        stop.set()
        for t in threads:
            t.join(timeout=90)
            assert not t.is_alive(), "a submitter hung on the dead server"
        server.start()
        in_doubt = _check(ledger, _stored_jobs(server))
        print(f"round {rnd}: {ledger.acked_count()} acknowledged in all, {in_doubt} stored without an answer")
    assert ledger.acked_count() >= ROUNDS  # every round acknowledged something before its kill
    # The restarted server keeps counting: a new job's id is above every id handed out.
    last = server.client().request("POST", "/shoal/v1/jobs", {"name": "after", "script": "#!/bin/sh\ntrue\n",
                                                            "workdir": str(workdir)})["job_id"]
    assert last > max(job_id for name, job_id in _stored_jobs(server) if name != "after")


# ---------------------------------------------------------------------- agents


def _markers(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _processes_with(marker: str) -> list[int]:
    """Pids of live processes whose environment carries ``marker`` (every task of the test's jobs)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            pass
    return found


AGENT_KILLS = 3
AGENT_JOBS = 16


def test_agents_killed_at_random_moments_run_no_job_twice_and_forget_none(make_cluster):
    """A node's agent is killed (-9) at random moments while a queue of short jobs with srun
    steps drains through its 4 GPUs, and started again each time. However each job ends, it
    was launched at most once, it does end (none stuck RUNNING or PENDING), a job that ran its
    script to the end COMPLETED, a FAILED one says why in sacct (exit code or reason), and no
    process of any of them is left on the node."""
    seed = int(os.environ.get("SHOAL_CRASH_SEED") or time.time_ns() % 1_000_000)
    print(f"agent crash test seed {seed} (SHOAL_CRASH_SEED={seed} replays it)")
    rng = random.Random(seed)
    cluster = make_cluster(nodes=2, gpus_per_node=4, heartbeat_timeout=60)
    victim = cluster.node_names()[0]
    marks = cluster.workdir / "marks"
    marks.mkdir()
    marker = f"SHOAL_CRASH_TEST={seed}-{os.getpid()}"
    jobs = []
    for i in range(AGENT_JOBS):
        script = f"""#!/bin/bash
echo $SLURM_JOB_ID >> {marks}/launched
srun --ntasks=1 sleep {rng.uniform(0.1, 1.5):.2f}
sleep {rng.uniform(0.1, 2.0):.2f}
echo $SLURM_JOB_ID >> {marks}/finished
"""
        jobs.append(cluster.sbatch("--nodelist", victim, "--gpus=1", f"--job-name=crash{i}", "--output=/dev/null",
                                   f"--export=ALL,{marker}", script=script))
    log = (cluster.root / "state" / "logs" / f"{victim}.log").open("ab")  # closed in the finally below
    agent: subprocess.Popen | None = None
    running_at_kills = []
    try:
        for _ in range(AGENT_KILLS):
            time.sleep(rng.uniform(0.5, 3.0))
            # Kill under running work; once the queue has drained (restarted agents keep their
            # jobs running, so it may drain before the last kill), there is nothing left to kill under.
            def running_or_drained():
                states = [j["state"] for j in cluster.jobs()]
                running = [s for s in states if s == "RUNNING"]
                return running or (None if "PENDING" in states else "drained")

            found = wait_until(running_or_drained, 60, "a running job to kill the agent under")
            if found == "drained":
                break
            running_at_kills.append(len(found))
            pid = agent.pid if agent else cluster.agent_pid(victim)
            argv = agent_argv(pid)
            os.kill(pid, signal.SIGKILL)
            if agent:
                agent.wait()
            time.sleep(rng.uniform(0, 2.0))  # down for a moment: some jobs end with nobody watching
            agent = subprocess.Popen(argv, env=cluster.env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        ended = {job_id: cluster.wait_for(job_id, timeout=120) for job_id in jobs}
        wait_until(lambda: not _processes_with(marker), 30, "every task of the jobs to be gone")
    finally:
        for pid in _processes_with(marker):
            os.killpg(pid, signal.SIGKILL)
        if agent:
            agent.terminate()
            agent.wait(timeout=30)
        log.close()

    print(f"running jobs at each kill: {running_at_kills}")
    assert running_at_kills, "the agent was never killed under a running job"
    launched = _markers(marks / "launched")
    finished = set(_markers(marks / "finished"))
    twice = {j for j in launched if launched.count(j) > 1}
    assert not twice, f"jobs launched twice: {twice}"
    sacct = cluster.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,Reason", "-j",
                         ",".join(map(str, jobs))]).stdout
    rows = {int(r.split("|")[0]): r.split("|")[1:] for r in sacct.strip().splitlines()}
    print(sacct)
    for job_id, job in ended.items():
        state, exit_code, reason = rows[job_id]
        assert state == job["state"] in ("COMPLETED", "FAILED"), (job_id, rows[job_id])
        assert str(job_id) in launched or state == "FAILED", f"job {job_id} {state} without running"
        if state == "FAILED":
            assert exit_code != "0:0" or reason != "None", f"job {job_id} FAILED without saying why: {rows[job_id]}"
        else:
            assert str(job_id) in finished, f"job {job_id} COMPLETED without running its script to the end"
