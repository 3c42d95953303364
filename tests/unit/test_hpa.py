"""The HorizontalPodAutoscaler as Kubernetes computes it: the examples of the Kubernetes docs,
the tolerance, stabilisation against flapping, scale-rate policies and the conservative
handling of missing metrics."""

from hypothesis import given, strategies as st

from shoal.kube.hpa import HPAState, default_behavior, desired_replicas, stamp_conditions

T0 = 1_764_700_000.0


def cpu(target=50):
    return {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                       "averageUtilization": target}}}


def pods_metric(name="requests_per_second", value="10"):
    return {"type": "Pods", "pods": {"metric": {"name": name}, "target": {"type": "AverageValue",
                                                                          "averageValue": value}}}


def hpa(*metrics, min_replicas=1, max_replicas=10, behavior=None):
    spec = {"scaleTargetRef": {"kind": "Deployment", "name": "llm"}, "minReplicas": min_replicas,
            "maxReplicas": max_replicas, "metrics": list(metrics) or [cpu()]}
    if behavior is not None:
        spec["behavior"] = behavior
    return spec


def conditions(result):
    return {c["type"]: (c["status"], c["reason"]) for c in result.conditions}


NO_WINDOW = {"scaleDown": {"stabilizationWindowSeconds": 0}}


# -- the algorithm ---------------------------------------------------------------------------

def test_cpu_at_twice_the_target_doubles_the_replicas():
    r = desired_replicas(hpa(cpu(50)), 3, {"cpu": [100.0, 100.0, 100.0]}, HPAState(), T0)
    assert (r.replicas, r.rescale) == (6, True)
    assert r.reason == "cpu resource utilization (percentage of request) above target"
    assert conditions(r) == {"AbleToScale": ("True", "SucceededRescale"), "ScalingActive": ("True", "ValidMetricFound"),
                             "ScalingLimited": ("False", "DesiredWithinRange")}
    assert r.current_metrics == ({"type": "Resource", "resource": {"name": "cpu",
                                                                   "current": {"averageUtilization": 100}}},)


def test_the_kubernetes_docs_example_200m_for_100m_doubles():
    r = desired_replicas(hpa(pods_metric("inflight_requests", "100m")), 2, {"inflight_requests": [0.2, 0.2]},
                         HPAState(), T0)
    assert r.replicas == 4


def test_within_ten_percent_of_the_target_nothing_changes():
    r = desired_replicas(hpa(cpu(50)), 3, {"cpu": [53.0, 54.0, 55.0]}, HPAState(), T0)  # 54%: ratio 1.08
    assert (r.replicas, r.rescale, r.reason) == (3, False, "")
    assert conditions(r)["AbleToScale"] == ("True", "ReadyForNewScale")
    r = desired_replicas(hpa(cpu(50)), 3, {"cpu": [56.0, 56.0, 56.0]}, HPAState(), T0)  # ratio 1.12
    assert r.replicas == 4  # ceil(3 x 1.12)


def test_a_configured_tolerance_replaces_the_default():
    spec = hpa(cpu(50), behavior={"scaleUp": {"tolerance": "0.2"}})
    assert desired_replicas(spec, 3, {"cpu": [58.0] * 3}, HPAState(), T0).replicas == 3  # 1.16 < 1.2
    assert desired_replicas(spec, 3, {"cpu": [62.0] * 3}, HPAState(), T0).replicas == 4


def test_utilisation_is_truncated_to_a_whole_percent_as_kubernetes_does():
    # 54.9% -> 54%: ratio 1.08, within the tolerance (55% would be 1.1, still within)
    assert desired_replicas(hpa(cpu(50)), 2, {"cpu": [54.9, 54.9]}, HPAState(), T0).replicas == 2


def test_the_largest_proposal_of_several_metrics_wins():
    r = desired_replicas(hpa(cpu(50), pods_metric("requests_per_second", "10")), 2,
                         {"cpu": [100.0, 100.0], "requests_per_second": [30.0, 30.0]}, HPAState(), T0)
    assert r.replicas == 6
    assert r.reason == "pods metric requests_per_second above target"
    assert len(r.current_metrics) == 2
    assert r.current_metrics[1] == {"type": "Pods", "pods": {"metric": {"name": "requests_per_second"},
                                                             "current": {"averageValue": "30"}}}


def test_metric_aliases_read_the_gateways_figures():
    spec = hpa(pods_metric("http_requests_per_second", "10"), pods_metric("queue_depth", "2"))
    r = desired_replicas(spec, 2, {"requests_per_second": [10.0, 10.0], "inflight_requests": [4.0, 4.0]},
                         HPAState(), T0)
    assert r.replicas == 4
    assert r.reason == "pods metric queue_depth above target"


