"""The limiter's own wires (applimit/_wire.py, applimit/_awire.py): connections they hold
between decisions, batches of concurrent async calls, and what happens to both when
connections die, a process forks, one call of a batch fails, or callers outnumber the
pool; and on Redis Cluster, a wire per master. The contract, fault and deployment suites
run over the same wires; these tests are about their own mechanics."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import edgegen_policy as policy
import pytest
import redis
from harness import RedisCluster, RedisServer
from limiter_support import Driver

from applimit import AsyncLimiter, BreakerState, Limiter, _hiredis, _script, _wire

POLICY = """
version: 1
app: {key_prefix: w, timeout: 2s, on_redis_error: allow}
limits:
  - name: log
    app: {algorithm: sliding_log, tiers: {default: 1000/1m}}
  - name: bucket
    app: {algorithm: gcra, tiers: {default: 5/1m}}
"""


def _limiter(server: RedisServer, **options: Any) -> Limiter:
    return Limiter(policy.loads(POLICY), redis_url=server.url, **options)


def _async_limiter(server: RedisServer, **options: Any) -> AsyncLimiter:
    return AsyncLimiter(policy.loads(POLICY), redis_url=server.url, **options)


def _clients(admin: redis.Redis) -> int:
    """Connections to the server other than the admin's own."""
    return len(admin.client_list()) - 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_connections_closed_while_idle_are_replaced_unnoticed(
    fresh_redis_server: RedisServer, flavour: str
) -> None:
    """CLIENT KILL of every connection the limiter holds idle (as a restart, the server's
    `timeout` or a proxy's idle cutoff would close them): the next decisions are exact,
    none degraded, and the breaker never hears of it."""
    admin = fresh_redis_server.client()
    driver = _driver(flavour, fresh_redis_server.url)
    try:
        assert (await driver.hit("log", "alice")).remaining == 999
        for expected in (998, 997):
            assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            decision = await driver.hit("log", "alice")
            assert not decision.degraded and decision.remaining == expected
        assert driver.limiter.breaker_state is BreakerState.CLOSED
    finally:
        await driver.close()
        admin.close()


def test_threads_beyond_max_connections_share_the_pool_bound(
    fresh_redis_server: RedisServer,
) -> None:
    """Sixteen threads on a limiter of four connections: each decision holds a connection
    only while it runs, so all of them are made, exactly, on at most four connections."""
    admin = fresh_redis_server.client()
    limiter = _limiter(fresh_redis_server, max_connections=4)
    barrier = threading.Barrier(16)
    results: list[bool] = []

    def work() -> None:
        barrier.wait()
        for _ in range(25):
            decision = limiter.hit("log", "shared")
            results.append(decision.allowed and not decision.degraded)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 400
    assert limiter.peek("log", "shared").remaining == 600
    assert _clients(admin) <= 4
    # reset runs on the same connections, so it finds one although all are idle with
    # the limiter rather than in the pool.
    assert limiter.reset("log", "shared")
    assert limiter.peek("log", "shared").remaining == 1000
    limiter.close()
    assert _clients(admin) == 0
    admin.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_use_the_parents_connections(
    fresh_redis_server: RedisServer,
) -> None:
    """After fork the child leaves the parent's idle connections alone (two processes on
    one socket would read each other's replies) and opens its own; the parent's keep
    working, and both count against the same limit."""
    admin = fresh_redis_server.client()
    with _limiter(fresh_redis_server) as limiter:
        assert limiter.hit("log", "forked").remaining == 999
        opened = admin.info("stats")["total_connections_received"]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                decisions = [limiter.hit("log", "forked") for _ in range(10)]
                if all(d.allowed and not d.degraded for d in decisions):
                    os.write(write, str(decisions[-1].remaining).encode())
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        os.close(write)
        child_saw = int(os.read(read, 64))
        os.close(read)
        assert child_saw == 989
        # The child connected on its own (the admin's INFO call is not a new connection).
        assert admin.info("stats")["total_connections_received"] == opened + 1
        parent = limiter.hit("log", "forked")
        assert not parent.degraded and parent.remaining == 988
        # ...and the parent kept its connection.
        assert admin.info("stats")["total_connections_received"] == opened + 1
    admin.close()


