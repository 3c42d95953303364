"""High availability: two `shoal server` processes on one PostgreSQL, agents and commands given both.

The administrator's story: one server leads (schedules, runs the controllers), the other
serves the API; agents and commands list both. `kill -9` the leader: the other takes over
within seconds, running jobs keep running, pending jobs and a job submitted during the
failover run, none is lost or run twice, and the dead server comes back as a follower.
A leader that loses its database connection stops at once, and a write it makes late is
refused by the term (the fencing token).

Figures (recorded in the test output with -s, and in docs/RELIABILITY.md): the time from
`kill -9` to the follower leading, and submit-to-start through the follower.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from shoal.api_client import Client, ClientError
from tests.integration.cluster import BIN, free_port, wait_until

pytestmark = pytest.mark.postgres

FAILOVER_BOUND_S = 10.0  # measured about 1 s: the follower polls the lease twice a second


class TwoServers:
    """Two servers on one PostgreSQL database and two agents, each agent given both URLs
    (node01 the first server first, node02 the second first, so one long-polls a follower)."""

    def __init__(self, root: Path, db_url: str) -> None:
        self.root = root
        self.db_url = db_url
        (root / "logs").mkdir(parents=True)
        self.workdir = root / "work"
        self.workdir.mkdir()
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.config = root / "cluster.yaml"
        self.config.write_text(json.dumps({
            "cluster_name": "ha", "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}],
            "nodes": {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 20.0, "kill_wait_s": 2.0},
            "scheduler": {"interval_s": 2.0}}))
        self.join = root / "join.token"
        self.join.write_text("join_failover_test_token")
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("SLURM_JOB_ID", "SHOAL_JOB_TOKEN", "SHOAL_SERVER", "SHOAL_TOKEN")}
        self.env.update({"SHOAL_CONFIG": str(root / "client.yaml"), "SHOAL_LOG_LEVEL": "INFO",
                         "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
        self.token = ""

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([sys.executable, "-m", "shoal", *argv], env=self.env,
                                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True)

    def start_server(self, i: int) -> None:
        self._spawn(f"server{i}", ["server", "--listen", f"127.0.0.1:{self.ports[i]}", "--db", self.db_url,
                                   "--config", str(self.config), "--state-dir", str(self.root / f"state{i}"),
                                   "--join-token-file", str(self.join)])
        wait_until(lambda: self._healthy(i), 60, f"server {i} to answer")

    def _healthy(self, i: int) -> bool:
        if self.procs[f"server{i}"].poll() is not None:
            raise AssertionError(f"server {i} exited:\n{self.log(f'server{i}')}")
        try:
            Client(self.urls[i], timeout=2).get("/healthz")
            return True
        except ClientError:
            return False

    def start_agents(self) -> None:
        for n, order in (("node01", self.urls), ("node02", self.urls[::-1])):
            self._spawn(n, ["agent", "--server", ",".join(order), "--join-token-file", str(self.join),
                            "--name", n, "--address", "127.0.0.1", "--port", str(free_port()),
                            "--workdir", str(self.root / n), "--cpus", "8", "--memory", "32G",
                            "--fake-gpus", "2", "--gpu-model", "A100-SXM4-80GB", "--run-jobs-as", "agent"])
        wait_until(lambda: len([n for n in self.client().get("/shoal/v1/nodes")["nodes"] if n["state"] == "UP"]) == 2,
                   60, "both nodes to register")

    def write_client_config(self) -> None:
        self.token = wait_until(lambda: _read(self.root / "state0" / "admin.token"), 30, "the admin token")
        (self.root / "client.yaml").write_text(json.dumps({"server": ",".join(self.urls), "token": self.token}))

    def client(self, i: int | None = None) -> Client:
        c = Client(self.urls[i] if i is not None else ",".join(self.urls), self.token, timeout=30)
        c.job_token = None
        return c

    def leader(self, i: int) -> dict:
        return self.client(i).get("/shoal/v1/leader")

    def run(self, argv: list[str], check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(argv, env={**self.env, **(env or {})}, cwd=self.workdir, capture_output=True,
                             text=True, timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"{argv} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def sbatch(self, *args: str, server: int | None = None) -> int:
        env = {"SHOAL_SERVER": self.urls[server]} if server is not None else {}
        out = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **env}, cwd=self.workdir,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        return self.client().get(f"/shoal/v1/jobs/{job_id}")

    def kill9(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=10)

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


@pytest.fixture
def ha(tmp_path, postgres_url):
    c = TwoServers(tmp_path / "ha", postgres_url)
    try:
        c.start_server(0)
        c.write_client_config()
        wait_until(lambda: c.leader(0)["self"]["role"] == "leader", 30, "the first server to lead")
        c.start_server(1)
        c.start_agents()
        yield c
    finally:
        c.stop()


def test_the_follower_takes_over_within_seconds_and_no_job_is_lost_or_run_twice(ha):
    # One leader: the first server; the second follows and names it.
    assert ha.leader(0)["self"]["role"] == "leader"
    follower = ha.leader(1)
    assert follower["self"]["role"] == "follower" and follower["leader"]["url"] == ha.urls[0]
    ping = ha.run(["scontrol", "ping"])
    assert ping.stdout == (f"Slurmctld(primary) at 127.0.0.1:{ha.ports[0]} is UP\n"
                           f"Slurmctld(backup) at 127.0.0.1:{ha.ports[1]} is UP\n")

    # Submit-to-start through the follower: submitted to it, planned by the leader, started by
    # node02, whose agent long-polls the follower.
    stamps = ha.workdir / "stamps"
    stamps.mkdir()
    starts = {}
    for via in (1, 0):
        t0 = time.time()
        jid = ha.sbatch("--gpus=1", "--nodelist=node02", "--output=/dev/null",
                        "--wrap", f"date +%s.%N > {stamps}/via{via}", server=via)
        wait_until(lambda: _read(stamps / f"via{via}"), 30, f"the job submitted to server {via} to start")
        starts[via] = float(_read(stamps / f"via{via}")) - t0
        assert ha.job(jid)["state"] in ("RUNNING", "COMPLETED")
    print(f"\nsubmit-to-start: {starts[1] * 1000:.0f} ms through the follower, "
          f"{starts[0] * 1000:.0f} ms through the leader")
    assert starts[1] < 5.0

    # A signal sent through the leader reaches node02's job once, though node02's agent
    # long-polls the follower (the change feed relays it).
    ready, trapped = ha.workdir / "ready", ha.workdir / "trapped"
    jid = ha.sbatch("--gpus=1", "--nodelist=node02", "--output=/dev/null", "--wrap",
                    f"trap 'echo usr1 >> {trapped}; exit 0' USR1; touch {ready}; "
                    f"for i in $(seq 300); do sleep 0.1; done", server=0)
    wait_until(lambda: ready.exists(), 30, "the trapping job to start")
    ha.run(["scancel", "--batch", "--signal=USR1", str(jid)], env={"SHOAL_SERVER": ha.urls[0]})
    assert wait_until(lambda: ha.job(jid)["state"] == "COMPLETED", 20, "the signalled job to end")
    assert trapped.read_text() == "usr1\n"

    # Four GPUs: four long jobs run, three more wait.
    runs = ha.workdir / "runs.log"
    script = f"echo $SLURM_JOB_ID $SLURM_RESTART_COUNT >> {runs}; sleep "
    running = [ha.sbatch("--gpus=1", "--output=/dev/null", "--wrap", script + "12", server=i % 2)
               for i in range(4)]
    wait_until(lambda: all(ha.job(j)["state"] == "RUNNING" for j in running), 30, "four jobs to run")
    pending = [ha.sbatch("--gpus=1", "--output=/dev/null", "--wrap", script + "1", server=i % 2)
               for i in range(3)]
    assert all(ha.job(j)["state"] == "PENDING" for j in pending)

    # kill -9 the leader; submit to the survivor at once; time the takeover.
    t0 = time.monotonic()
    ha.kill9("server0")
    during = ha.sbatch("--gpus=1", "--output=/dev/null", "--wrap", script + "1")  # the client fails over
    wait_until(lambda: ha.leader(1)["self"]["role"] == "leader", FAILOVER_BOUND_S, "the follower to lead")
    failover = time.monotonic() - t0
    print(f"failover: the follower led {failover:.2f} s after kill -9 of the leader")
    assert ha.leader(1)["leader"]["url"] == ha.urls[1]
    ping = ha.run(["scontrol", "ping"])
    assert ping.stdout == (f"Slurmctld(primary) at 127.0.0.1:{ha.ports[1]} is UP\n"
                           f"Slurmctld(backup) at 127.0.0.1:{ha.ports[0]} is DOWN\n")

    # The running jobs kept running; the pending ones and the one submitted during the failover ran.
    everything = running + pending + [during]
    for jid in everything:
        job = wait_until(lambda: (j := ha.job(jid))["state"] not in ("PENDING", "RUNNING") and not j["completing"]
                         and j, 60, f"job {jid} to end")
        assert job["state"] == "COMPLETED" and job["restart_count"] == 0, job
    lines = runs.read_text().split("\n")[:-1]
    assert sorted(lines) == sorted(f"{j} 0" for j in everything), "every job ran exactly once"

    # The dead server comes back as a follower of the new leader.
    ha.start_server(0)
    back = wait_until(lambda: (a := ha.leader(0))["leader"] and a, 30, "the restarted server to answer")
    assert back["self"]["role"] == "follower" and back["leader"]["url"] == ha.urls[1]
    assert ha.leader(1)["self"]["role"] == "leader"
    after = ha.sbatch("--gpus=1", "--output=/dev/null", "--wrap", "true", server=0)
    assert wait_until(lambda: ha.job(after)["state"] == "COMPLETED", 30, "a job submitted to the new follower")


def test_what_either_server_shows_follows_the_other_s_commits_at_once(ha):
    """Each server keeps squeue's, sinfo's and the agents' views in memory, brought up to date
    by the keys every commit sends on the change feed: the follower's squeue lists a job the
    moment the leader acknowledged it, and each server shows what the other changed."""

    def squeue(i: int) -> dict[str, str]:
        out = ha.run(["squeue", "-h", "-o", "%i %T"], env={"SHOAL_SERVER": ha.urls[i]}).stdout.split()
        return dict(zip(out[::2], out[1::2]))

    def sinfo_state(i: int, node: str) -> str:
        return ha.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], env={"SHOAL_SERVER": ha.urls[i]}).stdout.strip()

    squeue(1), sinfo_state(1, "node01")  # the follower's views are kept from here on
    for via, other in ((0, 1), (1, 0)):
        jid = str(ha.sbatch("--hold", "--output=/dev/null", "--wrap", "sleep 60", server=via))
        lag = time.monotonic()
        wait_until(lambda: squeue(other).get(jid) == "PENDING", 5, f"server {other} to list job {jid}")
        print(f"\njob {jid} submitted to server {via} listed by server {other} after "
              f"{(time.monotonic() - lag) * 1000:.0f} ms (a squeue takes about as long)")
        ha.run(["scancel", jid], env={"SHOAL_SERVER": ha.urls[other]})
        wait_until(lambda: jid not in squeue(via), 5, f"server {via} to drop the job cancelled on server {other}")
    ha.run(["scontrol", "update", "nodename=node01", "state=drain", "reason=maint"], env={"SHOAL_SERVER": ha.urls[0]})
    wait_until(lambda: sinfo_state(1, "node01") == "drain", 5, "the follower to show node01 drained")
    ha.run(["scontrol", "update", "nodename=node01", "state=resume"], env={"SHOAL_SERVER": ha.urls[1]})
    wait_until(lambda: sinfo_state(0, "node01") == "idle", 5, "the leader to show node01 resumed")
    # A job submitted to the follower runs on node02, whose agent long-polls the follower, and
    # ends: the follower's kept views of running jobs and of its queue follow the leader's plan.
    jid = str(ha.sbatch("--gpus=1", "--nodelist=node02", "--output=/dev/null", "--wrap", "sleep 1", server=1))
    wait_until(lambda: jid not in squeue(1) and jid not in squeue(0), 30, "the job to run and end on both servers")
    assert ha.job(int(jid))["state"] == "COMPLETED"


def test_a_token_revoked_through_either_server_is_refused_by_the_other(tmp_path, postgres_url):
    """Each server caches the tokens it has looked up; a revocation reaches the other server's
    cache through the change feed, sent as the deletion commits (auth.CACHE_S bounds it anyway)."""
    from shoal.server.auth import CACHE_S

    ha = TwoServers(tmp_path / "ha", postgres_url)
    try:
        ha.start_server(0)
        ha.write_client_config()
        ha.start_server(1)
        for via, other in ((0, 1), (1, 0)):
            made = ha.client(via).post("/shoal/v1/tokens", {"user": f"carol{via}"})
            assert made["id"] in {t["id"] for t in ha.client(other).get("/shoal/v1/tokens")["tokens"]}
            carol = Client(ha.urls[other], made["token"], timeout=10)
            carol.job_token = None
            assert carol.get("/shoal/v1/whoami")["user"] == f"carol{via}"  # now in the other's cache
            t0 = time.monotonic()
            ha.client(via).delete(f"/shoal/v1/tokens/{made['id']}")
            tries = 0

            def refused() -> bool:
                nonlocal tries
                tries += 1
                try:
                    carol.get("/shoal/v1/whoami")
                    return False
                except ClientError as e:
                    assert e.status == 401, e
                    return True

            wait_until(refused, CACHE_S + 1, f"server {other} to refuse the token revoked through server {via}",
                       interval=0.005)
            took = time.monotonic() - t0
            print(f"\nrevoked through server {via}: server {other} refused it after {took * 1000:.0f} ms "
                  f"(request {tries} after the revocation)")
            # Sooner than the cache's own bound: the feed, not the cache's expiry, refused it.
            assert took < CACHE_S / 2, took
    finally:
        ha.stop()


def test_a_node_credential_revoked_through_either_server_is_refused_by_the_other(tmp_path, postgres_url):
    """Each server keeps the node credential generations it has read; a revocation reaches the
    other server's through the change feed, so the agent is refused there too (403)."""
    ha = TwoServers(tmp_path / "ha", postgres_url)
    try:
        ha.start_server(0)
        ha.write_client_config()
        ha.start_server(1)
        joiner = Client(ha.urls[0], ha.join.read_text(), timeout=10)
        joiner.job_token = None
        facts = {"address": "127.0.0.1", "port": 1, "cpus": 1, "memory_mb": 1024}
        for via, other in ((0, 1), (1, 0)):
            node = f"rev{via}"
            agent = Client(ha.urls[other], joiner.post("/shoal/v1/agents/register", {"name": node, **facts})["credential"],
                           timeout=10)
            agent.job_token = None
            agent.post(f"/shoal/v1/agents/{node}/report", {})  # its generation is now in the other's cache
            ha.client(via).post(f"/shoal/v1/tokens/nodes/{node}/revoke")

            def refused() -> bool:
                try:
                    agent.post(f"/shoal/v1/agents/{node}/report", {})
                    return False
                except ClientError as e:
                    assert e.status == 403 and "credential revoked" in str(e), e
                    return True

            wait_until(refused, 2, f"server {other} to refuse node {node}'s credential revoked through server {via}",
                       interval=0.005)
    finally:
        ha.stop()


