"""Time limits, begin times and timestamps as sbatch reads and squeue prints them."""

from datetime import datetime

import pytest
from hypothesis import given, strategies as st

from shoal.model.timefmt import (
    TimeFormatError,
    format_duration,
    format_timestamp,
    parse_begin_time,
    parse_duration,
    parse_time_limit,
)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800),
        ("5:03", 303),
        ("1:02:03", 3723),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),
        ("1-02:03:04", 93784),
        ("90", 5400),
        ("0:90:00", 5400),
        (" 45 ", 2700),
    ],
)
def test_every_slurm_time_limit_form(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "unlimited", "infinite", "INFINITE", "0", "0:00", "-1"])
def test_unlimited_and_zero_mean_no_limit(text):
    assert parse_time_limit(text) is None


@pytest.mark.parametrize("text", ["", "7x", "1:2:3:4", "1-2:3:4:5", "-5", "1--2", "1.5", "abc", "1-", "١٢"])
def test_malformed_time_limits_say_which_forms_are_accepted(text):
    with pytest.raises(TimeFormatError, match="expected minutes, MM:SS, HH:MM:SS, D-HH"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    "seconds, text",
    [(0, "0:00"), (5, "0:05"), (303, "5:03"), (3723, "1:02:03"), (93784, "1-02:03:04"),
     (86400, "1-00:00:00"), (59.9, "0:59"), (None, "UNLIMITED"), (-3, "0:00")],
)
def test_durations_print_like_squeue(seconds, text):
    assert format_duration(seconds) == text


@given(st.integers(1, 400 * 86400))
def test_a_printed_duration_reads_back_as_the_same_seconds(seconds):
    assert parse_time_limit(format_duration(seconds)) == seconds


@given(st.text(max_size=20))
def test_time_limit_parser_raises_only_its_own_error(text):
    try:
        parse_time_limit(text)
    except TimeFormatError:
        pass


def test_timestamps_print_in_local_time_like_slurm():
    epoch = datetime(2026, 12, 2, 15, 20, 46).timestamp()
    assert format_timestamp(epoch) == "2026-12-02T15:20:46"
    assert format_timestamp(None) == "Unknown"


# A fixed local clock: 2026-03-10 14:30:00.
NOW = datetime(2026, 3, 10, 14, 30, 0).timestamp()


def _at(*args) -> float:
    return datetime(*args).timestamp()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("now+60", NOW + 60),
        ("now+1hour", NOW + 3600),
        ("now+2hours", NOW + 7200),
        ("now+30minutes", NOW + 1800),
        ("now+3days", NOW + 3 * 86400),
        ("now+1week", NOW + 7 * 86400),
        ("now-10", NOW - 10),
        ("16:00", _at(2026, 3, 10, 16, 0)),
        ("16:00:30", _at(2026, 3, 10, 16, 0, 30)),
        ("09:15", _at(2026, 3, 11, 9, 15)),
        ("midnight", _at(2026, 3, 11, 0, 0)),
        ("noon", _at(2026, 3, 11, 12, 0)),
        ("teatime", _at(2026, 3, 10, 16, 0)),
        ("today", _at(2026, 3, 10)),
        ("tomorrow", _at(2026, 3, 11)),
        ("tomorrow noon", _at(2026, 3, 11, 12, 0)),
        ("2026-12-02", _at(2026, 12, 2)),
        ("2026-12-02T15:20", _at(2026, 12, 2, 15, 20)),
        ("2026-12-02T15:20:46", _at(2026, 12, 2, 15, 20, 46)),
    ],
)
def test_begin_times_sbatch_accepts(text, expected):
    assert parse_begin_time(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["", "soon", "now+", "now+5fortnights", "25:00", "12:61", "2026-13-01", "2026-02-30", "now*2"]
)
def test_bad_begin_times_list_the_accepted_forms(text):
    with pytest.raises(TimeFormatError, match="invalid --begin value .*expected now"):
        parse_begin_time(text, NOW)


@given(st.text(max_size=25))
def test_begin_time_parser_raises_only_its_own_error(text):
    try:
        parse_begin_time(text, NOW)
    except TimeFormatError:
        pass


@given(st.text(max_size=25))
def test_duration_parser_raises_only_its_own_error(text):
    try:
        assert parse_duration(text) >= 0
    except TimeFormatError:
        pass


def test_begin_takes_a_day_after_the_time_of_day_as_slurm_does():
    now = datetime(2026, 12, 4, 16, 38).timestamp()
    # Checked against Slurm 22.05.8 at 16:38: 23:00-tomorrow is the next day's 23:00, not tonight's.
    assert parse_begin_time("23:00-tomorrow", now) == datetime(2026, 12, 5, 23, 0).timestamp()
    assert parse_begin_time("noon-tomorrow", now) == datetime(2026, 12, 5, 12, 0).timestamp()
    assert parse_begin_time("23:00today", now) == datetime(2026, 12, 4, 23, 0).timestamp()
