"""Calendar quotas in the policy: the model's shape, the loader's located errors, and the
lint checks L020 (unknown time zone) and L120 (a quota no rate can reach)."""

from __future__ import annotations

import edgegen_policy as policy
import pytest
from edgegen_policy import Layer, Period

BASE = """
version: 1
tiers: [free, pro]
limits:
  - name: api
    app:
      tiers: {{free: 10/1s, pro: 100/1s}}
{extra}
"""


def load(extra: str) -> policy.Policy:
    return policy.loads(BASE.format(extra=extra), file="p.yaml")


def errors_of(extra: str) -> list[policy.Diagnostic]:
    with pytest.raises(policy.PolicyLoadError) as info:
        load(extra)
    return info.value.diagnostics


def test_quotas_are_read_per_tier_shortest_period_first() -> None:
    """Each tier's quotas, in the order day, week, month, billing."""
    loaded = load(
        "      quotas: {free: {month: 500, day: 20}, pro: {billing: 9000}}\n"
        "      billing_day_from: billing_day\n"
        "      quota_timezone: Europe/Berlin"
    )
    app = loaded.limits[0].app
    assert app is not None and app.quotas is not None
    assert app.quotas["free"].periods() == ((Period.DAY, 20), (Period.MONTH, 500))
    assert app.billing_day_from == "billing_day"
    assert app.quota_timezone == "Europe/Berlin"
    assert not [d for d in policy.lint(loaded) if d.severity.value == "error"]


@pytest.mark.parametrize(
    ("extra", "fragment", "line"),
    [
        ("      quotas: {gold: {day: 5}}", "tier 'gold', which has no rate", 7),
        ("      quotas: {free: {}}", "no quota given", 8),
        ("      quotas: {free: {day: 0}}", "greater than or equal to 1", 8),
        ("      quotas: {free: {day: true}}", "not a number", 8),
        ("      quotas: {free: {year: 5}}", "year", 8),
        ("      quotas: {free: {billing: 5}}", "needs billing_day_from", 7),
        (
            "      quotas: {free: {day: 5}}\n      billing_day_from: billing_day",
            "no tier has a billing quota",
            7,
        ),
        (
            "      quotas: {free: {billing: 5}}\n      billing_day_from: Billing-Day",
            "not a key name",
            9,
        ),
        ("      quota_timezone: Europe/Berlin", "the limit has no quotas", 7),
        (
            "      quotas: {free: {day: 5}}\n      mode: approximate",
            "approximate mode does not apply",
            7,
        ),
    ],
)
def test_a_bad_quota_is_a_located_error(extra: str, fragment: str, line: int) -> None:
    """Each mistake is one error at its line, with the field path and the fix."""
    found = errors_of(extra)
    assert any(fragment in d.message and d.line == line for d in found), [d.format() for d in found]
    assert all(d.file == "p.yaml" for d in found)


def test_an_unknown_time_zone_is_l020_and_stops_the_app() -> None:
    """L020 names the zone and the field, and the validity gate stops the app layer."""
    loaded = load("      quotas: {free: {day: 5}}\n      quota_timezone: Europe/Atlantis")
    [found] = [d for d in policy.lint(loaded) if d.code == "L020"]
    assert "Europe/Atlantis" in found.message
    assert (found.line, found.path) == (9, "limits[0].app.quota_timezone")
    assert found in policy.check(loaded).stopping(Layer.APP)


def test_a_quota_below_a_rate_it_contains_is_l120() -> None:
    """day: 50 beside 100/1s: the rate never binds. A month quota above a rate of one
    second is fine; one below a rate of a week (which fits in any month) is not."""
    loaded = load("      quotas: {free: {day: 5, month: 50000}, pro: {week: 99}}")
    found = sorted((d.path, d.severity.value) for d in policy.lint(loaded) if d.code == "L120")
    assert found == [
        ("limits[0].app.quotas.free.day", "warning"),
        ("limits[0].app.quotas.pro.week", "warning"),
    ]


def test_a_quota_below_a_rate_longer_than_its_period_is_not_l120() -> None:
    """A rate of 100 per 30 days beside a day quota of 50: the day quota binds within a
    day, the rate across days; both can bind."""
    text = BASE.format(extra="      quotas: {free: {day: 50}}").replace("10/1s", "100/30d")
    assert not [d for d in policy.lint(policy.loads(text)) if d.code == "L120"]
