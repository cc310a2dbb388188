"""The framework helpers leave the Decision on the request for the app, for allowed and
shadow-denied requests: Flask (``flask.g`` and ``request.environ``) under waitress,
Django (``request.applimit_decision``) under gunicorn, the FastAPI dependency
(``request.state.applimit_decision``) under uvicorn, all on a real redis-server. A view
with a limit of its own sees one Decision that joins the request's and its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import Depends, FastAPI, Request
from flask import Flask, g, jsonify
from flask import request as flask_request
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from test_django import gunicorn, ready_url

from applimit import AsyncLimiter, Decision, Limiter
from applimit.fastapi import RateLimit
from applimit.flask import Caller, Limits, RequestInfo
from applimit.wsgi import DECISION_ENVIRON_KEY

POLICY = """
version: 1
tiers: [free]
app: { timeout: 2s }
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 3/1m } }
  - name: trial
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, enforce: false, tiers: { free: 1/1m } }
  - name: export
    app: { algorithm: sliding_log, middleware: false, tiers: { free: 5/1m } }
"""

ALICE = {"X-API-Key": "key-alice"}


def described(decision: Decision | None) -> dict[str, Any]:
    """What an app answers about the Decision it was given (as django_decision does)."""
    if decision is None:
        return {"decision": None}
    return {
        "allowed": decision.allowed,
        "degraded": decision.degraded,
        "limits": sorted({r.name for r in decision.results}),
        "shadow_denied_by": sorted(r.name for r in decision.shadow_denied_by),
    }


def identify(request: RequestInfo) -> Caller | None:
    """The test's auth: X-API-Key alice is a free user."""
    return Caller("alice", tier="free") if request.header("x-api-key") == "key-alice" else None


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """The policy above, as a file."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def check_sequence(client: httpx.Client) -> None:
    """The sequence every stack must answer alike."""
    first = client.get("/api/thing", headers=ALICE)
    assert first.status_code == 200
    assert first.json() == {
        "allowed": True,
        "degraded": False,
        "limits": ["api", "trial"],
        "shadow_denied_by": [],
    }
    # The shadow limit (1/1m) would refuse the second: the app is told, the client is not.
    second = client.get("/api/thing", headers=ALICE)
    assert second.status_code == 200
    assert second.json()["shadow_denied_by"] == ["trial"]
    assert second.json()["allowed"] is True
    # A view with its own limit: one Decision with the request's results and its own.
    joined = client.get("/api/report", headers=ALICE)
    assert joined.status_code == 200
    assert joined.json() == {
        "allowed": True,
        "degraded": False,
        "limits": ["api", "export", "trial"],
        "shadow_denied_by": ["trial"],
    }
    # The api limit (3/1m) refuses the fourth: no view runs, nothing to see.
    assert client.get("/api/thing", headers=ALICE).status_code == 429
    # No limit matches: no Decision.
    assert client.get("/healthz").json() == {"decision": None}


def test_flask_leaves_the_decision_in_g_and_the_environ(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path
) -> None:
    """Flask: flask.g.applimit_decision and request.environ["applimit.decision"] are the
    same Decision, for allowed and shadow-denied requests, joined with a view's own."""
    limiter = Limiter.from_policy(policy_path, redis_url=redis_server.url)
    limits = Limits(limiter=limiter, identify=identify)
    app = Flask(__name__)

    def answer() -> Any:
        decision = flask_request.environ.get(DECISION_ENVIRON_KEY)
        assert getattr(g, "applimit_decision", None) is decision
        return jsonify(described(decision))

    app.get("/api/thing")(answer)
    app.get("/api/report", endpoint="report")(limits.limit("export")(answer))
    app.get("/healthz", endpoint="healthz")(answer)
    limits.init_app(app)
    with (
        contextlib.closing(limiter),
        serve_wsgi(app) as url,
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        check_sequence(client)


def test_the_fastapi_dependency_leaves_the_decision_in_request_state(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path
) -> None:
    """FastAPI: request.state.applimit_decision, for allowed and shadow-denied requests;
    a route with two dependencies (the request's limits, then its own) sees both."""
    limiter = AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Built here, used and closed on the server's own event loop.
        yield
        await limiter.aclose()

    app = FastAPI(lifespan=lifespan)
    checked = Depends(RateLimit(limiter, identify=identify))

    @app.get("/api/thing", dependencies=[checked])
    async def thing(request: Request) -> dict[str, Any]:
        return described(getattr(request.state, "applimit_decision", None))

    @app.get(
        "/api/report",
        dependencies=[checked, Depends(RateLimit(limiter, "export", identify=identify))],
    )
    async def report(request: Request) -> dict[str, Any]:
        return described(getattr(request.state, "applimit_decision", None))

    @app.get("/healthz", dependencies=[checked])
    async def healthz(request: Request) -> dict[str, Any]:
        return described(getattr(request.state, "applimit_decision", None))

    with serve_asgi(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        check_sequence(client)


@pytest.fixture
def django_client(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path, tmp_path: Path
) -> Iterator[httpx.Client]:
    """The example project's settings with django_decision's views, under gunicorn."""
    log = tmp_path / "gunicorn.log"
    env = {"REDIS_URL": redis_server.url, "RATE_LIMIT_POLICY": str(policy_path)}
    with (
        gunicorn(env, log, settings="django_decision") as process,
        httpx.Client(base_url=ready_url(process, log), timeout=10) as client,
    ):
        yield client


def test_django_leaves_the_decision_on_the_request(django_client: httpx.Client) -> None:
    """Django: request.applimit_decision, from the middleware and the view decorator."""
    check_sequence(django_client)
