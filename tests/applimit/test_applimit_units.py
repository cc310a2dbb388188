"""Unit tests of the pure parts: public surface, keys, the core's plans, decisions, the
circuit breaker, URL parsing and the assembled script. No Redis needed."""

from __future__ import annotations

import math
import pickle

import edgegen_policy as policy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import applimit
from applimit import ConfigurationError, LimitResult, _keys, _script
from applimit._breaker import BreakerState, CircuitBreaker
from applimit._clients import parse_sentinel_url
from applimit._decision import combine
from applimit._plan import Core
from applimit._rules import compile_policy

POLICY_TEXT = """
version: 1
tiers: [free, pro]
app: {key_prefix: rl}
limits:
  - name: api
    match: {path_prefix: /api/}
    app: {tiers: {free: 100/1m, pro: [1000/1m, 20000/1h, 5000/1m]}}
  - name: "we{ird}: name"
    match: {paths: [/w]}
    app: {per: ip, algorithm: gcra, burst: 5, tiers: {free: 10/1s}}
"""
POLICY = policy.loads(POLICY_TEXT)


def test_public_surface_is_pinned() -> None:
    """applimit's public names are exactly these; anything else is private."""
    assert sorted(applimit.__all__) == [
        "ApplimitError",
        "AsyncLimiter",
        "AsyncOverrides",
        "BreakerState",
        "Caller",
        "ConfigurationError",
        "Decision",
        "DecisionEvent",
        "EXEMPT",
        "EventLogObserver",
        "InvalidArgumentError",
        "LimitResult",
        "Limiter",
        "Observer",
        "Outcome",
        "Override",
        "OverrideChange",
        "Overrides",
        "OvershootObserver",
        "RateLimited",
        "Refusal",
        "RequestInfo",
        "RequestMatch",
        "UnknownLimitError",
        "UnknownTierError",
        "rate_limited",
    ]
    for name in applimit.__all__:
        assert getattr(applimit, name).__doc__, f"{name} has no docstring"


def test_same_methods_on_both_limiters() -> None:
    """Limiter and AsyncLimiter offer the same decision methods with the same parameters;
    the async ones return a coroutine (the decision's own: no second one around it), and
    reset is a coroutine function."""
    import inspect

    limiter = applimit.AsyncLimiter(POLICY, redis_url="memory://units")
    for method in ("hit", "peek", "check_request", "reset"):
        sync = inspect.signature(getattr(applimit.Limiter, method))
        async_ = inspect.signature(getattr(applimit.AsyncLimiter, method))
        assert list(sync.parameters) == list(async_.parameters), method
    assert inspect.iscoroutinefunction(applimit.AsyncLimiter.reset)
    for awaitable in (
        limiter.hit("api", "alice"),
        limiter.peek("api", "alice"),
        limiter.check_request("GET", "/api/x", "alice"),
    ):
        assert inspect.iscoroutine(awaitable)
        assert inspect.getcoroutinelocals(awaitable)["prepared"].checks
        awaitable.close()


# --- keys --------------------------------------------------------------------------------


@settings(max_examples=500)
@given(st.text(max_size=200), st.text(max_size=200))
def test_identity_tags_never_collide_and_stay_braces_free(a: str, b: str) -> None:
    """Different identities get different tags; a tag has no braces and is bounded."""
    tag_a, tag_b = _keys.identity_tag(_keys.USER, a), _keys.identity_tag(_keys.USER, b)
    assert (tag_a == tag_b) == (a == b)
    for tag in (tag_a, tag_b):
        assert "{" not in tag and "}" not in tag and ":" not in tag
        assert len(tag) <= 2 + _keys.MAX_ESCAPED


def test_tags_of_long_identities_are_digests_and_kinds_differ() -> None:
    """Long identities are hashed (bounded keys); a user and an IP never share a tag."""
    long = _keys.identity_tag(_keys.USER, "x" * 10_000)
    assert long.startswith("u#") and len(long) == 24
    assert _keys.identity_tag(_keys.USER, "1.2.3.4") != _keys.identity_tag(_keys.IP, "1.2.3.4")
    # An escaped form can never look like a digest form: '#' is always escaped.
    assert _keys.identity_tag(_keys.USER, "#abc") == "u=%23abc"


