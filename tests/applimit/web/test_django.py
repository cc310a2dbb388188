"""applimit.django: the example project (examples/django_project) under gunicorn with two
worker processes, on a real redis-server, compared with what the WSGI middleware answers for
the same policy.

Every rate-limit header of every response is parsed and cross-checked (webcheck.py) before
a test looks at its values.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest
import redis
from gunicorn.config import KNOWN_SETTINGS
from harness import RedisServer
from servers import EXAMPLES, serve_wsgi
from webcheck import ALICE, BOB, problem, rate_limit_headers

from applimit import Limiter
from applimit.web._headers import QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY
from applimit.wsgi import Caller, RateLimitMiddleware, RequestInfo

PROJECT = EXAMPLES / "django_project"
HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT = 30.0
_LISTENING = re.compile(r"Listening at: (http://127\.0\.0\.1:\d+)")

POLICY = """
version: 1
tiers: [free, pro, enterprise]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 3/1m, pro: 5/1m, enterprise: 100/1m } }
  - name: search
    match: { paths: [/api/search] }
    app: { algorithm: sliding_log, tiers: { free: 10/1h, pro: 10/1h, enterprise: 10/1h } }
  - name: login
    match: { paths: [/login], methods: [POST] }
    app:
      per: ip
      algorithm: sliding_log
      on_redis_error: deny
      tiers: { free: 2/1m, pro: 2/1m, enterprise: 2/1m }