async def test_one_failing_call_in_a_batch_fails_alone(redis_server: RedisServer) -> None:
    """A batch of concurrent calls where one key holds a value of the wrong type (written
    by something else): that decision follows the failure policy, the others in the same
    pipeline are exact, and the breaker stays closed (Redis is fine)."""
    admin = redis_server.client()
    admin.set("w:log:{u=broken}:1m:log", "not a sorted set")
    async with _async_limiter(redis_server) as limiter:
        who = [f"user-{i}" for i in range(20)]
        decisions = await asyncio.gather(
            limiter.hit("log", "broken"), *(limiter.hit("log", w) for w in who)
        )
        assert decisions[0].degraded and decisions[0].allowed
        assert all(d.allowed and not d.degraded and d.remaining == 999 for d in decisions[1:])
        assert limiter.breaker_state is BreakerState.CLOSED
    admin.delete("w:log:{u=broken}:1m:log")
    admin.close()


async def test_a_run_of_several_calls_gives_each_its_own_outcome_in_order(
    redis_server: RedisServer,
) -> None:
    """The wire's contract for a Send of several calls (one Redis takes them in one
    batch): one outcome per call, in the calls' order, an error reply its own call's
    outcome, not raised."""
    admin = redis_server.client()
    admin.set("w:log:{u=wrong}:1m:log", "not a sorted set")
    async with _async_limiter(redis_server) as limiter:
        calls = tuple(
            limiter.core.for_limit("hit", "log", who, None, 1).calls[0]
            for who in ("first", "wrong", "third")
        )
        outcomes = await limiter._wire.run(calls)
    assert len(outcomes) == 3
    assert isinstance(outcomes[1], redis.exceptions.ResponseError)
    assert "WRONGTYPE" in str(outcomes[1])
    for reply in (outcomes[0], outcomes[2]):
        # {now, n, allowed, consumed, remaining, ...}: each call counted its own hit.
        assert isinstance(reply, list) and reply[1:5] == [1, 1, 1, 999]
    admin.delete("w:log:{u=wrong}:1m:log")
    admin.close()


async def test_concurrent_decisions_on_one_identity_stay_exact(
    redis_server: RedisServer,
) -> None:
    """Hundreds of concurrent hits on one identity, batched: each call is still its own
    atomic script, so exactly the quota is admitted and each remaining count is unique."""
    async with _async_limiter(redis_server) as limiter:
        decisions = await asyncio.gather(*(limiter.hit("bucket", "crowd") for _ in range(300)))
    admitted = [d for d in decisions if d.allowed]
    assert len(admitted) == 5
    assert sorted(d.remaining for d in admitted) == [0, 1, 2, 3, 4]
    assert all(not d.degraded for d in decisions)
    assert all(d.retry_after is not None and d.retry_after > 0 for d in decisions if not d.allowed)


async def test_decisions_of_one_event_loop_turn_share_one_write(
    fresh_redis_server: RedisServer,
) -> None:
    """200 decisions requested in the same turn of the event loop go to Redis as one batch
    on one connection (a pool of 64 would open dozens for one call each), and each caller
    gets its own answer: 200 distinct remaining counts."""
    admin = fresh_redis_server.client()
    limiter = AsyncLimiter(
        policy.loads(POLICY), redis_url=fresh_redis_server.url, max_connections=64
    )
    try:
        assert (await limiter.hit("log", "batched")).remaining == 999
        opened = admin.info("stats")["total_connections_received"]
        decisions = await asyncio.gather(*(limiter.hit("log", "batched") for _ in range(200)))
        assert admin.info("stats")["total_connections_received"] - opened <= 1
        assert sorted(d.remaining for d in decisions) == list(range(799, 999))
        assert not any(d.degraded for d in decisions)
    finally:
        await limiter.aclose()
        admin.close()


