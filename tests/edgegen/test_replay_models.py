"""The replay's counting models against their references.

- The app models against applimit's Lua: hypothesis draws traces (several identities in
  two tiers, one of them with several rates, random gaps with bursts, exact window and
  emission edges, idle gaps longer than the period, a clock that sometimes goes back as
  out-of-order records make it, random costs, sweeps at random points) and runs each
  through applimit's real ``Limiter`` on a real redis-server, its time set by
  ``test_clock``, and through the models; every decision must be the same. Hand-written
  traces pin each algorithm's exact edges, and two enforced limits and a shadow one on one
  request are held to decide.lua's all-or-nothing.
- The rule counter against the examples of Cloudflare's request-rate page.
- The Worker counter against workerd: Miniflare's ratelimit binding driven at chosen times.
- Sweeps: memory goes with the keys active within a period, and decisions do not change.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
import redis
from edge_support import run_node
from edgegen_policy import Algorithm, Rate, decide
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applimit import Limiter
from edgegen.replay._models import (
    GcraModel,
    RuleCounter,
    SlidingLogModel,
    SlidingWindowModel,
    WorkerCounter,
    app_model,
    app_models,
    rule_counter,
    worker_counter,
)
from edgegen.replay._types import AppModel

US = 1_000_000
# Time starts at a whole minute (plus a drawn offset), as a server's clock might read.
START_US = 1_000_000 * 60 * US
TIERS = ("free", "pro")
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
HERE = Path(__file__).resolve().parent


class Clock:
    """The limiter's test clock: seconds, held as integer µs so that nothing rounds."""

    def __init__(self, start_us: int) -> None:
        self.us = start_us

    def __call__(self) -> float:
        seconds = self.us / US
        # The limiter sends round(seconds x 1e6) µs: it must be the model's time exactly.
        assert round(seconds * US) == self.us
        return seconds


def rate_text(limit: int, period_ms: int) -> str:
    return f"{limit}/{period_ms}ms"


@contextmanager
def limiter_for(redis_client: redis.Redis, text: str, clock: Clock) -> Iterator[Limiter]:
    limiter = Limiter(policy.loads(text), redis=redis_client, test_clock=clock)
    try:
        yield limiter
    finally:
        limiter.close()


def admit(checks: Sequence[tuple[AppModel, Hashable, bool]], now_us: int, cost: int = 1) -> bool:
    """One request of ``cost`` through ``checks`` (model, key, shadow), decided as the
    replay's engine decides it (``edgegen_policy.decide``)."""
    passed, _ = decide([(model, key, cost, shadow) for model, key, shadow in checks], now_us)
    return passed


# --- (a) the app models equal the Lua ----------------------------------------------------


@st.composite
def traces(draw: st.DrawFn, algorithm: Algorithm) -> dict[str, Any]:
    """Rates for two tiers (pro has two or three, maybe two of one period), a burst for
    gcra, and events (identity, gap µs, cost, sweep first?, align to a window fraction?)."""
    periods_ms = st.sampled_from([1_000, 1_500, 7_000, 60_000])
    free = [(draw(st.integers(1, 8)), draw(periods_ms))]
    pro = [(draw(st.integers(1, 12)), draw(periods_ms)) for _ in range(draw(st.integers(2, 3)))]
    burst = draw(st.one_of(st.none(), st.integers(1, 15))) if algorithm is Algorithm.GCRA else None
    rates = [(limit, period_ms * 1000) for limit, period_ms in free + pro]
    periods = sorted({period for _, period in rates})
    longest = periods[-1]
    limits = [limit for limit, _ in rates]
    gaps = st.one_of(
        st.just(0),
        st.integers(0, 3_000),
        st.integers(0, periods[0]),
        st.integers(0, 2 * longest),
        # Exact edges: an entry leaving (a period after it), an emission interval passing.
        st.sampled_from([period + d for period in periods for d in (-1, 0, 1)]),
        st.sampled_from([k * period // limit for limit, period in rates for k in (1, 2)]),
        # Idle for longer than every period.
        st.integers(longest + 1, 4 * longest),
        # A record logged out of order: the clock goes back a little.
        st.integers(-periods[0], -1),
    )
    # Or land on a fraction of one rate's window (+-1 µs): where a sliding window's
    # previous count weighs a whole number of requests.
    aligns = st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(periods),
            st.integers(1, 12).flatmap(
                lambda den: st.tuples(st.integers(0, den - 1), st.just(den))
            ),
            st.sampled_from([-1, 0, 1]),
        ),
    )
    identities = draw(st.integers(1, 3))
    events = draw(
        st.lists(
            st.tuples(
                st.integers(0, identities - 1),
                gaps,
                st.one_of(st.just(1), st.integers(1, max(limits) + 2)),
                st.booleans() if draw(st.booleans()) else st.just(False),
                aligns,
            ),
            min_size=1,
            max_size=50,
        )
    )
    return {
        "free": free,
        "pro": pro,
        "burst": burst,
        "tiers": [draw(st.sampled_from(TIERS)) for _ in range(identities)],
        "events": events,
        "start": draw(st.integers(0, longest)),
        "back": periods[0],
    }


