"""The limiter's contract, run on {standalone, Redis Cluster, memory://} x {Limiter,
AsyncLimiter}."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from limiter_support import US, MakeLimiter, TestClock
from redis.cluster import RedisCluster

from applimit import InvalidArgumentError, UnknownLimitError, UnknownTierError, _script

POLICY = """
version: 1
tiers: [free, pro]
app:
  key_prefix: t
  timeout: 2s        # generous: these tests are about semantics, not latency
limits:
  - name: log
    match: {path_prefix: /log/}
    app: {algorithm: sliding_log, tiers: {free: 3/1m, pro: [5/1m, 8/1h]}}
  - name: win
    match: {path_prefix: /win/}
    app: {algorithm: sliding_window, tiers: {free: 3/1m, pro: [5/1m, 8/1h]}}
  - name: bucket
    match: {path_prefix: /bucket/}
    app: {algorithm: gcra, tiers: {free: 3/1m, pro: 5/1m}}
  - name: shadow
    match: {path_prefix: /both/}
    app: {algorithm: sliding_log, enforce: false, tiers: {free: 1/1m}}
  - name: strict
    match: {path_prefix: /both/}
    app: {algorithm: gcra, tiers: {free: 2/1m}}
  - name: loose
    match: {path_prefix: /both/}
    app: {algorithm: sliding_window, tiers: {free: 5/1m}}
  - name: by-ip
    match: {path_prefix: /mixed/}
    app: {per: ip, algorithm: sliding_log, tiers: {free: 2/1m}}
  - name: by-user
    match: {path_prefix: /mixed/}
    app: {algorithm: gcra, tiers: {free: 4/1m}}
  - name: pro-only
    match: {paths: [/pro]}
    app: {algorithm: sliding_log, tiers: {pro: 1/1m}}
  - name: edge-only
    match: {paths: [/edge]}
    edge: {rate: 10/1m}
cloudflare: {plan: business}
"""

ALGORITHM_LIMITS = ["log", "win", "bucket"]


def user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


def all_keys(admin: Any, pattern: str) -> list[bytes]:
    """KEYS on every master of a cluster (a cluster client asks one node otherwise)."""
    if isinstance(admin, RedisCluster):
        return list(admin.keys(pattern, target_nodes=RedisCluster.PRIMARIES))
    return list(admin.keys(pattern))


@pytest.mark.parametrize("name", ALGORITHM_LIMITS)
async def test_hit_counts_down_then_denies(make_limiter: MakeLimiter, name: str) -> None:
    """Each algorithm admits its quota, reports exact remaining counts, then denies with a
    positive retry_after no longer than the window, without consuming."""
    limiter = make_limiter(POLICY)
    who = user()
    remaining = [(await limiter.hit(name, who, tier="free")).remaining for _ in range(3)]
    assert remaining == [2, 1, 0]
    denied = await limiter.hit(name, who, tier="free")
    assert not denied.allowed
    assert denied.policy == name
    assert denied.limit == 3
    assert denied.remaining == 0
    assert denied.retry_after is not None
    assert 0 < denied.retry_after <= 120
    assert denied.reset_after > 0
    assert denied.denied_by == denied.results
    assert not denied.degraded
    again = await limiter.peek(name, who, tier="free")
    assert not again.allowed and again.remaining == 0


@pytest.mark.parametrize("name", ALGORITHM_LIMITS)
async def test_peek_consumes_nothing(make_limiter: MakeLimiter, name: str) -> None:
    """peek reports what hit would decide and leaves the count unchanged."""
    limiter = make_limiter(POLICY)
    who = user()
    for _ in range(5):
        looked = await limiter.peek(name, who, tier="free")
        assert looked.allowed and looked.remaining == 3 and looked.retry_after is None
        assert not any(r.consumed for r in looked.results)
    assert (await limiter.hit(name, who, tier="free")).remaining == 2
    assert (await limiter.peek(name, who, tier="free", cost=2)).allowed
    assert not (await limiter.peek(name, who, tier="free", cost=3)).allowed


@pytest.mark.parametrize("name", ["log", "win"])
async def test_multi_rate_tier_is_all_or_nothing(make_limiter: MakeLimiter, name: str) -> None:
    """pro: [5/1m, 8/1h]: a request the minute rate denies consumes nothing of the hour rate,
    and the decision reports the most restrictive rate while keeping both."""
    limiter = make_limiter(POLICY)
    who = user()
    for _ in range(5):
        assert (await limiter.hit(name, who, tier="pro")).allowed
    for _ in range(3):
        denied = await limiter.hit(name, who, tier="pro")
        assert not denied.allowed
    assert [(r.window, r.quota) for r in denied.results] == [(60.0, 5), (3600.0, 8)]
    minute, hour = denied.results
    assert not minute.allowed and hour.allowed
    assert hour.remaining == 3, "denied requests must not consume the hour rate"
    assert denied.limit == 5 and denied.binding == minute
    assert denied.retry_after == minute.retry_after


async def test_cost_above_the_limit_never_fits_and_writes_nothing(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """A cost larger than the quota is denied with retry_after = inf and leaves no key."""
    limiter = make_limiter(POLICY)
    who = user()
    for name in ALGORITHM_LIMITS:
        denied = await limiter.hit(name, who, tier="free", cost=4)
        assert not denied.allowed
        assert denied.retry_after == math.inf
        assert denied.remaining == 3
    assert not [k for k in all_keys(redis_admin, "t:*") if who.encode() in k]


async def test_cost_larger_than_what_is_left_is_rejected_without_writing(
    make_limiter: MakeLimiter,
) -> None:
    """With 1 left, a cost of 2 is denied and the 1 is still there afterwards."""
    limiter = make_limiter(POLICY)
    for name in ALGORITHM_LIMITS:
        who = user()
        assert (await limiter.hit(name, who, tier="free", cost=2)).remaining == 1
        denied = await limiter.hit(name, who, tier="free", cost=2)
        assert not denied.allowed and denied.remaining == 1
        assert (await limiter.hit(name, who, tier="free")).allowed


COST_POLICY = """
version: 1
tiers: [free]
app: {key_prefix: t, timeout: 2s}
limits:
  - name: tokens
    match: {path_prefix: /tokens/}
    app: {algorithm: sliding_log, tiers: {free: 200000/1h}}
  - name: callers
    match: {path_prefix: /tokens/}
    app: {per: ip, algorithm: gcra, tiers: {free: 100000/1h}}
