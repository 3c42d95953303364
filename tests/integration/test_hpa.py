"""The HPA on real processes: examples/serving/hpa.yaml (the example model server standing in
for vLLM) behind the gateway scales up under a bounded load and back down to minReplicas
after it; a CPU-bound pod's cpu utilisation and its fake GPU's DCGM_FI_DEV_GPU_UTIL reach
the HPA's currentMetrics through the agents' heartbeats."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, free_port, wait_until
from tests.integration.traffic import Load

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "serving" / "model_server.py"
HPA_YAML = ROOT / "examples" / "serving" / "hpa.yaml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("hpa")
    gw = free_port()
    # One pod per node (hostNetwork: the containerPort is the node's), so 4 nodes for maxReplicas 4.
    config = root / "cluster.yaml"
    config.write_text(json.dumps({
        "cluster_name": "hpa", "partitions": [{"name": "gpu", "nodes": "node[01-04]", "default": True}],
        "nodes": {"heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 60.0, "kill_wait_s": 2.0},
        "serving": {"hpa_sync_s": 1.0}}))
    c = LocalCluster(root, nodes=4, gpus_per_node=2, gpu_model="L4", cpus_per_node=8, memory="64G",
                     config=str(config), extra=("--image", f"vllm/vllm-openai:*=python3 {SERVER}",
                                                "--gateway", str(gw)))
    c.gateway = f"http://127.0.0.1:{gw}"
    c.up()
    yield c
    c.down()


def obj(c: LocalCluster, kind: str, name: str) -> dict:
    return c.api("GET", f"/shoal/v1/kube/objects/{kind}/default/{name}")


def hpa_when(c: LocalCluster, name: str, ok) -> dict | None:
    """The HPA if ``ok(hpa)``, else None (for wait_until)."""
    hpa = obj(c, "horizontalpodautoscalers", name)
    return hpa if ok(hpa) else None


def ready_pods(c: LocalCluster, app: str) -> list[dict]:
    items = c.api("GET", f"/shoal/v1/kube/objects/pods?namespace=default&selector=app%3D{app}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")
            and any(x["type"] == "Ready" and x["status"] == "True" for x in p["status"].get("conditions", ()))]


def hpa_events(c: LocalCluster, name: str) -> list[str]:
    items = c.api("GET", "/shoal/v1/kube/objects/events?namespace=default")["items"]
    return [e["message"] for e in items
            if e["involvedObject"]["kind"] == "HorizontalPodAutoscaler" and e["involvedObject"]["name"] == name
            and e["reason"] == "SuccessfulRescale"]


def condition(hpa: dict, kind: str) -> dict:
    return next(x for x in hpa["status"]["conditions"] if x["type"] == kind)


def test_load_scales_the_deployment_up_and_quiet_scales_it_back_to_min_replicas(cluster):
    cluster.run(["shoal", "apply", "-f", str(HPA_YAML)])
    wait_until(lambda: len(ready_pods(cluster, "llm")) == 2, 60, "the 2 initial replicas to be ready")
    hpa = wait_until(lambda: hpa_when(cluster, "llm", lambda h: len(h.get("status", {}).get("currentMetrics") or ()) == 2),
                     30, "the HPA to read both metrics")
    assert hpa["status"]["desiredReplicas"] == 2
    assert condition(hpa, "ScalingActive")["status"] == "True"

    # 12 clients asking one after another (bounded by the waits below): about 6 requests in
    # flight per pod against a target of 2.
    with Load(cluster.gateway, "llm", workers=12) as load:
        wait_until(lambda: obj(cluster, "deployments", "llm")["spec"]["replicas"] == 4, 60,
                   "the HPA to scale the Deployment to 4 replicas")
        wait_until(lambda: len(ready_pods(cluster, "llm")) == 4, 60, "4 ready replicas")
        hpa = wait_until(lambda: hpa_when(cluster, "llm", lambda h: condition(h, "ScalingLimited")["status"] == "True"),
                         30, "the HPA to say it is held at maxReplicas")
    assert load.answers and not load.failures(), load.failures()[:5]
    assert condition(hpa, "ScalingLimited")["reason"] == "TooManyReplicas"
    inflight = next(m for m in hpa["status"]["currentMetrics"] if m["pods"]["metric"]["name"] == "inflight_requests")
    assert float(inflight["pods"]["current"]["averageValue"].rstrip("m")) > 0
    assert hpa["status"]["currentReplicas"] == 4 and hpa["status"].get("lastScaleTime")
    assert any(m.startswith(("New size: 4; reason: pods metric inflight_requests above target",
                             "New size: 3; reason: pods metric inflight_requests above target"))
               for m in hpa_events(cluster, "llm")), hpa_events(cluster, "llm")

    # No load: after the 10 s scale-down window the HPA goes back to minReplicas.
    wait_until(lambda: obj(cluster, "deployments", "llm")["spec"]["replicas"] == 2, 60,
               "the HPA to scale back down to 2 replicas")
    wait_until(lambda: len(ready_pods(cluster, "llm")) == 2 and len(cluster.api(
        "GET", "/shoal/v1/kube/objects/pods?namespace=default&selector=app%3Dllm")["items"]) == 2, 60,
        "the extra pods to be gone")
    assert "New size: 2; reason: All metrics below target" in hpa_events(cluster, "llm")
    hpa = obj(cluster, "horizontalpodautoscalers", "llm")
    assert hpa["status"]["desiredReplicas"] == 2 and condition(hpa, "AbleToScale")["status"] == "True"


BURNER = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: burner}
spec:
  replicas: 1
  selector: {matchLabels: {app: burner}}
  template:
    metadata: {labels: {app: burner}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: busybox
        # Half a core: 50 ms of work in every 100 ms.
        command: ["python3", "-c",
                  "import time\\nwhile True:\\n  t = time.time() + 0.05\\n  while time.time() < t: pass\\n  time.sleep(0.05)"]
        resources:
          requests: {cpu: 250m, nvidia.com/gpu: 1}
          limits: {nvidia.com/gpu: 1}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: burner}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burner}
  minReplicas: 1
  maxReplicas: 2
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 40}}
  - type: Pods
    pods: {metric: {name: DCGM_FI_DEV_GPU_UTIL}, target: {type: AverageValue, averageValue: "10"}}
"""