def test_ip_addresses_have_one_spelling() -> None:
    """IPv6 spellings and IPv4-mapped addresses count as the same client; IPv6 clients
    are counted per /64 (clients.ipv6_prefix), or per address with 128."""

    def key(core: Core, ip: str) -> str:
        return core.for_limit("hit", "we{ird}: name", None, None, 1, ip=ip).calls[0].keys[0]

    core = Core(compile_policy(POLICY), cluster=False)
    assert (
        key(core, "2001:DB8:0::1") == key(core, "2001:db8::ffff:1") != key(core, "2001:db8:0:1::1")
    )
    assert "{i=2001%3Adb8%3A%3A%2F64}" in key(core, "2001:DB8::1")
    assert key(core, "::ffff:192.0.2.1") == key(core, "192.0.2.1")
    assert "{i=not%20an%20ip}" in key(core, "not an ip")
    text = POLICY_TEXT.replace("version: 1", "version: 1\nclients: {ipv6_prefix: 128}")
    per_address = Core(compile_policy(policy.loads(text)), cluster=False)
    assert key(per_address, "2001:DB8:0::1") != key(per_address, "2001:db8::ffff:1")
    assert "{i=2001%3Adb8%3A%3A1}" in key(per_address, "2001:DB8:0::1")


def test_keys_carry_one_hash_tag_whatever_the_limit_name() -> None:
    """A limit name with braces and colons is escaped: the identity is the only tag."""
    core = Core(compile_policy(POLICY), cluster=True)
    plan = core.for_limit("hit", "we{ird}: name", None, None, 1, ip="203.0.113.9")
    [key] = plan.calls[0].keys
    assert key == "rl:we%7Bird%7D%3A%20name:{i=203.0.113.9}:1s:gcra"


# --- the core's plans --------------------------------------------------------------------


def test_one_call_for_every_rate_and_server_time_in_production() -> None:
    """A pro request is one script call with one check per period; the time argument is
    empty, so the script reads the server's clock; equal periods keep the smaller quota."""
    core = Core(compile_policy(POLICY), cluster=True)
    plan = core.for_request(
        "hit", "GET", "/api/x?q=1", "alice", tier="pro", cost=1, ip=None, host=None
    )
    [call] = plan.calls
    assert call.keys == ("rl:api:{u=alice}:1m:sw", "rl:api:{u=alice}:1h:sw")
    mode, now, nonce, slack, count = call.args[:5]
    assert (mode, now, slack, count) == ("hit", "", "0", "2")
    assert len(nonce) == 12
    assert call.args[5:] == (
        "sliding_window 1000 60000000 1 0 0",
        "sliding_window 20000 3600000000 1 0 0",
    )


def test_test_clock_is_sent_only_when_configured() -> None:
    """Only a limiter built with test_clock sends a time, with expiry slack."""
    core = Core(compile_policy(POLICY), cluster=False, test_clock=lambda: 12.5)
    call = core.for_limit("peek", "api", "alice", None, 1).calls[0]
    assert call.args[1] == "12500000"
    assert call.args[3] == "600000"


def test_unlimited_plans_have_no_calls() -> None:
    """A request no limit matches needs no round trip."""
    core = Core(compile_policy(POLICY), cluster=False)
    plan = core.for_request("hit", "GET", "/else", "a", tier=None, cost=1, ip=None, host=None)
    assert plan.calls == () and plan.checks == ()


def test_policy_errors_the_app_cannot_work_with() -> None:
    """What policy.check says stops the app is a ConfigurationError that names the field:
    a tier the policy does not list, a limit name given twice (names name Redis keys)."""
    bad = policy.loads(
        "version: 1\ntiers: [free]\nlimits:\n  - name: a\n    app: {tiers: {gold: 1/1s}}\n"
    )
    with pytest.raises(ConfigurationError, match=r"limits\[0\]\.app\.tiers.*tier 'gold'"):
        compile_policy(bad)
    twice = policy.loads(
        "version: 1\nlimits:\n"
        "  - name: a\n    app: {tiers: {default: 1/1s}}\n"
        "  - name: a\n    app: {tiers: {default: 2/1s}}\n"
    )
    with pytest.raises(ConfigurationError, match=r"limits\[1\]\.name.*'a'"):
        compile_policy(twice)


