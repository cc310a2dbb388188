"""Middleware manners: identify runs only where a limit matches, what an identify failure
means, options checked when the middleware is built (also under uvicorn's lazy start-up),
limits for explicit use only, and a cost computed from the request.

Every decision is made by a real limiter on the shared redis-server; the start-up failure
is shown by a real uvicorn process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from harness import RedisServer
from servers import serve_wsgi
from test_web_headers import GATE, result

from applimit import (
    AsyncLimiter,
    ConfigurationError,
    InvalidArgumentError,
    Limiter,
    UnknownLimitError,
)
from applimit._decision import combine
from applimit.asgi import Caller, RateLimitMiddleware
from applimit.fastapi import RateLimit, add_problem_handler
from applimit.web._headers import TEMPORARY_REDUCED_CAPACITY
from applimit.web._request import RequestInfo
from applimit.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware

POLICY = """
version: 1
tiers: [free, pro]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 2/1m, pro: 10/1m } }
  - name: exports
    match: { path_prefix: /reports/ }
    app: { algorithm: sliding_log, middleware: false, tiers: { free: 1/1m, pro: 1/1m } }
"""


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """2 requests a minute under /api/; 'exports' (1 a minute) is for explicit use only."""
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


class AuthDown(Exception):
    """What a broken auth backend raises."""


def broken_identify(request: RequestInfo) -> Caller | None:
    """An identify whose backend is down: it raises on every call it gets."""
    broken_identify.calls.append(request.path)  # type: ignore[attr-defined]
    raise AuthDown("the session store is unreachable")


def starlette_app(limiter: AsyncLimiter, **options: Any) -> FastAPI:
    """A FastAPI app with /healthz, /api/thing and /reports/x behind the middleware."""
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, limiter=limiter, **options)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"ok": "yes"}

    @app.api_route("/api/thing", methods=["GET", "POST", "OPTIONS"])
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/reports/x")
    async def report() -> dict[str, str]:
        return {"ok": "yes"}

    return app


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in process (the peer is 127.0.0.1)."""
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """A WSGI app that answers 200 everywhere."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


# --- identify runs only where a limit matches ----------------------------------------------


async def test_identify_does_not_run_where_no_limit_matches(async_limiter: AsyncLimiter) -> None:
    """/healthz matches no limit: a raising identify is never called there, so it is a 200
    with no rate-limit headers; under /api/ the default ("raise") still propagates."""
    broken_identify.calls = []  # type: ignore[attr-defined]
    app = starlette_app(async_limiter, identify=broken_identify)
    async with client(app) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200
        assert "ratelimit-policy" not in health.headers
        # /reports/ is matched only by a middleware: false limit: not the middleware's.
        assert (await http.get("/reports/x")).status_code == 200
        assert broken_identify.calls == []  # type: ignore[attr-defined]
        with pytest.raises(AuthDown):
            await http.get("/api/thing")
    assert broken_identify.calls == ["/api/thing"]  # type: ignore[attr-defined]


def test_limiter_matches_ignores_tiers_and_explicit_limits(sync_limiter: Limiter) -> None:
    """Limiter.matches: the middleware's limits only, in every path spelling."""
    assert sync_limiter.matches("GET", "/api/thing")
    assert sync_limiter.matches("POST", "/api/../api/thing?x=1")
    assert not sync_limiter.matches("GET", "/healthz")
    assert not sync_limiter.matches("GET", "/reports/x")