@pytest.mark.parametrize(("callers", "half"), [(256, 128), (64, 32), (40, 32)])
async def test_callers_in_a_loop_settle_in_two_batches_that_take_turns(
    redis_server: RedisServer, callers: int, half: int
) -> None:
    """Callers deciding in a loop are answered half of them at a time (at least 32):
    while one half's next calls are sent, Redis works on the other's. Each batch is then
    a half: 256 callers in batches of 128, not the 32 to 96 a fixed part of 32 gave
    them. Fewer than 64 callers are answered 32 at a time, as before. Every call is
    still answered, and nothing stays counted in flight afterwards."""
    limiter = _async_limiter(redis_server)
    sizes: list[int] = []
    try:
        assert not (await limiter.hit("log", "warm")).degraded
        wire = limiter._wire
        assert wire is not None
        round_trip = wire._round_trip

        async def recorded(calls: list[Any], *, asking: bool = False) -> Any:
            sizes.append(len(calls))
            return await round_trip(calls, asking=asking)

        wire._round_trip = recorded  # type: ignore[method-assign]

        async def caller(index: int) -> int:
            degraded = 0
            for turn in range(12):
                decision = await limiter.hit("log", f"loop-{index}-{turn % 3}")
                degraded += decision.degraded
            return degraded

        assert sum(await asyncio.gather(*(caller(i) for i in range(callers)))) == 0
        assert sum(sizes) == callers * 12
        assert wire._in_flight == 0
    finally:
        await limiter.aclose()
    # The first batch holds every caller; the steady state, batches of a half (two
    # halves' callers now and then meet in one batch when Redis answers both at once).
    steady = sorted(sizes[1:-2])
    assert steady[len(steady) // 2] == min(half, callers)
    assert max(steady) <= callers


async def test_callers_past_their_deadline_behind_a_busy_loop_are_not_an_outage(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The event loop is blocked (a slow handler) after five callers submitted and before
    their batch is sent: at their deadline they get the failure policy, marked degraded,
    with one log line saying the process was too busy, and the breaker is not told:
    Redis answered, and the late replies are dropped. Redis did run those calls, so they
    count."""
    caplog.set_level(logging.WARNING, logger="applimit")
    text = POLICY.replace("timeout: 2s", "timeout: 50ms")
    limiter = AsyncLimiter(policy.loads(text), redis_url=redis_server.url)
    try:
        assert not (await limiter.hit("log", "busy")).degraded
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(limiter.hit("log", "busy")) for _ in range(5)]
        # Runs after the callers have submitted, before their batch is flushed.
        loop.call_soon(time.sleep, 0.15)
        late = await asyncio.gather(*tasks)
        assert all(d.degraded and d.allowed for d in late)
        assert limiter.breaker_state is BreakerState.CLOSED
        after = await limiter.hit("log", "busy")
        assert not after.degraded and after.remaining == 1000 - 7
        # Written once Redis answered again with no outage in between (a hung Redis looks
        # the same at the deadline, and is an outage instead).
        assert any("took longer than app.timeout" in r.getMessage() for r in caplog.records)
    finally:
        await limiter.aclose()


# --- Redis Functions -----------------------------------------------------------------------


def _driver(flavour: str, url: str) -> Driver:
    loaded = policy.loads(POLICY)
    if flavour == "sync":
        return Driver(Limiter(loaded, redis_url=url))
    return Driver(AsyncLimiter(loaded, redis_url=url))


def _calls(admin: redis.Redis, command: str) -> int:
    stats = admin.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_the_library_is_loaded_once_and_called_by_name(
    fresh_redis_server: RedisServer, flavour: str
) -> None:
    """On a server without the library the first decision loads it (FUNCTION LOAD) and
    every decision is one FCALL; a FUNCTION FLUSH later (or a restart) is met the same
    way, and the counts carry on."""
    admin = fresh_redis_server.client()
    driver = _driver(flavour, fresh_redis_server.url)
    try:
        for expected in range(999, 994, -1):
            assert (await driver.hit("log", "fn")).remaining == expected
        libraries = [dict(zip(lib[::2], lib[1::2], strict=True)) for lib in admin.function_list()]
        assert [lib[b"library_name"] for lib in libraries] == [_script.FUNCTION.encode()]
        assert _calls(admin, "function|load") == 1
        assert _calls(admin, "evalsha") == _calls(admin, "eval") == 0
        assert _calls(admin, "fcall") == 5 + 1  # the first call met "Function not found"
        admin.function_flush()
        assert (await driver.hit("log", "fn")).remaining == 994
        assert _calls(admin, "function|load") == 2
    finally:
        await driver.close()
        admin.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize(
    "denied",
    [["-fcall", "-function"], ["-function"]],
    ids=["no-fcall", "no-function-load"],
)
async def test_where_functions_are_refused_evalsha_takes_over(
    fresh_redis_server: RedisServer,
    flavour: str,
    denied: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ACL that refuses FCALL, or only FUNCTION LOAD (as Redis before 7 knows neither):
    decisions stay exact, the limiter says once that it uses EVALSHA, and does."""
    caplog.set_level(logging.INFO, logger="applimit")
    admin = fresh_redis_server.client()
    admin.acl_setuser(
        "scripts",
        enabled=True,
        passwords=["+pw"],
        keys=["w:*"],
        commands=["+@all", *denied],
    )
    url = f"redis://scripts:pw@127.0.0.1:{fresh_redis_server.port}/0"
    driver = _driver(flavour, url)
    try:
        remaining = [(await driver.hit("log", "acl")).remaining for _ in range(4)]
        assert remaining == [999, 998, 997, 996]
        said = [r for r in caplog.records if "refused Redis Functions" in r.getMessage()]
        assert len(said) == 1
        assert _calls(admin, "evalsha") >= 3
        assert admin.function_list() == []
    finally:
        await driver.close()
        admin.close()


def test_seeding_random_does_not_repeat_nonces(redis_server: RedisServer) -> None:
    """The nonces that name sliding-log entries come from the limiter's own generator: an
    app that seeds `random` before every request (or workers that all seed it alike) does
    not make two requests share an entry, so exactly the quota is admitted."""
    import random

    text = POLICY.replace("1000/1m", "3/1m")
    with Limiter(policy.loads(text), redis_url=redis_server.url) as limiter:
        admitted = 0
        for _ in range(6):
            random.seed(1234)
            admitted += limiter.hit("log", "seeded").allowed
    assert admitted == 3


async def test_an_unexpected_error_in_a_batch_reaches_its_callers(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that ends with an error nobody planned for (a bug) fails its callers with
    it at once; none is left waiting for a deadline that went with the batch."""
    async with _async_limiter(redis_server) as limiter:
        assert not (await limiter.hit("log", "bug")).degraded
        wire = limiter._wire
        assert wire is not None

        async def broken(calls: object) -> list[object]:
            raise RuntimeError("a bug in the batch")

        monkeypatch.setattr(wire, "_round_trip", broken)
        with pytest.raises(RuntimeError, match="a bug in the batch"):
            await asyncio.wait_for(limiter.hit("log", "bug"), timeout=10)


# --- the limiter's own pool ----------------------------------------------------------------

CLOSED_POLICY = """
version: 1
app: {key_prefix: w, timeout: 50ms, on_redis_error: deny}
limits:
  - name: log
    app: {algorithm: sliding_log, tiers: {default: 100000/1m}}
"""


def _outages(caplog: pytest.LogCaptureFixture) -> int:
    return sum("cannot be used" in r.getMessage() for r in caplog.records)


def test_a_wait_for_the_limiters_own_connections_is_not_a_redis_failure(
    fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every connection of the pool busy for the whole timeout (here the one connection,
    held): each decision that waited follows its limit's failure policy (fail closed:
    denied, degraded), and that is all. Redis answered every call it got, so the breaker
    stays closed and logs no outage, and the moment a connection is free decisions are
    made by Redis again. One line says what happened, and what to change."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = Limiter(
        policy.loads(CLOSED_POLICY), redis_url=fresh_redis_server.url, max_connections=1
    )
    try:
        assert limiter.hit("log", "pool").remaining == 99_999
        wire = limiter._wire
        assert wire is not None
        held = wire._idle.pop()  # as a decision in another thread would hold it
        try:
            for _ in range(5):
                started = time.perf_counter()
                decision = limiter.hit("log", "pool")
                assert decision.degraded and not decision.allowed
                assert time.perf_counter() - started < 0.05 + 0.2
            assert limiter.breaker_state is BreakerState.CLOSED
        finally:
            wire._idle.append(held)
        after = limiter.hit("log", "pool")
        assert not after.degraded and after.remaining == 99_998
        assert _outages(caplog) == 0
        said = [r for r in caplog.records if "max_connections" in r.getMessage()]
        assert len(said) == 1
    finally:
        limiter.close()


def test_threads_waiting_for_a_small_pool_do_not_open_the_breaker(
    fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Sixteen threads on four connections with a 50 ms timeout, failing closed, while
    Redis is well: waiting for a connection never reads as an outage (no breaker, no
    outage lines), and the waiters are served in turn, so nearly every decision is made
    by Redis (a thread that waited out the timeout would be refused)."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = Limiter(
        policy.loads(CLOSED_POLICY), redis_url=fresh_redis_server.url, max_connections=4
    )
    assert not limiter.peek("log", "warm-up").degraded
    barrier = threading.Barrier(16)
    refused: list[int] = []

    def work(index: int) -> None:
        barrier.wait()
        count = 0
        for _ in range(300):
            decision = limiter.hit("log", f"thread-{index}")
            count += not decision.allowed
            assert decision.allowed or decision.degraded
        refused.append(count)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(refused) == 16
        assert _outages(caplog) == 0
        assert limiter.breaker_state is BreakerState.CLOSED
        assert sum(refused) <= 16 * 300 // 50, f"{sum(refused)} of 4800 refused"
    finally:
        limiter.close()


async def test_a_wait_for_the_async_limiters_own_connections_is_not_a_redis_failure(
    fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for AsyncLimiter: its pool's one connection held elsewhere, a batch that
    waits out the timeout for it is answered by the failure policy, the breaker is not
    told, and the next batch, with the connection free, is decided by Redis."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = AsyncLimiter(
        policy.loads(CLOSED_POLICY), redis_url=fresh_redis_server.url, max_connections=1
    )
    try:
        assert (await limiter.hit("log", "pool")).remaining == 99_999
        wire = limiter._wire
        assert wire is not None
        # The one connection: kept by the wire since the last batch, else in the pool.
        held = wire._idle.pop() if wire._idle else await wire._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            for _ in range(5):
                decisions = await asyncio.gather(*(limiter.hit("log", "pool") for _ in range(3)))
                assert all(d.degraded and not d.allowed for d in decisions)
            assert limiter.breaker_state is BreakerState.CLOSED
        finally:
            await wire._pool.release(held)
        after = await limiter.hit("log", "pool")
        assert not after.degraded and after.remaining == 99_998
        assert _outages(caplog) == 0
        said = [r for r in caplog.records if "max_connections" in r.getMessage()]
        assert len(said) == 1
    finally:
        await limiter.aclose()


async def test_the_async_wire_keeps_its_connections_between_batches(
    fresh_redis_server: RedisServer,
) -> None:
    """Batches one after another take the connection the last one kept, not one from
    redis-py's pool: the pool is asked once for 50 decisions. A kept connection the
    server has closed since (CLIENT KILL) is found closed at the next batch, which is
    sent again on a new connection: no decision is lost or degraded. Batches in flight
    together on one connection (max_connections=1) each get it in turn: a kept
    connection is never held back from a batch waiting for the pool."""
    limiter = _async_limiter(fresh_redis_server, max_connections=1)
    admin = fresh_redis_server.client()
    try:
        assert (await limiter.hit("log", "kept")).remaining == 999
        wire = limiter._wire
        assert wire is not None
        pool = wire._pool
        asked = 0
        take = pool.get_connection

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal asked
            asked += 1
            return await take(*args, **kwargs)

        pool.get_connection = counted
        for expected in range(998, 948, -1):
            decision = await limiter.hit("log", "kept")
            assert decision.remaining == expected and not decision.degraded
        assert asked == 0
        assert len(wire._idle) == 1

        killed = admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        decision = await limiter.hit("log", "kept")
        assert decision.remaining == 948 and not decision.degraded

        # Callers that start over five turns of the event loop: a batch per turn, the
        # later ones waiting for the connection an earlier one holds.
        async def caller(index: int) -> bool:
            for _ in range(index % 5):
                await asyncio.sleep(0)
            return (await limiter.hit("log", f"turn-{index}")).degraded

        for _ in range(3):
            assert not any(await asyncio.gather(*(caller(i) for i in range(40))))
    finally:
        await limiter.aclose()
        admin.close()
    assert wire._idle == []


async def test_a_reset_gets_the_connection_the_async_wire_keeps(
    fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """With one connection, kept by the wire after a decision, reset() (DEL, sent once on
    a connection of the pool) still gets it at once: the keys are gone, no outage is
    logged, and the next decision starts from a full quota."""
    caplog.set_level(logging.INFO, logger="applimit")
    limiter = _async_limiter(fresh_redis_server, max_connections=1)
    try:
        assert (await limiter.hit("log", "reset")).remaining == 999
        assert (await limiter.hit("log", "reset")).remaining == 998
        await asyncio.wait_for(limiter.reset("log", "reset"), timeout=0.5)
        assert (await limiter.hit("log", "reset")).remaining == 999
        assert _outages(caplog) == 0
    finally:
        await limiter.aclose()


# --- Redis Cluster -------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_on_a_cluster_each_master_is_called_by_name(
    redis_cluster: RedisCluster, cluster_client: Any, flavour: str
) -> None:
    """Both limiters send their calls to each master themselves, as FCALL: a master
    without the library is sent FUNCTION LOAD once, and no call is an EVALSHA."""
    masters = redis_cluster.masters()
    for master in masters:
        with master.client() as node:
            node.function_flush()
            node.config_resetstat()
    loaded = policy.loads(POLICY)
    made: Limiter | AsyncLimiter
    if flavour == "sync":
        made = Limiter(loaded, redis_url=redis_cluster.url, cluster=True)
    else:
        made = AsyncLimiter(loaded, redis_url=redis_cluster.url, cluster=True)
    driver = Driver(made)
    who = [f"user-{i}" for i in range(30)]
    try:
        for _ in range(2):
            decisions = [await driver.hit("log", w) for w in who]
            assert all(d.allowed and not d.degraded for d in decisions)
        for master in masters:
            with master.client() as node:
                assert _calls(node, "function|load") == 1, master.port
                assert _calls(node, "fcall") >= 2
                assert _calls(node, "evalsha") == _calls(node, "eval") == 0
    finally:
        await driver.close()


@pytest.mark.parametrize("read", ["direct", "per_reply"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_replies_read_either_way(
    redis_server: RedisServer, flavour: str, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wires read replies from the connection's hiredis reader itself (the async one
    a whole batch in one loop), or reply by reply through redis-py where the connection's
    parser is not the one they know (another redis-py; here, told so): the same decisions
    either way, an error reply still its own call's, the breaker closed."""
    if read == "per_reply":
        monkeypatch.setattr(_hiredis, "_SYNC_PARSER", None)
        monkeypatch.setattr(_hiredis, "_ASYNC_PARSER", None)
    admin = redis_server.client()
    tag = f"{flavour}-{read}"
    broken = f"w:log:{{u=broken-{tag}}}:1m:log"
    admin.set(broken, "not a sorted set")
    driver = _driver(flavour, redis_server.url)
    try:
        who = [f"{tag}-{i}" for i in range(50)]
        first = [await driver.hit("log", w) for w in who]
        failed = await driver.hit("log", f"broken-{tag}")
        again = [await driver.hit("log", w) for w in who]
        if flavour == "async":
            limiter = driver.limiter
            assert isinstance(limiter, AsyncLimiter)
            batch = await asyncio.gather(
                *(limiter.hit("log", w) for w in who), limiter.hit("log", f"broken-{tag}")
            )
            assert [d.remaining for d in batch[:-1]] == [997] * 50
            assert batch[-1].degraded and batch[-1].allowed
        assert [d.remaining for d in first] == [999] * 50
        assert [d.remaining for d in again] == [998] * 50
        assert not any(d.degraded for d in first + again)
        assert failed.degraded and failed.allowed
        assert driver.limiter.breaker_state is BreakerState.CLOSED
    finally:
        await driver.close()
        admin.delete(broken)
        admin.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_push_message_before_a_reply_is_not_taken_for_one(
    fresh_redis_server: RedisServer, flavour: str
) -> None:
    """RESP3 lets a server push a message on a connection between replies (here a client-
    tracking invalidation, on the limiter's one connection where tracking was turned on):
    the reply read after it skips the push, and every caller gets its own reply."""
    admin = fresh_redis_server.client()
    loaded = policy.loads(POLICY)
    url = fresh_redis_server.url + "?protocol=3"
    driver = Driver(
        Limiter(loaded, redis_url=url, max_connections=1)
        if flavour == "sync"
        else AsyncLimiter(loaded, redis_url=url, max_connections=1)
    )
    try:
        assert (await driver.hit("log", "tracked")).remaining == 999
        if isinstance(driver.limiter, AsyncLimiter):
            # The one connection, kept by the wire since the last batch.
            (connection,) = driver.limiter._wire._idle
            await connection.send_command("CLIENT", "TRACKING", "ON")
            assert await connection.read_response() in (b"OK", "OK")
            await connection.send_command("GET", "watched")
            assert await connection.read_response() is None
        else:
            (connection,) = driver.limiter._wire._idle
            connection.send_command("CLIENT", "TRACKING", "ON")
            assert connection.read_response() in (b"OK", "OK")
            connection.send_command("GET", "watched")
            assert connection.read_response() is None
        admin.set("watched", "changed")  # an invalidation is pushed to that connection
        decisions = [await driver.hit("log", "tracked") for _ in range(20)]
        assert [d.remaining for d in decisions] == list(range(998, 978, -1))
        assert not any(d.degraded for d in decisions)
        assert driver.limiter.breaker_state is BreakerState.CLOSED
    finally:
        await driver.close()
        admin.close()


# -- the sync wire's blocking sockets ------------------------------------------------------

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="kernel socket timeouts are set on Linux only"
)


def _kernel_timeouts(sock: socket.socket) -> tuple[tuple[int, int], tuple[int, int]]:
    """The socket's SO_SNDTIMEO and SO_RCVTIMEO, as (seconds, microseconds)."""
    size = _wire._TIMEVAL.size
    send = _wire._TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, size))
    receive = _wire._TIMEVAL.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, size))
    return send, receive


