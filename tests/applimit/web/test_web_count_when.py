"""count_when under real servers: "5 failed logins a minute" counts 401 answers only.

Each stack is a real server on a real redis-server: the ASGI middleware under uvicorn, the
WSGI middleware and the Flask extension under waitress (4 threads), the Django middleware
under gunicorn (2 sync workers). The login handler answers 200 for the right password and
401 otherwise, and counts how often it runs.

The bound (docs/applimit.md, "Counting only some responses"): the middleware checks before
the handler and records the status before the response is sent, so the handler runs at
most ``limit + (requests in flight - 1)`` times for a caller's failures: every run beyond
the limit was admitted while another was still running. In-process stacks measure the
requests in flight around the middleware; under gunicorn, two sync workers run at most
two at once. Every stack also counts the limiter's lookups of the limits a request
matches (lookups.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from flask import Flask, abort
from flask import request as flask_request
from harness import RedisServer
from lookups import counting_lookups
from servers import serve_asgi, serve_wsgi
from test_django import gunicorn, ready_url
from webcheck import problem

from applimit import AsyncLimiter, Limiter
from applimit import asgi as applimit_asgi
from applimit import wsgi as applimit_wsgi
from applimit._plan import Core
from applimit.flask import Limits

LIMIT = 5
POLICY = f"""
version: 1
tiers: [free]
app: {{ timeout: 2s }}  # generous: these tests are about semantics, not latency
limits:
  - name: login
    match: {{ paths: [/login], methods: [POST] }}
    count_when: {{ status: 401 }}
    app: {{ per: ip, algorithm: sliding_log, tiers: {{ free: {LIMIT}/1m }} }}
  - name: signin
    count_when: {{ status: [401, 403] }}
    app: {{ per: ip, algorithm: gcra, middleware: false, tiers: {{ free: 3/1m }} }}
  - name: boom
    match: {{ paths: [/boom] }}
    count_when: {{ status: 5xx }}
    app: {{ per: ip, algorithm: sliding_log, tiers: {{ free: 2/1m }} }}
