"""Calendar quotas in the limiter: checked with the tier's rates in one atomic decision,
on every backend (one server, a cluster, memory://) and both limiters.

Time is a test clock (its time is the script's): the periods are the calendar's, so the
tests start just before the end of a month, a day or a billing month."""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from limiter_support import US, MakeLimiter, TestClock, script_calls
from redis.crc import key_slot
from test_applimit_contract import all_keys

from applimit import InvalidArgumentError

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: q, timeout: 2s}
limits:
  - name: api
    app:
      algorithm: gcra
      tiers: {free: 2/1s, pro: 1000/1s}
      quotas: {free: {day: 5}, pro: {month: 4, billing: 6}}
      billing_day_from: billing_day
  - name: watch
    app:
      enforce: false
      tiers: {free: 1000/1s}
      quotas: {free: {day: 1}}
  - name: mix
    app:
      tiers: {free: 3/1h}
      quotas: {free: {day: 2}}
  - name: berlin
    app:
      tiers: {free: 1000/1s}
      quotas: {free: {day: 2}}
      quota_timezone: Europe/Berlin
"""


def utc_us(*fields: int) -> int:
    """A UTC time as µs since the epoch."""
    year, month, day, *rest = fields
    return int(datetime(year, month, day, *rest, tzinfo=UTC).timestamp()) * US


def user() -> str:
    """A fresh identity, so tests never share keys."""
    return f"user-{uuid.uuid4()}"


def quota_of(decision: Any, period: str) -> Any:
    """The decision's result of the quota on ``period``."""
    [found] = [r for r in decision.results if r.algorithm == f"quota:{period}"]
    return found


async def test_a_month_of_28_days_admits_its_quota_then_the_next_months(
    make_limiter: MakeLimiter,
) -> None:
    """February 2026: 4 units, the fifth refused until March 1st 00:00 UTC exactly (the
    wait and the reset say so); at that instant the new month admits 4 more."""
    clock = TestClock(utc_us(2026, 2, 28, 23, 59, 50))
    limiter = make_limiter(POLICY, test_clock=clock)
    who, keys = user(), {"billing_day": 1}
    admitted = [(await limiter.hit("api", who, tier="pro", keys=keys)).allowed for _ in range(5)]
    assert admitted == [True, True, True, True, False]
    clock.advance(10 * US - 1)
    refused = await limiter.hit("api", who, tier="pro", keys=keys)
    assert not refused.allowed
    month = quota_of(refused, "month")
    assert (month.allowed, month.remaining, month.quota) == (False, 0, 4)
    assert month.retry_after == pytest.approx(1e-6, abs=1e-9)
    assert month.window == 28 * 86_400
    clock.advance(1)
    again = [(await limiter.hit("api", who, tier="pro", keys=keys)).allowed for _ in range(5)]
    assert again == [True, True, True, True, False]
    march = quota_of(await limiter.peek("api", who, tier="pro", keys=keys), "month")
    assert march.window == 31 * 86_400
    assert march.reset_after == pytest.approx(31 * 86_400)


async def test_a_billing_day_31_in_a_30_day_month_ends_on_the_30th(
    make_limiter: MakeLimiter,
) -> None:
    """Billing day 31: the period that began on March 31st ends on April 30th 00:00 (the
    last day of April starts the next), not on May 1st; a billing day passed as digits
    counts the same."""
    clock = TestClock(utc_us(2026, 4, 29, 23, 59, 59))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    first = await limiter.hit("api", who, tier="pro", keys={"billing_day": 31})
    billing = quota_of(first, "billing")
    assert (billing.remaining, billing.reset_after) == (5, 1.0)
    assert billing.window == 30 * 86_400
    clock.advance(US)
    fresh = quota_of(
        await limiter.peek("api", who, tier="pro", keys={"billing_day": "31"}), "billing"
    )
    assert (fresh.remaining, fresh.window) == (6, 31 * 86_400)


