"""Gate.answer: from a Decision to headers and refusals, for the cases HTTP tests rarely reach.

Decisions are built with the core's own ``combine`` from LimitResults, so these are the
shapes the limiter really returns. Every header is parsed and cross-checked.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest
from webcheck import Service, rate_limit_headers

from applimit import Decision, LimitResult
from applimit._decision import combine
from applimit.web._client_ip import TrustedProxies
from applimit.web._gate import PASS, Answer, Gate
from applimit.web._headers import TEMPORARY_REDUCED_CAPACITY

GATE = Gate(tiers=("free", "pro"), legacy_headers=True)


def result(
    name: str = "api",
    *,
    quota: int = 100,
    window: float = 60.0,
    remaining: int = 99,
    reset_after: float = 30.0,
    retry_after: float | None = None,
    allowed: bool = True,
    shadow: bool = False,
) -> LimitResult:
    """A LimitResult with defaults for an allowed sliding-window rate."""
    return LimitResult(
        name=name,
        tier="free",
        algorithm="sliding_window",
        quota=quota,
        window=window,
        allowed=allowed,
        consumed=allowed,
        remaining=remaining,
        reset_after=reset_after,
        retry_after=retry_after,
        shadow=shadow,
    )


def response(outcome: Answer) -> httpx.Response:
    """The outcome as an HTTP response, for the header checker."""
    if outcome.refusal is not None:
        return httpx.Response(
            outcome.refusal.status,
            headers=list(outcome.refusal.headers),
            content=outcome.refusal.body,
        )
    return httpx.Response(200, headers=list(outcome.headers))


def test_fractional_waits_round_up() -> None:
    """t and Retry-After are whole seconds rounded up: 0.2 s is 1, 12.0001 s is 13."""
    decision = combine([result(remaining=0, allowed=False, retry_after=12.0001, reset_after=40.2)])
    parsed = rate_limit_headers(response(GATE.answer(decision, "free")))
    assert parsed.limits["api"].t == 13
    assert parsed.retry_after == 13
    allowed = combine([result(reset_after=0.2)])
    assert rate_limit_headers(response(GATE.answer(allowed, "free"))).limits["api"].t == 1


def test_retry_after_covers_the_longest_of_several_denials() -> None:
    """Two rates deny: Retry-After is the later of the two, so both have cleared by then."""
    decision = combine(
        [
            result("api", quota=10, window=1, remaining=0, allowed=False, retry_after=0.4),
            result("daily", quota=1000, window=86400, remaining=0, allowed=False, retry_after=7200),
            result("other", remaining=50),
        ]
    )
    outcome = GATE.answer(decision, "free")
    parsed = rate_limit_headers(response(outcome))
    assert parsed.retry_after == 7200
    assert set(parsed.limits) == {"api", "daily"}
    assert set(parsed.policies) == {"api", "daily", "other"}
    assert outcome.refusal is not None
    body = json.loads(outcome.refusal.body)
    assert body["limit"] == "daily"
    assert body["violated-policies"] == ["api", "daily"]
    assert parsed.legacy == (1000, 0, 7200)


def test_a_cost_that_can_never_fit_waits_one_window() -> None:
    """retry_after is infinite when the cost exceeds the quota: the client is told one
    window, not zero (which would invite a tight retry loop)."""
    decision = combine([result(quota=5, remaining=5, allowed=False, retry_after=math.inf)])
    parsed = rate_limit_headers(response(GATE.answer(decision, "free")))
    assert parsed.retry_after == 60
    assert parsed.limits["api"] == Service(r=5, t=60)


def test_shadow_results_are_not_advertised_and_never_refuse() -> None:
    """A shadow rate that would deny leaves the request allowed and out of the headers;
    with only shadow limits there are no headers at all."""
    decision = combine(
        [result(), result("exports", remaining=0, allowed=False, retry_after=5, shadow=True)]
    )
    assert decision.allowed
    parsed = rate_limit_headers(response(GATE.answer(decision, "free")))
    assert set(parsed.policies) == {"api"}
    only_shadow = combine([result("exports", shadow=True)])
    assert GATE.answer(only_shadow, "free") is PASS


def test_no_limit_applies() -> None:
    """An empty decision (no matcher applied) adds nothing."""
    assert GATE.answer(combine([]), "free") is PASS


def test_degraded_fail_open_keeps_the_policy_but_invents_no_counts() -> None:
    """Without Redis the quotas are still known, the remaining counts are not."""
    decision = combine([result(remaining=0, reset_after=0.0)], degraded=True)
    outcome = GATE.answer(decision, "free")
    assert outcome.refusal is None
    names = [name for name, _ in outcome.headers]
    assert names == ["RateLimit-Policy"]
    rate_limit_headers(response(outcome))


def test_degraded_fail_closed_is_a_503_problem() -> None:
    """A limit failing closed refuses with 503 and the temporary-reduced-capacity type."""
    decision = combine(
        [
            result("api", remaining=0, reset_after=0.0),
            result("login", remaining=0, reset_after=0.0, allowed=False, retry_after=1.0),
        ],
        degraded=True,
    )
    outcome = GATE.answer(decision, "free")
    assert outcome.refusal is not None
    assert outcome.refusal.status == 503
    body = json.loads(outcome.refusal.body)
    assert body["type"] == TEMPORARY_REDUCED_CAPACITY
    assert body["violated-policies"] == ["login"]
    assert rate_limit_headers(response(outcome)).retry_after == 1


def test_names_windows_and_remaining_are_kept_within_the_grammar() -> None:
    """Non-ASCII limit names become valid sf-strings, a sub-second window leaves out w
    (it must be whole seconds), and a GCRA burst above the quota never shows r > q."""
    decision = combine(
        [
            result("café", quota=5, window=0.5, remaining=3, reset_after=0.3),
            result("search", quota=10, window=1, remaining=15, reset_after=0.5),
        ]
    )
    parsed = rate_limit_headers(response(GATE.answer(decision, "free")))
    assert parsed.policies["caf%C3%A9"].w is None
    assert parsed.limits["search"].r == 10


def test_several_rates_of_one_limit_are_named_by_period() -> None:
    """A tier with two rates gives two items, named after their periods."""
    decision = combine(
        [
            result(quota=1000, window=60, remaining=10),
            result(quota=20000, window=3600, remaining=19000, reset_after=3000),
            result("burst", quota=5, window=0.25, remaining=4, reset_after=0.1),
        ]
    )
    parsed = rate_limit_headers(response(GATE.answer(decision, "pro")))
    assert set(parsed.policies) == {"api/1m", "api/1h", "burst"}
    assert parsed.legacy == (5, 4, 1)


def test_decision_fields_match_the_binding_item() -> None:
    """The Decision's own scalar fields and the legacy trio describe the same rate."""
    decision: Decision = combine(
        [result(remaining=3, reset_after=10.5), result("b", quota=50, remaining=40)]
    )
    parsed = rate_limit_headers(response(GATE.answer(decision, "free")))
    assert parsed.legacy == (decision.limit, decision.remaining, math.ceil(decision.reset_after))


def test_gate_requires_tiers_and_accepts_proxies() -> None:
    """A policy always has tiers; the gate refuses to guess without them."""
    gate = Gate(tiers=("free",), proxies=TrustedProxies(["10.0.0.0/8"]))
    assert gate.lowest_tier == "free"
    assert gate.proxies.networks[0].prefixlen == 8
    with pytest.raises(ValueError, match="no tiers"):
        Gate(tiers=())
