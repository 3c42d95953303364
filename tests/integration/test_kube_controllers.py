"""The serving controllers reconcile one object at a time (Kubernetes' work-queue pattern):
a Deployment whose reconcile fails is logged and retried after its back-off, and the
others go on being reconciled."""

from __future__ import annotations

import json
import sqlite3

from tests.integration.cluster import wait_until


def deployment(name: str, replicas: int) -> str:
    return json.dumps({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": "shoal/sleeper:1",
                                                       "command": ["sleep", "600"],
                                                       "resources": {"requests": {"cpu": "100m",
                                                                                  "memory": "16Mi"}}}]}}}})


def running_pods(cluster, app: str) -> list[str]:
    out = json.loads(cluster.run(["shoal", "get", "pods", "-l", f"app={app}", "-o", "json"]).stdout)["items"]
    return [p["metadata"]["name"] for p in out if p["status"].get("phase") == "Running"]


def test_a_deployment_that_cannot_be_reconciled_does_not_stall_the_others(cluster):
    for name in ("good", "bad"):
        (cluster.workdir / f"{name}.json").write_text(deployment(name, 1))
        cluster.run(["shoal", "apply", "-f", str(cluster.workdir / f"{name}.json")])
    for name in ("good", "bad"):
        wait_until(lambda: len(running_pods(cluster, name)) == 1, 60, f"deployment {name} running")

    # Break the stored Deployment as no API request could (a value its reconcile cannot read).
    db = sqlite3.connect(cluster.root / "state" / "server" / "shoal.db", timeout=30)
    with db:
        (body,) = db.execute("SELECT body FROM objects WHERE kind = 'Deployment' AND name = 'bad'").fetchone()
        broken = json.loads(body)
        broken["spec"]["replicas"] = "lots"
        db.execute("UPDATE objects SET body = ? WHERE kind = 'Deployment' AND name = 'bad'", (json.dumps(broken),))
    db.close()

    cluster.run(["shoal", "scale", "deployment/good", "--replicas=3"])
    wait_until(lambda: len(running_pods(cluster, "good")) == 3, 60, "the good deployment scaled to 3")
    log = (cluster.root / "state" / "logs" / "server.log").read_text()
    assert "reconciling Deployment default/bad failed" in log
    assert running_pods(cluster, "bad"), "the broken deployment's pod is left as it was"