def test_gpu_utilisation_as_a_pods_metric():
    spec = hpa(pods_metric("DCGM_FI_DEV_GPU_UTIL", "60"))
    assert desired_replicas(spec, 4, {"DCGM_FI_DEV_GPU_UTIL": [90.0, 90.0, 90.0, 90.0]}, HPAState(), T0).replicas == 6


def test_external_and_object_metrics():
    external = {"type": "External", "external": {"metric": {"name": "queue_messages"},
                                                 "target": {"type": "Value", "value": "100"}}}
    assert desired_replicas(hpa(external), 2, {"queue_messages": 250.0}, HPAState(), T0).replicas == 5
    per_pod = {"type": "Object", "object": {"describedObject": {"kind": "Service", "name": "llm"},
                                            "metric": {"name": "held_requests"},
                                            "target": {"type": "AverageValue", "averageValue": "10"}}}
    r = desired_replicas(hpa(per_pod), 2, {"held_requests": 55.0}, HPAState(), T0)
    assert r.replicas == 6  # ceil(55 / 10)
    assert r.current_metrics[0]["object"]["describedObject"] == {"kind": "Service", "name": "llm"}


# -- missing metrics -------------------------------------------------------------------------

def test_pods_without_a_sample_are_at_target_on_a_scale_down():
    # 10% on one pod would say 1 replica; two pods without samples count as 100%: 70% -> not down
    r = desired_replicas(hpa(cpu(50), behavior=NO_WINDOW), 3, {"cpu": [10.0, None, None]}, HPAState(), T0)
    assert r.replicas == 3


def test_pods_without_a_sample_are_idle_on_a_scale_up():
    r = desired_replicas(hpa(cpu(50)), 2, {"cpu": [200.0, None]}, HPAState(), T0)
    assert r.replicas == 4  # (200 + 0) / 2 = 100% of 50% -> 2 x 2


def test_unready_pods_hold_a_cpu_scale_up_back():
    r = desired_replicas(hpa(cpu(100)), 2, {"cpu": [200.0]}, HPAState(), T0, unready_pods=1)
    assert r.replicas == 2  # the starting pod counts as idle: (200 + 0) / 2 = 100%


def test_a_missing_metric_never_lets_the_hpa_scale_down():
    spec = hpa(cpu(50), pods_metric("requests_per_second", "10"), behavior=NO_WINDOW)
    r = desired_replicas(spec, 4, {"cpu": [10.0] * 4}, HPAState(), T0)
    assert (r.replicas, r.rescale) == (4, False)
    assert conditions(r)["ScalingActive"] == ("False", "FailedGetPodsMetric")
    # ... but the metrics that work may still scale it up
    r = desired_replicas(spec, 4, {"cpu": [100.0] * 4}, HPAState(), T0)
    assert r.replicas == 8
    assert conditions(r)["ScalingActive"] == ("True", "ValidMetricFound")


def test_no_metric_at_all_changes_nothing_and_says_why():
    r = desired_replicas(hpa(cpu(50)), 3, {}, HPAState(), T0)
    assert (r.replicas, r.rescale) == (3, False)
    status, reason = conditions(r)["ScalingActive"]
    assert (status, reason) == ("False", "FailedGetResourceMetric")
    assert r.state == HPAState()
    r = desired_replicas(hpa(cpu(50)), 3, {"cpu": [None, None, None]}, HPAState(), T0)
    assert conditions(r)["ScalingActive"][1] == "FailedGetResourceMetric"
    assert "did not receive metrics" in r.conditions[1]["message"]


def test_a_target_scaled_to_zero_disables_the_hpa():
    r = desired_replicas(hpa(cpu(50)), 0, {"cpu": []}, HPAState(), T0)
    assert (r.replicas, r.rescale) == (0, False)
    assert conditions(r)["ScalingActive"] == ("False", "ScalingDisabled")


def test_min_replicas_zero_scales_an_idle_target_to_zero_and_stays_there():
    idle = {"inflight_requests": [0.0, 0.0]}
    r = desired_replicas(hpa(pods_metric("inflight_requests", "1"), min_replicas=0, behavior=NO_WINDOW), 2, idle,
                         HPAState(), T0)
    assert (r.replicas, r.rescale, r.reason) == (0, True, "All metrics below target")
    r = desired_replicas(hpa(pods_metric("inflight_requests", "1"), min_replicas=0), 0, {"inflight_requests": []},
                         r.state, T0 + 30)
    assert (r.replicas, r.rescale) == (0, False)
    assert conditions(r)["ScalingActive"] == ("False", "ScaledToZero")


def test_min_replicas_zero_still_keeps_a_busy_target_up():
    busy = {"inflight_requests": [0.5, 0.5]}
    r = desired_replicas(hpa(pods_metric("inflight_requests", "1"), min_replicas=0, behavior=NO_WINDOW), 2, busy,
                         HPAState(), T0)
    assert r.replicas == 1


