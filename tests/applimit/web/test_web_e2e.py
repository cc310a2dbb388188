"""End to end over real HTTP: the FastAPI example under uvicorn and the Flask example under
waitress, on a real redis-server, driven by httpx. Every test runs on both stacks.

Every rate-limit header of every response is parsed with the structured-field parser and
cross-checked (see webcheck.py) before the test looks at its values.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from harness import RedisServer
from webcheck import (
    ALICE,
    BOB,
    CAROL,
    FASTAPI,
    Serve,
    problem,
    rate_limit_headers,
)

from applimit import Limiter
from applimit.web._headers import QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY

SMALL_POLICY = """
version: 1
tiers: [free, pro, enterprise]
app: { timeout: 2s }  # generous: these tests are about semantics, not latency
limits:
  - name: api
    match: { path_prefix: /api/ }
    app:
      algorithm: sliding_log
      tiers: { free: 3/1m, pro: [5/1m, 7/1h], enterprise: 100/1m }
  - name: search
    match: { paths: [/api/search] }
    app: { algorithm: sliding_log, tiers: { free: 10/1h, pro: 10/1h, enterprise: 10/1h } }
  - name: login
    match: { paths: [/login], methods: [POST] }
    app: { per: ip, algorithm: sliding_log, tiers: { free: 2/1m, pro: 2/1m, enterprise: 2/1m } }
"""


def get(client: httpx.Client, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """GET and check the rate-limit headers of the answer."""
    response = client.get(path, headers=headers)
    rate_limit_headers(response)
    return response


def keys(redis_client: redis.Redis, pattern: str) -> list[str]:
    """Key names matching ``pattern``, decoded."""
    return sorted(k.decode() for k in redis_client.scan_iter(match=pattern))


# --- headers, tiers and identities -------------------------------------------------------


def test_headers_describe_the_callers_tier(serve: Serve) -> None:
    """Each tier sees its own quotas; a tier with two rates gets one item per rate; the
    legacy trio repeats the most restrictive item."""
    client = serve()
    alice = rate_limit_headers(get(client, "/api/items", ALICE))
    assert alice.policies == {"api": alice.policies["api"]}
    assert (alice.policies["api"].q, alice.policies["api"].w) == (100, 60)
    assert alice.limits["api"].r == 99
    assert 0 < alice.limits["api"].t <= 120
    assert alice.legacy == (100, 99, alice.limits["api"].t)

    bob = rate_limit_headers(get(client, "/api/items", BOB))
    assert {k: (v.q, v.w) for k, v in bob.policies.items()} == {
        "api/1m": (1000, 60),
        "api/1h": (20000, 3600),
    }
    assert (bob.limits["api/1m"].r, bob.limits["api/1h"].r) == (999, 19999)
    assert bob.legacy is not None and bob.legacy[:2] == (1000, 999)

    carol = rate_limit_headers(get(client, "/api/items", CAROL))
    assert carol.policies["api"].q == 10000


def test_every_matching_limit_is_reported(serve: Serve) -> None:
    """A search request is under both the api and the search limits, decided together."""
    parsed = rate_limit_headers(get(serve(), "/api/search", ALICE))
    assert set(parsed.policies) == {"api", "search"}
    assert (parsed.policies["search"].q, parsed.policies["search"].w) == (10, 1)
    assert parsed.limits["api"].r == 99


def test_users_are_counted_apart(serve: Serve) -> None:
    """Alice's requests do not use Bob's quota, and each request is counted once."""
    client = serve()
    for expected in (99, 98, 97):
        assert rate_limit_headers(get(client, "/api/items", ALICE)).limits["api"].r == expected
    assert rate_limit_headers(get(client, "/api/items", BOB)).limits["api/1m"].r == 999


def test_paths_without_limits_carry_no_headers(serve: Serve) -> None:
    """Only limited responses advertise limits."""
    response = get(serve(), "/healthz", ALICE)
    assert response.status_code == 200
    assert "ratelimit" not in response.headers
    assert "ratelimit-policy" not in response.headers
    assert "x-ratelimit-limit" not in response.headers


def test_legacy_headers_can_be_switched_off(serve: Serve) -> None:
    """legacy_headers=False leaves only the draft's fields."""
    response = get(serve(legacy_headers=False), "/api/items", ALICE)
    assert "ratelimit" in response.headers
    assert "x-ratelimit-limit" not in response.headers


