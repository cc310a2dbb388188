"""A circuit breaker in front of Redis, and the one-log-line-per-outage bookkeeping.

States: *closed* (calls go to Redis), *open* (no calls; decisions follow the failure
policy at once) and *half-open* (one caller probes Redis; the others stay degraded until
the probe answers). ``threshold`` consecutive failures open the breaker; after
``cooldown`` seconds one probe is let through; its success closes the breaker, its
failure opens it for another ``cooldown``. Only one probe is in flight at a time, so a
recovering Redis is not hit by every waiting caller at once.

An outage starts with the first failure after a success and ends with the next success.
It is logged twice, at the same level (warning), so that a filter that shows the one
shows the other: when it starts, and when it ends, with the number of decisions made
without Redis. Both records carry structured fields (``extra``: ``applimit_event`` is
``redis_outage`` or ``redis_recovered``, with ``node``) for JSON log handlers. Nothing is
logged per request. A server that
answers but refuses every write (out of memory under ``noeviction``, a read-only replica)
still answers calls that write nothing (a peek, a denial); such an answer does not end an
outage in which writes were refused: only a call that wrote does, so a full Redis is one
outage, not one per probe.

Thread-safe; the async limiter uses it from the event loop only, where the lock is never
contended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from enum import StrEnum

from ._errors import refuses_writes

logger = logging.getLogger("applimit")


class BreakerState(StrEnum):
    """Where the breaker is: calls flow, calls are skipped, or one probe is allowed."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Decides whether a call may go to Redis, from the outcomes of the previous calls."""

    def __init__(
        self,
        *,
        threshold: int = 3,
        cooldown: float = 0.25,
        probe_timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        describe: str = "Redis",
        node: str = "main",
    ) -> None:
        """Open after ``threshold`` consecutive failures; probe every ``cooldown`` seconds.

        ``probe_timeout`` is how long a probe may go unanswered before another caller may
        probe (a caller that was cancelled never reports back). ``describe`` names the
        server in log lines, ``node`` in their structured fields (``main`` or a cluster
        master's ``host:port``).
        """
        if threshold < 1:
            raise ValueError("the breaker threshold must be at least 1 failure")
        if cooldown <= 0:
            raise ValueError("the breaker cooldown must be a positive number of seconds")
        self.threshold = threshold
        self.cooldown = cooldown
        self.probe_timeout = probe_timeout
        self._clock = clock
        self._describe = describe
        self.node = node
        # Outages started so far: tells whether one began between two moments.
        self.outages = 0
        self._lock = threading.Lock()
        # Plain attributes, not properties: the decision path reads both on every call.
        # Where the breaker is (an open breaker whose cooldown is over still reads open).
        self.state = BreakerState.CLOSED
        # True from the first failure until the next success.
        self.in_outage = False
        self._failures = 0
        self._open_until = 0.0
        self._probe_started: float | None = None
        # When the outage began (read only while in_outage).
        self._outage_started = 0.0
        self._degraded = 0
        # Writes were refused during this outage: only a call that wrote ends it.
        self._writes_refused = False
        # The last failure counted: the calls of one failed round trip (a batch) share
        # their error, and count as one failure, not one per call.
        self._counted: BaseException | None = None

    def allow(self) -> bool:
        """True when this caller may call Redis now; False means decide without it."""
        if self.state is BreakerState.CLOSED:
            # Every decision asks; while Redis answers, no lock. A read that races a
            # failure lets one more call through, as if it had come a moment earlier.
            return True
        return self._allow_locked()

    def _allow_locked(self) -> bool:
        with self._lock:
            if self.state is BreakerState.CLOSED:
                return True
            now = self._clock()
            if self.state is BreakerState.OPEN:
                if now < self._open_until:
                    return False
                self.state = BreakerState.HALF_OPEN
                self._probe_started = now
                return True
            # Half-open: one probe at a time, unless the probe went silent.
            if self._probe_started is not None and now - self._probe_started < self.probe_timeout:
                return False
            self._probe_started = now
            return True

    def success(self, *, wrote: bool = True) -> None:
        """Record an answer from Redis: closes the breaker and ends any outage.

        ``wrote`` is False for a call that wrote nothing (a peek, a denial): during an
        outage in which Redis refused writes, such an answer does not show that it stores
        again, so the breaker stays open (a probe's answer starts another cooldown).
        """
        if self.state is BreakerState.CLOSED and not self._failures and not self.in_outage:
            # Nothing to reset (the common case): no lock.
            return
        with self._lock:
            if self._writes_refused and not wrote:
                if self.state is BreakerState.HALF_OPEN:
                    self.state = BreakerState.OPEN
                    self._open_until = self._clock() + self.cooldown
                    self._probe_started = None
                return
            self._failures = 0
            # Answered: the last failure counted is not kept (nor its traceback's frames).
            self._counted = None
            self.state = BreakerState.CLOSED
            self._probe_started = None
            self._writes_refused = False
            if not self.in_outage:
                return
            lasted = self._clock() - self._outage_started
            degraded = self._degraded
            self.in_outage = False
            self._degraded = 0
        logger.warning(
            "%s answers again after %.1f s; %d decisions were made without it during the outage.",
            self._describe,
            lasted,
            degraded,
            extra={
                "applimit_event": "redis_recovered",
                "node": self.node,
                "outage_seconds": round(lasted, 3),
                "degraded_decisions": degraded,
            },
        )

    def failure(self, error: BaseException) -> None:
        """Record a failed call: may open the breaker; logs when an outage starts. The
        calls of one round trip that failed as a whole share ``error``: it counts once."""
        with self._lock:
            if error is self._counted:
                return
            self._counted = error
            now = self._clock()
            self._failures += 1
            starting = not self.in_outage
            if starting:
                self._outage_started = now
                self.in_outage = True
                self.outages += 1
            if refuses_writes(error):
                self._writes_refused = True
            if self.state is BreakerState.HALF_OPEN or self._failures >= self.threshold:
                self.state = BreakerState.OPEN
                self._open_until = now + self.cooldown
                self._probe_started = None
        if starting:
            logger.warning(
                "%s cannot be used (%s: %s); decisions follow each limit's on_redis_error "
                "until it answers again.",
                self._describe,
                type(error).__name__,
                error,
                extra={
                    "applimit_event": "redis_outage",
                    "node": self.node,
                    "error": type(error).__name__,
                },
            )

    def degraded(self) -> None:
        """Count a decision made without Redis, for the end-of-outage log line."""
        with self._lock:
            if self.in_outage:
                self._degraded += 1

    def retry_in(self) -> float:
        """Seconds until the next probe may run (0 when the breaker is not open)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self._open_until - self._clock())


class Breakers:
    """The limiter's circuit breakers: its own, and on Redis Cluster one per master.

    One dead master must not take down decisions whose keys live on the others, so each
    node (by name, ``host:port``) has a breaker of its own, made on first use. The
    limiter's own breaker (``main``) answers for calls no node can be named for yet (no
    slot map, or one being rebuilt) and for a standalone or Sentinel-managed server.
    """

    def __init__(self, *, threshold: int, cooldown: float, probe_timeout: float) -> None:
        """Every breaker opens after ``threshold`` failures and probes after ``cooldown``."""
        self._threshold = threshold
        self._cooldown = cooldown
        self._probe_timeout = probe_timeout
        self.main = self._new("Redis (applimit)", "main")
        self._nodes: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def _new(self, describe: str, node: str) -> CircuitBreaker:
        return CircuitBreaker(
            threshold=self._threshold,
            cooldown=self._cooldown,
            probe_timeout=self._probe_timeout,
            describe=describe,
            node=node,
        )

    def of(self, node: str | None) -> CircuitBreaker:
        """The breaker of a cluster node (by name), or ``main`` for None."""
        if node is None:
            return self.main
        breaker = self._nodes.get(node)
        if breaker is None:
            with self._lock:
                breaker = self._nodes.get(node)
                if breaker is None:
                    breaker = self._new(f"Redis node {node} (applimit)", node)
                    self._nodes[node] = breaker
        return breaker

    @staticmethod
    def admit(breakers: Sequence[CircuitBreaker]) -> CircuitBreaker | None:
        """None when every breaker lets the call through (each asked once); else the
        first that does not."""
        seen: set[int] = set()
        for breaker in breakers:
            if id(breaker) in seen:
                continue
            seen.add(id(breaker))
            if not breaker.allow():
                return breaker
        return None

    def states(self) -> dict[str, BreakerState]:
        """Every breaker's state by node name (``main`` for the limiter's own), for
        metrics: read at scrape time, never on a decision's path."""
        states = {"main": self.main.state}
        states.update((node, breaker.state) for node, breaker in list(self._nodes.items()))
        return states

    def state(self, serving: set[str] | None) -> BreakerState:
        """The worst state over the breakers that matter: those of the masters in
        ``serving`` (the slot map's), or, without a slot map (None or empty), ``main``
        and every node's."""
        # No slot map yet (never connected, or every node unknown): only the limiter's own
        # breaker knows whether Redis answers.
        states = [self.main.state] if not serving else []
        states += [
            breaker.state
            for node, breaker in list(self._nodes.items())
            if not serving or node in serving
        ]
        for state in (BreakerState.OPEN, BreakerState.HALF_OPEN):
            if state in states:
                return state
        return BreakerState.CLOSED
