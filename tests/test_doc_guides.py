"""docs/selling-an-api.md holds: its policy loads and lints clean, and a client of an app
under it sees the headers and refusals the guide shows (the WSGI middleware on
``memory://``, driven by Werkzeug's test client)."""

from __future__ import annotations

import re
from pathlib import Path

import edgegen_policy as policy
import redis
from harness import RedisServer
from werkzeug.test import Client

from applimit import Caller, Limiter, RequestInfo
from applimit.wsgi import RateLimitMiddleware

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "selling-an-api.md"


def guide_policy() -> policy.Policy:
    [text] = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text("utf-8"), re.DOTALL)[:1]
    return policy.loads(text, "selling-an-api.md")


def test_the_guides_policy_loads_and_lints_clean() -> None:
    loaded = guide_policy()
    findings = [d for d in policy.lint(loaded) if d.severity is not policy.Severity.INFO]
    assert findings == []
    assert [(o.limit, o.gives()) for o in loaded.overrides] == [
        ("api", "rates 5000/1m; quotas 1000000/month"),
        ("exports", "concurrency 8"),
    ]


def test_a_client_sees_what_the_guide_shows() -> None:
    """RateLimit headers name the rate and the billing quota; the second export of a free
    organisation at once is refused by the concurrency limit, with the guide's words."""

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])  # type: ignore[operator]
        return [b"{}"]

    def identify(request: RequestInfo) -> Caller:
        plan = request.header("x-plan") or "pro"
        return Caller("alice", tier=plan, keys={"org": f"org-{plan}", "billing_day": "15"})

    with Limiter(guide_policy(), redis_url="memory://selling-an-api") as limiter:
        client = Client(RateLimitMiddleware(app, limiter=limiter, identify=identify))
        response = client.get("/v1/items")
        assert response.status_code == 200
        assert re.fullmatch(
            r'"api/1m";q=1000;w=60, "api/billing";q=50000;w=(2419200|2505600|2592000|2678400)',
            response.headers["RateLimit-Policy"],
        )
        assert re.fullmatch(
            r'"api/1m";r=999;t=\d+, "api/billing";r=49999;t=\d+', response.headers["RateLimit"]
        )
        held = client.get("/v1/exports/1", headers={"x-plan": "free"})
        assert held.status_code == 200
        refused = client.get("/v1/exports/2", headers={"x-plan": "free"})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "1"
        assert refused.json is not None
        assert refused.json["detail"] == (
            "Concurrency limit 'exports' allows 1 request at once for the free tier, and "
            "that many are running; retry when one has finished."
        )
        held.close()
        assert client.get("/v1/exports/3", headers={"x-plan": "free"}).status_code == 200


def test_a_customer_on_a_contract_sees_its_own_terms() -> None:
    """acme's override: its own rate and monthly quota in the headers, in place of pro's
    rate and billing quota; eight exports at once, though its tier allows four."""
    import threading

    running = threading.Barrier(9)
    release = threading.Event()

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "application/json")])  # type: ignore[operator]
        if str(environ["PATH_INFO"]).startswith("/v1/exports"):
            running.wait(10)
            release.wait(10)
        return [b"{}"]

    def identify(request: RequestInfo) -> Caller:
        return Caller("ann", tier="pro", keys={"org": "acme", "billing_day": "15"})

    with Limiter(guide_policy(), redis_url="memory://selling-an-api-acme") as limiter:
        client = Client(RateLimitMiddleware(app, limiter=limiter, identify=identify))
        response = client.get("/v1/items")
        assert re.fullmatch(
            r'"api/1m";q=5000;w=60, "api/month";q=1000000;w=\d+',
            response.headers["RateLimit-Policy"],
        )
        statuses: list[int] = []
        exports = [
            threading.Thread(
                target=lambda: statuses.append(client.get("/v1/exports/x").status_code)
            )
            for _ in range(8)
        ]
        for thread in exports:
            thread.start()
        running.wait(10)
        # Eight running at once; a ninth is refused, naming the customer's own terms.
        refused = client.get("/v1/exports/y")
        assert refused.status_code == 429
        assert refused.json is not None
        assert refused.json["detail"] == (
            "Concurrency limit 'exports' allows 8 requests at once under this caller's own "
            "terms, and that many are running; retry when one has finished."
        )
        release.set()
        for thread in exports:
            thread.join(10)
        assert statuses == [200] * 8


def _usage(path: Path, url: str, keys: str) -> str:
    import io

    from applimit._cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = ["usage", str(path), "--keys", keys, "--tier", "pro", "--redis-url", url]
    assert main(argv, stdin=io.StringIO(), stdout=out, stderr=err) == 0, err.getvalue()
    return out.getvalue()


def _numbers_free(text: str) -> str:
    """The usage text with what depends on the clock and the server put aside."""
    text = re.sub(r"in redis://\S+", "in REDIS", text)
    text = re.sub(r"resets in [0-9.]+s", "resets in Ts", text)
    return re.sub(r"period ends in (\d+[dhm] \d+[hms]|[0-9.]+s)", "period ends in T", text)


def test_support_sees_what_the_guide_shows(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """`applimit usage` of the guide, on a real Redis after two calls and one export
    running: the text the guide shows, but for the clock; a customer on a contract shows
    its own terms, as the guide says."""
    loaded = guide_policy()
    [shown] = re.findall(
        r"```\n\$ applimit usage .*?\n(.*?)```", GUIDE.read_text("utf-8"), re.DOTALL
    )
    path = tmp_path / "policy.yaml"
    [text] = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text("utf-8"), re.DOTALL)[:1]
    path.write_text(text)
    with Limiter(loaded, redis_url=redis_server.url) as limiter:
        for _ in range(2):
            limiter.hit("api", None, tier="pro", keys={"org": "globex", "billing_day": "15"})
        held = limiter.hit("exports", None, tier="pro", keys={"org": "globex"})
        assert held.allowed
        got = _usage(path, redis_server.url, "org=globex,billing_day=15")
        assert _numbers_free(got) == _numbers_free(shown)
        contract = _usage(path, redis_server.url, "org=acme,billing_day=15")
        assert "5000/1m" in contract and "1000000/month" in contract
        assert "running   0 of 8" in contract and contract.count("(override)") == 3
        limiter.release(held)
