"""``AsyncLimiter``: the asyncio shell around the core, for ASGI apps.

It only drives the decision flow (``_flow.py``): each call the flow asks for is awaited on
the limiter's wire (``_awire.py``), and the outcomes are sent back into it. It never
blocks the event loop, and every decision keeps to ``app.timeout``: the script calls of
the decisions made in one turn of the event loop are sent together (per master on Redis
Cluster), under one deadline for the batch.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from edgegen_policy import Policy

from . import _clients
from ._awire import AsyncTransport, open_async
from ._clients import AsyncClient, Target
from ._core import Prepared
from ._decision import Decision
from ._errors import REDIS_FAILURES
from ._flow import Flow, Wait
from ._memory import AsyncMemoryWire
from ._observe import Observer
from ._shell import LimiterBase, load_policy

# Bound once: read twice per observed decision.
_perf_counter = time.perf_counter


class AsyncLimiter(LimiterBase[AsyncTransport | AsyncMemoryWire]):
    """The asyncio twin of :class:`~applimit.Limiter`: the same methods, as coroutines.

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
        )
        # The calls of syncs whose decisions were cancelled, still on their way (see
        # _drive): aclose() lets them land first.
        self._abandoned: set[asyncio.Future[list[object]]] = set()

    def _resolve(self, client: object | None, url: str, cluster: bool) -> Target[AsyncClient]:
        return _clients.async_target(
            client, url, cluster=cluster, timeout=self.timeout, max_connections=self.max_connections
        )

    def _open(self, target: Target[AsyncClient]) -> AsyncTransport | AsyncMemoryWire:
        if self.memory_store is not None:
            # memory:// or enabled=False: the in-process store (_memory.py), no Redis.
            return AsyncMemoryWire(self.memory_store)
        # Calls go through the limiter's own wire, batched per event-loop turn (per master
        # on Redis Cluster), see _awire.py.
        return open_async(
            target, self.breakers, max_connections=self.max_connections, timeout=self.timeout
        )

    @classmethod
    def from_policy(cls, source: str | os.PathLike[str] | Policy, **options: Any) -> Self:
        """An async limiter for the policy file at ``source`` (or a loaded Policy)."""
        return cls(load_policy(source), **options)

    # -- decisions ------------------------------------------------------------------------

    async def hit(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> Decision:
        """Count a request against limit ``name`` for ``identity`` if it fits; identity
        None is an anonymous caller at ``ip`` (see Limiter.hit)."""
        prepared = self.core.for_limit("hit", name, identity, tier, cost, ip=ip, keys=keys)
        decider = self.decider
        if decider.approx is None and prepared.checks:
            # _decide's exact branch, in line (kept the same as it, observed the same way):
            # the commonest call saves a coroutine and its frame per await
            # (docs/benchmarks-compare.md, "Why each speed trick stays").
            observing = self.observing
            if observing:
                started = _perf_counter()
            step = decider.start(prepared)
            if isinstance(step, Decision):
                decision, sent = step, False
            else:
                sent = True
                decision, refunds = decider.finish(prepared, step, await self._wire.run(step[0]))
                if refunds:
                    decider.refunded(await self._wire.run(refunds))
            if observing:
                self.notifier.notify(
                    prepared,
                    decision,
                    _perf_counter() - started,
                    not sent and not decision.degraded,
                )
            return decision
        return await self._decide(prepared)

    async def peek(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> Decision:
        """What :meth:`hit` would decide now, consuming nothing."""
        return await self._decide(
            self.core.for_limit("peek", name, identity, tier, cost, ip=ip, keys=keys)
        )

    async def check_request(
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
    ) -> Decision:
        """Hit every app limit whose ``match`` applies, all or nothing (see Limiter)."""
        return await self._decide(
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

    async def _decide(self, prepared: Prepared) -> Decision:  # noqa: C901, PLR0912 (the flow driven in line: a coroutine of its own costs every decision an await)
        """Make the decision: an exact one in its two steps, around the awaited calls;
        otherwise drive the decision's flow, awaiting each Send (and Wait) and sending
        back its outcomes.

        A decision cancelled (the caller went away) while an approximate sync's calls are
        on their way lets the calls run: their outcome is handed to the flow when it
        comes, so that what the sync carries is counted exactly (see
        :meth:`_abandon`)."""
        observing = self.observing
        if observing:
            started = _perf_counter()
        decider = self.decider
        wire = self._wire
        if decider.approx is None and prepared.checks:
            # The exact decision (no approximate limit in the policy): the flow's own two
            # steps, called without the generator around them (about a tenth of an
            # async decision's CPU).
            step = decider.start(prepared)
            if isinstance(step, Decision):
                # No call sent: answered here (the denial cache, an open breaker).
                decision, sent = step, False
            else:
                sent = True
                outcomes = await wire.run(step[0])
                decision, refunds = decider.finish(prepared, step, outcomes)
                if refunds:
                    decider.refunded(await wire.run(refunds))
        else:
            flow = decider.decide_flow(prepared)
            # No call sent: answered here (approximate mode, the denial cache, an open
            # breaker or no limit at all).
            sent = False
            carrying: asyncio.Future[list[object]] | None = None
            try:
                send = next(flow)
                while True:
                    if isinstance(send, Wait):
                        send = flow.send(await _wait(send))
                        continue
                    sent = True
                    if send.carries:
                        carrying = asyncio.ensure_future(wire.run(send.calls))
                        outcomes = await asyncio.shield(carrying)
                        carrying = None
                    else:
                        outcomes = await wire.run(send.calls)
                    send = flow.send(outcomes)
            except StopIteration as done:
                decision = done.value
            except BaseException:
                self._abandon(flow, carrying)
                raise
        if observing:
            self.notifier.notify(
                prepared,
                decision,
                _perf_counter() - started,
                not sent and not decision.degraded,
            )
        return decision

    def _abandon(self, flow: Flow, carrying: asyncio.Future[list[object]] | None) -> None:
        """A decision's flow stopped midway (cancelled, or an error): closed now (it gives
        back what its sync carried, see _approx.py), or, when a sync's calls are on their
        way, once their outcome has been handed to it (see :func:`_finish_abandoned`)."""
        if carrying is None:
            flow.close()
        elif carrying.done():
            _finish_abandoned(flow, carrying)
        else:
            self._abandoned.add(carrying)
            carrying.add_done_callback(self._abandoned.discard)
            carrying.add_done_callback(functools.partial(_finish_abandoned, flow))


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


def _finish_abandoned(flow: Flow, carrying: asyncio.Future[list[object]]) -> None:
    """The outcome of a sync whose decision was cancelled, handed to its flow: the flow
    takes in what Redis counted of what the sync carried (and gives back the rest), then
    is closed before it asks for anything more."""
    if carrying.cancelled() or carrying.exception() is not None:
        flow.close()
        return
    try:
        flow.send(carrying.result())
    except StopIteration:
        return
    flow.close()
