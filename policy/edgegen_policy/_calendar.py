"""Calendar periods of quotas: which day, week, month or billing month an instant is in.

A quota counts units per calendar period of a time zone (``UTC`` unless the policy names
one): a ``day`` runs from local midnight to the next, a ``week`` from Monday's midnight
(ISO 8601 weeks), a ``month`` from the first's midnight, and a ``billing`` month from the
caller's billing day's midnight to the same day of the next month. A billing day the month
does not have (29-31 in a short month) is that month's last day: with billing day 31 the
periods start on Jan 31, Feb 28 (Feb 29 in a leap year), Mar 31, Apr 30, ...

Periods are instants, in integer µs since the epoch (the limiter's script counts in µs),
computed from local wall-clock dates with the IANA time zone database (:mod:`zoneinfo`).
Across a daylight-saving change a local day is 23 or 25 hours long, and a month an hour
shorter or longer, as its calendar says. A local midnight that does not exist (a zone that
springs forward at 00:00) starts its period at the first instant after the gap; a midnight
that happens twice (a zone that falls back over 00:00) starts it at the first occurrence.

Pure: no clock is read here, the caller passes the instant.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta, tzinfo
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
DAYS_IN_WEEK = 7
MONTHS = 12
MAX_BILLING_DAY = 31


class Period(StrEnum):
    """The calendar periods a quota can count over."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"
    BILLING = "billing"


_HOUR_MS = 3_600_000
# The shortest each period can be, in ms: a day or a week an hour short (daylight saving),
# a month of 28 days an hour short. What lint compares a tier's rates with.
SHORTEST_PERIOD_MS = {
    Period.DAY: 23 * _HOUR_MS,
    Period.WEEK: (7 * 24 - 1) * _HOUR_MS,
    Period.MONTH: (28 * 24 - 1) * _HOUR_MS,
    Period.BILLING: (28 * 24 - 1) * _HOUR_MS,
}


class UnknownTimeZoneError(ValueError):
    """The time zone database has no zone of this name."""


@lru_cache(maxsize=64)
def time_zone(name: str) -> tzinfo:
    """The zone called ``name`` (an IANA name such as ``Europe/Berlin``, or ``UTC``).

    Raises :class:`UnknownTimeZoneError` when the database has no such zone (or the name
    is not one a database could hold: a path, an empty string)."""
    if name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as error:
        raise UnknownTimeZoneError(
            f"unknown time zone {name!r}; use an IANA name such as Europe/Berlin or UTC"
        ) from error


def _instant(day: date, zone: tzinfo) -> int:
    """Local midnight of ``day`` in ``zone`` in µs since the epoch (fold 0: the first
    occurrence of a repeated midnight, the end of the gap for a skipped one)."""
    local = datetime(day.year, day.month, day.day, tzinfo=zone)
    # A skipped midnight read with fold 0 has the offset before the change: the instant
    # it names is the first one after the gap. Round-tripping it through UTC gives that
    # instant for both kinds of zone object.
    return (local.astimezone(UTC) - _EPOCH) // _US


def _local_date(at_us: int, zone: tzinfo) -> date:
    return (_EPOCH + at_us * _US).astimezone(zone).date()


def _clamped(year: int, month: int, day: int) -> date:
    """``day`` of the month, or the month's last day when it has fewer days."""
    return date(year, month, min(day, calendar.monthrange(year, month)[1]))


def _next_month(year: int, month: int) -> tuple[int, int]:
    return (year + 1, 1) if month == MONTHS else (year, month + 1)


def _previous_month(year: int, month: int) -> tuple[int, int]:
    return (year - 1, MONTHS) if month == 1 else (year, month - 1)


def period_dates(period: Period, today: date, billing_day: int = 1) -> tuple[date, date]:
    """The local dates the period containing ``today`` starts and ends on (the end is
    the next period's start)."""
    if period is Period.DAY:
        return today, today + timedelta(days=1)
    if period is Period.WEEK:
        start = today - timedelta(days=today.weekday())
        return start, start + timedelta(days=DAYS_IN_WEEK)
    if period is Period.MONTH:
        return today.replace(day=1), date(*_next_month(today.year, today.month), 1)
    if not 1 <= billing_day <= MAX_BILLING_DAY:
        raise ValueError(f"billing day {billing_day} is not a day of a month (1-31)")
    this = _clamped(today.year, today.month, billing_day)
    if today >= this:
        return this, _clamped(*_next_month(today.year, today.month), billing_day)
    return _clamped(*_previous_month(today.year, today.month), billing_day), this


def period_at(
    period: Period, at_us: int, zone: tzinfo, billing_day: int = 1
) -> tuple[int, int, date]:
    """The period containing the instant ``at_us`` (µs since the epoch) in ``zone``: its
    start (included) and end (excluded) in µs since the epoch, and its first local date."""
    first, last = period_dates(period, _local_date(at_us, zone), billing_day)
    start, end = _instant(first, zone), _instant(last, zone)
    if end <= at_us:
        # A zone that falls back over midnight repeats the end of a local day after the
        # next day's midnight has passed: the instant is in the next period.
        first, last = period_dates(period, last, billing_day)
        start, end = _instant(first, zone), _instant(last, zone)
    return start, end, first


def period_bounds(
    period: Period, at_us: int, zone: tzinfo, billing_day: int = 1
) -> tuple[int, int]:
    """The period containing the instant ``at_us`` in ``zone``: its start and end in µs
    since the epoch (see :func:`period_at`)."""
    start, end, _first = period_at(period, at_us, zone, billing_day)
    return start, end
