"""count_when: a limit checked before the work and counted only for the responses it names.

``hit`` and ``check_request`` check a count_when limit and count nothing for it (they still
count every other limit, all or nothing); ``record`` and ``record_request`` count a
response whose status the policy lists. Each test runs on the standalone server, the
cluster and the memory backend, through Limiter and AsyncLimiter (conftest.make_limiter).
The bound under concurrency is checked by real threads on a real server at the end.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import edgegen_policy as policy
import pytest
from harness import RedisServer
from limiter_support import MakeLimiter

from applimit import (
    ConfigurationError,
    InvalidArgumentError,
    Limiter,
    RequestMatch,
    rate_limited,
)
from applimit._rules import compile_policy
from applimit.fastapi import RateLimit

IP = "203.0.113.7"


def login_policy(algorithm: str = "sliding_log", statuses: str = "[401, 403]") -> str:
    """A login limit that counts failures only, and an API limit that counts everything
    on the same path."""
    burst = ", burst: 3" if algorithm == "gcra" else ""
    return f"""
version: 1
tiers: [free]
app: {{ timeout: 2s }}
limits:
  - name: login
    match: {{ paths: [/login], methods: [POST] }}
    count_when: {{ status: {statuses} }}
    app: {{ per: ip, algorithm: {algorithm}{burst}, tiers: {{ free: 3/1m }} }}
  - name: api
    match: {{ path_prefix: / }}
    app: {{ per: ip, algorithm: sliding_log, tiers: {{ free: 100/1m }} }}