# ---------------------------------------------------------------- fencing, in process


def _lease(url: str):
    from shoal.store.engine import make_engine, migrate
    from shoal.store.lease import PostgresLease

    engine = make_engine(url)
    migrate(engine)
    return engine, PostgresLease(engine)


def test_a_leader_that_loses_its_connection_stops_and_its_late_write_is_refused(postgres_url):
    from shoal.server.leader import Leadership
    from shoal.store.engine import session_factory
    from shoal.store.lease import NotLeader

    engine, lease1 = _lease(postgres_url)
    _, lease2 = _lease(postgres_url)
    old = Leadership(lease1, "http://old", time.time, poll_s=0.1)
    new = Leadership(lease2, "http://new", time.time, poll_s=0.1)
    sessions = session_factory(engine)
    try:
        old.start()
        wait_until(lambda: old.is_leader, 10, "the first server to lead")
        new.start()
        time.sleep(0.5)
        assert not new.is_leader, "two leaders at once"
        with sessions() as s, s.begin():
            old.fence(s)  # the leader's own term: accepted

        # A plan in flight holds the term: the new leader cannot bump it until the plan commits.
        late = sessions()
        late.begin()
        old.fence(late)
        with engine.connect() as admin:  # the old leader's lease connection drops
            admin.execute(text("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                               "AND objid = :lo AND granted"), {"lo": 0x616C0002})
            admin.commit()
        wait_until(lambda: not old.is_leader, 5, "the old leader to step down")
        time.sleep(1.0)
        assert not new.is_leader, "the new term was taken while a fenced plan was open"
        late.commit()
        late.close()
        wait_until(lambda: new.is_leader, 15, "the follower to lead")
        assert new.term == 2

        # The deposed leader's late write is refused by the term.
        with pytest.raises(NotLeader):
            with sessions() as s, s.begin():
                lease1.fence(s, 1)
        with sessions() as s, s.begin():
            new.fence(s)
    finally:
        old.stop()
        new.stop()
        engine.dispose()


def test_hollow_racks_spread_over_both_servers_stay_up_through_a_failover_and_run_each_job_once(tmp_path,
                                                                                                 postgres_url):
    """The layout docs/SCALE.md describes for a large site: several servers on one PostgreSQL,
    each rack's agents given the servers in a different order, so the followers take their
    share of the long-polls and reports. Two racks of 20 hollow nodes, one per server; 200
    array tasks run while the leader is `kill -9`ed: no node goes DOWN (the leader hears the
    follower's nodes through the store), and each task runs exactly once."""
    ha = TwoServers(tmp_path / "ha", postgres_url)
    ha.config.write_text(json.dumps({
        "cluster_name": "ha", "partitions": [{"name": "gpu", "nodes": "ra[01-20],rb[01-20]", "default": True}],
        "nodes": {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 15.0, "kill_wait_s": 2.0},
        "scheduler": {"interval_s": 1.0}}))
    stats = {rack: ha.root / f"{rack}.json" for rack in ("ra", "rb")}
    try:
        ha.start_server(0)
        ha.write_client_config()
        wait_until(lambda: ha.leader(0)["self"]["role"] == "leader", 30, "the first server to lead")
        ha.start_server(1)
        for rack, order in (("ra", ha.urls), ("rb", ha.urls[::-1])):
            ha._spawn(rack, ["agent", "--hollow", "20", "--name", rack, "--server", ",".join(order),
                             "--join-token-file", str(ha.join), "--address", "127.0.0.1", "--port", "1",
                             "--fake-gpus", "8", "--gpu-model", "H100-SXM-80GB", "--hollow-stats", str(stats[rack])])

        def states() -> dict[str, str]:
            for rack in stats:
                if ha.procs[rack].poll() is not None:
                    raise AssertionError(f"the hollow rack {rack} exited:\n{ha.log(rack)}")
            return {n["name"]: n["state"] for n in ha.client().get("/shoal/v1/nodes")["nodes"]}

        wait_until(lambda: list(states().values()).count("UP") == 40, 60, "the 40 hollow nodes to register")
        array = ha.sbatch("--array=0-199", "--gpus=4", "--output=/dev/null", "--wrap", "sleep 2")

        def tasks() -> list[dict]:
            return ha.client().get("/shoal/v1/jobs", {"job_id": str(array)})["jobs"]

        wait_until(lambda: sum(j["state"] == "COMPLETED" for j in tasks()) >= 40, 60, "the first tasks to end")
        ha.kill9("server0")
        wait_until(lambda: ha.leader(1)["self"]["role"] == "leader", FAILOVER_BOUND_S, "the follower to lead")
        seen_down: set[str] = set()

        def ended() -> bool:
            seen_down.update(n for n, s in states().items() if s != "UP")
            jobs = tasks()
            return len(jobs) == 200 and all(j["state"] not in ("PENDING", "RUNNING") and not j["completing"]
                                            for j in jobs)

        try:
            wait_until(ended, 120, "the 200 array tasks to end", interval=0.5)
        except AssertionError:
            left = [(j["job_id"], j["state"], j["completing"], j.get("nodes"), j.get("reason")) for j in tasks()
                    if j["state"] in ("PENDING", "RUNNING") or j["completing"]]
            raise AssertionError(f"tasks not ended: {left[:10]}\nserver1:\n{ha.log('server1')}\n"
                                 f"ra:\n{ha.log('ra')}\nrb:\n{ha.log('rb')}") from None
        jobs = tasks()
        assert {j["state"] for j in jobs} == {"COMPLETED"}
        assert all(j["restart_count"] == 0 for j in jobs)
        assert not seen_down, f"nodes left UP: {sorted(seen_down)}"

        def started() -> int:
            return sum(json.loads(p.read_text())["runs_started"] for p in stats.values())

        time.sleep(2)  # the stats files are written every second
        assert started() == 200, "each task ran exactly once on the hollow nodes"
        # Both racks ran tasks: the follower's rack was not idle.
        by_rack = {rack: json.loads(p.read_text())["runs_started"] for rack, p in stats.items()}
        assert all(by_rack.values()), by_rack
    finally:
        ha.stop()


def test_a_new_leader_wakes_every_node_s_long_poll_on_every_server(tmp_path, postgres_url):
    """The leader tells the other servers of its commits' work after each commit (the change
    feed sends apart): killed between the two, an agent long-polling another server never
    heard of its node's new run, which stayed RUNNING for good (seen in CI, twice, in the
    hollow-racks story above). A newly elected leader makes every node's long-poll answer
    again from the store, its own and the other servers'. Three servers in process: the
    leader goes without a word, and the long-polls held on the two others end."""
    import asyncio
    import threading

    from shoal.server.config import parse_cluster_config
    from shoal.server.core import Server

    config = parse_cluster_config({"partitions": [{"name": "gpu", "nodes": "n[1-2]", "default": True}]})
    servers = [Server(postgres_url, config, tmp_path / f"s{i}", url=f"http://s{i}") for i in range(3)]
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        for s in servers:
            s.hub.loop = loop
            s.feed.start()
        first, *others = servers
        first.leader.start()
        wait_until(lambda: first.leader.is_leader, 10, "the first server to lead")
        for s in others:
            s.leader.start()
        time.sleep(1.0)  # the feeds listening

        def long_poll(s):
            return asyncio.run_coroutine_threadsafe(s.hub.wait("n1", s.hub.epoch, s.hub.generation("n1"), 60), loop)

        polls = [long_poll(s) for s in others]
        time.sleep(1.0)
        assert not any(p.done() for p in polls), "nothing changed yet: the long-polls wait"
        first.feed.stop()  # dies without a word: no feed, its lease's connection gone
        first.leader.stop()
        first.engine.dispose()
        wait_until(lambda: any(s.leader.is_leader for s in others), FAILOVER_BOUND_S, "a new leader")
        for p in polls:
            p.result(timeout=10)
    finally:
        for s in servers:
            s.feed.stop()
            s.leader.stop()
            s.engine.dispose()
        loop.call_soon_threadsafe(loop.stop)
