"""A node dies under running jobs: the server notices the silent agent, marks the node down,
ends the job that cannot survive it (NODE_FAIL) and puts the --requeue job back in the queue,
where it runs again on the nodes that remain, knowing it was restarted. A silent node's
serving pods are replaced on other nodes, and its agent, when it wakes, stops the copies it
still runs (fencing).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from shoal.api_client import ClientError
import pytest

from tests.integration.cluster import LocalCluster, agent_argv, pid_alive, wait_until
from tests.integration.test_agent_restart import _start_agent


def test_killed_agent_fails_its_jobs_and_requeues_the_ones_that_asked(make_cluster):
    cluster: LocalCluster = make_cluster(nodes=3, gpus_per_node=4, heartbeat_timeout=3)
    pids = cluster.workdir / "pids"
    pids.mkdir()
    survivor = cluster.sbatch("--requeue", "--nodes=2", "--gpus-per-node=1", "--open-mode=append",
                              "--output=requeue-%j.out", script=f"""#!/bin/bash
echo $$ > {pids}/requeue-$SLURM_RESTART_COUNT
echo "run=$SLURM_RESTART_COUNT nodes=$SLURM_JOB_NODELIST host=$(hostname)"
srun bash -c 'echo "step=$SLURM_RESTART_COUNT host=$(hostname)"'
sleep 60
""")
    first = cluster.wait_for(survivor, states=("RUNNING",), timeout=15)
    victim = first["batch_host"]
    doomed = cluster.sbatch("--nodelist", victim, "--gpus=1", "--wrap", f"echo $$ > {pids}/doomed; sleep 60")
    cluster.wait_for(doomed, states=("RUNNING",), timeout=15)
    wait_until(lambda: (pids / "requeue-0").exists() and (pids / "doomed").exists(), 10, "both jobs to start")
    try:
        os.kill(cluster.agent_pid(victim), signal.SIGKILL)

        def victim_down():
            line = cluster.run(["sinfo", "-h", "-N", "-n", victim, "-o", "%N %t"]).stdout.split()
            return line if line and line[1].startswith("down") else None

        line = wait_until(victim_down, 15, f"sinfo to show {victim} down")
        assert line == [victim, "down*"], line
        node = [n for n in cluster.nodes_json() if n["name"] == victim][0]
        assert (node["state"], node["reason"]) == ("DOWN", "Not responding")

        failed = cluster.wait_for(doomed, timeout=10)
        assert failed["state"] == "NODE_FAIL", failed
        sacct = cluster.run(["sacct", "-j", str(doomed), "-X", "-n", "-P", "-o", "State"]).stdout.strip()
        assert sacct == "NODE_FAIL"

        again = cluster.wait_for(survivor, states=("RUNNING",), timeout=20)
        assert again["restart_count"] == 1
        assert victim not in again["nodelist"] and again["nodes"] == 2, again
        def steps_done():
            out = (cluster.workdir / f"requeue-{survivor}.out").read_text()
            return out if len([x for x in out.splitlines() if x.startswith("step=1")]) == 2 else None

        out = wait_until(steps_done, 15, "the restarted run's step on both of its nodes")
        assert f"run=1 nodes={again['nodelist']}" in out
        assert cluster.job(survivor)["state"] == "RUNNING"
        # The dead node takes no new work: a job asking for it is turned away at submit.
        probe = cluster.run(["sbatch", "--nodelist", victim, "--wrap", "true"], check=False)
        assert probe.returncode == 1 and victim in probe.stderr and "Traceback" not in probe.stderr, probe.stderr
        cluster.run(["scancel", str(survivor)])
        assert cluster.wait_for(survivor, timeout=20)["state"] == "CANCELLED"
    finally:
        # The killed agent's orphans keep running (as on a cut-off node): stop them.
        for f in pids.iterdir():
            try:
                os.killpg(int(f.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


TICKER = {
    "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "ticker"},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "ticker"}},
             "template": {"metadata": {"labels": {"app": "ticker"}},
                          "spec": {"terminationGracePeriodSeconds": 1,
                                   "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", (
                                       # The main process and one that left its process group tick
                                       # into the pod's file; $$ is a $ to Kubernetes.
                                       "echo $$$$ > $PIDS/$POD_NAME; "
                                       "setsid sh -c 'while :; do echo detached $$(date +%s.%N) "
                                       ">> $PIDS/$POD_NAME.ticks; sleep 0.1; done' & "
                                       "while :; do echo main $$(date +%s.%N) >> $PIDS/$POD_NAME.ticks; "
                                       "sleep 0.1; done")],
                                                   "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}},
}


def _ticks(path: Path) -> tuple[float, float]:
    """The first and last tick a pod wrote (either of its processes)."""
    times = [float(t) for line in path.read_text().splitlines() if len(line.split()) == 2
             for t in [line.split()[1]]]
    return min(times), max(times)


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_silent_nodes_pods_stop_by_their_lease_before_they_are_replaced_elsewhere(make_cluster, fault):
    """kill -9 or kill -STOP an agent: its pod's supervisor stops the pod (its detached process
    too) when the node's lease runs out, with no agent; then the node goes DOWN, the pod fails
    NodeLost and the ReplicaSet starts a replacement on the free node. Two copies never tick at
    once. The agent, started again or woken, never starts the old pod again."""
    cluster: LocalCluster = make_cluster(nodes=3, gpus_per_node=2, heartbeat_timeout=3)
    pids = cluster.workdir / "pods"
    pids.mkdir()
    manifest = json.loads(json.dumps(TICKER))
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "PIDS", "value": str(pids)}]
    cluster.run(["shoal", "apply", "-f", "-"], input=json.dumps(manifest))

    def running() -> dict[str, str]:
        items = json.loads(cluster.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"]
        return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in items if p["status"].get("phase") == "Running"}

    def two_running(without: str | None = None) -> dict[str, str] | None:
        pods = running()
        return pods if len(pods) == 2 and without not in pods else None

    first = wait_until(two_running, 30, "two running pods")
    wait_until(lambda: all((pids / f"{name}.ticks").exists() for name in first), 15, "both pods to tick")
    lost_pod, victim = min(first.items())
    spare = (set(cluster.node_names()) - set(first.values())).pop()
    orphan = int((pids / lost_pod).read_text())
    agent = cluster.agent_pid(victim)
    cmd = agent_argv(agent)
    restarted = None
    os.kill(agent, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    try:
        wait_until(lambda: next(n for n in cluster.nodes_json() if n["name"] == victim)["state"] == "DOWN", 15,
                   f"{victim} to go DOWN")
        assert not pid_alive(orphan), "the pod of a node whose lease ran out still runs when the node goes DOWN"
        now = wait_until(lambda: two_running(without=lost_pod), 20, "the ReplicaSet to replace the lost pod")
        replacement = (set(now) - set(first)).pop()
        assert now[replacement] == spare and victim not in now.values(), now
        wait_until(lambda: (pids / f"{replacement}.ticks").exists(), 15, "the replacement to tick")
        lost_end, began = _ticks(pids / f"{lost_pod}.ticks")[1], _ticks(pids / f"{replacement}.ticks")[0]
        assert lost_end < began, f"pod {lost_pod} ticked until {lost_end:.2f}, after {replacement} began at {began:.2f}"
        # Its supervisor did it, with no agent: its log says so.
        logs = [p.read_text() for p in (cluster.root / "state" / "nodes" / victim / "pods").glob(
            f"*_{lost_pod}_*/main/run.*/supervise.log")]
        assert any("fenced: the node's lease ran out" in text for text in logs), logs
    finally:
        if fault == "stop":
            os.kill(agent, signal.SIGCONT)
        else:
            restarted = _start_agent(cluster, cmd)
    try:
        wait_until(lambda: next(n for n in cluster.nodes_json() if n["name"] == victim)["state"] == "UP", 20,
                   f"{victim} to come back")
        if fault == "stop":  # woken, it finds its lease long expired and fences what it still holds
            log = (cluster.root / "state" / "logs" / f"{victim}.log").read_text()
            assert "fencing: no report reached the server" in log, log[-2000:]
        ticked = (pids / f"{lost_pod}.ticks").read_text()
        time.sleep(2)  # a few reports from the agent: still the replacement, never the old pod back
        assert running() == now
        assert (pids / f"{lost_pod}.ticks").read_text() == ticked, f"pod {lost_pod} ran again on {victim}"
    finally:
        if restarted is not None:
            restarted.terminate()
            restarted.wait(timeout=30)


def test_a_server_back_from_an_outage_longer_than_the_heartbeat_timeout_marks_no_node_down(tmp_path):
    """The server is down for twice the heartbeat timeout (agents without fencing keep their
    jobs running meanwhile, as slurmd does). Started again, it gives every node a full timeout
    from its own start, as slurmctld does: the agents report in, no node goes DOWN, no job
    fails."""
    import subprocess

    config = tmp_path / "cluster.yaml"
    config.write_text(json.dumps({
        "cluster_name": "outage", "partitions": [{"name": "batch", "nodes": "node[01-02]", "default": True}],
        "nodes": {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 3.0, "kill_wait_s": 2.0, "fencing": False}}))
    cluster = LocalCluster(tmp_path / "cluster", nodes=2, gpus_per_node=0, config=str(config)).up()
    server: subprocess.Popen | None = None
    try:
        jobs = [cluster.sbatch("--nodelist", name, "--wrap", "sleep 300") for name in cluster.node_names()]
        for job in jobs:
            cluster.wait_for(job, states=("RUNNING",), timeout=30)
        pid = cluster.state["pids"]["server"]
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
        os.kill(pid, signal.SIGKILL)
        time.sleep(6.0)  # twice the heartbeat timeout: every node's last heartbeat is stale now
        with open(cluster.root / "server-restarted.log", "ab") as log:
            server = subprocess.Popen(argv, env=cluster.env, start_new_session=True, stdout=log, stderr=log)
        wait_until(lambda: _answers(cluster), 60, "the restarted server to answer")
        deadline = time.time() + 6.0  # past a full timeout from the restart
        while time.time() < deadline:
            states = {n["name"]: n["state"] for n in cluster.nodes_json()}
            assert set(states.values()) == {"UP"}, states
            assert [cluster.job(j)["state"] for j in jobs] == ["RUNNING", "RUNNING"]
            time.sleep(0.2)
        for job in jobs:
            cluster.run(["scancel", str(job)])
            assert cluster.wait_for(job, timeout=30)["state"] == "CANCELLED"
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        cluster.down()


def _answers(cluster: LocalCluster) -> bool:
    try:
        cluster.nodes_json()
        return True
    except ClientError:
        return False
