"""The batch/v1 Job controller as a pure function: from a Job's spec and its pods, the pods to
create and delete and the status to write (the job controller's sync, level-triggered:
calling it again with the same inputs plans the same).

A Job runs pods to completion: ``completions`` successful pods, at most ``parallelism`` at
once; in ``Indexed`` mode each index 0..completions-1 must succeed once (its pods get
``JOB_COMPLETION_INDEX``). More than ``backoffLimit`` failed pods fail the Job. A pod that
ended because it was preempted or its node failed is retried without counting as a
failure, as a pod failure policy ignoring ``DisruptionTarget`` would do (Kubernetes counts
it unless a policy says so: a deliberate difference). ``podFailurePolicy`` rules (FailJob,
Ignore, Count on exit codes or on ``DisruptionTarget``), ``activeDeadlineSeconds``,
``suspend`` and ``ttlSecondsAfterFinished`` act as the job controller's do. With
``backoffLimitPerIndex`` (Indexed Jobs) each index has its own budget of failures: an index
over it (or failed by a ``FailIndex`` rule) is not retried and is listed in ``failedIndexes``;
the Job fails once every index has succeeded or failed (FailedIndexes), or at once when more
than ``maxFailedIndexes`` have failed (MaxFailedIndexesExceeded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from shoal.model.hostlist import compress_numbers

DEFAULT_BACKOFF_LIMIT = 6
UNLIMITED_BACKOFF = 2**31 - 1  # backoffLimit's default when backoffLimitPerIndex is set
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_ENV = "JOB_COMPLETION_INDEX"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # on a Job: Kueue admits its pods as a whole; so does Shoal
GANG_LABEL = "kueue.x-k8s.io/pod-group-name"  # on pods: a group admitted all or none


@dataclass(frozen=True)
class JobPod:
    name: str
    phase: str  # Active (pending or running), Succeeded, Failed, Disrupted (preempted, node lost)
    index: int | None = None
    exit_code: int | None = None  # of a Failed pod's container
    container: str = ""  # that container's name
    namespace: str = "default"


@dataclass
class JobPlan:
    create: list[int | None] = field(default_factory=list)  # an index per pod to create (None: not Indexed)
    delete: list[str] = field(default_factory=list)  # active pods to stop (the Job has finished)
    status: dict = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    delete_job: bool = False  # finished longer ago than ttlSecondsAfterFinished: the Job and its pods go


def settings(spec: Mapping) -> tuple[int, int, bool, int]:
    """(completions, parallelism, indexed, backoffLimit) with Kubernetes' defaults."""
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    completions = int(completions) if completions is not None else 1
    indexed = spec.get("completionMode") == "Indexed"
    default = DEFAULT_BACKOFF_LIMIT if spec.get("backoffLimitPerIndex") is None else UNLIMITED_BACKOFF
    backoff = spec.get("backoffLimit")
    return completions, parallelism, indexed, int(backoff if backoff is not None else default)


def failed_indexes(spec: Mapping, pods: Sequence[JobPod], per_index: int) -> set[int]:
    """The indexes that will not be retried: more than ``per_index`` counted failures, or a
    pod failed by a ``FailIndex`` rule (calculateFailedIndexes in the job controller)."""
    failures: dict[int, int] = {}
    out: set[int] = set()
    for p in pods:
        if p.index is None or p.phase not in ("Failed", "Disrupted"):
            continue
        rule = failure_policy_action(spec, p)
        if rule is not None and rule[0] == "FailIndex":
            out.add(p.index)
            continue
        if _counted(p, rule):
            failures[p.index] = failures.get(p.index, 0) + 1
    return out | {i for i, n in failures.items() if n > per_index}


def index_text(indexes: Sequence[int]) -> str:
    """``completedIndexes``: ``0-3,5``."""
    return compress_numbers(indexes)


