"""applimit.flask: the extension, its per-view decorator and its 429s, served by waitress on
a real redis-server and compared with what the WSGI middleware answers for the same policy.

Every rate-limit header of every response is parsed and cross-checked (webcheck.py) before
a test looks at its values.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from flask import Flask, Response, g, jsonify
from harness import RedisServer
from servers import serve_wsgi
from webcheck import ALICE, BOB, FLASK, Serve, problem, rate_limit_headers

from applimit import ConfigurationError, Limiter, UnknownLimitError, rate_limited
from applimit.flask import Caller, Limits, RateLimitExceeded, RequestInfo
from applimit.web._headers import QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY
from applimit.wsgi import RateLimitMiddleware

POLICY = """
version: 1
tiers: [free, pro]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 2/1m, pro: 4/1m } }
  # For explicit use only: it applies where a view names it, never in the request check.
  - name: export
    app: { algorithm: sliding_log, middleware: false, tiers: { free: 1/1m, pro: 3/1m } }
  - name: search
    match: { paths: [/api/search] }
    app: { algorithm: sliding_log, tiers: { free: 10/1h, pro: 10/1h } }
"""

KEYS = {"key-alice": Caller("alice", tier="free"), "key-bob": Caller("bob", tier="pro")}


def identify(request: RequestInfo) -> Caller | None:
    """The test's auth: bearer or X-API-Key, as the examples read them."""
    key = request.bearer_token() or request.header("x-api-key")
    return KEYS.get(key) if key else None


