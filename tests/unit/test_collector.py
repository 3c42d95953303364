"""The server's garbage collector: a request's short-lived objects die before a collection
sees them, so a storm of submissions does not promote them into the generation whose
collection stops the server for a third of a second (docs/SCALE.md)."""

import gc

import pytest

from shoal.server import collector


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_a_burst_of_request_objects_triggers_no_collection_in_the_server(thresholds):
    collector.set_for_server()
    gc.collect()  # the young generation's count starts from nothing
    young_before = gc.get_stats()[0]["collections"]
    in_flight = [[i] for i in range(5_000)]  # what 20 submissions in flight hold, say
    assert gc.get_stats()[0]["collections"] == young_before
    del in_flight


def test_the_same_burst_is_collected_under_pythons_defaults(thresholds):
    gc.set_threshold(700, 10, 10)
    gc.collect()
    young_before = gc.get_stats()[0]["collections"]
    in_flight = [[i] for i in range(5_000)]
    assert gc.get_stats()[0]["collections"] > young_before
    del in_flight
