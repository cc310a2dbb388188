"""Exemptions and the app's own refusal body, the same for every helper.

``exempt_when(request, client_ip)`` and ``exempt_caller(request, caller)`` spare a request:
neither counted nor refused, no rate-limit headers, ``applimit.EXEMPT`` as the Decision the
app sees; ``exempt_when`` runs before ``identify``, which a request it spares never reaches.
Flask's ``@limits.exempt`` and Django's ``@rate_limit_exempt`` leave a view out of the
request check. ``refusal(request, default)`` gives a 429 or 503 the app's own body, with the
status and the rate-limit headers kept; should it fail, the default body goes out.

Each stack is a real server on a real redis-server: the ASGI middleware and the FastAPI
dependency under uvicorn, the WSGI middleware and the Flask extension under waitress, the
Django middleware under gunicorn (django_exempt.py). Every rate-limit header of every
response is parsed and cross-checked (webcheck.py) before a test looks at its values.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi import Depends, FastAPI, Request
from flask import Blueprint, Flask, jsonify
from flask import request as flask_request
from harness import RedisServer
from servers import serve_asgi, serve_wsgi
from test_django import gunicorn, ready_url
from webcheck import problem, rate_limit_headers

from applimit import EXEMPT, AsyncLimiter, ConfigurationError, Decision, Limiter, Refusal
from applimit import asgi as applimit_asgi
from applimit import wsgi as applimit_wsgi
from applimit.fastapi import RateLimit, add_problem_handler
from applimit.flask import Caller, Limits, RequestInfo
from applimit.web._headers import QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY

POLICY = """
version: 1
tiers: [free]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app: { algorithm: sliding_log, on_redis_error: deny, tiers: { free: 2/1m } }
  - name: export
    app: { algorithm: sliding_log, middleware: false, tiers: { free: 1/1m } }
"""

ASGI, WSGI, DEPENDENCY, EXTENSION = "asgi", "wsgi", "fastapi-dependency", "flask-extension"
STACKS = [ASGI, WSGI, DEPENDENCY, EXTENSION]
# Redis is not listening there: every decision fails, and the api limit fails closed.
NO_REDIS = "redis://127.0.0.1:1/0"
INTERNAL = "10.9.9.9"
KEYS = {"key-alice": Caller("alice"), "key-root": Caller("root")}
BOOM = {"X-Boom": "1"}
ROOT = {"X-API-Key": "key-root"}
SUDO = {"X-API-Key": "key-root", "X-Sudo": "1"}
ALICE_SUDO = {"X-API-Key": "key-alice", "X-Sudo": "1"}
HTML = "text/html; charset=utf-8"


def identify(request: RequestInfo) -> Caller | None:
    """X-API-Key names the caller; X-Boom makes the auth fail, so that a request which
    reaches identify shows it (a 500 under on_identify_error "raise")."""
    if request.header("x-boom"):
        raise RuntimeError("identify ran")
    return KEYS.get(request.header("x-api-key") or "")


def exempt_when(request: RequestInfo, client_ip: str) -> bool:
    """The health check and the internal address are not limited."""
    return request.path == "/api/health" or client_ip == INTERNAL


def exempt_caller(request: RequestInfo, caller: Caller) -> bool:
    """root, when asking for it, is not limited."""
    return caller.user == "root" and request.header("x-sudo") == "1"


def refusal_page(request: RequestInfo, default: Refusal) -> tuple[str, str]:
    """The app's own page for a refusal, from what the refusal knows: the status, the
    limit that refused (none when nothing was decided), the wait, the request."""
    limit = default.decision.policy if default.decision is not None else "none"
    return (
        f"<p>{default.status} by {limit}: retry in {default.retry_after} s ({request.path})</p>",
        HTML,
    )


def answer(decision: Decision | None) -> dict[str, bool]:
    """What every view answers: whether the request was spared, and decided at all."""
    return {"exempt": decision is EXEMPT, "decided": decision is not None}


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    """The policy above, as a file."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


