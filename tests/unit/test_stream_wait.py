"""When the controller's pass waits for a stream of submissions (server.controller.stream_wait)."""

from __future__ import annotations

import math

import pytest

from shoal.server.controller import stream_wait

GAP, DEFER = 0.02, 3.0
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