"""


async def test_a_sliding_log_request_of_any_cost_is_one_entry(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """A request of cost 200,000 on a 200000/1h log is one sorted-set member of a few
    dozen bytes (not 200,000 members: megabytes, and Redis blocked while it writes them),
    and it counts as 200,000 exactly: nothing more fits until it leaves the window, one
    hour later to the microsecond."""
    clock = TestClock()
    limiter = make_limiter(COST_POLICY, test_clock=clock)
    who = user()
    first = await limiter.hit("tokens", who, cost=200_000)
    assert first.allowed and first.remaining == 0
    [key] = all_keys(redis_admin, f"t:tokens:{{u={who}}}:*")
    assert redis_admin.zcard(key) == 1
    assert redis_admin.memory_usage(key) < 256
    clock.advance(1800 * US)
    denied = await limiter.hit("tokens", who)
    assert not denied.allowed and denied.retry_after == 1800.0
    clock.advance(1800 * US - 1)
    assert not (await limiter.peek("tokens", who)).allowed
    clock.advance(1)
    after = await limiter.hit("tokens", who, cost=199_999)
    assert after.allowed and after.remaining == 1
    assert redis_admin.zcard(key) == 1


async def test_a_denied_request_gives_back_its_whole_sliding_log_cost(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """/tokens/ counts the user's tokens (sliding_log, 200000/1h) and the caller's address
    (gcra, 100000/1h). The third request of 50,000 is refused by the address limit, so it
    consumes no tokens:
    on Redis Cluster the two limits live in different slots, and the log's entry, already
    written, is taken back whole (one member, its 50,000 units)."""
    limiter = make_limiter(COST_POLICY)
    who, ip = user(), f"198.51.100.{uuid.uuid4().int % 250}"
    for _ in range(2):
        assert (await limiter.check_request("GET", "/tokens/", who, cost=50_000, ip=ip)).allowed
    denied = await limiter.check_request("GET", "/tokens/", who, cost=50_000, ip=ip)
    assert not denied.allowed and [r.name for r in denied.denied_by] == ["callers"]
    assert (await limiter.peek("tokens", who)).remaining == 100_000
    [key] = all_keys(redis_admin, f"t:tokens:{{u={who}}}:*")
    assert redis_admin.zcard(key) == 2
    other = await limiter.check_request("GET", "/tokens/", who, cost=100_000, ip="192.0.2.1")
    assert other.allowed and other.remaining == 0


async def test_check_request_is_atomic_across_algorithms(make_limiter: MakeLimiter) -> None:
    """Three limits match /both/: the gcra one (2/1m) denies the third request, and then the
    sliding-window one (5/1m) is not consumed either."""
    limiter = make_limiter(POLICY)
    who = user()
    for _ in range(2):
        assert (await limiter.check_request("GET", "/both/x", who)).allowed
    denied = await limiter.check_request("GET", "/both/x", who)
    assert not denied.allowed
    assert [r.name for r in denied.denied_by] == ["strict"]
    assert {r.name for r in denied.results} == {"shadow", "strict", "loose"}
    loose = next(r for r in denied.results if r.name == "loose")
    assert loose.allowed and not loose.consumed and loose.remaining == 3
    assert (await limiter.peek("loose", who)).remaining == 3


async def test_shadow_limit_reports_but_never_denies(make_limiter: MakeLimiter) -> None:
    """The shadow limit (1/1m) would deny the second request: it says so, and the request
    goes through, consuming the enforced limits."""
    limiter = make_limiter(POLICY)
    who = user()
    first = await limiter.check_request("GET", "/both/", who)
    second = await limiter.check_request("GET", "/both/", who)
    assert first.allowed and second.allowed
    shadow = next(r for r in second.results if r.name == "shadow")
    assert shadow.shadow and not shadow.allowed and not shadow.consumed
    assert second.shadow_denied_by == (shadow,)
    assert second.retry_after is None
    assert (await limiter.peek("loose", who)).remaining == 3
    # The binding result is an enforced one, never the shadow one.
    assert second.binding is not None and not second.binding.shadow


async def test_check_request_mixing_ip_and_user_limits(make_limiter: MakeLimiter) -> None:
    """/mixed/ is limited per IP (2/1m) and per user (4/1m): on Cluster these keys live in
    different slots, and the decision is still all or nothing."""
    limiter = make_limiter(POLICY)
    ip = f"10.0.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"
    alice = user()
    assert (await limiter.check_request("GET", "/mixed/", alice, ip=ip)).allowed
    assert (await limiter.check_request("GET", "/mixed/", alice, ip=ip)).allowed
    denied = await limiter.check_request("GET", "/mixed/", alice, ip=ip)
    assert not denied.allowed and [r.name for r in denied.denied_by] == ["by-ip"]
    by_user = next(r for r in denied.results if r.name == "by-user")
    assert not by_user.consumed and by_user.remaining == 2
    assert (await limiter.peek("by-user", alice)).remaining == 2
    # The same user from another address still has their per-user quota left.
    other_ip = "192.0.2.77"
    await limiter.reset("by-ip", None, ip=other_ip)
    assert (await limiter.check_request("GET", "/mixed/", alice, ip=other_ip)).allowed
    assert (await limiter.peek("by-user", alice)).remaining == 1


async def test_anonymous_callers_are_counted_by_ip(make_limiter: MakeLimiter) -> None:
    """identity=None counts a per-user limit by the client IP; without ip= it is an error."""
    limiter = make_limiter(POLICY)
    ip = f"2001:db8::{uuid.uuid4().int % 9999:x}"
    for _ in range(2):
        assert (await limiter.check_request("GET", "/bucket/", None, ip=ip)).allowed
    # The same address written differently is the same caller.
    spelled = ip.upper().replace("2001:DB8::", "2001:0DB8:0:0::")
    assert (await limiter.check_request("GET", "/bucket/", None, ip=spelled)).remaining == 0
    with pytest.raises(InvalidArgumentError) as raised:
        await limiter.check_request("GET", "/bucket/", None)
    assert raised.value.argument == "ip"


async def test_no_identity_shares_a_bucket_with_anonymous_callers(
    make_limiter: MakeLimiter,
) -> None:
    """hit/peek/reset count an anonymous caller by address with identity=None and ip=,
    in the bucket check_request counts it in (kind i=); a user id, whatever it says (the
    address itself, "anonymous-ip:<address>"), is counted as a user (kind u=) and never
    shares that bucket."""
    limiter = make_limiter(POLICY)
    ip = f"203.0.113.{uuid.uuid4().int % 250}"
    await limiter.reset("bucket", None, ip=ip)
    for remaining in (2, 1):
        assert (await limiter.hit("bucket", None, ip=ip)).remaining == remaining
    assert (await limiter.check_request("GET", "/bucket/", None, ip=ip)).remaining == 0
    assert not (await limiter.hit("bucket", None, ip=ip)).allowed
    assert not (await limiter.peek("bucket", None, ip=ip)).allowed
    for lookalike in (f"anonymous-ip:{ip}", ip, f"i={ip}"):
        decision = await limiter.hit("bucket", lookalike, ip=ip)
        assert decision.allowed and decision.remaining == 2, lookalike
    assert await limiter.reset("bucket", None, ip=ip)
    assert (await limiter.peek("bucket", None, ip=ip)).remaining == 3
    assert (await limiter.peek("bucket", ip)).remaining == 2
    # A per-IP limit counts the address given as ip=, whatever the identity says; an
    # identity alone is refused, never taken for an address (a user-chosen name could
    # otherwise spend the quota of the address it spells).
    assert (await limiter.hit("by-ip", None, ip=ip)).remaining == 1
    assert (await limiter.hit("by-ip", "alice", ip=ip)).remaining == 0
    for call in (limiter.hit, limiter.peek, limiter.reset):
        with pytest.raises(InvalidArgumentError, match="address only as ip=") as raised:
            await call("by-ip", ip)
        assert raised.value.argument == "ip"
    assert (await limiter.peek("by-ip", None, ip=ip)).remaining == 0
    with pytest.raises(InvalidArgumentError) as raised:
        await limiter.hit("bucket", None)
    assert raised.value.argument == "ip"
    with pytest.raises(InvalidArgumentError) as raised:
        await limiter.hit("bucket", None, ip="")
    assert raised.value.argument == "ip"


V6_POLICY = """
version: 1
clients: {ipv6_prefix: PREFIX}
app: {key_prefix: t, timeout: 2s}
limits:
  - name: per-ip
    match: {path_prefix: /v6/}
    app: {per: ip, algorithm: sliding_log, tiers: {default: 5/1m}}
  - name: anonymous
    match: {path_prefix: /v6/}
    app: {algorithm: gcra, tiers: {default: 5/1m}}
