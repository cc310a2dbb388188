"""The algorithms' integer model (``edgegen_policy._algorithms``) against applimit's Lua.

Hypothesis draws one algorithm (or a concurrency limit's lease) and rate (and a burst for
gcra) and a sequence of requests (time step, cost, hit, peek, a count_when limit's hit
that only checks, or a lease given back), with steps that land on window and emission edges, idle
gaps longer than the period and a clock that sometimes goes back. Each request is one
call of the real script (EVAL on a real redis-server, its time passed as a test clock's
is) and one :func:`~edgegen_policy.decide` over the model; the script's reply must equal
the model's answer: admitted, consumed, remaining, reset and retry, integer for integer.
applimit's ``memory://`` store and edgegen's replay decide with this model, so this one
test ties both to the Lua.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis
from edgegen_policy import AFTER, ALGORITHMS, LEASE, Algorithm, Quota, Rate, Verdict, decide
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applimit import _script

US = 1_000_000
START_US = 1_000_000 * 60 * US
# Hits carry the test clock's slack, as the limiter sends them: the server's own clock
# never expires a key the model still holds.
SLACK_MS = "600000"


class Keys:
    """The model's values by key: the ``Counter`` that :func:`decide` reads and writes."""

    def __init__(self, algorithm: str, quota: Quota) -> None:
        self.model = ALGORITHMS[algorithm]
        self.quota = quota
        self.values: dict[str, Any] = {}
        # The nonce of the call being decided (a lease is named after it).
        self.nonce = ""

    def peek(self, key: str, now: int, cost: int) -> Verdict:
        """Phase 1: the model's check."""
        verdict: Verdict = self.model.check(self.values.get(key), now, self.quota, cost)
        return verdict

    def record(self, key: str, verdict: Verdict, now: int, cost: int) -> None:
        """Phase 2: the model's apply."""
        values = self.values
        values[key] = self.model.apply(
            values.get(key), verdict, now, self.quota, cost, nonce=self.nonce
        )

    def refund(self, key: str, now: int, cost: int, nonce: str) -> None:
        """An earlier apply undone (decide.lua's refund mode)."""
        value = self.values.get(key)
        if value is None:
            return
        left = self.model.refund(value, now, self.quota, cost, nonce)
        if left is None:
            del self.values[key]
        else:
            self.values[key] = left


