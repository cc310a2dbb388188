"""``AsyncLimiter``: the asyncio shell around the core, for ASGI apps.

It never blocks the event loop: every call is awaited on a ``redis.asyncio`` client and
the whole decision (all its script calls) runs under ``asyncio.timeout(app.timeout)``,
which bounds it even when a connection has to be made first.

On a standalone or Sentinel-managed server, the script calls of decisions made
concurrently (in the same turn of the event loop) are sent together in one pipeline:
each decision is still one EVALSHA and one round trip, but hundreds of concurrent
requests no longer queue for connections one command at a time, which is what made
limiters time out (and fail open) under load when Redis itself was fine.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import redis.asyncio
import redis.asyncio.cluster
from redis.exceptions import NoScriptError, RedisClusterException

from policy import Policy

from . import _clients, _script
from ._breaker import CircuitBreaker
from ._clients import AsyncClient
from ._core import Prepared, ScriptCall
from ._decision import Decision
from ._errors import REDIS_FAILURES, ApplimitError
from ._shell import UNLIMITED, LimiterBase, load_policy
from ._wire import AsyncWire


class AsyncLimiter(LimiterBase):
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
    ) -> None:
        """Enforce ``policy``; the options are those of :class:`~applimit.Limiter`.

        ``redis`` is a ``redis.asyncio.Redis`` (also Sentinel-managed) or
        ``redis.asyncio.cluster.RedisCluster``; as with the sync limiter, only its
        settings are used, in connections of the limiter's own.
        """
        super().__init__(
            policy,
            has_client=redis is not None,
            redis_url=redis_url,
            cluster=cluster,
            max_connections=max_connections,
            failure_threshold=failure_threshold,
            recovery_time=recovery_time,
            test_clock=test_clock,
        )
        factory: Callable[[], AsyncClient]
        if redis is not None:
            factory, is_cluster = _clients.async_from_client(
                redis, timeout=self.timeout, max_connections=max_connections
            )
            self._set_cluster(is_cluster)
        else:
            factory = _clients.async_from_url(
                self.url, timeout=self.timeout, cluster=cluster, max_connections=max_connections
            )
        self._factory = factory
        # On a standalone or Sentinel-managed server, calls go through the wire (batched
        # per event-loop turn, see _wire.py); Redis Cluster keeps redis-py's client.
        self._wire: AsyncWire | None = None
        # Sentinel clients the limiter made from a redis+sentinel:// URL are its to close;
        # a Sentinel behind a client you passed is yours.
        self._owns_sentinels = redis is None and self.url.startswith(_clients.SENTINEL_SCHEME)
        self._client: AsyncClient | None = None
        self._closed = False

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
    ) -> Decision:
        """Count a request against limit ``name`` for ``identity`` if it fits; identity
        None is an anonymous caller at ``ip`` (see Limiter.hit)."""
        return await self._decide(self.core.for_limit("hit", name, identity, tier, cost, ip=ip))

    async def peek(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
    ) -> Decision:
        """What :meth:`hit` would decide now, consuming nothing."""
        return await self._decide(self.core.for_limit("peek", name, identity, tier, cost, ip=ip))

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
    ) -> Decision:
        """Hit every app limit whose ``match`` applies, all or nothing (see Limiter)."""
        return await self._decide(
            self.core.for_request(
                "hit", method, path, identity, tier=tier, cost=cost, ip=ip, host=host
            )
        )

    async def reset(
        self, name: str, identity: str | None, *, tier: str | None = None, ip: str | None = None
    ) -> bool:
        """Forget what limit ``name`` counted for ``identity`` (or the anonymous caller at
        ``ip``); False if Redis was unreachable."""
        keys = self.core.reset_keys(name, identity, tier, ip=ip)
        self._forget(keys)
        try:
            async with asyncio.timeout(self.timeout):
                client = self._connection()
                if self._wire is not None:
                    await self._wire.command("DEL", *keys)
                else:
                    await client.delete(*keys)
        except REDIS_FAILURES as error:
            self._note_failure(error, self.breaker)
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the limiter's own connections (a client you passed stays open)."""
        client, self._client = self._client, None
        self._wire = None
        self._closed = True
        if client is not None:
            await _clients.close_async(client, own_sentinels=self._owns_sentinels)

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

    def _connection(self) -> AsyncClient:
        if self._client is None:
            if self._closed:
                raise ApplimitError("this limiter is closed; build a new one to keep deciding.")
            # Creating the client does no I/O; it connects on its first command.
            client = self._factory()
            if isinstance(client, redis.asyncio.Redis):
                self._wire = AsyncWire(client, self.breaker, timeout=self.timeout)
            self._client = client
        return self._client

    async def _decide(self, prepared: Prepared) -> Decision:
        if not prepared.checks:
            return UNLIMITED
        step = self._approx_begin(prepared) if not self._closed else None
        if step is None:
            return await self._exact(prepared)
        if isinstance(step, Decision):
            return step
        # Approximate mode: the batch, then (when it is denied) the pending requests that
        # still fit, then the request alone, so a denial is Redis' own (see _approx.py).
        assert self.approx is not None
        decision = await self._exact(step.batch)
        flush = self._approx_settle(step, decision)
        if flush is None:
            return decision
        flushed = await self._exact(flush.prepared) if flush.prepared is not None else None
        if not self.approx.flushed(flush, flushed):
            return decision
        final = await self._exact(prepared)
        self.approx.learn(prepared, final)
        return final

    async def _exact(self, prepared: Prepared) -> Decision:
        # A closed limiter raises, as it would without the cache.
        if self.denials is not None and not self._closed:
            local = self.denials.answer(prepared)
            if local is not None:
                return local
        sent = self._clock()
        try:
            client = self._connection()
        except REDIS_FAILURES as error:
            return self._failed(prepared, error, self.breaker)
        wire = self._wire
        if wire is not None:
            # Not a cluster: one call, batched with the others of this event-loop turn
            # under one deadline for the batch (the wire's), not a timer per decision.
            if not self.breaker.allow():
                return self._skipped(prepared, self.breaker)
            try:
                reply = await wire.submit(prepared.calls[0])
            except REDIS_FAILURES as error:
                # The batch reported its own failure to the breaker, once for all of its
                # calls; a caller that ran out of time behind a busy loop is not an outage.
                return self._failed(prepared, error, self.breaker, report=False)
            # The batch told the breaker how Redis answered.
            decision, _ = self._succeeded(prepared, [reply], (), sent)
            return decision
        breakers = [self._breaker_for(_node(client, call)) for call in prepared.calls]
        closed = self._admit(breakers)
        if closed is not None:
            return self._skipped(prepared, closed)
        failed: CircuitBreaker = breakers[0]
        try:
            async with asyncio.timeout(self.timeout):
                if len(prepared.calls) == 1:
                    replies: list[object] = [await _run(client, prepared.calls[0])]
                else:
                    # One call per cluster slot, concurrently: still one round trip of time.
                    outcomes = await asyncio.gather(
                        *(_run(client, call) for call in prepared.calls),
                        return_exceptions=True,
                    )
                    for outcome, breaker in zip(outcomes, breakers, strict=True):
                        if isinstance(outcome, BaseException):
                            failed = breaker
                            raise outcome
                    replies = list(outcomes)
        except REDIS_FAILURES as error:
            return self._failed(prepared, error, failed)
        decision, refunds = self._succeeded(prepared, replies, breakers, sent)
        if refunds:
            await self._refund(client, refunds)
        return decision

    async def _refund(self, client: AsyncClient, refunds: tuple[ScriptCall, ...]) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.gather(*(_run(client, call) for call in refunds))
        except REDIS_FAILURES as error:
            self._refund_failed(error)


def _node(client: AsyncClient, call: ScriptCall) -> str | None:
    """The name of the cluster node serving the call's slot (None: not a cluster)."""
    if call.slot is None or not isinstance(client, redis.asyncio.cluster.RedisCluster):
        return None
    try:
        return str(client.nodes_manager.get_node_from_slot(call.slot).name)
    except (RedisClusterException, LookupError, TypeError):
        # Not connected yet, or the slot map is being rebuilt: count the call against the
        # cluster as a whole.
        return None


async def _run(client: AsyncClient, call: ScriptCall) -> object:
    """EVALSHA the script; on NOSCRIPT (restarted or flushed server) EVAL it once."""
    try:
        return await client.execute_command(
            "EVALSHA", _script.SHA, len(call.keys), *call.keys, *call.args
        )
    except NoScriptError:
        # EVAL runs the script and caches it again, so the next call's EVALSHA finds it.
        return await client.execute_command(
            "EVAL", _script.SOURCE, len(call.keys), *call.keys, *call.args
        )