def test_wsgi_identify_does_not_run_where_no_limit_matches(sync_limiter: Limiter) -> None:
    """The WSGI middleware under waitress: /healthz never reaches the broken identify."""
    broken_identify.calls = []  # type: ignore[attr-defined]
    app = WSGIRateLimitMiddleware(
        wsgi_app, limiter=sync_limiter, identify=broken_identify, on_identify_error="refuse"
    )
    with serve_wsgi(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        assert broken_identify.calls == []  # type: ignore[attr-defined]
        refused = http.get("/api/thing")
    assert refused.status_code == 503
    assert refused.json()["type"] == TEMPORARY_REDUCED_CAPACITY


# --- on_identify_error ---------------------------------------------------------------------


async def test_identify_error_anonymous_counts_the_caller_by_ip(
    async_limiter: AsyncLimiter, caplog: pytest.LogCaptureFixture
) -> None:
    """ "anonymous": logged, then counted as an anonymous caller (the free tier's 2/1m)."""
    app = starlette_app(async_limiter, identify=broken_identify, on_identify_error="anonymous")
    async with client(app) as http:
        statuses = [(await http.get("/api/thing")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert "identify() raised on GET /api/thing" in caplog.text
    assert "AuthDown" in caplog.text
    decision = await async_limiter.peek("api", None, ip="127.0.0.1")
    assert not decision.allowed


async def test_identify_error_refuse_answers_503_and_consumes_nothing(
    async_limiter: AsyncLimiter,
) -> None:
    """ "refuse": a 503 problem (the service cannot tell who calls); no quota is used."""
    app = starlette_app(async_limiter, identify=broken_identify, on_identify_error="refuse")
    async with client(app) as http:
        refused = await http.get("/api/thing")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers["retry-after"] == "5"
    body = refused.json()
    assert body["type"] == TEMPORARY_REDUCED_CAPACITY
    assert body["status"] == 503
    assert body["retry-after"] == 5 and "retry in 5 seconds" in body["detail"]
    decision = await async_limiter.peek("api", None, ip="127.0.0.1")
    assert decision.remaining == 2


def test_wsgi_identify_error_anonymous(sync_limiter: Limiter) -> None:
    """The WSGI middleware honours "anonymous" the same way."""
    app = WSGIRateLimitMiddleware(
        wsgi_app, limiter=sync_limiter, identify=broken_identify, on_identify_error="anonymous"
    )
    with serve_wsgi(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        statuses = [http.get("/api/thing").status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


# --- options checked at construction --------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"trusted_proxies": ["10.0.0.0/33"]}, "option trusted_proxies: trusted proxy '10.0"),
        ({"trusted_proxies": "10.0.0.1"}, "option trusted_proxies: '10.0.0.1' is not a list"),
        ({"on_identify_error": "ignore"}, "option on_identify_error: 'ignore' is not one of"),
        ({"cost": 0}, "option cost: 0 is not a cost"),
        ({"cost": "2"}, "option cost: '2' is not a cost"),
        ({"identify": "auth.identify"}, "option identify: 'auth.identify' is not callable"),
        ({"legacy_headers": "yes"}, "option legacy_headers: 'yes' is not True or False"),
    ],
)
def test_bad_options_fail_at_construction(
    async_limiter: AsyncLimiter, sync_limiter: Limiter, options: dict[str, Any], named: str
) -> None:
    """Each shell names the bad option when it is built, as a ConfigurationError."""
    with pytest.raises(ConfigurationError, match=named):
        RateLimitMiddleware(wsgi_app, limiter=async_limiter, **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=named):
        WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter, **options)
    if "on_identify_error" not in options:  # the dependency lets identify's errors raise
        with pytest.raises(ConfigurationError, match=named):
            RateLimit(async_limiter, "api", **options)


def test_the_wrong_limiter_kind_fails_at_construction(
    async_limiter: AsyncLimiter, sync_limiter: Limiter
) -> None:
    """An ASGI app needs an AsyncLimiter and a WSGI app a Limiter: said when built."""
    with pytest.raises(ConfigurationError, match=r"needs an applimit\.AsyncLimiter, not Limiter"):
        RateLimitMiddleware(wsgi_app, limiter=sync_limiter)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"needs an applimit\.Limiter, not AsyncLimiter"):
        WSGIRateLimitMiddleware(wsgi_app, limiter=async_limiter)  # type: ignore[arg-type]


APP_MODULE = """
from fastapi import FastAPI

from applimit import AsyncLimiter
from applimit.asgi import RateLimitMiddleware

limiter = AsyncLimiter.from_policy({policy!r}, redis_url={url!r})
app = FastAPI()
app.add_middleware(RateLimitMiddleware, limiter=limiter, trusted_proxies=["10.0.0.0/33"])


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {{"ok": "yes"}}
"""


@pytest.mark.parametrize("lifespan", ["auto", "on"])
def test_a_bad_option_fails_uvicorn_start_up_naming_it(
    tmp_path: Path, policy_path: Path, redis_server: RedisServer, lifespan: str
) -> None:
    """FastAPI builds its middleware lazily, on the lifespan start-up: a real uvicorn
    process exits at start-up with the option's message (never "lifespan appears
    unsupported" followed by a 500 on every request)."""
    module = tmp_path / "badapp.py"
    module.write_text(
        textwrap.dedent(APP_MODULE.format(policy=str(policy_path), url=redis_server.url)),
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "uvicorn", "badapp:app", "--app-dir", str(tmp_path)]
    command += ["--host", "127.0.0.1", "--port", "0", "--lifespan", lifespan]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0, done.stderr
    assert "RateLimitMiddleware option trusted_proxies" in done.stderr
    assert "'10.0.0.0/33' is not an IP address or CIDR network" in done.stderr
    assert "Application startup failed" in done.stderr
    assert "appears unsupported" not in done.stderr
    assert "Uvicorn running" not in done.stderr


# --- limits for explicit use only -----------------------------------------------------------


async def test_middleware_false_limits_apply_only_where_named(
    async_limiter: AsyncLimiter,
) -> None:
    """'exports' (middleware: false) is never applied by the middleware nor by an unnamed
    RateLimit, but a named RateLimit dependency and hit() apply it."""
    app = starlette_app(async_limiter)
    named = RateLimit(async_limiter, "exports")
    unnamed = RateLimit(async_limiter)
    add_problem_handler(app)

    @app.get("/reports/named", dependencies=[Depends(named)])
    async def named_route() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/reports/unnamed", dependencies=[Depends(unnamed)])
    async def unnamed_route() -> dict[str, str]:
        return {"ok": "yes"}

    async with client(app) as http:
        assert [(await http.get("/reports/x")).status_code for _ in range(3)] == [200] * 3
        unnamed_answers = [await http.get("/reports/unnamed") for _ in range(3)]
        assert [r.status_code for r in unnamed_answers] == [200] * 3
        assert all("ratelimit" not in r.headers for r in unnamed_answers)
        first, second = await http.get("/reports/named"), await http.get("/reports/named")
    assert first.status_code == 200
    assert first.headers["ratelimit-policy"] == '"exports";q=1;w=60'
    assert second.status_code == 429
    assert second.json()["limit"] == "exports"
    direct = await async_limiter.hit("exports", None, ip="127.0.0.1")
    assert not direct.allowed
    decision = await async_limiter.check_request(
        "GET", "/reports/x", None, ip="192.0.2.1", host="test"
    )
    assert decision.results == ()


def test_middleware_false_is_a_policy_field(sync_limiter: Limiter, tmp_path: Path) -> None:
    """The field loads as a bool on the app part, true by default; other values fail."""
    from edgegen_policy import PolicyError, load

    policy = load(sync_limiter_policy(tmp_path, "false"))
    assert [limit.app.middleware for limit in policy.limits if limit.app] == [True, False]
    with pytest.raises(PolicyError, match="middleware"):
        load(sync_limiter_policy(tmp_path, "[1]"))


def sync_limiter_policy(tmp_path: Path, value: str) -> Path:
    """The test policy with ``middleware: <value>`` on 'exports'."""
    path = tmp_path / f"policy-{len(value)}.yaml"
    path.write_text(POLICY.replace("middleware: false", f"middleware: {value}"), "utf-8")
    return path


# --- cost from a callable -------------------------------------------------------------------


def weight(request: RequestInfo) -> int:
    """A POST costs 2, anything else 1."""
    return 2 if request.method == "POST" else 1


async def test_cost_from_a_callable(async_limiter: AsyncLimiter) -> None:
    """cost=function(request): a POST uses the free tier's whole 2/1m at once."""
    app = starlette_app(async_limiter, cost=weight)
    async with client(app) as http:
        posted = await http.post("/api/thing")
        refused = await http.get("/api/thing")
    assert posted.status_code == 200
    assert posted.headers["ratelimit"] == '"api";r=0;t=60'
    assert refused.status_code == 429


def test_wsgi_cost_from_a_callable_and_a_bad_return(sync_limiter: Limiter) -> None:
    """The WSGI middleware computes the cost the same way; a function returning a
    non-cost is the app's bug, raised with the function's name."""
    app = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter, cost=weight)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/api/x", "REMOTE_ADDR": "192.0.2.9"}
    seen: list[str] = []
    app(dict(environ), lambda status, headers, exc_info=None: seen.append(status))
    app(dict(environ, REQUEST_METHOD="GET"), lambda s, h, e=None: seen.append(s))
    assert seen == ["200 OK", "429 Too Many Requests"]
    broken = WSGIRateLimitMiddleware(wsgi_app, limiter=sync_limiter, cost=lambda r: 0)
    with pytest.raises(InvalidArgumentError, match="returned 0 for GET /api/x"):
        broken(dict(environ, REQUEST_METHOD="GET"), lambda s, h, e=None: None)


