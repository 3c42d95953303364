"""The Kubernetes API, spoken to by the real kubectl 1.32 and the official Python client: a
local cluster serving HTTPS (kubectl sends its token only over TLS), the vLLM example
Deployment run with the example model server standing in for the vLLM image.
"""

from __future__ import annotations

import base64
import json
import time
import shutil
import threading
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, wait_until

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "serving" / "model_server.py"
DEPLOYMENT = ROOT / "examples" / "serving" / "vllm-llama-70b.yaml"
SERVICE = ROOT / "examples" / "serving" / "vllm-service.yaml"

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("kubeapi"), nodes=2, gpus_per_node=8, gpu_model="H100-SXM-80GB",
                     memory="1T", extra=("--tls", "on", "--label", "nvidia.com/gpu.product=NVIDIA-H100-SXM",
                                         "--taint", "nvidia.com/gpu=present:NoSchedule",
                                         "--image", f"vllm/vllm-openai:*=python3 {SERVER}"))
    c.up()
    c.kubeconfig = str(c.root / "state" / "kubeconfig")
    c.env.update(KUBECONFIG=c.kubeconfig, KUBECACHEDIR=str(c.root / "kube-cache"))
    yield c
    c.down()


def kubectl(c: LocalCluster, *args: str, check: bool = True, kubeconfig: str | None = None, timeout: float = 60):
    env = {"KUBECONFIG": kubeconfig} if kubeconfig else None
    return c.run(["kubectl", *args], check=check, env=env, timeout=timeout)


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


