"""Redis stopped, killed, hung (SIGSTOP), restarted empty: the failure policy holds, no
exception reaches the caller, each decision keeps to the timeout, one log line per outage,
and the limiter is back within a second of Redis. Run for Limiter and AsyncLimiter."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import edgegen_policy as policy
import pytest
import redis
from harness import RedisCluster, RedisServer, running
from limiter_support import Driver
from redis.crc import key_slot

from applimit import AsyncLimiter, BreakerState, Limiter

TIMEOUT = 0.05
# What a decision may take beyond the timeout on a busy two-core machine: scheduling and
# Python, not waiting on Redis.
SLACK = 0.2
RECOVERY = 1.0

POLICY = """
version: 1
app: {key_prefix: f, timeout: 50ms, on_redis_error: allow}
limits:
  - name: open
    app: {algorithm: sliding_log, tiers: {default: 1000/1m}}
  - name: closed
    app: {algorithm: gcra, on_redis_error: deny, tiers: {default: 1000/1m}}
  - name: shadow-closed
    app: {algorithm: sliding_window, on_redis_error: deny, enforce: false,
          tiers: {default: 1000/1m}}
"""

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sync", "async"])
async def limiter(
    request: pytest.FixtureRequest, fresh_redis_server: RedisServer
) -> AsyncIterator[Driver]:
    """A limiter of the private server, built from its URL."""
    loaded = policy.loads(POLICY)
    made: Limiter | AsyncLimiter
    if request.param == "sync":
        made = Limiter(loaded, redis_url=fresh_redis_server.url)
    else:
        made = AsyncLimiter(loaded, redis_url=fresh_redis_server.url)
    driver = Driver(made)
    yield driver
    await driver.close()


async def _timed(limiter: Driver, name: str) -> tuple[float, bool, bool]:
    # The bound is on how long the limiter waits; a full collection of the whole test run's
    # heap can pause the process for longer than SLACK (once seen late in a full run: a
    # decision of 0.34 s), so the collector is held off while a decision is timed.
    gc.disable()
    try:
        started = time.perf_counter()
        decision = await limiter.hit(name, "alice")
        return time.perf_counter() - started, decision.allowed, decision.degraded
    finally:
        gc.enable()


async def _assert_failure_policy(limiter: Driver, rounds: int = 10) -> list[float]:
    """Decisions without Redis: bounded in time, degraded, and as the policy says."""
    took: list[float] = []
    for _ in range(rounds):
        for name, allowed in (("open", True), ("closed", False)):
            elapsed, was_allowed, degraded = await _timed(limiter, name)
            assert degraded and was_allowed == allowed, name
            assert elapsed <= TIMEOUT + SLACK, f"{name} took {elapsed:.3f}s"
            took.append(elapsed)
        both = await limiter.check_request("GET", "/", "alice")
        assert both.degraded and not both.allowed
        assert [r.name for r in both.denied_by] == ["closed"]
        assert both.retry_after == 1.0
        shadow = next(r for r in both.results if r.name == "shadow-closed")
        assert shadow.shadow and not shadow.allowed
    return took


async def _recovery_time(limiter: Driver, back: Callable[[], object]) -> float:
    """Bring Redis back with ``back`` and poll until a decision is not degraded."""
    back()
    started = time.monotonic()
    while True:
        decision = await limiter.hit("open", "alice")
        if not decision.degraded:
            return time.monotonic() - started
        assert time.monotonic() - started < RECOVERY, "the limiter did not recover in time"
        # Polling interval: the condition is re-checked, nothing waits for a race.
        await asyncio.sleep(0.01)


def _outage_lines(caplog: pytest.LogCaptureFixture) -> tuple[int, int]:
    records = [r for r in caplog.records if r.name == "applimit"]
    started = sum("cannot be used" in r.getMessage() for r in records)
    ended = sum("answers again after" in r.getMessage() for r in records)
    return started, ended


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_stopped_redis_follows_the_failure_policy_and_recovers(
    limiter: Driver,
    fresh_redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    """Stopped (SIGTERM) or killed (SIGKILL): connection refused, every decision follows
    on_redis_error within the timeout, one warning for the whole outage; restarted empty,
    the limiter is back within a second and counts from zero."""
    caplog.set_level(logging.INFO, logger="applimit")
    assert (await limiter.hit("open", "alice")).remaining == 999
    getattr(fresh_redis_server, how)()
    await _assert_failure_policy(limiter)
    assert _outage_lines(caplog) == (1, 0)
    assert limiter.limiter.breaker_state is BreakerState.OPEN
    took = await _recovery_time(limiter, fresh_redis_server.start)
    assert took < RECOVERY
    assert limiter.limiter.breaker_state is BreakerState.CLOSED
    assert _outage_lines(caplog) == (1, 1)
    # Persistence is off, so the server came back empty: the count starts over, and the
    # script is loaded again after NOSCRIPT.
    assert (await limiter.hit("open", "alice")).remaining == 998


async def test_hung_redis_costs_one_timeout_per_decision_at_most(
    limiter: Driver, fresh_redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP: connections hang. The first decisions each wait out the timeout and no
    longer, then the breaker opens and decisions are immediate; after SIGCONT the limiter
    is back within a second."""
    caplog.set_level(logging.INFO, logger="applimit")
    assert not (await limiter.hit("open", "alice")).degraded
    fresh_redis_server.pause()
    try:
        took = await _assert_failure_policy(limiter, rounds=20)
        # Three failures open the breaker; from then on only a probe every 0.25 s waits.
        slow = [t for t in took if t >= TIMEOUT * 0.8]
        assert 1 <= len(slow) <= 8
        assert _outage_lines(caplog) == (1, 0)
    finally:
        took_back = await _recovery_time(limiter, fresh_redis_server.resume)
    assert took_back < RECOVERY
    assert _outage_lines(caplog) == (1, 1)
    # A command that timed out was still in the socket buffer of the frozen server, which
    # ran it on SIGCONT: such a request was answered by the failure policy and may count
    # as well. That errs on the safe side, and only the few calls that waited can do it.
    remaining = (await limiter.hit("open", "alice")).remaining
    assert 998 - 8 <= remaining <= 998


