"""Concurrency limits under real servers: a slot is held until the response is sent.

Each stack is a real server on a real redis-server: the ASGI middleware (with Starlette's
streaming response) under uvicorn, the WSGI middleware and the Flask extension under
waitress, the Django middleware under gunicorn. The export handler counts itself running
in Redis, streams a first chunk, then waits for the test to open its gate (a Redis list it
blocks on, so the gate works across gunicorn's processes) before its last chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
from flask import Flask, Response
from flask import request as flask_request
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from test_django import gunicorn, ready_url
from webcheck import problem

from applimit import AsyncLimiter, Limiter
from applimit import asgi as applimit_asgi
from applimit import wsgi as applimit_wsgi
from applimit.flask import Limits

POLICY = """
version: 1
tiers: [free]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: exports
    match: { path_prefix: /export }
    app: { per: ip, concurrency: 2, lease: 30s }
"""
ASGI, WSGI, FLASK, DJANGO = "asgi", "wsgi", "flask", "django"
DEADLINE = 15.0


def wait_until(what: str, done: Callable[[], bool]) -> None:
    """Poll ``done`` until it holds, against a deadline."""
    deadline = time.monotonic() + DEADLINE
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        # Polling interval: the condition is re-checked every round.
        time.sleep(0.02)


def starlette_app(url: str, limiter: AsyncLimiter) -> Any:
    """/export streams "start", waits for its gate, then "end"; /export/forever streams
    until the client goes away; /export/fail raises."""
    client = redis.asyncio.Redis.from_url(url)

    async def export(request: Request) -> StreamingResponse:
        gate = request.query_params.get("id", "")
        await client.incr("running")

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"start\n"
                if request.url.path == "/export/forever":
                    while True:
                        await asyncio.sleep(0.01)
                        yield b".\n"
                await client.blpop([f"gate:{gate}"], timeout=DEADLINE)
                yield b"end\n"
            finally:
                await client.decr("running")

        return StreamingResponse(body())

    async def fail(request: Request) -> StreamingResponse:
        raise RuntimeError("the export failed")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await limiter.aclose()
        await client.aclose()

    return Starlette(
        routes=[
            Route("/export/fail", fail),
            Route("/export", export),
            Route("/export/forever", export),
        ],
        lifespan=lifespan,
    )


def wsgi_export(url: str) -> Any:
    """The same export as a bare WSGI app (a generator body)."""
    client = redis.Redis.from_url(url)

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        path = environ["PATH_INFO"]
        if path == "/export/fail":
            raise RuntimeError("the export failed")
        gate = environ.get("QUERY_STRING", "").removeprefix("id=")
        client.incr("running")
        start_response("200 OK", [("Content-Type", "text/plain")])

        def body() -> Iterator[bytes]:
            try:
                yield b"start\n"
                if path == "/export/forever":
                    while True:
                        time.sleep(0.01)
                        yield b".\n"
                client.blpop([f"gate:{gate}"], timeout=DEADLINE)
                yield b"end\n"
            finally:
                client.decr("running")

        return body()

    return app


def flask_export(url: str, limiter: Limiter) -> Flask:
    """The same export in Flask, a streamed response, with the Limits extension."""
    client = redis.Redis.from_url(url)
    app = Flask(__name__)

    @app.get("/export")
    def export() -> Response:
        gate = flask_request.args.get("id", "")
        client.incr("running")

        def body() -> Iterator[bytes]:
            try:
                yield b"start\n"
                client.blpop([f"gate:{gate}"], timeout=DEADLINE)
                yield b"end\n"
            finally:
                client.decr("running")

        return Response(body(), mimetype="text/plain")

    @app.get("/export/fail")
    def fail() -> str:
        raise RuntimeError("the export failed")

    Limits(app, limiter=limiter)
    return app


@pytest.fixture(params=[ASGI, WSGI, FLASK, DJANGO])
def stack(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def site(
    stack: str, redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[httpx.Client]:
    """The stack, served, with the policy above, on a flushed Redis."""
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY, encoding="utf-8")
    url = redis_server.url
    with contextlib.ExitStack() as stack_of_things:
        if stack == DJANGO:
            env = {"REDIS_URL": url, "RATE_LIMIT_POLICY": str(policy_path)}
            log = tmp_path / "gunicorn.log"
            process = stack_of_things.enter_context(
                gunicorn(env, log, settings="django_leases", threads=4)
            )
            base = ready_url(process, log)
        elif stack == ASGI:
            limiter = AsyncLimiter.from_policy(policy_path, redis_url=url)
            app = applimit_asgi.RateLimitMiddleware(starlette_app(url, limiter), limiter=limiter)
            base = stack_of_things.enter_context(serve_asgi(app))
        else:
            sync = Limiter.from_policy(policy_path, redis_url=url)
            stack_of_things.callback(sync.close)
            if stack == WSGI:
                app = applimit_wsgi.RateLimitMiddleware(wsgi_export(url), limiter=sync)
            else:
                app = flask_export(url, sync)
            base = stack_of_things.enter_context(serve_wsgi(app, threads=8))
        yield stack_of_things.enter_context(httpx.Client(base_url=base, timeout=DEADLINE))


def running(redis_client: redis.Redis) -> int:
    return int(redis_client.get("running") or 0)


class Stream:
    """A request whose response is read in a thread of its own, chunk by chunk."""

    def __init__(self, client: httpx.Client, path: str) -> None:
        self.chunks: list[bytes] = []
        self.status: int | None = None
        self.thread = threading.Thread(target=self._read, args=(client, path), daemon=True)
        self.thread.start()

    def _read(self, client: httpx.Client, path: str) -> None:
        with client.stream("GET", path) as response:
            self.status = response.status_code
            for chunk in response.iter_bytes():
                self.chunks.append(chunk)

    def finish(self) -> bytes:
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()
        return b"".join(self.chunks)


def test_a_slot_is_held_until_the_response_is_sent(
    site: httpx.Client, redis_client: redis.Redis
) -> None:
    """Two exports stream at once; a third is refused with a problem body that says it
    is a concurrency limit; once one export's last chunk is sent, a new one is admitted."""
    first, second = Stream(site, "/export?id=1"), Stream(site, "/export?id=2")
    wait_until("two exports are running", lambda: running(redis_client) == 2)
    refused = site.get("/export?id=3")
    body = problem(refused, 429)
    assert body["limit"] == "exports" and body["concurrency"] == 2
    assert "Concurrency limit 'exports' allows 2 requests at once" in str(body["detail"])
    assert refused.headers["Retry-After"] == "1"
    assert "RateLimit-Policy" not in refused.headers
    redis_client.rpush("gate:1", "open")
    assert first.finish() == b"start\nend\n"
    # The slot comes back once the server has closed the response.
    redis_client.rpush("gate:4", "open")
    wait_until("a new export is admitted", lambda: site.get("/export?id=4").status_code == 200)
    redis_client.rpush("gate:2", "open")
    assert second.finish() == b"start\nend\n"
    wait_until("nothing runs", lambda: running(redis_client) == 0)


