"""The two apps of the suite and the real servers they run in.

Both apps have the routes of :data:`spec.ROUTES`; every handler answers with ``X-Handler:
<name>`` (a header, so HEAD answers say it too) and ``X-Route-Path``: the path its router
matched, percent-encoded. With a limiter, the app is wrapped in applimit's middleware
(trusting the loopback peer for ``CF-Connecting-IP``, as behind Cloudflare); without one it
is the bare router, used as the oracle of what an origin serves.

The FastAPI app runs under uvicorn (h11, proxy headers off: the middleware reads the client IP
itself) and the Flask app under waitress, each in a thread of the test process on a socket
bound to a free loopback port before the server starts. Readiness is polled against a
deadline; both are stopped and their threads joined on exit.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import quote

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from flask import Flask, make_response
from flask import request as flask_request
from waitress.server import create_server

import policy
from applimit import AsyncLimiter, Limiter
from applimit.asgi import RateLimitMiddleware as AsgiRateLimit
from applimit.wsgi import RateLimitMiddleware as WsgiRateLimit

from . import spec

FASTAPI = "fastapi"
FLASK = "flask"
STACKS = (FASTAPI, FLASK)
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 10.0
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


def _wait(what: str, ready: Callable[[], bool], thread: threading.Thread) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while not ready():
        if not thread.is_alive():
            raise RuntimeError(f"{what} stopped before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {STARTUP_TIMEOUT}s")
        # Polling interval: readiness is re-checked every round.
        time.sleep(0.01)


@contextlib.contextmanager
def serve_asgi(app: Any) -> Iterator[int]:
    """Serve an ASGI app with uvicorn (h11, no proxy headers); yield its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    config = uvicorn.Config(
        app,
        http="h11",
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        date_header=False,
        access_log=False,
        log_level="error",
        ws="none",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait("uvicorn", lambda: server.started, thread)
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT)
        sock.close()


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[int]:
    """Serve a WSGI app with waitress; yield its port."""
    sockets: dict[int, Any] = {}
    server = create_server(app, map=sockets, host=HOST, port=0, threads=2, ident="differential")
    port = int(server.effective_port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def close_all() -> None:
        # On the server's own loop thread: an empty socket map ends its loop.
        for channel in list(sockets.values()):
            channel.close()

    try:
        yield port
    finally:
        server.trigger.pull_trigger(close_all)
        thread.join(STARTUP_TIMEOUT)
        server.task_dispatcher.shutdown()


@contextlib.contextmanager
def serve(stack: str, *, policy_text: str | None, redis_url: str | None) -> Iterator[int]:
    """Serve the stack's app, limited by the policy when one is given; yield its port."""
    if stack == FASTAPI:
        limiter = None
        if policy_text is not None:
            limiter = AsyncLimiter.from_policy(policy.loads(policy_text), redis_url=redis_url)
        with serve_asgi(fastapi_app(limiter)) as port:
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