@pytest.mark.slow
@needs_kubectl
def test_kubectl_transcript(cluster):
    """What a serving team types on a real cluster, and what kubectl prints back."""
    c = cluster
    out = kubectl(c, "version").stdout
    assert "Client Version: v1.32" in out and "Server Version: v1.32.0-shoal" in out

    kinds = table(kubectl(c, "api-resources").stdout)
    assert kinds[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert ["deployments", "deploy", "apps/v1", "true", "Deployment"] in kinds
    assert ["nodes", "no", "v1", "false", "Node"] in kinds

    nodes = table(kubectl(c, "get", "nodes", "-o", "wide").stdout)
    assert nodes[0][:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"] and "GPUS" in nodes[0]
    assert [row[nodes[0].index("GPUS")] for row in nodes[1:]] == ["0/8", "0/8"]

    # The example as it is (4 replicas of 4 GPUs; the process runtime fits one per node: one port).
    out = kubectl(c, "apply", "-f", str(DEPLOYMENT), "-f", str(SERVICE)).stdout
    assert out.split("\n")[:2] == ["deployment.apps/vllm-llama-70b created", "service/vllm created"]
    wait_until(lambda: table(kubectl(c, "get", "deploy", "vllm-llama-70b").stdout)[1][1:4] == ["2/4", "4", "2"],
               60, "2 of 4 replicas ready and available")
    got = kubectl(c, "get", "deploy,rs,pods", "-o", "wide").stdout
    blocks = got.strip().split("\n\n")
    assert table(blocks[0])[0] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES",
                                   "SELECTOR"]
    assert table(blocks[0])[1][:4] == ["deployment.apps/vllm-llama-70b", "2/4", "4", "2"]
    assert table(blocks[1])[0][:4] == ["NAME", "DESIRED", "CURRENT", "READY"]
    pods = table(blocks[2])
    assert pods[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE",
                       "READINESS", "GATES"]
    assert sorted(p[2] for p in pods[1:]) == ["Pending", "Pending", "Running", "Running"]
    assert sorted(p[6] for p in pods[1:] if p[2] == "Running") == ["node01", "node02"]
    nodes = table(kubectl(c, "get", "nodes").stdout)
    assert [row[-1] for row in nodes[1:]] == ["4/8", "4/8"]  # GPUs allocated, whatever holds them

    described = kubectl(c, "describe", "deploy", "vllm-llama-70b").stdout
    assert "Replicas:               4 desired | 4 updated | 4 total | 2 available | 2 unavailable" in described
    assert "NewReplicaSet:   vllm-llama-70b-" in described and "ScalingReplicaSet" in described

    assert kubectl(c, "scale", "deploy/vllm-llama-70b", "--replicas=1").stdout.strip() == \
        "deployment.apps/vllm-llama-70b scaled"
    assert kubectl(c, "set", "image", "deploy/vllm-llama-70b", "vllm=vllm/vllm-openai:v0.6.4").stdout.strip() == \
        "deployment.apps/vllm-llama-70b image updated"
    out = kubectl(c, "rollout", "status", "deploy/vllm-llama-70b", "--timeout=90s", timeout=100).stdout
    assert out.strip().endswith('deployment "vllm-llama-70b" successfully rolled out')
    history = table(kubectl(c, "rollout", "history", "deploy/vllm-llama-70b").stdout)
    assert [row[0] for row in history[2:]] == ["1", "2"]
    logs = kubectl(c, "logs", "deploy/vllm-llama-70b").stdout
    assert "meta-llama/Llama-3.1-70B" in logs

    # Server-side validation: an unknown field is named, nothing is applied.
    bad = c.root / "bad.yaml"
    bad.write_text(DEPLOYMENT.read_text().replace("  replicas: 4\n", "  replicas: 4\n  replicaz: 2\n"))
    out = kubectl(c, "apply", "-f", str(bad), check=False)
    assert out.returncode == 1
    assert 'The Deployment "vllm-llama-70b" is invalid: spec.replicaz: unknown field "spec.replicaz"' in out.stderr
    assert "replicas: 1" in kubectl(c, "get", "deploy", "vllm-llama-70b", "-o", "yaml").stdout

    explained = kubectl(c, "explain", "deployment.spec.replicas").stdout
    assert "FIELD: replicas <integer>" in explained and "Number of desired pods" in explained

    out = kubectl(c, "get", "pods", "nosuch", check=False)
    assert out.stderr.strip() == 'Error from server (NotFound): pods "nosuch" not found'

    out = kubectl(c, "delete", "-f", str(DEPLOYMENT), "-f", str(SERVICE), timeout=90).stdout
    assert out.split("\n")[:2] == ['deployment.apps "vllm-llama-70b" deleted', 'service "vllm" deleted']
    wait_until(lambda: "No resources found" in kubectl(c, "get", "pods").stderr, 60, "the pods to go")
    events = table(kubectl(c, "get", "events").stdout)
    assert events[0] == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert any(row[2] == "ScalingReplicaSet" and row[3] == "deployment/vllm-llama-70b" for row in events[1:])


@pytest.mark.slow
@needs_kubectl
def test_apply_of_a_changed_image_keeps_every_other_field(cluster):
    """Client-side apply's three-way strategic merge: the image changes; probes, GPU limits,
    ports and a label someone added with kubectl label stay as they were."""
    c = cluster
    manifest = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probed"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "probed"}},
                 "template": {"metadata": {"labels": {"app": "probed"}}, "spec": {
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{
                         "name": "server", "image": "vllm/vllm-openai:v1", "ports": [{"containerPort": 8100}],
                         "args": ["--port", "8100"],
                         "env": [{"name": "MODEL_VERSION", "value": "v1"}],
                         "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}},
                         "readinessProbe": {"httpGet": {"path": "/health", "port": 8100}, "periodSeconds": 2},
                     }]}}}}
    path = c.root / "probed.json"
    path.write_text(json.dumps(manifest))
    kubectl(c, "apply", "-f", str(path))
    kubectl(c, "label", "deploy", "probed", "team=infer")
    before = json.loads(kubectl(c, "get", "deploy", "probed", "-o", "json").stdout)

    manifest["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v2"
    path.write_text(json.dumps(manifest))
    assert kubectl(c, "apply", "-f", str(path)).stdout.strip() == "deployment.apps/probed configured"
    after = json.loads(kubectl(c, "get", "deploy", "probed", "-o", "json").stdout)

    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v2"
    after["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v1"
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == {"team": "infer"}
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    kubectl(c, "delete", "deploy", "probed", timeout=90)


@pytest.mark.slow
@needs_kubectl
def test_forbidden_outside_a_granted_namespace(cluster):
    c = cluster
    bob = str(c.root / "bob.kubeconfig")
    c.run(["shoal", "kubeconfig", "--user", "bob", "-o", bob])
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in ("team-a", "team-b")]
    docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "bob-edit", "namespace": "team-a"},
                 "subjects": [{"kind": "User", "name": "bob"}],
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"}})
    path = c.root / "rbac.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    kubectl(c, "apply", "-f", str(path))

    out = kubectl(c, "get", "pods", "-n", "team-b", kubeconfig=bob, check=False)
    assert out.returncode == 1
    assert out.stderr.strip() == ('Error from server (Forbidden): pods is forbidden: User "bob" cannot list '
                                  'resource "pods" in API group "" in the namespace "team-b"')
    out = kubectl(c, "get", "pods", "-n", "team-a", kubeconfig=bob)
    assert out.stderr.strip() == "No resources found in team-a namespace."

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
           "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}
    path = c.root / "svc.json"
    path.write_text(json.dumps(svc))
    assert kubectl(c, "apply", "-n", "team-a", "-f", str(path), kubeconfig=bob).stdout.strip() == \
        "service/web created"
    out = kubectl(c, "apply", "-n", "team-b", "-f", str(path), kubeconfig=bob, check=False)
    assert out.returncode == 1 and "Error from server (Forbidden)" in out.stderr
    assert 'User "bob" cannot create resource "services" in API group "" in the namespace "team-b"' in out.stderr
    kubectl(c, "delete", "ns", "team-a", "team-b", timeout=90)


