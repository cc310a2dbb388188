"""Approximate mode's bound under real concurrency, against real Redis (standalone and
cluster): whatever mix of threads (``Limiter``, also ``batch=True``), asyncio tasks
(``AsyncLimiter``), async hits cancelled mid-sync and limiter instances decides for one
identity at once, the admitted units never exceed the documented bound, per window:

    admitted <= what Redis admits + instances x (sync_every - 1)

Every limiter of a test shares one test clock that never moves, so the whole run is one
window (of an hour) and "what Redis admits" is the quota. After the run each instance
hits once more, alone, until it is denied: what it admitted is then all counted by Redis
or reported as overshoot, so the overshoot reported, summed, is exactly what was admitted
beyond the quota (less what cancelled hits consumed in Redis without being answered).

The first tests are seeded random mixes (the seed in the test's id); the others reproduce
reported overshoots: 64 tasks of one AsyncLimiter admitted 661 of 100 with sync_every 10
(at most 109 allowed), 16 threads of one Limiter 177 to 232 of 100 with sync_every 20, also
batched (at most 119 allowed), and async hits cancelled while their sync awaited Redis
lost what the sync carried (226 of 100 admitted).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import edgegen_policy as policy
import pytest
import redis
from harness import RedisCluster, RedisServer
from limiter_support import TestClock, script_calls

from applimit import AsyncLimiter, Decision, DecisionEvent, Limiter, _script
from applimit._flow import Send, Wait, drive

ALGORITHMS = ("gcra", "sliding_window", "sliding_log")
SEEDS = range(8)
# Generous: a decision that took this long would be degraded, and the tests assert none is.
TIMEOUT = "5s"
# How long a test waits for its threads (they finish in well under a second).
JOIN_TIMEOUT = 60.0


def policy_text(algorithm: str, quota: int, sync_every: int, *, interval: str = "100ms") -> str:
    """One approximate limit ``a`` of ``quota`` per hour."""
    return f"""
version: 1
app: {{key_prefix: bound, timeout: {TIMEOUT}, on_redis_error: allow}}
limits:
  - name: a
    app:
      algorithm: {algorithm}
      mode: approximate
      sync_every: {sync_every}
      sync_interval: {interval}
      tiers: {{default: {quota}/1h}}
"""


@dataclass(frozen=True)
class Target:
    """Where the limiters connect, and a client to look from the outside."""

    url: str
    cluster: bool
    admin: Any


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def target(request: pytest.FixtureRequest) -> Target:
    """The harness's standalone server or cluster, flushed."""
    if request.param == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return Target(cluster.url, True, request.getfixturevalue("cluster_client"))
    server: RedisServer = request.getfixturevalue("redis_server")
    return Target(server.url, False, request.getfixturevalue("redis_client"))


class Overshoots:
    """An observer that adds up the overshoot it is told of (from any thread)."""

    def __init__(self) -> None:
        self.total = 0
        self._lock = threading.Lock()

    def on_decision(self, event: DecisionEvent) -> None:
        """Decisions are counted by the test itself."""

    def on_overshoot(self, limit: str, tier: str, count: int) -> None:
        """Add ``count`` to the total."""
        with self._lock:
            self.total += count


@dataclass
class Tally:
    """What one instance's callers were answered (units, not requests)."""

    admitted: int = 0
    degraded: int = 0
    cancelled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, decision: Decision, cost: int) -> None:
        with self.lock:
            if decision.degraded:
                self.degraded += 1
            elif decision.allowed:
                self.admitted += cost

    def cancel(self, cost: int) -> None:
        with self.lock:
            self.cancelled += cost


@dataclass(frozen=True)
class Instance:
    """One limiter instance of a scenario: ``kind`` is ``threads`` (Limiter), ``batch``
    (Limiter(batch=True)) or ``tasks`` (AsyncLimiter); each of its ``callers`` makes
    ``hits`` hits of a cost drawn from ``costs``, and a task cancels a hit with
    probability ``cancel``, after letting it run a few steps."""

    kind: str
    callers: int
    hits: int
    costs: tuple[int, ...]
    cancel: float