"""


@pytest.mark.parametrize("prefix", [64, 128])
async def test_ipv6_clients_are_counted_per_network(make_limiter: MakeLimiter, prefix: int) -> None:
    """clients.ipv6_prefix 64 (the default): 50 addresses of one /64 share one quota, so
    5 of their 50 requests pass a 5/1m limit, both per IP and for anonymous callers of a
    per-user limit; an address of another /64 has its own; hit/peek/reset by address use
    the same bucket. 128 counts every address on its own."""
    limiter = make_limiter(V6_POLICY.replace("PREFIX", str(prefix)))
    network = f"2001:db8:{uuid.uuid4().int % 0xFFFF:x}:{uuid.uuid4().int % 0xFFFF:x}"
    addresses = [f"{network}:{i:x}:{uuid.uuid4().int % 0xFFFF:x}::{i + 1:x}" for i in range(50)]
    admitted = [
        (await limiter.check_request("GET", "/v6/", None, ip=address)).allowed
        for address in addresses
    ]
    assert sum(admitted) == (5 if prefix == 64 else 50)
    other = f"2001:db8:{uuid.uuid4().int % 0xFFFF:x}:ffff::1"
    assert (await limiter.check_request("GET", "/v6/", None, ip=other)).remaining == 4
    left = 0 if prefix == 64 else 4
    for name in ("per-ip", "anonymous"):
        assert (await limiter.peek(name, None, ip=addresses[-1])).remaining == left
    assert (await limiter.peek("per-ip", "alice", ip=addresses[-1])).remaining == left
    assert await limiter.reset("per-ip", None, ip=addresses[0])
    after = await limiter.peek("per-ip", None, ip=addresses[-1])
    assert after.remaining == (5 if prefix == 64 else 4)


async def test_no_matching_limit_and_missing_tier_allow(make_limiter: MakeLimiter) -> None:
    """A request no limit matches, or a tier a limit gives no rate, is allowed with no
    results; edge-only limits are not the app's business."""
    limiter = make_limiter(POLICY)
    nothing = await limiter.check_request("GET", "/nowhere", user())
    assert nothing.allowed and nothing.results == () and nothing.policy is None
    free = await limiter.check_request("GET", "/pro", user(), tier="free")
    assert free.allowed and free.results == ()
    pro = await limiter.check_request("GET", "/pro", user(), tier="pro")
    assert pro.allowed and pro.policy == "pro-only"
    assert (await limiter.hit("pro-only", user(), tier="free")).results == ()


