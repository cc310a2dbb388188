"""``Limiter(batch=True)``: the calls of concurrent threads sent together on one
connection decide exactly as one call per thread does; a hung, killed or closed Redis
degrades every waiting thread within its timeout, and the breaker opens."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import edgegen_policy as policy
import pytest
import redis
from harness import RedisCluster, RedisServer

from applimit import BreakerState, Decision, Limiter

T = TypeVar("T")

TIMEOUT = 0.05
# What a decision may take beyond its bound on a busy two-core machine: scheduling and
# Python, not waiting on Redis.
SLACK = 0.3
# A thread still running this long after the others were let go is hung.
HANG = 10.0

POLICY = """
version: 1
app: {{key_prefix: {prefix}, timeout: {timeout}, on_redis_error: allow}}
limits:
  - name: log
    app: {{algorithm: sliding_log, tiers: {{default: {rate}}}}}
  - name: window
    app: {{algorithm: sliding_window, tiers: {{default: {rate}}}}}
  - name: gcra
    app: {{algorithm: gcra, tiers: {{default: {rate}}}}}
  - name: closed
    app: {{algorithm: gcra, on_redis_error: deny, tiers: {{default: {rate}}}}}
"""


def _policy(prefix: str, *, rate: str = "50/1m", timeout: str = "50ms") -> policy.Policy:
    return policy.loads(POLICY.format(prefix=prefix, rate=rate, timeout=timeout))


def _together(count: int, work: Callable[[int], T]) -> list[tuple[T, float]]:
    """Run ``work(i)`` in ``count`` threads let go at once; each result with how long it
    took. Fails if a thread does not finish (a hang) or raised."""
    barrier = threading.Barrier(count)
    results: list[tuple[T, float] | None] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        barrier.wait()
        started = time.perf_counter()
        try:
            value = work(index)
        except BaseException as error:
            errors.append(error)
            raise
        results[index] = (value, time.perf_counter() - started)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG)
        assert not thread.is_alive(), "a thread hung"
    assert not errors, errors
    done = [result for result in results if result is not None]
    assert len(done) == count
    return done


@pytest.fixture
def limiters(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[list[Limiter]]:
    """The same policy, unbatched and batched, on the shared server (flushed); closed
    after the test. The timeout is generous: these tests are about counts, not time."""
    loaded = _policy("b", timeout="2s")
    made = [
        Limiter(loaded, redis_url=redis_server.url),
        Limiter(loaded, redis_url=redis_server.url, batch=True),
    ]
    yield made
    for limiter in made:
        limiter.close()


@pytest.mark.parametrize("name", ["log", "window", "gcra"])
def test_threads_hitting_one_identity_get_exactly_what_one_call_each_gives(
    limiters: list[Limiter], name: str
) -> None:
    """32 threads x 5 hits on one identity, limit 50: the batched limiter admits exactly
    50, as the unbatched one does, and each thread got its own reply (the admitted
    decisions' remaining counts are 49 down to 0, each once)."""
    for index, limiter in enumerate(limiters):
        identity = f"user-{index}"

        def hits(_: int, limiter: Limiter = limiter, identity: str = identity) -> list[Decision]:
            return [limiter.hit(name, identity) for _ in range(5)]

        decisions = [d for result, _ in _together(32, hits) for d in result]
        assert not any(d.degraded for d in decisions)
        admitted = [d for d in decisions if d.allowed]
        assert len(admitted) == 50, f"batch={limiter.batch}"
        if name == "log":
            assert sorted(d.remaining for d in admitted) == list(range(50))
        assert limiter.peek(name, identity).remaining == 0


def test_the_batched_limiter_decides_on_one_connection(
    limiters: list[Limiter], redis_client: redis.Redis
) -> None:
    """However many threads decide at once, the batched limiter's script calls go over
    one connection: one write at a time, the others queued behind it."""
    _, batched = limiters
    before = {client["id"] for client in redis_client.client_list()}

    def hits(index: int) -> None:
        for hit in range(10):
            batched.hit("gcra", f"spread-{index}-{hit}")

    _together(16, hits)
    opened = [c for c in redis_client.client_list() if c["id"] not in before]
    assert len(opened) == 1


def test_reset_peek_and_check_request_work_beside_batched_hits(
    limiters: list[Limiter],
) -> None:
    """The other calls of a batched limiter (peek, reset, a request over several limits)
    decide as before while threads hit."""
    _, batched = limiters

    def hits(_: int) -> list[bool]:
        return [batched.hit("log", "carol").allowed for _ in range(5)]

    admitted = sum(sum(result) for result, _ in _together(20, hits))
    assert admitted == 50
    assert not batched.peek("log", "carol").allowed
    assert batched.reset("log", "carol")
    assert batched.peek("log", "carol").remaining == 50
    decision = batched.check_request("GET", "/", "dave")
    assert decision.allowed and not decision.degraded
    assert {r.name for r in decision.results} == {"log", "window", "gcra", "closed"}


def test_the_library_is_loaded_again_for_a_whole_batch(
    limiters: list[Limiter], redis_client: redis.Redis
) -> None:
    """FUNCTION FLUSH under a batched limiter: the batch that meets "Function not found"
    loads the library and runs its calls again, and every decision stays exact."""
    _, batched = limiters
    assert batched.hit("log", "erin").allowed
    redis_client.function_flush()

    def hits(_: int) -> list[Decision]:
        return [batched.hit("log", "erin") for _ in range(4)]

    decisions = [d for result, _ in _together(16, hits) for d in result]
    assert not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 49


@pytest.fixture
def fragile(fresh_redis_server: RedisServer) -> Iterator[Limiter]:
    """A batched limiter of a private server (free to pause or kill), timeout 50 ms."""
    limiter = Limiter(
        _policy("f", rate="1000/1m"),
        redis_url=fresh_redis_server.url,
        batch=True,
        failure_threshold=3,
        recovery_time=30.0,
    )
    # Connected and the library loaded before anything goes wrong.
    assert not limiter.hit("log", "warm").degraded
    yield limiter
    limiter.close()


@pytest.mark.slow
def test_a_hung_redis_degrades_every_waiting_thread_within_its_timeout(
    fragile: Limiter, fresh_redis_server: RedisServer
) -> None:
    """SIGSTOP: the write in flight waits out the socket timeout, the threads queued
    behind it their own timeout; none hangs, every decision follows the failure policy,
    and within as many rounds as the breaker's threshold the breaker is open and
    decisions are immediate."""
    fresh_redis_server.pause()
    try:
        rounds = 0
        while fragile.breaker_state is not BreakerState.OPEN:
            rounds += 1
            assert rounds <= 3, "the breaker did not open"

            def hit(index: int) -> tuple[bool, bool]:
                name = "closed" if index % 2 else "log"
                decision = fragile.hit(name, f"user-{index}")
                return decision.allowed, decision.degraded

            for index, ((allowed, degraded), took) in enumerate(_together(16, hit)):
                assert degraded and allowed == (index % 2 == 0)
                # Queued for at most the timeout, then in flight for at most the socket
                # timeout (which the safety net doubles).
                assert took <= 3 * TIMEOUT + SLACK, f"took {took:.3f}s"
        for index, ((allowed, degraded), took) in enumerate(
            _together(16, lambda i: _quick(fragile, i))
        ):
            assert degraded and allowed == (index % 2 == 0)
            assert took <= SLACK
    finally:
        fresh_redis_server.resume()


def _quick(limiter: Limiter, index: int) -> tuple[bool, bool]:
    decision = limiter.hit("closed" if index % 2 else "log", f"user-{index}")
    return decision.allowed, decision.degraded


@pytest.mark.slow
def test_a_killed_redis_degrades_every_thread_and_opens_the_breaker(
    fragile: Limiter, fresh_redis_server: RedisServer
) -> None:
    """SIGKILL: the connection is refused; every thread's decision follows the failure
    policy at once. The breaker counts failed round trips (a batch that fails as a whole
    is one, as for the async limiter), and each round of 16 threads makes at least one:
    within three rounds (the threshold) it is open."""
    fresh_redis_server.kill()
    rounds = 0
    while fragile.breaker_state is not BreakerState.OPEN:
        rounds += 1
        assert rounds <= 3, "three rounds of failed round trips left the breaker closed"
        for index, ((allowed, degraded), took) in enumerate(
            _together(16, lambda i: _quick(fragile, i))
        ):
            assert degraded and allowed == (index % 2 == 0)
            assert took <= TIMEOUT + SLACK


@pytest.mark.slow
def test_closing_releases_the_threads_waiting_on_a_batch(
    fresh_redis_server: RedisServer,
) -> None:
    """Threads queued behind a write that a hung Redis will not answer (timeout 5 s):
    closing the limiter lets every one of them go at once, degraded, long before the
    timeout."""
    limiter = Limiter(
        _policy("c", rate="1000/1m", timeout="5s"), redis_url=fresh_redis_server.url, batch=True
    )
    assert not limiter.hit("log", "warm").degraded
    fresh_redis_server.pause()
    try:
        combiner = limiter._wire._combiner  # type: ignore[union-attr]
        assert combiner is not None
        results: list[Decision] = []
        threads = [
            threading.Thread(
                target=lambda i=i: results.append(limiter.hit("log", f"u{i}")), daemon=True
            )
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        # Wait until one write is in flight and the seven others are queued behind it:
        # the condition is polled, nothing is timed.
        deadline = time.monotonic() + HANG
        while len(combiner._queue) < 7:
            assert time.monotonic() < deadline, "the threads never queued"
            time.sleep(0.001)
        started = time.perf_counter()
        limiter.close()
        for thread in threads:
            thread.join(HANG)
            assert not thread.is_alive(), "a thread hung after close()"
        took = time.perf_counter() - started
    finally:
        fresh_redis_server.resume()
    assert len(results) == 8
    assert all(d.degraded and d.allowed for d in results)
    assert took < 1.0


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
# Forking while threads run is the point here: the warning says what is tested.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_mid_batch_decides_on_its_own(fresh_redis_server: RedisServer) -> None:
    """Forked while a parent thread's write is in flight and another thread waits behind
    it: the child does not wait for the parent's leader (which is not in the child), it
    decides on connections of its own, and both processes count against one limit."""
    limiter = Limiter(
        _policy("k", rate="1000/1m", timeout="5s"), redis_url=fresh_redis_server.url, batch=True
    )
    assert limiter.hit("log", "shared").remaining == 999
    combiner = limiter._wire._combiner  # type: ignore[union-attr]
    assert combiner is not None
    fresh_redis_server.pause()
    parents = [
        threading.Thread(target=limiter.hit, args=("log", "shared"), daemon=True) for _ in range(2)
    ]
    read, write = os.pipe()
    resumed = False
    try:
        for thread in parents:
            thread.start()
        # One thread leads (its write is with the frozen server), the other is queued:
        # the condition is polled, nothing is timed.
        deadline = time.monotonic() + HANG
        while not (combiner._leading == 1 and len(combiner._queue) == 1):
            assert time.monotonic() < deadline, "the parent's threads never queued"
            time.sleep(0.001)
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.read(read, 1)  # the server runs again
                results = _together(4, lambda _: [limiter.hit("log", "shared") for _ in range(5)])
                decisions = [d for result, _ in results for d in result]
                if all(d.allowed and not d.degraded for d in decisions):
                    code = 0
            finally:
                os._exit(code)
        fresh_redis_server.resume()
        resumed = True
        os.write(write, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        for thread in parents:
            thread.join(HANG)
            assert not thread.is_alive()
        # 1 + the parent's 2 + the child's 20.
        assert limiter.peek("log", "shared").remaining == 1000 - 23
    finally:
        if not resumed:
            fresh_redis_server.resume()
        os.close(read)
        os.close(write)
        limiter.close()


class _Interrupted(Exception):
    """Raised by the test's signal handler in the main thread."""


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted


@pytest.mark.slow
def test_a_thread_interrupted_in_the_queue_leaves_it(fresh_redis_server: RedisServer) -> None:
    """A signal interrupts the main thread while its call waits behind a write that a
    hung Redis holds: the call leaves the queue, so once Redis answers again the calls
    after it are sent at once rather than waiting for a leader that never comes."""
    limiter = Limiter(
        _policy("i", rate="1000/1m", timeout="5s"), redis_url=fresh_redis_server.url, batch=True
    )
    assert not limiter.hit("log", "warm").degraded
    combiner = limiter._wire._combiner  # type: ignore[union-attr]
    assert combiner is not None
    previous = signal.signal(signal.SIGUSR1, _interrupt)
    main = threading.get_ident()
    fresh_redis_server.pause()
    resumed = False
    try:
        leader = threading.Thread(target=limiter.hit, args=("log", "first"), daemon=True)
        leader.start()
        deadline = time.monotonic() + HANG
        while combiner._leading != 1:
            assert time.monotonic() < deadline, "the first call was never sent"
            time.sleep(0.001)

        def interrupt_when_queued() -> None:
            while not combiner._queue:
                assert time.monotonic() < deadline, "the main thread never queued"
                time.sleep(0.001)
            signal.pthread_kill(main, signal.SIGUSR1)

        interrupter = threading.Thread(target=interrupt_when_queued, daemon=True)
        interrupter.start()
        with pytest.raises(_Interrupted):
            limiter.hit("log", "second")
        interrupter.join(HANG)
        assert not combiner._queue
        fresh_redis_server.resume()
        resumed = True
        leader.join(HANG)
        assert not leader.is_alive()
        started = time.perf_counter()
        after = limiter.hit("log", "third")
        assert not after.degraded and after.allowed
        assert time.perf_counter() - started < 1.0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        if not resumed:
            fresh_redis_server.resume()
        limiter.close()


@pytest.mark.parametrize("name", ["log", "gcra"])
def test_batch_on_a_cluster_decides_one_call_per_thread(
    redis_cluster: RedisCluster, cluster_client: object, name: str
) -> None:
    """On Redis Cluster ``batch=True`` changes nothing: each thread's call goes to the
    master of its slot on its own, and the totals are exact."""
    limiter = Limiter(
        _policy("cl", timeout="2s"), redis_url=redis_cluster.url, cluster=True, batch=True
    )
    try:

        def hits(index: int) -> list[Decision]:
            # One identity shared by all, and one of each thread's own (other slots).
            return [limiter.hit(name, "shared") for _ in range(4)] + [
                limiter.hit(name, f"own-{index}") for _ in range(2)
            ]

        decisions = [d for result, _ in _together(16, hits) for d in result]
        assert not any(d.degraded for d in decisions)
        # 50 of the shared identity's 64, and every one of the threads' own 32.
        assert sum(d.allowed for d in decisions) == 50 + 32
    finally:
        limiter.close()