# -- min and max -----------------------------------------------------------------------------

def test_the_desired_count_is_clamped_to_max_replicas():
    r = desired_replicas(hpa(cpu(10), max_replicas=5), 4, {"cpu": [100.0] * 4}, HPAState(), T0)
    assert r.replicas == 5
    assert conditions(r)["ScalingLimited"] == ("True", "TooManyReplicas")


def test_the_desired_count_is_clamped_to_min_replicas():
    r = desired_replicas(hpa(cpu(50), min_replicas=2, behavior=NO_WINDOW), 4, {"cpu": [1.0] * 4}, HPAState(), T0)
    assert r.replicas == 2
    assert conditions(r)["ScalingLimited"] == ("True", "TooFewReplicas")


def test_a_target_outside_the_range_is_brought_inside_at_once():
    r = desired_replicas(hpa(cpu(50), min_replicas=3), 1, {}, HPAState(), T0)
    assert (r.replicas, r.reason) == (3, "Current number of replicas below Spec.MinReplicas")
    r = desired_replicas(hpa(cpu(50), max_replicas=4), 9, {}, HPAState(), T0)
    assert (r.replicas, r.reason) == (4, "Current number of replicas above Spec.MaxReplicas")


# -- behavior --------------------------------------------------------------------------------

def test_the_scale_down_window_prevents_flapping():
    spec = hpa(cpu(50), max_replicas=20)
    state, now = HPAState(), T0
    r = desired_replicas(spec, 4, {"cpu": [100.0] * 4}, state, now)
    assert r.replicas == 8
    replicas, state = r.replicas, r.state
    seen = []
    for step in range(1, 25):  # the load falls away at once and stays low, checked every 15 s
        now = T0 + 15 * step
        r = desired_replicas(spec, replicas, {"cpu": [5.0] * replicas}, state, now)
        replicas, state = r.replicas, r.state
        seen.append((now - T0, replicas, conditions(r)["AbleToScale"][1]))
    assert all(n == 8 for t, n, _ in seen if t < 300)
    assert all(reason == "ScaleDownStabilized" for t, _, reason in seen if t < 300)
    assert [n for t, n, _ in seen if t >= 300][0] == 1  # 300 s after the last high recommendation


def test_a_new_hpa_waits_one_window_before_scaling_down():
    spec = hpa(cpu(50))
    r = desired_replicas(spec, 6, {"cpu": [5.0] * 6}, HPAState(), T0)
    assert r.replicas == 6
    r = desired_replicas(spec, 6, {"cpu": [5.0] * 6}, r.state, T0 + 301)
    assert r.replicas == 1


def test_a_scale_up_window_takes_the_lowest_recent_recommendation():
    spec = hpa(cpu(50), max_replicas=20, behavior={"scaleUp": {"stabilizationWindowSeconds": 60}})
    r = desired_replicas(spec, 4, {"cpu": [50.0] * 4}, HPAState(), T0)
    r = desired_replicas(spec, 4, {"cpu": [100.0] * 4}, r.state, T0 + 15)  # a spike
    assert (r.replicas, conditions(r)["AbleToScale"][1]) == (4, "ScaleUpStabilized")
    r = desired_replicas(spec, 4, {"cpu": [100.0] * 4}, r.state, T0 + 61)
    assert r.replicas == 8


def test_the_default_scale_up_adds_four_pods_or_doubles_per_15_seconds():
    spec = hpa(cpu(10), max_replicas=100)
    load = {"cpu": [500.0] * 2}  # wants 100
    r = desired_replicas(spec, 2, load, HPAState(), T0)
    assert r.replicas == 6  # max(2 + 4 pods, 2 x 2)
    assert conditions(r)["ScalingLimited"] == ("True", "ScaleUpLimit")
    r2 = desired_replicas(spec, 6, {"cpu": [500.0] * 6}, r.state, T0 + 5)
    assert (r2.replicas, r2.rescale) == (6, False)  # the 15 s period that allowed +4 is not over
    r3 = desired_replicas(spec, 6, {"cpu": [500.0] * 6}, r2.state, T0 + 16)
    assert r3.replicas == 12  # max(6 + 4, 6 x 2)


def test_a_pods_policy_alone_limits_to_its_count_per_period():
    spec = hpa(cpu(10), max_replicas=100, behavior={"scaleUp": {
        "policies": [{"type": "Pods", "value": 4, "periodSeconds": 60}]}})
    r = desired_replicas(spec, 10, {"cpu": [100.0] * 10}, HPAState(), T0)
    assert r.replicas == 14
    r = desired_replicas(spec, 14, {"cpu": [100.0] * 14}, r.state, T0 + 30)
    assert r.replicas == 14
    r = desired_replicas(spec, 14, {"cpu": [100.0] * 14}, r.state, T0 + 61)
    assert r.replicas == 18


