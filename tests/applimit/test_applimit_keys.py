"""Keys beyond user and IP: ``per: org`` limits count a key the app names (``keys=``,
``Caller.keys``), in a namespace of their own, together with the per-user limits of the
same request and all or nothing; a caller without the key is counted by client IP.

The contract tests run on both limiters, on one server and on a Redis Cluster (where the
user's and the organisation's keys live in different slots).
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import edgegen_policy as policy
import pytest
from hypothesis import given
from hypothesis import strategies as st
from limiter_support import MakeLimiter

from applimit import InvalidArgumentError, Limiter, RateLimited, _keys, rate_limited
from applimit._plan import Core
from applimit._rules import compile_policy
from applimit.asgi import Caller

POLICY = """
version: 1
app: {key_prefix: kk, timeout: 2s}
limits:
  - name: per-user
    match: {path_prefix: /api/}
    app: {algorithm: sliding_window, tiers: {default: 3/1m}}
  - name: per-org
    match: {path_prefix: /api/}
    app: {per: org, algorithm: sliding_log, tiers: {default: 4/1m}}
  - name: per-key
    match: {paths: [/api/keyed]}
    app: {per: api_key, algorithm: gcra, tiers: {default: 2/1m}}
"""
ACME = {"org": "acme"}


async def test_one_request_counts_per_user_and_per_org(make_limiter: MakeLimiter) -> None:
    """check_request counts the user and the organisation in one decision: users of one
    organisation share its quota, each has their own."""
    limiter = make_limiter(POLICY)
    first = await limiter.check_request("GET", "/api/a", "alice", ip="192.0.2.1", keys=ACME)
    assert first.allowed
    assert {r.name: r.remaining for r in first.results} == {"per-user": 2, "per-org": 3}
    for _ in range(2):
        assert (await limiter.check_request("GET", "/api/a", "alice", keys=ACME)).allowed
    # alice is out of her own quota; the organisation still has one request left.
    denied = await limiter.check_request("GET", "/api/a", "alice", keys=ACME)
    assert not denied.allowed
    assert [r.name for r in denied.results if not r.allowed] == ["per-user"]
    # bob, of the same organisation, spends the last one.
    assert (await limiter.check_request("GET", "/api/a", "bob", keys=ACME)).allowed
    refused = await limiter.check_request("GET", "/api/a", "carol", keys=ACME)
    assert [r.name for r in refused.results if not r.allowed] == ["per-org"]
    # Another organisation's users are counted apart.
    other = await limiter.check_request("GET", "/api/a", "carol", keys={"org": "globex"})
    assert other.allowed


async def test_a_refusal_by_the_org_consumes_nothing_for_the_user(
    make_limiter: MakeLimiter,
) -> None:
    """All or nothing across kinds: when the organisation refuses, the user's own quota is
    left as it was (on a cluster, the consumed part is given back)."""
    limiter = make_limiter(POLICY)
    for user in ("u1", "u2", "u3", "u4"):
        assert (await limiter.check_request("GET", "/api/a", user, keys=ACME)).allowed
    refused = await limiter.check_request("GET", "/api/a", "u5", keys=ACME)
    assert not refused.allowed
    assert (await limiter.peek("per-user", "u5")).remaining == 3


async def test_hit_peek_and_reset_name_the_key_with_keys(make_limiter: MakeLimiter) -> None:
    """hit/peek/reset take the key's value as keys=, in the bucket check_request uses."""
    limiter = make_limiter(POLICY)
    assert (await limiter.hit("per-org", None, keys=ACME)).remaining == 3
    assert (await limiter.check_request("GET", "/api/a", "dave", keys=ACME)).allowed
    assert (await limiter.peek("per-org", "anyone", keys=ACME)).remaining == 2
    assert await limiter.reset("per-org", None, keys=ACME)
    assert (await limiter.peek("per-org", None, keys=ACME)).remaining == 4
    # keys that name other keys than the limit's are ignored, as check_request ignores them.
    assert (await limiter.hit("per-key", None, keys={"api_key": "k-1", "org": "x"})).allowed
    assert (await limiter.peek("per-key", None, keys={"api_key": "k-1"})).remaining == 1


