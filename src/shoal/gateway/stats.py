"""What the gateway counts: per-pod in-flight requests and request rate, and its Prometheus text.

The rate is requests that a pod answered (counted when they end) over a sliding 10-second
window of 1-second buckets: it settles within 10 s of a change, never spikes on one burst
the way a short EWMA does, and a pod seen for less than the window is not undercounted
(the rate divides by the time it has been seen). The clock is passed in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from shoal.model.exposition import label_set as _labels

WINDOW_S = 10
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RateWindow:
    """Events per second over the last ``window_s`` seconds, in whole-second buckets."""

    __slots__ = ("_counts", "_stamps", "_since", "_window")

    def __init__(self, now: float, window_s: int = WINDOW_S):
        self._window = window_s
        self._counts = [0] * window_s
        self._stamps = [-1] * window_s
        self._since = now

    def add(self, now: float, n: int = 1) -> None:
        second = int(now)
        i = second % self._window
        if self._stamps[i] != second:
            self._stamps[i] = second
            self._counts[i] = 0
        self._counts[i] += n

    def rate(self, now: float) -> float:
        second = int(now)
        oldest = second - self._window + 1
        total = sum(c for s, c in zip(self._stamps, self._counts) if oldest <= s <= second)
        span = now - max(self._since, oldest)
        return total / max(span, 1.0)


class Histogram:
    __slots__ = ("counts", "sum", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.sum = 0.0
        self.total = 0

    def observe(self, seconds: float) -> None:
        self.sum += seconds
        self.total += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
                break


class GatewayStats:
    """Counters the proxy updates per request; ``report`` and ``prometheus`` read them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.inflight: Counter[str] = Counter()  # pod key -> outstanding requests (the balancer reads it)
        self.held: Counter[str] = Counter()  # service key -> requests waiting for a ready pod
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (service, pod, code)
        self.backend_errors: Counter[tuple[str, str, str]] = Counter()  # (service, pod, reason)
        self.latency: dict[str, Histogram] = {}
        self._pod_service: dict[str, str] = {}
        self._rates: dict[str, RateWindow] = {}

    def begin(self, service: str, pod: str) -> None:
        self.inflight[pod] += 1
        self._pod_service[pod] = service

    def end(self, service: str, pod: str, code: int, started: float) -> None:
        """A request that reached ``pod`` is over (answered, or broken off after it started)."""
        now = self.clock()
        self._done(pod)
        self.requests[(service, pod, str(code))] += 1
        rate = self._rates.get(pod)
        if rate is None:
            rate = self._rates[pod] = RateWindow(now)
        rate.add(now)
        self._observe(service, now - started)

    def failed(self, service: str, pod: str, reason: str) -> None:
        """An attempt that never got an answer from ``pod`` (refused, reset, timed out)."""
        self._done(pod)
        self.backend_errors[(service, pod, reason)] += 1

    def answered(self, service: str, code: int, started: float) -> None:
        """A request the gateway answered itself (404, 502, 503)."""
        self.requests[(service, "", str(code))] += 1
        self._observe(service, self.clock() - started)

    def _done(self, pod: str) -> None:
        n = self.inflight[pod] - 1
        if n > 0:
            self.inflight[pod] = n
        else:
            del self.inflight[pod]

    def _observe(self, service: str, seconds: float) -> None:
        h = self.latency.get(service)
        if h is None:
            h = self.latency[service] = Histogram()
        h.observe(seconds)

    def forget(self, keep: set[str]) -> None:
        """Drop the figures of pods that left the routes and have nothing in flight."""
        gone = {p for p in self._rates.keys() | self._pod_service.keys() if p not in keep and not self.inflight[p]}
        if not gone:
            return
        for p in gone:
            self._rates.pop(p, None)
            self._pod_service.pop(p, None)
        for counter in (self.requests, self.backend_errors):
            for k in [k for k in counter if k[1] in gone]:
                del counter[k]

    def report(self, pods: Iterable[str]) -> dict:
        """The body of ``POST /shoal/v1/kube/metrics``: every routed pod, plus any with requests in flight."""
        now = self.clock()
        out = {}
        for pod in {*pods, *self.inflight}:
            rate = self._rates.get(pod)
            out[pod] = {"rps": round(rate.rate(now), 3) if rate else 0.0, "inflight": self.inflight.get(pod, 0)}
        return {"pods": out, "held": {svc: n for svc, n in self.held.items() if n > 0}}

    def prometheus(self, routes_version=None) -> str:
        """Prometheus text exposition (format 0.0.4) of every counter."""
        lines = [
            "# HELP shoal_gateway_requests_total Requests answered, by Service, pod and HTTP status "
            '(pod="" when the gateway answered itself).',
            "# TYPE shoal_gateway_requests_total counter",
        ]
        for (svc, pod, code), n in sorted(self.requests.items()):
            lines.append(f"shoal_gateway_requests_total{_labels(service=svc, pod=pod, code=code)} {n}")
        lines += [
            "# HELP shoal_gateway_backend_errors_total Attempts that got no answer from a pod "
            "(the request was retried on another pod or answered 502).",
            "# TYPE shoal_gateway_backend_errors_total counter",
        ]
        for (svc, pod, reason), n in sorted(self.backend_errors.items()):
            lines.append(f"shoal_gateway_backend_errors_total{_labels(service=svc, pod=pod, reason=reason)} {n}")
        lines += ["# HELP shoal_gateway_inflight_requests Requests a pod is serving now.",
                  "# TYPE shoal_gateway_inflight_requests gauge"]
        for pod in sorted(self.inflight.keys() | self._pod_service.keys()):
            svc = self._pod_service.get(pod, "")
            lines.append(f"shoal_gateway_inflight_requests{_labels(service=svc, pod=pod)} {self.inflight.get(pod, 0)}")
        lines += ["# HELP shoal_gateway_requests_per_second Requests a pod answered per second, last 10 s.",
                  "# TYPE shoal_gateway_requests_per_second gauge"]
        now = self.clock()
        for pod, rate in sorted(self._rates.items()):
            svc = self._pod_service.get(pod, "")
            lines.append(f"shoal_gateway_requests_per_second{_labels(service=svc, pod=pod)} {rate.rate(now):.3f}")
        lines += ["# HELP shoal_gateway_held_requests Requests waiting for a Service to scale up from zero.",
                  "# TYPE shoal_gateway_held_requests gauge"]
        for svc, n in sorted(self.held.items()):
            lines.append(f"shoal_gateway_held_requests{_labels(service=svc)} {n}")
        lines += ["# HELP shoal_gateway_request_duration_seconds Time from a request's arrival to the end "
                  "of its response.",
                  "# TYPE shoal_gateway_request_duration_seconds histogram"]
        for svc, h in sorted(self.latency.items()):
            cumulative = 0
            for bound, n in zip(LATENCY_BUCKETS, h.counts):
                cumulative += n
                lines.append(f"shoal_gateway_request_duration_seconds_bucket{_labels(service=svc, le=f'{bound:g}')}"
                             f" {cumulative}")
            lines.append(f"shoal_gateway_request_duration_seconds_bucket{_labels(service=svc, le='+Inf')} {h.total}")
            lines.append(f"shoal_gateway_request_duration_seconds_sum{_labels(service=svc)} {h.sum:.6f}")
            lines.append(f"shoal_gateway_request_duration_seconds_count{_labels(service=svc)} {h.total}")
        if routes_version is not None:
            lines += ["# HELP shoal_gateway_routes_version Version of the routing table in use.",
                      "# TYPE shoal_gateway_routes_version gauge",
                      f"shoal_gateway_routes_version {_number(routes_version)}"]
        return "\n".join(lines) + "\n"


def _number(value) -> str:
    try:
        return f"{float(value):g}"
    except (TypeError, ValueError):
        return "NaN"
