"""Observable decisions over real HTTP: a Starlette app under uvicorn and a Flask app under
waitress, behind the middleware, on a real redis-server. The app reads the Decision the
middleware left for it (scope state, WSGI environ), shadow denials reach the Prometheus
series and the log, and a Redis outage is counted as degraded."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import edgegen_policy as policy
import flask
import httpx
import pytest
from harness import RedisServer
from prometheus_client import CollectorRegistry
from servers import load_example, serve_asgi, serve_wsgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from applimit import AsyncLimiter, Decision, Limiter
from applimit.asgi import DECISION_STATE_KEY
from applimit.asgi import RateLimitMiddleware as AsgiMiddleware
from applimit.prometheus import PrometheusObserver
from applimit.wsgi import DECISION_ENVIRON_KEY
from applimit.wsgi import RateLimitMiddleware as WsgiMiddleware

POLICY = """
version: 1
tiers: [free]
app: {key_prefix: webobs, timeout: 2s, on_redis_error: allow}
limits:
  - name: api
    match: {path_prefix: /api/}
    app: {algorithm: sliding_log, tiers: {free: 10/1m}}
  - name: new-api
    match: {path_prefix: /api/}
    app: {algorithm: sliding_window, enforce: false, tiers: {free: 1/1m}}
"""


def _described(decision: Decision | None) -> dict[str, Any]:
    """What the app answers about the Decision it was given."""
    if decision is None:
        return {"decision": None}
    return {
        "allowed": decision.allowed,
        "degraded": decision.degraded,
        "shadow_denied_by": [r.name for r in decision.shadow_denied_by],
        "remaining": decision.remaining,
    }


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def starlette_app(limiter: AsyncLimiter) -> Any:
    """A Starlette app that answers with what request.state says of its Decision."""

    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse(_described(getattr(request.state, DECISION_STATE_KEY, None)))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Built by the test, used and closed on the server's own event loop.
        yield
        await limiter.aclose()

    app = Starlette(
        routes=[Route("/api/thing", endpoint), Route("/free", endpoint)], lifespan=lifespan
    )
    return AsgiMiddleware(app, limiter=limiter, identify=lambda request: _alice())


def flask_app(limiter: Limiter) -> Any:
    """A Flask app that answers with what the WSGI environ holds of its Decision."""
    app = flask.Flask(__name__)

    @app.get("/api/thing")
    @app.get("/free")
    def endpoint() -> Any:
        return flask.jsonify(_described(flask.request.environ.get(DECISION_ENVIRON_KEY)))

    return WsgiMiddleware(app, limiter=limiter, identify=lambda request: _alice())


def _alice() -> Any:
    from applimit.asgi import Caller

    return Caller("alice", tier="free")


@pytest.fixture(params=["asgi", "wsgi"])
def served(
    request: pytest.FixtureRequest, redis_client: Any, redis_server: RedisServer
) -> Iterator[Any]:
    """Serve either stack; yields a function (redis_url) -> (base URL, registry)."""
    stack = request.param
    stack_exits: list[Any] = []

    def serve(url: str = redis_server.url, text: str = POLICY) -> tuple[str, CollectorRegistry]:
        registry = CollectorRegistry()
        observers = [PrometheusObserver(registry)]
        loaded = policy.loads(text)
        if stack == "asgi":
            alimiter = AsyncLimiter(loaded, redis_url=url, observers=observers)
            context = serve_asgi(starlette_app(alimiter))
        else:
            limiter = Limiter(loaded, redis_url=url, observers=observers)
            stack_exits.append(limiter.close)
            context = serve_wsgi(flask_app(limiter))
        base = context.__enter__()
        stack_exits.insert(0, lambda: context.__exit__(None, None, None))
        return base, registry

    yield serve
    for leave in stack_exits:
        leave()


def _count(registry: CollectorRegistry, limit: str, outcome: str) -> float:
    labels = {"limit": limit, "tier": "free", "outcome": outcome}
    return registry.get_sample_value("applimit_decisions_total", labels) or 0.0


def test_the_app_sees_the_decision_and_shadow_denials_are_counted(
    served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A shadow limit of 1/1m: three requests all pass; from the second on, the app reads
    in its Decision that the shadow limit would have denied, the counter says so, and one
    log line names the limit and tier with a hashed identity."""
    caplog.set_level(logging.INFO, logger="applimit")
    base, registry = served()
    with httpx.Client(base_url=base) as client:
        answers = [client.get("/api/thing") for _ in range(3)]
        unlimited = client.get("/free")
    assert [a.status_code for a in answers] == [200, 200, 200]
    bodies = [a.json() for a in answers]
    assert [b["shadow_denied_by"] for b in bodies] == [[], ["new-api"], ["new-api"]]
    assert [b["remaining"] for b in bodies] == [9, 8, 7]
    assert not any(b["degraded"] for b in bodies)
    # No limit matches /free: the middleware decided nothing and left nothing.
    assert unlimited.json() == {"decision": None}
    assert _count(registry, "api", "allowed") == 3
    assert _count(registry, "new-api", "allowed") == 1
    assert _count(registry, "new-api", "shadow_denied") == 2
    shadow = [r for r in caplog.records if getattr(r, "applimit_event", "") == "shadow_denied"]
    assert len(shadow) == 1
    record: Any = shadow[0]
    assert (record.limit, record.tier) == ("new-api", "free")
    assert "alice" not in record.getMessage()


