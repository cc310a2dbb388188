"""Helpers for the applimit tests: a test clock, reference models, and one driver for both
limiters so that the contract suite is written once.

The reference models are deliberately simple, independent restatements of each algorithm
(lists of timestamps, Fractions): the property tests drive the real scripts and these
models with the same events and compare every number.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from applimit import AsyncLimiter, Decision, Limiter
from applimit._memory import MemoryStore

US = 1_000_000


class TestClock:
    """A clock tests move by hand: seconds, held as integer microseconds so nothing rounds."""

    __test__ = False  # not a test class, despite the name

    def __init__(self, start_us: int = 1_000_000 * US) -> None:
        self.us = start_us

    def __call__(self) -> float:
        return self.us / US

    def advance(self, us: int) -> None:
        self.us += us


class Driver:
    """Calls a Limiter or an AsyncLimiter through one awaitable interface."""

    def __init__(self, limiter: Limiter | AsyncLimiter) -> None:
        self.limiter = limiter
        self.is_async = isinstance(limiter, AsyncLimiter)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.limiter, method)(*args, **kwargs)
        if self.is_async:
            return await result
        return result

    async def hit(self, *args: Any, **kwargs: Any) -> Decision:
        return await self._call("hit", *args, **kwargs)  # type: ignore[no-any-return]

    async def peek(self, *args: Any, **kwargs: Any) -> Decision:
        return await self._call("peek", *args, **kwargs)  # type: ignore[no-any-return]

    async def check_request(self, *args: Any, **kwargs: Any) -> Decision:
        return await self._call("check_request", *args, **kwargs)  # type: ignore[no-any-return]

    async def record(self, *args: Any, **kwargs: Any) -> Decision:
        return await self._call("record", *args, **kwargs)  # type: ignore[no-any-return]

    async def record_request(self, *args: Any, **kwargs: Any) -> Decision:
        return await self._call("record_request", *args, **kwargs)  # type: ignore[no-any-return]

    async def release(self, decision: Decision) -> None:
        await self._call("release", decision)

    async def reset(self, *args: Any, **kwargs: Any) -> bool:
        return await self._call("reset", *args, **kwargs)  # type: ignore[no-any-return]

    async def close(self) -> None:
        if isinstance(self.limiter, AsyncLimiter):
            await self.limiter.aclose()
        else:
            self.limiter.close()


MakeLimiter = Callable[..., Driver]
"""The ``make_limiter`` fixture: ``make_limiter(policy_yaml, **options)`` -> Driver."""


# --- reference models --------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What a model says one event decides, in integer microseconds."""

    allowed: bool
    remaining: int
    reset_us: int
    retry_us: int | None  # None when allowed; -1 for "never"


NEVER = -1


def as_expected(decision: Decision) -> Expected:
    """The single-limit decision in the models' units."""
    retry: int | None
    if decision.retry_after is None:
        retry = None
    elif math.isinf(decision.retry_after):
        retry = NEVER
    else:
        retry = round(decision.retry_after * US)
    return Expected(decision.allowed, decision.remaining, round(decision.reset_after * US), retry)


@dataclass
class SlidingLogModel:
    """Every admitted unit of cost is a timestamp; the window is (now - period, now]."""

    limit: int
    period: int
    entries: list[int] = field(default_factory=list)

    def decide(self, now: int, cost: int, consume: bool) -> Expected:
        live = sorted(t for t in self.entries if t > now - self.period)
        self.entries = live
        if cost <= self.limit - len(live):
            if consume:
                self.entries = sorted([*live, *([now] * cost)])
            kept = self.entries
            reset = max(kept) + self.period - now if kept else 0
            return Expected(True, self.limit - len(kept), reset, None)
        retry = NEVER
        if cost <= self.limit:
            # The request fits once the oldest (len + cost - limit) entries have left.
            retry = live[len(live) + cost - self.limit - 1] + self.period - now
        reset = max(live) + self.period - now if live else 0
        return Expected(False, self.limit - len(live), reset, retry)


def _ceil(value: Fraction) -> int:
    return math.ceil(value)


@dataclass
class GcraModel:
    """The theoretical arrival time as an exact Fraction of microseconds."""

    limit: int
    period: int
    burst: int
    tat: Fraction | None = None

    def decide(self, now: int, cost: int, consume: bool) -> Expected:
        interval = Fraction(self.period, self.limit)
        tolerance = interval * self.burst
        tat = max(self.tat if self.tat is not None else Fraction(now), Fraction(now))
        new_tat = tat + interval * cost
        if new_tat - now <= tolerance:
            if consume:
                self.tat = new_tat
                tat = new_tat
            remaining = math.floor((tolerance - (tat - now)) / interval)
            return Expected(True, remaining, _ceil(tat - now), None)
        retry = NEVER if cost > self.burst else _ceil(new_tat - tolerance - now)
        remaining = math.floor((tolerance - (tat - now)) / interval)
        return Expected(False, max(0, remaining), _ceil(tat - now), retry)


