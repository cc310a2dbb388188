"""The sliding log's entries: one sorted-set member per request whatever its cost, keys of
older versions read and rewritten, refunds that take an entry out of the middle, starts
rewritten before they grow out of exact doubles, and a model check with large costs.

The members are ``<start>.<cost>.<nonce>``, the start after a letter giving its length
(``A0.3.9f86d081884c``; see applimit/lua/sliding_log.lua): the units in the window come
from two members, so these tests look at the members themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import edgegen_policy as policy
import pytest
import redis
from harness import RedisServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from limiter_support import US, SlidingLogModel, TestClock, as_expected

from applimit import Limiter, _script

LIMIT = 10
POLICY = f"""
version: 1
app: {{key_prefix: sl, timeout: 2s}}
limits:
  - name: x
    app: {{algorithm: sliding_log, tiers: {{default: {LIMIT}/1m}}}}
"""
START_US = 1_000_000 * 60 * US


@pytest.fixture
def clock() -> TestClock:
    return TestClock(start_us=START_US)


@pytest.fixture
def limiter(redis_server: RedisServer, clock: TestClock) -> Iterator[Limiter]:
    made = Limiter(policy.loads(POLICY), redis_url=redis_server.url, test_clock=clock)
    yield made
    made.close()


def _key(who: str) -> str:
    return f"sl:x:{{u={who}}}:1m:log"


def _members(admin: redis.Redis, key: str) -> list[tuple[str, int]]:
    return [(m.decode(), int(s)) for m, s in admin.zrange(key, 0, -1, withscores=True)]


def _run(
    admin: redis.Redis,
    key: str,
    mode: str,
    now: int | None,
    nonce: str,
    cost: int,
    source: str = _script.SOURCE,
) -> list[int]:
    """One call of the script itself (as the limiter sends it), on one sliding-log check
    of LIMIT per minute; ``now`` None: on the server's clock (TIME)."""
    args = [
        mode,
        "" if now is None else str(now),
        nonce,
        "0",
        "1",
        f"sliding_log {LIMIT} {60 * US} {cost} 0 0",
    ]
    reply = admin.eval(source, 1, key, *args)  # type: ignore[no-untyped-call]
    assert isinstance(reply, list)
    return [int(v) for v in reply]


def test_entries_on_the_servers_clock_are_scored_with_its_time(redis_client: redis.Redis) -> None:
    """Without a test clock the script reads TIME and scores the entry with it, written as
    text from TIME's two fields (the microseconds padded to six digits), not formatted
    from the number. Each entry's score lies between TIME read just before and just
    after its call, for calls made until both kinds of microsecond field have come up:
    six digits, and fewer (below 100,000, a tenth of each second), whose padding a
    wrong score would show by a factor of ten or more."""
    key = _key(uuid.uuid4().hex)
    seen_short = seen_long = False
    calls = 0
    # Bounded: a tenth of every second has a short field, so about a second of calls.
    while not (seen_short and seen_long) and calls < 200_000:
        calls += 1
        redis_client.delete(key)
        sec, usec = redis_client.time()  # type: ignore[misc]
        before = sec * US + usec
        reply = _run(redis_client, key, "hit", None, f"{calls:012x}", 1)
        sec, usec = redis_client.time()  # type: ignore[misc]
        after = sec * US + usec
        ((member, score),) = _members(redis_client, key)
        assert member == f"A0.1.{calls:012x}"
        assert before <= score <= after
        assert score == reply[0]  # the reply's time is the entry's
        if score % US < 100_000:
            seen_short = True
        else:
            seen_long = True
    assert seen_short and seen_long


@pytest.mark.parametrize("usec", ["7", "74", "174", "5174", "45174", "345174"])
def test_a_score_from_time_pads_each_length_of_microseconds(
    redis_client: redis.Redis, usec: str
) -> None:
    """The score's text from TIME's two fields, for each length of the microsecond field
    (Redis gives it without leading zeros): the script's own source, with TIME's reply
    replaced by fixed fields, since a real clock shows the short lengths too rarely."""
    sec = "1796362569"
    assert _script.SOURCE.count("CALL('TIME')") == 1
    source = _script.SOURCE.replace("CALL('TIME')", f"{{'{sec}', '{usec}'}}")
    key = _key(uuid.uuid4().hex)
    reply = _run(redis_client, key, "hit", None, "0123456789ab", 1, source)
    expected = int(sec) * US + int(usec)
    assert reply[0] == expected
    assert _members(redis_client, key) == [("A0.1.0123456789ab", expected)]