def test_anonymous_callers_are_counted_by_ip_in_the_lowest_tier(
    serve: Serve, redis_client: redis.Redis
) -> None:
    """No credentials: the free tier's quota, one shared counter per client IP."""
    client = serve()
    first = rate_limit_headers(get(client, "/api/items"))
    second = rate_limit_headers(get(client, "/api/items"))
    assert first.policies["api"].q == 100
    assert (first.limits["api"].r, second.limits["api"].r) == (99, 98)
    assert keys(redis_client, "rl:api:*") == ["rl:api:{i=127.0.0.1}:1m:sw"]
    # An authenticated caller is counted by user, not by the shared address.
    get(client, "/api/items", ALICE)
    assert "rl:api:{u=alice}:1m:sw" in keys(redis_client, "rl:api:*")


def test_host_matchers_see_the_host_header(
    serve: Serve, write_policy: Callable[[str], Path]
) -> None:
    """A limit with hosts: applies to requests for that host only (port and case ignored)."""
    text = (
        SMALL_POLICY
        + """
  - name: partner
    match: { hosts: [partner.example.com] }
    app: { tiers: { free: 50/1m, pro: 50/1m, enterprise: 50/1m } }
"""
    )
    client = serve(policy=write_policy(text))
    there = rate_limit_headers(
        get(client, "/api/items", {**ALICE, "Host": "Partner.Example.com:8443"})
    )
    assert set(there.policies) == {"api", "partner"}
    elsewhere = rate_limit_headers(get(client, "/api/items", ALICE))
    assert set(elsewhere.policies) == {"api"}


# --- refusals ----------------------------------------------------------------------------


def test_over_the_limit_is_a_429_problem_with_a_retry_after_that_is_never_early(
    serve: Serve, write_policy: Callable[[str], Path], redis_server: RedisServer
) -> None:
    """The 4th request of a 3/1m limit is refused before the app runs: RFC 9457 body,
    Retry-After in whole seconds rounded up from the limiter's own wait."""
    path = write_policy(SMALL_POLICY)
    client = serve(policy=path)
    for _ in range(3):
        assert get(client, "/api/items", ALICE).status_code == 200
    refused = get(client, "/api/items", ALICE)
    body = problem(refused, 429)
    assert body["type"] == QUOTA_EXCEEDED
    assert body["limit"] == "api"
    assert body["violated-policies"] == ["api"]
    assert "free tier" in str(body["detail"])
    parsed = rate_limit_headers(refused)
    assert parsed.limits == {"api": parsed.limits["api"]}
    assert parsed.limits["api"].r == 0
    assert parsed.retry_after is not None and body["retry-after"] == parsed.retry_after
    with Limiter.from_policy(path, redis_url=redis_server.url) as limiter:
        real = limiter.peek("api", "alice", tier="free").retry_after
    assert real is not None
    # Looked up after the response, so the real wait can only have shrunk since.
    assert real <= parsed.retry_after <= math.ceil(real) + 1
    assert parsed.legacy == (3, 0, parsed.limits["api"].t)


def test_a_refusal_lists_only_the_violated_rate(
    serve: Serve, write_policy: Callable[[str], Path]
) -> None:
    """Bob's 5/1m rate runs out while 7/1h still has room: only the spent rate is in
    RateLimit, so Retry-After is not earlier than any reset it states."""
    client = serve(policy=write_policy(SMALL_POLICY))
    for _ in range(5):
        assert get(client, "/api/items", BOB).status_code == 200
    refused = get(client, "/api/items", BOB)
    body = problem(refused, 429)
    parsed = rate_limit_headers(refused)
    assert set(parsed.policies) == {"api/1m", "api/1h"}
    assert set(parsed.limits) == {"api/1m"}
    assert body["violated-policies"] == ["api/1m"]


def test_per_ip_limits_use_the_client_ip_even_for_users(
    serve: Serve, write_policy: Callable[[str], Path], redis_client: redis.Redis
) -> None:
    """login is per: ip: Alice and an anonymous caller from the same address share it."""
    client = serve(policy=write_policy(SMALL_POLICY))
    assert client.post("/login", headers=ALICE).status_code == 200
    assert client.post("/login").status_code == 200
    refused = client.post("/login", headers=BOB)
    problem(refused, 429)
    rate_limit_headers(refused)
    assert keys(redis_client, "rl:login:*") == ["rl:login:{i=127.0.0.1}:1m:log"]


