"""The memory backend against Redis, call for call: the same script calls, the same replies.

Hypothesis draws sequences of raw script calls as the limiter sends them (decide.lua's
ARGV): one to three checks of any algorithm, limit, cost, burst and shadow flag, as hit,
peek, or the refund of an earlier hit (its time and nonce), with time moving on in steps
and sometimes back. Each call runs on the real server (EVAL of the script) and on a
:class:`~applimit._memory.MemoryStore`; every reply must be equal, integer for integer.
The property suites compare both backends with models of single limits; this compares
them with each other, where the models do not reach: several checks in one call, shadow
checks, refunds out of the middle of a log, limits changed between calls, a clock going
back.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applimit import _script
from applimit._calls import ScriptCall
from applimit._memory import MemoryStore

US = 1_000_000
START_US = 1_000_000 * 60 * US
# Hits carry the test clock's slack (see _calls.TEST_CLOCK_TTL_SLACK_MS), refunds none, as
# the limiter sends them.
SLACK_MS = "600000"
ALGORITHMS = ("sliding_log", "sliding_window", "gcra")
SUFFIX = {"sliding_log": "log", "sliding_window": "sw", "gcra": "gcra"}


@st.composite
def checks(draw: st.DrawFn, periods: dict[str, int]) -> list[tuple[str, ...]]:
    """One to three checks on distinct keys: (key, algorithm, limit, period, cost, burst,
    shadow)."""
    keys = draw(st.lists(st.sampled_from(sorted(periods)), min_size=1, max_size=3, unique=True))
    out = []
    for key in keys:
        algorithm = key.rsplit(":", 1)[0]
        limit = draw(st.integers(1, 12))
        burst = draw(st.integers(1, 15)) if algorithm == "gcra" else 0
        out.append(
            (
                key,
                algorithm,
                str(limit),
                str(periods[key]),
                str(draw(st.integers(1, limit + 3))),
                str(burst),
                "1" if draw(st.booleans()) else "0",
            )
        )
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """Keys with their periods, and a list of (time step, mode, checks, refunded event)."""
    periods = {
        f"{algorithm}:{i}": draw(st.sampled_from([1_000, 7_000, 60_000])) * 1000
        for algorithm in ALGORITHMS
        for i in range(draw(st.integers(1, 2)))
    }
    longest = max(periods.values())
    steps = st.one_of(
        st.integers(0, 3_000),
        st.integers(0, 3_000),
        st.integers(0, 2 * longest),
        st.sampled_from([1_000_000, 7_000_000, 60_000_000, 1, -1]),
        st.integers(0, longest // 4),
        st.integers(-5_000, 0),
    )
    events = draw(
        st.lists(
            st.tuples(
                steps,
                st.sampled_from(["hit", "hit", "hit", "hit", "peek", "refund"]),
                checks(periods),
                st.integers(0, 1_000),
            ),
            min_size=1,
            max_size=60,
        )
    )
    return {"events": events, "start": draw(st.integers(0, longest))}


def _call(
    prefix: str, mode: str, now: int, nonce: str, slack: str, spec: list[tuple[str, ...]]
) -> ScriptCall:
    keys = tuple(f"{prefix}:{{u}}:{key}:{SUFFIX[key.rsplit(':', 1)[0]]}" for key, *_ in spec)
    args = [mode, str(now), nonce, slack, str(len(spec))]
    for _, algorithm, limit, period, cost, burst, shadow in spec:
        args.append(f"{algorithm} {limit} {period} {cost} {burst} {shadow}")
    return ScriptCall(keys, tuple(args))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scenario=scenarios())
@pytest.mark.parametrize("how", ["eval", "fcall"])
def test_memory_replies_equal_redis_replies(
    redis_client: redis.Redis, how: str, scenario: dict[str, Any]
) -> None:
    """Every call's reply from the memory store equals the server's, by EVAL (the script
    run afresh every call) and by FCALL (the library, whose tables of checks and states
    are reused from call to call, so a check of one algorithm finds the table another
    algorithm's check filled at its place in an earlier call)."""
    if how == "fcall":
        redis_client.function_load(_script.LIBRARY, replace=True)
    prefix = f"d{uuid.uuid4().hex[:8]}"
    store = MemoryStore()
    now = START_US + scenario["start"]
    hits: list[tuple[int, str, list[tuple[str, ...]]]] = []
    for index, (step, mode, spec, pick) in enumerate(scenario["events"]):
        now += step
        if mode == "refund":
            if not hits:
                continue
            at, nonce, hit_spec = hits[-1 - pick % min(len(hits), 4)]
            call = _call(prefix, "refund", at, nonce, "0", hit_spec)
        else:
            nonce = f"{index:012x}" if mode == "hit" else ""
            call = _call(prefix, mode, now, nonce, SLACK_MS, spec)
            if mode == "hit":
                hits.append((now, nonce, spec))
        if how == "fcall":
            expected = redis_client.fcall(  # type: ignore[no-untyped-call]
                _script.FUNCTION, len(call.keys), *call.keys, *call.args
            )
        else:
            expected = redis_client.eval(  # type: ignore[no-untyped-call]
                _script.SOURCE, len(call.keys), *call.keys, *call.args
            )
        assert store.execute(call) == expected, f"event {index}: {call}"


def test_a_refund_out_of_the_middle_of_a_log_matches(redis_client: redis.Redis) -> None:
    """Three entries, the middle one refunded: the later entries start its cost earlier
    on both backends, so the count (10 - 2 - 1 = 7 left) and every number agree."""
    store = MemoryStore()
    spec = [("sliding_log:0", "sliding_log", "10", str(60 * US), "0", "0", "0")]

    def run(mode: str, at: int, nonce: str, cost: int) -> object:
        checks = [
            (key, alg, limit, period, str(cost), burst, shadow)
            for key, alg, limit, period, _, burst, shadow in spec
        ]
        call = _call("mid", mode, at, nonce, SLACK_MS if mode != "refund" else "0", checks)
        expected = redis_client.eval(  # type: ignore[no-untyped-call]
            _script.SOURCE, len(call.keys), *call.keys, *call.args
        )
        assert store.execute(call) == expected
        return expected

    for offset, nonce, cost in (
        (0, "aaaaaaaaaaaa", 2),
        (1, "bbbbbbbbbbbb", 3),
        (2, "cccccccccccc", 1),
    ):
        run("hit", START_US + offset, nonce, cost)
    run("refund", START_US + 1, "bbbbbbbbbbbb", 3)
    assert run("peek", START_US + 3, "", 1) == [START_US + 3, 1, 1, 0, 7, 60 * US - 1, -1]


def test_entries_past_the_window_count_again_alike_when_the_clock_goes_back(
    redis_client: redis.Redis,
) -> None:
    """The log trims what left its window every few units, not at every entry: at 0 s,
    30 s and 61 s (limit 10/1m), the entry of 0 s has left the window but is still held
    at 61 s. When the clock then reads 59 s, it is inside the window again, and both
    backends count it: three entries, the same numbers."""
    store = MemoryStore()
    spec = [("sliding_log:0", "sliding_log", "10", str(60 * US), "1", "0", "0")]

    def run(mode: str, at: int, nonce: str) -> object:
        call = _call("back", mode, START_US + at, nonce, SLACK_MS, spec)
        expected = redis_client.eval(  # type: ignore[no-untyped-call]
            _script.SOURCE, len(call.keys), *call.keys, *call.args
        )
        assert store.execute(call) == expected
        return expected

    run("hit", 0, "aaaaaaaaaaaa")
    run("hit", 30 * US, "bbbbbbbbbbbb")
    third = run("hit", 61 * US, "cccccccccccc")
    assert isinstance(third, list) and third[4] == 8
    again = run("peek", 59 * US, "")
    assert isinstance(again, list) and again[4] == 7


def test_the_memory_backend_trims_a_log_as_often_as_the_script() -> None:
    """Limits in the differential cases stay below the script's trim interval, so the
    interval itself is compared: the one the memory backend trims by (edgegen_policy's
    model of the algorithms) is the Lua file's."""
    from edgegen_policy._algorithms import TRIM_EVERY

    assert f"local TRIM_EVERY = {TRIM_EVERY}\n" in _script.SOURCE