def app_policy(algorithm: Algorithm, trace: dict[str, Any], prefix: str) -> str:
    free = ", ".join(rate_text(*r) for r in trace["free"])
    pro = ", ".join(rate_text(*r) for r in trace["pro"])
    burst = f", burst: {trace['burst']}" if trace["burst"] is not None else ""
    return f"""
version: 1
tiers: [free, pro]
app: {{key_prefix: {prefix}, timeout: 5s}}
limits:
  - name: x
    app: {{algorithm: {algorithm.value}, tiers: {{free: [{free}], pro: [{pro}]}}{burst}}}
"""


def replay_against_lua(
    redis_client: redis.Redis, algorithm: Algorithm, trace: dict[str, Any]
) -> None:
    """Every event through the Limiter and through the models: the same decision each time."""
    clock = Clock(START_US + trace["start"])
    models = {
        tier: app_models(
            algorithm, [Rate.parse(rate_text(*r)) for r in trace[tier]], trace["burst"]
        )
        for tier in TIERS
    }
    users = [uuid.uuid4().hex for _ in trace["tiers"]]
    decisions: list[bool] = []
    text = app_policy(algorithm, trace, f"r{uuid.uuid4().hex[:10]}")
    with limiter_for(redis_client, text, clock) as limiter:
        for index, (who, gap, cost, sweep, align) in enumerate(trace["events"]):
            clock.us += gap
            if align is not None:
                period, (num, den), delta = align
                target = clock.us // period * period + num * period // den + delta
                clock.us = target if target >= clock.us else target + period
            tier = trace["tiers"][who]
            if sweep:
                # At the earliest time a later record may carry (the clock goes back by
                # less than the shortest period), as the engine sweeps.
                for tier_models in models.values():
                    for model in tier_models:
                        model.sweep(clock.us - trace["back"])
            decision = limiter.hit("x", users[who], tier=tier, cost=cost)
            assert not decision.degraded
            checks = [(model, who, False) for model in models[tier]]
            expected = admit(checks, clock.us, cost)
            assert decision.allowed == expected, (
                f"event {index}: user {who} ({tier}) cost {cost} after {gap} µs: the script "
                f"{'admits' if decision.allowed else 'refuses'}, the model does not"
            )
            decisions.append(expected)
    return decisions


@SETTINGS
@given(trace=traces(Algorithm.SLIDING_LOG))
def test_sliding_log_model_decides_as_the_lua(
    redis_client: redis.Redis, trace: dict[str, Any]
) -> None:
    """sliding_log: the model admits exactly what sliding_log.lua admits."""
    replay_against_lua(redis_client, Algorithm.SLIDING_LOG, trace)


@SETTINGS
@given(trace=traces(Algorithm.SLIDING_WINDOW))
def test_sliding_window_model_decides_as_the_lua(
    redis_client: redis.Redis, trace: dict[str, Any]
) -> None:
    """sliding_window: the model admits exactly what sliding_window.lua admits."""
    replay_against_lua(redis_client, Algorithm.SLIDING_WINDOW, trace)


