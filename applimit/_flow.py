"""The decision as a protocol: one body for ``Limiter`` and ``AsyncLimiter``, no I/O.

A decision may need Redis several times: the script call (one per hash slot on Redis
Cluster), the refunds of a denied multi-slot request, and in approximate mode a batch, a
flush and the request alone. What it needs, in which order, and what each answer means
(the denial cache, approximate batching, the circuit breakers, the failure policy,
refunds) is written once, here, as a generator in the manner of httpx's ``auth_flow``::

    flow = decider.decide_flow(prepared)
    send = next(flow)                      # a Send: the script calls to run
    send = flow.send(outcomes)             # their outcomes; again until StopIteration,
                                           # whose value is the Decision

The outcomes of a :class:`Send` are a list in the order of its calls: each call's reply,
or its failure (an exception of ``REDIS_FAILURES``, not raised); the list may stop at the
first failure when the later calls were not sent. The shells only drive the flow: the
sync one runs each Send on its wire and blocks, the async one awaits it.

In approximate mode a flow may also yield a :class:`Wait`: another decision's sync of the
same keys is in flight, and this one is best answered once it lands. The shell waits (a
thread on an event, a task on a future) until it lands or the Wait's deadline passes,
and sends back an empty list, or ``[TimeoutError]``. A Send whose ``carries`` is true
carries requests admitted locally: a shell that stops driving the flow meanwhile (a
cancelled task) still hands it the outcome when it comes, or closes the flow, which gives
them back to pending (see _approx.py); either way none is lost.

An exact decision (no approximate limit in the policy: most limiters) is two steps around
its calls, :meth:`Decider.start` and :meth:`Decider.finish` (then any refunds), which is
all its flow is made of; the shells call them directly, without the generator around them
(a tenth of an async decision's CPU). The meaning is written once either way.

What the flow asks of the wire (:class:`Transport`): which cluster node serves a slot
(for its breaker), whether the wire tells the breakers of its outcomes itself (the async
batches do, once per batch), and whether the limiter was closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

from redis.exceptions import ResponseError

from ._approx import ApproxCache, Flight, Sync
from ._breaker import Breakers, CircuitBreaker
from ._core import Core, Prepared, ScriptCall, wrote
from ._decision import Decision
from ._denials import DenialCache
from ._errors import CLOSED, ApplimitError, PoolExhausted, is_outage
from ._native import mypyc_attr

logger = logging.getLogger("applimit")

# What a client told to wait during an outage is told: the breaker probes Redis again
# well within this, so a retry after it may already be served normally.
DEGRADED_RETRY_AFTER = 1.0
# Errors specific to one key are logged at most this often (seconds), not per request.
_LOG_INTERVAL = 60.0

UNLIMITED = Decision(
    allowed=True, limit=0, remaining=0, reset_after=0.0, retry_after=None, policy=None
)


class Send:
    """What a flow needs next: run ``calls`` and send back their outcomes.

    ``refund`` marks the calls that give back what a denied multi-slot request consumed:
    the decision is made, their failure is only logged, and each gets a deadline of its
    own. ``carries`` marks an approximate sync's calls, which carry requests admitted
    locally (see the module's docstring).
    """

    __slots__ = ("calls", "carries", "refund")

    def __init__(
        self, calls: tuple[ScriptCall, ...], *, refund: bool = False, carries: bool = False
    ) -> None:
        self.calls = calls
        self.refund = refund
        self.carries = carries

    def __repr__(self) -> str:
        return f"Send({len(self.calls)} calls{', refund' if self.refund else ''})"


class Wait:
    """What a flow needs next in approximate mode: wait for ``flight`` (another
    decision's sync of the same keys) to land, until ``deadline`` (``time.monotonic()``
    seconds); send back ``[]``, or ``[TimeoutError]`` when the deadline passed first."""

    __slots__ = ("deadline", "flight")

    def __init__(self, flight: Flight, deadline: float) -> None:
        self.flight = flight
        self.deadline = deadline

    def __repr__(self) -> str:
        return "Wait()"


# An exact decision's calls on their way (Decider.start): the calls, the breaker of each,
# and when they were sent (the denial cache's clock). A plain tuple: made for every
# decision, and a class's __init__ is a Python call of its own.
Sending = tuple[tuple[ScriptCall, ...], Sequence[CircuitBreaker], float]


# A decision in the making: yields Sends (and Waits), receives their outcomes, returns the
# Decision.
Flow = Generator[Send | Wait, list[object], Decision]


class Transport(Protocol):
    """What the flow reads of the limiter's wire, sync or async (it never calls I/O)."""

    @property
    def closed(self) -> bool:
        """True once the limiter was closed: a decision then raises ApplimitError."""

    @property
    def reports(self) -> bool:
        """True when the wire tells the breakers of its outcomes itself."""

    def route(self, slot: int) -> str | None:
        """The name of the cluster node serving ``slot`` now (None: not known)."""


# Subclassed by _shell.py's _Disabled, which stays interpreted.
@mypyc_attr(allow_interpreted_subclasses=True)
class Decider:
    """Makes decisions from plans: local answers, the calls to run, outcomes to decisions.

    Holds the state a decision reads and updates besides Redis: the denial cache, the
    approximate counts, the breakers, and when each kind of trouble was last logged.
    Thread-safe as far as its parts are (each has its own lock).
    """

    def __init__(
        self,
        core: Core,
        *,
        wire: Transport,
        breakers: Breakers,
        denials: DenialCache | None,
        approx: ApproxCache | None,
        clock: Callable[[], float],
        timeout: float,
        max_connections: int,
    ) -> None:
        """``clock`` gives the time a request is sent (the denial cache's clock)."""
        self.core = core
        self.wire = wire
        self.breakers = breakers
        self.denials = denials
        self.approx = approx
        self.clock = clock
        self.timeout = timeout
        self.max_connections = max_connections
        # When each kind of log line was last written (monotonic seconds).
        self._logged: dict[str, float] = {}
        # A deadline that passed with no outage yet: the breaker, and its outage count
        # then. Only a later answer of that Redis, with no outage in between, shows the
        # process was too busy; a hung Redis starts an outage instead (see _log_slow).
        self._slow: tuple[CircuitBreaker, int] | None = None

    # -- the flow -------------------------------------------------------------------------

    def decide_flow(self, prepared: Prepared) -> Flow:
        """The flow of the decision for ``prepared`` (see the module's docstring)."""
        if not prepared.checks:
            return _given(UNLIMITED)
        approx = self.approx
        if approx is None or self.wire.closed or not approx.applies(prepared):
            return self._exact(prepared)
        return self._approximate(approx, prepared)

    def _approximate(self, approx: ApproxCache, prepared: Prepared) -> Flow:
        """Approximate mode: a local answer, or the batch, then (when it is denied) the
        pending requests that still fit, then the request alone, so a denial is Redis'
        own (see _approx.py). While another decision's sync of the same keys is in
        flight, wait for it and begin again (within the timeout), or ask Redis about the
        request alone."""
        deadline = 0.0
        while True:
            step = approx.begin(prepared)
            if isinstance(step, Decision):
                return step
            if not isinstance(step, Flight):
                break
            if not deadline:
                deadline = time.monotonic() + self.timeout
            if (yield Wait(step, deadline)):
                # Syncs of the same keys took the whole timeout: as for a call queued
                # that long behind others, the failure policy decides.
                return self._failed(
                    prepared,
                    TimeoutError("syncs of the same keys took the whole timeout"),
                    self.breakers.main,
                    report=False,
                )
        if step is None:
            sent = approx.clock()
            alone = yield from self._exact(prepared)
            approx.learn(prepared, alone, sent)
            return alone
        decision, ask = yield from self._sync(approx, step)
        if not ask:
            return decision
        sent = approx.clock()
        final = yield from self._exact(prepared)
        approx.learn(prepared, final, sent)
        return final

    def _sync(
        self, approx: ApproxCache, step: Sync
    ) -> Generator[Send, list[object], tuple[Decision, bool]]:
        """Run a sync: the batch, then (when it is denied) the pending requests that still
        fit. Its decision, and whether the request is to be asked about alone. Stopped
        before its reply is taken in (the flow closed, an exception), it gives what it
        carries back to pending."""
        try:
            decision = yield from self._exact(step.batch, carries=True)
            flush = approx.settle(step, decision)
            if flush is None:
                return decision, False
            flushed = None
            if flush.prepared is not None:
                flushed = yield from self._exact(flush.prepared, carries=True)
            return decision, approx.flushed(flush, flushed)
        except BaseException:
            approx.abandon(step)
            raise

    def _exact(
        self, prepared: Prepared, *, carries: bool = False
    ) -> Generator[Send, list[object], Decision]:
        """One decision by Redis, as a flow: :meth:`start`, the calls, :meth:`finish`,
        then any refunds (what the shells run directly when no approximate limit is in
        play). ``carries``: an approximate sync's calls (see :class:`Send`)."""
        step = self.start(prepared)
        if isinstance(step, Decision):
            return step
        decision, refunds = self.finish(prepared, step, (yield Send(step[0], carries=carries)))
        if refunds:
            self.refunded((yield Send(refunds, refund=True)))
        return decision

    def start(self, prepared: Prepared) -> Decision | Sending:
        """An exact decision's first step (the denial cache, the breakers): the decision,
        when it is made here, or the calls to run, for :meth:`finish`."""
        wire = self.wire
        if wire.closed:
            # A closed limiter raises, whatever its caches could answer.
            raise ApplimitError(CLOSED)
        if self.denials is not None:
            local = self.denials.answer(prepared)
            if local is not None:
                return local
        calls = prepared.calls
        breakers: Sequence[CircuitBreaker]
        if len(calls) == 1:
            # Every decision but a cluster's that spans identities: one call, one breaker.
            slot = calls[0].slot
            breaker = self.breakers.main if slot is None else self.breakers.of(wire.route(slot))
            if not breaker.allow():
                return self._skipped(prepared, breaker)
            breakers = (breaker,)
        else:
            breakers = [
                self.breakers.of(None if call.slot is None else wire.route(call.slot))
                for call in calls
            ]
            closed = Breakers.admit(breakers)
            if closed is not None:
                return self._skipped(prepared, closed)
        return calls, breakers, self.clock()

    def finish(
        self, prepared: Prepared, sending: Sending, outcomes: Sequence[object]
    ) -> tuple[Decision, tuple[ScriptCall, ...]]:
        """An exact decision from the outcomes of its calls (the breakers told, a denial
        cached), and the refunds to run after it (a denied multi-slot request; their
        outcomes go to :meth:`refunded`)."""
        calls, breakers, sent = sending
        reported = self.wire.reports
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                failed = self._failed(prepared, outcome, breakers[index], report=not reported)
                return failed, ()
        if self._slow is not None:
            self._confirm_slow(breakers)
        if not reported:
            for call, reply, breaker in zip(calls, outcomes, breakers, strict=True):
                # Only during an outage has a breaker anything to learn from a success
                # (success() does nothing otherwise), and then whether the call wrote
                # decides if the outage is over.
                if breaker.in_outage:
                    breaker.success(wrote=wrote(call, reply))
        try:
            decision, refunds = prepared.decide(outcomes)
        except ValueError as error:
            # A reply of the wrong shape: Redis answered, so this is not an outage, but
            # the decision can only follow the failure policy.
            self._log_refusal(error)
            return prepared.degraded(DEGRADED_RETRY_AFTER), ()
        if self.denials is not None and not decision.allowed:
            self.denials.record(prepared, decision, sent)
        return decision, refunds

    @staticmethod
    def refunded(outcomes: Sequence[object]) -> None:
        """Log the refunds that failed (the decision stands)."""
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                _refund_failed(outcome)

    # -- outcomes -------------------------------------------------------------------------

    def _skipped(self, prepared: Prepared, breaker: CircuitBreaker) -> Decision:
        """The decision while a breaker is open: the failure policy, at once."""
        breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def _failed(
        self, prepared: Prepared, error: BaseException, breaker: CircuitBreaker, *, report: bool
    ) -> Decision:
        """The decision when a call failed: the failure policy, marked degraded.

        ``report`` is False when the wire told the breaker itself (the async batches
        report once for all their calls).
        """
        if not report:
            breaker.degraded()
            self.log_other(error, breaker)
        elif self.note_failure(error, breaker):
            breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def note_failure(self, error: BaseException, breaker: CircuitBreaker) -> bool:
        """Feed a failed call to the breaker (or the log); True when it was an outage."""
        if is_outage(error):
            breaker.failure(error)
            return True
        self.log_other(error, breaker)
        return False

    def log_other(self, error: BaseException, breaker: CircuitBreaker) -> None:
        """Log a failure that is no outage (the breaker logs those), at most once a
        minute for each kind: the process too busy to keep to the timeout, its own pool
        too small, or an answer from Redis the limiter cannot use."""
        if isinstance(error, PoolExhausted):
            self._log_pool(error)
        elif isinstance(error, TimeoutError):
            self._log_slow(breaker)
        elif isinstance(error, ResponseError) and not is_outage(error):
            self._log_refusal(error)

    def _due(self, kind: str) -> bool:
        """True (and noted) when a log line of ``kind`` was not written in the last
        minute: an outage or overload must not flood the log with one line per decision."""
        now = time.monotonic()
        if now - self._logged.get(kind, float("-inf")) < _LOG_INTERVAL:
            return False
        self._logged[kind] = now
        return True

    def _log_slow(self, breaker: CircuitBreaker) -> None:
        """Note a decision that ran out of time before Redis was known to be down.

        The callers' deadline (async) passes at the same moment whether the event loop
        was too busy to send the call or Redis stopped answering; in the second case the
        socket timeout reports an outage an instant later. So nothing is written yet:
        :meth:`_confirm_slow` writes the line once Redis has answered with no outage in
        between, and an outage makes it moot (the breaker's warning says what happened).
        """
        if breaker.in_outage or self._slow is not None:
            return
        self._slow = (breaker, breaker.outages)

    def _confirm_slow(self, answered: Sequence[CircuitBreaker]) -> None:
        """Redis answered through ``answered``: log a pending slow decision (at most once
        a minute) if its breaker is among them and saw no outage since."""
        pending = self._slow
        if pending is None:
            return
        breaker, outages = pending
        if breaker not in answered:
            return
        self._slow = None
        if breaker.outages != outages or breaker.in_outage or not self._due("slow"):
            return
        logger.warning(
            "decisions took longer than app.timeout (%.0f ms) while Redis was answering, so "
            "the failure policy decided them: the process is too busy to keep up.",
            self.timeout * 1000,
            extra={
                "applimit_event": "decisions_too_slow",
                "node": breaker.node,
                "timeout_ms": round(self.timeout * 1000),
            },
        )

    def _log_pool(self, error: BaseException) -> None:
        """Log, at most once a minute, decisions that found every connection busy."""
        if not self._due("pool"):
            return
        logger.warning(
            "%s; those decisions followed the failure policy. Redis is not at fault: raise "
            "max_connections (now %d) or make fewer decisions at once.",
            error,
            self.max_connections,
            extra={"applimit_event": "pool_exhausted", "max_connections": self.max_connections},
        )

    def _log_refusal(self, error: BaseException) -> None:
        """Log an answer from Redis that the limiter cannot use, at most once a minute."""
        if not self._due("refusal"):
            return
        logger.error(
            "Redis answered the limiter with an error or an unexpected reply (%s: %s); the "
            "decision follows the failure policy. Is something other than applimit writing "
            "under key prefix %r, or another script loaded under the limiter's SHA?",
            type(error).__name__,
            error,
            self.core.policy.key_prefix,
            extra={
                "applimit_event": "redis_refused",
                "error": type(error).__name__,
                "key_prefix": self.core.policy.key_prefix,
            },
        )


def _given(decision: Decision) -> Flow:
    """A flow that needs no call: its decision is known."""
    yield from ()
    return decision


def _refund_failed(error: BaseException) -> None:
    logger.warning(
        "a refund after a denied multi-slot decision failed (%s: %s); the denied request "
        "stays counted against the limits that had admitted it.",
        type(error).__name__,
        error,
        extra={"applimit_event": "refund_failed", "error": type(error).__name__},
    )