def test_members_of_earlier_versions_count_one_unit_each_and_are_rewritten(
    redis_client: redis.Redis, limiter: Limiter, clock: TestClock
) -> None:
    """Earlier versions wrote one member per unit ("<nonce>.<i>"): a request of cost 3, then
    one of cost 1. This version counts the four units, rewrites the members in its own
    form at the first check (a peek included), then adds one member per request; a member
    an instance of an earlier version adds later (a rolling upgrade) is counted and
    rewritten too."""
    who = uuid.uuid4().hex
    key = _key(who)
    t1, t2 = clock.us - 20 * US, clock.us - 10 * US
    redis_client.zadd(key, {"0123456789ab.1": t1, "0123456789ab.2": t1, "0123456789ab.3": t1})
    redis_client.zadd(key, {"fedcba987654.1": t2})
    redis_client.pexpire(key, 120_000)
    assert limiter.peek("x", who).remaining == LIMIT - 4
    assert [m for m, _ in _members(redis_client, key)] == [
        "A0.1.0123456789ab.1",
        "A1.1.0123456789ab.2",
        "A2.1.0123456789ab.3",
        "A3.1.fedcba987654.1",
    ]
    assert limiter.hit("x", who, cost=2).remaining == LIMIT - 6
    clock.advance(1)
    redis_client.zadd(key, {"0a0a0a0a0a0a.1": clock.us})  # an earlier version's, after this one
    assert limiter.peek("x", who).remaining == LIMIT - 7
    # A cost of 5 fits once two units have left: t1's first two, a minute after t1.
    denied = limiter.peek("x", who, cost=5)
    assert not denied.allowed
    assert denied.retry_after == (t1 + 60 * US - clock.us) / US
    assert len(_members(redis_client, key)) == 6
    clock.advance(40 * US + 1)  # t1's three units have left
    assert limiter.peek("x", who).remaining == LIMIT - 4


def test_an_older_member_inside_the_window_is_renumbered_with_it(
    redis_client: redis.Redis, limiter: Limiter, clock: TestClock
) -> None:
    """An older version's member before this version's first one in the window (written
    while the server's clock had gone back): the whole window is renumbered in order, and
    every unit counts."""
    who = uuid.uuid4().hex
    key = _key(who)
    redis_client.zadd(key, {"0123456789ab.1": clock.us - 20 * US})
    redis_client.zadd(key, {"A7.2.cccccccccccc": clock.us - 10 * US})
    assert limiter.peek("x", who).remaining == LIMIT - 3
    assert [m for m, _ in _members(redis_client, key)] == [
        "A0.1.0123456789ab.1",
        "A1.2.cccccccccccc",
    ]
    denied = limiter.peek("x", who, cost=LIMIT - 1)
    # Two units must leave: the first entry's, then the cost-2 entry's.
    assert denied.retry_after == 50.0


def test_a_refund_takes_its_entry_out_and_moves_the_later_ones_back(
    redis_client: redis.Redis,
) -> None:
    """A refund (a request denied on another slot of a cluster) of an entry that is not
    the newest: the entries after it start its cost earlier, so the count, and when the
    next request fits, are exact again."""
    key = _key(uuid.uuid4().hex)
    now = START_US
    assert _run(redis_client, key, "hit", now, "aaaaaaaaaaaa", 5)[4] == LIMIT - 5
    assert _run(redis_client, key, "hit", now + 1000, "bbbbbbbbbbbb", 3)[4] == LIMIT - 8
    assert _run(redis_client, key, "hit", now + 2000, "cccccccccccc", 1)[4] == LIMIT - 9
    _run(redis_client, key, "refund", now, "aaaaaaaaaaaa", 5)
    assert [m for m, _ in _members(redis_client, key)] == [
        "A0.3.bbbbbbbbbbbb",
        "A3.1.cccccccccccc",
    ]
    peek = _run(redis_client, key, "peek", now + 3000, "", 7)
    # allowed, consumed, remaining, reset, retry: 4 used, 7 does not fit until the
    # cost-3 entry has left.
    assert peek[2:] == [0, 0, LIMIT - 4, 60 * US - 1000, 60 * US + 1000 - 3000]


