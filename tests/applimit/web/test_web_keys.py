"""The middleware counts the keys ``identify`` returns: ``Caller(user, tier, keys={"org":
...})`` under real servers (an ASGI app under uvicorn, a WSGI app and the Flask extension
under waitress; the FastAPI dependency through httpx), on a real redis-server. One request
is counted per user and per organisation; a caller without an organisation is counted by
client IP in the ``per: org`` limit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import edgegen_policy as policy
import httpx
import pytest
from fastapi import Depends, FastAPI
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from applimit import AsyncLimiter, Limiter
from applimit.asgi import Caller, RequestInfo
from applimit.asgi import RateLimitMiddleware as AsgiMiddleware
from applimit.fastapi import RateLimit
from applimit.wsgi import RateLimitMiddleware as WsgiMiddleware

POLICY = """
version: 1
app: {key_prefix: webkeys, timeout: 2s}
limits:
  - name: user
    match: {path_prefix: /api/}
    app: {algorithm: sliding_log, tiers: {default: 3/1m}}
  - name: org
    match: {path_prefix: /api/}
    app: {per: org, algorithm: sliding_log, tiers: {default: 4/1m}}
"""


def identify(request: RequestInfo) -> Caller | None:
    """x-user names the user; x-org, when sent, the user's organisation."""
    user = request.header("x-user")
    if not user:
        return None
    org = request.header("x-org")
    return Caller(user, keys={"org": org} if org else {})


def asgi_app(redis_url: str) -> tuple[Any, Callable[[], Any]]:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    limiter = AsyncLimiter(policy.loads(POLICY), redis_url=redis_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The limiter's connections live on the server's event loop: closed there too.
        yield
        await limiter.aclose()

    inner = Starlette(routes=[Route("/api/hello", hello)], lifespan=lifespan)
    return AsgiMiddleware(inner, limiter=limiter, identify=identify), lambda: None


def wsgi_app(redis_url: str) -> tuple[Any, Callable[[], Any]]:
    def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        return [b"hello"]

    limiter = Limiter(policy.loads(POLICY), redis_url=redis_url)
    return WsgiMiddleware(hello, limiter=limiter, identify=identify), limiter.close


def flask_app(redis_url: str) -> tuple[Any, Callable[[], Any]]:
    from flask import Flask

    from applimit.flask import Limits

    limiter = Limiter(policy.loads(POLICY), redis_url=redis_url)
    app = Flask(__name__)
    Limits(app, limiter=limiter, identify=identify)

    @app.get("/api/hello")
    def hello() -> str:
        return "hello"

    return app, limiter.close


SERVERS: dict[str, tuple[Callable[[str], tuple[Any, Callable[[], Any]]], Any]] = {
    "asgi-uvicorn": (asgi_app, serve_asgi),
    "wsgi-waitress": (wsgi_app, serve_wsgi),
    "flask-extension-waitress": (flask_app, serve_wsgi),
}


@pytest.fixture(params=sorted(SERVERS))
def client(
    request: pytest.FixtureRequest, redis_server: RedisServer, redis_client: object
) -> Iterator[httpx.Client]:
    """An HTTP client of the app under a real server, on a flushed redis-server."""
    build, serve = SERVERS[str(request.param)]
    app, close = build(redis_server.url)
    server: AbstractContextManager[str] = serve(app)
    with server as url, httpx.Client(base_url=url) as http:
        yield http
    close()


def refused_by(response: httpx.Response) -> str | None:
    """Which limit a 429 names in its RateLimit header (r=0), or None when admitted."""
    if response.status_code == 200:
        return None
    assert response.status_code == 429
    exhausted = [
        item.split(";")[0].strip('" ')
        for item in response.headers["ratelimit"].split(",")
        if ";r=0" in item
    ]
    return ",".join(sorted(exhausted))


def test_identify_keys_count_per_user_and_per_organisation(client: httpx.Client) -> None:
    """Users of one organisation share its quota of 4; each has their own 3; another
    organisation is counted apart."""
    acme = {"x-org": "acme"}
    for _ in range(3):
        assert refused_by(client.get("/api/hello", headers={"x-user": "alice"} | acme)) is None
    assert refused_by(client.get("/api/hello", headers={"x-user": "alice"} | acme)) == "user"
    assert refused_by(client.get("/api/hello", headers={"x-user": "bob"} | acme)) is None
    assert refused_by(client.get("/api/hello", headers={"x-user": "carol"} | acme)) == "org"
    other = {"x-user": "carol", "x-org": "globex"}
    assert refused_by(client.get("/api/hello", headers=other)) is None


def test_callers_without_an_organisation_are_counted_by_address(client: httpx.Client) -> None:
    """No x-org (or no user at all): the per-org limit counts the client's address, shared
    by every such caller from it, so leaving the key out never escapes the limit."""
    for user in ("dave", "erin", None, "frank"):
        headers = {"x-user": user} if user else {}
        assert refused_by(client.get("/api/hello", headers=headers)) is None
    assert refused_by(client.get("/api/hello", headers={"x-user": "grace"})) == "org"
    # An organisation's callers from the same address are not affected.
    headers = {"x-user": "grace", "x-org": "acme"}
    assert refused_by(client.get("/api/hello", headers=headers)) is None


async def test_the_fastapi_dependency_counts_a_named_per_org_limit(
    redis_server: RedisServer, redis_client: object
) -> None:
    """RateLimit(limiter, "org") counts the organisation identify returns, and a caller
    without one by the client address, as the middleware does."""
    limiter = AsyncLimiter(policy.loads(POLICY), redis_url=redis_server.url)
    app = FastAPI()

    @app.get("/export", dependencies=[Depends(RateLimit(limiter, "org", identify=identify))])
    async def export() -> dict[str, str]:
        return {"ok": "yes"}

    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for user in ("a", "b", "c", "d"):
                response = await http.get("/export", headers={"x-user": user, "x-org": "acme"})
                assert response.status_code == 200
            refused = await http.get("/export", headers={"x-user": "e", "x-org": "acme"})
            assert refused.status_code == 429
            assert (await http.get("/export", headers={"x-user": "e"})).status_code == 200
        # 127.0.0.1: the client address httpx's ASGI transport reports.
        assert (await limiter.peek("org", None, ip="127.0.0.1")).remaining == 3
        assert (await limiter.peek("org", None, keys={"org": "acme"})).remaining == 0
    finally:
        await limiter.aclose()
