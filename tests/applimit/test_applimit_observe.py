"""Decision events under real Redis: every outcome reaches the observers and the Prometheus
and OpenTelemetry series, identities stay out of labels and are hashed in logs, an
observer that raises changes no decision, and every log record the limiter writes carries
its structured fields. Run for Limiter and AsyncLimiter."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import edgegen_policy as policy
import pytest
from harness import RedisServer
from limiter_support import Driver
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from applimit import AsyncLimiter, DecisionEvent, Limiter, Observer, Outcome
from applimit.otel import OpenTelemetryObserver
from applimit.prometheus import PrometheusObserver

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: obs, timeout: 200ms, on_redis_error: allow}
limits:
  - name: api
    app: {algorithm: gcra, tiers: {free: 2/1m, pro: 100/1m}}
  - name: trial
    app: {algorithm: sliding_window, enforce: false, tiers: {free: 1/1m, pro: 1/1m}}
  - name: login
    app: {algorithm: sliding_log, on_redis_error: deny, tiers: {free: 5/1m, pro: 5/1m}}
"""


class Recorder:
    """An observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[DecisionEvent] = []

    def on_decision(self, event: DecisionEvent) -> None:
        self.events.append(event)

    def outcomes(self, limit: str) -> list[str]:
        return [e.outcome.value for e in self.events if e.limit == limit]


class Exploding:
    """An observer that raises on every event."""

    def __init__(self) -> None:
        self.calls = 0

    def on_decision(self, event: DecisionEvent) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


MakeDriver = Callable[..., Driver]


@pytest.fixture(params=["sync", "async"])
async def make(
    request: pytest.FixtureRequest, redis_client: Any, redis_server: RedisServer
) -> AsyncIterator[MakeDriver]:
    """Build limiters of the shared server (or of ``redis_url``) with given observers."""
    made: list[Driver] = []

    def build(**options: Any) -> Driver:
        options.setdefault("redis_url", redis_server.url)
        cls = Limiter if request.param == "sync" else AsyncLimiter
        driver = Driver(cls(policy.loads(POLICY), **options))
        made.append(driver)
        return driver

    yield build
    for driver in made:
        await driver.close()


def _closed_port() -> int:
    """A local port nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_every_outcome_reaches_the_observer(make: MakeDriver) -> None:
    """Three hits on a 2/1m limit with a 1/1m shadow limit beside it: allowed, allowed,
    denied; the shadow limit allows the first and would deny the others. One event per
    limit result, with the decision's numbers."""
    recorder = Recorder()
    limiter = make(observers=[recorder])
    for _ in range(3):
        await limiter.check_request("GET", "/", "alice", tier="free")
    assert recorder.outcomes("api") == ["allowed", "allowed", "denied"]
    assert recorder.outcomes("trial") == ["allowed", "shadow_denied", "shadow_denied"]
    first = recorder.events[0]
    assert (first.limit, first.tier, first.algorithm) == ("api", "free", "gcra")
    assert first.operation == "hit" and first.cost == 1 and first.remaining == 1
    assert first.first and not recorder.events[1].first
    assert 0 < first.latency < 1
    assert "alice" not in first.identity_hash


async def test_prometheus_counts_each_outcome_by_limit_tier_and_outcome(
    make: MakeDriver,
) -> None:
    """The counters say what the decisions said; peeks are not counted; the latency of
    decisions Redis answered is observed once per decision."""
    registry = CollectorRegistry()
    limiter = make(observers=[PrometheusObserver(registry)])
    for _ in range(3):
        await limiter.check_request("GET", "/", "bob", tier="free")
    await limiter.peek("api", "bob", tier="free")
    await limiter.hit("api", "carol", tier="pro")

    def decisions(limit: str, tier: str, outcome: str) -> float:
        return _sample(
            registry, "applimit_decisions_total", limit=limit, tier=tier, outcome=outcome
        )

    assert decisions("api", "free", "allowed") == 2
    assert decisions("api", "free", "denied") == 1
    assert decisions("trial", "free", "allowed") == 1
    assert decisions("trial", "free", "shadow_denied") == 2
    assert decisions("api", "pro", "allowed") == 1
    # Four decisions went to Redis (the first denial is Redis'; the peek is not counted).
    assert _sample(registry, "applimit_redis_duration_seconds_count") == 4
    # No identity in any label.
    for metric in registry.collect():
        for sample in metric.samples:
            assert not any(
                who in value for value in sample.labels.values() for who in ("bob", "carol")
            )


