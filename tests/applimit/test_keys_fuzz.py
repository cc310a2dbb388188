"""Hostile identities and policy strings against the key encoder and a real Redis.

``test_applimit_units.py`` already checks tags of short text identities; here: identities
made from any bytes (as a badly decoded header gives them, lone surrogates included) and
of any length up to 1 MB, whole keys rather than tags, and what actually lands in Redis.
"""

from __future__ import annotations

import edgegen_policy as policy
import pytest
import redis
from harness import RedisServer
from hypothesis import given, settings
from hypothesis import strategies as st

from applimit import Limiter, _keys
from applimit._plan import Core
from applimit._rules import compile_policy

POLICY = """
version: 1
app: {key_prefix: kz, timeout: 200ms}
limits:
  - name: "we{ird}:name %7B"
    app: {algorithm: sliding_log, tiers: {default: [2/1m, 10/1h]}}
"""
NAME = "we{ird}:name %7B"
# prefix + escaped limit name + tag + period + algorithm, with room to spare.
MAX_KEY = 200

identities = st.one_of(
    st.binary(min_size=1, max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(min_size=1, max_size=300),
    st.integers(90, 2_000).map(lambda n: "é" * n),
)


def _tag_of(key: str) -> str:
    """The hash tag Redis Cluster uses: between the first '{' and the next '}'."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start + 1)]


@settings(max_examples=400)
@given(identities, identities)
def test_keys_are_bounded_tag_safe_and_injective(a: str, b: str) -> None:
    """Every key of any identity is short, has exactly one brace pair, whose content is
    the identity's tag; different identities never share a key."""
    core = Core(compile_policy(policy.loads(POLICY)), cluster=True)
    keys = {}
    for identity in (a, b):
        plan = core.for_limit("hit", NAME, identity, None, 1)
        keys[identity] = [k for call in plan.calls for k in call.keys]
        for key in keys[identity]:
            assert len(key) <= MAX_KEY
            assert key.count("{") == 1 and key.count("}") == 1
            assert _tag_of(key) == _keys.identity_tag(_keys.USER, identity)
    if a != b:
        assert not set(keys[a]) & set(keys[b])


def test_policy_strings_cannot_shape_keys() -> None:
    """A key prefix with braces or colons is refused by the policy; a limit name with them
    is escaped, so only the identity's tag decides the slot."""
    with pytest.raises(policy.PolicyError):
        policy.loads("version: 1\napp: {key_prefix: 'a{b}'}\nlimits: []\n")
    core = Core(compile_policy(policy.loads(POLICY)), cluster=True)
    [key, *_] = core.for_limit("hit", NAME, "x", None, 1).calls[0].keys
    assert key.startswith("kz:we%7Bird%7D%3Aname%20%257B:{u=x}:")


@pytest.mark.parametrize("size", [97, 4_096, 1_000_000])
def test_huge_identities_reach_redis_as_short_distinct_keys(
    redis_client: redis.Redis, redis_url: str, size: int
) -> None:
    """Identities of up to 1 MB are counted under short keys; two that differ only in
    their last byte are counted apart."""
    with Limiter(policy.loads(POLICY), redis_url=redis_url) as limiter:
        first, second = "a" * (size - 1) + "1", "a" * (size - 1) + "2"
        assert [limiter.hit(NAME, first).allowed for _ in range(3)] == [True, True, False]
        assert limiter.hit(NAME, second).allowed
        assert not limiter.hit(NAME, first).degraded
    keys = list(redis_client.scan_iter("kz:*"))
    assert len(keys) == 4  # two identities x two rates
    assert all(len(k) <= MAX_KEY for k in keys)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The shared server's URL."""
    return redis_server.url
