"""Approximate mode: local counting synced in batches, against real Redis.

Every test runs over standalone and cluster, sync and async, under a test clock (time
moves by hand, nothing sleeps). Several limiter instances on one Redis stand for several
app servers.
"""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from limiter_support import US, MakeLimiter, TestClock, script_calls

from bench.bench_approx import overshoot_bound


def policy(rate: str, *, sync_every: int | None = None, interval: str | None = None) -> str:
    """A policy with one approximate limit ``a``, its exact twin ``e`` and both on /both/."""
    options = ""
    if sync_every is not None:
        options += f", sync_every: {sync_every}"
    if interval is not None:
        options += f", sync_interval: {interval}"
    return f"""
version: 1
tiers: [free]
app: {{key_prefix: ax, timeout: 2s}}
limits:
  - name: a
    match: {{path_prefix: /a/}}
    app: {{algorithm: sliding_log, mode: approximate{options}, tiers: {{free: {rate}}}}}
  - name: e
    match: {{path_prefix: /e/}}
    app: {{algorithm: sliding_log, tiers: {{free: {rate}}}}}
  - name: both
    match: {{path_prefix: /a/both}}
    app: {{algorithm: sliding_log, tiers: {{free: {rate}}}}}
cloudflare: {{plan: business}}
"""


def user() -> str:
    """A fresh identity, so tests never share keys."""
    return f"user-{uuid.uuid4()}"


async def test_overshoot_of_four_instances_stays_within_the_bound(
    make_limiter: MakeLimiter,
) -> None:
    """Four instances taking turns on one identity of a 100/1m limit (sync_every 10) admit
    at least the limit and at most the limit plus the documented bound, K x (N - 1)."""
    clock = TestClock()
    limiters = [make_limiter(policy("100/1m", sync_every=10), test_clock=clock) for _ in range(4)]
    who = user()
    admitted = 0
    for i in range(1000):
        if (await limiters[i % 4].hit("a", who)).allowed:
            admitted += 1
    bound = overshoot_bound(4, 10)
    assert bound == 4 * 9
    assert 100 <= admitted <= 100 + bound


async def test_steady_load_makes_ten_times_fewer_script_calls(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """Well within the limit, sync_every 10 sends one script call per 10 decisions (and
    sync_every 20 one per 20), while exact mode sends one per decision."""
    clock = TestClock()
    for sync_every, factor in ((10, 10), (20, 20)):
        limiters = [
            make_limiter(policy("100000/1m", sync_every=sync_every), test_clock=clock)
            for _ in range(4)
        ]
        who = user()
        for limiter in limiters:
            assert (await limiter.hit("a", who)).allowed
        before = script_calls(redis_admin)
        decisions = 4 * sync_every * 25
        for i in range(decisions):
            decision = await limiters[i % 4].hit("a", who)
            assert decision.allowed and not decision.degraded
        calls = script_calls(redis_admin) - before
        assert calls > 0
        assert decisions / calls >= factor


async def test_sync_every_one_is_exact_mode(make_limiter: MakeLimiter, redis_admin: Any) -> None:
    """With sync_every 1 every decision goes to Redis and says what exact mode says."""
    clock = TestClock()
    limiter = make_limiter(policy("5/1m", sync_every=1), test_clock=clock)
    who = user()
    before = script_calls(redis_admin)
    for _ in range(8):
        approx = await limiter.hit("a", who)
        exact = await limiter.hit("e", who)
        assert (approx.allowed, approx.remaining, approx.retry_after) == (
            exact.allowed,
            exact.remaining,
            exact.retry_after,
        )
        clock.advance(US)
    # Denials after the first are answered by the denied-until cache, in both modes alike.
    assert script_calls(redis_admin) - before <= 16


async def test_local_answers_count_down_and_exhaustion_asks_redis(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """Local answers report the local estimate of remaining, are not degraded, and once the
    local view is exhausted the denial comes from Redis, with its wait."""
    clock = TestClock()
    limiter = make_limiter(policy("5/1m", sync_every=100), test_clock=clock)
    who = user()
    seen = [await limiter.hit("a", who) for _ in range(5)]
    assert [d.remaining for d in seen] == [4, 3, 2, 1, 0]
    assert all(d.allowed and not d.degraded for d in seen)
    before = script_calls(redis_admin)
    denied = await limiter.hit("a", who)
    assert not denied.allowed and denied.retry_after is not None
    assert script_calls(redis_admin) > before
    # Every admitted request was counted in Redis: an exact peek agrees.
    assert (await limiter.peek("a", who)).remaining == 0


async def test_sync_interval_forces_a_sync(make_limiter: MakeLimiter, redis_admin: Any) -> None:
    """With a large sync_every, requests are answered locally until sync_interval of test
    clock time has passed since the last sync; the next request then syncs."""
    clock = TestClock()
    limiter = make_limiter(policy("1000/1m", sync_every=1000, interval="100ms"), test_clock=clock)
    who = user()
    assert (await limiter.hit("a", who)).allowed
    before = script_calls(redis_admin)
    for _ in range(20):
        assert (await limiter.hit("a", who)).allowed
        clock.advance(4_000)  # 20 x 4 ms = 80 ms < 100 ms
    assert script_calls(redis_admin) == before
    clock.advance(20_000)
    assert (await limiter.hit("a", who)).allowed
    assert script_calls(redis_admin) == before + 1
    # The batch carried every locally admitted request.
    assert (await limiter.peek("a", who)).remaining == 1000 - 22


async def test_a_request_that_also_matches_an_exact_limit_is_decided_exactly(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """A request matching an approximate and an exact limit goes to Redis every time."""
    clock = TestClock()
    limiter = make_limiter(policy("100/1m", sync_every=10), test_clock=clock)
    who = user()
    before = script_calls(redis_admin)
    for _ in range(5):
        assert (await limiter.check_request("GET", "/a/both", who)).allowed
    assert script_calls(redis_admin) - before >= 5
    assert (await limiter.peek("a", who)).remaining == 95


async def test_reset_drops_the_local_state(make_limiter: MakeLimiter) -> None:
    """After a reset the instance asks Redis again instead of denying from its local view."""
    clock = TestClock()
    limiter = make_limiter(policy("3/1m", sync_every=10), test_clock=clock)
    who = user()
    for _ in range(3):
        assert (await limiter.hit("a", who)).allowed
    assert not (await limiter.hit("a", who)).allowed
    assert await limiter.reset("a", who)
    assert (await limiter.hit("a", who)).allowed


async def test_threads_sharing_one_limiter_stay_within_the_bound(make_limiter: MakeLimiter) -> None:
    """Eight threads on one sync Limiter admit at least the limit and at most the limit
    plus sync_every - 1: one instance's bound, however many of its threads sync at once
    (test_applimit_approximate_bound.py tries many more mixes)."""
    driver = make_limiter(policy("100/1m", sync_every=10), test_clock=TestClock())
    if driver.is_async:
        pytest.skip("threads share a sync Limiter; the async one runs on one event loop")
    limiter = driver.limiter
    who = user()

    def hits(_: int) -> int:
        return sum(1 for _ in range(100) if limiter.hit("a", who).allowed)

    with ThreadPoolExecutor(8) as pool:
        admitted = sum(pool.map(hits, range(8)))
    assert 100 <= admitted <= 100 + overshoot_bound(1, 10)