# --- CORS preflights, the 503 text, RateLimit's unknown name ---------------------------------


async def test_preflights_are_neither_counted_nor_refused(async_limiter: AsyncLimiter) -> None:
    """A CORS preflight passes through uncounted: the real request is what counts."""
    app = starlette_app(async_limiter)
    preflight = {"Origin": "http://other.test", "Access-Control-Request-Method": "POST"}
    async with client(app) as http:
        for _ in range(3):
            await http.options("/api/thing", headers=preflight)
        statuses = [(await http.get("/api/thing")).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]


def test_one_second_is_singular_in_the_problem_detail() -> None:
    """ "retry in 1 second", not "1 seconds", for the 503 and the 429 alike."""
    closed = combine(
        [result("api", remaining=0, reset_after=0.0, allowed=False, retry_after=1.0)],
        degraded=True,
    )
    refusal = GATE.answer(closed, "free").refusal
    assert refusal is not None
    assert json.loads(refusal.body)["detail"].endswith("retry in 1 second.")
    denied = combine([result("api", remaining=0, allowed=False, retry_after=0.5)])
    refusal = GATE.answer(denied, "free").refusal
    assert refusal is not None
    assert json.loads(refusal.body)["detail"].endswith("retry in 1 second.")
    later = combine([result("api", remaining=0, allowed=False, retry_after=2.5)])
    refusal = GATE.answer(later, "free").refusal
    assert refusal is not None
    assert json.loads(refusal.body)["detail"].endswith("retry in 3 seconds.")