async def test_restart_and_script_flush_mid_run(
    limiter: Driver, fresh_redis_server: RedisServer
) -> None:
    """A restart between two decisions (the pooled connections die, the script cache is
    empty) and a SCRIPT FLUSH: no exception, and decisions are exact again at once or
    within the recovery time."""
    for _ in range(3):
        await limiter.hit("open", "bob")
    took = await _recovery_time(limiter, fresh_redis_server.restart)
    assert took < RECOVERY
    # The restarted server is empty: bob starts over.
    assert (await limiter.hit("open", "bob")).remaining == 999
    with fresh_redis_server.client() as admin:
        admin.script_flush()
    after = await limiter.hit("open", "bob")
    assert not after.degraded and after.remaining == 998


@pytest.fixture(scope="module")
def private_cluster() -> Iterator[RedisCluster]:
    """A cluster of this module's own, since these tests freeze one of its masters."""
    with running(RedisCluster()) as cluster:
        yield cluster


@pytest.mark.cluster
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_one_hung_cluster_master_degrades_only_its_own_keys(
    private_cluster: RedisCluster, caplog: pytest.LogCaptureFixture, flavour: str
) -> None:
    """SIGSTOP on one master: identities whose slot it serves follow the failure policy
    within the timeout (its breaker opens: one warning), the others are decided exactly
    as before; after SIGCONT everything is back within a second."""
    caplog.set_level(logging.INFO, logger="applimit")
    loaded = policy.loads(POLICY)
    made: Limiter | AsyncLimiter
    if flavour == "sync":
        made = Limiter(loaded, redis_url=private_cluster.url, cluster=True)
    else:
        made = AsyncLimiter(loaded, redis_url=private_cluster.url, cluster=True)
    limiter = Driver(made)
    users = [f"user-{i}" for i in range(24)]
    try:
        # The first decisions also discover the cluster (slots, nodes): on a busy machine
        # that may take longer than the 50 ms timeout, so wait until every identity is
        # decided by Redis.
        started = time.monotonic()
        while any([(await limiter.hit("open", who)).degraded for who in users]):
            assert time.monotonic() - started < 10, "the cluster never answered"
            await asyncio.sleep(0.05)
        caplog.clear()
        victim = private_cluster.masters()[0]
        on_victim = {who for who in users if victim.owns_slot(key_slot(f"{{u={who}}}".encode()))}
        assert on_victim and len(on_victim) < len(users)
        server = private_cluster.node(victim.port)
        server.pause()
        try:
            for _ in range(3):
                for who in users:
                    started = time.perf_counter()
                    decision = await limiter.hit("open", who)
                    assert time.perf_counter() - started <= TIMEOUT + SLACK
                    assert decision.degraded == (who in on_victim), who
                    assert decision.allowed
        finally:
            server.resume()
        started = time.monotonic()
        while any([(await limiter.hit("open", who)).degraded for who in sorted(on_victim)]):
            assert time.monotonic() - started < RECOVERY
            await asyncio.sleep(0.01)
        warnings = [r for r in caplog.records if "cannot be used" in r.getMessage()]
        assert len(warnings) == 1 and str(victim.port) in warnings[0].getMessage()
    finally:
        await limiter.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("cluster", [False, True])
