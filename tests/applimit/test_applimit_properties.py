"""Property tests: each algorithm's script against a simple reference model.

Hypothesis draws a rate and a sequence of (time step, cost, hit-or-peek) events; the same
events drive the real limiter on the real server (its time set through ``test_clock``,
so nothing sleeps) and the model in limiter_support. Every decision must agree exactly:
allowed, remaining, reset_after and retry_after, to the microsecond. Each property runs
twice: on Redis, and on the in-process ``memory://`` backend, whose port of the scripts
must agree with the same models.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import edgegen_policy as policy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from limiter_support import (
    US,
    Expected,
    GcraModel,
    SlidingLogModel,
    SlidingWindowModel,
    TestClock,
    as_expected,
)

from applimit import Limiter

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

PERIODS_MS = [1_000, 7_000, 60_000]


@pytest.fixture(scope="module", params=["redis", "memory"])
def url(request: pytest.FixtureRequest) -> str:
    """Where the limiter decides: the real server, or the in-process store."""
    if request.param == "memory":
        return "memory://properties"
    return str(request.getfixturevalue("redis_server").url)


@contextmanager
def limiter_for(
    url: str, algorithm: str, limit: int, period_ms: int, clock: TestClock, extra: str
) -> Iterator[Limiter]:
    text = f"""
version: 1
app: {{key_prefix: prop, timeout: 2s}}
limits:
  - name: x
    app: {{algorithm: {algorithm}, tiers: {{default: {limit}/{period_ms}ms}}{extra}}}
"""
    limiter = Limiter(policy.loads(text), redis_url=url, test_clock=clock)
    try:
        yield limiter
    finally:
        limiter.close()


@st.composite
def scenarios(draw: st.DrawFn, *, burst: bool = False) -> dict[str, object]:
    """A rate, where time starts within the first window, and a list of events."""
    limit = draw(st.integers(1, 12))
    period_ms = draw(st.sampled_from(PERIODS_MS))
    period = period_ms * 1000
    steps = st.one_of(
        st.integers(0, 2_000),
        st.integers(0, 2 * period),
        # Exact edges: an entry leaving, a window turning, an emission interval passing.
        st.sampled_from([period - 1, period, period + 1, period // max(1, limit)]),
    )
    events = draw(
        st.lists(
            st.tuples(steps, st.integers(1, limit + 2), st.sampled_from(["hit", "hit", "peek"])),
            min_size=1,
            max_size=40,
        )
    )
    scenario: dict[str, object] = {
        "limit": limit,
        "period_ms": period_ms,
        "start": draw(st.integers(0, period - 1)),
        "events": events,
    }
    if burst:
        scenario["burst"] = draw(st.one_of(st.none(), st.integers(1, 15)))
    return scenario


def _run(
    url: str,
    algorithm: str,
    scenario: dict[str, object],
    model: SlidingLogModel | GcraModel | SlidingWindowModel,
    extra: str = "",
) -> None:
    limit, period_ms = scenario["limit"], scenario["period_ms"]
    assert isinstance(limit, int) and isinstance(period_ms, int)
    start = scenario["start"]
    assert isinstance(start, int)
    # Time starts at an exact window edge plus an offset, as the server's clock might be.
    clock = TestClock(start_us=1_000_000 * period_ms * 1000 + start)
    who = uuid.uuid4().hex
    events = scenario["events"]
    assert isinstance(events, list)
    with limiter_for(url, algorithm, limit, period_ms, clock, extra) as limiter:
        for index, (step, cost, op) in enumerate(events):
            clock.advance(step)
            if op == "hit":
                decision = limiter.hit("x", who, cost=cost)
            else:
                decision = limiter.peek("x", who, cost=cost)
            assert not decision.degraded
            expected: Expected = model.decide(clock.us, cost, consume=op == "hit")
            assert as_expected(decision) == expected, (
                f"event {index} ({op} cost {cost} at +{clock.us % (period_ms * 1000)} µs "
                f"into a window)"
            )
            # hit reports consumption exactly when it admits.
            [result] = decision.results
            assert result.consumed == (op == "hit" and decision.allowed)


@SETTINGS
@given(scenario=scenarios())
def test_sliding_log_matches_the_model(url: str, scenario: dict[str, object]) -> None:
    """sliding_log agrees with a list of timestamps on every decision and every number."""
    limit, period_ms = scenario["limit"], scenario["period_ms"]
    assert isinstance(limit, int) and isinstance(period_ms, int)
    _run(url, "sliding_log", scenario, SlidingLogModel(limit, period_ms * 1000))


@SETTINGS
@given(scenario=scenarios())
def test_sliding_window_matches_the_model(url: str, scenario: dict[str, object]) -> None:
    """sliding_window agrees with two fixed-window counters weighed linearly (retry_after
    found by search in the model, by formula in the script)."""
    limit, period_ms = scenario["limit"], scenario["period_ms"]
    assert isinstance(limit, int) and isinstance(period_ms, int)
    _run(url, "sliding_window", scenario, SlidingWindowModel(limit, period_ms * 1000))


@SETTINGS
@given(scenario=scenarios(burst=True))
def test_gcra_matches_the_model(url: str, scenario: dict[str, object]) -> None:
    """gcra agrees with a theoretical arrival time kept as an exact Fraction, with and
    without an explicit burst, including rates whose interval is not a whole µs."""
    limit, period_ms = scenario["limit"], scenario["period_ms"]
    assert isinstance(limit, int) and isinstance(period_ms, int)
    burst = scenario["burst"]
    assert burst is None or isinstance(burst, int)
    extra = "" if burst is None else f", burst: {burst}"
    model = GcraModel(limit, period_ms * 1000, burst if burst is not None else limit)
    _run(url, "gcra", scenario, model, extra)


def test_models_agree_with_hand_computed_cases() -> None:
    """The models themselves, on cases small enough to check by hand."""
    log = SlidingLogModel(2, 10 * US)
    assert log.decide(0, 1, True) == Expected(True, 1, 10 * US, None)
    assert log.decide(4 * US, 1, True) == Expected(True, 0, 10 * US, None)
    # Full: the request fits when the entry of t=0 leaves, at t=10 s.
    assert log.decide(5 * US, 1, True) == Expected(False, 0, 9 * US, 5 * US)
    assert log.decide(10 * US, 1, True) == Expected(True, 0, 10 * US, None)
    gcra = GcraModel(limit=3, period=3 * US, burst=3)
    for remaining in (2, 1, 0):
        assert gcra.decide(0, 1, True).remaining == remaining
    assert gcra.decide(0, 1, True) == Expected(False, 0, 3 * US, 1 * US)
    window = SlidingWindowModel(limit=4, period=10 * US)
    for _ in range(4):
        window.decide(9 * US, 1, True)
    # Next window, 2.5 s in: 4 x 0.75 = 3 estimated, so one more fits.
    assert window.decide(12_500_000, 1, True).allowed
    assert not window.decide(12_500_000, 1, True).allowed
