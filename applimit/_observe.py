"""Decision events: what an observer hears of every decision, and how it is told.

Every decision a limiter returns ends in the decision machine (``_flow.Decider``), which
hands it here (when there is someone to tell) with how long it took and whether it was
answered without Redis. :class:`Notifier` turns it into one :class:`DecisionEvent` per limit result
and calls each observer's ``on_decision``; it also writes the shadow-mode log line.

Identities never travel raw: an event carries ``identity_hash``, a keyed short hash of
the counter the result was counted in (which names the limit and the identity), unless
the app opted in with ``log_identities=True``. The key is random per process, so the hash
tells "the same caller again" within a process and nothing about who the caller is.

An observer that raises must not change a decision: its error is logged (at most once a
minute per observer) and the decision is returned as it was made.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from ._breaker import BreakerState
from ._decision import Decision
from ._frozen import fast_constructor
from ._replies import Prepared

if TYPE_CHECKING:
    from ._shell import LimiterBase

logger = logging.getLogger("applimit")

# Errors of one observer, and shadow denials of one limit, are logged at most this often.
_LOG_INTERVAL = 60.0


class Outcome(StrEnum):
    """What one limit result of a decision came to.

    ``shadow_denied``: a shadow limit (``enforce: false``) would have denied. The
    ``degraded_*`` outcomes are decided by the limit's ``on_redis_error`` because Redis
    could not answer (down, too slow, or the circuit breaker open).
    """

    ALLOWED = "allowed"
    DENIED = "denied"
    SHADOW_DENIED = "shadow_denied"
    DEGRADED_ALLOWED = "degraded_allowed"
    DEGRADED_DENIED = "degraded_denied"

    # Hashed as the str it is: Enum's own __hash__ is a Python function (hash of the
    # member's name), called on every dict and set lookup the exporters make per decision,
    # and it disagrees with str equality (Outcome.DENIED == "denied", hashes differed).
    __hash__ = str.__hash__


@dataclass(frozen=True, slots=True, init=False, repr=False)
class DecisionEvent:
    """One limit result of one decision, as an observer hears of it (immutable).

    ``limit``, ``tier`` and ``algorithm`` name the rate that was checked; ``operation`` is
    ``hit`` (also ``check_request``) or ``peek``. ``remaining`` is that rate's count after
    the decision (0 when degraded). ``latency`` is the whole decision's time in seconds,
    the same for each event of one decision; ``first`` is true for the first event of its
    decision, so that per-decision numbers (latency) are counted once. ``answered_locally``
    is true when the denial cache or approximate mode answered without Redis;
    ``approximate`` when the limit is in approximate mode (such a result that Redis
    answered is a sync). ``identity_hash`` is the hashed counter key (or the raw key when
    the limiter was built with ``log_identities=True``), computed when read: never put it
    in a metric label.
    """

    limit: str
    tier: str
    algorithm: str
    outcome: Outcome
    operation: str
    cost: int
    remaining: int
    latency: float
    answered_locally: bool
    first: bool
    approximate: bool
    # The counter key, shown only through ``hashed`` (identity_hash).
    _key: str
    _hashed: Callable[[str], str]

    def __init__(  # noqa: PLR0917 (the fields, in order)
        self,
        limit: str,
        tier: str,
        algorithm: str,
        outcome: Outcome,
        operation: str,
        cost: int,
        remaining: int,
        latency: float,
        answered_locally: bool,
        first: bool,
        approximate: bool,
        key: str,
        hashed: Callable[[str], str],
    ) -> None:
        """An event; ``key`` is the counter key, ``hashed`` what hides it."""
        values = (
            limit,
            tier,
            algorithm,
            outcome,
            operation,
            cost,
            remaining,
            latency,
            answered_locally,
            first,
            approximate,
            key,
            hashed,
        )
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    @property
    def identity_hash(self) -> str:
        """The counter key (prefix, limit, identity) as it may appear in logs."""
        return self._hashed(self._key)

    def __repr__(self) -> str:
        """The fields, without the counter key."""
        return (
            f"DecisionEvent(limit={self.limit!r}, tier={self.tier!r}, "
            f"algorithm={self.algorithm!r}, outcome={self.outcome.value!r}, "
            f"operation={self.operation!r}, cost={self.cost!r}, remaining={self.remaining!r}, "
            f"latency={self.latency!r}, answered_locally={self.answered_locally!r}, "
            f"first={self.first!r}, approximate={self.approximate!r})"
        )


# DecisionEvent(...) with every field given in order, built without a call per field (see
# _frozen): one per limit result of every decision an observer hears of.
_event = fast_constructor(DecisionEvent)


@runtime_checkable
class Observer(Protocol):
    """Receives every decision of the limiters it is given to (``observers=[...]``).

    ``on_decision`` runs inline, on the caller's thread or event loop, once per limit
    result: it must be quick and must not block (count, or hand off to a queue). An
    observer may also define ``attach(limiter)``, which the limiter calls once when it is
    built, for what it reads at scrape time (the breakers), and
    ``on_overshoot(limit, tier, count)`` (see :class:`OvershootObserver`).
    """

    def on_decision(self, event: DecisionEvent) -> None:
        """Take note of one limit result of a decision."""


@runtime_checkable
class OvershootObserver(Protocol):
    """What an observer may add to hear of approximate mode's overshoot.

    ``count`` requests (cost units) of ``limit`` for ``tier`` that this instance admitted
    locally were found over the limit by a sync with Redis; each request is reported once,
    when a sync first finds it over. Called on the thread or event loop of the decision
    that synced; quick and non-blocking, as ``on_decision``.
    """

    def on_overshoot(self, limit: str, tier: str, count: int) -> None:
        """Take note of ``count`` requests admitted over ``limit`` for ``tier``."""


class CountingObserver(ABC):
    """The base of this package's exporters, and their private channel: the notifier
    hands a hit's result to :meth:`_count_result` as the fields a count needs, with no
    event built (:meth:`on_decision` does the same from an event)."""

    def on_decision(self, event: DecisionEvent) -> None:
        """Count one limit result of a hit; peeks are not counted."""
        if event.operation != "peek":
            self._count_result(
                event.limit,
                event.tier,
                event.outcome,
                event.latency,
                event.answered_locally,
                event.first,
                event.approximate,
            )

    @abstractmethod
    def _count_result(  # noqa: PLR0917 (the fields, in order)
        self,
        limit: str,
        tier: str,
        outcome: Outcome,
        latency: float,
        local: bool,
        first: bool,
        approximate: bool,
    ) -> None:
        """Record one result of a hit."""

    def _count_timed(
        self,
        limit: str,
        tier: str,
        latency: float,
        approximate: bool,
        outcome: Outcome = Outcome.ALLOWED,
    ) -> None:
        """Record the first result of a decision Redis answered (by default admitted: the
        common case, which an exporter may count with less work than
        :meth:`_count_result`)."""
        self._count_result(limit, tier, outcome, latency, False, True, approximate)


def outcome_of(allowed: bool, shadow: bool, degraded: bool) -> Outcome:
    """The outcome of one result: degraded first, then shadow, then the result itself."""
    if degraded:
        return Outcome.DEGRADED_ALLOWED if allowed else Outcome.DEGRADED_DENIED
    if allowed:
        return Outcome.ALLOWED
    return Outcome.SHADOW_DENIED if shadow else Outcome.DENIED


_ALLOWED = Outcome.ALLOWED
_DENIED = Outcome.DENIED
_SHADOW_DENIED = Outcome.SHADOW_DENIED
_DEGRADED_ALLOWED = Outcome.DEGRADED_ALLOWED
_DEGRADED_DENIED = Outcome.DEGRADED_DENIED


class Notifier:
    """Tells a limiter's observers of its decisions, and logs shadow denials.

    ``shadow`` is true when the policy has a shadow limit: shadow denials are logged
    (once a minute per limit and tier) even with no observer.
    """

    def __init__(
        self, observers: Iterable[Observer], *, shadow: bool, log_identities: bool = False
    ) -> None:
        self.observers = tuple(observers)
        for observer in self.observers:
            if not callable(getattr(observer, "on_decision", None)):
                raise TypeError(
                    f"observer {observer!r} has no on_decision(event) method; an observer "
                    "is an object with one (see applimit.Observer)."
                )
        # The exporters of this package (CountingObserver) are handed the few fields a count
        # needs, with no event built (docs/benchmarks-compare.md, "Why each speed trick
        # stays"), and never hear of peeks; every other observer gets the event.
        self._counters = tuple(
            (observer, observer._count_result)
            for observer in self.observers
            if isinstance(observer, CountingObserver)
        )
        self._listeners = tuple(
            observer for observer in self.observers if not isinstance(observer, CountingObserver)
        )
        # One exporter and nothing else: its admitted-by-Redis count is called directly.
        self._fast: Callable[[str, str, float, bool], None] | None = None
        if len(self._counters) == 1 and not self._listeners:
            self._fast = self._counters[0][0]._count_timed
        self._overshooters = tuple(
            cast(OvershootObserver, observer)
            for observer in self.observers
            if callable(getattr(observer, "on_overshoot", None))
        )
        self.shadow = shadow
        self.log_identities = log_identities
        self._key = secrets.token_bytes(16)
        # The bound method, made once: each event holds it, to hash its key when read.
        self._hashed = self.hashed
        self._logged: dict[object, float] = {}

    @property
    def active(self) -> bool:
        """True when a decision has somewhere to go (the shells time it only then)."""
        return bool(self.observers) or self.shadow

    def hashed(self, key: str) -> str:
        """The counter key as it may appear in logs and events."""
        if self.log_identities:
            return key
        return hashlib.blake2b(key.encode(), key=self._key, digest_size=6).hexdigest()

    def notify(self, prepared: Prepared, decision: Decision, latency: float, local: bool) -> None:
        """Tell every observer of ``decision`` (one event per result), and log a shadow
        denial. Never raises. The exporters of this package are handed the fields a count
        needs (``_count_result``), with no event built: this runs on every decision."""
        results = decision.results
        if not results:
            return
        fast = self._fast
        if (
            fast is not None
            and not local
            and len(results) == 1
            and results[0].allowed
            and not decision.degraded
            and prepared.operation != "peek"
        ):
            # The common case, with as little as can be: one limit result, admitted by
            # Redis, and one exporter of this package as the only observer.
            checks = prepared.checks
            result = results[0]
            fast(result.name, result.tier, latency, bool(checks) and checks[0].rule.approximate)
            return
        self._notify_each(prepared, decision, latency, local)

    def _notify_each(
        self, prepared: Prepared, decision: Decision, latency: float, local: bool
    ) -> None:
        """notify's general case: every result to every observer, shadow denials logged."""
        results = decision.results
        degraded = decision.degraded
        observers = self._listeners
        operation = prepared.operation
        counters = self._counters if operation != "peek" else ()
        checks = prepared.checks
        cost = prepared.cost
        hashed = self._hashed
        first = True
        for index, result in enumerate(results):
            shadow = result.shadow
            # outcome_of, inlined: this runs for every result of every decision.
            if degraded:
                outcome = _DEGRADED_ALLOWED if result.allowed else _DEGRADED_DENIED
            elif result.allowed:
                outcome = _ALLOWED
            else:
                outcome = _SHADOW_DENIED if shadow else _DENIED
            if index < len(checks):
                check = checks[index]
                key = check.key
                approximate = check.rule.approximate
            else:
                key, approximate = result.name, False
            if shadow and outcome is not _ALLOWED:
                self._log_shadow(result.name, result.tier, outcome, hashed(key))
            for counter, count in counters:
                try:
                    count(result.name, result.tier, outcome, latency, local, first, approximate)
                except Exception as error:
                    self._log_observer(counter, error)
            if observers:
                event = _event(
                    result.name,
                    result.tier,
                    result.algorithm,
                    outcome,
                    operation,
                    cost,
                    result.remaining,
                    latency,
                    local,
                    first,
                    approximate,
                    key,
                    hashed,
                )
                self._tell(observers, event)
            first = False

    def _tell(self, observers: tuple[Observer, ...], event: DecisionEvent) -> None:
        for observer in observers:
            try:
                observer.on_decision(event)
            except Exception as error:
                # An observer must not break a decision: logged, and the next one runs.
                self._log_observer(observer, error)

    def overshoot(self, limit: str, tier: str, count: int) -> None:
        """Tell the observers that have ``on_overshoot`` of requests admitted over a
        limit in approximate mode. Never raises."""
        for observer in self._overshooters:
            try:
                observer.on_overshoot(limit, tier, count)
            except Exception as error:
                self._log_observer(cast(Observer, observer), error)

    def _due(self, what: object) -> bool:
        now = time.monotonic()
        if now - self._logged.get(what, float("-inf")) < _LOG_INTERVAL:
            return False
        self._logged[what] = now
        return True

    def _log_shadow(self, limit: str, tier: str, outcome: Outcome, identity: str) -> None:
        """A shadow limit would have denied: one line per limit and tier a minute."""
        if not self._due(("shadow", limit, tier)):
            return
        logger.info(
            "shadow limit %r (tier %r) would have denied a request (identity %s); it is "
            "not enforced. Further shadow denials of this limit are counted, not logged, "
            "for a minute.",
            limit,
            tier,
            identity,
            extra={
                "applimit_event": "shadow_denied",
                "limit": limit,
                "tier": tier,
                "outcome": str(outcome),
                "identity_hash": identity,
            },
        )

    def _log_observer(self, observer: Observer, error: Exception) -> None:
        """An observer raised: logged once a minute per observer; the decision stands."""
        if not self._due(("observer", id(observer))):
            return
        logger.error(
            "the decision observer %r raised %s: %s; the decision was made and returned as "
            "usual. Fix the observer: on_decision must not raise.",
            observer,
            type(error).__name__,
            error,
            extra={"applimit_event": "observer_failed", "observer": type(observer).__name__},
        )


_RANK = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class Attached:
    """The limiters an exporter was given to, for what it reads at scrape time.

    Held weakly: a limiter that is dropped stops being reported.
    """

    def __init__(self) -> None:
        self._limiters: weakref.WeakSet[LimiterBase[Any]] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, limiter: LimiterBase[Any]) -> None:
        """Report ``limiter`` too."""
        with self._lock:
            self._limiters.add(limiter)

    def breaker_states(self) -> dict[str, BreakerState]:
        """Each node's breaker state, the worst over the limiters (``main`` is each
        limiter's own breaker)."""
        with self._lock:
            limiters = list(self._limiters)
        worst: dict[str, BreakerState] = {}
        for limiter in limiters:
            for node, state in limiter.breakers.states().items():
                if node not in worst or _RANK[state] > _RANK[worst[node]]:
                    worst[node] = state
        return worst