def fastapi_app(limiter: AsyncLimiter, stack: str, options: dict[str, Any]) -> FastAPI:
    """FastAPI with the ASGI middleware, or with the dependency on every route."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Built outside, used and closed on the server's own event loop.
        yield
        await limiter.aclose()

    app = FastAPI(lifespan=lifespan)
    dependencies = []
    if stack == ASGI:
        app.add_middleware(applimit_asgi.RateLimitMiddleware, limiter=limiter, **options)
    else:
        dependencies = [Depends(RateLimit(limiter, **options))]
        add_problem_handler(app)

    async def view(request: Request) -> dict[str, bool]:
        return answer(getattr(request.state, "applimit_decision", None))

    for path in ("/api/items", "/api/health", "/api/status"):
        app.get(path, dependencies=dependencies)(view)
    return app


def flask_app(limiter: Limiter, stack: str, options: dict[str, Any]) -> Flask:
    """Flask behind the WSGI middleware, or with the extension: there ``/api/status`` is
    marked ``@limits.exempt``, and so is the ``admin`` blueprint."""
    app = Flask(__name__)

    def view() -> Any:
        return jsonify(answer(flask_request.environ.get(applimit_wsgi.DECISION_ENVIRON_KEY)))

    app.get("/api/items", endpoint="items")(view)
    app.get("/api/health", endpoint="health")(view)
    admin = Blueprint("admin", __name__, url_prefix="/api/admin")
    admin.get("/panel", endpoint="panel")(view)
    if stack == WSGI:
        app.get("/api/status", endpoint="status")(view)
        app.register_blueprint(admin)
        app.wsgi_app = applimit_wsgi.RateLimitMiddleware(  # type: ignore[method-assign]
            app.wsgi_app, limiter=limiter, **options
        )
        return app
    limits = Limits(app, limiter=limiter, **options)

    # The mark works above the route decorator and below it (carried by functools.wraps).
    @limits.exempt
    @app.get("/api/status")
    def status() -> Any:
        return view()

    # Exempt from the request check, with a limit of its own all the same.
    @app.get("/api/export")
    @limits.limit("export")
    @limits.exempt
    def export() -> Any:
        return view()

    limits.exempt(admin)
    app.register_blueprint(admin)
    return app


@pytest.fixture
def start(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path
) -> Iterator[Callable[..., httpx.Client]]:
    """``start(stack, **options)``: the stack's app with the helper given ``options``
    (``identify`` by default; ``redis_url`` picks the Redis), served over real HTTP."""
    with contextlib.ExitStack() as stack_of_things:

        def run(stack: str, *, redis_url: str = redis_server.url, **options: Any) -> httpx.Client:
            options.setdefault("identify", identify)
            if stack in (ASGI, DEPENDENCY):
                url = stack_of_things.enter_context(
                    serve_asgi(
                        fastapi_app(
                            AsyncLimiter.from_policy(policy_path, redis_url=redis_url),
                            stack,
                            options,
                        )
                    )
                )
            else:
                limiter = Limiter.from_policy(policy_path, redis_url=redis_url)
                stack_of_things.callback(limiter.close)
                url = stack_of_things.enter_context(serve_wsgi(flask_app(limiter, stack, options)))
            return stack_of_things.enter_context(httpx.Client(base_url=url, timeout=10))

        yield run


def get(client: httpx.Client, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET and check the rate-limit headers of the answer."""
    response = client.get(path, headers=headers)
    rate_limit_headers(response)
    return response


def assert_spared(response: httpx.Response) -> None:
    """Answered by the app, with no rate-limit header, and told it was exempt."""
    assert response.status_code == 200, response.text
    names = {n for n in response.headers if n.startswith(("ratelimit", "retry", "x-ratelimit"))}
    assert names == set()
    assert response.json() == {"exempt": True, "decided": True}


def remaining(response: httpx.Response) -> int:
    """The api limit's ``r`` in a counted, allowed response (the app told it was not
    exempt)."""
    assert response.status_code == 200, response.text
    assert response.json() == {"exempt": False, "decided": True}
    return rate_limit_headers(response).limits["api"].r


@pytest.mark.parametrize("stack", STACKS)
def test_exempt_when_spares_a_request_without_identify(
    start: Callable[..., httpx.Client], stack: str
) -> None:
    """/api/health, which exempt_when spares, is answered without headers as often as
    asked, never reaches identify (which would fail), and counts nothing: an ordinary
    request afterwards has the whole quota, and once that is spent the health check still
    passes."""
    client = start(stack, exempt_when=exempt_when, exempt_caller=exempt_caller)
    for _ in range(5):
        assert_spared(get(client, "/api/health", BOOM))
    assert remaining(get(client, "/api/items")) == 1
    assert remaining(get(client, "/api/items")) == 0
    refused = get(client, "/api/items")
    assert problem(refused, 429)["type"] == QUOTA_EXCEEDED
    assert_spared(get(client, "/api/health"))
    # Without exempt_when the same request is limited like any other: refused now.
    assert problem(get(start(stack), "/api/health"), 429)["limit"] == "api"