async def test_a_caller_without_the_key_is_counted_by_ip(make_limiter: MakeLimiter) -> None:
    """The safe choice: a per-org limit counts a caller without an org (anonymous, or a
    user whose identify returned none) by client IP, never leaves them unlimited, and never
    in an organisation's bucket."""
    limiter = make_limiter(POLICY)
    address = "198.51.100.7"
    for user in ("erin", None, "frank", None):
        assert (await limiter.check_request("GET", "/api/a", user, ip=address)).allowed
    refused = await limiter.check_request("GET", "/api/a", "grace", ip=address)
    assert [r.name for r in refused.results if not r.allowed] == ["per-org"]
    assert (await limiter.peek("per-org", None, ip=address)).remaining == 0
    # hit without the key counts by ip= too; an organisation's bucket is untouched.
    assert not (await limiter.hit("per-org", "erin", ip=address)).allowed
    assert (await limiter.peek("per-org", None, keys=ACME)).remaining == 4


async def test_hit_without_the_key_or_an_address_is_refused(make_limiter: MakeLimiter) -> None:
    """A per-org limit never takes the identity for the organisation; without keys= and
    ip= there is nothing to count, and the error says what to pass. Empty or non-str key
    values are refused like an empty user id."""
    limiter = make_limiter(POLICY)
    with pytest.raises(InvalidArgumentError, match=r"keys=\{'org': value\}") as error:
        await limiter.hit("per-org", "acme")
    assert error.value.argument == "keys"
    with pytest.raises(InvalidArgumentError, match="keys\\['org'\\] is empty"):
        await limiter.hit("per-org", None, keys={"org": ""})
    with pytest.raises(InvalidArgumentError, match="must be a str"):
        await limiter.check_request("GET", "/api/a", "u", keys={"org": 7})
    with pytest.raises(InvalidArgumentError, match="mapping"):
        await limiter.hit("per-org", None, keys=["org", "acme"])


async def test_kinds_never_share_a_bucket(make_limiter: MakeLimiter) -> None:
    """One string as a user, an organisation, an API key and an address: four buckets,
    each named by its kind in the key."""
    limiter = make_limiter(POLICY)
    same = "10.0.0.1"
    for _ in range(2):
        await limiter.hit("per-key", None, keys={"api_key": same})
    assert (await limiter.peek("per-key", None, keys={"api_key": same})).remaining == 0
    # A read-only view (what a Caller keeps) is the same mapping.
    viewed = MappingProxyType({"api_key": same})
    assert (await limiter.peek("per-key", None, keys=viewed)).remaining == 0
    assert (await limiter.peek("per-key", None, ip=same)).remaining == 2
    assert (await limiter.peek("per-key", None, keys={"api_key": "u=" + same})).remaining == 2
    assert (await limiter.peek("per-org", None, keys={"org": same})).remaining == 4
    assert (await limiter.peek("per-user", same)).remaining == 3
    core = Core(compile_policy(policy.loads(POLICY)), cluster=False)
    assert core.reset_keys("per-key", None, None, keys={"api_key": same}) == [
        "kk:per-key:{k:api_key=10.0.0.1}:1m:gcra"
    ]
    assert core.reset_keys("per-org", None, None, keys={"org": "a{b}:c"}) == [
        "kk:per-org:{k:org=a%7Bb%7D%3Ac}:1m:log"
    ]
    assert core.reset_keys("per-user", same, None) == ["kk:per-user:{u=10.0.0.1}:1m:sw"]


def test_the_decorator_takes_keys() -> None:
    """rate_limited needs keys= for a per-org limit (refused when the function is
    decorated, not when it is called)."""
    loaded = policy.loads(POLICY)
    limiter = Limiter(loaded, redis_url="redis://127.0.0.1:1/0")
    try:
        with pytest.raises(ValueError, match="counts per org; give keys="):
            rate_limited(limiter, "per-org", identity=lambda user, org: user)
    finally:
        limiter.close()


