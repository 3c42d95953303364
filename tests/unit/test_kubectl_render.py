"""The kubectl-style commands print what kubectl 1.30 prints.

Rendering is pure (``shoal.kube.fmt``): these tests build Kubernetes-shaped object
dicts, as the server's ``/shoal/v1/kube`` answers them, and compare the text with kubectl's.
A few tests at the end drive ``shoal get``/``apply``/``logs`` against a small stand-in
HTTP server, to check the wiring: paths, bodies, and how errors reach the user.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from shoal.cli import kubectl, kubedescribe as kd
from shoal.kube import fmt as kf
from shoal.api_client import Client, ClientError

NOW = 1_790_000_000.0


def ts(ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW - ago))


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def pod(name="vllm-0", phase="Running", statuses=None, age=300, containers=("vllm",), **extra) -> dict:
    p = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "creationTimestamp": ts(age), "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": c, "image": "vllm/vllm-openai:v0.6.3"} for c in containers]},
        "status": {"phase": phase, "containerStatuses": statuses or []},
    }
    for k, v in extra.items():
        p[k].update(v) if isinstance(v, dict) and k in p else p.__setitem__(k, v)
    return p


def running(name="vllm", ready=True, restarts=0, last_finished=None) -> dict:
    cs = {"name": name, "ready": ready, "restartCount": restarts, "state": {"running": {"startedAt": ts(60)}}}
    if last_finished is not None:
        cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ts(last_finished)}}
    return cs


def waiting(reason, restarts=0, name="vllm") -> dict:
    return {"name": name, "ready": False, "restartCount": restarts, "state": {"waiting": {"reason": reason}}}


def terminated(reason, exit_code=0, name="vllm") -> dict:
    return {"name": name, "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": ts(10)}}}


# ---------------------------------------------------------------- AGE


@pytest.mark.parametrize("seconds, text", [
    # apimachinery's own HumanDuration table
    (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * 3600, "47h"), (49 * 3600, "2d1h"),
    ((8 * 24 + 2) * 3600, "8d"), (367 * 24 * 3600, "367d"), ((365 * 2 * 24 + 25) * 3600, "2y1d"),
    ((365 * 8 * 24 + 2) * 3600, "8y"),
    # the edges between the forms
    (0, "0s"), (-1, "0s"), (-2, "<invalid>"), (119, "119s"), (120, "2m"), (599, "9m59s"), (600, "10m"),
    (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (4 * 3600 + 60, "4h1m"), (8 * 3600, "8h"), (48 * 3600, "2d"),
    (2 * 365 * 24 * 3600, "2y"), (0.9, "0s"), (59.99, "59s"),
])  # fmt: skip
def test_age_is_kubectls_human_duration(seconds, text):
    assert kf.human_duration(seconds) == text


def test_age_of_a_timestamp():
    assert kf.age(ts(182), NOW) == "3m2s"
    assert kf.age(None, NOW) == "<unknown>"
    assert kf.age(NOW - 5, NOW) == "5s"  # epoch seconds too
    assert kf.age("2026-12-02T19:00:00+01:00", kf.parse_time("2026-12-02T18:00:05Z")) == "5s"


def test_go_durations_for_timeout():
    assert kf.parse_go_duration("5m") == 300
    assert kf.parse_go_duration("1h30m") == 5400
    assert kf.parse_go_duration("1.5s") == 1.5
    assert kf.parse_go_duration("300ms") == pytest.approx(0.3)
    assert kf.parse_go_duration("0") == 0
    for bad in ("5", "abc", "5x", ""):
        with pytest.raises(ValueError):
            kf.parse_go_duration(bad)


# ---------------------------------------------------------------- pods


@pytest.mark.parametrize("p, ready, status, restarts", [
    (pod(statuses=[running()]), "1/1", "Running", "0"),
    (pod(statuses=[running(restarts=3, last_finished=25)]), "1/1", "Running", "3 (25s ago)"),
    (pod(statuses=[waiting("CrashLoopBackOff", restarts=5)]), "0/1", "CrashLoopBackOff", "5"),
    (pod(phase="Pending", statuses=[waiting("ErrImagePull")]), "0/1", "ErrImagePull", "0"),
    (pod(phase="Pending", statuses=[waiting("ContainerCreating")]), "0/1", "ContainerCreating", "0"),
    (pod(phase="Pending"), "0/1", "Pending", "0"),
    (pod(phase="Succeeded", statuses=[terminated("Completed")]), "0/1", "Completed", "0"),
    (pod(phase="Failed", statuses=[terminated("Error", 1)]), "0/1", "Error", "0"),
    (pod(phase="Failed", statuses=[terminated("OOMKilled", 137)]), "0/1", "OOMKilled", "0"),
    (pod(phase="Failed", statuses=[terminated("", 3)]), "0/1", "ExitCode:3", "0"),
    (pod(statuses=[running(ready=False)]), "0/1", "Running", "0"),
    (pod(statuses=[running()], metadata={"deletionTimestamp": ts(3)}), "1/1", "Terminating", "0"),
    (pod(phase="Succeeded", statuses=[terminated("Completed")], metadata={"deletionTimestamp": ts(3)}),
     "0/1", "Completed", "0"),
    (pod(containers=("a", "b"), statuses=[running("a"), waiting("CrashLoopBackOff", 2, "b")]),
     "1/2", "CrashLoopBackOff", "2"),
])  # fmt: skip
def test_pod_columns_as_kubectl_computes_them(p, ready, status, restarts):
    assert kf.pod_status(p, NOW) == (ready, status, restarts)


def test_pod_waiting_for_init_containers():
    p = pod(phase="Pending", statuses=[waiting("PodInitializing")])
    p["spec"]["initContainers"] = [{"name": "fetch-weights"}]
    p["status"]["initContainerStatuses"] = [{"name": "fetch-weights", "state": {"running": {}}, "restartCount": 0}]
    assert kf.pod_status(p, NOW)[1] == "Init:0/1"
    p["status"]["initContainerStatuses"][0]["state"] = {"terminated": {"exitCode": 2}}
    assert kf.pod_status(p, NOW)[1] == "Init:ExitCode:2"


def test_pods_table_is_aligned_as_kubectl_aligns_it():
    pods = [pod("vllm-llama-70b-7d4b9c-x2k9q", statuses=[running(restarts=3, last_finished=25)]),
            pod("crash", statuses=[waiting("CrashLoopBackOff", restarts=5)], age=4000)]
    assert kf.render_table(kf.BY_PLURAL["pods"], pods, NOW) == (
        "NAME                          READY   STATUS             RESTARTS      AGE\n"
        "vllm-llama-70b-7d4b9c-x2k9q   1/1     Running            3 (25s ago)   5m\n"
        "crash                         0/1     CrashLoopBackOff   5             66m\n"
    )


def test_pods_wide_and_all_namespaces():
    p = pod(statuses=[running()], spec={"nodeName": "node1"}, status={"podIP": "127.0.1.2"})
    out = kf.render_table(kf.BY_PLURAL["pods"], [p], NOW, wide=True, with_namespace=True)
    assert out.splitlines() == [
        "NAMESPACE   NAME     READY   STATUS    RESTARTS   AGE   IP          NODE    NOMINATED NODE   READINESS GATES",
        "default     vllm-0   1/1     Running   0          5m    127.0.1.2   node1   <none>           <none>",
    ]


def test_short_columns_are_six_wide():
    # tabwriter's minwidth 6: a column of short cells still takes six characters
    assert kf.table([["A", "B"], ["x", "y"]]) == "A     B\nx     y\n"


def test_tabwriter_blocks_are_runs_of_lines_with_the_cell():
    # Go's Example_elastic, left-aligned: the b's and the d's are in different columns
    text = "a\tb\tc\naa\tbb\tcc\naaa\t\naaaa\tdddd\teeee\n"
    assert kf.tabwrite(text, 0, 1) == "a    b  c\naa   bb cc\naaa  \naaaa dddd eeee\n"


# ---------------------------------------------------------------- other kinds


def deployment(replicas=4, status=None, **meta) -> dict:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm-llama-70b", "namespace": "default", "uid": "d-1", "generation": 2,
                     "creationTimestamp": ts(4 * 3600), "annotations": {"deployment.kubernetes.io/revision": "2"},
                     **meta},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "vllm"}},
                 "template": {"metadata": {"labels": {"app": "vllm"}},
                              "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                                                       "args": ["--model", "meta-llama/Llama-3-70B"],
                                                       "ports": [{"containerPort": 8000}],
                                                       "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}},
        "status": {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 4, "readyReplicas": 3,
                   "availableReplicas": 3, "unavailableReplicas": 1, **(status or {})},
    }


def test_deployments_and_replicasets():
    d = deployment()
    assert kf.render_table(kf.BY_PLURAL["deployments"], [d], NOW).splitlines() == [
        "NAME             READY   UP-TO-DATE   AVAILABLE   AGE",
        "vllm-llama-70b   3/4     4            3           4h",
    ]
    wide = kf.render_table(kf.BY_PLURAL["deployments"], [d], NOW, wide=True).splitlines()
    assert wide[0].split() == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    assert wide[1].split()[-3:] == ["vllm", "vllm/vllm-openai:v0.6.3", "app=vllm"]
    rs = {"kind": "ReplicaSet", "metadata": {"name": "vllm-llama-70b-7d4b9c", "creationTimestamp": ts(30)},
          "spec": {"replicas": 4}, "status": {"replicas": 4, "readyReplicas": 2}}
    assert kf.render_table(kf.BY_PLURAL["replicasets"], [rs], NOW).splitlines() == [
        "NAME                    DESIRED   CURRENT   READY   AGE",
        "vllm-llama-70b-7d4b9c   4         4         2       30s",
    ]


def service(ports, kind="ClusterIP", **spec) -> dict:
    return {"kind": "Service", "metadata": {"name": "llm", "namespace": "default", "creationTimestamp": ts(90)},
            "spec": {"type": kind, "ports": ports, "selector": {"app": "vllm"}, **spec}}


@pytest.mark.parametrize("svc, cluster_ip, external, ports", [
    (service([{"port": 80, "targetPort": 8000}]), "<none>", "<none>", "80/TCP"),
    (service([{"port": 80, "nodePort": 30080, "protocol": "TCP"}], "NodePort", clusterIP="10.96.0.12"),
     "10.96.0.12", "<none>", "80:30080/TCP"),
    (service([{"port": 80}, {"port": 9090, "protocol": "UDP"}]), "<none>", "<none>", "80/TCP,9090/UDP"),
    (service([{"port": 443}], "LoadBalancer"), "<none>", "<pending>", "443/TCP"),
    (service([], externalIPs=["1.2.3.4"]), "<none>", "1.2.3.4", "<none>"),
])  # fmt: skip
def test_services_ports_column(svc, cluster_ip, external, ports):
    row = kf.table_row(kf.BY_PLURAL["services"], svc, NOW)
    assert row == ["llm", svc["spec"]["type"], cluster_ip, external, ports, "90s"]


def hpa(metrics, current=None) -> dict:
    return {"kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "llm", "namespace": "default", "creationTimestamp": ts(600)},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llama-70b"},
                     "minReplicas": 1, "maxReplicas": 8, "metrics": metrics},
            "status": {"currentReplicas": 2, "desiredReplicas": 2, "currentMetrics": current or []}}


CPU_50 = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}
RPS_10 = {"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                   "target": {"type": "AverageValue", "averageValue": "10"}}}


@pytest.mark.parametrize("h, targets", [
    (hpa([CPU_50], [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 45}}}]),
     "45%/50%"),
    (hpa([CPU_50]), "<unknown>/50%"),
    (hpa([RPS_10]), "<unknown>/10"),
    (hpa([RPS_10], [{"type": "Pods", "pods": {"current": {"averageValue": "12500m"}}}]), "12500m/10"),
    (hpa([RPS_10], [{"type": "Pods", "pods": {"current": {"averageValue": 7}}}]), "7/10"),
    (hpa([RPS_10], [{"type": "Pods", "pods": {"current": {"averageValue": 12.5}}}]), "12500m/10"),
    (hpa([CPU_50, RPS_10, RPS_10]), "<unknown>/50%, <unknown>/10 + 1 more..."),
    (hpa([]), "<none>"),
])  # fmt: skip
def test_hpa_targets(h, targets):
    assert kf.hpa_targets(h) == targets


def test_hpa_table():
    out = kf.render_table(kf.BY_PLURAL["horizontalpodautoscalers"], [hpa([CPU_50])], NOW)
    assert out.splitlines() == [
        "NAME   REFERENCE                   TARGETS         MINPODS   MAXPODS   REPLICAS   AGE",
        "llm    Deployment/vllm-llama-70b   <unknown>/50%   1         8         2          10m",
    ]


def test_namespaces_priorityclasses_events():
    ns = {"kind": "Namespace", "metadata": {"name": "serving", "creationTimestamp": ts(86400 * 3)},
          "status": {"phase": "Active"}}
    assert kf.table_row(kf.BY_PLURAL["namespaces"], ns, NOW) == ["serving", "Active", "3d"]
    pc = {"kind": "PriorityClass", "metadata": {"name": "serving-high", "creationTimestamp": ts(60)},
          "value": 1000000, "globalDefault": False}
    assert kf.table_header(kf.BY_PLURAL["priorityclasses"]) == [
        "NAME", "VALUE", "GLOBAL-DEFAULT", "AGE", "PREEMPTIONPOLICY"]
    assert kf.table_row(kf.BY_PLURAL["priorityclasses"], pc, NOW) == [
        "serving-high", "1000000", "false", "60s", "PreemptLowerPriority"]
    ev = {"kind": "Event", "metadata": {"name": "vllm-0.1a", "namespace": "default"},
          "involvedObject": {"kind": "Pod", "name": "vllm-0"}, "type": "Warning", "reason": "BackOff",
          "message": "Back-off restarting failed container vllm ", "count": 4,
          "firstTimestamp": ts(300), "lastTimestamp": ts(20)}
    assert kf.render_table(kf.BY_PLURAL["events"], [ev], NOW).splitlines() == [
        "LAST SEEN   TYPE      REASON    OBJECT       MESSAGE",
        "20s         Warning   BackOff   pod/vllm-0   Back-off restarting failed container vllm",
    ]


def test_several_kinds_name_their_kind():
    d = deployment()
    row = kf.table_row(kf.BY_PLURAL["deployments"], d, NOW, with_kind=True)
    assert row[0] == "deployment.apps/vllm-llama-70b"
    assert kf.qualified_name(hpa([])) == "horizontalpodautoscaler.autoscaling/llm"
    pc = {"kind": "PriorityClass", "metadata": {"name": "x"}}
    assert kf.qualified_name(pc) == "priorityclass.scheduling.k8s.io/x"
    assert kf.qualified_name({"kind": "Service", "metadata": {"name": "x"}}) == "service/x"


def test_nodes_from_the_shoal_api():
    n = kf.node_object({"name": "node1", "address": "127.0.0.2", "state": "DRAIN", "display_state": "drain",
                        "cpus": 128, "memory_mb": 2048, "gpus": [{"index": i, "uuid": f"GPU-{i}",
                                                                  "product": "NVIDIA A100"} for i in range(8)],
                        "gpus_alloc": 4, "labels": {"node-role.kubernetes.io/gpu": "", "nvidia.com/gpu.product":
                                                    "NVIDIA-A100-SXM4-80GB"},
                        "partitions": ["a100"], "registered_at": NOW - 5 * 3600, "last_heartbeat": NOW - 2,
                        "taints": [{"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}]}, "v0.1.0")
    assert kf.table_row(kf.BY_PLURAL["nodes"], n, NOW) == ["node1", "Ready,SchedulingDisabled", "gpu", "5h", "v0.1.0"]
    wide = kf.table_row(kf.BY_PLURAL["nodes"], n, NOW, wide=True)
    assert wide[5:] == ["127.0.0.2", "<none>", "4/8", "NVIDIA-A100-SXM4-80GB", "a100"]
    assert n["status"]["capacity"] == {"cpu": "128", "memory": "2097152Ki", "nvidia.com/gpu": "8", "pods": "110"}


# ---------------------------------------------------------------- kinds


@pytest.mark.parametrize("word, plural", [
    ("pods", "pods"), ("pod", "pods"), ("po", "pods"), ("Pod", "pods"), ("deployments", "deployments"),
    ("deployment", "deployments"), ("deploy", "deployments"), ("deployment.apps", "deployments"),
    ("deployments.apps", "deployments"), ("rs", "replicasets"), ("replicaset", "replicasets"),
    ("svc", "services"), ("services", "services"), ("hpa", "horizontalpodautoscalers"),
    ("horizontalpodautoscaler", "horizontalpodautoscalers"), ("ns", "namespaces"), ("namespace", "namespaces"),
    ("pc", "priorityclasses"), ("priorityclass", "priorityclasses"), ("ev", "events"), ("events", "events"),
    ("no", "nodes"), ("node", "nodes"), ("nodes", "nodes"),
])  # fmt: skip
def test_kind_aliases(word, plural):
    assert kf.resolve_kind(word).plural == plural


def test_kind_lists_and_all():
    assert [r.plural for r in kf.resolve_kinds("deploy,svc")] == ["deployments", "services"]
    assert [r.plural for r in kf.resolve_kinds("all")] == [
        "pods", "services", "deployments", "replicasets", "horizontalpodautoscalers"]
    with pytest.raises(kf.KindError, match='the server doesn\'t have a resource type "deploymentz"'):
        kf.resolve_kind("deploymentz")


def test_resource_arguments():
    targets = kubectl.parse_targets(["pod/a", "pod/b", "deploy/c"])
    assert [(r.plural, names) for r, names in targets] == [("pods", ["a", "b"]), ("deployments", ["c"])]
    assert [(r.plural, n) for r, n in kubectl.parse_targets(["deploy,svc", "x"])] == [
        ("deployments", ["x"]), ("services", ["x"])]
    with pytest.raises(kubectl.CommandError):
        kubectl.parse_targets([])


# ---------------------------------------------------------------- describe


def test_describe_pod_key_lines(utc):
    p = pod(statuses=[running(restarts=1, last_finished=100)],
            spec={"nodeName": "node1", "priority": 1000, "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {"nvidia.com/gpu.product": "A100"}},
            status={"podIP": "127.0.1.2", "hostIP": "127.0.0.2", "startTime": ts(290),
                    "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]})
    c = p["spec"]["containers"][0]
    c.update(ports=[{"containerPort": 8000}], args=["--model", "meta-llama/Llama-3-70B"],
             resources={"limits": {"nvidia.com/gpu": 4}, "requests": {"cpu": "8", "memory": "64Gi"}},
             readinessProbe={"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
             livenessProbe={"tcpSocket": {"port": 8000}, "initialDelaySeconds": 30})
    events = [{"type": "Normal", "reason": "Scheduled", "message": "Successfully assigned default/vllm-0 to node1",
               "firstTimestamp": ts(300), "lastTimestamp": ts(300), "count": 1,
               "source": {"component": "shoal-scheduler"}, "involvedObject": {"kind": "Pod", "name": "vllm-0"}},
              {"type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container",
               "firstTimestamp": ts(200), "lastTimestamp": ts(100), "count": 3, "source": {"component": "shoal-agent"},
               "involvedObject": {"kind": "Pod", "name": "vllm-0"}}]
    out = kd.describe_pod(p, events, NOW)
    lines = out.splitlines()
    assert lines[:6] == [
        "Name:         vllm-0",
        "Namespace:    default",
        "Priority:     1000",
        "Node:         node1/127.0.0.2",
        f"Start Time:   {kf.rfc1123z(ts(290))}",
        "Labels:       app=vllm",
    ]
    assert kf.rfc1123z(ts(290)).endswith(" +0000") and kf.rfc1123z(ts(290)).startswith(("Mon, ", "Tue, ", "Wed, ",
                                                                                          "Thu, ", "Fri, ", "Sat, ",
                                                                                          "Sun, "))
    for expected in [
        "Status:       Running", "IP:           127.0.1.2", "IPs:", "  IP:  127.0.1.2", "Containers:", "  vllm:",
        # "Args:" has no tab, so it ends the alignment block (kubectl's output has the same step)
        "    Image:         vllm/vllm-openai:v0.6.3", "    Port:          8000/TCP", "    Host Port:     0/TCP",
        "    Args:", "      --model", "      meta-llama/Llama-3-70B", "    State:          Running",
        "    Last State:     Terminated", "      Reason:       Error", "      Exit Code:    1",
        "    Ready:          True", "    Restart Count:  1", "    Limits:", "      nvidia.com/gpu:  4", "    Requests:",
        "      cpu:        8", "      memory:     64Gi",
        "    Liveness:     tcp-socket :8000 delay=30s timeout=1s period=10s #success=1 #failure=3",
        "    Readiness:    http-get http://:8000/health delay=0s timeout=1s period=5s #success=1 #failure=3",
        "Conditions:", "  Type           Status", "  Ready          True ", "QoS Class:       Burstable",
        "Node-Selectors:  nvidia.com/gpu.product=A100",
        "Tolerations:     nvidia.com/gpu:NoSchedule op=Exists",
        "Events:", "  Type     Reason     Age                   From             Message",
        "  ----     ------     ----                  ----             -------",
        "  Normal   Scheduled  5m                    shoal-scheduler  Successfully assigned default/vllm-0 to node1",
        "  Warning  BackOff    100s (x3 over 3m20s)  shoal-agent      Back-off restarting failed container",
    ]:
        assert expected in lines, expected


def test_describe_pod_terminating_and_no_events():
    p = pod(statuses=[running()], metadata={"deletionTimestamp": ts(4), "deletionGracePeriodSeconds": 30})
    out = kd.describe_pod(p, [], NOW)
    assert "Status:                    Terminating (lasts 4s)" in out
    assert "Termination Grace Period:  30s" in out
    assert out.endswith("Tolerations:        <none>\nEvents:             <none>\n")


def test_describe_deployment_key_lines():
    d = deployment(status={"conditions": [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]})
    tmpl = d["spec"]["template"]
    new_rs = {"kind": "ReplicaSet", "metadata": {"name": "vllm-llama-70b-7d4b9c", "creationTimestamp": ts(100),
                                                 "ownerReferences": [{"uid": "d-1", "controller": True}]},
              "spec": {"replicas": 4, "template": {**tmpl, "metadata": {"labels": {
                  "app": "vllm", "pod-template-hash": "7d4b9c"}}}}, "status": {"replicas": 4}}
    old_rs = {"kind": "ReplicaSet", "metadata": {"name": "vllm-llama-70b-5f6a7b", "creationTimestamp": ts(5000),
                                                 "ownerReferences": [{"uid": "d-1", "controller": True}]},
              "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "vllm", "image": "old"}]}}},
              "status": {"replicas": 1}}
    other = {"kind": "ReplicaSet", "metadata": {"name": "other", "ownerReferences": [{"uid": "d-2"}]},
             "spec": {"replicas": 3}}
    out = kd.describe_deployment(d, [new_rs, old_rs, other], None, NOW)
    lines = out.splitlines()
    for expected in [
        "Name:                   vllm-llama-70b",
        "Selector:               app=vllm",
        "Replicas:               4 desired | 4 updated | 4 total | 3 available | 1 unavailable",
        "StrategyType:           RollingUpdate",
        "MinReadySeconds:        0",
        "RollingUpdateStrategy:  25% max unavailable, 25% max surge",
        "Pod Template:", "  Labels:  app=vllm", "  Containers:", "   vllm:",
        "  Type           Status  Reason",
        "  Available      True    MinimumReplicasAvailable",
        "  Progressing    True    NewReplicaSetAvailable",
        "OldReplicaSets:  vllm-llama-70b-5f6a7b (1/1 replicas created)",
        "NewReplicaSet:   vllm-llama-70b-7d4b9c (4/4 replicas created)",
    ]:
        assert expected in lines, expected
    assert "Events" not in out  # not fetched: no section, as kubectl with --show-events=false
    d["spec"]["strategy"] = {"type": "Recreate"}
    assert "RollingUpdateStrategy" not in kd.describe_deployment(d, [], [], NOW)


def test_describe_service_lists_ready_endpoints():
    svc = service([{"name": "http", "port": 80, "targetPort": "http"}])
    ready = {"type": "Ready", "status": "True"}
    pods = [pod(f"vllm-{i}", status={"podIP": f"127.0.1.{i}", "conditions": [ready]},
                spec={"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]})
            for i in range(2, 7)]
    pods[0]["status"]["conditions"] = []  # not ready: left out
    out = kd.describe_service(svc, pods, [], NOW).splitlines()
    assert "Port:              http  80/TCP" in out
    assert "TargetPort:        http/TCP" in out
    assert "Endpoints:         127.0.1.3:8000,127.0.1.4:8000,127.0.1.5:8000 + 1 more..." in out
    assert "Session Affinity:  None" in out


def test_describe_hpa_metrics():
    h = hpa([CPU_50, RPS_10], [{"type": "Resource", "resource": {"name": "cpu", "current": {
        "averageUtilization": 45, "averageValue": "450m"}}}])
    h["status"]["conditions"] = [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
                                  "message": "recommended size matches current size"}]
    lines = kd.describe_hpa(h, [], NOW).splitlines()
    assert "Reference:                                             Deployment/vllm-llama-70b" in lines
    assert "  resource cpu on pods  (as a percentage of request):  45% (450m) / 50%" in lines
    assert '  "requests_per_second" on pods:                       <unknown> / 10' in lines
    assert "Min replicas:                                          1" in lines
    assert "Deployment pods:                                       2 current / 2 desired" in lines
    assert "  AbleToScale  True    ReadyForNewScale  recommended size matches current size" in lines


def test_describe_node_taints_and_gpus(utc):
    n = kf.node_object({"name": "node1", "address": "127.0.0.2", "state": "UP", "cpus": 16, "memory_mb": 65536,
                        "gpus": [{"index": 0, "uuid": "GPU-0", "product": "NVIDIA H100"}],
                        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                                   {"key": "dedicated", "effect": "NoExecute"}],
                        "registered_at": NOW - 60, "last_heartbeat": NOW - 1}, "v0.1.0")
    p = pod(statuses=[running()], spec={"nodeName": "node1", "containers": [
        {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}}}]})
    lines = kd.describe_node(n, [p], [], NOW).splitlines()
    assert "Taints:             dedicated:NoExecute" in lines
    assert "                    nvidia.com/gpu=present:NoSchedule" in lines
    assert "Unschedulable:      false" in lines
    assert "  nvidia.com/gpu:  1" in lines
    assert "  memory:          67108864Ki" in lines
    assert "  default             vllm-0    4 (25%)       4 (25%)     16Gi (25%)       16Gi (25%)     5m" in lines
    assert "  cpu             4 (25%)     4 (25%)" in lines
    assert "  nvidia.com/gpu  1           1" in lines


def test_rollout_history_table():
    out = kf.history_table("deployment.apps/vllm", [{"revision": 2, "change_cause": "image v0.6.3"},
                                                    {"revision": 1, "change_cause": None}])
    assert out == "deployment.apps/vllm \nREVISION  CHANGE-CAUSE\n1         <none>\n2         image v0.6.3\n\n"


# ---------------------------------------------------------------- taints and labels


def test_taint_specs():
    add, remove = kf.parse_taints(["nvidia.com/gpu=present:NoSchedule", "dedicated:NoExecute", "old:NoSchedule-",
                                   "gone-"])
    assert add == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                   {"key": "dedicated", "value": "", "effect": "NoExecute"}]
    assert remove == [{"key": "old", "value": "", "effect": "NoSchedule"}, {"key": "gone", "value": "", "effect": ""}]


@pytest.mark.parametrize("specs, message", [
    (["key=value"], "invalid taint spec: key=value"),
    (["key"], "invalid taint spec: key"),
    (["key:Sometimes"], "invalid taint effect: Sometimes, unsupported taint effect"),
    (["a=b=c:NoSchedule"], "invalid taint spec: a=b=c:NoSchedule"),
    (["a:b:NoSchedule"], "invalid taint spec: a:b:NoSchedule"),
    (["-bad:NoSchedule"], "invalid taint spec: -bad:NoSchedule, name part must consist of"),
    (["k:NoSchedule", "k=v:NoSchedule"], "duplicated taints with the same key and effect"),
    (["k:NoSchedule", "k-"], 'can not both modify and remove the following taint(s) in the same command: {"k":""}'),
    ([], "at least one taint update is required"),
])  # fmt: skip
def test_bad_taint_specs(specs, message):
    with pytest.raises(kf.TaintError) as e:
        kf.parse_taints(specs)
    assert str(e.value).startswith(message)


def test_taint_merge_as_kubectl():
    gpu = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}
    add, remove = kf.parse_taints(["nvidia.com/gpu:NoSchedule"])
    assert kf.apply_taints("node1", [], add, remove, False) == ("tainted", [gpu])
    with pytest.raises(kf.TaintError, match="^node node1 already has nvidia.com/gpu taint\\(s\\) with same "
                                            "effect\\(s\\) and --overwrite is false$"):
        kf.apply_taints("node1", [gpu], add, remove, False)
    add, remove = kf.parse_taints(["nvidia.com/gpu=yes:NoSchedule"])
    assert kf.apply_taints("node1", [gpu], add, remove, True) == ("modified", [{**gpu, "value": "yes"}])
    other = {"key": "dedicated", "value": "llm", "effect": "NoExecute"}
    add, remove = kf.parse_taints(["nvidia.com/gpu-"])
    assert kf.apply_taints("node1", [gpu, other], add, remove, False) == ("untainted", [other])
    with pytest.raises(kf.TaintError, match='^taint "nope:NoSchedule" not found$'):
        kf.apply_taints("node1", [gpu], *kf.parse_taints(["nope:NoSchedule-"]), False)


def test_label_specs():
    assert kf.parse_label_changes(["tier=gpu", "old-"]) == ({"tier": "gpu"}, ["old"])
    for bad in ("=x", "a b=c", "plain"):
        with pytest.raises(kf.TaintError, match="invalid label spec"):
            kf.parse_label_changes([bad])


# ---------------------------------------------------------------- rollout status


def test_rollout_status_lines_in_order():
    unobserved = deployment()
    unobserved["metadata"]["generation"] = 3  # the spec changed; the controller has not seen it yet
    states = [
        unobserved,
        deployment(status={"observedGeneration": 2, "updatedReplicas": 1, "replicas": 5, "availableReplicas": 4}),
        deployment(status={"updatedReplicas": 1, "replicas": 5, "availableReplicas": 4}),  # the same line again
        deployment(status={"updatedReplicas": 4, "replicas": 5, "availableReplicas": 3}),
        deployment(status={"updatedReplicas": 4, "replicas": 4, "availableReplicas": 2}),
        deployment(status={"updatedReplicas": 4, "replicas": 4, "availableReplicas": 4}),
        deployment(status={"updatedReplicas": 4, "replicas": 4, "availableReplicas": 4}),
    ]
    assert kf.rollout_lines(states) == [
        "Waiting for deployment spec update to be observed...",
        'Waiting for deployment "vllm-llama-70b" rollout to finish: 1 out of 4 new replicas have been updated...',
        'Waiting for deployment "vllm-llama-70b" rollout to finish: 1 old replicas are pending termination...',
        'Waiting for deployment "vllm-llama-70b" rollout to finish: 2 of 4 updated replicas are available...',
        'deployment "vllm-llama-70b" successfully rolled out',
    ]


def test_rollout_status_failures():
    stuck = deployment(status={"updatedReplicas": 2, "conditions": [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]})
    with pytest.raises(kf.RolloutError, match='^deployment "vllm-llama-70b" exceeded its progress deadline$'):
        kf.rollout_status(stuck)
    with pytest.raises(kf.RolloutError, match=r"desired revision \(3\) is different from the running revision \(2\)"):
        kf.rollout_status(deployment(), revision=3)


def test_rollout_watch_polls_until_done_or_timeout():
    states = iter([deployment(status={"updatedReplicas": 2}), deployment(status={"updatedReplicas": 2}),
                   deployment(status={"availableReplicas": 4})])
    clock = [0.0]
    printed = []
    rc = kubectl.watch_rollout(lambda: next(states), printed.append, clock=lambda: clock[0],
                               sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    assert rc == 0 and printed == [
        'Waiting for deployment "vllm-llama-70b" rollout to finish: 2 out of 4 new replicas have been updated...\n',
        'deployment "vllm-llama-70b" successfully rolled out\n']
    printed.clear()
    with pytest.raises(kf.RolloutError, match="^timed out waiting for the condition$"):
        kubectl.watch_rollout(lambda: deployment(status={"updatedReplicas": 2}), printed.append, timeout_s=3,
                              clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    assert len(printed) == 1
    # --watch=false: one look, exit 0
    assert kubectl.watch_rollout(lambda: deployment(status={"updatedReplicas": 2}), printed.append,
                                 watch=False) == 0


def test_restart_document_sets_the_template_annotation():
    obj = deployment()
    obj["metadata"]["resourceVersion"] = "7"
    doc = kubectl.restart_document(obj, "2026-12-02T19:00:00Z")
    assert "status" not in doc and "uid" not in doc["metadata"] and "resourceVersion" not in doc["metadata"]
    assert doc["spec"]["template"]["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/restartedAt": "2026-12-02T19:00:00Z"}
    assert "annotations" not in obj["spec"]["template"]["metadata"]  # the fetched object is left alone


# ---------------------------------------------------------------- apply


GOOD = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: vllm-llama-70b
spec:
  replicas: 2
---
apiVersion: v1
kind: Service
metadata:
  name: llm
"""


