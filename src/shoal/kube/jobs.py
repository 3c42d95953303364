"""The batch/v1 Job controller as a pure function: from a Job's spec and its pods, the pods to
create and delete and the status to write (the job controller's sync, level-triggered:
calling it again with the same inputs plans the same).

A Job runs pods to completion: ``completions`` successful pods, at most ``parallelism`` at
once; in ``Indexed`` mode each index 0..completions-1 must succeed once (its pods get
``JOB_COMPLETION_INDEX``). More than ``backoffLimit`` failed pods fail the Job. A pod that
ended because it was preempted or its node failed is retried without counting as a
failure, as a pod failure policy ignoring ``DisruptionTarget`` would do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_BACKOFF_LIMIT = 6
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"


@dataclass(frozen=True)
class JobPod:
    name: str
    phase: str  # Active (pending or running), Succeeded, Failed, Disrupted (preempted, node lost)
    index: int | None = None


@dataclass
class JobPlan:
    create: list[int | None] = field(default_factory=list)  # an index per pod to create (None: not Indexed)
    delete: list[str] = field(default_factory=list)  # active pods to stop (the Job has finished)
    status: dict = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)


def settings(spec: Mapping) -> tuple[int, int, bool, int]:
    """(completions, parallelism, indexed, backoffLimit) with Kubernetes' defaults."""
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    completions = int(completions) if completions is not None else 1
    indexed = spec.get("completionMode") == "Indexed"
    return completions, parallelism, indexed, int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))


def index_text(indexes: Sequence[int]) -> str:
    """``completedIndexes``: ``0-3,5``."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(set(indexes)):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def plan_job(spec: Mapping, pods: Sequence[JobPod], old_status: Mapping, now: str) -> JobPlan:
    """One sync of a Job (``now``: the RFC 3339 time conditions are stamped with)."""
    completions, parallelism, indexed, backoff = settings(spec)
    plan = JobPlan()
    status = {k: v for k, v in old_status.items() if k in ("startTime", "completionTime", "conditions")}
    status.setdefault("startTime", now)
    conditions = list(status.get("conditions") or [])
    finished = any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions)
    active = [p for p in pods if p.phase == "Active"]
    failed = sum(1 for p in pods if p.phase == "Failed")
    if indexed:
        done = {p.index for p in pods if p.phase == "Succeeded" and p.index is not None and p.index < completions}
        succeeded = len(done)
    else:
        done = set()
        succeeded = sum(1 for p in pods if p.phase == "Succeeded")
    if not finished:
        if succeeded >= completions:
            conditions += [_condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                      "succeeded pods", now), _condition("Complete", "CompletionsReached",
                                                                        "Reached expected number of succeeded "
                                                                        "pods", now)]
            status["completionTime"] = now
            plan.events.append(("Normal", "Completed", "Job completed"))
            finished = True
        elif failed > backoff:
            message = "Job has reached the specified backoff limit"
            conditions += [_condition("FailureTarget", "BackoffLimitExceeded", message, now),
                           _condition("Failed", "BackoffLimitExceeded", message, now)]
            plan.events.append(("Warning", "BackoffLimitExceeded", message))
            finished = True
    if finished:
        plan.delete = [p.name for p in active]
        active = []
    else:
        room = parallelism - len(active)
        if indexed:
            busy = {p.index for p in active}
            missing = [i for i in range(completions) if i not in done and i not in busy]
            plan.create = list(missing[:max(0, room)])
        else:
            plan.create = [None] * max(0, min(room, completions - succeeded - len(active)))
    status.update(active=len(active) + len(plan.create), succeeded=succeeded, failed=failed)
    if conditions:
        status["conditions"] = conditions
    if indexed and done:
        status["completedIndexes"] = index_text(sorted(done))
    plan.status = {k: v for k, v in status.items() if v or k in ("succeeded", "failed")}
    return plan


def _condition(type_: str, reason: str, message: str, now: str) -> dict:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": now, "lastTransitionTime": now}


def pod_template(template: Mapping, job_name: str, job_uid: str, index: int | None) -> tuple[dict, dict, dict]:
    """(labels, annotations, spec) of one of a Job's pods: the Job's labels and, in Indexed
    mode, its index as an annotation and ``JOB_COMPLETION_INDEX`` in every container."""
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), "batch.kubernetes.io/job-name": job_name, "job-name": job_name,
              "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid}
    annotations = dict(meta.get("annotations") or {})
    spec = dict(template.get("spec") or {})
    if index is not None:
        annotations[INDEX_ANNOTATION] = str(index)
        labels[INDEX_ANNOTATION] = str(index)
        spec["containers"] = [{**c, "env": [*(e for e in c.get("env") or () if e.get("name") != INDEX_ENV),
                                            {"name": INDEX_ENV, "value": str(index)}]}
                              for c in spec.get("containers") or ()]
    return labels, annotations, spec
