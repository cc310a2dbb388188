"""The middleware's contract beyond headers: what it leaves alone, what it never buffers,
and what it does when the limiter or identify() misbehave."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from webcheck import rate_limit_headers

from applimit import AsyncLimiter, Limiter, UnknownLimitError
from applimit.asgi import Caller, RateLimitMiddleware, RequestInfo
from applimit.fastapi import RateLimit
from applimit.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware

POLICY = """
version: 1
tiers: [free, pro]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 2/1m, pro: 10/1m } }
"""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """A small policy: 2 requests a minute under /api/ for the free tier."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture
async def async_limiter(
    policy_path: Path, redis_server: RedisServer, redis_client: Any
) -> AsyncIterator[AsyncLimiter]:
    """An AsyncLimiter on the shared (flushed) Redis."""
    limiter = AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url)
    yield limiter
    await limiter.aclose()


@pytest.fixture
def sync_limiter(
    policy_path: Path, redis_server: RedisServer, redis_client: Any
) -> Iterator[Limiter]:
    """A Limiter on the shared (flushed) Redis."""
    with Limiter.from_policy(policy_path, redis_url=redis_server.url) as limiter:
        yield limiter


class Recorder:
    """An ASGI app that records what it was called with and answers 200 with one header."""

    def __init__(self) -> None:
        self.calls: list[tuple[Scope, Any, Any]] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.calls.append((scope, receive, send))
        if scope["type"] == "http":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]}
            )
            await send({"type": "http.response.body", "body": b"ok"})


def http_scope(path: str = "/api/x") -> Scope:
    """A minimal ASGI http scope from 192.0.2.1."""
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"example.com")],
        "client": ("192.0.2.1", 1234),
    }


async def call(app: Any, scope: Scope) -> list[Message]:
    """Run one ASGI request and return the messages sent."""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


# --- ASGI --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_non_http_scopes_pass_through_untouched(
    async_limiter: AsyncLimiter, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WebSocket and lifespan scopes reach the app with the very same scope, receive and
    send, and the limiter is never asked."""

    async def no_decisions(*args: object, **kwargs: object) -> None:
        raise AssertionError("the limiter was called for a non-HTTP scope")

    monkeypatch.setattr(async_limiter, "check_request", no_decisions)
    inner = Recorder()
    app = RateLimitMiddleware(inner, limiter=async_limiter)
    scope: Scope = {"type": kind, "path": "/api/ws", "headers": []}

    async def receive() -> Message:
        return {}

    async def send(message: Message) -> None:
        return None

    await app(scope, receive, send)
    assert inner.calls == [(scope, receive, send)]


async def test_headers_are_added_to_the_apps_own(async_limiter: AsyncLimiter) -> None:
    """The app's headers stay; the rate-limit headers come after them."""
    sent = await call(RateLimitMiddleware(Recorder(), limiter=async_limiter), http_scope())
    headers = sent[0]["headers"]
    assert headers[0] == (b"x-app", b"1")
    names = [name for name, _ in headers]
    assert names[1:] == [b"ratelimit-policy", b"ratelimit"]
    assert sent[1] == {"type": "http.response.body", "body": b"ok"}


async def test_a_refused_request_never_reaches_the_app(async_limiter: AsyncLimiter) -> None:
    """The third request of 2/1m is answered by the middleware alone."""
    inner = Recorder()
    app = RateLimitMiddleware(inner, limiter=async_limiter)
    for _ in range(2):
        await call(app, http_scope())
    sent = await call(app, http_scope())
    assert len(inner.calls) == 2
    assert sent[0]["status"] == 429
    assert json.loads(sent[1]["body"])["limit"] == "api"