async def test_typed_errors_for_unknown_names(make_limiter: MakeLimiter) -> None:
    """Unknown tiers and limits, and bad costs or identities, raise typed errors whose
    messages say what exists."""
    limiter = make_limiter(POLICY)
    with pytest.raises(UnknownTierError, match="'gold' is not in the policy's tiers"):
        await limiter.hit("log", "u", tier="gold")
    with pytest.raises(UnknownLimitError, match="no limit named 'nope'"):
        await limiter.hit("nope", "u")
    # A misspelt name or tier gets the closest one offered.
    with pytest.raises(UnknownLimitError, match=r"no limit named 'lgo' \(did you mean 'log'\?\)"):
        await limiter.hit("lgo", "u")
    with pytest.raises(UnknownTierError, match=r"'fre' .*\(did you mean 'free'\?\)"):
        await limiter.hit("log", "u", tier="fre")
    with pytest.raises(UnknownLimitError, match="has no app part"):
        await limiter.hit("edge-only", "u")
    with pytest.raises(InvalidArgumentError, match="cost"):
        await limiter.hit("log", "u", cost=0)
    with pytest.raises(InvalidArgumentError, match="empty"):
        await limiter.hit("log", "")
    with pytest.raises(InvalidArgumentError, match="must be a str"):
        await limiter.hit("log", 42)


