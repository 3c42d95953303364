"""Pods are jobs: one row of ``jobs`` with ``kind = "pod"``, one node, no time limit.

So a pod goes through the same scheduling pass, placement, preemption, cleanup and node
failure handling as a batch job. This module maps between the two: a pod template becomes
a job row (resources from the containers, node terms for placement, priority from its
PriorityClass), and a job row is shown as a Kubernetes Pod (status from the agent's last
report, or from the job's state and pending reason).
"""

from __future__ import annotations

import json
import math

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.kube import jobs as jobslib
from shoal.kube.manifest import pod_resources
from shoal.model.job import JobState
from shoal.model.snapshot import PodTerms
from shoal.server.jobs import request_to_json
from shoal.model.resources import ResourceRequest
from shoal.server.kube.objects import CLUSTER, KINDS, get as get_object, list_rows, not_found, random_suffix, rfc3339
from shoal.store.models import CleanupRow, JobRow

POD = "pod"
LIVE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)
OWNER_API = {"ReplicaSet": "apps/v1", "Job": "batch/v1"}  # the kinds that own pods


def pod_uid(row: JobRow) -> str:
    return row.spec["pod"]["uid"]


def pod_terms(namespace: str, labels: dict, spec: dict) -> PodTerms:
    """The scheduling terms of a pod spec, with the key a pass caches static checks on."""
    ports = tuple(sorted({p["containerPort"] for c in spec.get("containers", ()) for p in c.get("ports") or ()
                          if p.get("containerPort")}))
    static = {"nodeSelector": spec.get("nodeSelector") or {},
              "nodeAffinity": (spec.get("affinity") or {}).get("nodeAffinity") or {},
              "tolerations": spec.get("tolerations") or []}
    return PodTerms(namespace=namespace, labels=dict(labels or {}), node_selector=dict(static["nodeSelector"]),
                    affinity=dict(spec.get("affinity") or {}), tolerations=tuple(static["tolerations"]),
                    ports=ports, key=json.dumps(static, sort_keys=True))


def terms_of(row: JobRow) -> PodTerms:
    pod = row.spec["pod"]
    return pod_terms(pod["namespace"], pod.get("labels") or {}, pod["spec"])


def gang_of(row: JobRow) -> str | None:
    """A pod's gang key (namespace/group) when it belongs to a pod group, else None."""
    pod = row.spec["pod"]
    group = (pod.get("labels") or {}).get(jobslib.GANG_LABEL)
    return f"{pod['namespace']}/{group}" if group else None


def priority_of(session: Session, spec: dict) -> tuple[int, str | None]:
    """(value, class name) of a pod's PriorityClass; the globalDefault class, else 0."""
    name = spec.get("priorityClassName")
    row = get_object(session, "PriorityClass", CLUSTER, name) if name else None
    if row is None and not name:
        row = next((r for r in list_rows(session, "PriorityClass") if r.body.get("globalDefault")), None)
    if row is None:
        return int(spec.get("priority") or 0), name
    return int(row.body.get("value", 0)), row.name


def create(session: Session, server, *, namespace: str, name: str, labels: dict, annotations: dict,
           spec: dict, owner_uid: str | None, owner_name: str | None, user: str, now: float,
           uid: str, deployment: str | None = None, owner_kind: str = "ReplicaSet") -> JobRow:
    """A pending pod (a job row) from a pod template. The caller commits and wakes the scheduler."""
    res = pod_resources(spec)
    value, class_name = priority_of(session, spec)
    qos = class_name if class_name and class_name in server.qos_table else None
    req = ResourceRequest(nodes=1, ntasks=1, cpus_per_task=max(1, math.ceil(res["cpus"])),
                          mem_per_node_mb=max(1, res["memory_mb"]), gpus_per_node=res["gpus"])
    pod = {"namespace": namespace, "name": name, "uid": uid, "labels": labels, "annotations": annotations,
           "spec": spec, "owner": owner_name, "priorityClassName": class_name,
           "deployment": deployment}
    if owner_kind != "ReplicaSet":
        pod["owner_kind"] = owner_kind
    row = JobRow(
        kind=POD, namespace=namespace, owner_uid=owner_uid, name=name, user=user,
        partition=server.serving_partition, state=JobState.PENDING.value, reason="None", held=False,
        interactive=False, requeue=False, submit_time=now, time_limit_s=None, priority=value,
        request=request_to_json(req), workdir=spec["containers"][0].get("workingDir") or "/",
        spec={"pod": pod, "qos": qos, "account": None, "environment": {}, "command": "(pod)"},
    )
    session.add(row)
    session.flush()
    return row