@SETTINGS
@given(trace=traces(Algorithm.GCRA))
def test_gcra_model_decides_as_the_lua(redis_client: redis.Redis, trace: dict[str, Any]) -> None:
    """gcra, with and without a burst: the model admits exactly what gcra.lua admits."""
    replay_against_lua(redis_client, Algorithm.GCRA, trace)


def edge_trace(limit: int, burst: int | None, events: list[tuple[int, int, int]]) -> dict[str, Any]:
    """A hand-written trace on one rate of ``limit`` per second: (identity, gap µs, cost)."""
    return {
        "free": [(limit, 1_000)],
        "pro": [(limit, 1_000)],
        "burst": burst,
        "tiers": ["free", "free"],
        "events": [(who, gap, cost, False, None) for who, gap, cost in events],
        "start": 0,
        "back": 0,
    }


def test_sliding_window_edges_decide_as_the_lua(redis_client: redis.Redis) -> None:
    """Halfway into a window the previous window's 2 weigh exactly 1 (3/1s: two more fit);
    1 µs earlier they weigh a little more (one more fits)."""
    half = US // 2
    trace = edge_trace(
        3,
        None,
        [
            # 2 each in the first window
            (0, 0, 1),
            (0, 1, 1),
            (1, 1, 1),
            (1, 1, 1),
            # 1 µs before halfway into the next
            (1, US + half - 1 - 3, 1),
            (1, 0, 1),
            # halfway
            (0, 1, 1),
            (0, 0, 1),
            (0, 0, 1),
        ],
    )
    decisions = replay_against_lua(redis_client, Algorithm.SLIDING_WINDOW, trace)
    assert decisions == [True] * 4 + [True, False] + [True, True, False]


def test_sliding_log_edges_decide_as_the_lua(redis_client: redis.Redis) -> None:
    """An entry leaves the window exactly one period after it was admitted, not 1 µs
    earlier (2/1s, entries of two identities one µs apart)."""
    trace = edge_trace(
        2,
        None,
        [
            # identity 0 at 0 and 1 µs, identity 1 at 2 and 3
            (0, 0, 1),
            (0, 1, 1),
            (1, 1, 1),
            (1, 1, 1),
            # at 1 s + 1 µs: identity 1's entries are both in the window
            (1, US - 2, 1),
            # identity 0's have both left: 2 fit
            (0, 0, 2),
            # at 1 s + 2 µs: the entry at 2 has left, one fits
            (1, 1, 1),
            (1, 0, 1),
        ],
    )
    decisions = replay_against_lua(redis_client, Algorithm.SLIDING_LOG, trace)
    assert decisions == [True] * 4 + [False, True, True, False]