"""


@contextlib.contextmanager
def gunicorn(
    env: Mapping[str, str], log: Path, settings: str | None = None, threads: int = 1
) -> Iterator[subprocess.Popen[bytes]]:
    """Run the example project under gunicorn (two workers) with ``env`` added; stop it
    (and wait for it) at exit. The log holds gunicorn's and Django's output. ``settings``
    names a settings module of this directory to use instead of the example's; ``threads``
    above 1 gives each worker that many threads (the gthread worker)."""
    if settings is not None:
        env = {**env, "DJANGO_SETTINGS_MODULE": settings}
    # Recent gunicorn opens a control socket, by default one path in the home directory for
    # every server: give each server its own.
    control = (
        ["--control-socket", str(log.with_suffix(".ctl"))]
        if any(s.name == "control_socket" for s in KNOWN_SETTINGS)
        else []
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--chdir",
                str(PROJECT),
                "--pythonpath",
                str(HERE),
                "--bind",
                "127.0.0.1:0",
                "--workers",
                "2",
                "--threads",
                str(threads),
                "--log-level",
                "info",
                *control,
                "demo_site.wsgi",
            ],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def ready_url(process: subprocess.Popen[bytes], log: Path) -> str:
    """The server's base URL once a worker answers /healthz."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    url: str | None = None
    while True:
        text = log.read_text(encoding="utf-8", errors="replace")
        if process.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {process.returncode}:\n{text}")
        if url is None and (found := _LISTENING.search(text)):
            url = found.group(1)
        if url is not None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    return url
        if time.monotonic() > deadline:
            raise RuntimeError(f"gunicorn was not ready within {STARTUP_TIMEOUT}s:\n{text}")
        # Polling interval: readiness is re-checked every round.
        time.sleep(0.05)


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The policy above, as a file."""
    path = tmp_path_factory.mktemp("django-policy") / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture
def django_url(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path, tmp_path: Path
) -> Iterator[str]:
    """The example project under gunicorn, on a flushed Redis. One server per test: each
    worker keeps a denial in memory until it expires (applimit's denial cache), so a server
    shared by tests would carry one test's refusals into the next."""
    log = tmp_path / "gunicorn.log"
    env = {"REDIS_URL": redis_server.url, "RATE_LIMIT_POLICY": str(policy_path)}
    with gunicorn(env, log) as process:
        yield ready_url(process, log)


@pytest.fixture
def client(django_url: str) -> Iterator[httpx.Client]:
    """A client of the example project."""
    with httpx.Client(base_url=django_url, timeout=10) as made:
        yield made


def get(client: httpx.Client, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET and check the rate-limit headers of the answer."""
    response = client.get(path, headers=headers)
    rate_limit_headers(response)
    return response


KEYS = {"key-alice": Caller("alice", tier="free"), "key-bob": Caller("bob", tier="pro")}


def wsgi_identify(request: RequestInfo) -> Caller | None:
    """The example project's identify, written for the WSGI middleware."""
    key = request.bearer_token() or request.header("x-api-key")
    return KEYS.get(key) if key else None


def plain_wsgi_app(environ: object, start_response: object) -> list[bytes]:
    """A WSGI app that answers 200 to everything."""
    assert callable(start_response)
    start_response("200 OK", [("Content-Type", "application/json")])
    return [b"{}"]


def test_a_refusal_is_the_wsgi_middlewares_refusal(
    client: httpx.Client, redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path
) -> None:
    """A free user's fourth API request is refused by the Django middleware and by the WSGI
    middleware with the same status, header names, header values (but the waits) and the
    same problem body (but the waits)."""
    refusals: list[httpx.Response] = []
    for _ in range(3):
        assert get(client, "/api/items", ALICE).status_code == 200
    refusals.append(get(client, "/api/items", ALICE))
    redis_client.flushall()
    limiter = Limiter.from_policy(policy_path, redis_url=redis_server.url)
    plain = RateLimitMiddleware(
        plain_wsgi_app, limiter=limiter, identify=wsgi_identify, legacy_headers=True
    )
    try:
        with serve_wsgi(plain) as url, httpx.Client(base_url=url, timeout=10) as other:
            for _ in range(3):
                assert get(other, "/api/items", ALICE).status_code == 200
            refusals.append(get(other, "/api/items", ALICE))
    finally:
        limiter.close()

    for response in refusals:
        body = problem(response, 429)
        assert body["type"] == QUOTA_EXCEEDED
        assert body["limit"] == "api"
        assert body["violated-policies"] == ["api"]
        parsed = rate_limit_headers(response)
        assert parsed.policies["api"].q == 3
        assert parsed.limits["api"].r == 0
        assert parsed.retry_after is not None and parsed.retry_after >= 1
        assert body["retry-after"] == parsed.retry_after
        assert parsed.legacy is not None

    def shape(response: httpx.Response) -> tuple[object, ...]:
        body = json.loads(response.content)
        names = {n for n in response.headers if n.startswith(("ratelimit", "retry", "x-rate"))}
        return (
            response.status_code,
            response.headers["content-type"],
            sorted(names),
            response.headers["ratelimit-policy"],
            sorted(body),
            {k: v for k, v in body.items() if k not in ("detail", "retry-after")},
        )

    django, middleware = refusals
    assert shape(django) == shape(middleware)


def test_allowed_requests_carry_the_headers(client: httpx.Client) -> None:
    """Allowed: RateLimit-Policy, RateLimit and the legacy trio for every limit that applied,
    also on a streaming response; a path no limit matches carries none."""
    searched = get(client, "/api/search", BOB)
    assert searched.json() == {"hits": []}
    parsed = rate_limit_headers(searched)
    assert set(parsed.policies) == {"api", "search"}
    assert parsed.limits["api"].r == 4
    assert parsed.limits["search"].r == 9
    assert parsed.retry_after is None
    assert parsed.legacy is not None
    export = get(client, "/api/v1/exports/report", BOB)
    assert export.text == "report,0\nreport,1\nreport,2\n"
    assert rate_limit_headers(export).limits["api"].r == 3
    health = client.get("/healthz")
    assert health.json() == {"status": "ok"}
    assert "ratelimit-policy" not in health.headers


def test_the_per_view_decorator_limits_only_its_view(client: httpx.Client) -> None:
    """@rate_limit("search", cost=5) on /reports/<name>: two reports use alice's 10 units,
    the third is refused with search's headers; the API views are counted by their own
    limit only, and /api/search then finds search exhausted."""
    first = get(client, "/reports/q1", ALICE)
    assert first.json() == {"report": "q1"}
    assert set(rate_limit_headers(first).policies) == {"search"}
    assert rate_limit_headers(first).limits["search"].r == 5
    assert get(client, "/reports/q2", ALICE).status_code == 200
    refused = get(client, "/reports/q3", ALICE)
    body = problem(refused, 429)
    assert body["limit"] == "search"
    assert set(rate_limit_headers(refused).policies) == {"search"}
    items = get(client, "/api/items", ALICE)
    assert items.status_code == 200, items.text
    assert set(rate_limit_headers(items).policies) == {"api"}
    assert rate_limit_headers(items).limits["api"].r == 2
    assert problem(get(client, "/api/search", ALICE), 429)["limit"] == "search"


def test_the_decorator_on_an_async_view(client: httpx.Client) -> None:
    """An async view with @rate_limit("search") (1 unit): counted in the same bucket as the
    sync report view (5 units), refused once that is spent."""
    status = get(client, "/reports/q1/status", BOB)
    assert status.json() == {"report": "q1", "status": "ready"}
    assert rate_limit_headers(status).limits["search"].r == 9
    assert rate_limit_headers(get(client, "/reports/q1", BOB)).limits["search"].r == 4
    problem(get(client, "/reports/q2", BOB), 429)
    for left in (3, 2, 1, 0):
        status = get(client, "/reports/q1/status", BOB)
        assert rate_limit_headers(status).limits["search"].r == left
    assert problem(get(client, "/reports/q1/status", BOB), 429)["limit"] == "search"


def test_identity_and_tier_come_from_identify(client: httpx.Client) -> None:
    """alice (free) and bob (pro) get their tier's quota in separate buckets; anonymous
    callers are counted by IP in the lowest tier."""
    for _ in range(3):
        get(client, "/api/items", ALICE)
    problem(get(client, "/api/items", ALICE), 429)
    bob = get(client, "/api/items", BOB)
    assert bob.status_code == 200
    assert rate_limit_headers(bob).policies["api"].q == 5
    assert rate_limit_headers(bob).limits["api"].r == 4
    anonymous = get(client, "/api/items")
    assert anonymous.status_code == 200
    assert rate_limit_headers(anonymous).policies["api"].q == 3
    assert rate_limit_headers(anonymous).limits["api"].r == 2


def test_rate_limited_in_a_view_is_a_429_not_a_500(client: httpx.Client) -> None:
    """/summary calls a rate_limited function (5 units of search): the third call raises
    RateLimited, which the middleware answers with the problem body and headers."""
    for _ in range(2):
        assert get(client, "/summary", BOB).json() == {"summary": "ok"}
    refused = get(client, "/summary", BOB)
    body = problem(refused, 429)
    assert body["limit"] == "search"
    assert rate_limit_headers(refused).retry_after is not None


def test_per_ip_login_and_fail_closed(
    redis_server: RedisServer, fresh_redis_server: RedisServer, policy_path: Path, tmp_path: Path
) -> None:
    """login counts per IP (two attempts, whoever calls), and fails closed: with Redis gone
    it answers the middleware's 503 problem, while a fail-open API request goes through."""
    log = tmp_path / "gunicorn.log"
    env = {"REDIS_URL": fresh_redis_server.url, "RATE_LIMIT_POLICY": str(policy_path)}
    with gunicorn(env, log) as process, httpx.Client(base_url=ready_url(process, log)) as client:
        assert client.post("/login", headers=ALICE).status_code == 200
        assert client.post("/login", headers=BOB).status_code == 200
        assert problem(client.post("/login"), 429)["limit"] == "login"
        fresh_redis_server.kill()
        closed = client.post("/login", headers=BOB)
        body = problem(closed, 503)
        assert body["type"] == TEMPORARY_REDUCED_CAPACITY
        assert rate_limit_headers(closed).retry_after == 1
        assert get(client, "/api/items", BOB).status_code == 200


def test_a_wrong_setting_stops_start_up(policy_path: Path, tmp_path: Path) -> None:
    """A bad trusted proxy in APPLIMIT stops gunicorn at start-up with a message that names
    the setting and the option, instead of serving 500s."""
    log = tmp_path / "gunicorn.log"
    env = {
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "RATE_LIMIT_POLICY": str(policy_path),
        "TRUSTED_PROXIES": "10.0.0.0/33",
    }
    with gunicorn(env, log) as process:
        code = process.wait(timeout=STARTUP_TIMEOUT)
    text = log.read_text(encoding="utf-8", errors="replace")
    assert code != 0, text
    assert "settings.APPLIMIT option trusted_proxies: trusted proxy '10.0.0.0/33'" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"polcy": "policy.yaml"}, "unknown option(s) 'polcy' (did you mean 'policy'?); known:"),
        ({}, "settings.APPLIMIT option policy: it is required"),
        ({"policy": "no-such.yaml"}, "settings.APPLIMIT option policy: "),
        ({"identify": "no_such_module.identify"}, "option identify: 'no_such_module.identify'"),
        ({"check_requests": "yes"}, "option check_requests: 'yes' is not True or False"),
        ({"trusted_proxies": "10.0.0.0/8"}, "option trusted_proxies: '10.0.0.0/8' is not a list"),
        ({"on_identify_error": "ignore"}, "option on_identify_error: 'ignore' is not one of"),
        ({"legacy_headers": 1}, "option legacy_headers: 1 is not True or False"),
        ("policy.yaml", "settings.APPLIMIT: a dict such as"),
    ],
)
def test_settings_mistakes_are_named(options: object, message: str, policy_path: Path) -> None:
    """Each mistake in APPLIMIT is an ImproperlyConfigured that names the option."""
    from django.core.exceptions import ImproperlyConfigured

    from applimit.django import load_config

    if isinstance(options, dict) and options and "policy" not in options and "polcy" not in options:
        options = {"policy": str(policy_path), **options}
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        load_config(options)