# --- client IPs --------------------------------------------------------------------------


def test_forwarded_for_is_believed_only_from_trusted_proxies(
    serve: Serve, redis_client: redis.Redis
) -> None:
    """Behind a trusted proxy each forwarded client has its own counter, and an address a
    client prepends itself is skipped; without trust the header changes nothing."""
    trusting = serve(trusted_proxies=["127.0.0.1"])
    one = {"X-Forwarded-For": "198.51.100.7"}
    other = {"X-Forwarded-For": "198.51.100.8"}
    spoofed = {"X-Forwarded-For": "6.6.6.6, 198.51.100.7"}
    assert rate_limit_headers(get(trusting, "/api/items", one)).limits["api"].r == 99
    assert rate_limit_headers(get(trusting, "/api/items", other)).limits["api"].r == 99
    assert rate_limit_headers(get(trusting, "/api/items", spoofed)).limits["api"].r == 98
    assert keys(redis_client, "rl:api:*") == [
        "rl:api:{i=198.51.100.7}:1m:sw",
        "rl:api:{i=198.51.100.8}:1m:sw",
    ]


def test_forwarded_for_from_an_untrusted_peer_is_ignored(
    serve: Serve, redis_client: redis.Redis
) -> None:
    """With no trusted proxies, rotating X-Forwarded-For does not buy a fresh quota."""
    client = serve()
    for n, expected in ((1, 99), (2, 98), (3, 97)):
        forwarded = {"X-Forwarded-For": f"198.51.100.{n}"}
        assert rate_limit_headers(get(client, "/api/items", forwarded)).limits["api"].r == expected
    assert keys(redis_client, "rl:api:*") == ["rl:api:{i=127.0.0.1}:1m:sw"]


def test_cf_connecting_ip_only_behind_cloudflare(serve: Serve, redis_client: redis.Redis) -> None:
    """CF-Connecting-IP names the client when the app is told it is behind Cloudflare (and
    the peer is trusted); otherwise X-Forwarded-For decides."""
    headers = {"CF-Connecting-IP": "2001:db8::7", "X-Forwarded-For": "198.51.100.9"}
    get(serve(trusted_proxies=["127.0.0.1"], behind_cloudflare=True), "/api/items", headers)
    # The IPv6 client is counted by its /64 (clients.ipv6_prefix), like the Worker counts it.
    assert keys(redis_client, "rl:api:*") == ["rl:api:{i=2001%3Adb8%3A%3A%2F64}:1m:sw"]
    redis_client.flushall()
    get(serve(trusted_proxies=["127.0.0.1"]), "/api/items", headers)
    assert keys(redis_client, "rl:api:*") == ["rl:api:{i=198.51.100.9}:1m:sw"]


# --- shadow mode -------------------------------------------------------------------------


def test_shadow_limits_count_but_never_refuse_or_show(
    serve: Serve, redis_client: redis.Redis
) -> None:
    """exports (free 5/1h) is in shadow mode: the 7 requests all pass, its counter holds the
    5 it would have admitted, and no header mentions it."""
    client = serve()
    for _ in range(7):
        response = get(client, "/api/v1/exports/report", ALICE)
        assert response.status_code == 200
        assert response.text == "report,0\nreport,1\nreport,2\n"
        assert set(rate_limit_headers(response).policies) == {"api"}
    (key,) = keys(redis_client, "rl:exports:*")
    assert key == "rl:exports:{u=alice}:1h:log"
    assert redis_client.zcard(key) == 5


# --- Redis down --------------------------------------------------------------------------


def test_redis_down_fails_open_or_closed_per_limit(
    serve: Serve, fresh_redis_server: RedisServer
) -> None:
    """The example policy fails open for the API and closed for login: with Redis stopped,
    the API still answers (quotas advertised, no invented remaining counts) and login is a
    503 problem with a Retry-After."""
    client = serve(redis_url=fresh_redis_server.url)
    assert get(client, "/api/items", ALICE).status_code == 200
    fresh_redis_server.stop()
    for _ in range(4):  # before and after the circuit breaker opens
        open_ = get(client, "/api/items", ALICE)
        assert open_.status_code == 200
        parsed = rate_limit_headers(open_)
        assert parsed.policies["api"].q == 100
        assert parsed.limits == {}
        closed = client.post("/login")
        body = problem(closed, 503)
        assert body["type"] == TEMPORARY_REDUCED_CAPACITY
        assert body["violated-policies"] == ["login"]
        assert rate_limit_headers(closed).retry_after == 1


