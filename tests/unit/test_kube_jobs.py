"""The Job controller's sync as a pure function: what it creates, when it completes or fails."""

from __future__ import annotations

from shoal.kube.jobs import JobPod, index_text, plan_job, pod_template

NOW = "2026-01-01T00:00:00Z"
INDEXED = {"completions": 4, "parallelism": 2, "completionMode": "Indexed", "backoffLimit": 1}


def test_indexed_job_starts_missing_indexes_up_to_parallelism():
    plan = plan_job(INDEXED, [], {}, NOW)
    assert plan.create == [0, 1] and plan.status["active"] == 2 and plan.status["startTime"] == NOW
    pods = [JobPod("a", "Succeeded", 0), JobPod("b", "Failed", 1), JobPod("c", "Active", 2)]
    plan = plan_job(INDEXED, pods, {"startTime": NOW}, NOW)
    assert plan.create == [1]  # index 1 failed once: retried; 3 waits for room
    assert (plan.status["succeeded"], plan.status["failed"], plan.status["completedIndexes"]) == (1, 1, "0")


def test_disrupted_pods_are_retried_without_counting_and_completion_is_stamped_once():
    pods = [JobPod(str(i), "Succeeded", i) for i in range(3)] + [JobPod("p", "Disrupted", 3)]
    plan = plan_job(INDEXED, pods, {}, NOW)
    assert plan.create == [3] and plan.status["failed"] == 0
    pods.append(JobPod("q", "Succeeded", 3))
    plan = plan_job(INDEXED, pods, {}, NOW)
    assert [c["type"] for c in plan.status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert plan.status["completionTime"] == NOW and plan.events == [("Normal", "Completed", "Job completed")]
    again = plan_job(INDEXED, pods, plan.status, "later")
    assert again.status == plan.status and again.events == [] and again.create == []


def test_backoff_limit_fails_the_job_and_stops_its_pods():
    spec = {"completions": 3, "parallelism": 3, "backoffLimit": 1}
    pods = [JobPod("a", "Failed"), JobPod("b", "Failed"), JobPod("c", "Active")]
    plan = plan_job(spec, pods, {}, NOW)
    assert plan.delete == ["c"] and plan.create == []
    assert plan.status["conditions"][-1]["type"] == "Failed"
    assert plan.status["conditions"][-1]["reason"] == "BackoffLimitExceeded"
    assert plan_job(spec, pods[:1] + pods[2:], {}, NOW).create == [None, None]  # one failure is within the limit


def test_pods_get_their_index_and_the_jobs_labels():
    template = {"metadata": {"labels": {"app": "ft"}},
                "spec": {"containers": [{"name": "t", "env": [{"name": "JOB_COMPLETION_INDEX", "value": "x"}]}]}}
    labels, annotations, spec = pod_template(template, "ft", "uid-1", 2)
    assert labels["job-name"] == "ft" and labels["batch.kubernetes.io/controller-uid"] == "uid-1"
    assert annotations == {"batch.kubernetes.io/job-completion-index": "2"}
    assert spec["containers"][0]["env"] == [{"name": "JOB_COMPLETION_INDEX", "value": "2"}]
    assert index_text([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


POLICY = {"completions": 2, "parallelism": 2, "backoffLimit": 3, "podFailurePolicy": {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
    {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}


def test_pod_failure_policy_fails_the_job_ignores_or_counts_as_its_rules_say():
    ignored = [JobPod("a", "Failed", exit_code=137, container="main"), JobPod("b", "Active")]
    plan = plan_job(POLICY, ignored, {}, NOW)
    assert plan.status["failed"] == 0 and plan.create == [None]
    counted = [JobPod("a", "Failed", exit_code=1, container="main"), JobPod("d", "Disrupted"), JobPod("b", "Active")]
    assert plan_job(POLICY, counted, {}, NOW).status["failed"] == 2  # no rule for 1: counted; DisruptionTarget: Count
    fatal = [JobPod("x", "Failed", exit_code=42, container="main", namespace="ml"), JobPod("b", "Active")]
    plan = plan_job(POLICY, fatal, {}, NOW)
    failed = plan.status["conditions"][-1]
    assert (failed["type"], failed["reason"]) == ("Failed", "PodFailurePolicy")
    assert failed["message"] == "Container main for pod ml/x failed with exit code 42 matching FailJob rule at index 0"
    assert plan.delete == ["b"]
    other = [JobPod("x", "Failed", exit_code=42, container="sidecar")]  # the rule names container main
    assert plan_job(POLICY, other, {}, NOW).status.get("conditions") is None


def test_active_deadline_fails_a_job_that_runs_too_long():
    spec = {"completions": 1, "activeDeadlineSeconds": 60}
    plan = plan_job(spec, [JobPod("a", "Active")], {"startTime": "2026-01-01T00:00:00Z"}, "2026-01-01T00:00:59Z")
    assert plan.delete == [] and "conditions" not in plan.status
    plan = plan_job(spec, [JobPod("a", "Active")], {"startTime": "2026-01-01T00:00:00Z"}, "2026-01-01T00:01:00Z")
    assert plan.delete == ["a"] and plan.status["conditions"][-1]["reason"] == "DeadlineExceeded"
    assert plan.events == [("Warning", "DeadlineExceeded", "Job was active longer than specified deadline")]


def test_a_suspended_job_runs_no_pods_and_resuming_restarts_its_clock():
    spec = {"completions": 2, "parallelism": 2, "suspend": True}
    plan = plan_job(spec, [JobPod("a", "Active")], {"startTime": NOW}, NOW)
    assert plan.delete == ["a"] and plan.create == [] and "startTime" not in plan.status
    assert [(c["type"], c["status"], c["reason"]) for c in plan.status["conditions"]] == [
        ("Suspended", "True", "JobSuspended")]
    assert plan_job(spec, [], plan.status, "later").events == []  # said once
    resumed = plan_job({**spec, "suspend": False}, [JobPod("a", "Disrupted")], plan.status, "2026-01-02T00:00:00Z")
    assert resumed.create == [None, None] and resumed.status["startTime"] == "2026-01-02T00:00:00Z"
    assert [(c["type"], c["status"], c["reason"]) for c in resumed.status["conditions"]] == [
        ("Suspended", "False", "JobResumed")]
    assert resumed.status["failed"] == 0  # the pods a suspension stopped are no failures


def test_a_finished_job_is_deleted_after_its_ttl():
    spec = {"completions": 1, "ttlSecondsAfterFinished": 30}
    done = plan_job(spec, [JobPod("a", "Succeeded")], {}, "2026-01-01T00:00:00Z")
    assert not done.delete_job
    assert not plan_job(spec, [JobPod("a", "Succeeded")], done.status, "2026-01-01T00:00:29Z").delete_job
    assert plan_job(spec, [JobPod("a", "Succeeded")], done.status, "2026-01-01T00:00:30Z").delete_job


PER_INDEX = {"completions": 4, "parallelism": 4, "completionMode": "Indexed", "backoffLimitPerIndex": 1}


def test_backoff_limit_per_index_gives_up_on_an_index_and_fails_the_job_once_the_rest_are_done():
    pods = [JobPod("a0", "Failed", 0), JobPod("b0", "Failed", 0), JobPod("a1", "Failed", 1),
            JobPod("c2", "Active", 2), JobPod("d3", "Succeeded", 3)]
    plan = plan_job(PER_INDEX, pods, {}, NOW)
    # index 0 failed twice (over its limit of 1): not retried; index 1 once: retried
    assert plan.create == [1] and plan.status["failedIndexes"] == "0" and plan.status["failed"] == 3
    assert not any(c["type"] == "Failed" for c in plan.status.get("conditions", []))
    pods = [p for p in pods if p.name != "c2"] + [JobPod("c2", "Succeeded", 2), JobPod("e1", "Succeeded", 1)]
    plan = plan_job(PER_INDEX, pods, {}, NOW)
    failed = plan.status["conditions"][-1]
    assert (failed["type"], failed["reason"], failed["message"]) == ("Failed", "FailedIndexes", "Job has failed indexes")
    assert plan.status["completedIndexes"] == "1-3" and plan.status["failedIndexes"] == "0"


def test_max_failed_indexes_fails_the_job_at_once_and_a_fail_index_rule_skips_the_retries():
    spec = {**PER_INDEX, "backoffLimitPerIndex": 3, "maxFailedIndexes": 1,
            "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]}}
    one = [JobPod("a0", "Failed", 0, exit_code=42, container="main")]
    plan = plan_job(spec, one + [JobPod("b1", "Failed", 1, exit_code=1, container="main")], {}, NOW)
    assert plan.status["failedIndexes"] == "0" and sorted(plan.create) == [1, 2, 3]  # 1 retried, 0 not
    two = one + [JobPod("b1", "Failed", 1, exit_code=42, container="main"), JobPod("c2", "Active", 2)]
    plan = plan_job(spec, two, {}, NOW)
    failed = plan.status["conditions"][-1]
    assert (failed["reason"], failed["message"]) == ("MaxFailedIndexesExceeded",
                                                     "Job has exceeded the specified maximal number of failed indexes")
    assert plan.delete == ["c2"] and plan.create == []


def test_without_a_per_index_limit_the_backoff_limit_defaults_to_none_only_with_one():
    from shoal.kube.jobs import settings
    assert settings({"completions": 2})[3] == 6
    assert settings({"completions": 2, "completionMode": "Indexed", "backoffLimitPerIndex": 0})[3] == 2**31 - 1