def test_a_busy_pods_cpu_and_gpu_utilisation_reach_the_hpa_from_its_agent(cluster, tmp_path):
    manifest = tmp_path / "burner.yaml"
    manifest.write_text(BURNER)
    cluster.run(["shoal", "apply", "-f", str(manifest)])
    try:
        def busy_metrics():
            h = obj(cluster, "horizontalpodautoscalers", "burner")
            current = {(m["type"], (m.get("resource") or m.get("pods", {}).get("metric", {})).get("name")): m
                       for m in h.get("status", {}).get("currentMetrics") or ()}
            cpu = current.get(("Resource", "cpu"))
            gpu = current.get(("Pods", "DCGM_FI_DEV_GPU_UTIL"))
            if cpu and gpu and cpu["resource"]["current"]["averageUtilization"] >= 80 \
                    and int(gpu["pods"]["current"]["averageValue"].rstrip("m")) >= 20 \
                    and h["status"]["desiredReplicas"] == 2:
                return h, cpu, gpu
            return None

        # Half a core on a 250m request is ~200%, on a GPU it holds alone ~50% busy (less when
        # the machine is shared): twice the targets or more, so the HPA wants a second pod.
        wait_until(busy_metrics, 60, "the burner's cpu and GPU figures in the HPA's currentMetrics")
        assert any("above target" in m for m in hpa_events(cluster, "burner"))
        # The agent exports the same GPU figure DCGM-style, labelled with the pod holding the GPU.
        def exported():
            for pod in ready_pods(cluster, "burner"):
                node = next(n for n in cluster.nodes_json() if n["name"] == pod["spec"]["nodeName"])
                with urllib.request.urlopen(f"http://{node['address']}:{node['port']}/metrics", timeout=10) as r:
                    text = r.read().decode()
                for line in text.splitlines():
                    if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and f'pod="{pod["metadata"]["name"]}"' in line \
                            and int(line.rsplit(" ", 1)[1]) > 0:
                        return node, line
            return None

        node, line = wait_until(exported, 20, "a busy GPU in an agent's DCGM-style /metrics")
        assert f'Hostname="{node["name"]}"' in line and 'modelName="NVIDIA L4"' in line and 'namespace="default"' in line
    finally:
        cluster.run(["shoal", "delete", "-f", str(manifest)], check=False)


