"""``AsyncLimiter``: the asyncio shell around the core, for ASGI apps.

It never blocks the event loop: every call is awaited on a ``redis.asyncio`` client and
the whole decision (all its script calls) runs under ``asyncio.timeout(app.timeout)``,
which bounds it even when a connection has to be made first.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from redis.exceptions import NoScriptError

from policy import Policy

from . import _clients, _script
from ._clients import AsyncClient
from ._core import Prepared, ScriptCall
from ._decision import Decision
from ._errors import REDIS_FAILURES, ApplimitError
from ._shell import LimiterBase, load_policy


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
        self, name: str, identity: str, *, tier: str | None = None, cost: int = 1
    ) -> Decision:
        """Count a request against limit ``name`` for ``identity`` if it fits (see Limiter.hit)."""
        return await self._decide(self.core.for_limit("hit", name, identity, tier, cost))

    async def peek(
        self, name: str, identity: str, *, tier: str | None = None, cost: int = 1
    ) -> Decision:
        """What :meth:`hit` would decide now, consuming nothing."""
        return await self._decide(self.core.for_limit("peek", name, identity, tier, cost))

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

    async def reset(self, name: str, identity: str, *, tier: str | None = None) -> bool:
        """Forget what limit ``name`` counted for ``identity``; False if Redis was unreachable."""
        keys = self.core.reset_keys(name, identity, tier)
        try:
            async with asyncio.timeout(self.timeout):
                await self._connection().delete(*keys)
        except REDIS_FAILURES as error:
            self._note_failure(error)
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the limiter's own connections (a client you passed stays open)."""
        client, self._client = self._client, None
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
            self._client = self._factory()
        return self._client

    async def _decide(self, prepared: Prepared) -> Decision:
        early = self._before(prepared)
        if early is not None:
            return early
        try:
            client = self._connection()
            async with asyncio.timeout(self.timeout):
                if len(prepared.calls) == 1:
                    replies: list[object] = [await _run(client, prepared.calls[0])]
                else:
                    # One call per cluster slot, concurrently: still one round trip of time.
                    outcomes = await asyncio.gather(
                        *(_run(client, call) for call in prepared.calls), return_exceptions=True
                    )
                    for outcome in outcomes:
                        if isinstance(outcome, BaseException):
                            raise outcome
                    replies = list(outcomes)
        except REDIS_FAILURES as error:
            return self._failed(prepared, error)
        decision, refunds = self._succeeded(prepared, replies)
        if refunds:
            await self._refund(client, refunds)
        return decision

    async def _refund(self, client: AsyncClient, refunds: tuple[ScriptCall, ...]) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.gather(*(_run(client, call) for call in refunds))
        except REDIS_FAILURES as error:
            self._refund_failed(error)


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