def test_degraded_decisions_follow_each_limits_failure_policy() -> None:
    """Fail-open limits allow, fail-closed deny with a retry_after, shadow never denies."""
    loaded = policy.loads(
        """
version: 1
app: {on_redis_error: allow}
limits:
  - {name: a, app: {tiers: {default: 1/1s}}}
  - {name: b, app: {on_redis_error: deny, tiers: {default: 1/1s}}}
  - {name: c, app: {on_redis_error: deny, enforce: false, tiers: {default: 1/1s}}}
"""
    )
    core = Core(compile_policy(loaded), cluster=False)
    plan = core.for_request("hit", "GET", "/", "u", tier=None, cost=1, ip=None, host=None)
    decision = plan.degraded(1.0)
    assert decision.degraded and not decision.allowed
    assert [r.name for r in decision.denied_by] == ["b"]
    assert decision.retry_after == 1.0
    only_open = core.prepare("hit", [c for c in plan.checks if c.rule.name != "b"]).degraded(1.0)
    assert only_open.allowed and only_open.retry_after is None


# --- decisions ---------------------------------------------------------------------------


def _result(
    name: str, *, allowed: bool, remaining: int, retry: float | None, shadow: bool = False
) -> LimitResult:
    return LimitResult(
        name, "free", "gcra", 10, 60.0, allowed, allowed, remaining, 5.0, retry, shadow
    )


def test_decision_reports_the_most_restrictive_result() -> None:
    """Denied: the longest wait binds; allowed: the fewest remaining; shadow never binds
    while an enforced result exists."""
    denied = combine(
        [
            _result("a", allowed=False, remaining=0, retry=2.0),
            _result("b", allowed=False, remaining=0, retry=9.0),
            _result("c", allowed=True, remaining=3, retry=None),
        ]
    )
    assert not denied.allowed and denied.policy == "b" and denied.retry_after == 9.0
    allowed = combine(
        [
            _result("a", allowed=True, remaining=4, retry=None),
            _result("s", allowed=False, remaining=0, retry=1.0, shadow=True),
            _result("b", allowed=True, remaining=2, retry=None),
        ]
    )
    assert allowed.allowed and allowed.policy == "b" and allowed.retry_after is None
    never = combine([_result("a", allowed=False, remaining=0, retry=math.inf)])
    assert never.retry_after == math.inf


# --- circuit breaker ---------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_probes_once_and_closes() -> None:
    """Three failures open it; after the cooldown exactly one probe is let through at a
    time; a failed probe reopens it; a successful one closes it."""
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=3, cooldown=0.25, probe_timeout=1.0, clock=clock)
    for _ in range(3):
        assert breaker.allow()
        breaker.failure(ConnectionError("down"))
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 0.25
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN
    assert not breaker.allow(), "a second caller must not probe at the same time"
    breaker.failure(ConnectionError("down"))
    assert breaker.state is BreakerState.OPEN and not breaker.allow()
    clock.now += 0.25
    assert breaker.allow()
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_a_lost_probe_does_not_wedge_the_breaker() -> None:
    """A probe that never reports (its caller was cancelled) is replaced after probe_timeout."""
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=1, cooldown=0.25, probe_timeout=1.0, clock=clock)
    breaker.failure(ConnectionError("down"))
    clock.now += 0.3
    assert breaker.allow()
    clock.now += 0.5
    assert not breaker.allow()
    clock.now += 0.6
    assert breaker.allow()


# --- URLs and the script -----------------------------------------------------------------


def test_sentinel_urls() -> None:
    """Several sentinels, credentials, the service and the database."""
    sentinels, service, options = parse_sentinel_url(
        "redis+sentinel://app:s%40cret@10.0.0.1,10.0.0.2:26380,[::1]:26381/my-master/2"
    )
    assert sentinels == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("::1", 26381)]
    assert service == "my-master"
    assert options == {"username": "app", "password": "s@cret", "db": 2}
    with pytest.raises(ConfigurationError, match="names no service"):
        parse_sentinel_url("redis+sentinel://h:26379")