@pytest.mark.parametrize("stack", STACKS)
def test_exempt_when_sees_the_client_ip_the_limits_count(
    start: Callable[..., httpx.Client], stack: str
) -> None:
    """An internal client behind a trusted proxy is spared, and counted for nothing (its
    quota is whole when no exemption applies); the same X-Forwarded-For written by a
    client the proxy list does not cover is only text, and that client is limited."""
    forwarded = {"X-Forwarded-For": INTERNAL}
    behind = start(stack, exempt_when=exempt_when, trusted_proxies=["127.0.0.1"])
    for _ in range(4):
        assert_spared(get(behind, "/api/items", forwarded))
    unexempt = start(stack, trusted_proxies=["127.0.0.1"])
    assert remaining(get(unexempt, "/api/items", forwarded)) == 1
    forged = start(stack, exempt_when=exempt_when)
    assert remaining(get(forged, "/api/items", forwarded)) == 1
    assert remaining(get(forged, "/api/items", forwarded)) == 0
    assert get(forged, "/api/items", forwarded).status_code == 429


@pytest.mark.parametrize("stack", STACKS)
def test_exempt_caller_spares_an_identified_caller(
    start: Callable[..., httpx.Client], stack: str
) -> None:
    """root asking for it is spared as often as asked and counted for nothing (root's own
    quota is whole afterwards); root is spared past that quota too; alice asking for it is
    counted."""
    client = start(stack, exempt_when=exempt_when, exempt_caller=exempt_caller)
    for _ in range(4):
        assert_spared(get(client, "/api/items", SUDO))
    assert remaining(get(client, "/api/items", ROOT)) == 1
    assert remaining(get(client, "/api/items", ROOT)) == 0
    assert get(client, "/api/items", ROOT).status_code == 429
    assert_spared(get(client, "/api/items", SUDO))
    assert remaining(get(client, "/api/items", ALICE_SUDO)) == 1


def test_flask_exempt_leaves_views_and_blueprints_out_of_the_request_check(
    start: Callable[..., httpx.Client],
) -> None:
    """``@limits.exempt`` views and a blueprint passed to ``limits.exempt`` are neither
    counted nor refused by the api limit, though its match: covers them; a limit the view
    names itself still applies; the other views are limited as before."""
    client = start(EXTENSION)
    for _ in range(4):
        assert_spared(get(client, "/api/status"))
        assert_spared(get(client, "/api/admin/panel"))
    assert remaining(get(client, "/api/items")) == 1
    exported = get(client, "/api/export")
    assert exported.status_code == 200
    assert set(rate_limit_headers(exported).limits) == {"export"}
    assert exported.json() == {"exempt": False, "decided": True}
    assert problem(get(client, "/api/export"), 429)["limit"] == "export"
    assert remaining(get(client, "/api/items")) == 0
    assert get(client, "/api/items").status_code == 429
    assert_spared(get(client, "/api/status"))


@pytest.mark.parametrize("stack", STACKS)
def test_a_refusal_of_the_apps_own(start: Callable[..., httpx.Client], stack: str) -> None:
    """The 429 carries the body and content type of the refusal function, made from
    what the refusal knows, with every rate-limit header kept (the legacy ones too)."""
    client = start(stack, refusal=refusal_page, legacy_headers=True)
    for _ in range(2):
        assert get(client, "/api/items").status_code == 200
    refused = get(client, "/api/items")
    assert refused.status_code == 429
    assert refused.headers["content-type"] == HTML
    parsed = rate_limit_headers(refused)
    assert parsed.retry_after is not None and parsed.retry_after >= 1
    assert parsed.limits["api"].r == 0
    assert parsed.policies["api"].q == 2
    assert parsed.legacy is not None
    assert refused.text == f"<p>429 by api: retry in {parsed.retry_after} s (/api/items)</p>"
    assert refused.headers["content-length"] == str(len(refused.content))


@pytest.mark.parametrize("stack", STACKS)
def test_a_fail_closed_refusal_of_the_apps_own(
    start: Callable[..., httpx.Client], stack: str
) -> None:
    """Redis unreachable and the limit failing closed: the 503 carries the refusal
    function's body, and RateLimit-Policy and Retry-After as before."""
    client = start(stack, redis_url=NO_REDIS, refusal=refusal_page)
    refused = get(client, "/api/items")
    assert refused.status_code == 503
    assert refused.headers["content-type"] == HTML
    assert refused.text == "<p>503 by api: retry in 1 s (/api/items)</p>"
    parsed = rate_limit_headers(refused)
    assert parsed.retry_after == 1
    assert parsed.policies["api"].q == 2


