"""The "denied until" cache: repeated denials are answered without Redis, and exactly.

Every test runs over standalone and cluster, sync and async, under a test clock: time is
moved by hand, so "expires exactly at the retry time" is checked to the microsecond.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from limiter_support import US, MakeLimiter, TestClock, script_calls

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: d, timeout: 2s}
limits:
  - name: log
    match: {path_prefix: /log/}
    app: {algorithm: sliding_log, tiers: {free: 2/1m, pro: 5/1m}}
  - name: win
    match: {path_prefix: /win/}
    app: {algorithm: sliding_window, tiers: {free: 2/1m}}
  - name: bucket
    match: {path_prefix: /bucket/}
    app: {algorithm: gcra, tiers: {free: 2/1m}}
  - name: strict
    match: {path_prefix: /both/}
    app: {algorithm: gcra, tiers: {free: [1/1m, 10/1h]}}
  - name: loose
    match: {path_prefix: /both/}
    app: {algorithm: sliding_window, tiers: {free: 5/1m}}
  - name: watch
    match: {path_prefix: /shadow/}
    app: {algorithm: sliding_log, enforce: false, tiers: {free: 1/1m}}
cloudflare: {plan: business}
"""


def user() -> str:
    """A fresh identity, so tests never share keys."""
    return f"user-{uuid.uuid4()}"


@pytest.mark.parametrize("name", ["log", "win", "bucket"])
async def test_a_repeated_denial_is_answered_locally_until_the_retry_time(
    make_limiter: MakeLimiter, redis_admin: Any, name: str
) -> None:
    """Once denied, the identity's requests are denied without a Redis call, with the wait
    shrinking as time passes, until exactly the retry time, when Redis is asked again."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert (await limiter.hit(name, who)).allowed
    assert (await limiter.hit(name, who)).allowed
    first = await limiter.hit(name, who)
    assert not first.allowed and first.retry_after is not None
    wait_us = round(first.retry_after * US)
    before = script_calls(redis_admin)
    clock.advance(wait_us // 2)
    again = await limiter.hit(name, who)
    peeked = await limiter.peek(name, who)
    assert script_calls(redis_admin) == before
    for local in (again, peeked):
        assert not local.allowed and not local.degraded
        assert local.remaining == 0
        assert local.retry_after == pytest.approx((wait_us - wait_us // 2) / US, abs=1e-6)
        assert local.reset_after == pytest.approx(first.reset_after - (wait_us // 2) / US, abs=1e-6)
    clock.advance(wait_us - wait_us // 2 - 1)
    assert not (await limiter.hit(name, who)).allowed
    assert script_calls(redis_admin) <= before + 1  # at most the 1 µs safety margin
    clock.advance(1)
    calls = script_calls(redis_admin)
    assert (await limiter.hit(name, who)).allowed
    assert script_calls(redis_admin) == calls + 1


async def test_a_denial_says_nothing_about_another_identity_or_tier(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """The cache is per identity and tier: a denied free user does not deny a pro one on
    the same key, nor anyone else."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    for _ in range(3):
        await limiter.hit("log", who)
    assert not (await limiter.hit("log", who)).allowed
    assert (await limiter.hit("log", who, tier="pro")).allowed
    assert (await limiter.hit("log", user())).allowed


async def test_larger_costs_and_shadow_limits_go_to_redis(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """Only cost-1 denials by enforced limits are cached; a request of another cost, and
    a shadow limit's would-be denial, are decided by Redis."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    for _ in range(3):
        await limiter.hit("log", who)
    before = script_calls(redis_admin)
    denied = await limiter.hit("log", who, cost=2)
    assert not denied.allowed
    assert script_calls(redis_admin) == before + 1
    for _ in range(3):
        decision = await limiter.check_request("GET", "/shadow/x", who)
        assert decision.allowed
    assert script_calls(redis_admin) == before + 4


async def test_multi_limit_requests_answer_locally_with_every_result(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """A request checked against several limits is answered locally when one of them
    denied it: every result is there, the other limits' counts as the denial gave them,
    and nothing is consumed."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    assert (await limiter.check_request("GET", "/both/x", who)).allowed
    first = await limiter.check_request("GET", "/both/x", who)
    assert not first.allowed and first.policy == "strict"
    assert first.retry_after is not None
    before = script_calls(redis_admin)
    clock.advance(US)
    local = await limiter.check_request("GET", "/both/x", who)
    assert script_calls(redis_admin) == before
    assert [(r.name, r.quota, r.allowed, r.consumed) for r in local.results] == [
        (r.name, r.quota, r.allowed, False) for r in first.results
    ]
    assert local.retry_after == pytest.approx(first.retry_after - 1, abs=1e-6)
    loose = await limiter.peek("loose", who)
    assert loose.remaining == 4  # the locally denied request consumed nothing


async def test_a_local_reset_clears_the_cache(make_limiter: MakeLimiter) -> None:
    """reset() on the instance forgets its cached denials: the next request is admitted."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    for _ in range(3):
        await limiter.hit("bucket", who)
    assert not (await limiter.hit("bucket", who)).allowed
    assert await limiter.reset("bucket", who)
    assert (await limiter.hit("bucket", who)).allowed


async def test_a_never_fitting_cost_is_not_confused_with_a_cost_of_one(
    make_limiter: MakeLimiter,
) -> None:
    """A cost above the quota is denied forever, which says nothing about cost 1."""
    clock = TestClock()
    limiter = make_limiter(POLICY, test_clock=clock)
    who = user()
    never = await limiter.hit("log", who, cost=3)
    assert not never.allowed and never.retry_after == math.inf
    assert (await limiter.hit("log", who)).allowed