async def test_reset_forgets_every_rate(make_limiter: MakeLimiter) -> None:
    """reset clears all of a limit's keys for one identity, and only for that identity."""
    limiter = make_limiter(POLICY)
    who, other = user(), user()
    for _ in range(5):
        await limiter.hit("log", who, tier="pro")
        await limiter.hit("log", other, tier="pro")
    assert not (await limiter.hit("log", who, tier="pro")).allowed
    assert await limiter.reset("log", who)
    fresh = await limiter.hit("log", who, tier="pro")
    assert [r.remaining for r in fresh.results] == [4, 7]
    assert not (await limiter.hit("log", other, tier="pro")).allowed


HOSTILE = [
    "a}b",
    "{x}",
    "}{",
    "user:1:{2}",
    "line\nbreak\r\n",
    "nul\x00byte",
    "%7D",
    "u=alice",
    "emoji-🙂",
    "lone-surrogate-\udc80",
    "x" * 10_000,
    "y" * 10_000,
]


async def test_hostile_identities_get_bounded_separate_keys(
    make_limiter: MakeLimiter, redis_admin: Any
) -> None:
    """Braces, colons, newlines, NULs, escapes and 10 kB strings: every identity has its
    own quota (no collisions), every key stays short and has exactly one hash tag (so the
    multi-rate call never fails with CROSSSLOT on Cluster)."""
    limiter = make_limiter(POLICY)
    for identity in HOSTILE:
        first = await limiter.hit("log", identity, tier="pro")
        assert first.allowed and not first.degraded, identity
        assert [r.remaining for r in first.results] == [4, 7], f"{identity!r} collided"
    keys = all_keys(redis_admin, "t:log:*")
    assert len(keys) == 2 * len(HOSTILE)
    for key in keys:
        assert len(key) < 160
        assert key.count(b"{") == 1 and key.count(b"}") == 1


@pytest.mark.redis_only("Redis' script cache")
async def test_script_flush_is_survived(make_limiter: MakeLimiter, redis_admin: Any) -> None:
    """After SCRIPT FLUSH the next call reloads the script (NOSCRIPT, then EVAL) and the
    count carries on."""
    limiter = make_limiter(POLICY)
    who = user()
    assert (await limiter.hit("log", who)).remaining == 2
    redis_admin.script_flush()
    assert redis_admin.script_exists(_script.SHA) == [False]
    after = await limiter.hit("log", who)
    assert after.remaining == 1 and not after.degraded


