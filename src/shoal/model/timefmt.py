"""Slurm's time formats: --time limits, --begin times, and how squeue/sacct print them.

Everything takes the clock as an argument (``now``) so tests and the simulator control it;
calendar conversions use the local time zone, as Slurm's commands do.
"""

from __future__ import annotations

import time as _time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import date

TIME_LIMIT_FORMS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"

_UNLIMITED = {"unlimited", "infinite", "-1"}
_UNITS = {
    "seconds": 1, "second": 1, "minutes": 60, "minute": 60, "hours": 3600, "hour": 3600,
    "days": 86400, "day": 86400, "weeks": 604800, "week": 604800,
}
_NAMED_TIMES = {"midnight": (0, 0), "noon": (12, 0), "elevenses": (11, 0), "fika": (15, 0),
                "teatime": (16, 0)}
BEGIN_FORMS = ("now[+count[seconds|minutes|hours|days|weeks]], HH:MM[:SS], "
               "YYYY-MM-DD[THH:MM[:SS]], today, tomorrow, midnight, noon or teatime")


class TimeFormatError(ValueError):
    """A time or duration that does not follow one of Slurm's forms."""


def parse_time_limit(text: str) -> int | None:
    """A --time value in seconds; None for no limit (``UNLIMITED``, ``infinite``, ``0``).

    The forms are Slurm's: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``,
    ``days-hours``, ``days-hours:minutes`` and ``days-hours:minutes:seconds``. As in
    Slurm, fields are not range-checked (``90`` and ``0:90:00`` are both 90 minutes).
    """
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    days = 0
    rest = value
    if "-" in value:
        day_text, _, rest = value.partition("-")
        days = _field(day_text, text)
        fields = [_field(f, text) for f in rest.split(":")]
        if len(fields) > 3:
            raise _limit_error(text)
        hours, minutes, seconds = (fields + [0, 0])[:3]
    else:
        fields = [_field(f, text) for f in rest.split(":")]
        if len(fields) == 1:
            hours, minutes, seconds = 0, fields[0], 0
        elif len(fields) == 2:
            hours, minutes, seconds = 0, fields[0], fields[1]
        elif len(fields) == 3:
            hours, minutes, seconds = fields
        else:
            raise _limit_error(text)
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    return total or None


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds: ``90``, ``30m``, ``6h``, ``2d``, or Slurm's ``HH:MM:SS`` / ``D-HH:MM:SS``."""
    value = text.strip().lower()
    number, unit = (value[:-1], value[-1]) if value[-1:] in _DURATION_UNITS else (value, "s")
    if number.replace(".", "", 1).isdigit() and number.isascii():
        return float(number) * _DURATION_UNITS[unit]
    if ":" in value or "-" in value:
        try:
            seconds = parse_time_limit(value)
        except TimeFormatError:
            seconds = None
        if seconds is not None:
            return float(seconds)
    raise TimeFormatError(f"invalid time {text!r}: expected seconds, 30m, 6h, 2d or D-HH:MM:SS")


