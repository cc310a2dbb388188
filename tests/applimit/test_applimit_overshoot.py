"""Approximate mode's overshoot, observed: requests admitted locally that a sync found
were over the limit reach ``on_overshoot`` once each, and the Prometheus and OpenTelemetry
counters equal what the instances really admitted beyond the limit.

Several limiter instances on one Redis stand for several app servers; a test clock that
never moves keeps the window (and the sync interval) still, so every admitted request
stays in the window and the overshoot is exactly the admitted count minus the limit.
"""

from __future__ import annotations

import uuid
from typing import Any

import edgegen_policy as policy
import redis
from harness import RedisServer
from limiter_support import US, MakeLimiter, TestClock
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from applimit import Decision, DecisionEvent, Limiter, Observer, _script
from applimit._flow import Wait, drive
from applimit.otel import OpenTelemetryObserver
from applimit.prometheus import PrometheusObserver

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: overshoot, timeout: 2s}
limits:
  - name: a
    app:
      algorithm: sliding_log
      mode: approximate
      sync_every: 10
      tiers: {free: 100/1h, pro: [1000/1h, 100/1h]}
cloudflare: {plan: business}
"""


class Overshoots:
    """An observer that keeps what it is told of overshoot."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, int]] = []

    def on_decision(self, event: DecisionEvent) -> None:
        """Decisions are not what this test looks at."""

    def on_overshoot(self, limit: str, tier: str, count: int) -> None:
        self.reports.append((limit, tier, count))