def _server_ms(admin: Any) -> int:
    """The server's clock (TIME), in ms."""
    seconds, micros = admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _state_deadline_ms(admin: Any, name: str, key: bytes) -> int:
    """When the key's state stops mattering (server ms), read from the state itself:
    a log's newest entry leaves the window, a window count stops weighing at the end of
    the next window, a GCRA value at its theoretical arrival time."""
    period_ms = 60_000
    if name == "log":
        [(_, score)] = admin.zrange(key, -1, -1, withscores=True)
        return math.ceil(score / 1000) + period_ms
    if name == "win":
        window = int(admin.hget(key, "w"))
        return (window + 2) * period_ms
    tat_us = int(admin.get(key).split()[0])
    return math.ceil(tat_us / 1000)


@pytest.mark.redis_only("key TTLs on the server's clock")
@pytest.mark.parametrize("name", ALGORITHM_LIMITS)
async def test_every_key_expires_after_its_state_and_within_a_period_of_it(
    make_limiter: MakeLimiter, redis_admin: Any, name: str
) -> None:
    """After every hit, the key outlives the state it holds (the TTL set by an earlier hit
    is kept only while it still does), by less than one period (expiries are rounded up to
    a grid one period wide, so that most hits need not move them)."""
    limiter = make_limiter(POLICY)
    who = user()
    for _ in range(3):
        assert (await limiter.hit(name, who)).allowed
        [key] = [k for k in all_keys(redis_admin, f"t:{name}:*") if who.encode() in k]
        # The key expires at some time between TIME read before PTTL plus the TTL and
        # TIME read after it plus the TTL, however long the reads take on a busy machine.
        before = _server_ms(redis_admin)
        ttl_ms = redis_admin.pttl(key)
        after = _server_ms(redis_admin)
        deadline_ms = _state_deadline_ms(redis_admin, name, key)
        # 5 ms for PTTL's rounding to whole milliseconds and TIME's to whole ones.
        assert deadline_ms - 5 <= after + ttl_ms
        assert before + ttl_ms <= deadline_ms + 60_000 + 5


TTL_POLICY = """
version: 1
tiers: [free]
app: {key_prefix: t, timeout: 2s}
limits:
  - {name: log, match: {path_prefix: /l/}, app: {algorithm: sliding_log, tiers: {free: 100/1m}}}
  - {name: win, match: {path_prefix: /w/}, app: {algorithm: sliding_window, tiers: {free: 100/1m}}}
  - {name: bucket, match: {path_prefix: /b/}, app: {algorithm: gcra, tiers: {free: 100/1m}}}
"""


@pytest.mark.redis_only("key TTLs read with PTTL")
@pytest.mark.parametrize("name", ALGORITHM_LIMITS)
async def test_the_ttl_is_kept_within_an_expiry_cell_and_renewed_past_it(
    make_limiter: MakeLimiter, redis_admin: Any, name: str
) -> None:
    """Under a test clock (whose TTLs carry a fixed slack and count from the test time),
    a hit whose state's deadline stays in the cell of the grid that the key's TTL ends
    leaves that TTL as it was; a hit that moves the deadline into a later cell sets the
    TTL to the end of that cell. Steps of 1 s stay in a cell, steps of 45 s leave it."""
    period_ms, slack_ms = 60_000, 600_000
    clock = TestClock(1_000_020 * US + 10 * US)  # 10 s into a cell
    limiter = make_limiter(TTL_POLICY, test_clock=clock)
    who = user()
    previous: tuple[int, int] | None = None  # (cell, ttl)
    for step_s in (0, 1, 45, 1, 1, 45, 1):
        clock.advance(step_s * US)
        assert (await limiter.hit(name, who)).allowed
        [key] = [k for k in all_keys(redis_admin, f"t:{name}:*") if who.encode() in k]
        ttl = redis_admin.pttl(key) - slack_ms
        now_ms = clock.us // 1000
        deadline_ms = _state_deadline_ms(redis_admin, name, key)
        cell = deadline_ms // period_ms + 1
        if name == "win":
            # A window's count is kept to the end of the next window: its cell is fixed.
            cell = deadline_ms // period_ms
        if previous is not None and previous[0] == cell:
            assert previous[1] - 50 <= ttl <= previous[1], "the TTL should have been kept"
        else:
            expected = cell * period_ms - now_ms
            assert expected - 50 <= ttl <= expected, "the TTL should end the new cell"
        assert ttl >= deadline_ms - now_ms - 50
        previous = (cell, ttl)