def test_without_a_cpu_request_the_default_cpu_target_cannot_be_computed_and_nothing_scales(cluster, tmp_path):
    # The issue's vLLM Deployment asks for no CPU; an HPA with the default metric (cpu at 80%
    # of requests) must say so, as Kubernetes does, instead of scaling a busy pod to the max.
    manifest = tmp_path / "no-request.yaml"
    head, hpa = BURNER.split("---")
    hpa = hpa[:hpa.index("  metrics:")]
    manifest.write_text((head.replace("requests: {cpu: 250m, nvidia.com/gpu: 1}", "requests: {nvidia.com/gpu: 1}")
                         + "---" + hpa).replace("burner", "norequest"))
    cluster.run(["shoal", "apply", "-f", str(manifest)])
    try:
        wait_until(lambda: ready_pods(cluster, "norequest"), 30, "the pod to be ready")
        node = ready_pods(cluster, "norequest")[0]["spec"]["nodeName"]

        def cpu_reported() -> bool:  # the agent's figure for the pod is in (the burner is busy)
            n = next(n for n in cluster.nodes_json() if n["name"] == node)
            with urllib.request.urlopen(f"http://{n['address']}:{n['port']}/metrics", timeout=10) as r:
                return any(x.startswith("shoal_pod_cpu_cores{") and 'pod="norequest-' in x
                           and float(x.rsplit(" ", 1)[1]) > 0.1 for x in r.read().decode().splitlines())

        wait_until(cpu_reported, 30, "the pod's CPU in its agent's /metrics")
        hpa = wait_until(lambda: hpa_when(cluster, "norequest", lambda h: any(
            c["type"] == "ScalingActive" for c in h.get("status", {}).get("conditions") or ())), 30, "an HPA pass")
        time.sleep(3)  # a few more HPA passes (1 s apart) with the CPU figure in hand
        hpa = obj(cluster, "horizontalpodautoscalers", "norequest")
        active = condition(hpa, "ScalingActive")
        assert (active["status"], active["reason"]) == ("False", "FailedGetResourceMetric")
        assert "resource cpu" in active["message"]
        assert obj(cluster, "deployments", "norequest")["spec"]["replicas"] == 1
        assert not hpa_events(cluster, "norequest")
    finally:
        cluster.run(["shoal", "delete", "-f", str(manifest)], check=False)
        wait_until(lambda: not cluster.api("GET", "/shoal/v1/kube/objects/pods?namespace=default&selector=app%3Dnorequest")
                   ["items"], 30, "its pods to be gone")


def scale_to_zero_manifests() -> str:
    """The model server behind a scale-to-zero Service, with an HPA allowed down to 0 replicas."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nap"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nap"}},
                           "template": {"metadata": {"labels": {"app": "nap"}}, "spec": {
                               "terminationGracePeriodSeconds": 2,
                               "containers": [{"name": "model", "image": "vllm/vllm-openai:v0.6.0",
                                               "ports": [{"containerPort": 8100}],
                                               "readinessProbe": {"httpGet": {"path": "/health", "port": 8100},
                                                                  "periodSeconds": 1, "failureThreshold": 1},
                                               "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "nap", "annotations": {"shoal.io/scale-to-zero": "true"}},
               "spec": {"selector": {"app": "nap"}, "ports": [{"port": 80, "targetPort": 8100}]}}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "nap"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nap"},
                    "minReplicas": 0, "maxReplicas": 2,
                    "metrics": [{"type": "Pods", "pods": {"metric": {"name": "inflight_requests"},
                                                          "target": {"type": "AverageValue", "averageValue": "1"}}}],
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 3}}}}
    return "\n---\n".join(json.dumps(d) for d in (deployment, service, hpa))


def test_min_replicas_zero_scales_an_idle_service_to_zero_and_a_request_wakes_it(cluster):
    cluster.run(["shoal", "apply", "-f", "-"], input=scale_to_zero_manifests())
    replicas = lambda: obj(cluster, "deployments", "nap")["spec"]["replicas"]  # noqa: E731
    # Idle: no request in flight, so the HPA takes it down to zero and says so.
    wait_until(lambda: replicas() == 0 and not ready_pods(cluster, "nap"), 60, "the idle Deployment at 0 replicas")
    hpa = wait_until(lambda: hpa_when(cluster, "nap", lambda h: condition(h, "ScalingActive")["reason"] == "ScaledToZero"),
                     20, "the HPA to say it is scaled to zero")
    assert hpa["status"]["currentReplicas"] == 0

    # A request arrives: the gateway holds it, the server scales 0 -> 1, the pod answers it.
    started = time.monotonic()
    req = urllib.request.Request(f"{cluster.gateway}/v1/completions", method="POST",
                                 data=json.dumps({"prompt": "wake", "max_tokens": 2}).encode(),
                                 headers={"Host": "nap.default", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        assert json.loads(r.read())["usage"]["completion_tokens"] == 2
    cold_start = time.monotonic() - started
    assert cold_start < 30, cold_start
    assert any("a request is waiting at the gateway" in m for m in hpa_events(cluster, "nap"))

    # Quiet again: back to zero.
    wait_until(lambda: replicas() == 0, 60, "the Deployment back at 0 replicas after the request")
    cluster.run(["shoal", "delete", "-f", "-"], input=scale_to_zero_manifests())
