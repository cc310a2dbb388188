"""Hostile requests, fuzzed: the ASGI and WSGI middlewares answer every request they are
given with a well-formed response, in bounded time, and never raise.

Hypothesis builds ASGI scopes and WSGI environs from any bytes: header names and values
that are not UTF-8 (ASGI headers are bytes; WSGI strings are latin-1), huge values, many
``X-Forwarded-For`` hops with garbage addresses, odd paths, ``raw_path`` and query bytes,
any method and host. The middlewares drive a real limiter on the harness Redis, with an
``identify`` that takes the user from a header, so identities of any bytes reach Redis
keys too. Every answer must be 200 from the tiny app, or 429 (or 503 when a fail-closed
limit cannot reach Redis) with header names and values an HTTP server can send.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import edgegen_policy as policy
import pytest
from harness import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applimit import AsyncLimiter, Limiter
from applimit.asgi import Caller
from applimit.asgi import RateLimitMiddleware as AsgiMiddleware
from applimit.wsgi import RateLimitMiddleware as WsgiMiddleware

POLICY = """
version: 1
app: {key_prefix: fz, timeout: 200ms, on_redis_error: allow}
limits:
  - name: api
    match: {path_prefix: /api/}
    app: {per: user, algorithm: sliding_log, tiers: {default: 5/1m}}
  - name: login
    match: {paths: [/login], methods: [POST]}
    app: {per: ip, algorithm: gcra, on_redis_error: deny, tiers: {default: 3/1m}}
  - name: all
    app: {per: ip, algorithm: sliding_window, tiers: {default: 50/1m}}
"""
# 400: a path holding a control character (bad_path).
STATUSES = {200, 400, 429, 503}
# An HTTP field value: visible characters, spaces and tabs, no CR/LF/NUL.
FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Generous: a decision keeps to the policy's 200 ms timeout; the rest is Python.
BOUND = 3.0

header_bytes = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(1_000, 200_000).map(lambda n: b"x" * n),
)
ip_text = st.one_of(
    st.ip_addresses().map(str),
    st.sampled_from(["", "unknown", "::ffff:1.2.3.4", "[::1]:80", "1.2.3.4:5", "999.1.1.1"]),
    st.text(max_size=30),
)
forwarded_for = st.lists(ip_text, max_size=200).map(
    lambda hops: ", ".join(hops).encode("utf-8", "surrogatepass")
)
paths = st.one_of(
    st.sampled_from([b"/api/items", b"/login", b"/", b"//api//x/../y", b"/api/%2e%2e/%00", b"*"]),
    st.binary(max_size=300),
    st.builds(
        lambda p, tail: p + tail, st.sampled_from([b"/api/", b"/login"]), st.binary(max_size=50)
    ),
)
methods = st.one_of(st.sampled_from(["GET", "POST", "get", "PATCH", ""]), st.text(max_size=12))
special = st.sampled_from(
    [b"host", b"x-forwarded-for", b"cf-connecting-ip", b"x-user", b"authorization", b"cookie"]
)
headers = st.lists(
    st.tuples(st.one_of(special, st.binary(min_size=1, max_size=20)), header_bytes), max_size=12
)


def _identify(request: Any) -> Caller | None:
    """The user is whatever the X-User header says (any text); no header: anonymous."""
    for name, value in request.headers:
        if name == "x-user" and value:
            return Caller(user=value)
    return None


def _check_headers(pairs: list[tuple[bytes, bytes]]) -> None:
    for name, value in pairs:
        assert TOKEN.fullmatch(name), name
        assert FIELD_VALUE.fullmatch(value), value
        assert len(value) < 4096


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for every example, so one AsyncLimiter serves them all."""
    made = asyncio.new_event_loop()
    yield made
    made.close()


@pytest.fixture(scope="module")
def asgi_app(redis_server: RedisServer, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    """The ASGI middleware around a tiny app, on a real AsyncLimiter."""
    limiter = AsyncLimiter(policy.loads(POLICY), redis_url=redis_server.url)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    yield AsgiMiddleware(
        app, limiter=limiter, identify=_identify, trusted_proxies=["127.0.0.0/8", "10.0.0.0/8"]
    )
    loop.run_until_complete(limiter.aclose())


@pytest.fixture(scope="module")
def wsgi_app(redis_server: RedisServer) -> Iterator[Any]:
    """The WSGI middleware around a tiny app, on a real Limiter."""
    limiter = Limiter(policy.loads(POLICY), redis_url=redis_server.url)

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    yield WsgiMiddleware(
        app,
        limiter=limiter,
        identify=_identify,
        trusted_proxies=["127.0.0.0/8"],
        behind_cloudflare=True,
    )
    limiter.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=methods,
    path=paths,
    query=st.binary(max_size=200),
    headers=headers,
    xff=st.none() | forwarded_for,
    client=st.none() | st.tuples(ip_text, st.integers(0, 65535)),
    raw_path=st.booleans(),
)
def test_asgi_middleware_answers_any_request(
    asgi_app: Any,
    loop: asyncio.AbstractEventLoop,
    method: str,
    path: bytes,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    xff: bytes | None,
    client: tuple[str, int] | None,
    raw_path: bool,
) -> None:
    """Any scope gets one response start with a known status and sendable headers, and a
    body, within the bound; nothing raises."""
    all_headers = [(n.lower(), v) for n, v in headers]
    if xff is not None:
        all_headers.append((b"x-forwarded-for", xff))
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path.decode("latin-1"),
        "query_string": query,
        "headers": all_headers,
        "client": client,
        "server": ("127.0.0.1", 8000),
    }
    if raw_path:
        scope["raw_path"] = path
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    started = time.monotonic()
    loop.run_until_complete(asyncio.wait_for(asgi_app(scope, receive, send), BOUND))
    assert time.monotonic() - started < BOUND
    start = sent[0]
    assert start["type"] == "http.response.start"
    assert start["status"] in STATUSES
    _check_headers(list(start.get("headers", [])))
    assert [m["type"] for m in sent[1:]][-1:] == ["http.response.body"]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=methods,
    path=paths,
    query=st.binary(max_size=200),
    headers=headers,
    remote=st.none() | ip_text,
    raw_uri=st.booleans(),
)
def test_wsgi_middleware_answers_any_request(
    wsgi_app: Any,
    method: str,
    path: bytes,
    query: bytes,
    headers: list[tuple[bytes, bytes]],
    remote: str | None,
    raw_uri: bool,
) -> None:
    """Any environ gets one start_response with a known status line and sendable headers
    (latin-1 strings, as PEP 3333 requires), within the bound; nothing raises."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path.decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
    }
    if remote is not None:
        environ["REMOTE_ADDR"] = remote
    if raw_uri:
        environ["RAW_URI"] = environ["REQUEST_URI"] = (path + b"?" + query).decode("latin-1")
    for name, value in headers:
        key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        environ[key] = value.decode("latin-1")
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(
        status: str, response_headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Any:
        started.append((status, response_headers))
        return lambda data: None

    begun = time.monotonic()
    body = b"".join(wsgi_app(environ, start_response))
    assert time.monotonic() - begun < BOUND
    [(status, response_headers)] = started
    code, _, reason = status.partition(" ")
    assert int(code) in STATUSES and reason
    _check_headers([(n.encode("latin-1"), v.encode("latin-1")) for n, v in response_headers])
    assert isinstance(body, bytes)