def test_redis_down_with_a_fail_closed_policy(
    serve: Serve, write_policy: Callable[[str], Path], fresh_redis_server: RedisServer
) -> None:
    """on_redis_error: deny for the whole app refuses every limited request, never raises."""
    text = SMALL_POLICY.replace("timeout: 2s", "timeout: 2s, on_redis_error: deny", 1)
    client = serve(policy=write_policy(text), redis_url=fresh_redis_server.url)
    fresh_redis_server.kill()
    problem(get(client, "/api/items", ALICE), 503)
    assert get(client, "/healthz").status_code == 200


# --- the FastAPI dependency --------------------------------------------------------------


@pytest.mark.parametrize("stack", [FASTAPI])
def test_per_route_dependency_counts_its_named_limit(
    serve: Serve, write_policy: Callable[[str], Path]
) -> None:
    """/reports/{name} draws 5 units of the search budget (10/1h): two reports, then a 429
    problem from the exception handler, with the same headers as the middleware's."""
    client = serve(policy=write_policy(SMALL_POLICY))
    first = get(client, "/reports/q1", ALICE)
    assert first.json() == {"report": "q1"}
    assert rate_limit_headers(first).limits["search"].r == 5
    assert get(client, "/reports/q2", ALICE).status_code == 200
    refused = get(client, "/reports/q3", ALICE)
    body = problem(refused, 429)
    assert body["limit"] == "search"
    assert rate_limit_headers(refused).retry_after is not None


# --- spellings of a path -----------------------------------------------------------------


def raw_request(base_url: str, method: str, target: str) -> tuple[int, dict[str, str]]:
    """Send ``method target`` with the target's exact bytes (httpx would re-encode it)."""
    url = httpx.URL(base_url)
    assert url.host is not None and url.port is not None
    with socket.create_connection((url.host, url.port), timeout=10) as sock:
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: {url.host}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n".encode("latin-1")
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
    return status, headers


@pytest.mark.parametrize("target", ["/l%6Fgin", "/%6cogin", "/./login", "/login/"])
def test_encoded_login_spellings_share_the_login_limit(
    serve: Serve, write_policy: Callable[[str], Path], target: str
) -> None:
    """``/l%6Fgin`` reaches the login handler, so it is counted by the login limit: the
    third attempt in any spelling mix is refused (login allows 2 per minute). Spellings a
    router answers with 404 or a redirect (``/./login`` in Starlette) count all the same:
    a proxy in front may have served them as /login."""
    client = serve(policy=write_policy(SMALL_POLICY))
    base = str(client.base_url)
    statuses = [raw_request(base, "POST", t)[0] for t in ("/login", target, target, "/login")]
    assert statuses[0] == 200, statuses
    assert statuses[2:] == [429, 429], statuses


@pytest.mark.parametrize("target", ["/%61pi/items", "/api%2Fitems", "//api/items"])
def test_encoded_api_spellings_are_counted(serve: Serve, target: str) -> None:
    """Spellings that the API routes serve (or that a proxy in front would merge into
    them) carry the api limit's headers and use up its quota."""
    client = serve()
    status, headers = raw_request(str(client.base_url), "GET", target)
    assert "ratelimit-policy" in headers, (status, headers)
    assert '"api"' in headers["ratelimit-policy"]


def test_head_counts_against_a_get_limit(serve: Serve, write_policy: Callable[[str], Path]) -> None:
    """HEAD runs the GET handler (Flask, Starlette routes), so a GET-only limit counts it;
    FastAPI answers 405 but the attempt counts all the same."""
    text = SMALL_POLICY.replace(
        "match: { paths: [/api/search] }", "match: { paths: [/api/search], methods: [GET] }"
    )
    client = serve(policy=write_policy(text))
    headers = {"x-api-key": "key-alice"}
    statuses = [client.head("/api/search", headers=headers).status_code for _ in range(4)]
    assert 429 not in statuses[:3] and statuses[3] == 429, statuses  # api: 3/1m, free tier