@pytest.mark.slow
@needs_kubectl
def test_kubectl_creates_reads_and_deletes_secrets(cluster):
    """kubectl create secret docker-registry / generic against Shoal: stored and served as
    Kubernetes does (stringData in, base64 data out, TYPE and DATA columns), describe shows
    sizes only, a viewer is refused them, and no value reaches the server's log."""
    c = cluster
    kubectl(c, "create", "namespace", "sec")
    out = kubectl(c, "create", "secret", "docker-registry", "regcred", "-n", "sec", "--docker-server=r.example:5000",
                  "--docker-username=alice", "--docker-password=pw-0xDEADBEEF", "--docker-email=a@example.com")
    assert out.stdout.strip() == "secret/regcred created", out.stdout + out.stderr
    kubectl(c, "create", "secret", "generic", "hf", "-n", "sec", "--from-literal=token=hf_s3cr3t_value",
            "--from-literal=user=alice")
    rows = table(kubectl(c, "get", "secrets", "-n", "sec").stdout)
    assert rows[0] == ["NAME", "TYPE", "DATA", "AGE"]
    assert [r[:3] for r in rows[1:]] == [["hf", "Opaque", "2"], ["regcred", "kubernetes.io/dockerconfigjson", "1"]]
    got = json.loads(kubectl(c, "get", "secret", "regcred", "-n", "sec", "-o", "json").stdout)
    config = json.loads(base64.b64decode(got["data"][".dockerconfigjson"]))
    assert config["auths"]["r.example:5000"]["auth"] == base64.b64encode(b"alice:pw-0xDEADBEEF").decode()
    token = kubectl(c, "get", "secret", "hf", "-n", "sec", "-o", "jsonpath={.data.token}").stdout
    assert base64.b64decode(token) == b"hf_s3cr3t_value"
    described = kubectl(c, "describe", "secret", "hf", "-n", "sec").stdout
    assert "token:  15 bytes" in described and "hf_s3cr3t_value" not in described, described
    out = kubectl(c, "create", "secret", "generic", "hf", "-n", "sec", "--from-literal=token=x", check=False)
    assert out.returncode == 1 and 'secrets "hf" already exists' in out.stderr, out.stderr

    viewer = str(c.root / "carol.kubeconfig")
    c.run(["shoal", "kubeconfig", "--user", "carol", "-o", viewer])
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "carol-view", "namespace": "sec"}, "subjects": [{"kind": "User", "name": "carol"}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}}
    c.run(["kubectl", "apply", "-f", "-"], input=json.dumps(binding))
    out = kubectl(c, "get", "secret", "hf", "-n", "sec", kubeconfig=viewer, check=False)
    assert out.returncode == 1 and 'cannot get resource "secrets"' in out.stderr, out.stderr
    assert "hf" not in kubectl(c, "get", "secrets", "-n", "sec", kubeconfig=viewer).stdout
    kubectl(c, "delete", "secret", "hf", "-n", "sec")
    assert [r[0] for r in table(kubectl(c, "get", "secrets", "-n", "sec").stdout)[1:]] == ["regcred"]
    logs = "".join(p.read_text(errors="replace") for p in c.root.rglob("*.log"))
    assert "pw-0xDEADBEEF" not in logs and "hf_s3cr3t_value" not in logs
    kubectl(c, "delete", "ns", "sec", timeout=90)


