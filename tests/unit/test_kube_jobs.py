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