def _prometheus(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _otel(reader: InMemoryMetricReader, name: str) -> dict[tuple[str, str], int]:
    data = reader.get_metrics_data()
    counts: dict[tuple[str, str], int] = {}
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    attributes: Any = point.attributes
                    counts[(attributes["limit"], attributes["tier"])] = int(point.value)  # type: ignore[union-attr]
    return counts


async def test_overshoot_counted_equals_what_four_instances_admitted_beyond_the_limit(
    make_limiter: MakeLimiter,
) -> None:
    """Four instances take turns on one identity of a 100/1h approximate limit (sync_every
    10) until all are denied: the overshoot they report, summed, equals the requests they
    admitted beyond 100, and is more than none (approximate mode did overshoot)."""
    clock = TestClock()
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    recorder = Overshoots()
    observers: list[Observer] = [
        PrometheusObserver(registry),
        OpenTelemetryObserver(MeterProvider(metric_readers=[reader])),
        recorder,
    ]
    limiters = [make_limiter(POLICY, test_clock=clock, observers=observers) for _ in range(4)]
    who = f"user-{uuid.uuid4()}"
    admitted = 0
    for i in range(600):
        if (await limiters[i % 4].hit("a", who)).allowed:
            admitted += 1
    # The last round was denied by every instance: what each admitted is all synced or
    # known to be over (nothing pending unseen).
    for limiter in limiters:
        assert not (await limiter.hit("a", who)).allowed
    assert admitted > 100
    assert {(limit, tier) for limit, tier, _ in recorder.reports} == {("a", "free")}
    assert all(count > 0 for _, _, count in recorder.reports)
    assert sum(count for _, _, count in recorder.reports) == admitted - 100
    assert _prometheus(registry, "applimit_approx_overshoot_total", limit="a", tier="free") == (
        admitted - 100
    )
    assert _otel(reader, "applimit.approx.overshoot") == {("a", "free"): admitted - 100}


async def test_a_tier_of_two_rates_counts_each_request_once(make_limiter: MakeLimiter) -> None:
    """The pro tier has two rates (1000/1h and 100/1h): a request over the tighter one is
    counted once, not once per rate."""
    clock = TestClock()
    recorder = Overshoots()
    limiters = [make_limiter(POLICY, test_clock=clock, observers=[recorder]) for _ in range(3)]
    who = f"user-{uuid.uuid4()}"
    admitted = 0
    for i in range(450):
        if (await limiters[i % 3].hit("a", who, tier="pro")).allowed:
            admitted += 1
    for limiter in limiters:
        assert not (await limiter.hit("a", who, tier="pro")).allowed
    assert admitted > 100
    assert sum(count for _, tier, count in recorder.reports if tier == "pro") == admitted - 100


async def test_within_the_limit_nothing_is_reported(make_limiter: MakeLimiter) -> None:
    """Well within the limit every sync is allowed: no overshoot, and the counter has no
    series."""
    clock = TestClock()
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    limiters = [make_limiter(POLICY, test_clock=clock, observers=[observer]) for _ in range(2)]
    who = f"user-{uuid.uuid4()}"
    for i in range(60):
        assert (await limiters[i % 2].hit("a", who)).allowed
    assert (
        registry.get_sample_value("applimit_approx_overshoot_total", {"limit": "a", "tier": "free"})
        is None
    )


FLUSH_POLICY = """
version: 1
app: {key_prefix: flush, timeout: 2s, on_redis_error: allow}
limits:
  - name: a
    app:
      algorithm: sliding_log
      mode: approximate
      sync_every: 5
      sync_interval: 1h
      tiers: {default: 10/1m}
"""


def test_a_flush_redis_did_not_answer_keeps_its_requests_pending(
    redis_client: redis.Redis, redis_server: RedisServer
) -> None:
    """An instance holds 4 requests admitted locally; others leave room for 2; its sync is
    denied and the flush of the 2 that fit fails (Redis down for that call, the limit
    failing open). None of the 4 is lost: once the window has passed, the next sync
    counts all 4 with the request (5 in Redis), and nothing was reported as overshoot for
    the failed flush beyond what the batch showed did not fit (2)."""
    clock = TestClock()
    recorder = Overshoots()
    loaded = policy.loads(FLUSH_POLICY)
    # Driven by hand: its calls run on a plain client, so one of them can be made to fail.
    instance = Limiter(
        loaded, redis_url="redis://127.0.0.1:1/0", test_clock=clock, observers=[recorder]
    )
    # The other instances, as one exact limiter on the same keys (its count is Redis').
    exact = FLUSH_POLICY
    for line in ("      mode: approximate\n", "      sync_every: 5\n", "      sync_interval: 1h\n"):
        assert line in exact
        exact = exact.replace(line, "")
    other = Limiter(policy.loads(exact), redis_url=redis_server.url, test_clock=clock)
    who = f"user-{uuid.uuid4()}"
    sends: list[str] = []
    # Which Send (counted from 1) fails: none until the test says.
    failing = [0]

    def answer(calls: Any) -> list[object]:
        sends.append(repr(calls))
        if len(sends) == failing[0]:
            return [redis.exceptions.ConnectionError("Connection refused")]
        return [
            redis_client.eval(_script.SOURCE, len(call.keys), *call.keys, *call.args)
            for call in calls
        ]

    def hit() -> Decision:
        prepared = instance.core.for_limit("hit", "a", who, None, 1)
        return drive(instance.decider, prepared, answer, no_wait)

    def no_wait(step: Wait) -> list[object]:
        raise AssertionError("nothing waits here")

    try:
        assert hit().allowed  # a sync: Redis counts 1
        for _ in range(4):
            assert hit().allowed  # local: 4 pending
        for _ in range(7):
            assert other.hit("a", who).allowed  # Redis: 8 of 10
        # The batch (4 pending + 1) is denied with room for 2; the flush of those 2 fails.
        failing[0] = len(sends) + 2
        assert not hit().allowed
        assert len(sends) == failing[0]
        assert recorder.reports == [("a", "default", 2)]
        clock.advance(61 * US)
        assert hit().allowed  # a sync of the 4 kept pending and the request
        assert other.peek("a", who).remaining == 10 - 5
        assert recorder.reports == [("a", "default", 2)]
    finally:
        instance.close()
        other.close()