def test_streaming_responses_are_not_buffered(
    policy_path: Path, redis_server: RedisServer, redis_client: Any
) -> None:
    """Through uvicorn, the client reads the first chunk while the app is still waiting to
    send the second: the middleware passes body messages on as they come."""
    release = threading.Event()
    waited: list[bool] = []
    # Built here, used and closed on the server's own event loop (its lifespan).
    limiter = AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url)

    async def streaming(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await limiter.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        # The test sets the event only after it has read the first chunk.
        waited.append(await asyncio.to_thread(release.wait, 10))
        await send({"type": "http.response.body", "body": b"second"})

    app = RateLimitMiddleware(streaming, limiter=limiter)
    with serve_asgi(app) as url, httpx.Client() as client:
        with client.stream("GET", f"{url}/api/stream") as response:
            rate_limit_headers(response)
            assert "ratelimit" in response.headers
            chunks = response.iter_raw()
            assert next(chunks) == b"first"
            release.set()
            assert b"".join(chunks) == b"second"
    assert waited == [True]


async def test_a_closed_limiter_reopens_and_keeps_counting(async_limiter: AsyncLimiter) -> None:
    """A limiter closed on shutdown decides again after it (new connections): the counts
    go on from Redis, nothing is let through unlimited. A bug of the limiter (here a
    check_request that raises) reaches the app's server as any exception does, rather than
    being taken for an outage."""
    inner = Recorder()
    app = RateLimitMiddleware(inner, limiter=async_limiter)
    first = await call(app, http_scope())
    remaining = dict(first[0]["headers"])[b"ratelimit"]
    await async_limiter.aclose()
    again = await call(app, http_scope())
    assert again[0]["status"] == 200
    assert dict(again[0]["headers"])[b"ratelimit"] != remaining
    for _ in range(20):
        sent = await call(app, http_scope())
    assert sent[0]["status"] == 429

    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug in the limiter")

    async_limiter.check_request = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="a bug in the limiter"):
        await call(app, http_scope())


async def test_async_identify_and_its_mistakes(async_limiter: AsyncLimiter) -> None:
    """identify may be a coroutine function; returning anything but a Caller or None is
    the app's bug and surfaces as TypeError; so does a Caller with an empty id."""

    async def identify(request: RequestInfo) -> Caller | None:
        return Caller("u1", tier="pro") if request.header("host") else None

    app = RateLimitMiddleware(Recorder(), limiter=async_limiter, identify=identify)
    sent = await call(app, http_scope())
    policy = dict(sent[0]["headers"])[b"ratelimit-policy"]
    assert policy == b'"api";q=10;w=60'

    def wrong(request: RequestInfo) -> object:
        return ("u1", "pro")

    confused = RateLimitMiddleware(Recorder(), limiter=async_limiter, identify=wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"return applimit\.Caller"):
        await call(confused, http_scope())
    with pytest.raises(ValueError, match="non-empty str"):
        Caller("")


# --- WSGI --------------------------------------------------------------------------------


def test_wsgi_identify_answers_and_mistakes(sync_limiter: Limiter) -> None:
    """A WSGI app's identify: a Caller (or a subclass of it) or None is taken as it is;
    an async identify cannot be awaited there and is refused as TypeError (its coroutine
    closed, no warning), as is any other value. Caller.keys may be any Mapping, not only
    a dict, and nothing else."""

    class Member(Caller):
        pass

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append(status)
        return lambda data: None

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "REMOTE_ADDR": "192.0.2.1"}
    answers: list[object] = [
        Caller("plain", keys=MappingProxyType({"org": "acme"})),
        Member("member"),
        None,
    ]
    for answer in answers:
        seen: list[str] = []
        app = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter, identify=lambda r: answer)  # noqa: B023
        assert list(app(dict(environ), start_response)) == [b"ok"]
        assert seen == ["200 OK"]

    async def later(request: RequestInfo) -> Caller:
        return Caller("late")

    for wrong, message in ((later, "cannot await it"), (lambda r: "u1", r"applimit\.Caller")):
        app = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter, identify=wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=message):
            app(dict(environ), start_response)
    with pytest.raises(ValueError, match="must be a mapping"):
        Caller("u1", keys=[("org", "acme")])  # type: ignore[arg-type]