def test_a_percent_policy_halves_at_most_per_minute():
    spec = hpa(cpu(50), max_replicas=20, behavior={"scaleDown": {
        "stabilizationWindowSeconds": 0, "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]}})
    r = desired_replicas(spec, 10, {"cpu": [1.0] * 10}, HPAState(), T0)
    assert r.replicas == 5
    assert conditions(r)["ScalingLimited"] == ("True", "ScaleDownLimit")
    r = desired_replicas(spec, 5, {"cpu": [1.0] * 5}, r.state, T0 + 30)
    assert r.replicas == 5  # the minute that took 5 away is not over
    r = desired_replicas(spec, 5, {"cpu": [1.0] * 5}, r.state, T0 + 61)
    assert r.replicas == 2  # int(5 x 0.5): a percentage scale-down rounds down


def test_select_policy_min_takes_the_smallest_change():
    spec = hpa(cpu(10), max_replicas=100, behavior={"scaleUp": {"selectPolicy": "Min"}})
    assert desired_replicas(spec, 10, {"cpu": [100.0] * 10}, HPAState(), T0).replicas == 14  # min(+4, x2)
    spec = hpa(cpu(10), max_replicas=100)
    assert desired_replicas(spec, 10, {"cpu": [100.0] * 10}, HPAState(), T0).replicas == 20  # max(+4, x2)


def test_disabled_scale_down_never_scales_down():
    spec = hpa(cpu(50), behavior={"scaleDown": {"selectPolicy": "Disabled", "stabilizationWindowSeconds": 0}})
    r = desired_replicas(spec, 8, {"cpu": [1.0] * 8}, HPAState(), T0)
    assert (r.replicas, r.rescale) == (8, False)
    assert conditions(r)["ScalingLimited"] == ("True", "ScaleDownLimit")
    up = desired_replicas(spec, 2, {"cpu": [100.0] * 2}, HPAState(), T0)
    assert up.replicas == 4  # scaling up still works


def test_disabled_scale_up_never_scales_up():
    spec = hpa(cpu(50), behavior={"scaleUp": {"selectPolicy": "Disabled"}})
    assert desired_replicas(spec, 2, {"cpu": [100.0] * 2}, HPAState(), T0).replicas == 2


def test_default_behavior_fills_only_what_is_missing():
    assert default_behavior(None)["scaleDown"]["stabilizationWindowSeconds"] == 300
    b = default_behavior({"scaleUp": {"stabilizationWindowSeconds": 30}})
    assert b["scaleUp"] == {"stabilizationWindowSeconds": 30, "selectPolicy": "Max",
                            "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                         {"type": "Percent", "value": 100, "periodSeconds": 15}]}


# -- state -----------------------------------------------------------------------------------

def test_state_survives_a_server_restart_as_json():
    r = desired_replicas(hpa(cpu(10), max_replicas=50), 2, {"cpu": [100.0] * 2}, HPAState(), T0)
    stored = r.state.to_dict()
    # the window starts with the count the HPA found, then its (unlimited) recommendation
    assert stored == {"recommendations": [[T0, 2], [T0, 20]], "scaleUpEvents": [[T0, 4]], "scaleDownEvents": []}
    assert HPAState.from_dict(stored) == r.state
    assert HPAState.from_dict(None) == HPAState()


def test_old_history_is_forgotten():
    state = HPAState()
    for i in range(100):
        state = desired_replicas(hpa(cpu(50)), 3, {"cpu": [50.0] * 3}, state, T0 + 15 * i).state
    assert len(state.recommendations) <= 21  # the 300 s window at one pass per 15 s


def test_stamp_conditions_keeps_the_transition_time_of_an_unchanged_status():
    before = [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
               "lastTransitionTime": "2026-12-02T19:00:00Z"}]
    after = [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale", "message": "m"},
             {"type": "ScalingActive", "status": "False", "reason": "FailedGetResourceMetric", "message": "m"}]
    stamped = stamp_conditions(before, after, "2026-12-02T19:05:00Z")
    assert [c["lastTransitionTime"] for c in stamped] == ["2026-12-02T19:00:00Z", "2026-12-02T19:05:00Z"]


@given(current=st.integers(1, 30), load=st.lists(st.floats(0, 1000), min_size=1, max_size=30),
       min_r=st.integers(1, 5), span=st.integers(0, 30))
def test_the_result_always_lies_between_min_and_max(current, load, min_r, span):
    max_r = min_r + span
    r = desired_replicas(hpa(cpu(60), min_replicas=min_r, max_replicas=max_r), current, {"cpu": load},
                         HPAState(), T0)
    if min_r <= current <= max_r:
        assert min_r <= r.replicas <= max_r
    else:
        assert r.replicas == min(max(current, min_r), max_r)