def test_starts_are_rewritten_from_zero_long_before_doubles_lose_them(
    redis_client: redis.Redis, limiter: Limiter, clock: TestClock
) -> None:
    """Starts only grow while a key lives; past 2^50 the entries in the window are
    renumbered from 0 (Lua's numbers are exact below 2^53), and nothing else changes."""
    who = uuid.uuid4().hex
    key = _key(who)
    start = 2**50 - 2
    redis_client.zadd(key, {f"P{start}.5.0123456789ab": clock.us - 10 * US})
    redis_client.zadd(key, {f"P{start - 9}.9.0123456789ab": clock.us - 61 * US})
    redis_client.pexpire(key, 120_000)
    assert limiter.hit("x", who, cost=2).remaining == LIMIT - 7
    members = [m for m, _ in _members(redis_client, key)]
    assert members[0] == "A0.5.0123456789ab"
    assert members[1].startswith("A5.2.")
    assert len(members) == 2
    assert limiter.peek("x", who, cost=3).allowed
    assert limiter.peek("x", who, cost=4).retry_after == 50.0


def test_entries_past_the_window_are_trimmed_every_few_units_and_never_counted(
    redis_server: RedisServer, clock: TestClock
) -> None:
    """A key at a steady rate (40 per minute, one hit every 1.5 s, limit 60/1m: an entry
    leaves the window with each request) is trimmed each time its starts cross a multiple
    of 16 units, not at every entry: it holds its window's entries and fewer than 16 past
    it (at most limit + 15), each decision's numbers are the model's, and a key whose
    entries have all left the window is trimmed at its next entry."""
    limit = 60
    text = POLICY.replace(f"{LIMIT}/1m", f"{limit}/1m")
    model = SlidingLogModel(limit, 60 * US)
    who = uuid.uuid4().hex
    sizes = []
    with (
        Limiter(policy.loads(text), redis_url=redis_server.url, test_clock=clock) as limiter,
        redis_server.client() as admin,
    ):
        for made in range(1, 201):
            clock.advance(1_500_000)
            decision = limiter.hit("x", who)
            assert as_expected(decision) == model.decide(clock.us, 1, consume=True)
            # The window (now - 60 s, now] holds the last 40 entries.
            in_window = min(made, 40)
            size = int(admin.zcard(_key(who)))
            assert in_window <= size < in_window + 16
            sizes.append(size)
        # Trimmed in steps: the size climbs to its window plus 15, then falls back.
        assert max(sizes) == in_window + 15 and min(sizes[50:]) == in_window
        clock.advance(61 * US)
        assert limiter.hit("x", who).remaining == limit - 1
        assert int(admin.zcard(_key(who))) == 1


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def _large(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, str]]]:
    limit = draw(st.integers(1, 300))
    period = 60 * US
    steps = st.one_of(
        st.integers(0, 2_000), st.integers(0, 2 * period), st.sampled_from([period, period + 1])
    )
    events = draw(
        st.lists(
            st.tuples(steps, st.integers(1, limit + 2), st.sampled_from(["hit", "hit", "peek"])),
            min_size=1,
            max_size=40,
        )
    )
    return limit, events


@SETTINGS
@given(case=_large())
def test_large_costs_match_the_model(
    redis_server: RedisServer, case: tuple[int, list[tuple[int, int, str]]]
) -> None:
    """Costs up to the limit (300) and beyond: every number of every decision equals the
    model's (a list of one timestamp per unit), while the log holds one member per
    admitted request."""
    limit, events = case
    text = POLICY.replace(f"{LIMIT}/1m", f"{limit}/1m")
    clock = TestClock(start_us=START_US + 17)
    model = SlidingLogModel(limit, 60 * US)
    who = uuid.uuid4().hex
    admitted = 0
    with Limiter(policy.loads(text), redis_url=redis_server.url, test_clock=clock) as limiter:
        for step, cost, op in events:
            clock.advance(step)
            decision = (limiter.hit if op == "hit" else limiter.peek)("x", who, cost=cost)
            assert as_expected(decision) == model.decide(clock.us, cost, consume=op == "hit")
            admitted += op == "hit" and decision.allowed
        with redis_server.client() as admin:
            assert admin.zcard(_key(who)) <= admitted