@st.composite
def sequences(draw: st.DrawFn) -> dict[str, Any]:
    """An algorithm (or a concurrency limit's lease), a rate, gcra's burst (None: the
    default), a start, and requests (time step µs, cost, hit?, after?); for a lease, some
    requests give back an earlier one's lease instead."""
    algorithm = draw(st.sampled_from([*(a.value for a in Algorithm), LEASE]))
    limit = draw(st.integers(1, 20))
    period_ms = draw(st.sampled_from([1_000, 1_500, 7_000, 60_000]))
    burst = draw(st.one_of(st.none(), st.integers(1, 25))) if algorithm == Algorithm.GCRA else None
    period = period_ms * 1000
    steps = st.one_of(
        st.just(0),
        st.integers(0, 3_000),
        st.integers(0, period),
        # Exact edges: an entry leaving (a period after it), an emission interval passing.
        st.sampled_from([period + d for d in (-1, 0, 1)]),
        st.sampled_from([k * period // limit + d for k in (1, 2) for d in (-1, 0, 1)]),
        # Idle for longer than the period (two windows: a sliding window forgets).
        st.integers(period + 1, 3 * period),
        # A record logged out of order: the clock goes back a little.
        st.integers(-period, -1),
    )
    requests = draw(
        st.lists(
            st.tuples(
                steps,
                st.integers(1, limit + 3),
                st.sampled_from(["hit", "hit", "peek", "after", "refund"]),
                st.integers(0, 59),
            ),
            min_size=1,
            max_size=60,
        )
    )
    return {
        "algorithm": algorithm,
        "rate": Rate.parse(f"{limit}/{period_ms}ms"),
        "burst": burst,
        "start": draw(st.integers(0, period)),
        "requests": requests,
    }


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=sequences())
def test_the_model_answers_as_the_lua(redis_client: redis.Redis, sequence: dict[str, Any]) -> None:
    """Every request: the script's reply (admitted, consumed, remaining, reset, retry)
    equals what ``decide`` over the model answers, with the spec built by the model's rate
    rules (``Quota.of``: the period in µs, gcra's burst defaulting to the limit)."""
    algorithm: str = sequence["algorithm"]
    quota = Quota.of(algorithm, sequence["rate"], sequence["burst"])
    keys = Keys(algorithm, quota)
    key = f"alg:{uuid.uuid4().hex}"
    now = START_US + sequence["start"]
    for index, (step, cost, action, earlier) in enumerate(sequence["requests"]):
        now += step
        if action == "refund" and algorithm == LEASE and index:
            # A request that ended gives its lease back (one of the earlier ones).
            nonce = f"{earlier % index:012x}"
            spec = f"{algorithm} {quota.limit} {quota.period} {cost} {quota.burst} 0"
            args = ["refund", str(now), nonce, "0", "1", spec]
            reply = redis_client.eval(_script.SOURCE, 1, key, *args)  # type: ignore[no-untyped-call]
            keys.refund(key, now, cost, nonce)
            assert reply == [now, 1], f"request {index} (refund of {nonce})"
            continue
        hit = action in ("hit", "after")
        flags = AFTER if action == "after" else 0
        spec = f"{algorithm} {quota.limit} {quota.period} {cost} {quota.burst} {flags}"
        mode = "hit" if hit else "peek"
        keys.nonce = f"{index:012x}"
        args = [mode, str(now), keys.nonce, SLACK_MS, "1", spec]
        reply = redis_client.eval(_script.SOURCE, 1, key, *args)  # type: ignore[no-untyped-call]
        passed, (verdict,) = decide([(keys, key, cost, flags)], now, hit=hit)
        consumed = hit and passed and verdict.allowed and not flags
        expected = [now, 1, int(verdict.allowed), int(consumed)]
        expected += [verdict.remaining, verdict.reset, verdict.retry]
        assert reply == expected, f"request {index} ({action}, cost {cost}, step {step} µs)"


# --- calendar quotas ---------------------------------------------------------------------


@st.composite
def quota_sequences(draw: st.DrawFn) -> dict[str, Any]:
    """A quota's period (start, end), a rate of another algorithm checked in the same
    call, and requests (time step µs, cost, mode) that run up to, across and past the
    period's end, and before its start (the app's clock and Redis' differ at an edge)."""
    limit = draw(st.integers(1, 12))
    length = draw(st.sampled_from([1_000_000, 86_400 * US, 28 * 86_400 * US]))
    start = START_US + draw(st.integers(0, 10 * US))
    algorithm = draw(st.sampled_from(list(Algorithm)))
    rate = Rate.parse(f"{draw(st.integers(1, 15))}/{draw(st.sampled_from([1_000, 7_000]))}ms")
    steps = st.one_of(
        st.just(0),
        st.integers(0, 3_000),
        st.integers(0, length // 4),
        st.integers(-length // 8, -1),
        # Past the period's end and its grace: the counter's TTL is then in the past.
        st.integers(length, 2 * length),
    )
    requests = draw(
        st.lists(
            st.tuples(
                steps, st.integers(1, limit + 2), st.sampled_from(["hit", "hit", "peek", "refund"])
            ),
            min_size=1,
            max_size=50,
        )
    )
    return {
        "limit": limit,
        "start": start,
        "end": start + length,
        "first": start + draw(st.integers(-2 * US, length + 2 * US)),
        "rate": (algorithm, rate),
        "requests": requests,
    }


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sequence=quota_sequences())
def test_the_quota_model_answers_as_the_lua(
    redis_client: redis.Redis, sequence: dict[str, Any]
) -> None:
    """A calendar quota checked with a rate in one call, request by request: the script's
    reply equals ``decide`` over both models (the rate and the quota all or nothing), a
    refund gives back what a hit took, and a new counter's TTL is the period's end and
    the grace (``QUOTA_GRACE_US``), as memory:// sets it."""
    from edgegen_policy import CALENDAR, QUOTA_GRACE_US

    algorithm, rate = sequence["rate"]
    rate_quota = Quota.of(algorithm, rate)
    quota = Quota(sequence["limit"], sequence["end"], sequence["start"])
    rates = Keys(algorithm, rate_quota)
    counts = Keys(Algorithm.GCRA, quota)
    counts.model = ALGORITHMS[CALENDAR]
    tag = uuid.uuid4().hex
    rate_key, quota_key = f"alg:{{{tag}}}:r", f"alg:{{{tag}}}:q"
    now = sequence["first"]
    for index, (step, cost, mode) in enumerate(sequence["requests"]):
        now += step
        specs = [
            f"{algorithm.value} {rate_quota.limit} {rate_quota.period} {cost} {rate_quota.burst} 0",
            f"{CALENDAR} {quota.limit} {quota.period} {cost} {quota.burst} 0",
        ]
        nonce = f"{index:012x}"
        if mode == "refund":
            # Undo the last hit on the quota alone, as a split plan's refund would.
            args = ["refund", str(now), nonce, "0", "1", specs[1]]
            redis_client.eval(_script.SOURCE, 1, quota_key, *args)  # type: ignore[no-untyped-call]
            value = counts.values.get(quota_key)
            if value is not None:
                left = counts.model.refund(value, now, quota, cost, nonce)
                if left is None:
                    del counts.values[quota_key]
            stored = redis_client.get(quota_key)
            expected_count = None if value is None or left is None else str(left.count).encode()
            assert stored == expected_count, f"request {index}: refund of {cost}"
            continue
        had = quota_key in counts.values
        args = [mode, str(now), nonce, SLACK_MS, "2", *specs]
        reply = redis_client.eval(_script.SOURCE, 2, rate_key, quota_key, *args)  # type: ignore[no-untyped-call]
        hit = mode == "hit"
        passed, verdicts = decide(
            [(rates, rate_key, cost, False), (counts, quota_key, cost, False)], now, hit=hit
        )
        expected = [now, 2]
        for verdict in verdicts:
            consumed = hit and passed and verdict.allowed
            expected += [int(verdict.allowed), int(consumed)]
            expected += [verdict.remaining, verdict.reset, verdict.retry]
        assert reply == expected, (
            f"request {index} ({mode}, cost {cost}, at {now - quota.burst} µs)"
        )
        if hit and passed and not had:
            # Redis counts a TTL from its own clock: the test clock's offset is the slack.
            ttl_ms = -(-(quota.period + QUOTA_GRACE_US - now) // 1000) + int(SLACK_MS)
            if ttl_ms <= 0:
                # A TTL in the past deletes the key (PEXPIRE), as memory:// does.
                assert redis_client.exists(quota_key) == 0
                del counts.values[quota_key]
            else:
                assert abs(redis_client.pttl(quota_key) - ttl_ms) <= 1_000