@pytest.mark.parametrize("choice", ["refuse", "anonymous", "raise"])
def test_on_identify_error(
    choice: str,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    policy_path: Path,
    tmp_path: Path,
) -> None:
    """identify raising (django_variant.py): /healthz, which no limit matches, never calls
    it; elsewhere "refuse" answers the 503 problem (middleware and decorator alike),
    "anonymous" counts by IP in the lowest tier, "raise" is Django's 500."""
    log = tmp_path / "gunicorn.log"
    env = {
        "REDIS_URL": redis_server.url,
        "RATE_LIMIT_POLICY": str(policy_path),
        "ON_IDENTIFY_ERROR": choice,
    }
    with gunicorn(env, log, settings="django_variant") as process:
        url = ready_url(process, log)
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/healthz", headers=BOB).status_code == 200
            for path in ("/api/items", "/reports/q1"):
                response = get(client, path, BOB)
                if choice == "refuse":
                    assert problem(response, 503)["type"] == TEMPORARY_REDUCED_CAPACITY
                elif choice == "anonymous":
                    assert response.status_code == 200
                    policies = rate_limit_headers(response).policies
                    assert all(quota.q in (3, 10) for quota in policies.values())  # free
                else:
                    assert response.status_code == 500


def test_a_request_cost_from_settings(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path, tmp_path: Path
) -> None:
    """APPLIMIT["cost"] as a dotted path (django_variant.header_cost): the request check
    counts what it returns for the request; a cost that is not one is the app's error."""
    log = tmp_path / "gunicorn.log"
    env = {
        "REDIS_URL": redis_server.url,
        "RATE_LIMIT_POLICY": str(policy_path),
        "REQUEST_COST": "1",
    }
    with gunicorn(env, log, settings="django_variant") as process:
        url = ready_url(process, log)
        with httpx.Client(base_url=url, timeout=10) as client:
            costly = get(client, "/api/items", {**BOB, "X-Cost": "3"})
            assert rate_limit_headers(costly).limits["api"].r == 2
            assert get(client, "/api/items", {**BOB, "X-Cost": "0"}).status_code == 500
        assert "the cost function 'header_cost' returned 0" in log.read_text(encoding="utf-8")