async def test_redis_down_from_the_start(flavour: str, cluster: bool) -> None:
    """Nothing listens at the URL when the limiter starts: building it does not fail, and
    decisions follow the failure policy quickly (a cluster client, which connects when it
    is made, is retried only when the breaker allows)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    loaded = policy.loads(POLICY)
    made: Limiter | AsyncLimiter
    if flavour == "sync":
        made = Limiter(loaded, redis_url=url, cluster=cluster)
    else:
        made = AsyncLimiter(loaded, redis_url=url, cluster=cluster)
    limiter = Driver(made)
    try:
        for _ in range(10):
            elapsed, allowed, degraded = await _timed(limiter, "open")
            assert degraded and allowed and elapsed <= TIMEOUT + SLACK
            _, allowed, degraded = await _timed(limiter, "closed")
            assert degraded and not allowed
        assert made.breaker_state is BreakerState.OPEN
    finally:
        await limiter.close()


# --- Redis out of memory -------------------------------------------------------------------


def _fill(admin: redis.Redis) -> None:
    """Write until the server refuses writes (maxmemory reached, noeviction), then set
    maxmemory a little below what is used: at the edge, a small write can still squeeze
    in whenever a client's buffers are freed, which would be a (brief) recovery."""
    index = 0
    while True:
        try:
            admin.set(f"filler:{index}", "x" * 4096)
        except redis.exceptions.OutOfMemoryError:
            break
        index += 1
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used - 512 * 1024)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        admin.set("filler:probe", "x")


def _refusals(caplog: pytest.LogCaptureFixture) -> int:
    return sum("refused Redis Functions" in r.getMessage() for r in caplog.records)


def _script_commands(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("fcall", "evalsha", "eval")
    }


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("functions", [True, False], ids=["fcall", "evalsha"])
async def test_redis_out_of_memory_is_one_outage_not_a_refusal_of_functions(
    caplog: pytest.LogCaptureFixture, flavour: str, functions: bool
) -> None:
    """maxmemory with noeviction, filled up: decisions that would write follow the failure
    policy (fail open or closed), the limiter keeps using Redis Functions where it did (an
    OOM is not a refusal of FCALL), and the outage is logged twice, once when it starts
    and once when it ends, however many probes meet the full server in between (with
    EVALSHA, peeks are still answered: they write nothing). CONFIG SET maxmemory 0 ends
    it within a second."""
    caplog.set_level(logging.INFO, logger="applimit")
    server = RedisServer(extra_args=["--maxmemory", "8mb", "--maxmemory-policy", "noeviction"])
    with running(server), server.client() as admin:
        url = server.url
        if not functions:
            # An ACL without FCALL, as on Redis before 7: the limiter uses EVALSHA.
            admin.acl_setuser(
                "scripts", enabled=True, passwords=["+pw"], keys=["f:*"],
                commands=["+@all", "-fcall", "-function"],
            )  # fmt: skip
            url = f"redis://scripts:pw@127.0.0.1:{server.port}/0"
        loaded = policy.loads(POLICY)
        made: Limiter | AsyncLimiter
        # Probes every 20 ms: a breaker that flaps would show it many times over.
        if flavour == "sync":
            made = Limiter(loaded, redis_url=url, recovery_time=0.02)
        else:
            made = AsyncLimiter(loaded, redis_url=url, recovery_time=0.02)
        limiter = Driver(made)
        try:
            for name in ("open", "closed"):
                assert not (await limiter.hit(name, "alice")).degraded
            before = _script_commands(admin)
            refusals = _refusals(caplog)
            _fill(admin)
            ended = time.monotonic() + 0.6
            rounds = 0
            while time.monotonic() < ended:
                rounds += 1
                for name, allowed in (("open", True), ("closed", False)):
                    decision = await limiter.hit(name, "alice")
                    assert decision.degraded and decision.allowed == allowed, name
                both = await limiter.check_request("GET", "/", "bob")
                assert both.degraded and not both.allowed
                peek = await limiter.peek("open", "alice")
                if not peek.degraded:
                    # Answered by Redis (EVALSHA; FCALL is refused as a whole): exactly.
                    assert not functions and peek.remaining == 999
            assert rounds > 20
            assert _outage_lines(caplog) == (1, 0)
            assert _refusals(caplog) == refusals == (0 if functions else 1)
            assert made.breaker_state is not BreakerState.CLOSED
            took = await _recovery_time(limiter, lambda: admin.config_set("maxmemory", 0))
            assert took < RECOVERY
            assert _outage_lines(caplog) == (1, 1)
            after = await limiter.hit("closed", "alice")
            assert after.allowed and not after.degraded
            used = {k: v - before[k] for k, v in _script_commands(admin).items()}
            if functions:
                # Still FCALL: the full server never made the limiter give up Functions.
                assert used["evalsha"] == used["eval"] == 0 and used["fcall"] > 0
            else:
                assert used["fcall"] == 0 and used["evalsha"] > 0
        finally:
            await limiter.close()