def get(client: httpx.Client, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET and check the rate-limit headers of the answer."""
    response = client.get(path, headers=headers)
    rate_limit_headers(response)
    return response


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """The policy above, as a file."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def build_app(limits: Limits | None = None) -> Flask:
    """A small app: two API views (the second counted by two limits), an export view
    limited per view, and a view whose helper function is ``rate_limited``."""
    app = Flask(__name__)

    @app.get("/api/items")
    def items() -> Response:
        return jsonify(items=[1, 2])

    @app.get("/api/search")
    def search_view() -> Response:
        return jsonify(hits=[])

    if limits is not None:

        @app.get("/export")
        @limits.limit("export")
        def export() -> Response:
            return jsonify(export=True)

        @app.get("/big-export")
        @limits.limit("export", cost=lambda request: int(request.args.get("units", "1")))
        def big_export() -> Response:
            return jsonify(export="big")

        search = rate_limited(
            limits.limiter, "export", identity=lambda user: user, tier=lambda user: "free"
        )(lambda user: f"searched for {user}")

        @app.get("/helper/<user>")
        def helper(user: str) -> Response:
            return jsonify(result=search(user))

    return app


@pytest.fixture
def start(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path
) -> Iterator[Callable[..., httpx.Client]]:
    """``start(**limits_options)``: the small app with the extension, served by waitress.

    ``build`` (an option of its own) replaces the app factory; it gets the ``Limits``.
    """
    with contextlib.ExitStack() as stack:

        def run(build: Callable[[Limits], Flask] | None = None, **options: Any) -> httpx.Client:
            redis_url = options.pop("redis_url", redis_server.url)
            limiter = Limiter.from_policy(policy_path, redis_url=redis_url)
            stack.callback(limiter.close)
            options.setdefault("identify", identify)
            limits = Limits(limiter=limiter, **options)
            app = build(limits) if build is not None else build_app(limits)
            limits.init_app(app)
            url = stack.enter_context(serve_wsgi(app))
            return stack.enter_context(httpx.Client(base_url=url, timeout=10))

        yield run


def test_a_refusal_is_the_wsgi_middlewares_refusal(
    start: Callable[..., httpx.Client],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    policy_path: Path,
) -> None:
    """The third request of a free user is refused by both the extension and the WSGI
    middleware with the same status, header names, header values (but the waits) and the
    same problem body (but the waits)."""
    limiter = Limiter.from_policy(policy_path, redis_url=redis_server.url)
    plain = RateLimitMiddleware(build_app(), limiter=limiter, identify=identify)
    refusals: list[httpx.Response] = []
    try:
        with serve_wsgi(plain) as url, httpx.Client(base_url=url, timeout=10) as client:
            for _ in range(2):
                assert get(client, "/api/items", ALICE).status_code == 200
            refusals.append(get(client, "/api/items", ALICE))
    finally:
        limiter.close()
    redis_client.flushall()
    client = start()
    for _ in range(2):
        allowed = get(client, "/api/items", ALICE)
        assert allowed.status_code == 200
    refusals.append(get(client, "/api/items", ALICE))

    middleware, extension = refusals
    for response in refusals:
        body = problem(response, 429)
        assert body["type"] == QUOTA_EXCEEDED
        assert body["limit"] == "api"
        assert body["violated-policies"] == ["api"]
        parsed = rate_limit_headers(response)
        assert parsed.policies["api"].q == 2
        assert parsed.limits["api"].r == 0
        assert parsed.retry_after is not None and parsed.retry_after >= 1
        assert body["retry-after"] == parsed.retry_after

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

    assert shape(extension) == shape(middleware)


def test_allowed_requests_carry_the_headers(start: Callable[..., httpx.Client]) -> None:
    """An allowed request has RateLimit-Policy and RateLimit for each limit that applied;
    a request no limit matches has none."""
    client = start()
    first = get(client, "/api/search", BOB)
    assert first.status_code == 200
    parsed = rate_limit_headers(first)
    assert set(parsed.policies) == {"api", "search"}
    assert parsed.limits["api"].r == 3
    assert parsed.limits["search"].r == 9
    assert parsed.retry_after is None
    missing = client.get("/nowhere")
    assert missing.status_code == 404
    assert "ratelimit" not in missing.headers


def test_the_per_view_decorator_limits_only_its_view(start: Callable[..., httpx.Client]) -> None:
    """export (1/1m for free) is counted on /export alone: the second export is refused with
    export's own headers, while the API views, counted by their own limit, are untouched."""
    client = start()
    first = get(client, "/export", ALICE)
    assert first.json() == {"export": True}
    assert rate_limit_headers(first).policies["export"].q == 1
    refused = get(client, "/export", ALICE)
    body = problem(refused, 429)
    assert body["limit"] == "export"
    assert set(rate_limit_headers(refused).policies) == {"export"}
    items = get(client, "/api/items", ALICE)
    assert items.status_code == 200
    assert set(rate_limit_headers(items).policies) == {"api"}
    assert rate_limit_headers(items).limits["api"].r == 1


def test_a_cost_from_the_request(start: Callable[..., httpx.Client]) -> None:
    """cost= as a callable of the request: 3 units of bob's 3/1m at once, then nothing."""
    client = start()
    assert rate_limit_headers(get(client, "/big-export?units=3", BOB)).limits["export"].r == 0
    problem(get(client, "/big-export?units=1", BOB), 429)


def test_identity_and_tier_come_from_identify(start: Callable[..., httpx.Client]) -> None:
    """alice (free) and bob (pro) get their tier's quota in separate buckets; anonymous
    callers are counted by IP in the lowest tier."""
    client = start()
    for _ in range(2):
        get(client, "/api/items", ALICE)
    problem(get(client, "/api/items", ALICE), 429)
    bob = get(client, "/api/items", BOB)
    assert bob.status_code == 200
    assert rate_limit_headers(bob).policies["api"].q == 4
    assert rate_limit_headers(bob).limits["api"].r == 3
    anonymous = get(client, "/api/items")
    assert anonymous.status_code == 200
    assert rate_limit_headers(anonymous).policies["api"].q == 2
    assert rate_limit_headers(anonymous).limits["api"].r == 1


def test_identify_runs_once_per_request_in_the_request_context(
    start: Callable[..., httpx.Client],
) -> None:
    """With the request check and a per-view limit on one request, identify runs once, and
    flask.g is there for it."""
    calls: list[str] = []

    def counting(request: RequestInfo) -> Caller | None:
        g.seen = True
        calls.append(request.path)
        return identify(request)

    def build(limits: Limits) -> Flask:
        app = Flask(__name__)

        @app.get("/api/export")
        @limits.limit("export")
        def export() -> Response:
            return jsonify(seen=g.get("seen", False))

        return app

    client = start(build, identify=counting)
    response = get(client, "/api/export", BOB)
    assert response.json() == {"seen": True}
    assert calls == ["/api/export"]
    parsed = rate_limit_headers(response)
    assert set(parsed.policies) == {"api", "export"}
    assert parsed.limits["api"].r == 3
    assert parsed.limits["export"].r == 2


def test_a_request_cost(start: Callable[..., httpx.Client]) -> None:
    """cost= for the request check, a function of the RequestInfo as for the middleware."""

    def cost(request: RequestInfo) -> int:
        return int(request.header("x-cost") or "1")

    client = start(cost=cost)
    assert (
        rate_limit_headers(get(client, "/api/items", {**BOB, "X-Cost": "3"})).limits["api"].r == 1
    )
    problem(get(client, "/api/items", {**BOB, "X-Cost": "2"}), 429)


def test_check_requests_off_leaves_only_the_views(start: Callable[..., httpx.Client]) -> None:
    """check_requests=False: the API views are not limited; /export still is."""
    client = start(check_requests=False)
    for _ in range(5):
        response = client.get("/api/items", headers=ALICE)
        assert response.status_code == 200
        assert "ratelimit" not in response.headers
    get(client, "/export", ALICE)
    problem(get(client, "/export", ALICE), 429)


def test_rate_limited_inside_a_view_is_a_429_not_a_500(
    start: Callable[..., httpx.Client],
) -> None:
    """A function decorated with rate_limited, called by a view, raises RateLimited: the
    extension answers it with the problem body and headers."""
    client = start()
    assert get(client, "/helper/carol").json() == {"result": "searched for carol"}
    refused = get(client, "/helper/carol")
    body = problem(refused, 429)
    assert body["limit"] == "export"
    assert rate_limit_headers(refused).retry_after is not None


def test_after_request_functions_see_the_refusal(start: Callable[..., httpx.Client]) -> None:
    """A refusal goes through the app's after_request functions (Flask-CORS adds its headers
    there), and an app's handler for every HTTPException still sends the problem body."""

    def build(limits: Limits) -> Flask:
        app = build_app(limits)

        @app.after_request
        def mark(response: Response) -> Response:
            response.headers["Access-Control-Allow-Origin"] = "*"
            return response

        @app.errorhandler(Exception)
        def everything(error: Exception) -> Any:
            if isinstance(error, RateLimitExceeded):
                return error.get_response()
            return jsonify(error="unexpected"), 500

        return app

    client = start(build)
    get(client, "/export", ALICE)
    refused = get(client, "/export", ALICE)
    assert problem(refused, 429)["limit"] == "export"
    assert refused.headers["access-control-allow-origin"] == "*"


def test_a_view_failing_closed_answers_503(
    start: Callable[..., httpx.Client], tmp_path: Path, fresh_redis_server: RedisServer
) -> None:
    """Redis gone and the limit failing closed: the per-view limit answers the middleware's
    503 with the temporary-reduced-capacity problem."""
    text = POLICY.replace("timeout: 2s", "timeout: 2s, on_redis_error: deny", 1)
    (tmp_path / "policy.yaml").write_text(text, encoding="utf-8")
    client = start(redis_url=fresh_redis_server.url)
    fresh_redis_server.kill()
    refused = get(client, "/export", ALICE)
    body = problem(refused, 503)
    assert body["type"] == TEMPORARY_REDUCED_CAPACITY
    assert rate_limit_headers(refused).retry_after == 1


def test_definition_errors_fail_at_start_up(policy_path: Path, redis_server: RedisServer) -> None:
    """An unknown limit name, a bad cost, a bad option or an AsyncLimiter fail when the app
    is built, with the errors the rest of applimit raises."""
    with Limiter.from_policy(policy_path, redis_url=redis_server.url) as limiter:
        limits = Limits(limiter=limiter)
        with pytest.raises(UnknownLimitError, match=r"no limit named 'nope'.*'api', 'export'"):
            limits.limit("nope")
        with pytest.raises(ValueError, match="cost must be a positive int"):
            limits.limit("export", cost=0)
        with pytest.raises(ConfigurationError, match=r"Limits option trusted_proxies: .*/33"):
            Limits(limiter=limiter, trusted_proxies=["10.0.0.0/33"])
        with pytest.raises(ConfigurationError, match="Limits option on_identify_error"):
            Limits(limiter=limiter, on_identify_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Limits option limiter: .*applimit\.Limiter"):
        Limits(limiter=object())  # type: ignore[arg-type]


def test_identify_runs_only_where_a_limit_applies(start: Callable[..., httpx.Client]) -> None:
    """A request no limit matches, and a CORS preflight, never reach identify (an auth
    backend that is down does not turn /healthz into a 500) and carry no headers."""
    calls: list[str] = []

    def strict(request: RequestInfo) -> Caller | None:
        calls.append(request.path)
        raise RuntimeError("the auth backend is down")

    def build(limits: Limits) -> Flask:
        app = build_app(limits)

        @app.get("/healthz")
        def healthz() -> Response:
            return jsonify(status="ok")

        return app

    client = start(build, identify=strict)
    health = client.get("/healthz")
    assert health.status_code == 200
    assert "ratelimit-policy" not in health.headers
    preflight = client.options(
        "/api/items",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 200
    assert "ratelimit-policy" not in preflight.headers
    assert calls == []


@pytest.mark.parametrize("choice", ["refuse", "anonymous", "raise"])
def test_on_identify_error(start: Callable[..., httpx.Client], choice: str) -> None:
    """An identify that raises: "refuse" answers the middleware's 503 problem (for the
    request check and the per-view limit alike), "anonymous" counts the caller by IP in the
    lowest tier, "raise" lets the app's error handling answer (a 500)."""

    def broken(request: RequestInfo) -> Caller | None:
        raise RuntimeError("the auth backend is down")

    client = start(identify=broken, on_identify_error=choice)
    for path in ("/api/items", "/export"):
        response = get(client, path, BOB)
        if choice == "refuse":
            body = problem(response, 503)
            assert body["type"] == TEMPORARY_REDUCED_CAPACITY
        elif choice == "anonymous":
            assert response.status_code == 200
            policies = rate_limit_headers(response).policies
            assert all(quota.q in (1, 2) for quota in policies.values())  # free, not pro
        else:
            assert response.status_code == 500


# --- the example app ---------------------------------------------------------------------

EXAMPLE_POLICY = """
version: 1
tiers: [free, pro, enterprise]
app: { timeout: 2s }
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, tiers: { free: 3/1m, pro: 5/1m, enterprise: 100/1m } }
  - name: search
    match: { paths: [/api/search] }
    app: { algorithm: sliding_log, tiers: { free: 10/1h, pro: 10/1h, enterprise: 10/1h } }
"""


@pytest.mark.parametrize("stack", [FLASK])
def test_the_example_reports_view_draws_from_search(
    serve: Serve, write_policy: Callable[[str], Path]
) -> None:
    """examples/flask_app.py: /reports/<name> costs 5 units of search (10/1h): two reports,
    then the extension's 429 problem."""
    client = serve(policy=write_policy(EXAMPLE_POLICY))
    first = get(client, "/reports/q1", ALICE)
    assert first.json() == {"report": "q1"}
    assert rate_limit_headers(first).limits["search"].r == 5
    assert get(client, "/reports/q2", ALICE).status_code == 200
    refused = get(client, "/reports/q3", ALICE)
    assert problem(refused, 429)["limit"] == "search"