async def test_the_decorator_counts_the_organisation(make_limiter: MakeLimiter) -> None:
    """keys= computes the organisation from the call's arguments, as identity= the user
    (a plain function with a Limiter, a coroutine function with an AsyncLimiter)."""
    driver = make_limiter(POLICY)
    limiter = driver.limiter
    options: dict[str, Any] = {
        "identity": lambda user, org: user,
        "keys": lambda user, org: {"org": org} if org else None,
        "ip": lambda user, org: "203.0.113.9",
    }
    if isinstance(limiter, Limiter):

        @rate_limited(limiter, "per-org", **options)
        def plain(user: str, org: str | None) -> str:
            return "done"

        async def export(user: str, org: str | None) -> str:
            return plain(user, org)

    else:

        @rate_limited(limiter, "per-org", **options)
        async def export(user: str, org: str | None) -> str:
            return "done"

    for user in ("a", "b", "c", "d"):
        assert await export(user, "initech") == "done"
    with pytest.raises(RateLimited):
        await export("e", "initech")
    assert await export("e", None) == "done"  # no organisation: counted by address
    assert (await driver.peek("per-org", None, ip="203.0.113.9")).remaining == 3


def test_caller_keys_are_checked_and_frozen() -> None:
    """Caller(keys=...) refuses names no limit can use (built-ins, not identifiers) and
    empty values, and keeps a copy that cannot change."""
    given_keys = {"org": "acme"}
    caller = Caller("alice", "pro", keys=given_keys)
    given_keys["org"] = "changed"
    assert dict(caller.keys) == {"org": "acme"}
    with pytest.raises(TypeError):
        caller.keys["org"] = "x"  # type: ignore[index]
    for bad in ({"user": "x"}, {"ip": "x"}, {"Org": "x"}, {"org-id": "x"}):
        with pytest.raises(ValueError, match="key name"):
            Caller("alice", keys=bad)
    with pytest.raises(ValueError, match="non-empty str"):
        Caller("alice", keys={"org": ""})
    assert Caller("alice") == Caller("alice", None, {})
    # Caller's own __init__ (not the dataclass'): every field set, by keyword too, the
    # same refusals, and still frozen.
    assert Caller(user="bob", keys={"org": "a"}, tier="pro") == Caller("bob", "pro", {"org": "a"})
    assert dataclasses.replace(caller, tier="free") == Caller("alice", "free", {"org": "acme"})
    for user in ("", None, 42, b"alice"):
        with pytest.raises(ValueError, match="non-empty str"):
            Caller(user)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mapping"):
        Caller("alice", keys=[("org", "acme")])  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        caller.user = "mallory"  # type: ignore[misc]

    # A dataclass subclass (its own generated __init__) is checked and frozen the same way.
    @dataclasses.dataclass(frozen=True)
    class Member(Caller):
        plan: str = "basic"

    member = Member("carol", "pro", {"org": "acme"}, plan="gold")
    assert (member.user, member.tier, dict(member.keys), member.plan) == (
        "carol",
        "pro",
        {"org": "acme"},
        "gold",
    )
    with pytest.raises(TypeError):
        member.keys["org"] = "x"  # type: ignore[index]
    assert Member("dave").keys == {}
    with pytest.raises(ValueError, match="non-empty str"):
        Member("")
    with pytest.raises(ValueError, match="key name"):
        Member("erin", keys={"user": "x"})


@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_named_tags_never_collide_with_users_addresses_or_other_names(a: str, b: str) -> None:
    """Tags of different kinds differ whatever the identities say; within a kind, tags
    differ exactly when the identities do."""
    kinds = [_keys.USER, _keys.IP, _keys.named_kind("org"), _keys.named_kind("api_key")]
    tags = {(k, i): _keys.identity_tag(k, i) for k in kinds for i in (a, b)}
    for (k1, i1), t1 in tags.items():
        for (k2, i2), t2 in tags.items():
            assert (t1 == t2) == (k1 == k2 and i1 == i2)


def test_keys_of_a_request_are_one_call_per_slot() -> None:
    """On one server the user's and the organisation's checks go in one script call; on a
    cluster, one per hash slot."""
    compiled = compile_policy(policy.loads(POLICY))
    one = Core(compiled, cluster=False).for_request(
        "hit",
        "GET",
        "/api/keyed",
        "alice",
        tier=None,
        cost=1,
        ip="192.0.2.1",
        host=None,
        keys={"org": "acme", "api_key": "k"},
    )
    assert len(one.calls) == 1 and len(one.checks) == 3
    split = Core(compiled, cluster=True).for_request(
        "hit",
        "GET",
        "/api/keyed",
        "alice",
        tier=None,
        cost=1,
        ip="192.0.2.1",
        host=None,
        keys={"org": "acme", "api_key": "k"},
    )
    assert len(split.calls) == 3