@linux_only
def test_the_sync_wire_reads_a_blocking_socket_bounded_by_the_kernel(
    fresh_redis_server: RedisServer,
) -> None:
    """A decision's connection is a blocking socket (no Python timeout, so no `poll`
    before its send and its receive) whose send and receive timeouts are the policy's, set
    in the kernel; a connection made anew after the server closed the last one is treated
    the same way; decisions stay exact throughout."""
    admin = fresh_redis_server.client()
    limiter = _limiter(fresh_redis_server)
    try:
        assert limiter.hit("log", "alice").remaining == 999
        assert limiter.hit("log", "alice").remaining == 998
        (connection,) = limiter._wire._idle
        first = connection._sock
        assert first.gettimeout() is None
        assert _kernel_timeouts(first) == ((2, 0), (2, 0))
        assert getattr(connection, _wire._DIRECT) is first
        assert admin.client_kill_filter(_type="normal", skipme=True) == 1
        assert limiter.hit("log", "alice").remaining == 997
        again = connection._sock
        assert again is not first and again.gettimeout() is None
        assert getattr(connection, _wire._DIRECT) is again
        assert _kernel_timeouts(again) == ((2, 0), (2, 0))
        decision = limiter.hit("log", "alice")
        assert not decision.degraded and decision.remaining == 996
    finally:
        limiter.close()
        admin.close()


