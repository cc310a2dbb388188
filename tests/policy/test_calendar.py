"""The calendar periods of quotas (``edgegen_policy._calendar``): days, ISO weeks, months
and billing months, in UTC and across a time zone's daylight-saving changes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from edgegen_policy import Period, UnknownTimeZoneError, period_at, period_bounds, time_zone
from edgegen_policy._calendar import period_dates
from hypothesis import given
from hypothesis import strategies as st

US = 1_000_000


def at(
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    *,
    zone: str = "UTC",
) -> int:
    """A local wall-clock time in ``zone`` as µs since the epoch."""
    local = datetime(year, month, day, hour, minute, second, tzinfo=time_zone(zone))
    return int(local.timestamp()) * US


def utc(instant: int) -> str:
    return datetime.fromtimestamp(instant / US, UTC).isoformat()


def test_a_month_of_28_days() -> None:
    """February 2026 (not a leap year) is 28 days: its last µs is in it, the next is March's."""
    end = at(2026, 3, 1)
    assert period_bounds(Period.MONTH, end - 1, UTC) == (at(2026, 2, 1), end)
    assert period_bounds(Period.MONTH, end, UTC) == (end, at(2026, 4, 1))
    assert end - at(2026, 2, 1) == 28 * 86_400 * US


def test_a_leap_day_is_in_its_day_and_its_month() -> None:
    """29 February 2024: a day of its own, and February 2024 has 29 days."""
    start, end = period_bounds(Period.DAY, at(2024, 2, 29, 12), UTC)
    assert (utc(start), utc(end)) == ("2024-02-29T00:00:00+00:00", "2024-03-01T00:00:00+00:00")
    start, end = period_bounds(Period.MONTH, at(2024, 2, 29, 23, 59, 59), UTC)
    assert end - start == 29 * 86_400 * US


@pytest.mark.parametrize(
    ("today", "day", "expected"),
    [
        # Billing day 31 in a 30-day month: the period starts on the month's last day.
        (date(2026, 4, 29), 31, (date(2026, 3, 31), date(2026, 4, 30))),
        (date(2026, 4, 30), 31, (date(2026, 4, 30), date(2026, 5, 31))),
        (date(2026, 5, 30), 31, (date(2026, 4, 30), date(2026, 5, 31))),
        # February: the 28th, or the 29th in a leap year.
        (date(2026, 2, 28), 31, (date(2026, 2, 28), date(2026, 3, 31))),
        (date(2026, 2, 27), 30, (date(2026, 1, 30), date(2026, 2, 28))),
        (date(2024, 2, 28), 31, (date(2024, 1, 31), date(2024, 2, 29))),
        (date(2024, 2, 29), 29, (date(2024, 2, 29), date(2024, 3, 29))),
        # Across a year's end.
        (date(2026, 1, 14), 15, (date(2025, 12, 15), date(2026, 1, 15))),
        (date(2026, 12, 15), 15, (date(2026, 12, 15), date(2027, 1, 15))),
        (date(2026, 3, 1), 1, (date(2026, 3, 1), date(2026, 4, 1))),
    ],
)
def test_billing_months_start_on_the_billing_day_or_the_months_last(
    today: date, day: int, expected: tuple[date, date]
) -> None:
    """A billing day the month lacks is its last day; each period runs to the next start."""
    assert period_dates(Period.BILLING, today, day) == expected


def test_weeks_start_on_monday() -> None:
    """ISO weeks: Saturday 5 December 2026 is in the week from Monday 30 November."""
    assert period_bounds(Period.WEEK, at(2026, 12, 5, 13), UTC) == (
        at(2026, 11, 30),
        at(2026, 12, 7),
    )


def test_a_day_in_berlin_follows_daylight_saving() -> None:
    """The day clocks spring forward is 23 hours long, the day they fall back 25; each
    starts at local midnight."""
    berlin = time_zone("Europe/Berlin")
    start, end = period_bounds(Period.DAY, at(2026, 3, 29, 12, zone="Europe/Berlin"), berlin)
    assert (utc(start), end - start) == ("2026-03-28T23:00:00+00:00", 23 * 3600 * US)
    start, end = period_bounds(Period.DAY, at(2026, 10, 25, 12, zone="Europe/Berlin"), berlin)
    assert (utc(start), end - start) == ("2026-10-24T22:00:00+00:00", 25 * 3600 * US)
    # The month of the spring change is an hour short of 31 days.
    start, end = period_bounds(Period.MONTH, at(2026, 3, 15, zone="Europe/Berlin"), berlin)
    assert end - start == (31 * 24 - 1) * 3600 * US


def test_a_skipped_midnight_starts_the_day_after_the_gap() -> None:
    """America/Santiago springs forward at local midnight (6 September 2026: 00:00 is
    01:00): the day starts at the first instant that exists."""
    zone = time_zone("America/Santiago")
    noon = at(2026, 9, 6, 12, zone="America/Santiago")
    start, end = period_bounds(Period.DAY, noon, zone)
    assert start <= noon < end
    assert datetime.fromtimestamp(start / US, zone).hour == 1
    assert end - start == 23 * 3600 * US


@given(
    instant=st.integers(0, 4_102_444_800 * US),
    period=st.sampled_from(list(Period)),
    day=st.integers(1, 31),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/Santiago", "Australia/Lord_Howe"]),
)
def test_every_instant_is_in_the_period_found_and_periods_tile(
    instant: int, period: Period, day: int, zone: str
) -> None:
    """The period found contains the instant; the next period starts where it ends; and
    its first local date is the start's."""
    tz = time_zone(zone)
    start, end, first = period_at(period, instant, tz, day)
    assert start <= instant < end
    assert period_at(period, end, tz, day)[0] == end
    assert period_at(period, start - 1, tz, day)[1] == start
    assert datetime.fromtimestamp(start / US, tz).date() in (first, first + timedelta(days=1))


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "utc "])
def test_an_unknown_time_zone_is_refused(name: str) -> None:
    """A name the database lacks (or that is a path) is an error that names it."""
    with pytest.raises(UnknownTimeZoneError, match="unknown time zone"):
        time_zone(name)