def test_wsgi_returns_the_apps_iterable_itself(sync_limiter: Limiter) -> None:
    """No buffering: the app's iterable (a generator here) is handed back as it is, with
    the headers added through start_response."""
    produced: list[str] = []

    def body() -> Iterator[bytes]:
        produced.append("first")
        yield b"first"
        produced.append("second")
        yield b"second"

    generator = body()

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return generator

    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))
        return lambda data: None

    app = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "REMOTE_ADDR": "192.0.2.1"}
    result = app(environ, start_response)
    assert result is generator
    assert produced == []  # nothing was read ahead
    names = [name for name, _ in started[0][1]]
    assert names == ["Content-Type", "RateLimit-Policy", "RateLimit"]
    assert list(result) == [b"first", b"second"]


def test_wsgi_refusal_and_a_closed_limiter(sync_limiter: Limiter) -> None:
    """Over the limit the middleware answers 429 itself; a limiter closed (an app's
    shutdown hook) decides again afterwards, still refusing: it is not let through."""
    calls: list[str] = []

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"ok"]

    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        statuses.append(status)
        return lambda data: None

    app = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/x", "REMOTE_ADDR": "192.0.2.1"}
    for _ in range(3):
        body = app(dict(environ), start_response)
    assert statuses == ["200 OK", "200 OK", "429 Too Many Requests"]
    assert json.loads(b"".join(body))["status"] == 429
    assert len(calls) == 2
    sync_limiter.close()
    body = app(dict(environ), start_response)
    assert statuses[-1] == "429 Too Many Requests" and len(calls) == 2


def test_wsgi_refuses_an_async_identify(sync_limiter: Limiter) -> None:
    """A WSGI app cannot await identify(); saying so beats never authenticating anyone."""

    async def identify(request: RequestInfo) -> Caller | None:
        return None

    app = WSGIRateLimitMiddleware(
        lambda environ, start_response: [b""],
        limiter=sync_limiter,
        identify=identify,  # type: ignore[arg-type]
    )
    with pytest.raises(TypeError, match="identify\\(\\) is async"):
        app({"REQUEST_METHOD": "GET", "PATH_INFO": "/api/x"}, lambda *a: None)  # type: ignore[arg-type]


def test_wsgi_behind_waitress_streams_the_apps_chunks(sync_limiter: Limiter) -> None:
    """Through a real server the generator's chunks arrive whole, after the headers."""

    def wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        yield b"a" * 70_000
        yield b"b"

    with serve_wsgi(WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter)) as url:
        response = httpx.get(f"{url}/api/big")
    assert response.content == b"a" * 70_000 + b"b"
    assert rate_limit_headers(response).limits["api"].r == 1


# --- the FastAPI dependency without the problem handler ----------------------------------


async def test_dependency_without_the_problem_handler_keeps_the_headers(
    async_limiter: AsyncLimiter,
) -> None:
    """Without add_problem_handler FastAPI renders its own JSON, but the refusal's headers
    (Retry-After, RateLimit) are still there; a sync Limiter works too."""
    app = FastAPI()
    limit = RateLimit(async_limiter, "api")

    @app.get("/thing", dependencies=[Depends(limit)])
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/thing")).status_code == 200
        assert (await client.get("/thing")).status_code == 200
        refused = await client.get("/thing")
    assert refused.status_code == 429
    assert refused.json() == {"detail": "Too Many Requests"}
    assert rate_limit_headers(refused).retry_after is not None
    with pytest.raises(UnknownLimitError, match="no limit named 'nope'"):
        RateLimit(async_limiter, "nope")


async def test_dependency_with_a_sync_limiter_and_all_matching_limits(
    sync_limiter: Limiter,
) -> None:
    """RateLimit(limiter) with no name checks the policy's matchers for the route; a
    blocking Limiter runs in the thread pool."""
    app = FastAPI()

    @app.get("/api/thing", dependencies=[Depends(RateLimit(sync_limiter))])
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/free", dependencies=[Depends(RateLimit(sync_limiter))])
    async def free() -> dict[str, str]:
        return {"ok": "yes"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        limited = await client.get("/api/thing")
        unlimited = await client.get("/free")
    assert rate_limit_headers(limited).limits["api"].r == 1
    assert "ratelimit" not in unlimited.headers