@pytest.mark.slow
def test_python_client_watches_pods_across_a_rollout(cluster):
    """The official client lists pods, then watches from the list's resourceVersion while a
    Deployment rolls to a new image: each pod is ADDED first, DELETED last, in order."""
    from kubernetes import client, config, watch

    config.load_kube_config(cluster.kubeconfig)
    core, apps = client.CoreV1Api(), client.AppsV1Api()
    listed = core.list_namespaced_pod("default", label_selector="app=watched")
    assert listed.items == []
    seen: list[tuple[str, str, int]] = []
    w = watch.Watch()

    def follow():
        for ev in w.stream(core.list_namespaced_pod, "default", label_selector="app=watched",
                           resource_version=listed.metadata.resource_version, timeout_seconds=120):
            seen.append((ev["type"], ev["object"].metadata.name, int(ev["object"].metadata.resource_version)))
            if [t for t, _, _ in seen].count("DELETED") == 2:  # both pods gone: the story is over
                w.stop()

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    container = client.V1Container(name="server", image="vllm/vllm-openai:v1", args=["--port", "8200"],
                                   ports=[client.V1ContainerPort(container_port=8200)])
    body = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="watched"),
        spec=client.V1DeploymentSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels={"app": "watched"}),
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels={"app": "watched"}),
                                              spec=client.V1PodSpec(containers=[container], tolerations=[
                                                  client.V1Toleration(key="nvidia.com/gpu", operator="Exists",
                                                                      effect="NoSchedule")]))))
    apps.create_namespaced_deployment("default", body)

    def rolled(image):
        d = apps.read_namespaced_deployment("watched", "default")
        return (d.status.updated_replicas == 1 and d.status.available_replicas == 1 and d.status.replicas == 1
                and d.status.observed_generation == d.metadata.generation
                and d.spec.template.spec.containers[0].image == image)

    wait_until(lambda: rolled("vllm/vllm-openai:v1"), 60, "the first pod to be available")
    apps.patch_namespaced_deployment("watched", "default",
                                     {"spec": {"template": {"spec": {"containers": [
                                         {"name": "server", "image": "vllm/vllm-openai:v2"}]}}}})
    wait_until(lambda: rolled("vllm/vllm-openai:v2"), 60, "the rollout")
    wait_until(lambda: len(core.list_namespaced_pod("default", label_selector="app=watched").items) == 1, 60,
               "the old pod to go")
    wait_until(lambda: sum(1 for t, _, _ in seen if t == "DELETED") == 1, 10, "the old pod's DELETED event")
    apps.delete_namespaced_deployment("watched", "default")
    wait_until(lambda: sum(1 for t, _, _ in seen if t == "DELETED") == 2, 60, "the new pod's DELETED event")
    watcher.join(10)

    versions = [rv for _, _, rv in seen]
    assert versions == sorted(versions)
    names = list(dict.fromkeys(name for _, name, _ in seen))
    assert len(names) == 2
    old, new = ([t for t, n, _ in seen if n == name] for name in names)
    assert old[0] == "ADDED" and old[-1] == "DELETED" and "MODIFIED" in old  # Running, then Terminating
    assert new[0] == "ADDED" and new[-1] == "DELETED" and new.count("DELETED") == 1
    first_new = next(i for i, (t, n, _) in enumerate(seen) if n == names[1])
    old_gone = next(i for i, (t, n, _) in enumerate(seen) if n == names[0] and t == "DELETED")
    assert first_new < old_gone  # surge: the new pod comes before the old one goes