@dataclass
class SlidingWindowModel:
    """Two fixed-window counters; the estimate weighs the previous one linearly."""

    limit: int
    period: int
    counts: dict[int, int] = field(default_factory=dict)

    def _estimate(self, now: int) -> tuple[int, int, int, Fraction]:
        window = now // self.period
        elapsed = now - window * self.period
        cur = self.counts.get(window, 0)
        prev = self.counts.get(window - 1, 0)
        estimate = Fraction(prev * (self.period - elapsed), self.period) + cur
        return window, cur, prev, estimate

    def decide(self, now: int, cost: int, consume: bool) -> Expected:
        window, cur, prev, estimate = self._estimate(now)
        elapsed = now - window * self.period
        if estimate + cost <= self.limit:
            if consume:
                self.counts[window] = cur + cost
                _, cur, prev, estimate = self._estimate(now)
            return Expected(
                True,
                max(0, math.floor(self.limit - estimate)),
                self._reset(cur, prev, elapsed),
                None,
            )
        retry = NEVER if cost > self.limit else self._retry(now, cost)
        return Expected(
            False, max(0, math.floor(self.limit - estimate)), self._reset(cur, prev, elapsed), retry
        )

    def _reset(self, cur: int, prev: int, elapsed: int) -> int:
        if cur > 0:
            return 2 * self.period - elapsed
        if prev > 0:
            return self.period - elapsed
        return 0

    def _retry(self, now: int, cost: int) -> int:
        """The first microsecond at which the request fits, found by search (no formula)."""
        lo, hi = now, now + 2 * self.period
        while lo < hi:
            mid = (lo + hi) // 2
            if self._estimate(mid)[3] + cost <= self.limit:
                hi = mid
            else:
                lo = mid + 1
        return lo - now


# --- concurrency ---------------------------------------------------------------------------


def hammer(
    url: str,
    text: str,
    name: str,
    identity: str,
    threads: int,
    per_thread: int,
    frozen_us: int | None,
    start: Any,
) -> tuple[int, int]:
    """One process of the concurrency test: ``threads`` threads hit one identity.

    Runs in a spawned process. Returns (admitted, degraded). ``start`` is a barrier shared
    by every process and the test, which releases them all at once; ``frozen_us`` pins a
    test clock (for GCRA, whose bucket would otherwise refill while the test runs).
    """
    import threading

    import edgegen_policy as policy

    clock = None if frozen_us is None else (lambda: frozen_us / US)
    limiter = Limiter(policy.loads(text), redis_url=url, test_clock=clock)
    admitted = [0] * threads
    degraded = [0] * threads
    ready = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        ready.wait()
        for _ in range(per_thread):
            decision = limiter.hit(name, identity)
            admitted[index] += decision.allowed
            degraded[index] += decision.degraded

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    # Connect before the start signal, so the race is about deciding, not connecting.
    limiter.peek(name, "warm-up")
    start.wait()
    ready.wait()
    for worker in workers:
        worker.join()
    limiter.close()
    return sum(admitted), sum(degraded)


# The commands that run the limiter's script: FCALL of its library (Redis 7+), EVALSHA and
# EVAL where Redis Functions are refused, and EVAL after NOSCRIPT.
SCRIPT_COMMANDS = ("fcall", "evalsha", "eval")


class MemoryAdmin:
    """The memory backend's store behind the few Redis commands the tests read it with."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def keys(self, pattern: str) -> list[bytes]:
        """KEYS ``pattern``, as bytes like a Redis client returns them."""
        return [key.encode("utf-8", "surrogatepass") for key in self.store.keys(pattern)]

    def _log(self, key: bytes) -> Any:
        return self.store.value(key.decode("utf-8", "surrogatepass"))

    def zcard(self, key: bytes) -> int:
        """How many entries a sliding log holds."""
        value = self._log(key)
        return len(value.scores) if value is not None else 0

    def memory_usage(self, key: bytes) -> int:
        """What the key holds, in bytes of its entries' fields (an upper bound on what
        Redis would hold for the same entries)."""
        value = self._log(key)
        if value is None:
            return 0
        return len(key) + sum(8 + 16 + 16 + len(nonce) for _, _, nonce in value.entries)


def script_calls(admin: Any) -> int:
    """How many limiter script calls the backend has run (every master of a cluster)."""
    from redis.cluster import RedisCluster

    if isinstance(admin, MemoryAdmin):
        return admin.store.calls

    if isinstance(admin, RedisCluster):
        infos = admin.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        stats = list(infos.values())
    else:
        stats = [admin.info("commandstats")]
    return sum(
        int(s.get(f"cmdstat_{name}", {}).get("calls", 0)) for s in stats for name in SCRIPT_COMMANDS
    )


def hammer_period_end(
    url: str,
    cluster: bool,
    text: str,
    name: str,
    identity: str,
    threads: int,
    per_thread: int,
    end_us: int,
    start: Any,
    keys: dict[str, Any] | None = None,
) -> tuple[int, int, int]:
    """One process of the quota exactness test: ``threads`` threads hit one identity, each
    alternating between the last µs of a period and the first of the next (two limiters,
    each with its test clock frozen on one side of ``end_us``); ``keys`` as hit() takes
    them (a billing day).

    Runs in a spawned process. Returns (admitted before the end, admitted after, degraded).
    """
    import threading

    import edgegen_policy as policy

    loaded = policy.loads(text)
    sides = [
        Limiter(loaded, redis_url=url, cluster=cluster, test_clock=lambda at=at: at / US)
        for at in (end_us - 1, end_us)
    ]
    admitted = [[0, 0] for _ in range(threads)]
    degraded = [0] * threads
    ready = threading.Barrier(threads + 1)

    def run(index: int) -> None:
        ready.wait()
        for attempt in range(2 * per_thread):
            side = (index + attempt) % 2
            decision = sides[side].hit(name, identity, keys=keys)
            admitted[index][side] += decision.allowed
            degraded[index] += decision.degraded

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for limiter in sides:
        limiter.peek(name, "warm-up", keys=keys)
    start.wait()
    ready.wait()
    for worker in workers:
        worker.join()
    for limiter in sides:
        limiter.close()
    return sum(a[0] for a in admitted), sum(a[1] for a in admitted), sum(degraded)
