"""An administrator revokes a node's agent credential: the agent's next report is refused
(and it stops, rather than joining again on its own), its node goes DOWN after the heartbeat
timeout like any silent node, and the agent started again with the join token brings it back."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.integration.cluster import LocalCluster, agent_argv, wait_until


def _node(cluster: LocalCluster, name: str) -> dict:
    return next(n for n in cluster.nodes_json() if n["name"] == name)


def test_a_revoked_node_goes_down_until_its_agent_joins_again(tmp_path):
    cluster = LocalCluster(tmp_path / "cluster", nodes=1, gpus_per_node=0, heartbeat_timeout=3).up()
    agent: subprocess.Popen | None = None
    try:
        [name] = cluster.node_names()
        pid = cluster.agent_pid(name)
        argv = agent_argv(pid)
        log = cluster.root / "state" / "logs" / f"{name}.log"

        alice = cluster.api("POST", "/shoal/v1/tokens", {"user": "alice", "role": "user"})["token"]
        out = cluster.run(["shoal", "token", "revoke-node", name], env={"SHOAL_TOKEN": alice}, check=False)
        assert out.returncode == 1 and "admin" in out.stderr, out
        out = cluster.run(["shoal", "token", "revoke-node", "nosuchnode"], check=False)
        assert out.returncode == 1 and "no node nosuchnode" in out.stderr, out

        out = cluster.run(["shoal", "token", "revoke-node", name])
        assert out.stdout.startswith(f"node {name}: agent credential revoked"), out.stdout
        said = wait_until(lambda: "credential revoked" in log.read_text() and log.read_text(), 10,
                          "the agent's next request refused as revoked")
        assert "shoal token revoke-node" in said
        node = wait_until(lambda: (n := _node(cluster, name))["state"] == "DOWN" and n, 15, f"{name} to go DOWN")
        assert node["reason"] == "Not responding", node
        assert "registered" not in said.split("credential revoked", 1)[1], "the agent joined again on its own"

        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
                   15, "the revoked agent to stop")
        with open(log, "ab") as f:
            agent = subprocess.Popen(argv, env=cluster.env, start_new_session=True, stdout=f, stderr=f)
        wait_until(lambda: _node(cluster, name)["state"] == "UP", 20, f"{name} back UP after joining again")
        job = cluster.sbatch("--wrap", "srun echo back")
        done = cluster.wait_for(job, timeout=30)
        assert done["state"] == "COMPLETED", done
        assert (cluster.workdir / f"slurm-{job}.out").read_text() == "back\n"
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=15)
        cluster.down()

