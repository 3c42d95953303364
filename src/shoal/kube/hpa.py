"""HorizontalPodAutoscaler (autoscaling/v2) as the Kubernetes HPA controller computes it, as
one pure function: :func:`desired_replicas`.

Per metric, desired = ceil(ready pods x current / target), unchanged while the ratio is
within the tolerance (0.1); pods without a sample count as at target on a scale-down and as
idle on a scale-up, so a missing sample never makes the HPA over-react; the largest proposal
wins, and when a metric cannot be read at all the HPA never scales down. Then ``behavior``:
the stabilisation windows (scale down to the highest recommendation of the last
``scaleDown.stabilizationWindowSeconds``, up to the lowest of ``scaleUp``'s), the rate
policies over the recent scale events, ``selectPolicy``, and min/max replicas.

The history Kubernetes keeps in the controller's memory (recommendations, scale events) is
an immutable :class:`HPAState` passed in and returned, so the server can store it and a
restart loses nothing. Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

from shoal.model.quantity import parse_decimal

TOLERANCE = 0.1
# Pods metrics Shoal measures: the gateway's per-pod figures (two names each) and GPU utilisation.
METRIC_ALIASES = {"http_requests_per_second": "requests_per_second", "queue_depth": "inflight_requests"}
POD_METRICS = ("requests_per_second", "inflight_requests", *METRIC_ALIASES, "DCGM_FI_DEV_GPU_UTIL")
DEFAULT_SCALE_UP = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                                 {"type": "Percent", "value": 100, "periodSeconds": 15}]}
DEFAULT_SCALE_DOWN = {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                      "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}
DEFAULT_METRICS = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                            "averageUtilization": 80}}}]

MetricValues = Sequence[float | None] | float


def default_behavior(behavior: Mapping | None) -> dict:
    """``behavior`` with Kubernetes' defaults in every field left out (scaleUp: no
    stabilisation, 4 pods or 100% per 15 s, Max; scaleDown: 300 s, 100% per 15 s, Max)."""
    behavior = behavior or {}
    out = {}
    for direction, defaults in (("scaleUp", DEFAULT_SCALE_UP), ("scaleDown", DEFAULT_SCALE_DOWN)):
        rules = dict(behavior.get(direction) or {})
        for key, value in defaults.items():
            if rules.get(key) is None:
                rules[key] = [dict(p) for p in value] if key == "policies" else value
        out[direction] = rules
    return out


@dataclass(frozen=True)
class HPAState:
    """What the HPA remembers between passes: its unstabilised recommendations and the scale
    events of the last policy periods, each as (time, replicas)."""

    recommendations: tuple[tuple[float, int], ...] = ()
    scale_up_events: tuple[tuple[float, int], ...] = ()  # (time, pods added)
    scale_down_events: tuple[tuple[float, int], ...] = ()  # (time, pods removed)

    def to_dict(self) -> dict:
        return {"recommendations": [list(r) for r in self.recommendations],
                "scaleUpEvents": [list(e) for e in self.scale_up_events],
                "scaleDownEvents": [list(e) for e in self.scale_down_events]}

    @classmethod
    def from_dict(cls, data: Mapping | None) -> HPAState:
        data = data or {}

        def pairs(key: str) -> tuple[tuple[float, int], ...]:
            return tuple((float(t), int(n)) for t, n in data.get(key) or ())

        return cls(pairs("recommendations"), pairs("scaleUpEvents"), pairs("scaleDownEvents"))


@dataclass(frozen=True)
class HPAResult:
    replicas: int  # what the target's replicas should be now
    rescale: bool  # replicas differs from the current count
    reason: str  # why it rescales, in the HPA's words ("" when it does not)
    conditions: tuple[dict, ...]  # AbleToScale, ScalingActive, ScalingLimited: type, status, reason, message
    current_metrics: tuple[dict, ...]  # status.currentMetrics
    state: HPAState  # to pass to the next call (it assumes ``replicas`` is applied)


class _MetricError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


def desired_replicas(spec: Mapping, current_replicas: int, metrics: Mapping[str, MetricValues],
                     state: HPAState, now: float, *, ready_pods: int | None = None,
                     unready_pods: int = 0) -> HPAResult:
    """One HPA pass over the target's ``current_replicas``.

    ``metrics`` by name: a Resource metric (``cpu``) and a Pods metric (``requests_per_second``
    …) are per-pod samples of the target's ready pods, ``None`` for a pod with no sample
    yet; Resource samples are utilisation in percent of the pod's request. Object and
    External metrics are one value. ``ready_pods`` (default ``current_replicas``) scales
    Object/External Value targets; ``unready_pods`` holds cpu scale-ups back as Kubernetes
    does for pods still starting.
    """
    min_r, max_r = int(spec.get("minReplicas", 1)), int(spec["maxReplicas"])
    behavior = default_behavior(spec.get("behavior"))
    tol = (_tolerance(behavior["scaleUp"]), _tolerance(behavior["scaleDown"]))
    conds: dict[str, dict] = {}

    def cond(kind: str, status: str, reason: str, message: str) -> None:
        conds[kind] = {"type": kind, "status": status, "reason": reason, "message": message}

    cond("AbleToScale", "True", "SucceededGetScale", "the HPA controller was able to get the target's current scale")
    statuses: list[dict] = []
    reason = ""
    if current_replicas == 0 and min_r != 0:
        cond("ScalingActive", "False", "ScalingDisabled", "scaling is disabled since the replica count of the "
                                                          "target is zero")
        return HPAResult(0, False, "", tuple(conds.values()), (), state)
    if current_replicas == 0:
        # Scaled to zero on purpose: no pod measures anything; a request held at a gateway
        # brings the first replica back (the controller does that before asking here).
        cond("ScalingActive", "False", "ScaledToZero", "the target is scaled to zero; a request waiting at "
                                                       "the gateway for one of its Services scales it up")
        return HPAResult(0, False, "", tuple(conds.values()), (), state)
    if current_replicas > max_r:
        desired, reason = max_r, "Current number of replicas above Spec.MaxReplicas"
    elif current_replicas < min_r:
        desired, reason = min_r, "Current number of replicas below Spec.MinReplicas"
    else:
        specs = spec.get("metrics") or DEFAULT_METRICS
        proposal, metric_name, invalid, first_error = 0, "", 0, None
        ready = current_replicas if ready_pods is None else ready_pods
        for m in specs:
            try:
                count, name, status = _metric_replicas(m, current_replicas, metrics, tol, ready, unready_pods)
            except _MetricError as e:
                invalid += 1
                first_error = first_error or e
                continue
            statuses.append(status)
            if proposal == 0 or count > proposal:
                proposal, metric_name = count, name
        if invalid >= len(specs) or (invalid and proposal < current_replicas):
            cond("ScalingActive", "False", first_error.reason, first_error.message)
            return HPAResult(current_replicas, False, "", tuple(conds.values()), tuple(statuses), state)
        cond("ScalingActive", "True", "ValidMetricFound",
             f"the HPA was able to successfully calculate a replica count from {metric_name}")
        desired = max(0, proposal)
        if desired > current_replicas:
            reason = f"{metric_name} above target"
        elif desired < current_replicas:
            reason = "All metrics below target"
        desired, state = _normalize(desired, current_replicas, min_r, max_r, behavior, state, now, cond)
    rescale = desired != current_replicas
    if rescale:
        cond("AbleToScale", "True", "SucceededRescale",
             f"the HPA controller was able to update the target scale to {desired}")
        state = _record_scale(state, behavior, current_replicas, desired, now)
    else:
        reason = ""
    return HPAResult(desired, rescale, reason, tuple(conds.values()), tuple(statuses), state)


def stamp_conditions(previous: Iterable[Mapping], conditions: Iterable[Mapping], now_text: str) -> list[dict]:
    """``conditions`` with ``lastTransitionTime``: kept from ``previous`` when a condition's
    status did not change, ``now_text`` otherwise."""
    before = {c.get("type"): c for c in previous}
    out = []
    for c in conditions:
        old = before.get(c["type"])
        keep = old is not None and old.get("status") == c["status"] and old.get("lastTransitionTime")
        out.append({**c, "lastTransitionTime": old["lastTransitionTime"] if keep else now_text})
    return out


# -- per metric ------------------------------------------------------------------------------

def _metric_replicas(m: Mapping, current: int, metrics: Mapping[str, MetricValues], tol: tuple[float, float],
                     ready: int, unready: int) -> tuple[int, str, dict]:
    kind = m.get("type")
    if kind == "Resource":
        src = m["resource"]
        name, target = src["name"], src["target"]
        if target.get("type") != "Utilization":
            raise _MetricError("FailedGetResourceMetric", f"the HPA was unable to compute the replica count: Shoal "
                                                          f"measures {name} as utilization of requests")
        values = _samples(metrics, name, "FailedGetResourceMetric", f"resource {name}")
        goal = int(target["averageUtilization"])
        count, utilization = _per_pod(values, goal, current, tol, unready if name == "cpu" else 0,
                                      lambda vals: int(sum(vals) / len(vals)), lambda ratio: max(100, goal))
        status = {"type": "Resource", "resource": {"name": name, "current": {"averageUtilization": utilization}}}
        return count, f"{name} resource utilization (percentage of request)", status
    if kind == "Pods":
        src = m["pods"]
        name = src["metric"]["name"]
        values = _samples(metrics, name, "FailedGetPodsMetric", f"pods metric {name}")
        goal = _milli(src["target"].get("averageValue"))
        milli = [None if v is None else int(round(v * 1000)) for v in values]
        count, usage = _per_pod(milli, goal, current, tol, 0, lambda vals: sum(vals) // len(vals), lambda ratio: goal)
        status = {"type": "Pods", "pods": {"metric": {"name": name}, "current": {"averageValue": _quantity(usage)}}}
        return count, f"pods metric {name}", status
    if kind in ("Object", "External"):
        member = kind.lower()
        src = m[member]
        name, target = src["metric"]["name"], src["target"]
        raw = metrics.get(name, metrics.get(METRIC_ALIASES.get(name, name)))
        if raw is None:
            raise _MetricError(f"FailedGet{kind}Metric", f"the HPA was unable to compute the replica count: unable "
                                                         f"to get {member} metric {name}")
        usage = int(round(1000 * (sum(v for v in raw if v is not None) if isinstance(raw, Sequence) else raw)))
        current_status: dict[str, Any]
        if target.get("type") == "AverageValue":
            goal = _milli(target.get("averageValue"))
            ratio = usage / (goal * current) if current else math.inf
            count = current if _within(ratio, tol) else math.ceil(usage / goal)
            current_status = {"averageValue": _quantity(math.ceil(usage / current) if current else usage)}
        else:
            goal = _milli(target.get("value"))
            ratio = usage / goal
            if current == 0:
                count = math.ceil(ratio)
            else:
                count = current if _within(ratio, tol) else math.ceil(ratio * ready)
            current_status = {"value": _quantity(usage)}
        status = {"type": kind, member: {"metric": {"name": name}, "current": current_status}}
        if kind == "Object":
            status[member]["describedObject"] = dict(src.get("describedObject") or {})
        return count, f"{member} metric {name}", status
    raise _MetricError("InvalidMetricSourceType", f"the HPA was unable to compute the replica count: unsupported "
                                                  f"metric source type {kind!r}")


def _samples(metrics: Mapping[str, MetricValues], name: str, reason: str, what: str) -> list[float | None]:
    raw = metrics.get(name)
    if raw is None:
        raw = metrics.get(METRIC_ALIASES.get(name, name))
    if raw is None:
        raise _MetricError(reason, f"the HPA was unable to compute the replica count: unable to get metrics for "
                                   f"{what}: no metrics returned")
    values = list(raw) if isinstance(raw, Sequence) else [raw]
    if all(v is None for v in values):
        raise _MetricError(reason, f"the HPA was unable to compute the replica count: did not receive metrics "
                                   f"for {what} from any targeted pod (pods might be unready)")
    return values


def _per_pod(values: list, goal: float, current: int, tol: tuple[float, float], unready: int,
             average: Any, missing_at: Any) -> tuple[int, int]:
    """GetResourceReplicas / calcPlainMetricReplicas: (replicas, the current average)."""
    samples = [v for v in values if v is not None]
    missing = len(values) - len(samples)
    usage = average(samples)
    ratio = usage / goal
    up_with_unready = unready > 0 and ratio > 1.0
    if not up_with_unready and missing == 0:
        return (current if _within(ratio, tol) else math.ceil(ratio * len(samples))), usage
    filled = list(samples)
    if missing and ratio < 1.0:
        filled += [missing_at(ratio)] * missing  # a scale-down: pods without a sample are taken as at target
    elif missing and ratio > 1.0:
        filled += [0] * missing  # a scale-up: as idle
    if up_with_unready:
        filled += [0] * unready
    new_ratio = average(filled) / goal
    if _within(new_ratio, tol) or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
        return current, usage  # too small a change, or the guesses reversed the direction
    count = math.ceil(new_ratio * len(filled))
    if (new_ratio < 1.0 and count > current) or (new_ratio > 1.0 and count < current):
        return current, usage
    return count, usage


def _within(ratio: float, tol: tuple[float, float]) -> bool:
    up, down = tol
    return 1.0 - down <= ratio <= 1.0 + up


def _tolerance(rules: Mapping) -> float:
    value = rules.get("tolerance")
    return TOLERANCE if value is None else float(parse_decimal(value))


def _milli(value: Any) -> int:
    amount = parse_decimal(value if value is not None else 0)
    if amount <= 0:
        raise _MetricError("InvalidMetricSourceType", f"the HPA was unable to compute the replica count: target "
                                                      f"{value!r} must be positive")
    return int((amount * 1000).to_integral_value())


def _quantity(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


# -- behavior: stabilisation and rate policies -----------------------------------------------

def _normalize(desired: int, current: int, min_r: int, max_r: int, behavior: Mapping, state: HPAState,
               now: float, cond: Any) -> tuple[int, HPAState]:
    up_window = int(behavior["scaleUp"]["stabilizationWindowSeconds"])
    down_window = int(behavior["scaleDown"]["stabilizationWindowSeconds"])
    recs = list(state.recommendations)
    if not recs and down_window > 0:
        recs = [(now, current)]  # a new HPA does not scale down before a window has passed
    up_rec = down_rec = desired
    for t, r in recs:
        if t > now - up_window:
            up_rec = min(up_rec, r)
        if t > now - down_window:
            down_rec = max(down_rec, r)
    stabilized = min(max(current, up_rec), down_rec)
    horizon = now - max(up_window, down_window)
    recs = [(t, r) for t, r in recs if t > horizon] + [(now, desired)]
    state = HPAState(tuple(recs), state.scale_up_events, state.scale_down_events)
    if stabilized != desired:
        if desired >= current:
            cond("AbleToScale", "True", "ScaleUpStabilized", "recent recommendations were lower than current one, "
                                                             "applying the lowest recent recommendation")
        else:
            cond("AbleToScale", "True", "ScaleDownStabilized", "recent recommendations were higher than current "
                                                               "one, applying the highest recent recommendation")
    else:
        cond("AbleToScale", "True", "ReadyForNewScale", "recommended size matches current size")
    limited, reason, message = _rate_limit(stabilized, current, min_r, max_r, behavior, state, now)
    cond("ScalingLimited", "True" if limited != stabilized else "False", reason, message)
    return limited, state


def _rate_limit(desired: int, current: int, min_r: int, max_r: int, behavior: Mapping, state: HPAState,
                now: float) -> tuple[int, str, str]:
    if desired > current:
        limit = max(current, _scale_up_limit(current, behavior["scaleUp"], state, now))
        if max_r > limit:
            allowed, reason, message = limit, "ScaleUpLimit", "the desired replica count is increasing faster " \
                                                              "than the maximum scale rate"
        else:
            allowed, reason, message = max_r, "TooManyReplicas", "the desired replica count is more than the " \
                                                                 "maximum replica count"
        if desired > allowed:
            return allowed, reason, message
    elif desired < current:
        limit = min(current, _scale_down_limit(current, behavior["scaleDown"], state, now))
        if min_r < limit:
            allowed, reason, message = limit, "ScaleDownLimit", "the desired replica count is decreasing faster " \
                                                                "than the maximum scale rate"
        else:
            allowed, reason, message = min_r, "TooFewReplicas", "the desired replica count is less than the " \
                                                                "minimum replica count"
        if desired < allowed:
            return allowed, reason, message
    return desired, "DesiredWithinRange", "the desired count is within the acceptable range"


def _change_in_period(events: Iterable[tuple[float, int]], period: int, now: float) -> int:
    return sum(n for t, n in events if t > now - period)


def _period_start(current: int, policy: Mapping, state: HPAState, now: float) -> int:
    period = int(policy["periodSeconds"])
    return (current - _change_in_period(state.scale_up_events, period, now)
            + _change_in_period(state.scale_down_events, period, now))


def _scale_up_limit(current: int, rules: Mapping, state: HPAState, now: float) -> int:
    select = rules.get("selectPolicy", "Max")
    if select == "Disabled":
        return current
    pick = min if select == "Min" else max
    result = None
    for policy in rules["policies"]:
        start = _period_start(current, policy, state, now)
        if policy["type"] == "Pods":
            proposed = start + int(policy["value"])
        else:  # rounded up, or a small target could never grow
            proposed = math.ceil(Decimal(start) * (1 + Decimal(int(policy["value"])) / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else int(result)


def _scale_down_limit(current: int, rules: Mapping, state: HPAState, now: float) -> int:
    select = rules.get("selectPolicy", "Max")
    if select == "Disabled":
        return current
    pick = max if select == "Min" else min  # the least change is the highest count
    result = None
    for policy in rules["policies"]:
        start = _period_start(current, policy, state, now)
        if policy["type"] == "Pods":
            proposed = start - int(policy["value"])
        else:
            proposed = int(Decimal(start) * (1 - Decimal(int(policy["value"])) / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else int(result)


def _record_scale(state: HPAState, behavior: Mapping, before: int, after: int, now: float) -> HPAState:
    """Remember a scale event for the rate policies, forgetting those older than the longest
    policy period of its direction."""
    up = after > before
    rules = behavior["scaleUp" if up else "scaleDown"]
    longest = max((int(p["periodSeconds"]) for p in rules.get("policies") or ()), default=0)
    events = state.scale_up_events if up else state.scale_down_events
    kept = tuple(e for e in events if e[0] > now - longest) + ((now, abs(after - before)),)
    if up:
        return HPAState(state.recommendations, kept, state.scale_down_events)
    return HPAState(state.recommendations, state.scale_up_events, kept)