@dataclass(frozen=True)
class Scenario:
    """A random mix of instances on one identity."""

    quota: int
    sync_every: int
    instances: tuple[Instance, ...]

    @property
    def bound(self) -> int:
        return self.quota + len(self.instances) * (self.sync_every - 1)


def scenario(seed: int) -> Scenario:
    """The mix of ``seed``: 1-4 instances of every kind, enough hits to exhaust the
    limit about twice over. Across the seeds each kind leads once, and odd seeds cancel
    async hits."""
    rng = random.Random(seed)
    sync_every = rng.choice((2, 5, 10, 20))
    quota = rng.randint(20, 150)
    count = rng.randint(1, 4)
    kinds = ["threads", "batch", "tasks"]
    costs = (1,) if rng.random() < 0.5 else (1, 1, 2, 3)
    attempts = 2 * (quota + count * (sync_every - 1))
    instances = []
    for index in range(count):
        kind = kinds[(seed + index) % 3] if index == 0 else rng.choice(kinds)
        callers = rng.randint(4, 64) if kind == "tasks" else rng.randint(2, 12)
        cancel = rng.choice((0.1, 0.3)) if kind == "tasks" and seed % 2 else 0.0
        hits = max(1, attempts // (count * callers))
        instances.append(Instance(kind, callers, hits, costs, cancel))
    return Scenario(quota, sync_every, tuple(instances))


def _policy(algorithm: str, plan: Scenario) -> policy.Policy:
    return policy.loads(policy_text(algorithm, plan.quota, plan.sync_every))


def _caller(limiter: Limiter, who: str, spec: Instance, rng: random.Random, tally: Tally) -> None:
    """One caller of a sync instance (a thread): its hits."""
    for _ in range(spec.hits):
        cost = rng.choice(spec.costs)
        tally.add(limiter.hit("a", who, cost=cost), cost)


async def _task(
    limiter: AsyncLimiter, who: str, spec: Instance, rng: random.Random, tally: Tally
) -> None:
    """One caller of an async instance: its hits, some of them cancelled midway."""
    for _ in range(spec.hits):
        cost = rng.choice(spec.costs)
        if rng.random() >= spec.cancel:
            tally.add(await limiter.hit("a", who, cost=cost), cost)
            continue
        hit = asyncio.ensure_future(limiter.hit("a", who, cost=cost))
        for _ in range(rng.randint(0, 3)):
            # Let the hit run a few steps (to its sync's call, its reply, a wait...).
            await asyncio.sleep(0)
        if not hit.done():
            hit.cancel()
        await asyncio.wait({hit})
        if hit.cancelled():
            tally.cancel(cost)
        else:
            tally.add(hit.result(), cost)


def drain_sync(limiter: Limiter, who: str, tally: Tally) -> None:
    """Hit alone until denied: what the instance admitted is then counted or reported."""
    while True:
        decision = limiter.hit("a", who)
        tally.add(decision, 1)
        if not decision.allowed or decision.degraded:
            return


async def settled(limiter: AsyncLimiter) -> None:
    """Wait (with a deadline) until the syncs of cancelled hits, which go on without
    them, have landed: a drain that went to Redis alone past one would leave what it
    carries unresolved."""
    approx = limiter.decider.approx
    assert approx is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + JOIN_TIMEOUT
    while any(entry.flight is not None for entry in approx._entries.values()):
        assert loop.time() < deadline, "a cancelled hit's sync never landed"
        await asyncio.sleep(0.001)


async def drain_async(limiter: AsyncLimiter, who: str, tally: Tally) -> None:
    """As :func:`drain_sync`, for an async instance."""
    while True:
        decision = await limiter.hit("a", who)
        tally.add(decision, 1)
        if not decision.allowed or decision.degraded:
            return


def run_mix(target: Target, algorithm: str, plan: Scenario, seed: int) -> tuple[list[Tally], int]:
    """Run ``plan``'s instances at once on one identity, all started by one barrier,
    then drain them one after the other (nothing else runs meanwhile); the tallies and
    the overshoot reported, summed."""
    loaded = _policy(algorithm, plan)
    clock = TestClock()
    observer = Overshoots()
    who = f"user-{uuid.uuid4()}"
    tallies = [Tally() for _ in plan.instances]
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    # One per instance, in order: drains it (from the test's thread).
    drains: list[Any] = []
    turns: list[threading.Event] = []
    sync_limiters: list[Limiter] = []
    parties = sum(s.callers for s in plan.instances if s.kind != "tasks") + sum(
        1 for s in plan.instances if s.kind == "tasks"
    )
    start = threading.Barrier(parties)
    # Every caller is done, and every sync of a cancelled hit has landed: drains start.
    finished = threading.Barrier(parties + 1)

    def guarded(run: Any) -> Any:
        def body() -> None:
            try:
                run()
            except BaseException as error:  # a failure in a thread fails the test
                errors.append(error)
                start.abort()
                finished.abort()

        return body

    for number, (spec, tally) in enumerate(zip(plan.instances, tallies, strict=True)):
        if spec.kind == "tasks":
            turn = threading.Event()
            drained = threading.Event()
            turns.append(turn)

            async def instance(
                spec: Instance = spec,
                tally: Tally = tally,
                n: int = number,
                turn: threading.Event = turn,
                drained: threading.Event = drained,
            ) -> None:
                limiter = AsyncLimiter(
                    loaded,
                    redis_url=target.url,
                    cluster=target.cluster,
                    test_clock=clock,
                    observers=[observer],
                )
                try:
                    await asyncio.to_thread(start.wait)
                    await asyncio.gather(
                        *(
                            _task(limiter, who, spec, random.Random(f"{seed}-{n}-{i}"), tally)
                            for i in range(spec.callers)
                        )
                    )
                    await settled(limiter)
                    await asyncio.to_thread(finished.wait)
                    await asyncio.to_thread(turn.wait, JOIN_TIMEOUT)
                    await drain_async(limiter, who, tally)
                finally:
                    drained.set()
                    await limiter.aclose()

            def drain(turn: threading.Event = turn, drained: threading.Event = drained) -> None:
                turn.set()
                assert drained.wait(JOIN_TIMEOUT), "an async instance did not drain"

            drains.append(drain)
            threads.append(
                threading.Thread(target=guarded(lambda run=instance: asyncio.run(run())))
            )
        else:
            limiter = Limiter(
                loaded,
                redis_url=target.url,
                cluster=target.cluster,
                test_clock=clock,
                observers=[observer],
                batch=spec.kind == "batch",
            )
            sync_limiters.append(limiter)
            drains.append(lambda limiter=limiter, tally=tally: drain_sync(limiter, who, tally))
            for index in range(spec.callers):
                rng = random.Random(f"{seed}-{number}-{index}")

                def run(
                    limiter: Limiter = limiter,
                    spec: Instance = spec,
                    tally: Tally = tally,
                    rng: random.Random = rng,
                ) -> None:
                    start.wait()
                    _caller(limiter, who, spec, rng, tally)
                    finished.wait()

                threads.append(threading.Thread(target=guarded(run)))
    try:
        for thread in threads:
            thread.start()
        with contextlib.suppress(threading.BrokenBarrierError):
            # Broken when a caller failed: its error is raised below.
            finished.wait(timeout=JOIN_TIMEOUT)
        if not errors:
            for drain in drains:
                drain()
    finally:
        for turn in turns:
            # An async instance still waiting for its turn (a caller failed) closes.
            turn.set()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)
        for limiter in sync_limiters:
            limiter.close()
    assert not any(thread.is_alive() for thread in threads), "callers still running"
    if errors:
        raise errors[0]
    return tallies, observer.total


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_random_mix_of_callers_never_admits_beyond_the_bound(
    target: Target, algorithm: str, seed: int
) -> None:
    """Threads, batched threads and tasks (some cancelled midway) of 1-4 instances on one
    identity admit at most the quota plus instances x (sync_every - 1) units, none of
    them degraded; the overshoot reported is exactly what was admitted beyond the quota
    (less what cancelled hits consumed in Redis)."""
    plan = scenario(seed)
    tallies, overshoot = run_mix(target, algorithm, plan, seed)
    admitted = sum(t.admitted for t in tallies)
    cancelled = sum(t.cancelled for t in tallies)
    assert sum(t.degraded for t in tallies) == 0
    assert admitted <= plan.bound, (plan, admitted)
    # Every instance was denied last: Redis holds the whole quota. What it counted are the
    # admitted units it counted and those cancelled hits consumed unanswered; the rest of
    # what was admitted was reported once each.
    assert plan.quota + overshoot - cancelled <= admitted <= plan.quota + overshoot, (
        plan,
        admitted,
        overshoot,
        cancelled,
    )
    if not cancelled:
        assert admitted == plan.quota + overshoot