def new_name(prefix: str) -> str:
    return f"{prefix}-{random_suffix()}"


def owned(session: Session, owner_uid: str) -> list[JobRow]:
    """Every pod an owner made, in any state (a Job counts its ended ones)."""
    return list(session.scalars(select(JobRow).where(JobRow.kind == POD, JobRow.owner_uid == owner_uid)
                                .order_by(JobRow.id)))


def live(session: Session, owner_uid: str | None = None, namespace: str | None = None) -> list[JobRow]:
    """Pods still wanted: pending or running, not being deleted."""
    q = select(JobRow).where(JobRow.kind == POD, JobRow.state.in_(LIVE_STATES), JobRow.deleting_at.is_(None))
    if owner_uid is not None:
        q = q.where(JobRow.owner_uid == owner_uid)
    if namespace is not None:
        q = q.where(JobRow.namespace == namespace)
    return list(session.scalars(q.order_by(JobRow.id)))


def visible(session: Session, namespace: str | None = None, name: str | None = None) -> list[JobRow]:
    """Pods ``get pods`` lists: live ones, terminating ones (draining, or their processes not
    yet gone), and ended ones nobody has deleted (a finished bare pod shows Completed)."""
    q = select(JobRow).where(JobRow.kind == POD)
    if namespace is not None:
        q = q.where(JobRow.namespace == namespace)
    if name is not None:
        q = q.where(JobRow.name == name)
    rows = list(session.scalars(q.order_by(JobRow.namespace, JobRow.name, JobRow.id.desc())))
    cleaning = set(session.scalars(select(CleanupRow.job_id).where(CleanupRow.job_id.in_([r.id for r in rows]))))\
        if rows else set()
    out, seen = [], set()
    for r in rows:
        gone = JobState(r.state).terminal and r.deleting_at is not None and r.id not in cleaning
        if gone or (r.namespace, r.name) in seen:
            continue
        seen.add((r.namespace, r.name))
        out.append(r)
    return out


def find(session: Session, namespace: str, name: str) -> JobRow | None:
    rows = visible(session, namespace, name)
    return rows[0] if rows else None


def delete(session: Session, row: JobRow, now: float) -> bool:
    """Begin a pod's deletion. Pending: it ends now. Running: it leaves the gateway's routes
    at once and the controller stops it after the drain time (``drain``). False when it was
    already going."""
    if row.deleting_at is not None:
        return False
    row.deleting_at = now
    if row.state == JobState.PENDING.value:
        from shoal.server.jobs import finish

        finish(session, row, JobState.CANCELLED, now, reason="None")
    return True


def drain_over(session: Session, now: float, drain_s: float) -> list[JobRow]:
    """Running pods whose drain time is over: the caller cancels them (their agent then
    stops the containers with the pod's terminationGracePeriodSeconds)."""
    return list(session.scalars(select(JobRow).where(
        JobRow.kind == POD, JobRow.state == JobState.RUNNING.value, JobRow.deleting_at.is_not(None),
        JobRow.deleting_at <= now - drain_s)))


# ---------------------------------------------------------------- readiness


def condition(row: JobRow, kind: str) -> dict | None:
    for c in (row.pod_status or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return None


def is_ready(row: JobRow) -> bool:
    if row.state != JobState.RUNNING.value or row.deleting_at is not None:
        return False
    c = condition(row, "Ready")
    return c is not None and c.get("status") == "True"


def ready_since(row: JobRow) -> float | None:
    """When the pod became Ready (the agent's time), None when it is not ready."""
    if not is_ready(row):
        return None
    return (row.pod_status or {}).get("readySince")


# ---------------------------------------------------------------- Pod JSON


def _pending_status(row: JobRow) -> dict:
    reason = row.reason if row.reason not in ("None", "", None) else "Priority"
    msg = {"Resources": "0 nodes are available: insufficient resources for this pod "
                        "(GPUs, CPUs or memory, after node selectors, taints and affinity)",
           "BadConstraints": "no node matches this pod's node selector, affinity and tolerations",
           "Priority": "waiting for higher-priority work"}.get(reason, reason)
    return {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg,
         "lastTransitionTime": rfc3339(row.submit_time)}]}