async def test_a_repeated_denial_is_counted_as_answered_locally(make: MakeDriver) -> None:
    """Once denied, the next hit within the wait is answered by the denial cache: still a
    denial, and a local answer."""
    registry = CollectorRegistry()
    recorder = Recorder()
    limiter = make(observers=[PrometheusObserver(registry), recorder])
    for _ in range(4):
        await limiter.hit("api", "dave", tier="free")
    assert recorder.outcomes("api") == ["allowed", "allowed", "denied", "denied"]
    assert [e.answered_locally for e in recorder.events] == [False, False, False, True]
    assert _sample(registry, "applimit_local_answers_total", limit="api", tier="free") == 1
    assert (
        _sample(registry, "applimit_decisions_total", limit="api", tier="free", outcome="denied")
        == 2
    )


async def test_degraded_outcomes_and_the_open_breaker_are_counted(make: MakeDriver) -> None:
    """Redis unreachable (a closed port): each limit follows on_redis_error, counted as
    degraded_allowed or degraded_denied; once the breaker opens the gauge says so."""
    registry = CollectorRegistry()
    recorder = Recorder()
    limiter = make(
        redis_url=f"redis://127.0.0.1:{_closed_port()}",
        observers=[PrometheusObserver(registry), recorder],
    )
    for _ in range(4):
        decision = await limiter.check_request("GET", "/", "erin", tier="free")
        assert decision.degraded and not decision.allowed
    assert set(recorder.outcomes("api")) == {"degraded_allowed"}
    assert set(recorder.outcomes("login")) == {"degraded_denied"}
    # The shadow limit fails open with the app's default (allow).
    assert set(recorder.outcomes("trial")) == {"degraded_allowed"}
    assert not any(e.answered_locally for e in recorder.events)

    def count(limit: str, outcome: str) -> float:
        return _sample(
            registry, "applimit_decisions_total", limit=limit, tier="free", outcome=outcome
        )

    assert count("api", "degraded_allowed") == 4
    assert count("login", "degraded_denied") == 4
    assert _sample(registry, "applimit_breaker_state", node="main", state="open") == 1
    assert _sample(registry, "applimit_breaker_state", node="main", state="closed") == 0
    assert _sample(registry, "applimit_redis_duration_seconds_count") == 0