@pytest.mark.redis_only("the server's clock; memory:// reads the process's")
async def test_decisions_use_the_server_clock(
    make_limiter: MakeLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's clock plays no part: with time.time() ten minutes off, the count carries
    on exactly where it was (the script reads TIME on the server)."""
    import time

    limiter = make_limiter(POLICY)
    who = user()
    assert (await limiter.hit("log", who)).remaining == 2
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 600)
    monkeypatch.setattr(time, "time_ns", lambda: int((real() + 600) * 1e9))
    assert (await limiter.hit("log", who)).remaining == 1
    monkeypatch.setattr(time, "time", lambda: real() - 600)
    assert (await limiter.hit("log", who)).remaining == 0


BURST_POLICY = """
version: 1
app: {key_prefix: t, timeout: 2s}
limits:
  - name: log
    app: {algorithm: sliding_log, tiers: {default: 100/1m}}
  - name: bucket
    app: {algorithm: gcra, tiers: {default: 100/1m}}
"""


@pytest.mark.parametrize("name", ["log", "bucket"])
async def test_a_2x_burst_across_a_window_edge_is_refused(
    make_limiter: MakeLimiter, name: str
) -> None:
    """100 requests in the last 100 ms of a minute, then 100 in the first 100 ms of the
    next: a fixed window would admit all 200; sliding_log and gcra admit the first 100
    only, and sliding_log admits again exactly one window after the first burst."""
    clock = TestClock(start_us=1_000_000 * 60 * US)  # a whole minute: a fixed-window edge
    limiter = make_limiter(BURST_POLICY, test_clock=clock)
    who = user()
    clock.advance(59_900_000)
    first = [(await limiter.hit(name, who)).allowed for _ in range(100)]
    clock.advance(200_000)  # 100 ms past the edge
    second = [(await limiter.hit(name, who)).allowed for _ in range(100)]
    assert sum(first) == 100
    assert sum(second) == 0
    if name == "log":
        clock.advance(60_000_000 - 200_000)  # exactly one window after the first burst
        assert (await limiter.hit(name, who)).allowed


@pytest.mark.redis_only("keys written by applimit 0.1 into Redis")
@pytest.mark.parametrize("name", ["log", "bucket"])
async def test_keys_written_by_applimit_0_1_get_a_ttl_that_covers_their_state(
    make_limiter: MakeLimiter, redis_admin: Any, name: str
) -> None:
    """applimit 0.1 set TTLs that ended exactly at the state's deadline and marked nothing.
    A hit of this version on such a key (as in a rolling upgrade) must not keep that
    shorter TTL: the key outlives the new state, and the count carries on."""
    limiter = make_limiter(POLICY)
    who = user()
    await limiter.hit(name, who)  # finds the key's name (and hash slot)
    [key] = [k for k in all_keys(redis_admin, f"t:{name}:*") if who.encode() in k]
    redis_admin.delete(key)
    seconds, micros = redis_admin.time()
    now_us = seconds * US + micros
    if name == "log":
        # One entry of 0.1 (member "<nonce>:<i>"), TTL ending when it leaves the window.
        # Scored at the start of the current minute: the new entry's deadline is then in
        # the same expiry cell, later by however far into the minute we are.
        scored = now_us - now_us % (60 * US) + 1
        redis_admin.zadd(key, {"0123456789ab:1": scored})
        redis_admin.pexpire(key, math.ceil((scored + 60 * US - now_us) / 1000))
    else:
        # A TAT one emission interval (20 s at 3/1m) ahead, TTL ending exactly there.
        redis_admin.set(key, f"{now_us + 20 * US} 0", px=20_000)
    decision = await limiter.hit(name, who)
    assert decision.allowed and decision.remaining == 1
    seconds, micros = redis_admin.time()
    expires_ms = seconds * 1000 + micros // 1000 + redis_admin.pttl(key)
    assert expires_ms >= _state_deadline_ms(redis_admin, name, key) - 5