"""


def remaining(decision: object, name: str) -> int:
    """The remaining count of limit ``name`` in a decision."""
    results = [r for r in decision.results if r.name == name]  # type: ignore[attr-defined]
    assert len(results) == 1, results
    return int(results[0].remaining)


@pytest.mark.parametrize("algorithm", ["sliding_log", "sliding_window", "gcra"])
async def test_hit_checks_and_record_counts_only_listed_statuses(
    make_limiter: MakeLimiter, algorithm: str
) -> None:
    """hit() never counts a count_when limit; record() counts 401 and 403, not 200 or 500;
    once three failures are counted, hit() refuses and record() adds nothing more."""
    limiter = make_limiter(login_policy(algorithm))
    for _ in range(5):
        checked = await limiter.hit("login", None, ip=IP)
        assert checked.allowed
        assert not checked.results[0].consumed
        assert checked.remaining == 3
    for status in (200, 204, 302, 404, 500):
        nothing = await limiter.record("login", None, status, ip=IP)
        assert nothing.allowed and nothing.results == ()
    assert (await limiter.peek("login", None, ip=IP)).remaining == 3
    for expected, status in ((2, 401), (1, 403), (0, 401)):
        counted = await limiter.record("login", None, status, ip=IP)
        assert counted.allowed and counted.results[0].consumed
        assert counted.remaining == expected
    refused = await limiter.hit("login", None, ip=IP)
    assert not refused.allowed
    assert refused.retry_after is not None and refused.retry_after > 0
    spent = await limiter.record("login", None, 401, ip=IP)
    assert not spent.allowed and not spent.results[0].consumed
    # Another caller is untouched.
    assert (await limiter.hit("login", None, ip="198.51.100.1")).remaining == 3


async def test_check_request_counts_other_limits_and_refuses_all_or_nothing(
    make_limiter: MakeLimiter,
) -> None:
    """check_request counts the plain limit and only checks the count_when one;
    record_request counts the count_when limits (never the plain one); a request refused
    by a spent count_when limit consumes nothing of the plain limit."""
    limiter = make_limiter(login_policy())
    first = await limiter.check_request("POST", "/login", None, ip=IP)
    assert first.allowed
    assert remaining(first, "login") == 3
    assert remaining(first, "api") == 99
    recorded = await limiter.record_request("POST", "/login", None, 401, ip=IP)
    assert [r.name for r in recorded.results] == ["login"]
    assert remaining(recorded, "login") == 2
    # A path only the plain limit matches records nothing.
    other = await limiter.record_request("GET", "/items", None, 401, ip=IP)
    assert other.allowed and other.results == ()
    # Spellings the router reads as /login are counted as /login.
    assert (
        remaining(await limiter.record_request("POST", "/x/../login", None, 403, ip=IP), "login")
        == 1
    )
    assert remaining(await limiter.check_request("POST", "/login", None, ip=IP), "login") == 1
    await limiter.record_request("POST", "/%6cogin", None, 401, ip=IP)
    refused = await limiter.check_request("POST", "/login", None, ip=IP)
    assert not refused.allowed
    assert [r.name for r in refused.denied_by] == ["login"]
    # The refused request consumed nothing of api: 100 - 2 admitted requests.
    assert remaining(await limiter.peek("api", None, ip=IP), "api") == 98


@pytest.mark.parametrize(
    ("statuses", "counted", "not_counted"),
    [
        ("4xx", [400, 401, 429, 499], [200, 399, 500]),
        ("[500-503, 401]", [401, 500, 503], [400, 504, 200]),
        ("429", [429], [428, 430]),
    ],
)
async def test_status_classes_and_ranges(
    make_limiter: MakeLimiter, statuses: str, counted: list[int], not_counted: list[int]
) -> None:
    """Classes and ranges count exactly the statuses they name."""
    limiter = make_limiter(login_policy(statuses=statuses).replace("3/1m", "50/1m"))
    for status in not_counted:
        assert (await limiter.record("login", None, status, ip=IP)).results == ()
    for status in counted:
        assert (await limiter.record("login", None, status, ip=IP)).results[0].consumed
    assert (await limiter.peek("login", None, ip=IP)).remaining == 50 - len(counted)


@pytest.mark.parametrize(
    ("statuses", "how_many"),
    [("4xx", 100), ("[500-503, 401]", 5), ("429", 1), ("[401, 4xx, 5xx]", 200)],
)
def test_the_policy_and_the_compiled_rule_count_the_same_statuses(
    statuses: str, how_many: int
) -> None:
    """CountWhen.counts (edgegen's replay, suggest) and AppRule.counts (the limiter) are
    one test (edgegen_policy.status_counts), over the same ranges: every status agrees."""
    loaded = policy.loads(login_policy(statuses=statuses))
    [limit] = [limit for limit in loaded.limits if limit.name == "login"]
    assert limit.count_when is not None
    rule = compile_policy(loaded).by_name["login"]
    assert rule.count_when == limit.count_when.status
    for status in range(100, 600):
        assert rule.counts(status) is limit.count_when.counts(status), status
    assert sum(rule.counts(status) for status in range(100, 600)) == how_many


async def test_record_refuses_what_it_cannot_count(make_limiter: MakeLimiter) -> None:
    """record() of a limit without count_when, or of a status that is not one, is an
    error that says why; nothing is counted."""
    limiter = make_limiter(login_policy())
    with pytest.raises(InvalidArgumentError, match="no count_when"):
        await limiter.record("api", None, 401, ip=IP)
    for status in ("401", 401.0, True, 99, 600, None):
        with pytest.raises(InvalidArgumentError, match="status"):
            await limiter.record("login", None, status, ip=IP)
        with pytest.raises(InvalidArgumentError, match="status"):
            await limiter.record_request("POST", "/login", None, status, ip=IP)
    assert (await limiter.peek("login", None, ip=IP)).remaining == 3
    assert (await limiter.peek("api", None, ip=IP)).remaining == 100


def test_match_names_the_limits_and_whether_responses_count() -> None:
    """Limiter.match, the middleware's one lookup: the limits a request matches and
    whether a count_when limit is among them (what matches() and counts_responses()
    answer apart); None where no limit the middleware applies matches, or limits are off."""
    text = login_policy().replace("path_prefix: / }", "path_prefix: /api/ }")
    with Limiter(policy.loads(text), redis_url="memory://count-when-match") as limiter:
        login = limiter.match("POST", "/x/../login")
        assert login == RequestMatch(("login",), counts_responses=True)
        assert limiter.counts_responses("POST", "/login")
        api = limiter.match("GET", "/api/items", "api.example.com")
        assert api == RequestMatch(("api",), counts_responses=False)
        assert api and limiter.matches("GET", "/api/items")
        assert not limiter.counts_responses("GET", "/api/items")
        assert limiter.match("GET", "/login") is None
        assert not limiter.matches("GET", "/login")
        assert not limiter.counts_responses("GET", "/login")
    with Limiter(policy.loads(text), enabled=False) as off:
        assert off.match("POST", "/login") is None
        assert not off.matches("POST", "/login")
        assert not off.counts_responses("POST", "/login")


def test_count_when_needs_exact_mode() -> None:
    """Approximate mode counts locally before the answer is known: refused, located."""
    text = login_policy().replace(
        "app: { per: ip, algorithm: sliding_log, tiers: { free: 3/1m } }",
        "app: { per: ip, algorithm: gcra, mode: approximate, tiers: { free: 3/1m } }",
    )
    with pytest.raises(policy.PolicyLoadError) as caught:
        policy.loads(text, "login.yaml")
    assert "count_when needs app mode: exact" in str(caught.value)
    assert "login.yaml:" in str(caught.value)


def test_parallel_failures_are_held_to_the_limit_plus_those_in_flight(
    redis_server: RedisServer,
) -> None:
    """16 threads each check, then record a failure, until refused. Exactly the limit's
    worth of failures is counted, and no more requests are admitted than the limit plus
    those in flight: every admission beyond the limit overlapped one still running."""
    limit = 5
    limiter = Limiter(
        policy.loads(login_policy().replace("3/1m", f"{limit}/1m")), redis_url=redis_server.url
    )
    lock = threading.Lock()
    state = {"in_flight": 0, "peak": 0, "admitted": 0, "counted": 0}
    start = threading.Barrier(16)

    def attacker() -> None:
        start.wait()
        while True:
            with lock:
                state["in_flight"] += 1
                state["peak"] = max(state["peak"], state["in_flight"])
            try:
                checked = limiter.check_request("POST", "/login", None, ip=IP)
                if not checked.allowed:
                    return
                with lock:
                    state["admitted"] += 1
                recorded = limiter.record_request("POST", "/login", None, 401, ip=IP)
                if recorded.allowed:
                    with lock:
                        state["counted"] += 1
            finally:
                with lock:
                    state["in_flight"] -= 1

    try:
        with ThreadPoolExecutor(16) as pool:
            for future in [pool.submit(attacker) for _ in range(16)]:
                future.result()
        assert state["counted"] == limit
        assert limit <= state["admitted"] <= limit + state["peak"] - 1
        assert not limiter.check_request("POST", "/login", None, ip=IP).allowed
    finally:
        limiter.close()


def test_helpers_that_never_see_a_status_refuse_count_when_limits() -> None:
    """The FastAPI dependency and rate_limited() cannot record a response's status: a
    count_when limit is refused when they are built, with what to use instead, rather
    than never counted."""
    limiter = Limiter(policy.loads(login_policy()), redis_url="memory://count-when-helpers")
    try:
        with pytest.raises(ConfigurationError, match="RateLimitMiddleware"):
            RateLimit(limiter, "login")
        with pytest.raises(ConfigurationError, match="'login'"):
            RateLimit(limiter)
        with pytest.raises(ValueError, match=r"limiter\.record"):
            rate_limited(limiter, "login", identity=lambda: None, ip=lambda: IP)
        assert RateLimit(limiter, "api").name == "api"
    finally:
        limiter.close()


async def test_a_quota_and_a_concurrency_limit_of_a_count_when_limit(
    make_limiter: MakeLimiter,
) -> None:
    """A count_when limit with a daily quota and a concurrency limit: the check takes the
    slot and counts no quota; the record counts the quota (and the rate) and takes no
    slot; a spent quota refuses the check."""
    limiter = make_limiter(
        """
version: 1
tiers: [free]
app: { timeout: 2s }
limits:
  - name: login
    count_when: { status: 401 }
    app:
      per: ip
      algorithm: sliding_log
      tiers: { free: 10/1m }
      quotas: { free: { day: 2 } }
      concurrency: 1
"""
    )
    checked = await limiter.hit("login", None, ip=IP)
    assert checked.allowed
    by_algorithm = {r.algorithm: (r.consumed, r.remaining) for r in checked.results}
    assert by_algorithm == {
        "sliding_log": (False, 10),
        "quota:day": (False, 2),
        "lease": (True, 0),
    }
    assert not (await limiter.hit("login", None, ip=IP)).allowed
    await limiter.release(checked)
    for expected in (1, 0):
        recorded = await limiter.record("login", None, 401, ip=IP)
        assert {r.algorithm for r in recorded.results} == {"sliding_log", "quota:day"}
        assert [r.remaining for r in recorded.results if r.algorithm == "quota:day"] == [expected]
    refused = await limiter.hit("login", None, ip=IP)
    assert [r.algorithm for r in refused.denied_by] == ["quota:day"]