def test_each_algorithm_file_opens_with_its_contract() -> None:
    """The shipped Lua files document KEYS/ARGV/returns, and the script holds them all."""
    for name in _script.PARTS:
        text = _script._read(name)
        head = text.split("\n\n", 1)[0]
        assert head.startswith(f"-- {name}:"), name
        if name != "common.lua":
            assert "KEYS" in head and "ARGV" in head and "Return" in head, name
        assert text in _script.SOURCE
    assert len(_script.SHA) == 40


_FLOATS = st.floats(allow_nan=False) | st.just(math.inf)


@given(
    st.tuples(
        st.text(max_size=5),
        st.text(max_size=5),
        st.sampled_from(["sliding_log", "sliding_window", "gcra"]),
        st.integers(min_value=0),
        _FLOATS,
        st.booleans(),
        st.booleans(),
        st.integers(min_value=0),
        _FLOATS,
        st.none() | _FLOATS,
        st.booleans(),
    ),
    st.booleans(),
    st.integers(min_value=0),
    st.booleans(),
)
def test_the_fast_constructors_build_the_same_frozen_objects(
    fields: tuple[object, ...], allowed: bool, remaining: int, degraded: bool
) -> None:
    """make_result and make_decision (the hot path's constructors, which set the slots
    directly) build objects equal to the classes' own, field by field, and as frozen."""
    import dataclasses

    from applimit import Decision
    from applimit._decision import make_decision, make_result

    fast = make_result(*fields)  # type: ignore[arg-type]
    slow = LimitResult(*fields)  # type: ignore[arg-type]
    assert dataclasses.astuple(fast) == dataclasses.astuple(slow) == fields
    assert fast == slow and repr(fast) == repr(slow) and hash(fast) == hash(slow)
    # Built as a plain class with the same slots, then made the frozen class itself.
    assert type(fast) is LimitResult
    assert pickle.loads(pickle.dumps(fast)) == slow
    assert dataclasses.replace(fast, remaining=7) == dataclasses.replace(slow, remaining=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.remaining = 1  # type: ignore[misc]
    decision_fields = (allowed, 3, remaining, 1.5, None, "api", (fast,), degraded)
    made = make_decision(*decision_fields)
    assert made == Decision(*decision_fields) and type(made) is Decision
    assert hash(made) == hash(Decision(*decision_fields))
    assert pickle.loads(pickle.dumps(made)) == made
    assert tuple(getattr(made, f.name) for f in dataclasses.fields(Decision)) == decision_fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.allowed = not allowed  # type: ignore[misc]


def test_only_lists_tells_plain_script_replies_from_anything_else() -> None:
    """The wires' one-pass check before looking at each reply: true only when every reply
    is a plain list (an error reply, a list subclass such as a push, or None is not)."""
    import redis

    from applimit._protocol import only_lists

    class Pushed(list):  # type: ignore[type-arg]
        pass

    assert only_lists([[1, 2], [3]]) and only_lists([])
    assert not only_lists([[1], redis.exceptions.ResponseError("WRONGTYPE")])
    assert not only_lists([[1], Pushed([b"invalidate"])])
    assert not only_lists([None])


@settings(max_examples=50, deadline=None)
@given(
    allowed=st.booleans(),
    shadow=st.booleans(),
    remaining=st.integers(-5, 10),
    retry=st.one_of(st.none(), st.floats(0, 100), st.just(math.inf)),
    degraded=st.booleans(),
)
def test_a_single_result_is_the_decision_it_describes(
    allowed: bool, shadow: bool, remaining: int, retry: float | None, degraded: bool
) -> None:
    """``single`` (the one-check shortcut, also combine's for one result) is the
    decision that result describes: admitted when it admits or only shadows, its quota,
    remaining and reset, and a retry only when denied (never when it cannot tell)."""
    from applimit import Decision
    from applimit._decision import single

    result = LimitResult(
        "api", "free", "gcra", 10, 60.0, allowed, allowed, remaining, 1.5, retry, shadow
    )
    admits = allowed or shadow
    expected = Decision(
        admits,
        10,
        remaining,
        1.5,
        None if admits else (math.inf if retry is None else retry),
        "api",
        (result,),
        degraded,
    )
    assert single(result, degraded) == expected
    assert combine((result,), degraded=degraded) == expected