@pytest.mark.slow
@needs_kubectl
def test_indexed_job_retries_a_failed_index_and_completes(cluster):
    """A batch/v1 Indexed Job of 4 pods, backoffLimit 2, whose index 2 fails once: retried,
    every index done, and kubectl wait --for=condition=complete returns."""
    c = cluster
    marker = c.root / "index-2-failed-once"
    script = (f'if [ "$JOB_COMPLETION_INDEX" = 2 ] && [ ! -e {marker} ]; then touch {marker}; exit 1; fi; '
              'echo shard $JOB_COMPLETION_INDEX done')
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "finetune"},
           "spec": {"completions": 4, "parallelism": 4, "completionMode": "Indexed", "backoffLimit": 2,
                    "template": {"spec": {
                        "restartPolicy": "Never",
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [{"name": "train", "image": "busybox", "command": ["sh", "-c", script],
                                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    path = c.root / "job.json"
    path.write_text(json.dumps(job))
    assert kubectl(c, "apply", "-f", str(path)).stdout.strip() == "job.batch/finetune created"
    out = kubectl(c, "wait", "--for=condition=complete", "job/finetune", "--timeout=60s", timeout=70)
    assert out.stdout.strip() == "job.batch/finetune condition met"

    jobs = table(kubectl(c, "get", "jobs").stdout)
    assert jobs[0] == ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]
    assert jobs[1][:3] == ["finetune", "Complete", "4/4"]
    status = json.loads(kubectl(c, "get", "job", "finetune", "-o", "json").stdout)["status"]
    assert (status["succeeded"], status["failed"], status["completedIndexes"]) == (4, 1, "0-3")
    assert [x["type"] for x in status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    pods = table(kubectl(c, "get", "pods", "-l", "job-name=finetune").stdout)[1:]
    statuses = sorted((row[0].rsplit("-", 1)[0], row[2]) for row in pods)
    assert statuses == sorted([("finetune-0", "Completed"), ("finetune-1", "Completed"), ("finetune-2", "Error"),
                               ("finetune-2", "Completed"), ("finetune-3", "Completed")])
    kubectl(c, "delete", "job", "finetune", timeout=90)
    wait_until(lambda: "No resources found" in kubectl(c, "get", "pods", "-l", "job-name=finetune").stderr, 30,
               "the Job's pods to go with it")


@pytest.mark.slow
@needs_kubectl
def test_job_failure_policy_suspend_and_ttl_as_kubernetes_runs_them(cluster):
    """podFailurePolicy FailJob on an exit code ends the Job at the first such failure (no
    retry, however large backoffLimit); backoffLimitPerIndex gives up on one index only; a suspended Job runs nothing until resumed by a
    patch; ttlSecondsAfterFinished deletes a finished Job and its pods."""
    c = cluster

    def job(name: str, command: str, **spec) -> str:
        doc = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
               "spec": {**spec, "template": {"spec": {
                   "restartPolicy": "Never",
                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                   "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", command],
                                   "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}]}}}}
        path = c.root / f"{name}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    fatal = job("fatal", "exit 42", backoffLimit=6, podFailurePolicy={"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}}]})
    kubectl(c, "apply", "-f", fatal)
    out = kubectl(c, "wait", "--for=condition=failed", "job/fatal", "--timeout=60s", timeout=70)
    assert out.stdout.strip() == "job.batch/fatal condition met"
    failed = next(x for x in json.loads(kubectl(c, "get", "job", "fatal", "-o", "json").stdout)["status"]["conditions"]
                  if x["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"].startswith("Container main for pod default/fatal-") and \
        failed["message"].endswith("failed with exit code 42 matching FailJob rule at index 0")
    assert len(table(kubectl(c, "get", "pods", "-l", "job-name=fatal").stdout)) == 2  # the header and one pod

    # backoffLimitPerIndex 0: index 1 fails once and is given up on; the others still run, then the Job fails.
    per_index = job("per-index", '[ "$JOB_COMPLETION_INDEX" != 1 ] || exit 3', completions=3, parallelism=3,
                    completionMode="Indexed", backoffLimitPerIndex=0)
    kubectl(c, "apply", "-f", per_index)
    kubectl(c, "wait", "--for=condition=failed", "job/per-index", "--timeout=60s", timeout=70)
    status = json.loads(kubectl(c, "get", "job", "per-index", "-o", "json").stdout)["status"]
    failed = next(x for x in status["conditions"] if x["type"] == "Failed")
    assert (failed["reason"], status["failedIndexes"], status["completedIndexes"], status["failed"]) == \
        ("FailedIndexes", "1", "0,2", 1), status
    kubectl(c, "delete", "job", "per-index", timeout=90)

    paused = job("paused", "echo resumed", suspend=True, ttlSecondsAfterFinished=2)
    kubectl(c, "apply", "-f", paused)
    wait_until(lambda: any(x["type"] == "Suspended" and x["status"] == "True" for x in json.loads(
        kubectl(c, "get", "job", "paused", "-o", "json").stdout)["status"].get("conditions", ())), 30,
               "the Job suspended")
    assert "No resources found" in kubectl(c, "get", "pods", "-l", "job-name=paused").stderr
    kubectl(c, "patch", "job", "paused", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    kubectl(c, "wait", "--for=condition=complete", "job/paused", "--timeout=60s", timeout=70)
    wait_until(lambda: kubectl(c, "get", "job", "paused", check=False).returncode != 0, 30,
               "the finished Job deleted after its ttlSecondsAfterFinished")
    assert 'jobs.batch "paused" not found' in kubectl(c, "get", "job", "paused", check=False).stderr
    kubectl(c, "delete", "job", "fatal", timeout=90)


@pytest.mark.slow
@needs_kubectl
def test_a_queued_job_is_admitted_whole_or_not_at_all(cluster):
    """A Job labelled for a Kueue queue: its 3 pods of 4 GPUs start together or not at all.
    With 8 of the 16 GPUs held by a Slurm job none starts (two would fit); once it ends, all do."""
    c = cluster
    blocker = c.sbatch("--gpus-per-node=8", "--wrap", "sleep 300")
    wait_until(lambda: c.run(["squeue", "-h", "-j", str(blocker), "-o", "%T"]).stdout.strip() == "RUNNING", 30,
               "the Slurm job holding 8 GPUs")
    doc = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "gang", "labels": {"kueue.x-k8s.io/queue-name": "training"}},
           "spec": {"completions": 3, "parallelism": 3, "template": {"spec": {
               "restartPolicy": "Never",
               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 1"],
                               "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}}}
    path = c.root / "gang.json"
    path.write_text(json.dumps(doc))
    kubectl(c, "apply", "-f", str(path))

    def phases() -> list[str]:
        pods = json.loads(kubectl(c, "get", "pods", "-l", "job-name=gang", "-o", "json").stdout)["items"]
        return sorted(p["status"].get("phase", "") for p in pods)

    wait_until(lambda: len(phases()) == 3, 30, "the Job's three pods")
    time.sleep(3)  # several scheduling passes
    assert phases() == ["Pending"] * 3
    c.run(["scancel", str(blocker)])
    kubectl(c, "wait", "--for=condition=complete", "job/gang", "--timeout=60s", timeout=70)
    kubectl(c, "delete", "job", "gang", timeout=90)