@linux_only
@pytest.mark.parametrize(
    ("timeout", "expected"),
    [
        (2.5, (2, 500_000)),
        (0.05, (0, 50_000)),
        # A zero timeval would be no timeout at all.
        (1e-7, (0, 1)),
        (1.9999996, (2, 0)),
        # No timeout: blocking for good, as redis-py's own socket would be.
        (None, (0, 0)),
    ],
)
def test_kernel_timeouts_are_the_connections_own(
    redis_server: RedisServer, timeout: float | None, expected: tuple[int, int]
) -> None:
    """The socket timeout of the connection, however small or however rounded, becomes the
    kernel's send and receive timeouts, never zero (which is no timeout) for a positive
    one. (The kernel keeps a timeout in clock ticks, so it reads back rounded up to one:
    at most 10 ms more, at the slowest tick Linux has.)"""
    connection = redis.Connection(port=redis_server.port, socket_timeout=timeout)
    try:
        connection.connect()
        _wire._adopt(connection)
        assert connection._sock.gettimeout() is None
        wanted = expected[0] * 1_000_000 + expected[1]
        for seconds, micros in _kernel_timeouts(connection._sock):
            got = seconds * 1_000_000 + micros
            assert got == 0 if timeout is None else wanted <= got <= wanted + 10_000
    finally:
        connection.disconnect()