def seconds(rfc3339: str) -> float:
    """An RFC 3339 time (as the status stamps it) in seconds since the epoch."""
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def failure_policy_action(spec: Mapping, pod: JobPod) -> tuple[str, int, str] | None:
    """The first ``podFailurePolicy`` rule a Failed or Disrupted pod matches: (action, rule
    index, what matched, in the job controller's words); None when no rule matches."""
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or ()):
        codes = rule.get("onExitCodes")
        if codes and pod.phase == "Failed" and pod.exit_code is not None:
            if codes.get("containerName") not in (None, pod.container):
                continue
            inside = pod.exit_code in (codes.get("values") or ())
            if inside == (codes.get("operator", "In") == "In"):
                return rule["action"], i, (f"Container {pod.container} for pod {pod.namespace}/{pod.name} failed "
                                           f"with exit code {pod.exit_code}")
        for cond in rule.get("onPodConditions") or ():
            if pod.phase == "Disrupted" and cond.get("type") == "DisruptionTarget" and cond.get("status",
                                                                                              "True") == "True":
                return rule["action"], i, f"Pod {pod.namespace}/{pod.name} has condition DisruptionTarget"
    return None


def _counted(pod: JobPod, rule: tuple[str, int, str] | None) -> bool:
    """Whether a Failed or Disrupted pod counts as a failure: a Failed one unless a rule says
    Ignore; a Disrupted one (preempted, node lost) only when a rule matching it says so."""
    return pod.phase == "Failed" if rule is None else rule[0] != "Ignore"