# --- the reported overshoots -------------------------------------------------------------


def _async_limiter(target: Target, text: str, clock: TestClock, **options: Any) -> AsyncLimiter:
    return AsyncLimiter(
        policy.loads(text),
        redis_url=target.url,
        cluster=target.cluster,
        test_clock=clock,
        **options,
    )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_64_tasks_of_one_async_limiter_admit_at_most_the_bound(
    target: Target, algorithm: str
) -> None:
    """64 tasks of one AsyncLimiter hit one identity of 100/1h with sync_every 10 at once
    (they admitted 373 before, 661 with 20 hits a task): at least 100 and at most 100 + 9
    are admitted."""
    limiter = _async_limiter(target, policy_text(algorithm, 100, 10), TestClock())
    who = f"user-{uuid.uuid4()}"
    tally = Tally()

    async def caller() -> None:
        for _ in range(10):
            tally.add(await limiter.hit("a", who), 1)

    try:
        await asyncio.gather(*(caller() for _ in range(64)))
    finally:
        await limiter.aclose()
    assert tally.degraded == 0
    assert 100 <= tally.admitted <= 100 + 9


@pytest.mark.parametrize("batch", [False, True], ids=["threads", "batch"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_threads_of_one_limiter_admit_at_most_the_bound(
    target: Target, algorithm: str, batch: bool
) -> None:
    """16 threads of one Limiter (also with batch=True) start together on one identity of
    100/1h with sync_every 20 (they admitted 177 to 232 before): at least 100 and at most
    100 + 19 are admitted."""
    limiter = Limiter(
        policy.loads(policy_text(algorithm, 100, 20)),
        redis_url=target.url,
        cluster=target.cluster,
        test_clock=TestClock(),
        batch=batch,
    )
    who = f"user-{uuid.uuid4()}"
    tally = Tally()
    start = threading.Barrier(16)

    def caller() -> None:
        start.wait(timeout=JOIN_TIMEOUT)
        for _ in range(20):
            tally.add(limiter.hit("a", who), 1)

    threads = [threading.Thread(target=caller) for _ in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(JOIN_TIMEOUT)
    finally:
        limiter.close()
    assert not any(thread.is_alive() for thread in threads)
    assert tally.degraded == 0
    assert 100 <= tally.admitted <= 100 + 19


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_hits_cancelled_while_their_sync_awaits_redis_lose_nothing(
    target: Target, algorithm: str
) -> None:
    """One hit at a time on 100/1h with sync_every 10, every other sync cancelled while
    its call is on its way to Redis (226 were admitted before): at most 100 + 9 are
    admitted, and at least 100 less the hits cancelled (each may have been counted)."""
    limiter = _async_limiter(target, policy_text(algorithm, 100, 10), TestClock())
    who = f"user-{uuid.uuid4()}"
    tally = Tally()
    syncs = 0
    try:
        for _ in range(400):
            hit = asyncio.ensure_future(limiter.hit("a", who))
            # One step: a local answer is done; a sync awaits its call.
            await asyncio.sleep(0)
            if not hit.done():
                syncs += 1
                if syncs % 2 == 0:
                    hit.cancel()
            await asyncio.wait({hit})
            if hit.cancelled():
                tally.cancel(1)
            else:
                tally.add(hit.result(), 1)
    finally:
        await limiter.aclose()
    assert 100 - tally.cancelled <= tally.admitted <= 100 + 9
    assert tally.degraded == 0
    assert tally.cancelled >= 10


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_cancelled_sync_still_counts_what_it_carried(
    target: Target, algorithm: str
) -> None:
    """Well within the limit, every sync after the first is cancelled while its call is on
    its way; once a last sync has run, Redis counted exactly the requests admitted plus
    the cancelled ones (each consumed, as in exact mode): none of the pending requests
    the cancelled syncs carried was lost or counted twice."""
    clock = TestClock()
    text = policy_text(algorithm, 100_000, 10, interval="1ms")
    limiter = _async_limiter(target, text, clock)
    who = f"user-{uuid.uuid4()}"
    tally = Tally()
    try:
        tally.add(await limiter.hit("a", who), 1)
        for _ in range(200):
            hit = asyncio.ensure_future(limiter.hit("a", who))
            # One step: a local answer is done; a sync awaits its call.
            await asyncio.sleep(0)
            if not hit.done():
                hit.cancel()
            await asyncio.wait({hit})
            if hit.cancelled():
                tally.cancel(1)
                # Its sync goes on: the next hit starts once it has landed.
                await settled(limiter)
            else:
                tally.add(hit.result(), 1)
        # Past sync_interval (by 1 ms, too little to refill GCRA by a unit): the next hit
        # syncs whatever is still pending.
        clock.advance(1_000)
        tally.add(await limiter.hit("a", who), 1)
        remaining = (await limiter.peek("a", who)).remaining
    finally:
        await limiter.aclose()
    assert tally.cancelled >= 15
    assert tally.degraded == 0
    assert 100_000 - remaining == tally.admitted + tally.cancelled


@pytest.mark.parametrize("flavour", ["threads", "tasks"])
async def test_concurrent_callers_still_sync_once_per_sync_every(
    target: Target, flavour: str
) -> None:
    """Eight threads (or sixteen tasks) on one identity, well within the limit: still
    about one script call per sync_every (10) decisions; the callers wait for the sync in
    flight rather than each asking Redis."""
    text = policy_text("gcra", 1_000_000, 10)
    who = f"user-{uuid.uuid4()}"
    before = script_calls(target.admin)
    tally = Tally()
    if flavour == "tasks":
        limiter = _async_limiter(target, text, TestClock())

        async def caller() -> None:
            for _ in range(100):
                tally.add(await limiter.hit("a", who), 1)

        try:
            await asyncio.gather(*(caller() for _ in range(16)))
        finally:
            await limiter.aclose()
        decisions = 1600
    else:
        sync = Limiter(
            policy.loads(text), redis_url=target.url, cluster=target.cluster, test_clock=TestClock()
        )

        def caller() -> None:
            for _ in range(200):
                tally.add(sync.hit("a", who), 1)

        threads = [threading.Thread(target=caller) for _ in range(8)]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(JOIN_TIMEOUT)
        finally:
            sync.close()
        decisions = 1600
    calls = script_calls(target.admin) - before
    assert tally.admitted == decisions
    assert decisions / calls >= 8, calls


# --- the machine, driven by hand ----------------------------------------------------------

# Nothing listens here: the decisions below are driven by hand, their calls run elsewhere.
NOWHERE = "redis://127.0.0.1:1/0"


def _answer(client: redis.Redis, calls: Any) -> list[object]:
    """The replies to a Send's ``calls``, run with EVAL on a plain client."""
    return [client.eval(_script.SOURCE, len(call.keys), *call.keys, *call.args) for call in calls]


def test_a_sync_stopped_midway_gives_its_requests_back(redis_client: redis.Redis) -> None:
    """A sync that carries 4 pending requests is stopped before its reply (the flow
    closed, as a shell does on an exception): the 4 go back to pending, and the next
    sync carries them, so Redis counts every admitted request once."""
    clock = TestClock()
    limiter = Limiter(
        policy.loads(policy_text("sliding_log", 100, 5)), redis_url=NOWHERE, test_clock=clock
    )
    exact = Limiter(
        policy.loads(policy_text("sliding_log", 100, 1)), redis_url=NOWHERE, test_clock=clock
    )
    who = f"user-{uuid.uuid4()}"

    def prepared() -> Any:
        return limiter.core.for_limit("hit", "a", who, None, 1)

    def run(calls: Any) -> list[object]:
        return _answer(redis_client, calls)

    def no_wait(step: Wait) -> list[object]:
        raise AssertionError("nothing waits here")

    def counted() -> int:
        peek = exact.core.for_limit("peek", "a", who, None, 1)
        return 100 - drive(exact.decider, peek, run, no_wait).remaining

    try:
        assert drive(limiter.decider, prepared(), run, no_wait).allowed  # a sync: Redis counts 1
        for _ in range(4):
            assert drive(limiter.decider, prepared(), run, no_wait).allowed  # local: 4 pending
        send = limiter.decider.begin(prepared())
        assert isinstance(send, Send) and len(send.calls) == 1
        # Stopped there, as a shell stops on an exception.
        limiter.decider.abandon(send)
        assert counted() == 1
        # The 4 are pending again: the next hit syncs them with itself.
        send = limiter.decider.begin(prepared())
        assert isinstance(send, Send) and len(send.calls) == 1
        done = limiter.decider.advance(send, run(send.calls))
        assert isinstance(done, Decision) and done.allowed
        assert counted() == 1 + 4 + 1
    finally:
        limiter.close()
        exact.close()


def test_a_decision_waits_for_the_sync_in_flight_then_answers_locally(
    redis_client: redis.Redis,
) -> None:
    """While one decision's sync of a key is on its way, another decision on the key
    neither sends a call nor is answered from the state the sync will change: it waits
    (a Wait), and once the sync lands it is answered locally. A wait that runs out of
    time follows the failure policy (here allow), marked degraded."""
    limiter = Limiter(
        policy.loads(policy_text("gcra", 100, 5)), redis_url=NOWHERE, test_clock=TestClock()
    )
    who = f"user-{uuid.uuid4()}"

    decider = limiter.decider

    def hit() -> Any:
        return decider.begin(limiter.core.for_limit("hit", "a", who, None, 1))

    try:
        send = hit()
        assert isinstance(send, Send)
        wait = hit()
        assert isinstance(wait, Wait) and not wait.flight.landed
        assert isinstance(decider.advance(send, _answer(redis_client, send.calls)), Decision)
        assert wait.flight.landed
        local = decider.advance(wait, [])
        assert isinstance(local, Decision) and local.allowed and not local.degraded
        # Again, and this time the wait runs out.
        for _ in range(3):
            assert isinstance(hit(), Decision)  # local: 4 pending in all
        third = hit()
        assert isinstance(third, Send) and third.carries
        wait = hit()
        assert isinstance(wait, Wait)
        late = decider.advance(wait, [TimeoutError("out of time")])
        assert isinstance(late, Decision) and late.degraded
        decider.abandon(third)
    finally:
        limiter.close()