_ENDED = {
    JobState.NODE_FAIL.value: ("Failed", "NodeLost", "the node running this pod stopped responding"),
    JobState.PREEMPTED.value: ("Failed", "Preempted", "preempted by higher-priority work"),
    JobState.TIMEOUT.value: ("Failed", "DeadlineExceeded", "the pod ran past its deadline"),
}


# The conditions a pod's node (or the scheduler) owns; others are written by controllers
# through pods/status (readiness gates) and kept beside the pod's spec.
KUBELET_CONDITIONS = frozenset({"PodScheduled", "Initialized", "ContainersReady", "Ready",
                                "PodReadyToStartContainers", "DisruptionTarget"})


def set_extra_conditions(session: Session, namespace: str, name: str, conditions: list) -> None:
    """The conditions of ``conditions`` the kubelet does not own, kept as the pod's (pods/status)."""
    row = find(session, namespace, name)
    if row is None:
        raise not_found(KINDS["pods"], name)
    extra = [dict(c) for c in conditions if isinstance(c, dict) and c.get("type") not in KUBELET_CONDITIONS]
    row.spec = {**row.spec, "pod": {**row.spec["pod"], "conditions": extra}}


def status_of(row: JobRow) -> dict:
    status = _status_of(row)
    extra = row.spec["pod"].get("conditions")
    if extra:
        status["conditions"] = [*(status.get("conditions") or ()), *extra]
    return status


def _status_of(row: JobRow) -> dict:
    state = row.state
    node = row.batch_host
    if state == JobState.PENDING.value:
        return _pending_status(row)
    status = dict(row.pod_status or {})
    status.pop("readySince", None)
    if not status:
        status = {"phase": "Pending", "containerStatuses": [
            {"name": c["name"], "ready": False, "started": False, "restartCount": 0, "image": c.get("image", ""),
             "state": {"waiting": {"reason": "ContainerCreating"}}}
            for c in row.spec["pod"]["spec"]["containers"]]}
    if JobState(state).terminal:
        if state in _ENDED and status.get("phase") not in ("Succeeded", "Failed"):
            phase, reason, message = _ENDED[state]
            status.update(phase=phase, reason=reason, message=message)
        elif status.get("phase") not in ("Succeeded", "Failed") and state != JobState.CANCELLED.value:
            status["phase"] = "Succeeded" if state == JobState.COMPLETED.value else "Failed"
        status["conditions"] = [dict(c, status="False") if c.get("type") in ("Ready", "ContainersReady") else c
                                for c in status.get("conditions") or ()]
    if node and not status.get("hostIP"):
        status["hostIP"] = status["podIP"] = ""
    status.setdefault("startTime", rfc3339(row.start_time))
    return status


def to_json(row: JobRow, node_addresses: dict[str, str] | None = None) -> dict:
    pod = row.spec["pod"]
    meta = {"name": row.name, "namespace": row.namespace, "uid": pod["uid"], "labels": pod.get("labels") or {},
            "resourceVersion": str(row.version), "creationTimestamp": rfc3339(row.submit_time)}
    meta["annotations"] = {**(pod.get("annotations") or {}), "shoal.io/job-id": str(row.id)}
    if row.owner_uid:
        kind = pod.get("owner_kind", "ReplicaSet")
        meta["ownerReferences"] = [{"apiVersion": OWNER_API[kind], "kind": kind, "name": pod.get("owner"),
                                    "uid": row.owner_uid, "controller": True, "blockOwnerDeletion": True}]
    if row.deleting_at is not None or row.state == JobState.CANCELLED.value:
        meta["deletionTimestamp"] = rfc3339(row.deleting_at or row.end_time)
        meta["deletionGracePeriodSeconds"] = pod["spec"].get("terminationGracePeriodSeconds", 30)
    spec = dict(pod["spec"])
    if row.batch_host:
        spec["nodeName"] = row.batch_host
    if pod.get("priorityClassName"):
        spec["priorityClassName"] = pod["priorityClassName"]
    spec["priority"] = row.priority
    status = status_of(row)
    if row.batch_host and node_addresses and not status.get("podIP"):
        status["podIP"] = status["hostIP"] = node_addresses.get(row.batch_host, "")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def job_key(row: JobRow) -> str:
    """The run key the agent knows this pod by."""
    from shoal.server.jobs import job_run_key

    return job_run_key(row.id, row.restart_count)
