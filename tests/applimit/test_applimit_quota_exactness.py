"""Exactness of calendar quotas under concurrency: 4 processes x 8 threads on one identity,
half their requests in the last µs of a month and half in the first µs of the next, admit
exactly the quota in each month, on one server and on a Redis Cluster.

Each process has two limiters whose test clocks (the script's time) stand on either side
of the month's end, and every thread alternates between them, so the two periods are
counted at the same moment by the same processes."""

from __future__ import annotations

import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime

import pytest
from harness import RedisCluster, RedisServer
from limiter_support import US, hammer_period_end

PROCESSES = 4
THREADS = 8
PER_THREAD = 10  # 320 attempts on each side of the end, on a quota of 100

POLICY = """
version: 1
tiers: [default]
app: {key_prefix: qx, timeout: 5s}
limits:
  - name: monthly
    app:
      algorithm: gcra
      tiers: {default: 100000/1s}
      quotas: {default: {month: 100}}
  - name: billed
    app:
      algorithm: sliding_window
      tiers: {default: 100000/1s}
      quotas: {default: {billing: 100}}
      billing_day_from: billing_day
"""


def end_of(year: int, month: int) -> int:
    """The first µs of the month after ``month`` (UTC), in µs since the epoch."""
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return int(following.timestamp()) * US


# A contract: one caller's own monthly quota, in place of its tier's 100.
CONTRACT = """overrides:
  - {limit: monthly, user: acme, quotas: {month: 150}, expires: "2999-01-01", reason: contract}
"""


def run(
    url: str,
    *,
    cluster: bool,
    end_us: int,
    name: str = "monthly",
    keys: dict[str, int] | None = None,
    identity: str | None = None,
    text: str = POLICY,
) -> tuple[int, int, int]:
    context = multiprocessing.get_context("spawn")
    identity = identity or uuid.uuid4().hex
    with context.Manager() as manager:
        start = manager.Barrier(PROCESSES + 1)
        with ProcessPoolExecutor(PROCESSES, mp_context=context) as pool:
            futures = [
                pool.submit(
                    hammer_period_end,
                    url,
                    cluster,
                    text,
                    name,
                    identity,
                    THREADS,
                    PER_THREAD,
                    end_us,
                    start,
                    keys,
                )
                for _ in range(PROCESSES)
            ]
            start.wait(timeout=120)
            outcomes = [f.result(timeout=120) for f in futures]
    return (
        sum(o[0] for o in outcomes),
        sum(o[1] for o in outcomes),
        sum(o[2] for o in outcomes),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "month",
    [
        # February 2026: 28 days. February 2024: 29 (the leap day is its last).
        (2026, 2),
        (2024, 2),
    ],
)
def test_a_monthly_quota_admits_exactly_its_quota_on_each_side_of_the_end(
    redis_server: RedisServer, month: tuple[int, int]
) -> None:
    """Exactly 100 in the month that ends and 100 in the one that starts, none degraded."""
    assert run(redis_server.url, cluster=False, end_us=end_of(*month)) == (100, 100, 0)


@pytest.mark.slow
def test_a_billing_day_31_ends_its_period_on_a_30_day_months_last_day(
    redis_server: RedisServer,
) -> None:
    """Billing day 31: the period from March 31st ends at April 30th 00:00 UTC, where the
    next begins (April has no 31st): 100 on each side of that instant."""
    end = int(datetime(2026, 4, 30, tzinfo=UTC).timestamp()) * US
    outcome = run(
        redis_server.url, cluster=False, end_us=end, name="billed", keys={"billing_day": 31}
    )
    assert outcome == (100, 100, 0)


@pytest.mark.slow
@pytest.mark.cluster
def test_on_a_cluster_as_well(redis_cluster: RedisCluster) -> None:
    """The same on a Redis Cluster: a caller's rate and quota keys share one slot, so one
    script decides them together."""
    assert run(redis_cluster.url, cluster=True, end_us=end_of(2026, 2)) == (100, 100, 0)


@pytest.mark.slow
def test_an_overrides_quota_is_as_exact(redis_server: RedisServer) -> None:
    """A caller whose override gives it 150 a month: exactly 150 on each side of the end."""
    outcome = run(
        redis_server.url,
        cluster=False,
        end_us=end_of(2026, 2),
        identity="acme",
        text=POLICY + CONTRACT,
    )
    assert outcome == (150, 150, 0)
