"""When the controller's pass waits for a stream of submissions (server.controller.stream_wait), and
which submissions make one (Controller.submitted)."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest

from shoal.server.controller import Controller, stream_wait
from shoal.server.groupcommit import InFlight
from shoal.server.hub import WorkHub

GAP, PAUSE, DEFER = 0.02, 0.25, 3.0
NO_STREAM = -math.inf


def test_without_a_stream_a_pass_runs_at_once():
    assert stream_wait(100.0, NO_STREAM, 99.999, GAP, DEFER) == 0.0


def test_a_pass_waits_for_the_stream_to_pause():
    # The stream's last submission 5 ms ago: the pass looks again when 20 ms have passed without one.
    assert stream_wait(100.0, 99.995, 99.0, GAP, DEFER) == pytest.approx(0.015)


def test_a_paused_stream_gets_its_pass():
    assert stream_wait(100.0, 99.98, 99.0, GAP, DEFER) == 0.0


def test_however_long_a_stream_lasts_a_pass_runs_every_defer_seconds():
    assert stream_wait(100.0, 99.999, 97.5, GAP, DEFER) == pytest.approx(0.019)
    assert stream_wait(100.0, 99.999, 97.0, GAP, DEFER) == 0.0
    assert stream_wait(100.0, 99.999, 96.995, GAP, DEFER) == 0.0
    # The limit comes before the pause: the pass runs at the limit.
    assert stream_wait(100.0, 99.999, 97.01, GAP, DEFER) == pytest.approx(0.01)


def test_no_deferral_when_it_is_turned_off():
    assert stream_wait(100.0, 99.999, 99.9, GAP, 0.0) == 0.0
    assert stream_wait(100.0, 99.999, 99.9, 0.0, DEFER) == 0.0


# ------------------------------------------------------------------ who makes a stream


class _Controller(Controller):
    """The real controller's step, with its pass counted instead of run."""

    def __init__(self) -> None:
        scheduler = SimpleNamespace(stream_gap_s=GAP, stream_pause_s=PAUSE, stream_defer_s=DEFER, interval_s=1.0)
        super().__init__(SimpleNamespace(config=SimpleNamespace(scheduler=scheduler), clock=time.time, qos=(),
                                         hub=WorkHub()))
        self.ran = 0
        self.now = 1000.0

    def at(self, t: float) -> "_Controller":
        """The controller's monotonic clock set to ``t`` (it reads time.monotonic)."""
        self.now = t
        return self

    def run_pass(self, periodic: bool = False) -> None:
        self.ran += 1

    def _none_may_start(self) -> bool:
        return False


def test_one_submitter_s_loop_is_a_stream_and_its_passes_wait():
    c = _Controller()
    c.submitted(alone=True)
    c.step()
    assert c.ran == 1  # the first submission is not a stream yet: its job starts at once
    c.submitted(alone=True)
    c.step()
    assert c.ran == 1 and c.rest_s() > 0  # the second, right after it, is: the pass waits


def test_submissions_made_at_once_by_several_submitters_are_not_deferred():
    c = _Controller()
    c.submitted(alone=True)
    c.step()
    c.submitted(alone=False)  # another submission was in flight meanwhile
    c.step()
    assert c.ran == 2 and c.rest_s() < DEFER


def test_in_flight_counts_the_others_inside():
    inside = InFlight()
    entered, release = threading.Event(), threading.Event()
    seen = []

    def first():
        with inside as others:
            seen.append(others)
            entered.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert entered.wait(10)
    with inside as others:
        seen.append(others)
    release.set()
    t.join(10)
    with inside as others:
        seen.append(others)
    assert seen == [0, 1, 0]


def test_a_hiccup_in_a_stream_does_not_end_it_but_a_pause_does(monkeypatch):
    c = _Controller()
    monkeypatch.setattr(time, "monotonic", lambda: c.now)
    c.at(1000.0).submitted()
    c.step()
    assert c.ran == 1  # not a stream yet
    c.at(1000.005).submitted()
    c.step()
    assert c.ran == 1 and c.rest_s() == pytest.approx(PAUSE)  # a stream: the pass waits
    c.at(1000.105).submitted()  # 100 ms later: a hiccup (over the gap, under the pause)
    c.step()
    assert c.ran == 1, "a hiccup ended the stream and its jobs started mid-loop"
    c.at(1000.2).step()
    assert c.ran == 1 and c.rest_s() == pytest.approx(0.155)
    c.at(1000.356).step()  # the pause: no submission for 250 ms
    assert c.ran == 2
    c.at(1000.7).submitted()  # a submission after the pause is not a stream: its pass runs at once
    c.step()
    assert c.ran == 3


def test_a_slow_pair_of_submissions_does_not_start_a_stream(monkeypatch):
    c = _Controller()
    monkeypatch.setattr(time, "monotonic", lambda: c.now)
    c.at(1000.0).submitted()
    c.step()
    c.at(1000.1).submitted()  # under the pause but over the gap: one job after another, each at once
    c.step()
    assert c.ran == 2