async def test_a_leap_day_is_a_day_of_its_own(make_limiter: MakeLimiter) -> None:
    """29 February 2024 has its own daily quota; 1 March starts another."""
    clock = TestClock(utc_us(2024, 2, 29, 12))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    for _ in range(5):
        clock.advance(US)
        assert (await limiter.hit("api", who)).allowed
    clock.advance(US)
    refused = await limiter.hit("api", who)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(12 * 3600 - 6)
    clock.us = utc_us(2024, 3, 1)
    assert (await limiter.hit("api", who)).allowed


async def test_all_or_nothing_with_the_rates(make_limiter: MakeLimiter) -> None:
    """A request the rate refuses spends no quota, and one the quota refuses spends no
    rate: each check is consumed only when every enforced check admits."""
    clock = TestClock(utc_us(2026, 6, 10, 12))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert (await limiter.hit("api", who)).allowed
    assert (await limiter.hit("api", who)).allowed
    by_rate = await limiter.hit("api", who)
    assert not by_rate.allowed
    assert [r.algorithm for r in by_rate.denied_by] == ["gcra"]
    assert quota_of(by_rate, "day").remaining == 3
    # The quota refuses the third request of a day, which the rate (3 an hour) would
    # admit: the rate is not spent, so after midnight it admits one more, then refuses.
    clock.us = utc_us(2026, 6, 10, 23, 59, 58)
    assert (await limiter.hit("mix", who)).allowed
    assert (await limiter.hit("mix", who)).allowed
    by_quota = await limiter.hit("mix", who)
    assert [r.algorithm for r in by_quota.denied_by] == ["quota:day"]
    clock.advance(3 * US)
    assert (await limiter.hit("mix", who)).allowed
    by_rate_again = await limiter.hit("mix", who)
    assert [r.algorithm for r in by_rate_again.denied_by] == ["sliding_window"]
    assert quota_of(by_rate_again, "day").remaining == 1


async def test_costs_and_peek(make_limiter: MakeLimiter) -> None:
    """A cost counts its units; a cost the quota can never hold waits forever; a cost
    that does not fit now waits for the period's end; peek consumes nothing."""
    clock = TestClock(utc_us(2026, 6, 10, 23, 59, 58))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert quota_of(await limiter.hit("api", who, cost=2), "day").remaining == 3
    assert quota_of(await limiter.peek("api", who, cost=2), "day").remaining == 3
    clock.advance(US)
    assert quota_of(await limiter.hit("api", who, cost=2), "day").remaining == 1
    too_big = await limiter.hit("api", who, cost=6)
    assert math.isinf(quota_of(too_big, "day").retry_after)
    later = await limiter.hit("api", who, cost=2)
    assert not later.allowed
    assert quota_of(later, "day").retry_after == pytest.approx(1.0)


async def test_a_shadow_quota_reports_and_never_denies(make_limiter: MakeLimiter) -> None:
    """enforce: false: the second request of the day would be refused, and is admitted."""
    clock = TestClock(utc_us(2026, 6, 10, 12))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert (await limiter.hit("watch", who)).allowed
    second = await limiter.hit("watch", who)
    assert second.allowed
    assert [r.algorithm for r in second.shadow_denied_by] == ["quota:day"]


async def test_a_time_zones_day_starts_at_its_midnight(make_limiter: MakeLimiter) -> None:
    """Europe/Berlin in summer: the day ends at 22:00 UTC."""
    clock = TestClock(utc_us(2026, 7, 1, 21, 59, 59))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert (await limiter.hit("berlin", who)).allowed
    assert (await limiter.hit("berlin", who)).allowed
    refused = await limiter.hit("berlin", who)
    assert refused.retry_after == pytest.approx(1.0)
    clock.advance(US)
    assert (await limiter.hit("berlin", who)).allowed