def test_a_redis_outage_is_counted_as_degraded_through_the_middleware(served: Any) -> None:
    """The limiter's Redis is a closed port: requests pass (on_redis_error: allow), the
    app reads a degraded Decision, and the series count degraded_allowed."""
    base, registry = served(f"redis://127.0.0.1:{_closed_port()}")
    with httpx.Client(base_url=base) as client:
        answers = [client.get("/api/thing") for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(a.json()["degraded"] for a in answers)
    assert _count(registry, "api", "degraded_allowed") == 3
    assert _count(registry, "new-api", "degraded_allowed") == 3


@pytest.mark.parametrize("example", ["fastapi_app", "flask_app"])
def test_the_examples_serve_their_metrics(
    example: str, redis_client: Any, redis_server: RedisServer
) -> None:
    """The FastAPI and Flask examples answer /metrics with the decisions they made, in the
    Prometheus text format, over real HTTP."""
    app = load_example(example).create_app(redis_url=redis_server.url)
    serve = serve_asgi if example == "fastapi_app" else serve_wsgi
    with serve(app) as base, httpx.Client(base_url=base) as client:
        assert client.get("/api/items").status_code == 200
        metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'applimit_decisions_total{limit="api",outcome="allowed",tier="free"} 1.0' in text
    assert 'applimit_breaker_state{node="main",state="closed"} 1.0' in text


def test_refusals_through_the_middleware_are_counted(served: Any) -> None:
    """The eleventh request of 10/1m is refused (429) and counted as denied; with Redis
    unreachable, a limit that fails closed refuses (503) and is counted as
    degraded_denied, the fail-open one beside it as degraded_allowed."""
    base, registry = served()
    with httpx.Client(base_url=base) as client:
        statuses = [client.get("/api/thing").status_code for _ in range(11)]
    assert statuses == [200] * 10 + [429]
    assert _count(registry, "api", "allowed") == 10
    assert _count(registry, "api", "denied") == 1

    closed = POLICY.replace(
        "app: {algorithm: sliding_log, tiers: {free: 10/1m}}",
        "app: {algorithm: sliding_log, on_redis_error: deny, tiers: {free: 10/1m}}",
    )
    base, registry = served(f"redis://127.0.0.1:{_closed_port()}", closed)
    with httpx.Client(base_url=base) as client:
        statuses = [client.get("/api/thing").status_code for _ in range(2)]
    assert statuses == [503, 503]
    assert _count(registry, "api", "degraded_denied") == 2
    assert _count(registry, "new-api", "degraded_allowed") == 2


def test_the_middlewares_log_records_carry_structured_fields(
    redis_client: Any, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An identify() that raises, with on_identify_error='anonymous', and a tier the policy
    does not list: the request passes, and each record the middleware writes names its
    event for JSON handlers (WSGI under waitress, real Redis)."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = Limiter(policy.loads(POLICY), redis_url=redis_server.url)
    calls = 0

    def identify(request: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("token service down")
        from applimit.wsgi import Caller

        return Caller("nina", tier="platinum")

    app = flask.Flask(__name__)

    @app.get("/api/thing")
    def endpoint() -> Any:
        return flask.jsonify(_described(flask.request.environ.get(DECISION_ENVIRON_KEY)))

    wrapped = WsgiMiddleware(app, limiter=limiter, identify=identify, on_identify_error="anonymous")
    try:
        with serve_wsgi(wrapped) as base, httpx.Client(base_url=base) as client:
            assert client.get("/api/thing").status_code == 200
            assert client.get("/api/thing").status_code == 200
    finally:
        limiter.close()
    records = [r for r in caplog.records if r.name == "applimit"]
    events = [getattr(r, "applimit_event", None) for r in records]
    assert "identify_failed" in events and "unknown_tier" in events
    assert all(isinstance(event, str) for event in events)