@linux_only
@pytest.mark.parametrize("blocked", ["read", "write"])
def test_a_hung_server_times_out_the_blocking_socket(
    fresh_redis_server: RedisServer, blocked: str
) -> None:
    """SIGSTOP: a reply that never comes, and a write larger than the socket buffers hold,
    each end at the kernel's timeout as redis-py's TimeoutError (not waiting for good, as a
    blocking socket without one would), the connection closed; after SIGCONT the next call
    connects afresh."""
    loaded = policy.loads(POLICY.replace("timeout: 2s", "timeout: 300ms"))
    limiter = Limiter(loaded, redis_url=fresh_redis_server.url)
    try:
        assert limiter.hit("log", "alice").remaining == 999
        (connection,) = limiter._wire._idle
        assert getattr(connection, _wire._DIRECT) is connection._sock
        wire = limiter._wire
        fresh_redis_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError) as caught:
                if blocked == "read":
                    wire.command("PING")
                else:
                    wire.command("SET", "big", b"x" * (64 << 20))
            took = time.monotonic() - started
        finally:
            fresh_redis_server.resume()
        word = "reading from" if blocked == "read" else "writing to"
        assert str(caught.value) == f"Timeout {word} socket"
        assert isinstance(caught.value.__cause__, BlockingIOError)
        # Each send and receive may wait the timeout; one of each at most here (for the
        # write, the send that found the buffers full).
        assert 0.25 <= took < 0.3 * 2 + 1.0
        assert connection._sock is None
        assert wire.command("PING") in (b"PONG", "PONG", True)
    finally:
        limiter.close()


