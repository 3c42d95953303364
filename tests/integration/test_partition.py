"""A network partition: one node's agent runs in its own network namespace, joined to the host
by a veth pair; the test takes the link down. The server sees the node silent, marks it DOWN
and restarts its --requeue job elsewhere; the cut-off agent, its lease run out, kills what it
still runs (the server has already restarted it). The link comes back: the agent registers
again, the node is UP, and no job ran twice at once or a third time.

Needs root and iproute2 (`ip netns`); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                reason="network namespaces need root and iproute2's ip")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Relay:
    """A TCP relay from ``listen`` to the server on loopback: the server listens on 127.0.0.1
    only, which a namespace cannot reach; the relay gives it an address on the veth link."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.sock = socket.create_server(listen)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def partitioned(tmp_path):
    """A cluster of node01, node02 (on the host) and node03 (in its own network namespace)."""
    tag = f"{os.getpid() % 100000}{time.time_ns() % 100}"
    ns, host_if, ns_if = f"shoal-part-{tag}", f"shp{tag}h", f"shp{tag}n"
    subnet = f"10.231.{os.getpid() % 250 + 1}"
    try:
        ip("netns", "add", ns)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot create a network namespace here: {e.stderr.decode().strip()}")
    agent: subprocess.Popen | None = None
    relay: Relay | None = None
    cluster: LocalCluster | None = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", ns)
        ip("addr", "add", f"{subnet}.1/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", ns, "addr", "add", f"{subnet}.2/30", "dev", ns_if)
        ip("-n", ns, "link", "set", ns_if, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        config = tmp_path / "cluster.yaml"
        config.write_text(json.dumps({
            "cluster_name": "partition", "partitions": [{"name": "gpu", "nodes": "node[01-03]", "default": True}],
            "nodes": {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 4.0, "kill_wait_s": 2.0}}))
        cluster = LocalCluster(tmp_path / "cluster", nodes=2, gpus_per_node=2, config=str(config)).up()
        relay_port = free_port()
        relay = Relay((f"{subnet}.1", relay_port), ("127.0.0.1", cluster.port))
        state = cluster.root / "state"
        with open(state / "logs" / "node03.log", "w") as log:
            agent = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "-m", "shoal", "agent",
                 "--server", f"http://{subnet}.1:{relay_port}", "--join-token-file", str(state / "join.token"),
                 "--name", "node03", "--address", f"{subnet}.2", "--port", str(free_port()),
                 "--workdir", str(state / "nodes" / "node03"), "--cpus", "64", "--memory", "512G",
                 "--fake-gpus", "2", "--gpu-model", "A100-SXM4-80GB"],
                env=cluster.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        cluster.node03_log = state / "logs" / "node03.log"
        cluster.cut = lambda: ip("link", "set", host_if, "down")
        cluster.heal = lambda: ip("link", "set", host_if, "up")
        wait_until(lambda: any(n["name"] == "node03" and n["state"] == "UP" for n in cluster.nodes_json()),
                   30, "node03 to register from its namespace")
        yield cluster
    finally:
        if agent is not None:
            os.killpg(agent.pid, signal.SIGTERM)
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
        if relay is not None:
            relay.close()
        if cluster is not None:
            cluster.down()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10, check=False)  # takes the veth pair along


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def node(cluster: LocalCluster, name: str) -> dict:
    return next(n for n in cluster.nodes_json() if n["name"] == name)


def test_a_cut_off_node_fences_its_work_and_takes_only_new_work_when_healed(partitioned):
    cluster = partitioned
    runs = cluster.workdir / "runs"
    runs.mkdir()
    # Drain the host's nodes for a moment so both jobs start on node03.
    for n in ("node01", "node02"):
        cluster.run(["scontrol", "update", f"nodename={n}", "state=drain", "reason=test"])
    script = f"echo $$ > {runs}/$SLURM_JOB_ID.$SLURM_RESTART_COUNT; echo $SLURMD_NODENAME >> {runs}/$SLURM_JOB_ID.log; sleep 300"
    survivor = cluster.sbatch("--requeue", "--gpus=1", "--output=/dev/null", "--wrap", script)
    doomed = cluster.sbatch("--gpus=1", "--output=/dev/null", "--wrap", script)
    for job in (survivor, doomed):
        assert cluster.wait_for(job, states=("RUNNING",), timeout=20)["nodelist"] == "node03"
    wait_until(lambda: all((runs / f"{j}.0").exists() for j in (survivor, doomed)), 15, "both jobs to start")
    first = {j: int((runs / f"{j}.0").read_text()) for j in (survivor, doomed)}
    for n in ("node01", "node02"):
        cluster.run(["scontrol", "update", f"nodename={n}", "state=resume"])

    cluster.cut()
    cut_at = time.time()
    try:
        # The server: node03 DOWN after its 4 s timeout, the --requeue job restarted elsewhere,
        # the other NODE_FAIL. Meanwhile the agent kills both, having lost its lease.
        died: dict[int, float] = {}
        restarted_at = None
        deadline = time.time() + 30
        while time.time() < deadline and (len(died) < 2 or restarted_at is None):
            for j, pid in first.items():
                if j not in died and not alive(pid):
                    died[j] = time.time()
            if restarted_at is None and (runs / f"{survivor}.1").exists():
                restarted_at = time.time()
            time.sleep(0.05)
        assert set(died) == {survivor, doomed}, f"the cut-off agent left {set(first) - set(died)} running"
        assert restarted_at is not None, "the --requeue job was not restarted elsewhere"
        # The fence came before (or with) the restart: the two runs never overlapped.
        assert died[survivor] <= restarted_at + 0.5, (died, restarted_at)
        # A lease of 2.8 s (of the 4 s timeout: docs/FENCING.md), renewed every 1 s.
        assert 1.5 <= died[survivor] - cut_at <= 10, (died, cut_at)
        assert node(cluster, "node03")["state"] == "DOWN"
        again = cluster.job(survivor)
        assert again["restart_count"] == 1 and again["nodelist"] in ("node01", "node02"), again
        assert cluster.wait_for(doomed, timeout=10)["state"] == "NODE_FAIL"
        log = cluster.node03_log.read_text()
        assert "fencing: no report reached the server" in log, log[-3000:]
        # The run's supervisor reads the same lease and is often first (docs/FENCING.md).
        supervised = cluster.root / "state" / "nodes" / "node03" / "jobs" / f"{survivor}.0" / "supervise.log"
        assert f"{survivor}.0" in log or "fenced: the node's lease ran out" in supervised.read_text(), log[-3000:]
    finally:
        cluster.heal()

    # Healed: the agent registers again and the node is UP; it runs nothing old.
    wait_until(lambda: "registered again after the fence" in cluster.node03_log.read_text(), 60,
               "node03's agent to register again")
    wait_until(lambda: node(cluster, "node03")["state"] == "UP", 30, "node03 to be UP")
    fresh = cluster.sbatch("-w", "node03", "--output=/dev/null", "--wrap", "echo fresh")
    assert cluster.wait_for(fresh, timeout=60)["state"] == "COMPLETED"
    assert (runs / f"{survivor}.log").read_text().split() == ["node03", again["nodelist"]]
    assert (runs / f"{doomed}.log").read_text().split() == ["node03"]
    assert not (runs / f"{survivor}.2").exists() and cluster.job(survivor)["state"] == "RUNNING"
    assert node(cluster, "node03")["jobs"] == []
    cluster.run(["scancel", str(survivor)])