def broken_page(request: RequestInfo, default: Refusal) -> tuple[str, str]:
    """A template that fails to render."""
    raise RuntimeError("the refusal template is broken")


def header_splitting_page(request: RequestInfo, default: Refusal) -> tuple[str, str]:
    """A content type that would end the header and start another."""
    return "<p>slow down</p>", "text/html\r\nSet-Cookie: session=stolen"


def shapeless_page(request: RequestInfo, default: Refusal) -> Any:
    """Not (body, content_type)."""
    return {"error": "slow down"}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("page", [broken_page, header_splitting_page, shapeless_page])
def test_a_failing_refusal_function_still_sends_the_default(
    start: Callable[..., httpx.Client],
    stack: str,
    page: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refusal function that raises or answers something unusable: the default 429
    (problem body, every header) goes out, and the failure is logged."""
    client = start(stack, refusal=page)
    for _ in range(2):
        assert get(client, "/api/items").status_code == 200
    with caplog.at_level(logging.ERROR, logger="applimit"):
        refused = get(client, "/api/items")
    body = problem(refused, 429)
    assert body["limit"] == "api"
    assert body["retry-after"] == rate_limit_headers(refused).retry_after
    assert "set-cookie" not in refused.headers
    assert [r for r in caplog.records if getattr(r, "applimit_event", None) == "refusal_failed"]


def failing_exemption(request: RequestInfo, client_ip: str) -> bool:
    """An exemption that needs a backend which is down."""
    raise RuntimeError("the exemption list is unavailable")


def forgetful_exemption(request: RequestInfo, client_ip: str) -> bool:
    """An exemption without a return: None is not an answer."""
    request.header("x-api-key")
    return None  # type: ignore[return-value]  # the bug this test is about


@pytest.mark.parametrize("stack", [ASGI, WSGI, EXTENSION])
@pytest.mark.parametrize("hook", [failing_exemption, forgetful_exemption])
def test_a_failing_exemption_follows_on_identify_error(
    start: Callable[..., httpx.Client], stack: str, hook: Callable[..., bool]
) -> None:
    """An exemption function that raises (or does not answer True or False) means what a
    failing identify means: "refuse" answers 503 (through the refusal function) and counts
    nothing, "anonymous" does not exempt (the request is counted), "raise" is a 500."""
    refusing = start(stack, exempt_when=hook, on_identify_error="refuse", refusal=refusal_page)
    refused = get(refusing, "/api/items")
    assert refused.status_code == 503
    assert refused.text == "<p>503 by none: retry in 5 s (/api/items)</p>"
    refused = start(stack, exempt_when=hook, on_identify_error="refuse").get("/api/items")
    assert problem(refused, 503)["type"] == TEMPORARY_REDUCED_CAPACITY
    counting = start(stack, exempt_when=hook, on_identify_error="anonymous")
    # Nothing was counted by the refusals: the whole quota is left.
    assert remaining(get(counting, "/api/items")) == 1
    assert start(stack, exempt_when=hook).get("/api/items").status_code == 500


def test_a_failing_exemption_raises_from_the_dependency(start: Callable[..., httpx.Client]) -> None:
    """The FastAPI dependency lets identify's exceptions through, and an exemption
    function's too: a 500, nothing counted."""
    client = start(DEPENDENCY, exempt_when=failing_exemption)
    assert client.get("/api/items").status_code == 500
    assert remaining(get(start(DEPENDENCY), "/api/items")) == 1


async def async_exemption(request: RequestInfo, client_ip: str) -> bool:
    """An async function, which the decision would not await."""
    return True


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("refusal", "<p>slow down</p>", "option refusal: '<p>slow down</p>' is not callable"),
        ("exempt_when", async_exemption, "option exempt_when: 'async_exemption' is an async"),
        ("exempt_caller", 42, "option exempt_caller: 42 is not callable"),
    ],
)
def test_options_are_checked_when_built(
    policy_path: Path, option: str, value: object, message: str
) -> None:
    """Each helper refuses a function option that is not a plain function, naming it."""
    with Limiter.from_policy(policy_path, redis_url=NO_REDIS) as limiter:
        for build in (
            lambda: applimit_wsgi.RateLimitMiddleware(
                Flask(__name__), limiter=limiter, **{option: value}
            ),
            lambda: Limits(Flask(__name__), limiter=limiter, **{option: value}),
            lambda: RateLimit(limiter, **{option: value}),
        ):
            with pytest.raises(ConfigurationError, match=re.escape(message)):
                build()
    limiter_async = AsyncLimiter.from_policy(policy_path, redis_url=NO_REDIS)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        applimit_asgi.RateLimitMiddleware(FastAPI(), limiter=limiter_async, **{option: value})


