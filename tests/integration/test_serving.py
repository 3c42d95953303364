"""Serving end to end: the issue's vLLM Deployment, as written, on tainted and labelled
nodes, with the example model server standing in for the vLLM image; a Service behind the
gateway; logs; a batch job beside the pods on the same GPUs."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "serving" / "model_server.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    gw = free_port()
    c = LocalCluster(tmp_path_factory.mktemp("serving"), nodes=4, gpus_per_node=8, gpu_model="H100-SXM-80GB",
                     memory="1T", extra=("--label", "nvidia.com/gpu.product=NVIDIA-H100-SXM",
                                         "--taint", "nvidia.com/gpu=present:NoSchedule",
                                         "--image", f"vllm/vllm-openai:*=python3 {SERVER}",
                                         "--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def pods(c: LocalCluster) -> list[dict]:
    return json.loads(c.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"]


def test_vllm_manifest_applies_and_runs(cluster):
    out = cluster.run(["shoal", "apply", "-f", str(ROOT / "examples/serving/vllm-llama-70b.yaml")])
    assert out.stdout.strip() == "deployment.apps/vllm-llama-70b created"
    def deployment():
        d = json.loads(cluster.run(["shoal", "get", "deploy", "vllm-llama-70b", "-o", "json"]).stdout)
        return d if d["status"].get("availableReplicas") == 4 else None

    deploy = wait_until(deployment, 30, "4 available replicas")
    ready = pods(cluster)
    assert len(ready) == 4
    assert all(any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]) for p in ready)
    # The nodeSelector + toleration let them onto the tainted H100 nodes; the port keeps one per node.
    assert sorted(p["spec"]["nodeName"] for p in ready) == cluster.node_names()
    assert deploy["status"]["readyReplicas"] == 4 and deploy["status"]["updatedReplicas"] == 4
    table = cluster.run(["shoal", "get", "deploy"]).stdout
    assert "vllm-llama-70b   4/4" in table
    # Each pod got 4 GPUs as CUDA_VISIBLE_DEVICES, and its log is readable through the server.
    name = ready[0]["metadata"]["name"]
    log = wait_until(lambda: (lambda t: t if "loaded" in t else None)(cluster.run(["shoal", "logs", name]).stdout),
                     15, "the model server's start-up line")
    assert "CUDA_VISIBLE_DEVICES='0,1,2,3'" in log or "CUDA_VISIBLE_DEVICES='4,5,6,7'" in log
    nodes = {n["name"]: n for n in cluster.nodes_json()}
    assert all(n["gpus_alloc"] == 4 for n in nodes.values())


def test_service_answers_through_the_gateway(cluster):
    cluster.run(["shoal", "apply", "-f", str(ROOT / "examples/serving/vllm-service.yaml")])

    def ask():
        req = urllib.request.Request(f"{cluster.gateway}/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "the gateway", "max_tokens": 4}).encode(),
                                     headers={"Host": "vllm.default", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return None

    answer = wait_until(ask, 20, "an answer through the gateway")
    assert answer["usage"]["completion_tokens"] == 4
    seen = {ask()["pod"] for _ in range(40)}
    assert len(seen) >= 2  # balanced over the ready pods


def test_batch_job_uses_the_gpus_serving_left(cluster):
    # Batch jobs ignore taints (partitions fence training); 4 GPUs are free on each node.
    job = cluster.sbatch("--gres=gpu:4", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    done = cluster.wait_for(job, timeout=30)
    assert done["state"] == "COMPLETED"


def test_bad_manifest_names_the_field(cluster, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "examples/serving/vllm-llama-70b.yaml").read_text().replace("replicas: 4", "replica: 4"))
    out = cluster.run(["shoal", "apply", "-f", str(bad)], check=False)
    assert out.returncode == 1
    assert "spec.replica" in out.stderr and "Traceback" not in out.stderr


def test_a_container_that_cannot_be_created_says_why_instead_of_hanging(cluster):
    """No command for the image on the process runtime, and a container engine that cannot
    run here (no docker daemon, or no docker at all): both pods wait with a kubelet-style
    reason, the message says what is wrong, and an event is recorded; neither counts restarts."""
    def deployment(name: str, runtime: str | None) -> dict:
        spec = {"containers": [{"name": "app", "image": "ghcr.io/example/unknown-app:1.0"}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
        if runtime:
            spec["runtimeClassName"] = runtime
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}

    docs = [deployment("no-command", None), deployment("no-engine", "docker")]
    cluster.run(["shoal", "apply", "-f", "-"], input="\n---\n".join(json.dumps(d) for d in docs))

    def waiting(app: str):
        for p in pods(cluster):
            if p["metadata"]["labels"].get("app") == app:
                for cs in p["status"].get("containerStatuses") or ():
                    w = cs.get("state", {}).get("waiting") or {}
                    if w.get("reason") not in (None, "ContainerCreating"):
                        return p, cs, w
        return None

    pod, cs, w = wait_until(lambda: waiting("no-command"), 30, "the no-command pod's waiting reason")
    assert w["reason"] == "CreateContainerError", w
    assert "the process runtime needs a command for image ghcr.io/example/unknown-app:1.0" in w["message"]
    assert cs["restartCount"] == 0 and pod["status"]["phase"] == "Pending"
    table = cluster.run(["shoal", "get", "pods", "-l", "app=no-command"]).stdout
    assert "CreateContainerError" in table, table
    described = cluster.run(["shoal", "describe", "pod", pod["metadata"]["name"]]).stdout
    assert "Warning" in described and "Failed" in described, described

    pod, cs, w = wait_until(lambda: waiting("no-engine"), 60, "the docker pod's waiting reason")
    assert w["reason"] in ("CreateContainerError", "ErrImagePull", "ImagePullBackOff"), w
    assert "docker" in w["message"], w
    assert cs["restartCount"] == 0
    cluster.run(["shoal", "delete", "deployment", "no-command", "no-engine"])


def test_a_noexecute_taint_evicts_the_pod_that_does_not_tolerate_it(cluster):
    """The taint manager: a node tainted NoExecute loses the running pods that do not tolerate
    the taint (their ReplicaSet replaces them elsewhere, or they wait); the others stay."""
    def vllm_pods():
        return [p for p in pods(cluster) if p["metadata"]["labels"].get("app") == "vllm"
                and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]

    node = wait_until(vllm_pods, 30, "a running vllm pod")[0]["spec"]["nodeName"]
    cluster.run(["shoal", "taint", "node", node, "maintenance=now:NoExecute"])
    try:
        wait_until(lambda: all(p["spec"]["nodeName"] != node for p in vllm_pods()), 30,
                   f"the vllm pod on {node} to be evicted")
        assert len({p["spec"]["nodeName"] for p in vllm_pods()}) == len(vllm_pods()), "one per node, still"
        events = cluster.run(["shoal", "get", "events"]).stdout
        assert "TaintManagerEviction" in events, events
    finally:
        cluster.run(["shoal", "taint", "node", node, "maintenance=now:NoExecute-"])