"""
WRONG, RIGHT = b"password=wrong", b"password=right"
ASGI, WSGI, FLASK, DJANGO = "asgi", "wsgi", "flask", "django"


class Counters:
    """Handler runs per path and the peak of requests in flight around the middleware."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: dict[str, int] = {}
        self.in_flight = 0
        self.peak = 0

    def ran(self, path: str) -> None:
        with self.lock:
            self.runs[path] = self.runs.get(path, 0) + 1

    def enter(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def asgi_app(counters: Counters, limiter: AsyncLimiter) -> Any:
    """A bare ASGI login form: 401 unless the body is the right password; /boom raises.
    The limiter's connections live in the server's loop: closed at its shutdown."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await limiter.aclose()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        counters.ran(scope["path"])
        if scope["path"] == "/boom":
            raise RuntimeError("the handler failed")
        status = 200 if body == RIGHT else 401
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def wsgi_app(counters: Counters) -> Any:
    """The same form as a bare WSGI app."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        counters.ran(environ["PATH_INFO"])
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("the handler failed")
        start_response("200 OK" if body == RIGHT else "401 Unauthorized", [])
        return [b"{}"]

    return app


def flask_app(counters: Counters, limiter: Limiter) -> Flask:
    """The same form in Flask, with the Limits extension."""
    app = Flask(__name__)

    @app.post("/login")
    def login() -> tuple[str, int]:
        counters.ran("/login")
        return ("{}", 200 if flask_request.get_data() == RIGHT else 401)

    limits = Limits(app, limiter=limiter)

    @app.post("/signin")
    @limits.limit("signin")
    def signin() -> tuple[str, int]:
        counters.ran("/signin")
        if flask_request.get_data() == b"password=forbidden":
            abort(403)
        return ("{}", 200 if flask_request.get_data() == RIGHT else 401)

    @app.route("/boom", methods=["GET", "POST"])
    def boom() -> str:
        counters.ran("/boom")
        raise RuntimeError("the handler failed")

    return app


def counted_asgi(app: Any, counters: Counters) -> Any:
    """``app`` with the requests in flight counted around it."""

    async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        counters.enter()
        try:
            await app(scope, receive, send)
        finally:
            counters.leave()

    return outer


def counted_wsgi(app: Any, counters: Counters) -> Any:
    """``app`` with the requests in flight counted around it (the body is a list)."""

    def outer(environ: dict[str, Any], start_response: Any) -> Any:
        counters.enter()
        try:
            return list(app(environ, start_response))
        finally:
            counters.leave()

    return outer


class Site:
    """A served stack: its client, its handler runs, its bound on requests in flight, and
    its lookups of matching limits since the last call (the caller of each, in order)."""

    def __init__(
        self,
        client: httpx.Client,
        runs: Callable[[str], int],
        most_in_flight: Callable[[], int],
        lookups: Callable[[], list[str]],
    ) -> None:
        self.client = client
        self.runs = runs
        self.most_in_flight = most_in_flight
        self.lookups = lookups


@pytest.fixture(params=[ASGI, WSGI, FLASK, DJANGO])
def site(
    request: pytest.FixtureRequest,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Site]:
    """One stack, served, with the policy above, on a flushed Redis."""
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(POLICY, encoding="utf-8")
    counters = Counters()
    with contextlib.ExitStack() as stack:
        if request.param == DJANGO:
            env = {"REDIS_URL": redis_server.url, "RATE_LIMIT_POLICY": str(policy_path)}
            process = stack.enter_context(
                gunicorn(env, tmp_path / "gunicorn.log", settings="django_count")
            )
            url = ready_url(process, tmp_path / "gunicorn.log")

            def runs(path: str) -> int:
                return int(redis_client.get(f"test:runs:{path.strip('/')}") or 0)

            # Two sync workers, one request each.
            most: Callable[[], int] = lambda: 2  # noqa: E731

            def lookups() -> list[str]:
                found, _ = (
                    redis_client.pipeline()
                    .lrange("test:lookups", 0, -1)
                    .delete("test:lookups")
                    .execute()
                )
                return [caller.decode() for caller in found]

        else:
            looked_up: list[str] = []
            monkeypatch.setattr(Core, "_match", counting_lookups(looked_up.append))

            def lookups() -> list[str]:
                found = looked_up[:]
                del looked_up[: len(found)]
                return found

            if request.param == ASGI:
                limiter: Any = AsyncLimiter.from_policy(policy_path, redis_url=redis_server.url)
                app = applimit_asgi.RateLimitMiddleware(
                    asgi_app(counters, limiter), limiter=limiter
                )
                url = stack.enter_context(serve_asgi(counted_asgi(app, counters)))
            else:
                limiter = Limiter.from_policy(policy_path, redis_url=redis_server.url)
                stack.callback(limiter.close)
                if request.param == WSGI:
                    app = applimit_wsgi.RateLimitMiddleware(wsgi_app(counters), limiter=limiter)
                else:
                    app = flask_app(counters, limiter)
                url = stack.enter_context(serve_wsgi(counted_wsgi(app, counters)))

            def runs(path: str) -> int:
                return counters.runs.get(path, 0)

            most = lambda: counters.peak  # noqa: E731
        client = stack.enter_context(httpx.Client(base_url=url, timeout=10))
        yield Site(client, runs, most, lookups)


def post(site: Site, body: bytes, path: str = "/login") -> httpx.Response:
    return site.client.post(path, content=body)


@pytest.mark.parametrize("clients", [20, 4])
def test_parallel_wrong_passwords_run_the_handler_within_the_bound(
    site: Site, clients: int
) -> None:
    """20 wrong passwords from ``clients`` parallel clients: the handler runs at least the
    limit's worth of times and at most the limit plus the requests in flight but one;
    every other attempt is refused with a 429 before the handler. With 20 at once an async
    server may admit them all (20 in flight); with 4 clients at most 8 run. Afterwards the
    right password is refused too (the failures are spent), with a problem body that
    names the limit."""
    start = threading.Barrier(clients)

    def attempts(_: int) -> list[int]:
        start.wait()
        return [post(site, WRONG).status_code for _ in range(20 // clients)]

    with ThreadPoolExecutor(clients) as pool:
        statuses = [status for some in pool.map(attempts, range(clients)) for status in some]
    runs = site.runs("/login")
    assert set(statuses) <= {401, 429}
    assert statuses.count(401) == runs
    bound = LIMIT + min(clients, site.most_in_flight()) - 1
    assert LIMIT <= runs <= bound, (runs, site.most_in_flight())
    refused = post(site, RIGHT)
    assert "login" in str(problem(refused, 429))
    assert site.runs("/login") == runs


def test_right_passwords_pass_until_the_failures_are_spent(site: Site) -> None:
    """Four failures, then right passwords are never refused (they do not count); the
    fifth failure spends the limit, and only then is the right password refused."""
    for _ in range(LIMIT - 1):
        assert post(site, WRONG).status_code == 401
    for _ in range(3 * LIMIT):
        assert post(site, RIGHT).status_code == 200
    assert post(site, WRONG).status_code == 401
    assert post(site, RIGHT).status_code == 429
    assert site.runs("/login") == 4 * LIMIT


def test_a_handler_that_raises_counts_as_500(site: Site) -> None:
    """A limit counting 5xx counts a raising handler: two failures, then refused."""
    for _ in range(2):
        assert post(site, b"", "/boom").status_code == 500
    refused = post(site, b"", "/boom")
    assert "boom" in str(problem(refused, 429))
    assert site.runs("/boom") == 2


def test_a_decorated_view_records_its_status(site: Site, request: pytest.FixtureRequest) -> None:
    """Flask's @limits.limit and Django's @rate_limit on a count_when limit: the view is
    checked before it runs and its status recorded after (403 raised by the view counts
    as 403); right passwords pass until the failures are spent."""
    if request.node.callspec.params["site"] not in (FLASK, DJANGO):
        pytest.skip("bare ASGI and WSGI apps have no view decorator")
    assert post(site, WRONG, "/signin").status_code == 401
    assert post(site, b"password=forbidden", "/signin").status_code == 403
    for _ in range(5):
        assert post(site, RIGHT, "/signin").status_code == 200
    assert post(site, WRONG, "/signin").status_code == 401
    assert "signin" in str(problem(post(site, RIGHT, "/signin"), 429))
    assert site.runs("/signin") == 8


def test_a_request_is_matched_once(site: Site) -> None:
    """Each stack looks up the limits a request matches once, before identify, and keeps
    from it whether a count_when limit is among them: no second lookup to decide whether
    to record the status. check_request's and record_request's plans each read the
    core's memo of that lookup themselves (their arguments are the request's, not a
    match). A request no limit matches costs the one lookup."""
    site.lookups()  # the server's start (the readiness probe)
    planned = ["request_match", "for_request", "for_record_request"]
    assert post(site, WRONG).status_code == 401
    assert site.lookups() == planned
    assert post(site, RIGHT).status_code == 200
    assert site.lookups() == planned
    assert site.client.get("/healthz").status_code != 429
    assert site.lookups() == ["request_match"]