def test_a_failing_handler_gives_its_slot_back(site: httpx.Client) -> None:
    """Five exports that raise, one after another, under a limit of two at once: each
    gives its slot back, so none is refused."""
    for _ in range(5):
        # A connection of its own each: a server may close one its app failed on.
        response = site.get("/export/fail", headers={"Connection": "close"})
        assert response.status_code == 500


def test_a_client_that_goes_away_gives_its_slot_back(
    site: httpx.Client, redis_client: redis.Redis, stack: str
) -> None:
    """A stream that never ends, whose client disconnects: the server stops it and the
    slot comes back (after both, a further two run at once)."""
    if stack in (FLASK, DJANGO):
        pytest.skip("the endless stream is served by the bare ASGI and WSGI apps")
    with site.stream("GET", "/export/forever") as response:
        assert response.status_code == 200
        next(response.iter_bytes())
    with site.stream("GET", "/export/forever") as response:
        next(response.iter_bytes())
    wait_until("both streams stopped", lambda: running(redis_client) == 0)
    first, second = Stream(site, "/export?id=5"), Stream(site, "/export?id=6")
    wait_until("two exports are running", lambda: running(redis_client) == 2)
    assert first.status == second.status == 200
    redis_client.rpush("gate:5", "open")
    redis_client.rpush("gate:6", "open")
    assert first.finish() == second.finish() == b"start\nend\n"
