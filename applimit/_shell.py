"""What ``Limiter`` and ``AsyncLimiter`` share: options, the parts of a decision, the surface.

The shells differ only in how they run a decision's calls (blocking, or awaited). In
order, a limiter is built here from:

1. its options, checked (a ``redis_url=`` like the policy's ``app.redis_url``);
2. its target, resolved by the shell (:meth:`LimiterBase._resolve`): where the connections
   go and whether that is a Redis Cluster, known before anything else is built; or, for
   a ``memory://`` URL and for a disabled limiter, an in-process store (``_memory.py``);
3. the core (plans by hash slot on a cluster), the denial cache (off where it could not
   be exact), the approximate counts and the breakers;
4. the wire (:meth:`LimiterBase._open`: built without I/O, it connects on first use) and
   the :class:`~applimit._flow.Decider`, the machine the shell drives.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from edgegen_policy import OVERRIDE_TIER, Policy, load

from . import _memory, _override_store, _overrides
from ._approx import ApproxCache
from ._breaker import Breakers, BreakerState
from ._calls import ScriptCall
from ._clients import MEMORY_SCHEME, Target, check_url, memory_target
from ._decision import Decision, Leased
from ._denials import DenialCache
from ._errors import ConfigurationError
from ._flow import UNLIMITED, Decider, Send, Transport, Wait
from ._observe import Notifier, Observer
from ._plan import RequestMatch, make_core
from ._replies import Prepared
from ._rules import CompiledPolicy, compile_policy

logger = logging.getLogger("applimit")


def load_policy(source: str | os.PathLike[str] | Policy) -> Policy:
    """A policy object from a path, or the object itself."""
    if isinstance(source, Policy):
        return source
    return load(source)


class Wire(Transport, Protocol):
    """What the shells' base reads of a wire, sync or async: what the flow reads, and the
    masters that serve slots now (for ``breaker_state``)."""

    def serving_nodes(self) -> set[str] | None:
        """The masters in the slot map (None: not a cluster, or no slot map yet)."""


WireT = TypeVar("WireT", bound=Wire)


class LimiterBase(ABC, Generic[WireT]):
    """Construction and the I/O-free parts of each decision, for both shells."""

    def __init__(
        self,
        policy: Policy,
        *,
        client: object | None,
        redis_url: str | None,
        cluster: bool,
        max_connections: int,
        failure_threshold: int,
        recovery_time: float,
        test_clock: Callable[[], float] | None,
        enabled: bool = True,
        observers: Iterable[Observer] = (),
        log_identities: bool = False,
        override_refresh: float | None = None,
    ) -> None:
        if client is not None and redis_url is not None:
            raise ConfigurationError(
                "pass either redis= (a client) or redis_url=, not both; the limiter builds "
                "its connections from one of them."
            )
        if max_connections < 1:
            raise ConfigurationError(f"max_connections is {max_connections}; use at least 1.")
        if recovery_time <= 0 or failure_threshold < 1:
            raise ConfigurationError(
                "failure_threshold must be at least 1 and recovery_time positive; they "
                "decide when the circuit breaker opens and when it probes Redis again."
            )
        if redis_url is not None:
            check_url(redis_url)
        self.compiled: CompiledPolicy = compile_policy(policy)
        self.url = redis_url if redis_url is not None else self.compiled.redis_url
        self.timeout = self.compiled.timeout
        self.max_connections = max_connections
        self.test_clock = test_clock
        self.enabled = enabled
        # The in-process store this limiter decides on, if not Redis (see _memory.py).
        self.memory_store: _memory.MemoryStore | None = None
        target: Target[Any]
        if not enabled:
            # Nothing is ever decided: a private store stands in for Redis, so that no
            # connection is made and reset() has nothing to reach.
            target = memory_target(MEMORY_SCHEME)
            self.memory_store = _memory.MemoryStore()
        elif client is None and self.url.startswith(MEMORY_SCHEME):
            if cluster:
                raise ConfigurationError(
                    "cluster=True with a memory:// URL: the in-memory store is one store in "
                    "this process; leave cluster out."
                )
            target = memory_target(self.url)
            assert target.memory is not None
            self.memory_store = _memory.store(target.memory)
        else:
            target = self._resolve(client, self.url, cluster)
        self.cluster = target.cluster
        self.core = make_core(
            self.compiled,
            cluster=target.cluster,
            test_clock=test_clock,
            # memory://'s "server" clock, which tests may move, also places quotas.
            wall_clock=_memory.now_seconds if self.memory_store is not None else None,
        )
        # The time a request is sent, by the denial cache's clock: chosen once, as neither
        # the test clock nor the store changes, rather than on every decision.
        self._clock = self._clock_source()
        self.breakers = Breakers(
            threshold=failure_threshold,
            cooldown=recovery_time,
            # A probe that has not reported after a few timeouts was lost (cancelled).
            probe_timeout=max(4 * self.timeout, recovery_time),
        )
        self.breaker = self.breakers.main
        # Kept to open a fresh wire when the limiter is closed (see _reopened).
        self._target = target
        self._wire: WireT = self._open(target)
        self.notifier = self._notifier(observers, log_identities=log_identities)
        self.decider = (Decider if enabled else _Disabled)(
            self.core,
            wire=self._wire,
            breakers=self.breakers,
            denials=self._denial_cache(),
            approx=self._approx_cache(),
            clock=self._clock,
            timeout=self.timeout,
            max_connections=max_connections,
            notifier=self.notifier,
        )
        if self.memory_store is not None:
            self.memory_store.attach(self)
        self._start_overrides(policy, client, override_refresh)

    # -- overrides ------------------------------------------------------------------------

    def _start_overrides(
        self, policy: Policy, client: object | None, refresh: float | None
    ) -> None:
        """The file's overrides, in force at once; and the feed of the run-time ones when
        the policy (``app.override_refresh``) or ``override_refresh=`` asks for them."""
        self.file_overrides = _overrides.from_file(policy)
        if refresh is None and policy.app.override_refresh is not None:
            refresh = policy.app.override_refresh.ms / 1000
        if refresh is not None and not 0 < refresh <= _override_store.MAX_REFRESH:
            raise ConfigurationError(
                f"override_refresh is {refresh}; use a number of seconds above 0, at most "
                f"{_override_store.MAX_REFRESH:g}."
            )
        self.override_refresh = refresh
        self.override_source: _override_store.Source | None = None
        self.override_feed: _override_store.Feed | None = None
        if not self.enabled:
            return
        if self.memory_store is not None:
            self.override_source = _override_store.MemorySource(self.memory_store)
        else:
            self.override_source = _override_store.RedisSource(
                self._override_factory(client), self.compiled.key_prefix
            )
        if refresh is None:
            self._use_overrides(())
            return
        feed = _override_store.Feed(self.override_source, self._use_overrides, interval=refresh)
        self.override_feed = feed
        if self.memory_store is not None:
            # In-process: read now, and again whenever the store says they changed; the
            # thread only ends the overrides that expire.
            feed.poll(force=True)
        else:
            self._use_overrides(())
        feed.start()

    def _override_factory(self, client: object | None) -> Callable[[], Any]:
        """A factory of the blocking client the overrides are read and written with."""
        return self._target.factory

    def overrides_changed(self) -> None:
        """The memory:// store's overrides changed: read them now."""
        if self.override_feed is not None:
            self.override_feed.poll(force=True)

    def _use_overrides(self, runtime: Sequence[_overrides.Override]) -> None:
        """Plan with ``runtime`` and the file's overrides in force now; what this instance
        holds locally of the identities whose override changed is forgotten."""
        found = _overrides.table(self.compiled, (*runtime, *self.file_overrides), time.time())
        before = self.core.overrides
        if dict(before) == dict(found):
            return
        changed = {k for k in (*before, *found) if before.get(k) != found.get(k)}
        self.core.use_overrides(found)
        stale: list[str] = []
        for name, tag in changed:
            rule = self.compiled.by_name[name]
            stale.extend(self.core.keys_of(rule, tuple(rule.tiers), tag))
            for entry in (before.get((name, tag)), found.get((name, tag))):
                if entry is not None:
                    stale.extend(b.key_head + tag + b.key_tail for b in entry.blocks)
        self._forget(stale)

    def overrides_in_force(self) -> list[_overrides.Override]:
        """The overrides this instance decides with now (run-time and file), by limit."""
        return sorted(
            (entry.override for entry in self.core.overrides.values()),
            key=lambda o: (o.limit, o.kind, o.value),
        )

    # -- what each shell provides ---------------------------------------------------------

    @abstractmethod
    def _resolve(self, client: object | None, url: str, cluster: bool) -> Target[Any]:
        """Where the connections go: from ``client``'s settings, else from ``url``."""
        ...

    @abstractmethod
    def _open(self, target: Target[Any]) -> WireT:
        """The wire to ``target``, built without I/O."""
        ...

    def _reopened(self) -> WireT:
        """Put a fresh wire (no connection yet, no I/O) in the old one's place and return
        the old one, for the caller to close.

        Closing a limiter releases its connections without ending it: the next decision
        opens new ones, in the event loop it runs in. An app's lifespan that closes the
        limiter on shutdown therefore serves the next start-up too (each ``TestClient(app)``
        of a test suite runs the lifespan in an event loop of its own), instead of every
        later request meeting a closed limiter.
        """
        old = self._wire
        self._wire = self.decider.wire = self._open(self._target)
        return old

    def _late(self, calls: Sequence[ScriptCall], outcomes: Sequence[object]) -> None:
        """Outcomes whose decisions stopped waiting, from the async wires: to the
        decider's ledger of the breakers (looked up now: a reopened limiter keeps its
        decider)."""
        self.decider.late(calls, outcomes)

    # -- parts ----------------------------------------------------------------------------

    def _denial_cache(self) -> DenialCache | None:
        """The "denied until" cache, or None where it could not be exact.

        On Redis Cluster a policy whose limits count different kinds (per IP, per user, per
        an app key such as ``org``) has requests whose checks span hash slots; their
        refunds give capacity back, which a cached denial would not see.
        """
        kinds = {rule.kind for rule in self.compiled.rules}
        if self.cluster and len(kinds) > 1:
            return None
        return DenialCache(self._clock, exact_clock=self.test_clock is not None)

    def _notifier(self, observers: Iterable[Observer], *, log_identities: bool) -> Notifier:
        """Who hears of each decision (see _observe.py); observers with ``attach`` are
        told of this limiter (for what they read at scrape time)."""
        notifier = Notifier(
            observers,
            shadow=self.enabled and any(rule.shadow for rule in self.compiled.rules),
            log_identities=log_identities,
        )
        for observer in notifier.observers:
            attach = getattr(observer, "attach", None)
            if callable(attach):
                attach(self)
        return notifier

    def _approx_cache(self) -> ApproxCache | None:
        """The approximate counts, if some limit is in approximate mode."""
        if any(rule.approximate for rule in self.compiled.rules):
            return ApproxCache(self.core, self._clock, self._overshoot)
        return None

    def _overshoot(self, limit: str, tier: str, count: int) -> None:
        """Requests a sync found were admitted over a limit: the observers hear of them."""
        self.notifier.overshoot(limit, tier, count)

    def forget_local(self) -> None:
        """Drop every answer this instance holds locally (cached denials, approximate
        counts): what a memory:// store's clear() asks of the limiters on it."""
        self.decider.denials = self._denial_cache()
        self.decider.approx = self._approx_cache()

    def _clock_source(self) -> Callable[[], float]:
        """The denial cache's clock: the test clock, else the memory store's (the "server"
        clock there: the one tests may move), else the monotonic clock."""
        if self.test_clock is not None:
            return self.test_clock
        if self.memory_store is not None:
            return _memory.now_seconds
        return time.monotonic

    def _forget(self, keys: list[str]) -> None:
        """Drop what this instance holds of ``keys`` (a local reset): cached denials and
        approximate counts."""
        tiers = (*self.compiled.tiers, OVERRIDE_TIER)
        if self.decider.denials is not None:
            self.decider.denials.forget(keys, tiers)
        if self.decider.approx is not None:
            self.decider.approx.forget(keys, tiers)

    # -- the public read-only surface -----------------------------------------------------

    @property
    def tiers(self) -> tuple[str, ...]:
        """The policy's tiers, least generous first."""
        return self.compiled.tiers

    @property
    def limits(self) -> tuple[str, ...]:
        """The names of the policy's app limits, in policy order."""
        return tuple(r.name for r in self.compiled.rules)

    def matches(self, method: str, path: str, host: str | None = None, mount: str = "") -> bool:
        """True when some app limit the middleware applies matches this request.

        Local and cheap (no Redis): the middleware asks it (through :meth:`match`) before
        running the app's ``identify``, so a request no limit covers (``/healthz``) never
        reaches the app's auth. Every tier counts, since the tier is only known after
        ``identify``; limits with ``middleware: false`` are left out, as
        :meth:`check_request` leaves them out. A limiter built with ``enabled=False``
        matches nothing. ``mount`` as for :meth:`check_request`.
        """
        return self.match(method, path, host, mount) is not None

    def counts_responses(
        self, method: str, path: str, host: str | None = None, mount: str = ""
    ) -> bool:
        """True when a limit with ``count_when`` matches this request: its response must be
        recorded (``record_request``) once its status is known. Local and cheap, like
        :meth:`matches`; False for a limiter built with ``enabled=False``."""
        found = self.match(method, path, host, mount)
        return found is not None and found.counts_responses

    def match(
        self, method: str, path: str, host: str | None = None, mount: str = ""
    ) -> RequestMatch | None:
        """The app limits the middleware applies that match this request, or None when
        none does: :meth:`matches` and :meth:`counts_responses` in one lookup.

        A :class:`~applimit.RequestMatch` names the limits (every tier's, in policy order)
        and says whether one of them counts responses. The middleware asks it once per
        request, before ``identify``: None passes the request through, and
        ``counts_responses`` says whether to call :meth:`record_request` once the response
        has its status. Local and cheap (no Redis); None for a limiter built with
        ``enabled=False``. ``mount`` as for :meth:`check_request`.
        """
        if not self.enabled:
            # Nothing is limited, so nothing needs to know who is calling.
            return None
        return self.core.request_match(method, path, host, mount)

    @property
    def breaker_state(self) -> BreakerState:
        """The circuit breaker's state, for health checks: ``closed`` when Redis answers.

        On Redis Cluster, the worst over the masters that serve slots now (``open`` if any
        of theirs is open): after a failover the dead master's breaker stays open, but no
        call goes to it any more, so it must not fail health checks forever. Once the
        slot map names the masters, every call is routed to one of them, so the limiter's
        own breaker (used only while no node can be named) no longer counts on its own.
        """
        return self.breakers.state(self._wire.serving_nodes())


class _Disabled(Decider):
    """The decider of a limiter built with ``enabled=False``: every decision is allowed,
    with no results (as for a request no limit matches), and nothing is sent anywhere.
    The arguments are still checked, so a misspelt limit name fails in tests too."""

    def begin(self, prepared: Prepared, inner: bool = False) -> Decision | Send | Wait:
        """Allowed, with no call."""
        return UNLIMITED


def releases_of(decision: Decision) -> tuple[ScriptCall, ...]:
    """The calls that give back the concurrency leases ``decision`` took (none for a
    decision that took none)."""
    if type(decision) is not Leased:
        return ()
    return tuple(call for call in decision.releases if isinstance(call, ScriptCall))


def released(outcomes: Sequence[object]) -> None:
    """Log a release that Redis did not take: its leases run out after the policy's
    ``lease`` instead."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            logger.warning(
                "giving back a concurrency lease failed (%s: %s); it runs out after the "
                "limit's lease instead.",
                type(outcome).__name__,
                outcome,
                extra={"applimit_event": "release_failed", "error": type(outcome).__name__},
            )