def test_manifests_from_files_and_directories(tmp_path):
    (tmp_path / "a.yaml").write_text(GOOD)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "serving"}}]}))
    (tmp_path / "notes.txt").write_text("not a manifest")
    flat = kubectl.read_manifests([str(tmp_path)])
    assert [(os.path.basename(s), d["kind"]) for s, d in flat] == [("a.yaml", "Deployment"), ("a.yaml", "Service")]
    deep = kubectl.read_manifests([str(tmp_path)], recursive=True)
    assert [d["kind"] for _, d in deep] == ["Deployment", "Service", "Namespace"]
    assert [s for s, _ in kubectl.read_manifests(["-"], stdin=io.StringIO(GOOD))] == ["STDIN", "STDIN"]
    with pytest.raises(kubectl.CommandError, match='the path "nope.yaml" does not exist'):
        kubectl.read_manifests(["nope.yaml"])


def test_yaml_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n   labels: y: z\n")
    with pytest.raises(kubectl.CommandError) as e:
        kubectl.read_manifests([str(bad)])
    assert str(e.value).startswith(f"error parsing {bad}: error converting YAML to JSON: yaml: line 5: ")
    nokind = tmp_path / "nokind.yaml"
    nokind.write_text("metadata: {name: x}\n")
    with pytest.raises(kubectl.CommandError, match=r'error validating ".*nokind.yaml": error validating data: '
                                                   r"\[apiVersion not set, kind not set\]"):
        kubectl.read_manifests([str(nokind)])