def test_rate_limit_with_an_unknown_name_raises_unknown_limit_error(
    async_limiter: AsyncLimiter,
) -> None:
    """RateLimit(limiter, "nope") raises the limiter's own UnknownLimitError."""
    with pytest.raises(UnknownLimitError, match="no limit named 'nope'") as raised:
        RateLimit(async_limiter, "nope")
    assert raised.value.known == ("api", "exports")


async def test_the_dependency_runs_identify_only_where_a_limit_matches(
    async_limiter: AsyncLimiter,
) -> None:
    """RateLimit(limiter) with no name on a route no limit covers answers without running
    identify (whose backend is down here), as the middleware does; on a limited route the
    broken identify is the app's error, raised."""
    broken_identify.calls = []  # type: ignore[attr-defined]
    app = FastAPI()
    dependency = Depends(RateLimit(async_limiter, identify=broken_identify))

    @app.get("/healthz", dependencies=[dependency])
    async def healthz() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/api/thing", dependencies=[dependency])
    async def thing() -> dict[str, str]:
        return {"ok": "yes"}

    async with client(app) as http:
        health = await http.get("/healthz")
        assert health.status_code == 200 and "ratelimit" not in health.headers
        assert broken_identify.calls == []  # type: ignore[attr-defined]
        with pytest.raises(AuthDown):
            await http.get("/api/thing")
    assert broken_identify.calls == ["/api/thing"]  # type: ignore[attr-defined]