def plan_job(spec: Mapping, pods: Sequence[JobPod], old_status: Mapping, now: str) -> JobPlan:
    """One sync of a Job (``now``: the RFC 3339 time conditions are stamped with)."""
    completions, parallelism, indexed, backoff = settings(spec)
    plan = JobPlan()
    status = {k: v for k, v in old_status.items() if k in ("startTime", "completionTime", "conditions")}
    conditions = list(status.get("conditions") or [])
    ended = next((c for c in conditions if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"),
                 None)
    finished = ended is not None
    suspended = bool(spec.get("suspend")) and not finished
    conditions = _suspension(conditions, suspended, now, plan)
    if suspended:
        status.pop("startTime", None)  # resuming starts the clock of activeDeadlineSeconds again
    else:
        status.setdefault("startTime", now)
    active = [p for p in pods if p.phase == "Active"]
    failed, fail_job = 0, None
    for p in pods:
        if p.phase not in ("Failed", "Disrupted"):
            continue
        rule = failure_policy_action(spec, p)
        if rule is not None and rule[0] == "FailJob" and fail_job is None:
            fail_job = f"{rule[2]} matching FailJob rule at index {rule[1]}"
        failed += _counted(p, rule)
    per_index = spec.get("backoffLimitPerIndex") if indexed else None
    lost: set[int] = set()
    if indexed:
        done = {p.index for p in pods if p.phase == "Succeeded" and p.index is not None and p.index < completions}
        succeeded = len(done)
        if per_index is not None:
            lost = {i for i in failed_indexes(spec, pods, int(per_index)) if i < completions} - done
    else:
        done = set()
        succeeded = sum(1 for p in pods if p.phase == "Succeeded")
    max_lost = spec.get("maxFailedIndexes")
    if not finished:
        deadline = spec.get("activeDeadlineSeconds")
        if succeeded >= completions:
            conditions += [_condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                      "succeeded pods", now), _condition("Complete", "CompletionsReached",
                                                                        "Reached expected number of succeeded "
                                                                        "pods", now)]
            status["completionTime"] = now
            plan.events.append(("Normal", "Completed", "Job completed"))
            finished = True
        elif fail_job is not None:
            finished = _fail(conditions, plan, "PodFailurePolicy", fail_job, now)
        elif max_lost is not None and len(lost) > int(max_lost):
            finished = _fail(conditions, plan, "MaxFailedIndexesExceeded",
                             "Job has exceeded the specified maximal number of failed indexes", now)
        elif lost and len(lost) + succeeded >= completions:
            finished = _fail(conditions, plan, "FailedIndexes", "Job has failed indexes", now)
        elif failed > backoff:
            finished = _fail(conditions, plan, "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                             now)
        elif deadline is not None and "startTime" in status and seconds(now) - seconds(status["startTime"]) >= \
                int(deadline):
            finished = _fail(conditions, plan, "DeadlineExceeded", "Job was active longer than specified deadline",
                             now)
    elif ended is not None and spec.get("ttlSecondsAfterFinished") is not None:
        over = ended.get("lastTransitionTime") or now
        plan.delete_job = seconds(now) - seconds(over) >= int(spec["ttlSecondsAfterFinished"])
    if finished or suspended:
        plan.delete = [p.name for p in active]
        active = []
    else:
        room = parallelism - len(active)
        if indexed:
            busy = {p.index for p in active}
            missing = [i for i in range(completions) if i not in done and i not in busy and i not in lost]
            plan.create = list(missing[:max(0, room)])
        else:
            plan.create = [None] * max(0, min(room, completions - succeeded - len(active)))
    status.update(active=len(active) + len(plan.create), succeeded=succeeded, failed=failed)
    if conditions:
        status["conditions"] = conditions
    if indexed and done:
        status["completedIndexes"] = index_text(sorted(done))
    if per_index is not None:
        status["failedIndexes"] = index_text(sorted(lost))
    plan.status = {k: v for k, v in status.items() if v or k in ("succeeded", "failed", "failedIndexes")}
    return plan


def _fail(conditions: list[dict], plan: JobPlan, reason: str, message: str, now: str) -> bool:
    conditions += [_condition("FailureTarget", reason, message, now), _condition("Failed", reason, message, now)]
    plan.events.append(("Warning", reason, message))
    return True


def _suspension(conditions: list[dict], suspended: bool, now: str, plan: JobPlan) -> list[dict]:
    """The Suspended condition: True while ``spec.suspend``, False (JobResumed) once resumed."""
    old = next((c for c in conditions if c.get("type") == "Suspended"), None)
    if suspended == (old is not None and old.get("status") == "True"):
        return conditions
    if old is None and not suspended:
        return conditions
    rest = [c for c in conditions if c.get("type") != "Suspended"]
    if suspended:
        plan.events.append(("Normal", "Suspended", "Job suspended"))
        return rest + [_condition("Suspended", "JobSuspended", "Job suspended", now)]
    plan.events.append(("Normal", "Resumed", "Job resumed"))
    return rest + [{**_condition("Suspended", "JobResumed", "Job resumed", now), "status": "False"}]


def _condition(type_: str, reason: str, message: str, now: str) -> dict:
    return {"type": type_, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": now, "lastTransitionTime": now}


def pod_template(template: Mapping, job_name: str, job_uid: str, index: int | None,
                 gang: bool = False) -> tuple[dict, dict, dict]:
    """(labels, annotations, spec) of one of a Job's pods: the Job's labels and, in Indexed
    mode, its index as an annotation and ``JOB_COMPLETION_INDEX`` in every container. With
    ``gang`` the pods form a pod group (Kueue's label), admitted all or none."""
    meta = template.get("metadata") or {}
    labels = {**(meta.get("labels") or {}), "batch.kubernetes.io/job-name": job_name, "job-name": job_name,
              "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid}
    if gang:
        labels.setdefault(GANG_LABEL, job_name)
    annotations = dict(meta.get("annotations") or {})
    spec = dict(template.get("spec") or {})
    if index is not None:
        annotations[INDEX_ANNOTATION] = str(index)
        labels[INDEX_ANNOTATION] = str(index)
        spec["containers"] = [{**c, "env": [*(e for e in c.get("env") or () if e.get("name") != INDEX_ENV),
                                            {"name": INDEX_ENV, "value": str(index)}]}
                              for c in spec.get("containers") or ()]
    return labels, annotations, spec