def _field(text: str, whole: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise _limit_error(whole)
    return int(text)


def _limit_error(text: str) -> TimeFormatError:
    return TimeFormatError(f"invalid time limit '{text}': expected {TIME_LIMIT_FORMS}")


def format_duration(seconds: float | int | None) -> str:
    """A duration as squeue's TIME and TIME_LIMIT columns print it: ``5:03``, ``1-02:03:04``.

    None is ``UNLIMITED``; fractions of a second are dropped and negative values print
    as ``0:00`` (a clock that went backwards should not show a minus sign).
    """
    if seconds is None:
        return "UNLIMITED"
    days, hours, minutes, secs = _split(seconds)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def format_hms(seconds: float | int | None, unlimited: str = "UNLIMITED") -> str:
    """Slurm's secs2time_str, used by sacct and scontrol: ``00:05:03``, ``1-02:03:04``."""
    if seconds is None:
        return unlimited
    days, hours, minutes, secs = _split(seconds)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def _split(seconds: float | int) -> tuple[int, int, int, int]:
    """Whole seconds as (days, hours, minutes, seconds); negative counts as 0."""
    days, rem = divmod(max(0, int(seconds)), 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    return days, hours, minutes, secs


def format_timestamp(epoch: float | None) -> str:
    """A point in time as Slurm prints it (``2026-12-02T15:20:46``, local time).

    None and 0 print as ``Unknown``, which is what squeue and sacct show for a start or
    end time that has not happened.
    """
    if not epoch:
        return "Unknown"
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.localtime(epoch))


def parse_begin_time(text: str, now: float) -> float:
    """An sbatch --begin value as an epoch, relative to ``now`` and in local time.

    A time of day without a date means its next occurrence (tomorrow if it has passed
    today), as Slurm's parse_time does; a date without a time means its midnight.
    """
    raw = text
    value = text.strip().lower()
    if not value:
        raise _begin_error(raw)
    if value.startswith("now"):
        return now + _relative_offset(value[3:].strip(), raw)
    if value.startswith("uts") and value[3:].isdigit():
        return float(int(value[3:]))

    from datetime import datetime, timedelta  # only --begin needs the calendar: it costs start-up time

    for suffix in ("today", "tomorrow"):
        # Slurm takes a day after the time of day, with or without a dash: noon-tomorrow, 16:00tomorrow.
        if value.endswith(suffix) and value != suffix and not _looks_iso(value):
            value = value[: -len(suffix)].rstrip("-") + " " + suffix
    today = datetime.fromtimestamp(now).date()
    day: date | None = None
    clock: tuple[int, int, int] | None = None
    for word in value.replace("t", " ", 1).split() if _looks_iso(value) else value.split():
        if word == "today":
            day = today
        elif word == "tomorrow":
            day = today + timedelta(days=1)
        elif word in _NAMED_TIMES:
            clock = (*_NAMED_TIMES[word], 0)
        elif ":" in word:
            clock = _clock(word, raw)
        elif "-" in word:
            day = _iso_date(word, raw)
        else:
            raise _begin_error(raw)
    if clock is None and day is None:
        raise _begin_error(raw)
    if day is None:
        assert clock is not None
        candidate = datetime.combine(today, datetime.min.time()).replace(
            hour=clock[0], minute=clock[1], second=clock[2])
        if candidate.timestamp() <= now:
            candidate += timedelta(days=1)
        return candidate.timestamp()
    hour, minute, second = clock or (0, 0, 0)
    try:
        return datetime(day.year, day.month, day.day, hour, minute, second).timestamp()
    except (OverflowError, OSError, ValueError):
        raise _begin_error(raw) from None


def _looks_iso(value: str) -> bool:
    """``2026-12-02t15:20`` (already lower-cased): the T joins a date and a time."""
    head, sep, tail = value.partition("t")
    return bool(sep) and "-" in head and head[:1].isdigit() and tail[:1].isdigit()


def _relative_offset(rest: str, raw: str) -> float:
    """``+60``, ``+1hour``, ``- 2 days`` after ``now``: seconds unless a unit is given."""
    if not rest:
        return 0.0
    sign = {"+": 1, "-": -1}.get(rest[0])
    if sign is None:
        raise _begin_error(raw)
    body = rest[1:].replace(" ", "")
    digits = 0
    while digits < len(body) and body[digits].isascii() and body[digits].isdigit():
        digits += 1
    unit = body[digits:]
    if not digits or digits > 12 or unit not in ("", *_UNITS):
        raise _begin_error(raw)
    return float(sign * int(body[:digits]) * _UNITS.get(unit, 1))


def _clock(word: str, raw: str) -> tuple[int, int, int]:
    pieces = word.split(":")
    if not 2 <= len(pieces) <= 3 or not all(p.isascii() and p.isdigit() and len(p) <= 2 for p in pieces):
        raise _begin_error(raw)
    hour, minute, second = (int(p) for p in (pieces + ["0"])[:3])
    if hour > 23 or minute > 59 or second > 59:
        raise _begin_error(raw)
    return hour, minute, second


def _iso_date(word: str, raw: str) -> date:
    from datetime import date

    pieces = word.split("-")
    if len(pieces) != 3 or not all(p.isascii() and p.isdigit() for p in pieces) or len(pieces[0]) != 4:
        raise _begin_error(raw)
    try:
        return date(int(pieces[0]), int(pieces[1]), int(pieces[2]))
    except ValueError:
        raise _begin_error(raw) from None


def _begin_error(text: str) -> TimeFormatError:
    return TimeFormatError(f"invalid --begin value '{text}': expected {BEGIN_FORMS}")
