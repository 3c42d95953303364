"""A Shoal node as a Kubernetes Node object: what ``shoal get nodes`` and the Kubernetes API
both show. Stdlib only, so the commands can use it without the server's imports."""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: the commands must start fast
    from collections.abc import Mapping
    from typing import Any

GPU = "nvidia.com/gpu"
GPUS_ALLOCATED = "shoal.io/gpus-allocated"  # every holder's GPUs: pods, batch jobs, clean-ups


def node_object(n: Mapping[str, Any], version: str) -> dict:
    """A Shoal node (docs/API.md) as a Kubernetes Node, so that get/describe treat it alike."""
    import uuid  # only here: a uid for the Kubernetes API, stable per node name

    state = n.get("state") or ""
    heartbeat = n.get("last_heartbeat")
    ready = {"UP": "True", "DRAIN": "True", "DOWN": "False"}.get(state, "Unknown")
    message = ("shoal agent is posting ready status" if ready == "True"
               else n.get("reason") or "Agent stopped posting node status.")
    cond = {"type": "Ready", "status": ready,
            "lastHeartbeatTime": iso(heartbeat), "lastTransitionTime": iso(n.get("reason_time") or heartbeat),
            "reason": "KubeletReady" if ready == "True" else "NodeStatusUnknown", "message": message}
    gpus = len(n.get("gpus") or ())
    capacity = {"cpu": str(n.get("cpus") or 0), "memory": f"{int(n.get('memory_mb') or 0) * 1024}Ki",
                GPU: str(gpus), "pods": "110"}
    addresses = [{"type": "InternalIP", "address": n.get("address") or ""}, {"type": "Hostname", "address": n["name"]}]
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n["name"], "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"shoal-node:{n['name']}")),
                     "labels": dict(n.get("labels") or {}),
                     "annotations": {"shoal.io/state": n.get("display_state") or state.lower(),
                                     GPUS_ALLOCATED: str(n.get("gpus_alloc") or 0)},
                     "creationTimestamp": iso(n.get("registered_at") or n.get("boot_time"))},
        "spec": {"taints": [dict(t) for t in n.get("taints") or ()], "unschedulable": state == "DRAIN"},
        "status": {
            "conditions": [cond], "addresses": addresses, "capacity": capacity, "allocatable": dict(capacity),
            "nodeInfo": {"kubeletVersion": n.get("version") or version, "containerRuntimeVersion": "shoal",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                         "osImage": "", "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            "shoal": {"gpusAllocated": n.get("gpus_alloc") or 0, "partitions": n.get("partitions") or [],
                      "gpus": n.get("gpus") or []},
        },
    }
    if n.get("images"):  # the node's image cache; kubelet's nodeStatusMaxImages: the 50 largest
        node["status"]["images"] = [
            {"names": list(i.get("names") or ()), "sizeBytes": int(i.get("sizeBytes") or 0)}
            for i in sorted(n["images"], key=lambda i: -int(i.get("sizeBytes") or 0))[:50]]
    return node


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
