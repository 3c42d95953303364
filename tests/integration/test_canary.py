"""A canary, end to end: two Deployments of the example model server (the stable version and
a canary) behind one Service whose `shoal.io/traffic-split` annotation sends 10% to the
canary; 2,000 requests through `shoal gateway` from a real cluster's routes; the canary
answers 10% +- 3% of them. Changing the annotation moves the traffic without a restart."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.traffic import apply, ask, model_deployment, serving

PORT = 8000


def service(split: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "llm", "annotations": {"shoal.io/traffic-split": split}},
                       "spec": {"selector": {"tier": "llm"}, "ports": [{"port": 80, "targetPort": PORT}]}}) + "\n"


def deployment(name: str, replicas: int, version: str) -> str:
    """The model server with the Service's shared label; its own Service is left out."""
    docs = [json.loads(d) for d in model_deployment(name, replicas=replicas, port=PORT, version=version).split("\n---\n")]
    deploy = docs[0]
    deploy["spec"]["template"]["metadata"]["labels"]["tier"] = "llm"
    return json.dumps(deploy) + "\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gw = free_port()
    # Pods use the node's network: three pods on one port need three nodes.
    c = LocalCluster(tmp_path_factory.mktemp("canary"), nodes=3, gpus_per_node=1, extra=("--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def versions_of(c: LocalCluster, requests: int) -> Counter:
    """Send ``requests`` completions through the gateway, 16 at a time; count answers by version."""
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: ask(c.gateway, "llm"), range(requests)))
    assert all(status == 200 for status, _ in answers), Counter(status for status, _ in answers)
    return Counter(doc["version"] for _, doc in answers)


def test_a_10_percent_canary_gets_10_percent_of_2000_requests(cluster, tmp_path):
    apply(cluster, tmp_path / "stable.yaml", deployment("llm-stable", 2, "v1"))
    apply(cluster, tmp_path / "canary.yaml", deployment("llm-canary", 1, "v2"))
    apply(cluster, tmp_path / "svc.yaml", service("llm-stable=90,llm-canary=10"))
    wait_until(lambda: len(serving(cluster, "llm")) == 3, 60, "three ready backends in the gateway's routes")
    wait_until(lambda: ask(cluster.gateway, "llm")[0] == 200, 20, "the gateway routing to the Service")

    counts = versions_of(cluster, 2000)
    assert sum(counts.values()) == 2000
    assert 140 <= counts["v2"] <= 260, counts  # 10% +- 3% of 2,000

    # The operator promotes the canary to half the traffic: no restart, the gateway follows the routes.
    apply(cluster, tmp_path / "svc.yaml", service("llm-stable=50,llm-canary=50"))

    def half():
        c = versions_of(cluster, 200)
        return c if 80 <= c["v2"] <= 120 else None

    wait_until(half, 20, "half the traffic on the canary after the split changed", interval=0.5)