def test_namespace_flag_fills_and_checks():
    docs = [{"kind": "Deployment", "metadata": {"name": "a"}}, {"kind": "Namespace", "metadata": {"name": "n"}},
            {"kind": "Service", "metadata": {"name": "b", "namespace": "serving"}}]
    kubectl.set_namespace(docs[:2], "serving")
    assert docs[0]["metadata"]["namespace"] == "serving" and "namespace" not in docs[1]["metadata"]
    with pytest.raises(kubectl.CommandError, match='the namespace from the provided object "serving" does not match '
                                                   'the namespace "prod"'):
        kubectl.set_namespace(docs[2:], "prod")


def test_apply_errors_name_the_file_each_document_came_from():
    sources = ["deploy.yaml", "deploy.yaml", "svc.yaml"]
    errors = [{"document": 1, "kind": "Deployment", "name": "vllm", "message": "must be a whole number of GPUs",
               "path": "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]"},
              {"document": 1, "kind": "Deployment", "name": "vllm", "path": "spec.replica",
               "message": 'unknown field "spec.replica"'},
              {"document": 2, "kind": "Service", "name": "llm", "path": "", "message": "metadata.name is required"}]
    assert kubectl.apply_error_lines(errors, sources) == [
        'error: error validating "deploy.yaml": error validating data: [spec.template.spec.containers[0].resources'
        '.limits[nvidia.com/gpu]: must be a whole number of GPUs, spec.replica: unknown field "spec.replica"]',
        'error: error validating "svc.yaml": error validating data: [metadata.name is required]',
    ]


