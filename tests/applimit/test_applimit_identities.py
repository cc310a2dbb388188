"""Who a limit counts, through the helpers that call ``hit``: the ``rate_limited``
decorator and the FastAPI dependency count an anonymous caller by address, in the bucket
``check_request`` (and the middleware) count it in, and never in a user's bucket,
whatever the user id says."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import edgegen_policy as policy
import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from harness import RedisServer

from applimit import AsyncLimiter, Limiter, RateLimited, rate_limited
from applimit.asgi import Caller
from applimit.fastapi import RateLimit, RequestInfo

POLICY = """
version: 1
app: {key_prefix: id, timeout: 2s}
limits:
  - name: api
    match: {path_prefix: /api/}
    app: {algorithm: gcra, tiers: {default: 3/1m}}
  - name: login
    match: {paths: [/login]}
    app: {per: ip, algorithm: sliding_log, tiers: {default: 2/1m}}
"""


@pytest.fixture
def limiter(redis_server: RedisServer, redis_client: object) -> Iterator[Limiter]:
    made = Limiter(policy.loads(POLICY), redis_url=redis_server.url)
    yield made
    made.close()


@pytest.fixture
async def async_limiter(
    redis_server: RedisServer, redis_client: object
) -> AsyncIterator[AsyncLimiter]:
    made = AsyncLimiter(policy.loads(POLICY), redis_url=redis_server.url)
    yield made
    await made.aclose()


def test_the_decorator_counts_anonymous_callers_by_address(limiter: Limiter) -> None:
    """identity None: the call is counted by the address ``ip`` computes, together with
    the same caller's check_request; a user whose id is "anonymous-ip:<address>" (how
    anonymous callers used to be counted) or the address itself has a quota of its own."""
    address = f"203.0.113.{uuid.uuid4().int % 250}"

    @rate_limited(limiter, "api", identity=lambda user, ip: user, ip=lambda user, ip: ip)
    def search(user: str | None, ip: str) -> str:
        return "found"

    assert search(None, address) == "found"
    assert limiter.check_request("GET", "/api/x", None, ip=address).remaining == 1
    assert search(None, address) == "found"
    with pytest.raises(RateLimited):
        search(None, address)
    for lookalike in (f"anonymous-ip:{address}", address):
        assert search(lookalike, address) == "found"
        assert limiter.peek("api", lookalike).remaining == 2
    assert limiter.peek("api", None, ip=address).remaining == 0


async def test_the_async_decorator_counts_a_per_ip_limit_by_address(
    async_limiter: AsyncLimiter,
) -> None:
    """A per-IP limit counts the address whoever calls, as check_request does."""
    address = f"198.51.100.{uuid.uuid4().int % 250}"

    @rate_limited(async_limiter, "login", identity=lambda user, ip: user, ip=lambda user, ip: ip)
    async def login(user: str | None, ip: str) -> str:
        return "in"

    assert await login("alice", address) == "in"
    assert await login(None, address) == "in"
    with pytest.raises(RateLimited):
        await login("bob", address)
    decision = await async_limiter.check_request("POST", "/login", "carol", ip=address)
    assert not decision.allowed


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_the_fastapi_dependency_keeps_anonymous_callers_apart_from_users(
    limiter: Limiter, async_limiter: AsyncLimiter, flavour: str
) -> None:
    """RateLimit(limiter, "api"): anonymous requests are counted by the client address,
    in the bucket the middleware (check_request) uses; a user whose id is
    "anonymous-ip:<address>" is counted as that user, apart from them."""
    chosen: Limiter | AsyncLimiter = limiter if flavour == "sync" else async_limiter

    def identify(request: RequestInfo) -> Caller | None:
        user = request.header("x-user")
        return Caller(user) if user else None

    app = FastAPI()
    limit = RateLimit(chosen, "api", identify=identify)

    @app.get("/api/thing", dependencies=[Depends(limit)])
    async def thing(request: Request) -> dict[str, str]:
        return {"ok": "yes"}

    address = "127.0.0.1"  # what httpx's ASGI transport reports as the client
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/api/thing")).status_code == 200
        assert (await client.get("/api/thing")).status_code == 200
        assert (await client.get("/api/thing")).status_code == 200
        assert (await client.get("/api/thing")).status_code == 429
        for lookalike in (f"anonymous-ip:{address}", address):
            response = await client.get("/api/thing", headers={"x-user": lookalike})
            assert response.status_code == 200, lookalike
    assert not limiter.check_request("GET", "/api/thing", None, ip=address).allowed
    assert limiter.peek("api", f"anonymous-ip:{address}").remaining == 2
