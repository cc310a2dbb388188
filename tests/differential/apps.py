"""The two apps of the suite and the real servers they run in.

Both apps have the routes of :data:`spec.ROUTES`; every handler answers with ``X-Handler:
<name>`` (a header, so HEAD answers say it too) and ``X-Route-Path``: the path its router
matched, percent-encoded. With a limiter, the app is wrapped in applimit's middleware
(trusting the loopback peer for ``CF-Connecting-IP``, as behind Cloudflare); without one it
is the bare router, used as the oracle of what an origin serves.

The FastAPI app runs under uvicorn twice, once with each of its HTTP parsers (h11, and
httptools as uvicorn[standard] installs it; proxy headers off: the middleware reads the client
IP itself), and the Flask app under waitress, each in a thread of the test process on a socket
bound to a free loopback port before the server starts. Readiness is polled against a
deadline; each is stopped and its thread joined on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import servers
from fastapi import FastAPI, Request
from fastapi.responses import Response
from flask import Flask, make_response
from flask import request as flask_request

import policy
from applimit import AsyncLimiter, Limiter
from applimit.asgi import RateLimitMiddleware as AsgiRateLimit
from applimit.wsgi import RateLimitMiddleware as WsgiRateLimit

from . import spec

FASTAPI = "fastapi"
# The same FastAPI app under uvicorn with the httptools parser (what uvicorn[standard]
# runs): the two parsers read a request line each its own way.
FASTAPI_HTTPTOOLS = "fastapi-httptools"
FLASK = "flask"
STACKS = (FASTAPI, FASTAPI_HTTPTOOLS, FLASK)
# uvicorn's HTTP implementation for each FastAPI stack.
_PARSERS = {FASTAPI: "h11", FASTAPI_HTTPTOOLS: "httptools"}
HOST = servers.HOST
# The middleware believes CF-Connecting-IP from this peer only: the test client.
TRUSTED = ["127.0.0.1"]


def _route_path(path: str) -> str:
    return quote(path.encode("utf-8", "surrogateescape"), safe="/:@!$&'()*+,;=-._~")


def fastapi_app(limiter: AsyncLimiter | None) -> FastAPI:
    """The FastAPI app; wrapped in the ASGI middleware when a limiter is given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if limiter is not None:
            await limiter.aclose()

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)

    def endpoint(handler: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            path = _route_path(str(request.scope["path"]))
            return Response(handler, headers={"X-Handler": handler, "X-Route-Path": path})

        serve.__name__ = handler
        return serve

    for route in spec.ROUTES:
        app.add_api_route(route.template, endpoint(route.handler), methods=list(route.methods))
    if limiter is not None:
        app.add_middleware(
            AsgiRateLimit, limiter=limiter, trusted_proxies=TRUSTED, behind_cloudflare=True
        )
    return app


def flask_app(limiter: Limiter | None) -> Flask:
    """The Flask app; its ``wsgi_app`` wrapped in the WSGI middleware when a limiter is given."""
    app = Flask("differential", static_folder=None)

    def view(handler: str) -> Callable[..., Any]:
        def serve(**_params: str) -> Any:
            response = make_response(handler)
            response.headers["X-Handler"] = handler
            response.headers["X-Route-Path"] = _route_path(flask_request.path)
            return response

        serve.__name__ = handler
        return serve

    for route in spec.ROUTES:
        app.add_url_rule(
            route.flask_rule,
            endpoint=route.handler,
            view_func=view(route.handler),
            methods=list(route.methods),
        )
    if limiter is not None:
        app.wsgi_app = WsgiRateLimit(  # type: ignore[method-assign]
            app.wsgi_app, limiter=limiter, trusted_proxies=TRUSTED, behind_cloudflare=True
        )
    return app


@contextlib.contextmanager
def serve_asgi(app: Any, http: str = "h11") -> Iterator[int]:
    """Serve an ASGI app with uvicorn (the ``http`` parser, no proxy headers, no added
    headers); yield its port."""
    with servers.serve_asgi(
        app, http=http, server_header=False, date_header=False, log_level="error"
    ) as url:
        yield urlsplit(url).port or 0


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[int]:
    """Serve a WSGI app with waitress; yield its port."""
    with servers.serve_wsgi(app, threads=2, ident="differential") as url:
        yield urlsplit(url).port or 0


@contextlib.contextmanager
def serve(stack: str, *, policy_text: str | None, redis_url: str | None) -> Iterator[int]:
    """Serve the stack's app, limited by the policy when one is given; yield its port."""
    if stack in _PARSERS:
        limiter = None
        if policy_text is not None:
            limiter = AsyncLimiter.from_policy(policy.loads(policy_text), redis_url=redis_url)
        with serve_asgi(fastapi_app(limiter), _PARSERS[stack]) as port:
            yield port
        return
    sync_limiter = None
    if policy_text is not None:
        sync_limiter = Limiter.from_policy(policy.loads(policy_text), redis_url=redis_url)
    try:
        with serve_wsgi(flask_app(sync_limiter)) as port:
            yield port
    finally:
        if sync_limiter is not None:
            sync_limiter.close()
