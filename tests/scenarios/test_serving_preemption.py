"""Serving and training on one full pool: a high-priority serving Deployment preempts a
preemptible training gang instead of waiting, the training job checkpoints on its signal, is
requeued, and resumes when serving scales down. Real server, agents and model server.

The administrator's configuration: a QOS named like the serving PriorityClass may preempt
the scavenger QOS (a pod's QOS is the QOS named like its PriorityClass, docs/SERVING.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.cluster import LocalCluster, wait_until
from tests.scenarios.test_preemption import TRAINER, qos_cluster

ROOT = Path(__file__).resolve().parents[2]
MODEL_SERVER = ROOT / "examples" / "serving" / "model_server.py"

QOS = [
    {"name": "normal"},
    {"name": "scavenger", "preempt_mode": "requeue"},
    {"name": "serving-critical", "priority": 1000, "preempt": ["scavenger"]},
]


def manifests(replicas: int) -> str:
    docs = [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
         "metadata": {"name": "serving-critical"}, "value": 1000000,
         "description": "online inference: may preempt scavenger training"},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "chat"},
         "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "chat"}},
                  "template": {"metadata": {"labels": {"app": "chat"}},
                               "spec": {"priorityClassName": "serving-critical",
                                        "terminationGracePeriodSeconds": 2,
                                        "containers": [{
                                            "name": "server", "image": "shoal/markov:1",
                                            "command": ["python3", str(MODEL_SERVER)],
                                            "ports": [{"containerPort": 8000}],
                                            "resources": {"limits": {"nvidia.com/gpu": 4}},
                                            "readinessProbe": {"httpGet": {"path": "/health", "port": 8000},
                                                               "periodSeconds": 1}}]}}}},
    ]
    return "\n---\n".join(json.dumps(d) for d in docs)


@pytest.fixture
def cluster(tmp_path):
    c = qos_cluster(tmp_path, QOS, "mixed")
    yield c
    c.down()


def chat_pods(c: LocalCluster) -> list[dict]:
    items = json.loads(c.run(["shoal", "get", "pods", "-o", "json"]).stdout)["items"]
    return [p for p in items if p["metadata"]["labels"].get("app") == "chat"]


def ready(pod: dict) -> bool:
    return any(k["type"] == "Ready" and k["status"] == "True" for k in pod["status"].get("conditions", []))


def test_serving_preempts_scavenger_training_which_checkpoints_and_resumes_after_scale_down(cluster):
    # Training fills the whole pool: a 2-node gang of 4 GPUs each, preemptible, checkpointing on USR1.
    victim = cluster.sbatch("--qos=scavenger", "--requeue", "--signal=B:USR1@3", "--nodes=2",
                            "--gpus-per-node=4", script=TRAINER)
    cluster.wait_for(victim, states=("RUNNING",), timeout=20)
    assert sum(n["gpus_alloc"] for n in cluster.nodes_json()) == 8

    cluster.run(["shoal", "apply", "-f", "-"], input=manifests(1))
    pod = wait_until(lambda: next((p for p in chat_pods(cluster) if ready(p)), None), 40,
                     "the serving pod ready on the preempted GPUs")
    # It preempted the gang instead of waiting: the gang got its 3 s checkpoint grace first.
    marker = cluster.workdir / f"ckpt-{victim}"
    assert marker.exists(), "the training job never got its checkpoint signal"
    requeued = cluster.job(victim)
    assert (requeued["state"], requeued["restart_count"]) == ("PENDING", 1), requeued
    assert requeued["reason"] in ("Resources", "Priority"), requeued
    pod_job = next(j for j in cluster.jobs() if j["name"] == pod["metadata"]["name"])
    assert float(marker.read_text()) < pod_job["start_time"], "the pod started before the checkpoint"
    assert pod_job["start_time"] - pod_job["submit_time"] <= 3 + 2 + 4, pod_job  # grace + KillWait + passes
    # squeue shows serving and (waiting) training on the same pool. The requeued job shows
    # COMPLETING (CG), as in Slurm, until its other node has cleaned up; then PENDING.
    def pending_in_squeue() -> str | None:
        table = cluster.run(["squeue", "-h", "-o", "%i %T"]).stdout
        return table if f"{victim} PENDING" in table else None
    table = wait_until(pending_in_squeue, 10, "the requeued job cleaned up and PENDING in squeue")
    assert f"{pod_job['job_id']} RUNNING" in table, table

    # Serving scales down: the GPUs come back and the training job resumes from its checkpoint.
    cluster.run(["shoal", "scale", "deployment/chat", "--replicas=0"])
    done = cluster.wait_for(victim, states=("COMPLETED",), timeout=40)
    assert done["restart_count"] == 1
    out = (cluster.workdir / f"slurm-{victim}.out").read_text()  # truncated at the requeue, as Slurm does
    assert "run 1" in out and "resumed from" in out, out
    assert wait_until(lambda: not chat_pods(cluster), 20, "the serving pod gone")
