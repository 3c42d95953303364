"""An agent killed under serving pods and started again, as after a crash or an upgrade: the
pods never notice. Each container process runs under its own supervisor, which outlives the
agent (kubelet's conmon); the new agent re-adopts the containers, with the same process and
restart count, probes them again and follows their logs, while traffic through the gateway
goes on. A pod deleted while the agent was down is stopped once it is back.
"""

from __future__ import annotations

import time

from tests.integration.cluster import free_port, wait_until
from tests.integration.test_agent_restart import _alive, _kill_agent, _start_agent
from tests.integration.traffic import Load, apply, model_deployment, pods, serving


def _container(cluster, app: str) -> dict:
    """The one pod of Deployment ``app``: its name, main process, restart count and readiness."""
    [pod] = pods(cluster, f"app={app}")
    status = pod["status"]["containerStatuses"][0]
    return {"name": pod["metadata"]["name"], "pid": int(status["containerID"].split("://")[1]),
            "restarts": status["restartCount"], "ready": status["ready"]}


def test_serving_pods_survive_a_restart_of_their_agent(make_cluster, tmp_path):
    gw = free_port()
    cluster = make_cluster(nodes=1, gpus_per_node=0, extra=("--gateway", str(gw)))
    gateway = f"http://127.0.0.1:{gw}"
    apply(cluster, tmp_path / "serve.yaml", model_deployment("serve", replicas=1, port=8300))
    apply(cluster, tmp_path / "doomed.yaml", model_deployment("doomed", replicas=1, port=8301))
    wait_until(lambda: serving(cluster, "serve") and serving(cluster, "doomed"), 60, "both pods in the routes")
    before, doomed = _container(cluster, "serve"), _container(cluster, "doomed")
    restarted_log = cluster.root / "agent-restarted.log"

    agent = None
    try:
        with Load(gateway, "serve", workers=2) as load:
            wait_until(lambda: len(load.answers) >= 20, 20, "traffic through the gateway")
            lines_before = cluster.run(["shoal", "logs", before["name"]]).stdout.count("\n")
            cmd = _kill_agent(cluster, cluster.node_names()[0])
            cluster.run(["shoal", "delete", "deployment", "doomed"])  # while no agent watches
            time.sleep(1.0)
            agent = _start_agent(cluster, cmd)
            wait_until(lambda: "re-adopted 2 pod(s)" in restarted_log.read_text(), 30,
                       "the new agent to re-adopt both pods")
            back = time.time()
            wait_until(lambda: sum(a.sent > back + 3.0 for a in load.answers) >= 20, 30,
                       "traffic for a while after the restart")
            # The deleted pod's process is stopped by the new agent (TERM, within its grace period).
            wait_until(lambda: not _alive(doomed["pid"]), 30, "the deleted pod's process to be stopped")
            wait_until(lambda: not pods(cluster, "app=doomed"), 30, "the deleted pod to be gone")
            after = _container(cluster, "serve")
            lines_after = cluster.run(["shoal", "logs", before["name"]]).stdout.count("\n")

        # The same process, never restarted, ready all along: not one request failed.
        assert after == before, (before, after)
        assert _alive(before["pid"])
        assert load.failures() == [], load.failures()[:5]
        assert len(load.answers) >= 60
        # Its log goes on in the same file (one line a request), read through the new agent.
        assert lines_after > lines_before
    finally:
        if agent is not None:
            agent.terminate()  # an agent's TERM stops the node's pods, as `shoal down` expects
            agent.wait(timeout=30)
    assert not _alive(before["pid"])