async def test_the_async_wire_writes_to_the_stream_and_resends_after_a_lost_connection(
    fresh_redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connected connection is written directly, not through redis-py's
    send_packed_command (whose wait_for costs a task and a timer per write); one whose
    transport was lost under it (here aborted, as a reset would) fails the write, and
    the batch, of which nothing was answered, is sent again on a new connection: exact,
    not degraded, and no outage for the breaker."""
    limiter = _async_limiter(fresh_redis_server, max_connections=1)
    try:
        assert (await limiter.hit("log", "lost")).remaining == 999
        wire = limiter._wire
        assert wire is not None
        (connection,) = wire._idle
        sent_by_redis_py = 0
        # What redis-py's send_packed_command writes with (under its wait_for): spied
        # there, since a class that overrides send_packed_command itself is always
        # written through it (see the tests below).
        send = type(connection)._send_packed_command

        async def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> None:
            nonlocal sent_by_redis_py
            # The limiter's calls, not the handshake redis-py sends as it connects.
            packed = command if isinstance(command, bytes) else b"".join(command)
            if b"FCALL" in packed:
                sent_by_redis_py += 1
            await send(self, command, *args, **kwargs)

        monkeypatch.setattr(type(connection), "_send_packed_command", counted)
        for expected in (998, 997):
            assert (await limiter.hit("log", "lost")).remaining == expected
        assert sent_by_redis_py == 0

        transport = connection._writer.transport
        transport.abort()
        # abort() tells the protocol in the event loop's next turn.
        await asyncio.sleep(0)
        assert transport.is_closing() and connection.is_connected
        decision = await limiter.hit("log", "lost")
        assert not decision.degraded and decision.remaining == 996
        # Sent again by redis-py, which connected the connection afresh.
        assert sent_by_redis_py == 1
        assert connection._writer.transport is not transport
        assert limiter.breaker_state is BreakerState.CLOSED
        assert (await limiter.hit("log", "lost")).remaining == 995
        assert sent_by_redis_py == 1
    finally:
        await limiter.aclose()


class _CountingConnection(redis.Connection):
    """A connection class that sees what it sends, as an app's tracing one would."""

    sent = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


class _AsyncCountingConnection(redis.asyncio.Connection):
    sent = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        await super().send_packed_command(command, check_health)


def test_a_connection_class_that_sends_its_own_way_sees_every_write(
    redis_server: RedisServer,
) -> None:
    """A client whose connection class overrides send_packed_command (to count or trace
    what it sends) has every decision written through it: the sync wire does not write
    such a socket itself; a plain connection class is still written directly."""
    pool = redis.ConnectionPool(
        host=redis_server.host, port=redis_server.port, connection_class=_CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    limiter = Limiter(policy.loads(POLICY), redis=client)
    try:
        _CountingConnection.sent = 0
        for expected in range(999, 989, -1):
            assert limiter.hit("log", "counted").remaining == expected
        assert _CountingConnection.sent >= 10
        (connection,) = limiter._wire._idle
        assert getattr(connection, _wire._DIRECT) is None
    finally:
        limiter.close()
        client.close()


async def test_an_async_connection_class_that_sends_its_own_way_sees_every_write(
    redis_server: RedisServer,
) -> None:
    """The same for the async wire: its batches go through the class's own
    send_packed_command, and decisions stay exact."""
    pool = redis.asyncio.ConnectionPool(
        host=redis_server.host,
        port=redis_server.port,
        connection_class=_AsyncCountingConnection,
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    limiter = AsyncLimiter(policy.loads(POLICY), redis=client)
    try:
        _AsyncCountingConnection.sent = 0
        decisions = await asyncio.gather(*(limiter.hit("log", "counted-a") for _ in range(20)))
        assert sorted(d.remaining for d in decisions) == list(range(980, 1000))
        for _ in range(5):
            await limiter.hit("log", "counted-a")
        # At least one write per batch: the gathered decisions, then each awaited one.
        assert _AsyncCountingConnection.sent >= 6
    finally:
        await limiter.aclose()
        await client.aclose()
