"""A pass's plan computed in a forked child (``shoal.server.forked``): the same plan, and every
way the child can fail is a ``Failed`` the controller plans around."""

from __future__ import annotations

import dataclasses
import os
import resource
import time

import pytest
from hypothesis import given, settings
from sched_cluster import job, nodes, partition, running, snapshot
from test_preempt import QOS_TABLE, holds, urgent
from test_sched_properties import scenarios

from shoal.sched import SchedConfig, schedule
from shoal.sched.placement import PlacementCache
from shoal.server import forked

pytestmark = pytest.mark.skipif(not forked.AVAILABLE, reason="this platform cannot fork")


@given(scenarios())
@settings(max_examples=25, deadline=None)
def test_a_forked_pass_plans_what_a_pass_here_plans(scenario):
    snap, config = scenario
    cache = PlacementCache()
    schedule(snap, config, cache)  # a warm cache goes to the child as it is
    here, there = schedule(snap, config), forked.call(schedule, snap, config, cache)
    assert there == here
    assert there is not here


def test_a_forked_pass_brings_back_its_preemptions_and_start_estimates():
    cluster = nodes("gpu", 2)
    active = [holds(11, "scavenger", {"gpu1": tuple(range(8))}, 900.0),
              dataclasses.replace(running(12, {"gpu2": (8, 1000, tuple(range(8)))}, start_time=900.0,
                                          time_limit_s=600), qos=None)]
    pending = [urgent(1), job(2, gpus_per_node=8, time_limit_s=60)]
    snap = dataclasses.replace(snapshot(cluster, [partition("gpu", cluster)], pending, active, now=1000.0),
                               qos=QOS_TABLE)
    here = schedule(snap, SchedConfig())
    assert here.preemptions and here.estimates  # what the child must bring back
    assert forked.call(schedule, snap, SchedConfig(), PlacementCache()) == here


def boom(x):
    raise ValueError(x)


def killed():
    os.kill(os.getpid(), 9)  # the child's own pid, read in the child


def test_an_error_in_the_child_is_failed_and_said_on_stderr(capfd):
    with pytest.raises(forked.Failed, match="ended with 1"):
        forked.call(boom, "the pass broke")
    assert "ValueError: the pass broke" in capfd.readouterr().err


def test_a_child_that_dies_or_sends_nothing_is_failed():
    with pytest.raises(forked.Failed, match="ended with 3"):
        forked.call(os._exit, 3)
    with pytest.raises(forked.Failed, match="ended with -9"):
        forked.call(killed)


def test_a_child_past_its_time_is_killed_and_failed():
    t = time.monotonic()
    with pytest.raises(forked.Failed, match="no result after 0.5 s"):
        forked.call(time.sleep, 30, timeout_s=0.5)
    assert time.monotonic() - t < 5


def test_a_result_larger_than_the_pipe_comes_back_whole():
    big = forked.call(bytes, 5_000_000)
    assert big == bytes(5_000_000)


def test_a_pipe_past_descriptor_1024_is_waited_on(tmp_path):
    """A server with a thousand agents' connections open gets pipes past select()'s limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        with open(os.devnull) as null:
            while not held or held[-1] < 1100:
                held.append(os.dup(null.fileno()))
        assert forked.call(sum, [1, 2, 3]) == 6
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
