"""The decision as a step machine: one body for ``Limiter`` and ``AsyncLimiter``, no I/O.

A decision may need Redis several times: the script call (one per hash slot on Redis
Cluster), the refunds of a denied multi-slot request, and in approximate mode a batch, a
flush and the request alone. What it needs, in which order, and what each answer means
(the denial cache, approximate batching, the circuit breakers, the failure policy,
refunds, observation) is written once, here, as a machine in the manner of h11::

    step = decider.begin(prepared)         # a Decision, or a Send / Wait
    while not isinstance(step, Decision):
        step = decider.advance(step, outcomes_of(step))

(:func:`drive` is that loop for the blocking shell; the async shell awaits instead.)
The outcomes of a :class:`Send` are a list in the order of its calls: each call's reply,
or its failure (an exception of ``REDIS_FAILURES``, not raised); the list may stop at the
first failure when the later calls were not sent. The shells are that loop and nothing
more: the sync one runs each Send on its wire and blocks, the async one awaits it. Every
decision takes it (exact, approximate, peek, disabled, no limit at all), and the machine
tells the observers of the decision it returns, so neither shell has anything to add.

In approximate mode a step may also be a :class:`Wait`: another decision's sync of the
same keys is in flight, and this one is best answered once it lands. The shell waits (a
thread on an event, a task on a future) until it lands or the Wait's deadline passes,
and advances with an empty list, or ``[TimeoutError]``. A Send whose ``carries`` is true
carries requests admitted locally: a shell that stops driving the decision meanwhile (a
cancelled task) still hands the machine the outcome when it comes, or calls
:meth:`Decider.abandon`, which gives them back to pending (see _approx.py); either way
none is lost.

An exact decision (most of them) is the step :meth:`Decider.begin` returns, with its
state on the :class:`Send` itself, and :meth:`Decider.advance` of its outcomes; the
approximate sequence (batch, flush, the request alone) is a generator over the same two
steps, kept inside the machine: the shells never see the difference.

The machine keeps the breakers' ledger: every outcome of a call reaches a breaker here,
the wires only write and read. What it asks of the wire (:class:`Transport`) is which
cluster node serves a slot (for its breaker) and whether the limiter was closed. An
outcome that lands after its decision stopped waiting (the async deadline passed, the
caller was cancelled) still tells of Redis' health: the async wires hand it to
:meth:`Decider.late`.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

from redis.exceptions import ResponseError

from ._approx import ApproxCache, Flight, Sync
from ._breaker import Breakers, BreakerState, CircuitBreaker
from ._calls import ScriptCall
from ._decision import Decision
from ._denials import DenialCache
from ._errors import CLOSED, ApplimitError, DeadlinePassed, PoolExhausted, is_outage
from ._native import mypyc_attr
from ._observe import Notifier
from ._plan import Core
from ._protocol import redirected
from ._replies import Prepared, wrote

logger = logging.getLogger("applimit")

# What a client told to wait during an outage is told: the breaker probes Redis again
# well within this, so a retry after it may already be served normally.
DEGRADED_RETRY_AFTER = 1.0
# Errors specific to one key are logged at most this often (seconds), not per request.
_LOG_INTERVAL = 60.0

UNLIMITED = Decision(
    allowed=True, limit=0, remaining=0, reset_after=0.0, retry_after=None, policy=None
)

# Bound once: read twice per observed decision.
_perf_counter = time.perf_counter
_CLOSED = BreakerState.CLOSED


class Step:
    """A decision in the making: what the machine needs next (a :class:`Send` or a
    :class:`Wait`), and what it needs to go on when the shell hands it the outcomes.

    ``request`` is the decision's own plan (what the observers hear of), ``started`` when
    it began (``time.perf_counter()``, read only when someone observes), ``flow`` the
    approximate sequence it belongs to (None for an exact decision).
    """

    # Slotted, every field stored when a step is made: a Send is made for every decision
    # that goes to Redis, and an instance dict (or a field read through to a class
    # default) is work on that path (docs/benchmarks-compare.md, "Why each speed trick
    # stays").
    __slots__ = ("flow", "request", "started")

    request: Prepared
    started: float
    flow: Approximate | None


class Send(Step):
    """Run ``calls`` and advance with their outcomes.

    ``carries`` marks an approximate sync's calls, which carry requests admitted locally
    (see the module's docstring). ``refund`` marks a call that gives back what a denied
    multi-slot request consumed: the decision (``decided``) is made, the call's failure is
    only logged, and each refund is a Send of its own (so each has its own deadline).
    The rest is the machine's: the plan the calls are of, the breaker of each call, and
    when they were sent (the denial cache's clock).
    """

    __slots__ = ("breakers", "calls", "carries", "decided", "plan", "refunds", "sent")

    plan: Prepared
    calls: tuple[ScriptCall, ...]
    breakers: Sequence[CircuitBreaker]
    sent: float
    carries: bool
    decided: Decision | None
    refunds: tuple[ScriptCall, ...]

    @property
    def refund(self) -> bool:
        """True for a refund's Send (its decision is made)."""
        return self.decided is not None

    def __repr__(self) -> str:
        return f"Send({len(self.calls)} calls{', refund' if self.refund else ''})"


class Wait(Step):
    """Wait for ``flight`` (another decision's sync of the same keys) to land, until
    ``deadline`` (``time.monotonic()`` seconds); advance with ``[]``, or with
    ``[TimeoutError]`` when the deadline passed first."""

    __slots__ = ("deadline", "flight")

    def __init__(self, request: Prepared, flight: Flight, deadline: float) -> None:
        self.request = request
        self.started = 0.0
        self.flow = None
        self.flight = flight
        self.deadline = deadline

    def __repr__(self) -> str:
        return "Wait()"


# The approximate sequence: yields the Sends and Waits the machine hands out, receives
# their outcomes, returns the Decision.
Approximate = Generator[Send | Wait, list[object], Decision]


class Transport(Protocol):
    """What the machine reads of the limiter's wire, sync or async (it never calls I/O)."""

    @property
    def closed(self) -> bool:
        """True once the limiter was closed: a decision then raises ApplimitError."""

    def route(self, slot: int) -> str | None:
        """The name of the cluster node serving ``slot`` now (None: not known)."""


# Subclassed by _shell.py's _Disabled, which stays interpreted.
@mypyc_attr(allow_interpreted_subclasses=True)
class Decider:
    """Makes decisions from plans: local answers, the calls to run, outcomes to decisions.

    Holds the state a decision reads and updates besides Redis: the denial cache, the
    approximate counts, the breakers, and when each kind of trouble was last logged; and
    tells the observers (``notifier``) of every decision it makes. Thread-safe as far as
    its parts are (each has its own lock).
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
        notifier: Notifier,
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
        self.notifier = notifier
        # Read on every decision: with no observer and no shadow limit, none is timed.
        self.observing = notifier.active
        # When each kind of log line was last written (monotonic seconds).
        self._logged: dict[str, float] = {}
        # A deadline that passed with no outage yet: the breaker, and its outage count
        # then. Only a later answer of that Redis, with no outage in between, shows the
        # process was too busy; a hung Redis starts an outage instead (see _log_slow).
        self._slow: tuple[CircuitBreaker, int] | None = None

    # -- the machine ----------------------------------------------------------------------

    def begin(self, prepared: Prepared, inner: bool = False) -> Decision | Send | Wait:
        """The decision for ``prepared``, when it is made without Redis (no limit, the
        denial cache, an open breaker, a local approximate answer); else its first step.

        ``inner`` marks a Redis decision inside the approximate sequence (its batch, its
        flush, the request alone): it is made exactly and not told to the observers (the
        sequence's own decision is)."""
        started = _perf_counter() if self.observing else 0.0
        wire = self.wire
        if not prepared.checks:
            decision: Decision = UNLIMITED
        elif wire.closed:
            # A closed limiter raises, whatever its caches could answer.
            raise ApplimitError(CLOSED)
        elif self.approx is not None and not inner and self.approx.applies(prepared):
            step = self._handed(self._approximate(self.approx, prepared), prepared, None)
            if not isinstance(step, Decision):
                step.started = started
                return step
            decision = step
        else:
            answered = None if self.denials is None else self.denials.answer(prepared)
            if answered is not None:
                decision = answered
            else:
                calls = prepared.calls
                breakers: Sequence[CircuitBreaker]
                if len(calls) == 1:
                    # Every decision but a cluster's that spans identities: one call, one
                    # breaker.
                    slot = calls[0].slot
                    breaker = (
                        self.breakers.main if slot is None else self.breakers.of(wire.route(slot))
                    )
                    breakers = (breaker,)
                    # A closed breaker (nearly always) read here, without allow()'s call.
                    closed = None if breaker.state is _CLOSED or breaker.allow() else breaker
                else:
                    breakers = [
                        self.breakers.of(None if call.slot is None else wire.route(call.slot))
                        for call in calls
                    ]
                    closed = Breakers.admit(breakers)
                if closed is None:
                    # Send has no __init__ (a Python frame per decision): filled here,
                    # every field (see Step).
                    send = Send()
                    send.request = send.plan = prepared
                    send.calls = calls
                    send.breakers = breakers
                    send.sent = self.clock()
                    send.started = started
                    send.flow = None
                    send.carries = False
                    send.decided = None
                    send.refunds = ()
                    return send
                decision = self._skipped(prepared, closed)
        if self.observing and not inner:
            self._observe(prepared, decision, started, sent=False)
        return decision

    def advance(
        self, step: Send | Wait, outcomes: list[object], inner: bool = False
    ) -> Decision | Send | Wait:
        """The next step after ``step``, given its outcomes: the decision, or what to run
        (or wait for) next. ``inner`` as for :meth:`begin`.

        For an exact decision's Send: the breakers told of each outcome, a failure's
        decision by the failure policy, else the decision of the replies (a denial cached)
        or its first refund (a denied multi-slot request); after a refund, the next one or
        the decision."""
        flow = step.flow
        following: Decision | Send | Wait
        if flow is not None and not inner:
            following = self._handed(flow, step.request, outcomes)
        elif not isinstance(step, Send):
            raise TypeError("a Wait is always a step of the approximate sequence")
        elif step.decided is not None:
            following = self._refunded(step, outcomes)
        else:
            # An exact decision's Send; a failed call is found by _answered.
            following = self._answered(step, outcomes)
        if isinstance(following, Decision):
            if self.observing and not inner:
                self._observe(step.request, following, step.started, sent=isinstance(step, Send))
            return following
        following.started = step.started
        return following

    def abandon(self, step: Send | Wait, outcomes: list[object] | None = None) -> None:
        """The shell stopped driving the decision at ``step`` (cancelled, an error). An
        approximate sequence is closed, which gives back to pending what its sync carried
        (see _approx.py); with ``outcomes`` (the carried sync's, landed after the shell
        stopped), it first takes in what Redis counted. Nobody is told of a decision."""
        flow = step.flow
        if flow is None:
            return
        if outcomes is not None:
            try:
                flow.send(outcomes)
            except StopIteration:
                return
        flow.close()

    def _observe(
        self, prepared: Prepared, decision: Decision, started: float, *, sent: bool
    ) -> None:
        """Tell the observers of ``decision``: answered here when no call was sent and the
        failure policy did not decide."""
        self.notifier.notify(
            prepared, decision, _perf_counter() - started, not sent and not decision.degraded
        )

    @staticmethod
    def _handed(
        flow: Approximate, request: Prepared, outcomes: list[object] | None
    ) -> Decision | Send | Wait:
        """The approximate sequence's next step (its first with ``outcomes`` None), marked
        as the sequence's, or its decision."""
        try:
            step = next(flow) if outcomes is None else flow.send(outcomes)
        except StopIteration as done:
            decision: Decision = done.value
            return decision
        step.flow = flow
        step.request = request
        return step

    def _approximate(self, approx: ApproxCache, prepared: Prepared) -> Approximate:
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
            if (yield Wait(prepared, step, deadline)):
                # Syncs of the same keys took the whole timeout: as for a call queued
                # that long behind others, the failure policy decides.
                return self._failed(
                    prepared,
                    DeadlinePassed("syncs of the same keys took the whole timeout"),
                    self.breakers.main,
                )
        if step is None:
            sent = approx.clock()
            alone = yield from self._exact(prepared, carries=False)
            approx.learn(prepared, alone, sent)
            return alone
        decision, ask = yield from self._sync(approx, step)
        if not ask:
            return decision
        sent = approx.clock()
        final = yield from self._exact(prepared, carries=False)
        approx.learn(prepared, final, sent)
        return final

    def _sync(
        self, approx: ApproxCache, step: Sync
    ) -> Generator[Send | Wait, list[object], tuple[Decision, bool]]:
        """Run a sync: the batch, then (when it is denied) the pending requests that still
        fit. Its decision, and whether the request is to be asked about alone. Stopped
        before its reply is taken in (the sequence closed, an exception), it gives what
        it carries back to pending."""
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
        self, prepared: Prepared, *, carries: bool
    ) -> Generator[Send | Wait, list[object], Decision]:
        """One decision by Redis inside the approximate sequence: the machine's own
        steps, as inner ones (:meth:`begin`, then :meth:`advance` until it decides)."""
        step = self.begin(prepared, True)
        if isinstance(step, Send):
            step.carries = carries
        while not isinstance(step, Decision):
            step = self.advance(step, (yield step), True)
        return step

    def _answered(self, send: Send, outcomes: Sequence[object]) -> Decision | Send:
        """The decision of an exact Send's outcomes: a failed call's by the failure policy
        (see :meth:`_failed`); else the replies' (the breakers told, a denial cached), or
        the first of its refunds.

        A failure is looked for only when the replies cannot be read: ``decide`` reads
        every reply and refuses (ValueError) whatever is not one, a failed call's
        exception included, so the outcomes of calls Redis answered are read once
        (docs/benchmarks-compare.md, "Why each speed trick stays")."""
        prepared = send.plan
        try:
            decision, refunds = prepared.decide(outcomes)
        except ValueError as error:
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    return self._failed_send(send, outcomes, outcome)
            # A reply of the wrong shape: Redis answered, so this is not an outage, but
            # the decision can only follow the failure policy.
            self._log_refusal(error)
            decision, refunds = prepared.degraded(DEGRADED_RETRY_AFTER), ()
        breakers = send.breakers
        if self._slow is not None:
            self._confirm_slow(breakers)
        for breaker in breakers:
            # Only during an outage has a breaker anything to learn from a success
            # (success() does nothing otherwise): the replies are looked at only then
            # (docs/benchmarks-compare.md, "Why each speed trick stays").
            if breaker.in_outage:
                _recovering(send, outcomes)
                break
        if self.denials is not None and not decision.allowed:
            self.denials.record(prepared, decision, send.sent)
        if refunds:
            return self._refunding(send, decision, refunds)
        return decision

    def _refunded(self, refund: Send, outcomes: Sequence[object]) -> Decision | Send:
        """After a refund: its failure logged (the decision stands), then the next refund
        or the decision."""
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                _refund_failed(outcome)
        decided = refund.decided
        assert decided is not None
        return self._refunding(refund, decided, refund.refunds)

    @staticmethod
    def _refunding(
        send: Send, decision: Decision, refunds: tuple[ScriptCall, ...]
    ) -> Decision | Send:
        """The Send of the first of ``refunds``, or ``decision`` when none is left."""
        if not refunds:
            return decision
        refund = copy.copy(send)
        refund.calls = refunds[:1]
        refund.carries = False
        refund.decided = decision
        refund.refunds = refunds[1:]
        return refund

    # -- outcomes -------------------------------------------------------------------------

    def _skipped(self, prepared: Prepared, breaker: CircuitBreaker) -> Decision:
        """The decision while a breaker is open: the failure policy, at once."""
        breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def _failed_send(
        self, send: Send, outcomes: Sequence[object], error: BaseException
    ) -> Decision:
        """:meth:`_failed` for the first failed call of ``send``."""
        return self._failed(send.plan, error, send.breakers[list(outcomes).index(error)])

    def _failed(
        self, prepared: Prepared, error: BaseException, breaker: CircuitBreaker
    ) -> Decision:
        """The decision when a call failed: the failure policy, marked degraded (and
        counted in the breaker's outage, if one is on)."""
        self.note_failure(error, breaker)
        breaker.degraded()
        return prepared.degraded(DEGRADED_RETRY_AFTER)

    def late(self, calls: Sequence[ScriptCall], outcomes: Sequence[object]) -> None:
        """The outcomes of ``calls`` whose decisions stopped waiting for them (the
        deadline passed, the caller was cancelled), for the breakers: a batch that
        failed after its callers' deadline is how a Redis that stopped answering shows,
        and a late answer ends an outage as any other does. A redirection is an answer
        (the call went on elsewhere)."""
        wire = self.wire
        for call, outcome in zip(calls, outcomes, strict=True):
            breaker = self.breakers.of(None if call.slot is None else wire.route(call.slot))
            if isinstance(outcome, BaseException) and not redirected(outcome):
                if is_outage(outcome):
                    breaker.failure(outcome)
            elif breaker.in_outage:
                breaker.success(
                    wrote=not isinstance(outcome, BaseException) and wrote(call, outcome)
                )

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


def drive(
    decider: Decider,
    prepared: Prepared,
    run: Callable[[tuple[ScriptCall, ...]], list[object]],
    wait: Callable[[Wait], list[object]],
) -> Decision:
    """The blocking loop over the machine (``Limiter``'s, and what tests drive by hand):
    ``run`` each Send's calls, ``wait`` for each Wait, hand back the outcomes, until it
    decides. Stopped midway (an interrupt, a bug in ``run``), it abandons the decision, so
    what an approximate sync carried goes back to pending, before the error goes on."""
    step = decider.begin(prepared)
    while not isinstance(step, Decision):
        try:
            outcomes = wait(step) if isinstance(step, Wait) else run(step.calls)
        except BaseException:
            decider.abandon(step)
            raise
        step = decider.advance(step, outcomes)
    return step


def _recovering(send: Send, outcomes: Sequence[object]) -> None:
    """Tell each breaker of ``send`` that is in an outage of its call's answer: whether
    the call wrote decides if the outage is over (see _breaker.py)."""
    for call, reply, breaker in zip(send.calls, outcomes, send.breakers, strict=True):
        if breaker.in_outage:
            breaker.success(wrote=wrote(call, reply))


def _refund_failed(error: BaseException) -> None:
    logger.warning(
        "a refund after a denied multi-slot decision failed (%s: %s); the denied request "
        "stays counted against the limits that had admitted it.",
        type(error).__name__,
        error,
        extra={"applimit_event": "refund_failed", "error": type(error).__name__},
    )
