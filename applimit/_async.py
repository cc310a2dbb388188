"""``AsyncLimiter``: the asyncio shell around the core, for ASGI apps.

It only drives the decision machine (``_flow.py``): each Send is awaited on the limiter's
wire (``_awire.py``), and its outcomes handed back. It never
blocks the event loop, and every decision keeps to ``app.timeout``: the script calls of
the decisions made in one turn of the event loop are sent together (per master on Redis
Cluster), under one deadline for the batch.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from edgegen_policy import Policy

from . import _clients
from ._awire import AsyncTransport, open_async
from ._clients import AsyncClient, Target
from ._decision import Decision
from ._errors import REDIS_FAILURES, ConfigurationError
from ._flow import UNLIMITED, Decider, Send, Wait
from ._memory import AsyncMemoryWire
from ._observe import Observer
from ._override_store import AsyncOverrides
from ._replies import Prepared
from ._shell import LimiterBase, load_policy, released, releases_of


class AsyncLimiter(LimiterBase[AsyncTransport | AsyncMemoryWire]):
    """The asyncio twin of :class:`~applimit.Limiter`: the same methods, each returning an
    awaitable (a coroutine).

    Build it with :meth:`from_policy` and close it with ``await limiter.aclose()`` (or use
    ``async with``). Use it from one event loop.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        redis: AsyncClient | None = None,
        redis_url: str | None = None,
        cluster: bool = False,
        max_connections: int = 128,
        failure_threshold: int = 3,
        recovery_time: float = 0.25,
        test_clock: Callable[[], float] | None = None,
        enabled: bool = True,
        observers: Iterable[Observer] = (),
        log_identities: bool = False,
        override_refresh: float | None = None,
    ) -> None:
        """Enforce ``policy``; the options are those of :class:`~applimit.Limiter`.

        ``redis`` is a ``redis.asyncio.Redis`` (also Sentinel-managed) or
        ``redis.asyncio.cluster.RedisCluster``; as with the sync limiter, only its
        settings are used, in connections of the limiter's own.
        """
        super().__init__(
            policy,
            client=redis,
            redis_url=redis_url,
            cluster=cluster,
            max_connections=max_connections,
            failure_threshold=failure_threshold,
            recovery_time=recovery_time,
            test_clock=test_clock,
            enabled=enabled,
            observers=observers,
            log_identities=log_identities,
            override_refresh=override_refresh,
        )
        # The calls of syncs whose decisions were cancelled, still on their way (see
        # _abandon): aclose() lets them land first.
        self._abandoned: set[asyncio.Future[list[object]]] = set()

    def _resolve(self, client: object | None, url: str, cluster: bool) -> Target[AsyncClient]:
        return _clients.async_target(
            client, url, cluster=cluster, timeout=self.timeout, max_connections=self.max_connections
        )

    def _override_factory(self, client: object | None) -> Callable[[], Any]:
        # The overrides are read in a thread of their own, with a blocking client of the
        # same settings (see _override_store.Feed).
        if client is None:
            return _clients.sync_from_url(
                self.url, timeout=self.timeout, cluster=self.cluster, max_connections=4
            )
        try:
            return _clients.sync_from_async_client(client, timeout=self.timeout, max_connections=4)
        except ConfigurationError as error:
            if self.override_refresh is not None:
                raise
            # Only the overrides API would need it: it says why when called.
            problem = error

            def unavailable() -> Any:
                raise problem

            return unavailable

    def _open(self, target: Target[AsyncClient]) -> AsyncTransport | AsyncMemoryWire:
        if self.memory_store is not None:
            # memory:// or enabled=False: the in-process store (_memory.py), no Redis.
            return AsyncMemoryWire(self.memory_store)
        # Calls go through the limiter's own wire, batched per event-loop turn (per master
        # on Redis Cluster), see _awire.py.
        return open_async(
            target, self._late, max_connections=self.max_connections, timeout=self.timeout
        )

    @classmethod
    def from_policy(cls, source: str | os.PathLike[str] | Policy, **options: Any) -> Self:
        """An async limiter for the policy file at ``source`` (or a loaded Policy)."""
        return cls(load_policy(source), **options)

    @property
    def overrides(self) -> AsyncOverrides:
        """The per-identity overrides: set, remove, list and their audit trail
        (docs/applimit.md, "Per-customer overrides")."""
        return AsyncOverrides(self)

    # -- decisions ------------------------------------------------------------------------

    def hit(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> Coroutine[Any, Any, Decision]:
        """Count a request against limit ``name`` for ``identity`` if it fits; identity
        None is an anonymous caller at ``ip`` (see Limiter.hit). Awaitable; the
        arguments are checked at the call."""
        return self._decide(
            self.core.for_limit("hit", name, identity, tier, cost, ip=ip, keys=keys)
        )

    def peek(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> Coroutine[Any, Any, Decision]:
        """What :meth:`hit` would decide now, consuming nothing. Awaitable."""
        return self._decide(
            self.core.for_limit("peek", name, identity, tier, cost, ip=ip, keys=keys)
        )

    def check_request(
        self,
        method: str,
        path: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        host: str | None = None,
        keys: Mapping[str, str] | None = None,
        mount: str = "",
    ) -> Coroutine[Any, Any, Decision]:
        """Hit every app limit whose ``match`` applies, all or nothing (see Limiter).
        Awaitable."""
        return self._decide(
            self.core.for_request(
                "hit",
                method,
                path,
                identity,
                tier=tier,
                cost=cost,
                ip=ip,
                host=host,
                keys=keys,
                mount=mount,
            )
        )

    def record(
        self,
        name: str,
        identity: str | None,
        status: int,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> Coroutine[Any, Any, Decision]:
        """Count a response of ``status`` against the count_when limit ``name`` if it
        counts that status (see Limiter.record). Awaitable; the arguments are checked at
        the call."""
        prepared = self.core.for_record(
            name, identity, status, tier=tier, cost=cost, ip=ip, keys=keys
        )
        return _nothing_counted() if prepared is None else self._decide(prepared)

    def record_request(
        self,
        method: str,
        path: str,
        identity: str | None,
        status: int,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        host: str | None = None,
        keys: Mapping[str, str] | None = None,
        mount: str = "",
    ) -> Coroutine[Any, Any, Decision]:
        """Count a response of ``status`` against the count_when limits check_request
        checked for this request (see Limiter.record_request). Awaitable."""
        prepared = self.core.for_record_request(
            method,
            path,
            identity,
            status,
            tier=tier,
            cost=cost,
            ip=ip,
            host=host,
            keys=keys,
            mount=mount,
        )
        return _nothing_counted() if prepared is None else self._decide(prepared)

    async def release(self, decision: Decision) -> None:
        """Give back the concurrency leases ``decision`` took (see Limiter.release). A
        release already sent completes even if the awaiting task is cancelled."""
        releases = releases_of(decision)
        if not releases:
            return
        try:
            outcomes = await asyncio.shield(asyncio.ensure_future(self._wire.run(releases)))
        except REDIS_FAILURES as error:
            outcomes = [error]
        released(outcomes)

    async def reset(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> bool:
        """Forget what limit ``name`` counted for ``identity`` (or the anonymous caller at
        ``ip``); False if Redis was unreachable."""
        redis_keys = self.core.reset_keys(name, identity, tier, ip=ip, keys=keys)
        self._forget(redis_keys)
        try:
            async with asyncio.timeout(self.timeout):
                await self._wire.delete(redis_keys)
        except REDIS_FAILURES as error:
            self.decider.note_failure(error, self.breaker)
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the limiter's own connections (a client you passed stays open), once
        the syncs of cancelled decisions still on their way have landed (within the
        timeout), so that what they carry is counted.

        The limiter stays usable: a decision after ``aclose()`` opens new connections in
        the event loop it runs in. An app's lifespan that closes the limiter on shutdown
        thus serves the next start-up too (each ``TestClient(app)`` runs the lifespan in
        an event loop of its own).
        """
        if self._abandoned:
            await asyncio.wait(set(self._abandoned), timeout=self.timeout)
        await self._reopened().close()
        if self.override_source is not None:
            # The overrides' own connection (blocking, closed in a thread); the feed, if it
            # runs, opens a new one.
            await asyncio.to_thread(self.override_source.close)

    async def __aenter__(self) -> Self:
        """Use as ``async with AsyncLimiter.from_policy(...) as limiter:``."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the limiter's connections."""
        await self.aclose()

    # -- running calls --------------------------------------------------------------------

    async def _decide(self, prepared: Prepared) -> Decision:
        """Drive the decision's machine (see _flow.py): await each Send on the wire and
        each Wait, hand back the outcomes, until it decides. The public methods return
        this coroutine itself rather than awaiting it in one of their own: one coroutine
        per decision, not two.

        A decision cancelled (the caller went away) while an approximate sync's calls are
        on their way lets the calls run: their outcome is handed to the machine when it
        comes, so that what the sync carries is counted exactly (see :meth:`_abandon`)."""
        decider = self.decider
        wire = self._wire
        step = decider.begin(prepared)
        carrying: asyncio.Future[list[object]] | None = None
        while not isinstance(step, Decision):
            try:
                if isinstance(step, Wait):
                    outcomes = await _wait(step)
                elif step.carries:
                    carrying = asyncio.ensure_future(wire.run(step.calls))
                    outcomes = await asyncio.shield(carrying)
                    carrying = None
                else:
                    outcomes = await wire.run(step.calls)
            except BaseException:
                self._abandon(step, carrying)
                raise
            step = decider.advance(step, outcomes)
        return step

    def _abandon(self, step: Send | Wait, carrying: asyncio.Future[list[object]] | None) -> None:
        """A decision stopped at ``step`` (cancelled, or an error): abandoned now (what an
        approximate sync carried goes back to pending, see _approx.py), or, when a
        sync's calls are on their way, once their outcome has been handed to the machine
        (see :func:`_finish_abandoned`)."""
        decider = self.decider
        if carrying is None:
            decider.abandon(step)
        elif carrying.done():
            _finish_abandoned(decider, step, carrying)
        else:
            self._abandoned.add(carrying)
            carrying.add_done_callback(self._abandoned.discard)
            carrying.add_done_callback(functools.partial(_finish_abandoned, decider, step))


async def _wait(wait: Wait) -> list[object]:
    """Until the sync ``wait`` is for lands: ``[]``, or ``[TimeoutError]`` when its
    deadline passed first."""
    future = wait.flight.future()
    if future is None:
        return []
    try:
        async with asyncio.timeout(max(0.0, wait.deadline - time.monotonic())):
            await future
    except TimeoutError:
        return [TimeoutError("the sync waited for did not land in time")]
    return []


def _finish_abandoned(
    decider: Decider, step: Send | Wait, carrying: asyncio.Future[list[object]]
) -> None:
    """The outcome of a sync whose decision was cancelled, handed to the machine: it takes
    in what Redis counted of what the sync carried (and gives back the rest), and the
    decision ends there."""
    if carrying.cancelled() or carrying.exception() is not None:
        decider.abandon(step)
    else:
        decider.abandon(step, carrying.result())


async def _nothing_counted() -> Decision:
    """The answer of a record call whose status does not count: nothing was sent."""
    return UNLIMITED
