"""A FastAPI app rate-limited by examples/policy.yaml through a shared Redis.

Run it (several instances may share one Redis; the limits hold across all of them)::

    REDIS_URL=redis://localhost:6379/0 uvicorn fastapi_app:app --app-dir examples --no-proxy-headers

Then ``curl -i -H 'Authorization: Bearer key-alice' localhost:8000/api/items``: alice is on
the free tier, so the 101st request within a minute gets a 429 with ``Retry-After`` and a
problem+json body. Requests without a key are anonymous and counted by client IP.

Environment: ``REDIS_URL`` (else the policy's ``app.redis_url``), ``TRUSTED_PROXIES``
(comma-separated addresses or CIDRs of your load balancers), ``BEHIND_CLOUDFLARE=1``,
``RATE_LIMIT_POLICY`` (a policy file other than examples/policy.yaml).
Pass ``--no-proxy-headers`` to uvicorn: the middleware reads X-Forwarded-For itself, and only
from the proxies you trust.

``/metrics`` serves the limiter's decisions in the Prometheus format (``applimit.prometheus``,
the ``prometheus`` extra): refusals by limit, tier and outcome, Redis latency, breaker state.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from applimit import AsyncLimiter
from applimit.asgi import Caller, RateLimitMiddleware, RequestInfo
from applimit.fastapi import RateLimit, add_problem_handler
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
    policy: str | os.PathLike[str] | None = None,
    trusted_proxies: list[str] | None = None,
    behind_cloudflare: bool | None = None,
    legacy_headers: bool = True,
    rate_limited: bool = True,
) -> FastAPI:
    """Build the app; settings default to the environment (see the module docstring).

    ``rate_limited=False`` leaves the middleware out (the fleet demo wraps that bare app in
    a per-instance counter, to show what goes wrong without a shared store).
    """
    if policy is None:
        policy = os.environ.get("RATE_LIMIT_POLICY") or POLICY
    if trusted_proxies is None:
        trusted_proxies = _env_list("TRUSTED_PROXIES")
    if behind_cloudflare is None:
        behind_cloudflare = os.environ.get("BEHIND_CLOUDFLARE") == "1"
    # A registry per app, so that several apps (tests, the fleet demo) live in one process.
    registry = CollectorRegistry()
    limiter = AsyncLimiter.from_policy(
        policy,
        redis_url=redis_url or os.environ.get("REDIS_URL"),
        observers=[PrometheusObserver(registry)],
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await limiter.aclose()

    app = FastAPI(title="applimit example", lifespan=lifespan)
    # Per-route limit: an expensive report costs 5 units of the "search" budget.
    report_limit = RateLimit(limiter, "search", identify=identify, cost=5)
    add_problem_handler(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/items")
    async def items() -> dict[str, object]:
        return {"items": [1, 2, 3]}

    @app.get("/api/search")
    async def search(q: str = "") -> dict[str, object]:
        return {"q": q, "hits": []}

    @app.post("/login")
    async def login() -> dict[str, str]:
        return {"session": "example"}

    @app.get("/api/v1/exports/{name}")
    async def export(name: str) -> StreamingResponse:
        async def rows() -> AsyncIterator[bytes]:
            for n in range(3):
                yield f"{name},{n}\n".encode()

        return StreamingResponse(rows(), media_type="text/csv")

    @app.get("/reports/{name}", dependencies=[Depends(report_limit)])
    async def report(name: str) -> dict[str, str]:
        return {"report": name}

    if rate_limited:
        app.add_middleware(
            RateLimitMiddleware,
            limiter=limiter,
            identify=identify,
            trusted_proxies=trusted_proxies,
            behind_cloudflare=behind_cloudflare,
            legacy_headers=legacy_headers,
        )
    return app


app = create_app()
