"""The watch cache's bookkeeping: one position order for every change, events in order, and
410 Gone for a position older than the events kept."""

from __future__ import annotations

from collections import deque

from shoal.server.kubeapi.cache import WatchCache, with_rv
from shoal.server.kubeapi.registry import RESOURCES

PODS = next(r for r in RESOURCES if r.resource == "pods")


def pod(name: str, phase: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "status": {"phase": phase}}


def test_reads_become_added_modified_deleted_events_with_rising_positions():
    cache = WatchCache(sessions=None, server=None)
    cache._apply("pods", {("default", "a"): ("ann", pod("a", "Pending"))})  # the first read: no events
    start = cache.rv
    cache._apply("pods", {("default", "a"): ("ann", pod("a", "Running")),
                          ("default", "b"): (None, pod("b", "Pending"))})
    cache._apply("pods", {("default", "b"): (None, pod("b", "Pending"))})  # a gone, b unchanged
    events = list(cache.since(PODS, start))
    assert [(e.type, e.entry.obj["metadata"]["name"]) for e in events] == [
        ("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    assert [e.rv for e in events] == sorted(e.rv for e in events) and events[0].rv > start
    assert with_rv(cache.state["pods"][("default", "b")])["metadata"]["resourceVersion"] == str(events[1].rv)
    assert list(cache.since(PODS, events[1].rv))[0].type == "DELETED"


def test_a_position_older_than_the_kept_events_is_gone():
    cache = WatchCache(sessions=None, server=None)
    cache.events = deque(maxlen=2)
    cache._apply("pods", {})
    start = cache.rv
    for n in range(4):
        cache._apply("pods", {("default", f"p{n}"): (None, pod(f"p{n}", "Pending"))})
    assert cache.too_old(start) and not cache.too_old(cache.rv)