def test_gcra_edges_decide_as_the_lua(redis_client: redis.Redis) -> None:
    """2/1s with a burst of 2: a full bucket admits again exactly one emission interval
    (0.5 s) later, not 1 µs earlier."""
    trace = edge_trace(
        2, 2, [(0, 0, 1), (0, 0, 1), (0, 0, 1), (0, US // 2 - 1, 1), (0, 1, 1), (0, 0, 1)]
    )
    decisions = replay_against_lua(redis_client, Algorithm.GCRA, trace)
    assert decisions == [True, True, False, False, True, False]


TWO_LIMITS = """
version: 1
tiers: [free]
app: {{key_prefix: {prefix}, timeout: 5s}}
limits:
  - name: burst
    match: {{path_prefix: /api/}}
    app: {{algorithm: sliding_window, tiers: {{free: 3/1s}}}}
  - name: hourly
    match: {{path_prefix: /api/}}
    app: {{algorithm: gcra, tiers: {{free: 60/1m}}, burst: 5}}
  - name: watch
    match: {{path_prefix: /api/}}
    app: {{algorithm: sliding_log, tiers: {{free: 2/2s}}, enforce: false}}
"""


@SETTINGS
@given(
    gaps=st.lists(
        st.one_of(st.integers(0, 400_000), st.integers(0, 3 * US), st.just(0)),
        min_size=1,
        max_size=60,
    ),
    costs=st.lists(st.integers(1, 4), min_size=60, max_size=60),
)
def test_several_limits_on_one_request_are_all_or_nothing(
    redis_client: redis.Redis, gaps: list[int], costs: list[int]
) -> None:
    """Two enforced limits and a shadow one on one request, through check_request (one
    script call) and through ``admit``: a request one limit refuses is counted by none
    (the other enforced limit keeps its room), and the shadow limit counts what passes."""
    clock = Clock(START_US)
    models: list[tuple[AppModel, Hashable, bool]] = [
        (app_model(Algorithm.SLIDING_WINDOW, Rate.parse("3/1s"), None), "u", False),
        (app_model(Algorithm.GCRA, Rate.parse("60/1m"), 5), "u", False),
        (app_model(Algorithm.SLIDING_LOG, Rate.parse("2/2s"), None), "u", True),
    ]
    text = TWO_LIMITS.format(prefix=f"m{uuid.uuid4().hex[:10]}")
    user = uuid.uuid4().hex
    with limiter_for(redis_client, text, clock) as limiter:
        for index, gap in enumerate(gaps):
            clock.us += gap
            cost = costs[index]
            would = [model.check(key, clock.us, cost) for model, key, _ in models]
            decision = limiter.check_request("GET", "/api/items", user, tier="free", cost=cost)
            assert not decision.degraded
            assert len(decision.results) == 3
            assert decision.allowed == admit(models, clock.us, cost), f"request {index}"
            # The script reports consumption per check exactly as admit applied it.
            consumed = [r.consumed for r in decision.results]
            assert consumed == [decision.allowed and ok for ok in would], f"request {index}"


def test_a_request_one_limit_refuses_is_counted_by_none(redis_client: redis.Redis) -> None:
    """A fixed trace where the per-second limit refuses while the per-minute one has room:
    neither counts it, as decide.lua does, and the per-minute limit's room is intact; a
    shadow check that refuses is not counted while the request is."""
    per_second = app_model(Algorithm.SLIDING_WINDOW, Rate.parse("3/1s"), None)
    per_minute = app_model(Algorithm.GCRA, Rate.parse("60/1m"), 5)
    shadow = app_model(Algorithm.SLIDING_LOG, Rate.parse("2/2s"), None)
    checks: list[tuple[AppModel, Hashable, bool]] = [
        (per_second, "u", False),
        (per_minute, "u", False),
        (shadow, "u", True),
    ]
    clock = Clock(START_US)
    text = TWO_LIMITS.format(prefix=f"m{uuid.uuid4().hex[:10]}")
    user = uuid.uuid4().hex
    outcomes = []
    with limiter_for(redis_client, text, clock) as limiter:
        for _ in range(4):
            decision = limiter.check_request("GET", "/api/items", user, tier="free")
            assert decision.allowed == admit(checks, clock.us)
            outcomes.append((decision.allowed, [r.consumed for r in decision.results]))
    # 3 admitted, the shadow limit counting the first 2 only (its own limit); the 4th
    # refused by the per-second limit alone: gcra (burst 5) had room for 2 more, and
    # still has after the refusal.
    assert outcomes == [
        (True, [True, True, True]),
        (True, [True, True, True]),
        (True, [True, True, False]),
        (False, [False, False, False]),
    ]
    assert per_minute.check("u", clock.us, 2)
    assert not per_minute.check("u", clock.us, 3)
    assert not shadow.check("u", clock.us, 1)


# --- (b) the rule counter: Cloudflare's request-rate page -------------------------------

# The page's rules: Block, mitigation timeout 10 minutes, 1 request per 10 seconds.
PAGE_PERIOD_S = 10
PAGE_TIMEOUT_S = 600
# Where in a 10 s window the examples' requests start (the page gives no times; the
# outcomes it states must hold wherever its requests fall).
OFFSETS_US = [0, 1, 2_500_000, 9_000_000, 9_999_999]


@pytest.mark.parametrize("offset", OFFSETS_US)
def test_request_rate_example_a(offset: int) -> None:
    """Example A: requests 1 and 3 share a counter (same IP and x-api-key), request 2 has
    its own (another x-api-key), request 4 does not match the rule and is not counted.
    Requests 1 and 2 are allowed (counter 1, within 1 request), request 3 sets its counter
    to 2 and is blocked."""
    counter = rule_counter(PAGE_PERIOD_S, 1, PAGE_TIMEOUT_S, "block")
    at = START_US + offset
    first_key = ("colo-1", "198.51.100.1", "key-a")
    second_key = ("colo-1", "198.51.100.1", "key-b")
    assert counter.hit(first_key, at) is False  # request 1
    assert counter.hit(second_key, at + 100_000) is False  # request 2
    assert counter.hit(first_key, at + 200_000) is True  # request 3
    # Request 4 does not match: the engine never gives it to the counter, and nothing
    # about it creates a counter.
    assert isinstance(counter, RuleCounter)
    assert len(counter) == 2


@pytest.mark.parametrize("offset", OFFSETS_US)
def test_request_rate_example_b(offset: int) -> None:
    """Example B: the counting expression reads the response (status 400), so a request is
    counted after its response. Request 1 (400) sets the counter to 1; request 2 (200) is
    allowed and not counted; request 3 (400) is allowed and sets it to 2; request 4 finds
    2 above 1 and is blocked, and so is every later matching request for ten minutes."""
    counter = RuleCounter(PAGE_PERIOD_S, 1, PAGE_TIMEOUT_S, "block")
    key = ("colo-1", "198.51.100.1", "key-a")
    at = START_US + offset
    assert counter.hit_counted_on_response(key, at, counted=True) is False  # 400
    assert counter.hit_counted_on_response(key, at + 1 * US // 10, counted=False) is False  # 200
    assert counter.hit_counted_on_response(key, at + 2 * US // 10, counted=True) is False  # 400
    request_4 = at + 3 * US // 10
    assert counter.hit_counted_on_response(key, request_4, counted=True) is True
    # Blocked for the ten minutes that follow, whatever the counter says by then ...
    for later in (1 * US, 60 * US, 300 * US, PAGE_TIMEOUT_S * US - 1):
        assert counter.hit_counted_on_response(key, request_4 + later, counted=True) is True
    # ... and not after: the blocked requests never reached the origin, so never counted.
    assert counter.hit_counted_on_response(key, request_4 + PAGE_TIMEOUT_S * US, True) is False


def test_mitigation_applies_for_the_timeout_regardless_of_rate() -> None:
    """With a mitigation timeout, one request over the rate starts the action for the
    whole timeout, even for requests that would be within the rate on their own."""
    counter = rule_counter(60, 2, 600, "block")
    key = ("colo-1", "203.0.113.9")
    at = START_US
    assert [counter.hit(key, at + i) for i in range(3)] == [False, False, True]
    # Ten minutes of one request every five minutes: far below 2 per minute, still blocked.
    assert counter.hit(key, at + 300 * US) is True
    assert counter.hit(key, at + 600 * US - 1) is True
    # The timeout has ended; the previous minute's one request weighs nearly 1, +1 <= 2.
    assert counter.hit(key, at + 600 * US + 2) is False


def test_throttling_applies_the_action_only_over_the_rate() -> None:
    """mitigation_timeout 0 (a challenge below Enterprise): only requests that find the
    rate exceeded get the action; once the sliding estimate is back within the rate,
    requests pass again."""
    counter = rule_counter(10, 2, 0, "managed_challenge")
    key = ("colo-1", "203.0.113.9")
    at = START_US  # a window's start
    assert [counter.hit(key, at + i) for i in range(4)] == [False, False, True, True]
    # Next window, 9 s in: the previous window's 4 weigh 4 x 1/10 = 0.4; +1 is 1.4 <= 2.
    assert counter.hit(key, at + 19 * US) is False
    # 1.4 + 1 = 2.4 > 2: challenged, without a timeout.
    assert counter.hit(key, at + 19 * US + 1) is True


def test_the_sliding_estimate_weighs_the_previous_window() -> None:
    """Cloudflare's published estimate: previous x (period - elapsed) / period + current;
    a burst at the end of one window still counts early in the next."""
    counter = rule_counter(60, 10, 0, "block")
    key = "k"
    window = START_US
    for i in range(10):
        assert counter.hit(key, window + 59 * US + i) is False
    # 15 s into the next window: 10 x 45/60 = 7.5, so 2 more fit (9.5), a third not (10.5).
    at = window + 75 * US
    assert [counter.hit(key, at + i) for i in range(3)] == [False, False, True]
    # 45 s in: 10 x 15/60 = 2.5 + 3 counted = 5.5; 4 more fit (9.5), the next not.
    at = window + 105 * US
    assert [counter.hit(key, at + i) for i in range(5)] == [False] * 4 + [True]


def test_counters_are_per_key_and_data_centre() -> None:
    """Counters are not shared across data centres: the same client at two colos has two."""
    counter = rule_counter(10, 1, 600, "block")
    assert counter.hit(("AMS", "192.0.2.1"), START_US) is False
    assert counter.hit(("FRA", "192.0.2.1"), START_US + 1) is False
    assert counter.hit(("AMS", "192.0.2.1"), START_US + 2) is True
    assert counter.hit(("FRA", "192.0.2.2"), START_US + 3) is False


def test_rule_counter_refuses_impossible_settings() -> None:
    """Bad settings say what is wrong."""
    with pytest.raises(ValueError, match="unknown rule action 'drop'"):
        rule_counter(10, 1, 0, "drop")
    with pytest.raises(ValueError, match="requests_per_period must be"):
        rule_counter(10, 0, 0, "block")
    with pytest.raises(ValueError, match="period is 10 or 60 seconds, not 30"):
        worker_counter(5, 30)


# --- (c) the Worker counter against workerd ----------------------------------------------

WORKER_LIMIT = 3


def worker_trace() -> list[tuple[int, str]]:
    """(ms since the epoch, key) calls: bursts inside windows, exact window edges (the
    last ms of a window and the first of the next), a key's first call late in a window,
    and an idle gap of several windows, for a 10 s and a 60 s binding alike."""
    base = 1_764_000_000_000  # a whole minute, in ms
    calls: list[tuple[int, str]] = []
    for ms in (0, 1, 2, 3, 4, 9_999, 10_000, 10_001, 10_002, 10_003, 10_004):
        calls.append((base + ms, "a"))
    for ms in (7_000, 7_001, 7_002, 7_003, 9_999, 12_000, 12_001):
        calls.append((base + ms, "b"))
    for ms in (59_998, 59_999, 60_000, 60_000, 60_001, 60_002, 60_003, 125_000):
        calls.append((base + ms, "a"))
    calls.sort(key=lambda call: call[0])
    return calls


@pytest.mark.workerd
@pytest.mark.parametrize("period", [10, 60])
def test_worker_counter_answers_as_the_workerd_binding(period: int) -> None:
    """The same calls at the same times through Miniflare's ratelimit binding (in workerd,
    its clock set per call) and through the model: the same answer to every call. The
    trace crosses window edges by one ms, so a model aligned to a key's first call, or
    one that counted refused calls, would disagree."""
    calls = worker_trace()
    answer = run_node(
        HERE / "replay_ratelimit.mjs",
        {"limit": WORKER_LIMIT, "period": period, "calls": [[ms, key] for ms, key in calls]},
    )
    successes = answer["successes"]
    assert len(successes) == len(calls)
    model = worker_counter(WORKER_LIMIT, period)
    expected = [not model.hit(key, ms * 1000) for ms, key in calls]
    assert successes == expected
    # The trace exercises both answers and a window edge in each binding.
    assert True in successes and False in successes


def test_worker_windows_are_aligned_to_the_epoch() -> None:
    """A key first seen in the last ms of a window starts afresh 1 ms later."""
    model = WorkerCounter(1, 10)
    edge = 1_764_000_010_000 * 1000
    assert model.hit("k", edge - 1000) is False
    assert model.hit("k", edge - 1) is True
    assert model.hit("k", edge) is False


# --- (d) sweeps bound memory and change no decision --------------------------------------


def all_app_models() -> list[GcraModel | SlidingWindowModel | SlidingLogModel]:
    return [
        GcraModel(5, 10 * US, 5),
        GcraModel(5, 10 * US, 15),
        SlidingWindowModel(5, 10 * US),
        SlidingLogModel(5, 10 * US),
    ]


@given(
    events=st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 25 * US), st.integers(1, 6), st.booleans()),
        min_size=1,
        max_size=120,
    )
)
@settings(max_examples=200, deadline=None)
def test_sweeps_change_no_decision(events: list[tuple[int, int, int, bool]]) -> None:
    """A model swept at random points decides every request as its unswept twin."""
    for swept, kept in zip(all_app_models(), all_app_models(), strict=True):
        now = START_US
        for key, gap, cost, sweep in events:
            now += gap
            if sweep:
                swept.sweep(now)
            assert swept.hit(key, now, cost) == kept.hit(key, now, cost)
    for swept_edge, kept_edge in (
        (RuleCounter(10, 3, 60, "block"), RuleCounter(10, 3, 60, "block")),
        (RuleCounter(10, 3, 0, "managed_challenge"), RuleCounter(10, 3, 0, "managed_challenge")),
        (WorkerCounter(3, 10), WorkerCounter(3, 10)),
    ):
        now = START_US
        for key, gap, _cost, sweep in events:
            now += gap
            if sweep:
                swept_edge.sweep(now)
            assert swept_edge.hit(key, now) == kept_edge.hit(key, now)


def test_sweep_forgets_keys_idle_longer_than_their_state_lasts() -> None:
    """10,000 identities once each, then a sweep a period later: every key is gone (gcra's
    once its TAT has passed; sliding_window's once its window no longer weighs); the one
    active identity stays."""
    period = 10 * US
    for model in all_app_models():
        for i in range(10_000):
            model.hit(i, START_US + i, 1)
        assert len(model) == 10_000
        model.hit("active", START_US + period + 20_000, 1)
        model.sweep(START_US + period + 20_000)
        if isinstance(model, SlidingWindowModel):
            # Its counts weigh until the end of the next window.
            model.sweep(START_US + 2 * period)
        assert len(model) == 1
    for edge in (RuleCounter(10, 3, 60, "block"), WorkerCounter(3, 10)):
        for i in range(10_000):
            edge.hit(i, START_US + i)
        edge.sweep(START_US + 2 * period + 60 * US)
        assert len(edge) == 0


def test_sliding_log_memory_is_bounded_by_the_window() -> None:
    """One identity admitted for an hour at its limit: the log holds a period's entries
    (plus at most the compaction slack), not the hour's."""
    model = SlidingLogModel(100, 10 * US)
    admitted = 0
    for i in range(36_000):
        admitted += model.hit("u", START_US + i * (US // 10), 1)
    assert admitted == 36_000  # 10 per second is exactly the limit
    assert model.entries("u") <= 100
    log_lists = model._values["u"]
    assert len(log_lists.scores) <= 100 + 2 * 64


def test_app_model_refuses_a_burst_for_other_algorithms() -> None:
    """burst is gcra's; the error says how to fix the call."""
    with pytest.raises(ValueError, match="burst applies to gcra only"):
        app_model(Algorithm.SLIDING_LOG, Rate.parse("5/1m"), 3)


def test_app_models_check_the_smaller_of_two_rates_with_one_period() -> None:
    """As applimit compiles a tier: 10/1m and 5/60s share a period, so only 5/1m counts."""
    models: Sequence[AppModel] = app_models(
        Algorithm.SLIDING_WINDOW,
        [Rate.parse("10/1m"), Rate.parse("5/60s"), Rate.parse("50/1h")],
        None,
    )
    assert len(models) == 2
    checks = [(m, "u", False) for m in models]
    assert [admit(checks, START_US + i) for i in range(6)] == [True] * 5 + [False]