async def test_a_billing_quota_needs_a_billing_day(make_limiter: MakeLimiter) -> None:
    """Without keys['billing_day'], or with one that is no day of a month, the call is
    refused with an error that names the key and the fix; nothing is counted."""
    limiter = make_limiter(POLICY, test_clock=TestClock(utc_us(2026, 6, 10)))
    who = user()
    with pytest.raises(InvalidArgumentError, match=r"keys\['billing_day'\]"):
        await limiter.hit("api", who, tier="pro")
    for bad in (0, 32, "", "x1", "٣", "+5", " 5", True, 5.0, "005"):
        with pytest.raises(InvalidArgumentError, match="not a billing day"):
            await limiter.hit("api", who, tier="pro", keys={"billing_day": bad})
    peeked = await limiter.peek("api", who, tier="pro", keys={"billing_day": 10})
    assert quota_of(peeked, "month").remaining == 4


async def test_a_callers_keys_share_one_slot_and_reset_clears_the_period(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """Every key of one caller (rates and quotas) hashes to one slot; the quota's key
    names its period; reset() deletes the current period's counters."""
    clock = TestClock(utc_us(2026, 6, 10, 12))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    keys = {"billing_day": 15}
    for _ in range(4):
        clock.advance(US)
        assert (await limiter.hit("api", who, tier="pro", keys=keys)).allowed
    found = sorted(k.decode() if isinstance(k, bytes) else k for k in all_keys(redis_admin, "q:*"))
    assert any(k.endswith(":month:quota:2026-06-01") for k in found)
    assert any(k.endswith(":billing:quota:2026-05-15") for k in found)
    assert len({key_slot(k.encode()) for k in found}) == 1
    assert not (await limiter.hit("api", who, tier="pro", keys=keys)).allowed
    await limiter.reset("api", who, keys=keys)
    assert (await limiter.hit("api", who, tier="pro", keys=keys)).allowed


async def test_a_quota_denial_is_answered_locally_until_the_period_ends(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """The denial cache holds a quota's refusal until the period's end: no script call
    until then, and the first request of the next period goes to Redis."""
    clock = TestClock(utc_us(2026, 6, 10, 23, 59, 50))
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    for _ in range(5):
        clock.advance(US)
        assert (await limiter.hit("api", who)).allowed
    clock.advance(US)
    assert not (await limiter.hit("api", who)).allowed
    before = script_calls(redis_admin)
    clock.advance(2 * US)
    local = await limiter.hit("api", who)
    assert not local.allowed
    assert local.retry_after == pytest.approx(2.0, abs=1e-5)
    assert script_calls(redis_admin) == before
    clock.us = utc_us(2026, 6, 11)
    assert (await limiter.hit("api", who)).allowed
    assert script_calls(redis_admin) == before + 1


async def test_observers_hear_a_quota_denial(make_limiter: MakeLimiter) -> None:
    """Each result is an event: the quota's carries its algorithm (quota:day) and its
    outcome; a decision made without Redis names the quota too."""
    from applimit import DecisionEvent

    heard: list[DecisionEvent] = []

    class Listener:
        def on_decision(self, event: DecisionEvent) -> None:
            heard.append(event)

    clock = TestClock(utc_us(2026, 6, 10, 12))
    limiter = make_limiter(POLICY, test_clock=clock, observers=[Listener()])
    who = user()
    for _ in range(5):
        clock.advance(US)
        await limiter.hit("api", who)
    clock.advance(US)
    await limiter.hit("api", who)
    last = [(e.algorithm, e.outcome.value) for e in heard[-2:]]
    assert last == [("gcra", "allowed"), ("quota:day", "denied")]


def test_a_degraded_decision_names_the_quota() -> None:
    """When Redis cannot answer, each limit's on_redis_error decides; the quota's result
    still says it is the quota (its algorithm and period length)."""
    import edgegen_policy as policy

    from applimit._plan import make_core
    from applimit._rules import compile_policy

    core = make_core(compile_policy(policy.loads(POLICY)), cluster=False, test_clock=lambda: 1.8e9)
    prepared = core.for_limit("hit", "api", "alice", None, 1)
    degraded = prepared.degraded(1.0)
    assert [r.algorithm for r in degraded.results] == ["gcra", "quota:day"]
    assert degraded.results[1].window == 86_400


SPLIT = """
version: 1
app: {key_prefix: qs, timeout: 2s}
limits:
  - name: by-address
    match: {path_prefix: /api/}
    app: {per: ip, tiers: {default: 1/1h}}
  - name: by-user
    match: {path_prefix: /api/}
    app:
      tiers: {default: 100/1s}
      quotas: {default: {day: 5}}
"""


async def test_a_request_denied_by_another_identitys_limit_gives_the_quota_back(
    make_limiter: MakeLimiter,
) -> None:
    """A per-IP limit refuses the second request: the user's quota is not spent by it
    (on a cluster the two identities are two calls, and the user's is refunded)."""
    clock = TestClock(utc_us(2026, 6, 10, 12))
    limiter = make_limiter(SPLIT, test_clock=clock)
    who = user()
    assert (await limiter.check_request("GET", "/api/x", who, ip="192.0.2.7")).allowed
    clock.advance(US)
    refused = await limiter.check_request("GET", "/api/x", who, ip="192.0.2.7")
    assert [r.name for r in refused.denied_by] == ["by-address"]
    assert quota_of(refused, "day").consumed is False
    left = quota_of(await limiter.peek("by-user", who), "day")
    assert left.remaining == 4


def test_memory_stores_clock_places_quotas_in_their_periods() -> None:
    """On memory:// without a test clock, the store's clock (what the pytest plugin's
    applimit_clock moves) is the time of the quotas' periods, as it is the script's."""
    import edgegen_policy as policy

    from applimit import Limiter, _memory

    now = [utc_us(2030, 1, 31, 23, 59, 59) / US]
    text = POLICY.replace("{key_prefix: q,", "{redis_url: 'memory://quota-clock', key_prefix: q,")
    with _memory.use_clock(lambda: now[0]):
        _memory.store("quota-clock").clear()
        with Limiter(policy.loads(text)) as limiter:
            admitted = [limiter.hit("mix", "carol").allowed for _ in range(4)]
            assert admitted == [True, True, False, False]
            refused = limiter.hit("mix", "carol")
            assert quota_of(refused, "day").retry_after == pytest.approx(1.0)
            now[0] += 1
            assert quota_of(limiter.peek("mix", "carol"), "day").remaining == 2


def test_a_remembered_plan_is_dated_anew_in_each_period() -> None:
    """The same plan (a user's, remembered) gets the key and the spec of the period of
    each call's time, forwards and back, while a policy without quotas gets the plain
    Core."""
    import edgegen_policy as policy

    from applimit._plan import Core, QuotaCore, make_core
    from applimit._rules import compile_policy

    now = [utc_us(2026, 2, 28, 23, 59, 59) / US]
    core = make_core(compile_policy(policy.loads(POLICY)), cluster=False, test_clock=lambda: now[0])
    assert isinstance(core, QuotaCore)

    def quota_key() -> str:
        prepared = core.for_limit("hit", "api", "dave", None, 1)
        return prepared.checks[-1].key

    assert quota_key().endswith(":day:quota:2026-02-28")
    now[0] += 1
    assert quota_key().endswith(":day:quota:2026-03-01")
    spec = core.for_limit("peek", "api", "dave", None, 1).calls[0].args[-1]
    assert spec == f"quota 5 {utc_us(2026, 3, 2)} 1 {utc_us(2026, 3, 1)} 0"
    now[0] -= 2
    assert quota_key().endswith(":day:quota:2026-02-28")
    plain = make_core(compile_policy(policy.loads(SPLIT.replace("quotas", "#"))), cluster=False)
    assert type(plain) is Core
