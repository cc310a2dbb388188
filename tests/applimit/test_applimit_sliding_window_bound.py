"""The error bound of ``sliding_window``, measured (docs/applimit.md states it).

The two-counter estimate ``prev x (1 - f) + cur`` (f: elapsed fraction of the current
window) assumes the previous window's requests were spread evenly. The true count of any
window (t - P, t] is at most ``limit + f x prev``, so at most ``limit x (1 + f)``: the
worst case, approached when the previous window's requests all came at its very end and
the current window's near its end, is twice the limit. Steady traffic comes nowhere near.
Both are measured here with a test clock, so the numbers are exact and repeatable.
"""

from __future__ import annotations

import bisect
import math
import random
import uuid
from collections.abc import Iterator

import edgegen_policy as policy
import pytest
from harness import RedisServer
from limiter_support import US, TestClock

from applimit import Limiter

LIMIT = 100
PERIOD = 60 * US
POLICY = f"""
version: 1
app: {{key_prefix: bound, timeout: 2s}}
limits:
  - name: w
    app: {{algorithm: sliding_window, tiers: {{default: {LIMIT}/1m}}}}
"""


@pytest.fixture
def clock() -> TestClock:
    return TestClock(start_us=1_000_000 * PERIOD)  # at a window edge


@pytest.fixture
def limiter(redis_server: RedisServer, clock: TestClock) -> Iterator[Limiter]:
    with Limiter(policy.loads(POLICY), redis_url=redis_server.url, test_clock=clock) as made:
        yield made


def _worst_window(admitted: list[int]) -> int:
    """The most admitted requests in any window (t - P, t], t an admission time."""
    return max(
        bisect.bisect_right(admitted, t) - bisect.bisect_right(admitted, t - PERIOD)
        for t in admitted
    )


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5, 0.75, 0.9, 0.99])
def test_adversarial_burst_reaches_the_bound_and_never_passes_it(
    limiter: Limiter, clock: TestClock, fraction: float
) -> None:
    """A full window's quota in its last microsecond, then a burst at fraction f of the
    next window: exactly floor(f x limit) more are admitted, so the true window holds
    limit x (1 + f), the stated bound, and not one more."""
    who = uuid.uuid4().hex
    clock.advance(PERIOD - 1)
    admitted = [clock.us for _ in range(LIMIT) if limiter.hit("w", who).allowed]
    assert len(admitted) == LIMIT
    clock.advance(1 + round(fraction * PERIOD))
    burst = 0
    while limiter.hit("w", who).allowed:
        burst += 1
        admitted.append(clock.us)
    assert burst == math.floor(fraction * LIMIT)
    # Every one of them is inside (now - P, now].
    assert _worst_window(admitted) == LIMIT + burst <= LIMIT * (1 + fraction)


@pytest.mark.parametrize("load", [0.8, 1.0, 1.5, 3.0])
def test_steady_random_traffic_stays_close_to_the_limit(
    limiter: Limiter, clock: TestClock, load: float
) -> None:
    """4,000 Poisson arrivals at 0.8x to 3x the limit (seeded): no window of one minute
    ever holds more than 10% over the limit (docs/applimit.md quotes the measured worst)."""
    who = uuid.uuid4().hex
    rnd = random.Random(20_240_601)
    admitted: list[int] = []
    for _ in range(4_000):
        clock.advance(int(rnd.expovariate(load * LIMIT / PERIOD)))
        if limiter.hit("w", who).allowed:
            admitted.append(clock.us)
    worst = _worst_window(admitted)
    assert worst <= LIMIT * 1.10
