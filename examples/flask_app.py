"""A Flask app rate-limited by examples/policy.yaml through a shared Redis.

Run it with any WSGI server, for example::

    REDIS_URL=redis://localhost:6379/0 waitress-serve --port 8000 --call flask_app:create_app

(from examples/). ``curl -i -H 'X-API-Key: key-bob' localhost:8000/api/items`` is bob on the
pro tier; without a key the caller is anonymous and counted by client IP. Environment:
``REDIS_URL``, ``TRUSTED_PROXIES`` (comma-separated), ``BEHIND_CLOUDFLARE=1``.

The ``applimit.flask.Limits`` extension checks every request against the policy's limits
whose ``match:`` applies, and ``/reports/<name>`` also draws 5 units of the ``search`` limit
through the per-view decorator (its ``match:`` covers only ``/api/search``, so no request is
counted twice). Refusals are 429s with the rate-limit headers and a problem+json body.

``/metrics`` serves the limiter's decisions in the Prometheus format (``applimit.prometheus``,
the ``prometheus`` extra): refusals by limit, tier and outcome, Redis latency, breaker state.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from flask import Flask, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from applimit import Limiter
from applimit.flask import Caller, Limits, RequestInfo
from applimit.prometheus import PrometheusObserver

POLICY = Path(__file__).with_name("policy.yaml")

# Stands in for the app's real authentication: API keys and the plan each customer pays for.
API_KEYS = {
    "key-alice": Caller("alice", tier="free"),
    "key-bob": Caller("bob", tier="pro"),
    "key-carol": Caller("carol", tier="enterprise"),
}


def identify(request: RequestInfo) -> Caller | None:
    """Who is calling: the owner of the API key, or None (anonymous, counted by IP)."""
    key = request.bearer_token() or request.header("x-api-key")
    return API_KEYS.get(key) if key else None


def _env_list(name: str) -> list[str]:
    return [part.strip() for part in os.environ.get(name, "").split(",") if part.strip()]


def create_app(
    *,
    redis_url: str | None = None,
    policy: str | os.PathLike[str] = POLICY,
    trusted_proxies: list[str] | None = None,
    behind_cloudflare: bool | None = None,
    legacy_headers: bool = True,
) -> Flask:
    """Build the app; settings default to the environment (see the module docstring)."""
    if trusted_proxies is None:
        trusted_proxies = _env_list("TRUSTED_PROXIES")
    if behind_cloudflare is None:
        behind_cloudflare = os.environ.get("BEHIND_CLOUDFLARE") == "1"
    app = Flask(__name__)
    # A registry per app, so that several apps (tests) live in one process.
    registry = CollectorRegistry()
    limiter = Limiter.from_policy(
        policy,
        redis_url=redis_url or os.environ.get("REDIS_URL"),
        observers=[PrometheusObserver(registry)],
    )
    limits = Limits(
        app,
        limiter=limiter,
        identify=identify,
        trusted_proxies=trusted_proxies,
        behind_cloudflare=behind_cloudflare,
        legacy_headers=legacy_headers,
    )

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify(status="ok")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    @app.get("/api/items")
    def items() -> Response:
        return jsonify(items=[1, 2, 3])

    @app.get("/api/search")
    def search() -> Response:
        return jsonify(hits=[])

    @app.post("/login")
    def login() -> Response:
        return jsonify(session="example")

    @app.get("/api/v1/exports/<name>")
    def export(name: str) -> Response:
        def rows() -> Iterator[str]:
            for n in range(3):
                yield f"{name},{n}\n"

        return Response(rows(), mimetype="text/csv")

    @app.get("/reports/<name>")
    @limits.limit("search", cost=5)
    def report(name: str) -> Response:
        return jsonify(report=name)

    return app