async def test_an_observer_that_raises_changes_no_decision(
    make: MakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """The decisions are those of a limiter without observers, the observers after it
    still hear of them, and the error is logged once, with structured fields."""
    caplog.set_level(logging.INFO, logger="applimit")
    exploding = Exploding()
    recorder = Recorder()
    limiter = make(observers=[exploding, recorder])
    allowed = [(await limiter.hit("api", "frank", tier="free")).allowed for _ in range(3)]
    assert allowed == [True, True, False]
    assert exploding.calls == 3
    assert recorder.outcomes("api") == ["allowed", "allowed", "denied"]
    failures = [r for r in caplog.records if getattr(r, "applimit_event", "") == "observer_failed"]
    assert len(failures) == 1
    assert "observer bug" in failures[0].getMessage()


async def test_an_object_without_on_decision_is_refused(make: MakeDriver) -> None:
    """A misplaced object fails at construction, not on the first decision."""
    with pytest.raises(TypeError, match="on_decision"):
        make(observers=[object()])


def test_the_recorder_is_an_observer() -> None:
    """The protocol is runtime-checkable: what apps write satisfies it."""
    assert isinstance(Recorder(), Observer)
    assert Outcome("shadow_denied") is Outcome.SHADOW_DENIED


async def test_shadow_denials_are_logged_once_with_a_hashed_identity(
    make: MakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """With no observer at all, a shadow limit that would deny is logged (once a minute
    per limit and tier) with the limit, the tier and a hash of the identity, not the
    identity; log_identities=True opts in to the raw key."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = make()
    for _ in range(4):
        await limiter.check_request("GET", "/", "grace", tier="pro")
    shadow = [r for r in caplog.records if getattr(r, "applimit_event", "") == "shadow_denied"]
    assert len(shadow) == 1
    record: Any = shadow[0]
    assert (record.limit, record.tier, record.outcome) == ("trial", "pro", "shadow_denied")
    assert "grace" not in record.getMessage() and "grace" not in record.identity_hash
    assert record.identity_hash in record.getMessage()

    caplog.clear()
    opted = make(log_identities=True)
    await opted.check_request("GET", "/", "heidi", tier="pro")
    await opted.check_request("GET", "/", "heidi", tier="pro")
    shadow = [r for r in caplog.records if getattr(r, "applimit_event", "") == "shadow_denied"]
    assert len(shadow) == 1 and "heidi" in shadow[0].getMessage()


async def test_outage_and_recovery_are_logged_at_one_level_with_fields(
    make: MakeDriver, fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The outage warning and the recovery line are both warnings and both carry
    applimit_event and node; no "too busy" line for a stopped Redis."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = make(redis_url=fresh_redis_server.url)
    assert not (await limiter.hit("api", "ivan", tier="pro")).degraded
    fresh_redis_server.stop()
    for _ in range(5):
        assert (await limiter.hit("api", "ivan", tier="pro")).degraded
    fresh_redis_server.start()
    for _ in range(200):
        if not (await limiter.hit("api", "ivan", tier="pro")).degraded:
            break
        await _pause(0.02)
    else:
        pytest.fail("the limiter did not come back")
    records = [r for r in caplog.records if r.name == "applimit"]
    events = [getattr(r, "applimit_event", None) for r in records]
    assert events == ["redis_outage", "redis_recovered"], [r.getMessage() for r in records]
    assert {r.levelno for r in records} == {logging.WARNING}
    assert all(getattr(r, "node", None) == "main" for r in records)


async def _pause(seconds: float) -> None:
    """Give a restarted server time to accept connections (a wait for a process, not
    for the limiter)."""
    import asyncio

    await asyncio.sleep(seconds)


async def test_every_record_the_limiter_writes_has_structured_fields(
    make: MakeDriver, caplog: pytest.LogCaptureFixture
) -> None:
    """Through an outage, shadow denials and a failing observer: each applimit record
    names its event, for JSON handlers to index."""
    caplog.set_level(logging.DEBUG, logger="applimit")
    limiter = make(redis_url=f"redis://127.0.0.1:{_closed_port()}", observers=[Exploding()])
    for _ in range(3):
        await limiter.check_request("GET", "/", "judy", tier="free")
    good = make(observers=[Exploding()])
    for _ in range(3):
        await good.check_request("GET", "/", "judy", tier="free")
    records = [r for r in caplog.records if r.name == "applimit"]
    assert records
    assert all(isinstance(getattr(r, "applimit_event", None), str) for r in records)


async def test_opentelemetry_exports_the_same_counts(make: MakeDriver) -> None:
    """The OpenTelemetry observer, read by the SDK's in-memory reader: decisions by
    limit, tier and outcome, local answers, and the breaker state."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        limiter = make(observers=[OpenTelemetryObserver(meter_provider=provider)])
        for _ in range(4):
            await limiter.hit("api", "ken", tier="free")
        data = reader.get_metrics_data()
        assert data is not None
        points: dict[str, list[Any]] = {}
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points[metric.name] = list(metric.data.data_points)
        counted = {
            (p.attributes["limit"], p.attributes["tier"], p.attributes["outcome"]): p.value
            for p in points["applimit.decisions"]
        }
        assert counted == {("api", "free", "allowed"): 2, ("api", "free", "denied"): 2}
        assert [p.value for p in points["applimit.local_answers"]] == [1]
        assert sum(p.count for p in points["applimit.redis.duration"]) == 3
        state = {
            (p.attributes["node"], p.attributes["state"]): p.value
            for p in points["applimit.breaker.state"]
        }
        assert state[("main", "closed")] == 1 and state[("main", "open")] == 0
    finally:
        provider.shutdown()


async def test_a_hung_redis_is_an_outage_not_a_busy_process(
    make: MakeDriver, fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP: the first decisions run into their deadline before the socket timeout
    reports the outage. That is logged as the outage it is, never as "the process is too
    busy"; after SIGCONT, the recovery line follows."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = make(redis_url=fresh_redis_server.url)
    assert not (await limiter.hit("api", "lena", tier="pro")).degraded
    fresh_redis_server.pause()
    try:
        for _ in range(6):
            assert (await limiter.hit("api", "lena", tier="pro")).degraded
    finally:
        fresh_redis_server.resume()
    for _ in range(200):
        if not (await limiter.hit("api", "lena", tier="pro")).degraded:
            break
        await _pause(0.02)
    else:
        pytest.fail("the limiter did not come back")
    await limiter.hit("api", "lena", tier="pro")
    messages = [r.getMessage() for r in caplog.records if r.name == "applimit"]
    assert not any("too busy" in m for m in messages), messages
    events = [getattr(r, "applimit_event", None) for r in caplog.records]
    assert events.count("redis_outage") == 1 and events.count("redis_recovered") == 1


def test_the_fast_event_constructor_agrees_with_the_class() -> None:
    """The decision's path builds events through the slots (see applimit._frozen); they
    are the events the class' own constructor builds, frozen, and the counter key shows
    only hashed."""
    import dataclasses

    from applimit._observe import _event

    def hashed(key: str) -> str:
        return f"h({key})"

    values = ("api", "free", "gcra", Outcome.DENIED, "hit", 2, 0, 0.001, True, False, False)
    made = _event(*values, "k", hashed)
    built = DecisionEvent(*values, "k", hashed)
    assert made == built and type(made) is DecisionEvent and hash(made) == hash(built)
    names = ("limit", "tier", "algorithm", "outcome", "operation", "cost", "remaining")
    names += ("latency", "answered_locally", "first", "approximate")
    assert tuple(getattr(made, name) for name in names) == values
    assert made.identity_hash == "h(k)"
    assert "'k'" not in repr(made) and repr(made) == repr(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.limit = "other"  # type: ignore[misc]


APPROX_POLICY = """
version: 1
tiers: [free]
app: {key_prefix: obsax, timeout: 2s}
limits:
  - name: a
    app: {algorithm: sliding_log, mode: approximate, sync_every: 10, tiers: {free: 1000/1m}}
cloudflare: {plan: business}
"""


async def test_approximate_mode_syncs_and_local_answers_are_counted(
    redis_client: Any, redis_server: RedisServer, flavour: str
) -> None:
    """An approximate limit (sync_every 10): of 25 hits, those Redis answered are syncs
    and the rest local answers; together they are every hit."""
    registry = CollectorRegistry()
    recorder = Recorder()
    cls = Limiter if flavour == "sync" else AsyncLimiter
    limiter = Driver(
        cls(
            policy.loads(APPROX_POLICY),
            redis_url=redis_server.url,
            observers=[PrometheusObserver(registry), recorder],
        )
    )
    try:
        for _ in range(25):
            assert (await limiter.hit("a", "mallory")).allowed
    finally:
        await limiter.close()
    assert all(e.approximate for e in recorder.events)
    syncs = _sample(registry, "applimit_approx_syncs_total", limit="a", tier="free")
    local = _sample(registry, "applimit_local_answers_total", limit="a", tier="free")
    assert syncs >= 3 and local >= 10
    assert syncs + local == 25
    assert syncs == sum(not e.answered_locally for e in recorder.events)


async def test_an_exporter_fed_events_counts_as_one_attached_to_a_limiter(
    make: MakeDriver,
) -> None:
    """The limiters hand the exporters a result's fields without building an event; an
    exporter fed the events themselves (by another observer forwarding them) ends with
    the same series, and neither hears of peeks."""
    attached_registry, fed_registry = CollectorRegistry(), CollectorRegistry()
    attached = PrometheusObserver(attached_registry)
    fed = PrometheusObserver(fed_registry)

    class Forward:
        def on_decision(self, event: DecisionEvent) -> None:
            fed.on_decision(event)

    limiter = make(observers=[attached, Forward()])
    for _ in range(3):
        await limiter.hit("api", "trent")
        await limiter.hit("trial", "trent")
        await limiter.peek("api", "trent")

    def decisions(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
        return {
            tuple(sorted(sample.labels.items())): sample.value  # type: ignore[misc]
            for metric in registry.collect()
            if metric.name == "applimit_decisions"
            for sample in metric.samples
            if sample.name == "applimit_decisions_total"
        }

    assert decisions(attached_registry) == decisions(fed_registry)
    assert sum(decisions(attached_registry).values()) == 6


def test_an_outcome_hashes_as_the_str_it_equals() -> None:
    """Outcome.DENIED == "denied", so a mapping keyed by one finds the other."""
    from applimit._observe import Outcome

    for outcome in Outcome:
        assert outcome == outcome.value
        assert hash(outcome) == hash(outcome.value)
        assert {outcome: 1}[outcome.value] == 1