def test_django_settings_name_a_bad_function_option(policy_path: Path) -> None:
    """APPLIMIT's function options are checked with the others when Django loads the
    middleware; a dotted path that does not import is named too."""
    from django.core.exceptions import ImproperlyConfigured

    from applimit.django import load_config

    with pytest.raises(
        ImproperlyConfigured, match=re.escape("settings.APPLIMIT option refusal: 42 is not")
    ):
        load_config({"policy": str(policy_path), "refusal": 42})
    with pytest.raises(
        ImproperlyConfigured, match=re.escape("option exempt_when: 'nowhere.exempt'")
    ):
        load_config({"policy": str(policy_path), "exempt_when": "nowhere.exempt"})


# --- Django, under gunicorn --------------------------------------------------------------


@contextlib.contextmanager
def django_site(
    redis_server: RedisServer, policy_path: Path, log: Path, **env: str
) -> Iterator[httpx.Client]:
    """django_exempt.py's site under gunicorn, behind a trusted proxy (this host)."""
    env = {
        "REDIS_URL": redis_server.url,
        "RATE_LIMIT_POLICY": str(policy_path),
        "TRUSTED_PROXIES": "127.0.0.1",
        **env,
    }
    with (
        gunicorn(env, log, settings="django_exempt") as process,
        httpx.Client(base_url=ready_url(process, log), timeout=10) as client,
    ):
        yield client


def test_django_exemptions_and_refusal(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path, tmp_path: Path
) -> None:
    """Django: exempt_when (the health check, without identify; the internal address),
    exempt_caller, @rate_limit_exempt on a function view and on a class-based view's
    dispatch are spared, uncounted; the other requests are limited, and the 429 carries
    the site's own page with the rate-limit headers."""
    with django_site(redis_server, policy_path, tmp_path / "gunicorn.log") as client:
        for _ in range(3):
            assert_spared(get(client, "/api/health", BOOM))
            assert_spared(get(client, "/api/items", {"X-Forwarded-For": INTERNAL}))
            assert_spared(get(client, "/api/items", SUDO))
            assert_spared(get(client, "/api/status"))
            assert_spared(get(client, "/api/panel"))
        assert remaining(get(client, "/api/items")) == 1
        assert remaining(get(client, "/api/items")) == 0
        refused = get(client, "/api/items")
        assert refused.status_code == 429
        assert refused.headers["content-type"] == HTML
        parsed = rate_limit_headers(refused)
        assert parsed.limits["api"].r == 0
        assert refused.text == f"<p>429 by api: retry in {parsed.retry_after} s (/api/items)</p>"
        assert_spared(get(client, "/api/status"))
        assert remaining(get(client, "/api/items", ROOT)) == 1


def test_django_failing_refusal_sends_the_default(
    redis_server: RedisServer, redis_client: redis.Redis, policy_path: Path, tmp_path: Path
) -> None:
    """Django: a refusal function that raises leaves the default 429 problem in place,
    headers and all, and the failure in the log."""
    log = tmp_path / "gunicorn.log"
    with django_site(redis_server, policy_path, log, REFUSAL="raise") as client:
        assert remaining(get(client, "/api/items")) == 1
        assert remaining(get(client, "/api/items")) == 0
        refused = get(client, "/api/items")
        body = problem(refused, 429)
        assert body["retry-after"] == rate_limit_headers(refused).retry_after
    assert "refusal() failed for the 429 answer to GET /api/items" in log.read_text()


def test_exempt_is_told_apart_from_an_empty_decision() -> None:
    """EXEMPT is allowed with no results, like the Decision of a request no limit covers,
    and still unequal to it, so that an app comparing Decisions cannot mistake one for
    the other."""
    from applimit._flow import UNLIMITED

    assert EXEMPT.allowed and not EXEMPT.results
    assert EXEMPT != UNLIMITED
    assert EXEMPT == EXEMPT
    assert repr(EXEMPT) == "applimit.EXEMPT"