def test_apply_results_as_kubectl_prints_them():
    results = [{"kind": "Deployment", "name": "vllm-llama-70b", "action": "created"},
               {"kind": "Service", "name": "llm", "action": "unchanged"},
               {"kind": "HorizontalPodAutoscaler", "name": "llm", "action": "configured"},
               {"kind": "PriorityClass", "name": "serving-high", "action": "created"},
               {"kind": "Namespace", "name": "serving", "action": "created"},
               {"kind": "Pod", "name": "debug", "action": "created"}]
    assert kubectl.apply_result_lines(results, "none") == [
        "deployment.apps/vllm-llama-70b created", "service/llm unchanged",
        "horizontalpodautoscaler.autoscaling/llm configured", "priorityclass.scheduling.k8s.io/serving-high created",
        "namespace/serving created", "pod/debug created"]
    assert kubectl.apply_result_lines(results[:1], "client") == ["deployment.apps/vllm-llama-70b created (dry run)"]
    assert kubectl.apply_result_lines(results[:1], "server") == [
        "deployment.apps/vllm-llama-70b created (server dry run)"]


# ---------------------------------------------------------------- small helpers


def test_label_selectors():
    sel = {"matchLabels": {"app": "vllm"}, "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["b", "a"]}, {"key": "canary", "operator": "DoesNotExist"}]}
    assert kf.selector_text(sel) == "app=vllm,!canary,tier in (a,b)"
    assert kf.selector_matches(sel, {"app": "vllm", "tier": "a"})
    assert not kf.selector_matches(sel, {"app": "vllm", "tier": "a", "canary": "1"})
    labels = {"app": "vllm", "tier": "gpu"}
    for text, ok in [("app=vllm", True), ("app==vllm,tier!=cpu", True), ("tier in (gpu,tpu)", True),
                     ("tier notin (gpu)", False), ("app", True), ("!app", False), ("zone", False)]:
        assert kubectl.selector_text_matches(text, labels) is ok, text


def test_logs_picks_the_pod_kubectl_would():
    ready = [{"type": "Ready", "status": "True", "lastTransitionTime": ts(100)}]
    pending = pod("pending", phase="Pending", age=900)
    young = pod("young", spec={"nodeName": "n"}, status={"conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": ts(10)}]}, age=20)
    old = pod("old", spec={"nodeName": "n"}, status={"conditions": ready}, age=200)
    assert kf.meta(kubectl.pick_pod([pending, young, old], NOW))["name"] == "old"
    assert kubectl.pick_pod([], NOW) is None
    multi = pod(containers=("vllm", "sidecar"))
    assert kubectl.default_container(multi) == ("vllm", ["vllm", "sidecar"])
    multi["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "sidecar"}
    assert kubectl.default_container(multi)[0] == "sidecar"


def test_quantities():
    assert [kf.format_quantity(v) for v in (0, 0.75, 4, 1500, 2000, 12.5)] == ["0", "750m", "4", "1500", "2k",
                                                                                "12500m"]
    assert kf.format_quantity(16 * 2 ** 30, binary=True) == "16Gi"
    assert kf.parse_quantity("500m") == 0.5 and kf.parse_quantity("2Gi") == 2 * 2 ** 30
    assert kf.parse_quantity("1e3") == 1000 and kf.parse_quantity(4) == 4


def test_importing_the_commands_stays_light():
    code = "import sys, shoal.cli.kubectl, shoal.cli.main; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                 .stdout.split())
    heavy = {"yaml", "pydantic", "typing", "dataclasses", "http.client", "urllib.parse", "sqlalchemy", "fastapi",
             "shoal.server", "datetime"}
    assert not heavy & loaded


# ---------------------------------------------------------------- commands against a stand-in server


class StandIn:
    """A tiny HTTP server answering canned (status, headers, body) per 'METHOD path', recording requests."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.requests: list[tuple[str, str, bytes]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path = lines[0].split()[:2]
                length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")),
                              0)
                while len(body) < length:
                    body += conn.recv(65536)
                self.requests.append((method, path, body))
                answer = self.answers.get(f"{method} {path}") or self.answers.get(f"{method} {path.split('?')[0]}")
                status, payload, chunked = answer if answer else (404, {"detail": "no such route"}, False)
                if chunked:
                    parts = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payload) + b"0\r\n\r\n"
                    conn.sendall(b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
                    for i in range(0, len(parts), 7):  # dribble it out, split mid-chunk
                        conn.sendall(parts[i:i + 7])
                else:
                    raw = json.dumps(payload).encode()
                    conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(raw), raw))

    def close(self):
        self.sock.close()


@pytest.fixture
def standin(monkeypatch):
    servers = []

    def start(answers):
        s = StandIn(answers)
        servers.append(s)
        monkeypatch.setenv("SHOAL_SERVER", s.url)
        monkeypatch.setenv("SHOAL_TOKEN", "t")
        monkeypatch.setenv("SHOAL_CONFIG", "/nonexistent/shoal.yaml")
        monkeypatch.delenv("SHOAL_NAMESPACE", raising=False)
        return s

    yield start
    for s in servers:
        s.close()


def test_stream_decodes_chunks_as_they_arrive(standin):
    s = standin({"GET /log": (200, [b"line one\n", b"line two\n"], True),
                 "GET /bad": (400, {"detail": 'container "x" is not valid'}, False)})
    c = Client(s.url)
    assert b"".join(c.stream("/log", {"follow": "true", "tail": 5})) == b"line one\nline two\n"
    assert s.requests[-1][1] == "/log?follow=true&tail=5"
    with pytest.raises(ClientError) as e:
        list(c.stream("/bad"))
    assert e.value.status == 400 and str(e.value) == 'container "x" is not valid'


def test_get_not_found_is_one_line(standin, capsys):
    from shoal.cli.main import main

    standin({"GET /shoal/v1/kube/objects/deployments/default/x": (
        404, {"detail": 'deployments.apps "x" not found', "reason": "NotFound"}, False)})
    assert main(["get", "deploy", "x"]) == 1
    assert capsys.readouterr().err == 'Error from server (NotFound): deployments.apps "x" not found\n'
    assert main(["get", "deploymentz"]) == 1
    assert capsys.readouterr().err == 'error: the server doesn\'t have a resource type "deploymentz"\n'


def test_get_empty_and_several_kinds(standin, capsys):
    from shoal.cli.main import main

    s = standin({"GET /shoal/v1/kube/objects/pods": (200, {"items": []}, False),
                 "GET /shoal/v1/kube/objects/deployments": (200, {"items": [deployment()]}, False),
                 "GET /shoal/v1/kube/objects/services": (200, {"items": [service([{"port": 80}])]}, False)})
    assert main(["get", "pods"]) == 0
    assert capsys.readouterr().err == "No resources found in default namespace.\n"
    assert s.requests[-1][1] == "/shoal/v1/kube/objects/pods?namespace=default"
    assert main(["get", "deploy,svc", "-l", "app=vllm"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n\n")[0].splitlines()[1].startswith("deployment.apps/vllm-llama-70b   3/4")
    assert out.split("\n\n")[1].splitlines()[1].startswith("service/llm   ClusterIP")
    assert s.requests[-1][1] == "/shoal/v1/kube/objects/services?namespace=default&selector=app%3Dvllm"
    assert main(["get", "deploy", "-o", "name"]) == 0
    assert capsys.readouterr().out == "deployment.apps/vllm-llama-70b\n"
    assert main(["get", "deploy", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "List"


def test_apply_posts_documents_and_maps_errors(standin, capsys, tmp_path):
    from shoal.cli.main import main

    f = tmp_path / "llm.yaml"
    f.write_text(GOOD)
    s = standin({"POST /shoal/v1/kube/apply": (200, {"results": [
        {"kind": "Service", "namespace": "serving", "name": "llm", "action": "created"},
        {"kind": "Deployment", "namespace": "serving", "name": "vllm-llama-70b", "action": "configured"}],
        "warnings": ['Deployment/vllm-llama-70b: field "securityContext" is ignored by Shoal']}, False)})
    assert main(["apply", "-f", str(f), "-n", "serving", "--dry-run=server"]) == 0
    out = capsys.readouterr()
    assert out.out == ("deployment.apps/vllm-llama-70b configured (server dry run)\n"
                       "service/llm created (server dry run)\n")
    assert out.err == 'Warning: Deployment/vllm-llama-70b: field "securityContext" is ignored by Shoal\n'
    body = json.loads(s.requests[-1][2])
    assert body["dry_run"] is True and [d["metadata"]["namespace"] for d in body["documents"]] == ["serving"] * 2
    s.answers["POST /shoal/v1/kube/apply"] = (422, {"detail": {"errors": [
        {"document": 0, "kind": "Deployment", "name": "vllm-llama-70b", "path": "spec.replica",
         "message": 'unknown field "spec.replica"'}]}}, False)
    assert main(["apply", "-f", str(f)]) == 1
    assert capsys.readouterr().err == (f'error: error validating "{f}": error validating data: '
                                       '[spec.replica: unknown field "spec.replica"]\n')


def test_taint_patches_the_whole_list(standin, capsys):
    from shoal.cli.main import main

    s = standin({"GET /shoal/v1/nodes/node1": (200, {"name": "node1", "taints": [
        {"key": "dedicated", "value": "llm", "effect": "NoExecute"}]}, False),
                 "PATCH /shoal/v1/nodes/node1": (200, {"name": "node1"}, False)})
    assert main(["taint", "node", "node1", "nvidia.com/gpu:NoSchedule"]) == 0
    assert capsys.readouterr().out == "node/node1 tainted\n"
    assert json.loads(s.requests[-1][2]) == {"taints": [
        {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "llm", "effect": "NoExecute"}]}
    assert main(["taint", "node", "node1", "dedicated=other:NoExecute"]) == 1
    assert capsys.readouterr().err == ("error: node node1 already has dedicated taint(s) with same effect(s) and "
                                       "--overwrite is false\n")


def test_unreachable_server_is_reported_as_other_commands_do(monkeypatch, capsys):
    from shoal.cli.main import main

    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    monkeypatch.setenv("SHOAL_SERVER", f"http://127.0.0.1:{port}")
    with pytest.raises(SystemExit) as e:
        main(["get", "pods"])
    assert e.value.code == 1
    assert "error: cannot reach the Shoal server" in capsys.readouterr().err


def test_logs_of_a_deployment_streams_its_first_pod(standin, capfdbinary):
    from shoal.cli.main import main

    ready = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ts(50)}], "phase": "Running"}
    pods = [pod("vllm-a", spec={"nodeName": "node1"}, status=ready, age=100),
            pod("vllm-b", phase="Pending", age=500)]
    s = standin({"GET /shoal/v1/kube/objects/deployments/default/vllm-llama-70b": (200, deployment(), False),
                 "GET /shoal/v1/kube/objects/pods": (200, {"items": pods}, False),
                 "GET /shoal/v1/kube/pods/default/vllm-a/log": (200, [b"INFO loading weights\n", b"INFO ready\n"],
                                                             True)})
    assert main(["logs", "deployment/vllm-llama-70b", "--tail", "20", "-f"]) == 0
    out = capfdbinary.readouterr()
    assert out.out == b"INFO loading weights\nINFO ready\n"
    assert b"Found 2 pods, using pod/vllm-a\n" in out.err
    assert s.requests[1][1] == "/shoal/v1/kube/objects/pods?namespace=default&selector=app%3Dvllm"
    assert s.requests[-1][1] == "/shoal/v1/kube/pods/default/vllm-a/log?container=vllm&follow=true&tail=20"


def test_describe_fetches_what_it_shows(standin, capsys):
    from shoal.cli.main import main

    d = deployment(namespace="serving")
    s = standin({"GET /shoal/v1/kube/objects/deployments/serving/vllm-llama-70b": (200, d, False),
                 "GET /shoal/v1/kube/objects/replicasets": (200, {"items": []}, False),
                 "GET /shoal/v1/kube/objects/events": (200, {"items": [
                     {"involvedObject": {"kind": "Deployment", "name": "vllm-llama-70b", "namespace": "serving"},
                      "type": "Normal", "reason": "ScalingReplicaSet", "count": 1, "firstTimestamp": ts(5),
                      "lastTimestamp": ts(5), "source": {"component": "deployment-controller"},
                      "message": "Scaled up replica set vllm-llama-70b-7d4b9c to 4"},
                     {"involvedObject": {"kind": "Pod", "name": "vllm-llama-70b"}, "type": "Normal",
                      "reason": "Other", "message": "not about the deployment"}]}, False)})
    assert main(["describe", "deploy/vllm-llama-70b", "-n", "serving"]) == 0
    out = capsys.readouterr().out
    assert "Replicas:               4 desired | 4 updated | 4 total | 3 available | 1 unavailable\n" in out
    assert "ScalingReplicaSet" in out and "not about the deployment" not in out
    assert [path for _, path, _ in s.requests] == [
        "/shoal/v1/kube/objects/deployments/serving/vllm-llama-70b",
        "/shoal/v1/kube/objects/replicasets?namespace=serving",
        "/shoal/v1/kube/objects/events?namespace=serving"]


def test_delete_scale_rollout_and_label_messages(standin, capsys):
    from shoal.cli.main import main

    base = "/shoal/v1/kube/objects/deployments/default/vllm-llama-70b"
    s = standin({f"DELETE {base}": (200, {"deleted": 1}, False),
                 f"POST {base}/scale": (200, deployment(), False),
                 f"GET {base}": (200, deployment(), False),
                 f"POST {base}/undo": (200, deployment(), False),
                 f"GET {base}/history": (200, {"revisions": [{"revision": 1, "change_cause": None},
                                                             {"revision": 2, "change_cause": "bump image"}]}, False),
                 "POST /shoal/v1/kube/apply": (200, {"results": [], "warnings": []}, False),
                 "DELETE /shoal/v1/kube/objects/services/default/nope": (404, {"detail": "x", "reason": "NotFound"},
                                                                       False),
                 "GET /shoal/v1/nodes/node1": (200, {"name": "node1", "labels": {"zone": "a", "old": "1"}}, False),
                 "PATCH /shoal/v1/nodes/node1": (200, {}, False)})
    assert main(["delete", "deployment", "vllm-llama-70b", "--grace-period", "0"]) == 0
    assert capsys.readouterr().out == 'deployment.apps "vllm-llama-70b" deleted\n'
    assert s.requests[-1][:2] == ("DELETE", f"{base}?grace_period=0")
    assert main(["delete", "svc", "nope"]) == 1
    assert capsys.readouterr().err == 'Error from server (NotFound): services "nope" not found\n'
    assert main(["scale", "deployment/vllm-llama-70b", "--replicas", "6"]) == 0
    assert capsys.readouterr().out == "deployment.apps/vllm-llama-70b scaled\n"
    assert json.loads(s.requests[-1][2]) == {"replicas": 6}
    assert main(["scale", "deployment", "vllm-llama-70b", "--replicas=2"]) == 0
    capsys.readouterr()
    assert main(["rollout", "undo", "deployment/vllm-llama-70b", "--to-revision", "1"]) == 0
    assert capsys.readouterr().out == "deployment.apps/vllm-llama-70b rolled back\n"
    assert json.loads(s.requests[-1][2]) == {"to_revision": 1}
    assert main(["rollout", "history", "deploy/vllm-llama-70b"]) == 0
    assert capsys.readouterr().out == ("deployment.apps/vllm-llama-70b \nREVISION  CHANGE-CAUSE\n1         <none>\n"
                                       "2         bump image\n\n")
    assert main(["rollout", "restart", "deployment/vllm-llama-70b"]) == 0
    assert capsys.readouterr().out == "deployment.apps/vllm-llama-70b restarted\n"
    doc = json.loads(s.requests[-1][2])["documents"][0]
    assert "kubectl.kubernetes.io/restartedAt" in doc["spec"]["template"]["metadata"]["annotations"]
    assert main(["rollout", "status", "deployment/vllm-llama-70b", "--watch=false"]) == 0
    assert capsys.readouterr().out == ('Waiting for deployment "vllm-llama-70b" rollout to finish: 3 of 4 updated '
                                       "replicas are available...\n")
    assert main(["label", "node", "node1", "tier=gpu", "old-"]) == 0
    assert capsys.readouterr().out == "node/node1 labeled\n"
    assert json.loads(s.requests[-1][2]) == {"labels": {"old": None, "tier": "gpu"}}
    assert main(["label", "node", "node1", "zone=b"]) == 1
    assert capsys.readouterr().err == "error: 'zone' already has a value (a), and --overwrite is false\n"
    assert main(["exec", "-it", "vllm-0", "--", "bash"]) == 1
    assert capsys.readouterr().err.startswith("error: exec: -t (a terminal) is not supported")


def test_get_watch_prints_changed_rows_under_one_header(capsys):
    class Api:
        rounds = [[pod("a", statuses=[waiting("ContainerCreating")], metadata={"resourceVersion": "1"})],
                  [pod("a", statuses=[waiting("ContainerCreating")], metadata={"resourceVersion": "1"})],
                  [pod("a", statuses=[running()], metadata={"resourceVersion": "2"}),
                   pod("bb-long-name", statuses=[running()], metadata={"resourceVersion": "1"})],
                  []]

        def list(self, r, namespace, selector=None):
            return self.rounds.pop(0)

    sleeps = []

    def sleep(s):
        sleeps.append(s)
        if len(sleeps) == 4:
            raise KeyboardInterrupt

    class Args:
        output, selector, show_labels, no_headers = None, None, False, False

    with pytest.raises(KeyboardInterrupt):
        kubectl._watch(Api(), kf.BY_PLURAL["pods"], [], "default", Args(), sleep=sleep)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["NAME", "READY", "STATUS"], ["a", "0/1", "ContainerCreating"], ["a", "1/1", "Running"],
        ["bb-long-name", "1/1", "Running"], ["a", "1/1", "Running"], ["bb-long-name", "1/1", "Running"]]
    # widths are remembered and only grow (kubectl's RememberWidths): a longer name widens later rows
    assert lines[1].index("0/1") == lines[0].index("READY") and lines[2].index("1/1") > lines[1].index("0/1")
    assert lines[2].index("Running") == lines[3].index("Running") == lines[4].index("Running")


def test_a_nodes_cached_images_as_kubelet_reports_them_and_in_scontrol():
    from shoal.cli.scontrol import render_node

    images = [{"names": ["r/small:1", "sha256:" + "a" * 64], "sizeBytes": 10, "lastUsed": 2.0},
              {"names": ["r/big:1"], "sizeBytes": 900, "lastUsed": 1.0}]
    n = kf.node_object({"name": "node1", "state": "UP", "images": images}, "v1")
    assert n["status"]["images"] == [{"names": ["r/big:1"], "sizeBytes": 900},
                                     {"names": ["r/small:1", "sha256:" + "a" * 64], "sizeBytes": 10}]
    assert "images" not in kf.node_object({"name": "node2", "state": "UP"}, "v1")["status"]
    text = render_node({"name": "node1", "cpus": 4, "memory_mb": 1024, "images": images})
    assert "   Images=r/small:1,r/big:1\n" in text
    assert "Images" not in render_node({"name": "node2", "cpus": 4, "memory_mb": 1024})
