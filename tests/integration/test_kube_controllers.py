"""The serving controllers reconcile one object at a time (Kubernetes' work-queue pattern):
a Deployment or HPA whose reconcile fails is logged and retried after its back-off, and the
others go on being reconciled."""

from __future__ import annotations

import json
import sqlite3

from tests.integration.cluster import LocalCluster, wait_until


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

    break_stored(cluster, "Deployment", "bad", lambda body: body["spec"].update(replicas="lots"))

    cluster.run(["shoal", "scale", "deployment/good", "--replicas=3"])
    wait_until(lambda: len(running_pods(cluster, "good")) == 3, 60, "the good deployment scaled to 3")
    log = (cluster.root / "state" / "logs" / "server.log").read_text()
    assert "reconciling Deployment default/bad failed" in log
    assert running_pods(cluster, "bad"), "the broken deployment's pod is left as it was"


def break_stored(cluster, kind: str, name: str, change) -> None:
    """Change a stored object as no API request could (a value its reconcile cannot read)."""
    db = sqlite3.connect(cluster.root / "state" / "server" / "shoal.db", timeout=30)
    with db:
        (body,) = db.execute("SELECT body FROM objects WHERE kind = ? AND name = ?", (kind, name)).fetchone()
        broken = json.loads(body)
        change(broken)
        db.execute("UPDATE objects SET body = ? WHERE kind = ? AND name = ?", (json.dumps(broken), kind, name))
    db.close()


def test_an_autoscaler_that_cannot_be_reconciled_does_not_stall_the_deployments(make_cluster, tmp_path):
    config = tmp_path / "cluster.yaml"  # an HPA pass every round, as the broken one would fail each
    config.write_text(json.dumps({"cluster_name": "hpa", "serving": {"hpa_sync_s": 0.1},
                                  "partitions": [{"name": "gpu", "nodes": "node[01-02]", "default": True}]}))
    cluster: LocalCluster = make_cluster(config=str(config))
    (cluster.workdir / "web.json").write_text(deployment("web", 1))
    cluster.run(["shoal", "apply", "-f", str(cluster.workdir / "web.json")])
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "minReplicas": 1, "maxReplicas": 1,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": 80}}}]}}
    cluster.run(["shoal", "apply", "-f", "-"], input=json.dumps(hpa))
    wait_until(lambda: len(running_pods(cluster, "web")) == 1, 60, "deployment web running")

    break_stored(cluster, "HorizontalPodAutoscaler", "web",
                 lambda body: body["spec"].update(maxReplicas="lots"))
    cluster.run(["shoal", "scale", "deployment/web", "--replicas=2"])
    wait_until(lambda: len(running_pods(cluster, "web")) == 2, 60, "deployment web scaled to 2 by hand")
    log = (cluster.root / "state" / "logs" / "server.log").read_text()
    assert "reconciling HorizontalPodAutoscaler default/web failed" in log
