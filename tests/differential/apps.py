"""The two apps of the suite and the real servers they run in.

Both apps have the routes of :data:`spec.ROUTES`; every handler answers with ``X-Handler:
<name>`` (a header, so HEAD answers say it too) and ``X-Route-Path``: the path its router
matched, percent-encoded. With a limiter, the app is wrapped in applimit's middleware
(trusting the loopback peer for ``CF-Connecting-IP``, as behind Cloudflare); without one it
is the bare router, used as the oracle of what an origin serves.

The FastAPI app runs under uvicorn twice, once with each of its HTTP parsers (h11, and
httptools as uvicorn[standard] installs it; proxy headers off: the middleware reads the client
IP itself), and the Flask app under waitress, each in a thread of the test process on a socket
bound to a free loopback port before the server starts. Two more stacks run under gunicorn, in
a process of their own (served.py): the Flask app, and a Django project with the same routes
behind ``applimit.django``. gunicorn takes ``SCRIPT_NAME`` from a client's header (from the
loopback peer, its default ``forwarded_allow_ips``) and routes ``PATH_INFO`` without it: the
runners send every other request of these stacks under :data:`MOUNT` with that header
(:data:`MOUNTED`). Readiness is polled against a deadline; each server is stopped (its thread
joined, its process waited for) on exit.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import edgegen_policy as policy
import servers
from fastapi import FastAPI, Request
from fastapi.responses import Response
from flask import Flask, make_response
from flask import request as flask_request

from applimit import AsyncLimiter, Limiter
from applimit.asgi import RateLimitMiddleware as AsgiRateLimit
from applimit.wsgi import RateLimitMiddleware as WsgiRateLimit

from . import spec

FASTAPI = "fastapi"
# The same FastAPI app under uvicorn with the httptools parser (what uvicorn[standard]
# runs): the two parsers read a request line each its own way.
FASTAPI_HTTPTOOLS = "fastapi-httptools"
FLASK = "flask"
# The Flask app and a Django project under gunicorn (a process of its own, served.py).
FLASK_GUNICORN = "flask-gunicorn"
DJANGO = "django-gunicorn"
STACKS = (FASTAPI, FASTAPI_HTTPTOOLS, FLASK, FLASK_GUNICORN, DJANGO)
# The stacks whose server takes SCRIPT_NAME from a header, and the mount the runners send.
MOUNTED = frozenset({FLASK_GUNICORN, DJANGO})
MOUNT = "/mnt"
_GUNICORN_APPS = {FLASK_GUNICORN: "flask", DJANGO: "django"}
TESTS = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")
# uvicorn's HTTP implementation for each FastAPI stack.
_PARSERS = {FASTAPI: "h11", FASTAPI_HTTPTOOLS: "httptools"}
HOST = servers.HOST
# The middleware believes CF-Connecting-IP from this peer only: the test client.
TRUSTED = ["127.0.0.1"]


def route_path(path: str) -> str:
    """The path a router matched, percent-encoded for the ``X-Route-Path`` header."""
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
            path = route_path(str(request.scope["path"]))
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
            response.headers["X-Route-Path"] = route_path(flask_request.path)
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
def serve_gunicorn(app: str, policy_text: str | None, redis_url: str | None) -> Iterator[int]:
    """Serve served.py's ``app`` (flask or django) with gunicorn (one worker, four threads)
    in a process of its own, limited by the policy when one is given; yield its port."""
    with tempfile.TemporaryDirectory(prefix="differential-gunicorn-") as directory:
        folder = Path(directory)
        # The repository first: tests/applimit (no __init__.py) must not stand for applimit.
        path = os.pathsep.join((str(TESTS.parent), str(TESTS)))
        env = {**os.environ, "DIFFERENTIAL_APP": app, "PYTHONPATH": path}
        env.pop("DIFFERENTIAL_POLICY", None)
        if policy_text is not None:
            (folder / "policy.yaml").write_text(policy_text, encoding="utf-8")
            env["DIFFERENTIAL_POLICY"] = str(folder / "policy.yaml")
            env["DIFFERENTIAL_REDIS_URL"] = redis_url or ""
        log = folder / "gunicorn.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "--bind",
                    f"{HOST}:0",
                    "--workers",
                    "1",
                    "--threads",
                    "4",
                    "--forwarded-allow-ips",
                    HOST,
                    "--control-socket",
                    str(folder / "gunicorn.ctl"),
                    "--log-level",
                    "info",
                    "--error-logfile",
                    "-",
                    "differential.served:app",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=folder,
            )
        try:
            yield _gunicorn_port(process, log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _gunicorn_port(process: subprocess.Popen[bytes], log: Path) -> int:
    """The port gunicorn listens on, once its worker has imported the app and answers."""
    deadline = time.monotonic() + servers.STARTUP_TIMEOUT * 3
    port: int | None = None
    while True:
        text = log.read_text(encoding="utf-8", errors="replace")
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode}:\n{text}")
        if port is None and (found := _LISTENING.search(text)):
            port = int(found.group(1))
        if port is not None and _answers(port):
            return port
        if time.monotonic() > deadline:
            raise RuntimeError(f"gunicorn was not ready in time:\n{text}")
        # Polling interval: readiness is re-checked every round.
        time.sleep(0.05)


def _answers(port: int) -> bool:
    """Whether the server answers a request (any status) on the port."""
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(b"GET /static/ready HTTP/1.1\r\nHost: ready\r\nConnection: close\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


@contextlib.contextmanager
def serve(stack: str, *, policy_text: str | None, redis_url: str | None) -> Iterator[int]:
    """Serve the stack's app, limited by the policy when one is given; yield its port."""
    if stack in _GUNICORN_APPS:
        with serve_gunicorn(_GUNICORN_APPS[stack], policy_text, redis_url) as port:
            yield port
        return
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
