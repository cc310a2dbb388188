"""Calendar quotas through the ASGI middleware: ``identify`` returns the caller's billing
day in ``Caller.keys``; the RateLimit headers name each quota ``"limit/period"`` with the
period's length as ``w`` and its end as ``t``; a refusal waits for the period's end.

An in-process app (httpx's ASGI transport) on memory://, with a test clock at the end of
a billing month: billing day 31 in April, whose period ends on April 30th."""

from __future__ import annotations

from datetime import UTC, datetime

import edgegen_policy as policy
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from webcheck import rate_limit_headers

from applimit import AsyncLimiter, InvalidArgumentError, _memory
from applimit.asgi import Caller, RateLimitMiddleware, RequestInfo

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: webq, redis_url: "memory://web-quotas"}
limits:
  - name: api
    match: {path_prefix: /api/}
    app:
      tiers: {free: 10/1m, pro: 100/1m}
      quotas: {pro: {billing: 3, day: 1000}}
      billing_day_from: billing_day
"""
US = 1_000_000


def identify(request: RequestInfo) -> Caller | None:
    """x-user names a pro user; x-billing-day, their billing day."""
    user = request.header("x-user")
    if not user:
        return None
    day = request.header("x-billing-day")
    return Caller(user, "pro", keys={"billing_day": day} if day else {})


async def test_quota_headers_and_a_refusal_until_the_period_ends() -> None:
    """Three requests admitted with "api/billing" counting down; the fourth refused with
    Retry-After the seconds to April 30th 00:00 UTC, and a problem naming the period."""
    _memory.store("web-quotas").clear()
    now = [datetime(2026, 4, 29, 23, 59, 0, tzinfo=UTC).timestamp()]
    limiter = AsyncLimiter(policy.loads(POLICY), test_clock=lambda: now[0])

    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = RateLimitMiddleware(
        Starlette(routes=[Route("/api/hello", hello)]), limiter=limiter, identify=identify
    )
    headers = {"x-user": "alice", "x-billing-day": "31"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        for left in (2, 1, 0):
            response = await client.get("/api/hello", headers=headers)
            assert response.status_code == 200
            parsed = rate_limit_headers(response)
            assert parsed.policies["api/billing"].q == 3
            # March 31st to April 30th: 30 days.
            assert parsed.policies["api/billing"].w == 30 * 86_400
            assert parsed.limits["api/billing"].r == left
            assert parsed.limits["api/billing"].t == 60
            assert parsed.policies["api/day"].w == 86_400
        refused = await client.get("/api/hello", headers=headers)
        assert refused.status_code == 429
        parsed = rate_limit_headers(refused)
        assert parsed.retry_after == 60
        assert list(parsed.limits) == ["api/billing"]
        problem = refused.json()
        assert problem["violated-policies"] == ["api/billing"]
        assert "3 requests per billing month " in problem["detail"]
        # At the period's end the next billing month admits again.
        now[0] += 60
        assert (await client.get("/api/hello", headers=headers)).status_code == 200
        # identify without the billing day: the app's mistake, raised (a 500 under a
        # server), never a request counted against a made-up period.
        with pytest.raises(InvalidArgumentError, match=r"keys\['billing_day'\]"):
            await client.get("/api/hello", headers={"x-user": "bob"})
    await limiter.aclose()
