"""``Limiter``: the blocking shell around the core, for threads and WSGI apps."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import redis.cluster

from policy import Policy

from . import _clients
from ._clients import SyncClient
from ._core import Prepared
from ._decision import Decision
from ._errors import REDIS_FAILURES, ApplimitError
from ._shell import UNLIMITED, LimiterBase, load_policy
from ._wire import ClusterWire, SyncWire


class Limiter(LimiterBase):
    """Enforces a policy's app limits through Redis, for every instance of the app at once.

    Build it with :meth:`from_policy`. Every method decides in one round trip to Redis
    (see docs/applimit.md for the exception on Redis Cluster) and never raises a Redis
    error: when Redis is down, slow or refuses, the decision follows the limit's
    ``on_redis_error`` and is marked ``degraded``. Thread-safe; share one per process.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        redis: SyncClient | None = None,
        redis_url: str | None = None,
        cluster: bool = False,
        max_connections: int = 128,
        failure_threshold: int = 3,
        recovery_time: float = 0.25,
        test_clock: Callable[[], float] | None = None,
    ) -> None:
        """Enforce ``policy`` (a loaded :class:`policy.Policy`).

        ``redis`` is a ``redis.Redis`` (also Sentinel-managed) or
        ``redis.cluster.RedisCluster`` whose settings (address, credentials, TLS) the
        limiter copies into connections of its own, with the policy's ``app.timeout``
        and no retries; your client is not used or changed. Or give ``redis_url``
        (``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``; with
        ``cluster=True`` a cluster node's URL). With neither, ``app.redis_url`` from the
        policy is used.

        ``max_connections`` bounds the limiter's pool (callers beyond it wait, within the
        timeout). ``failure_threshold`` consecutive failures open the circuit breaker;
        ``recovery_time`` seconds later one call probes Redis again.

        ``test_clock`` is for tests only: a callable returning seconds that replaces the
        Redis server's clock, so tests can move time without sleeping. Production code
        leaves it None: every instance then uses the server's clock, so clock skew
        between app servers changes nothing.
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
        factory: Callable[[], SyncClient]
        if redis is not None:
            factory, is_cluster = _clients.sync_from_client(
                redis, timeout=self.timeout, max_connections=max_connections
            )
            self._set_cluster(is_cluster)
        else:
            factory = _clients.sync_from_url(
                self.url, timeout=self.timeout, cluster=cluster, max_connections=max_connections
            )
        self._factory = factory
        # Sentinel clients the limiter made from a redis+sentinel:// URL are its to close;
        # a Sentinel behind a client you passed is yours.
        self._owns_sentinels = redis is None and self.url.startswith(_clients.SENTINEL_SCHEME)
        self._client: SyncClient | None = None
        # The script calls bypass redis-py's generic command path (see _wire.py): one wire
        # on a standalone or Sentinel-managed server, one per master on Redis Cluster.
        self._wire: SyncWire | None = None
        self._cluster: ClusterWire | None = None
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_policy(cls, source: str | os.PathLike[str] | Policy, **options: Any) -> Self:
        """A limiter for the policy file at ``source`` (or a loaded Policy).

        ``options`` are those of the constructor (``redis=``, ``redis_url=``, ...). Raises
        ``policy.PolicyLoadError`` for a file that does not load and
        :class:`ConfigurationError` for a policy the app cannot enforce.
        """
        return cls(load_policy(source), **options)

    # -- decisions ------------------------------------------------------------------------

    def hit(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
    ) -> Decision:
        """Count a request of ``cost`` against limit ``name`` for ``identity``, if it fits.

        ``identity`` is the user; None is an anonymous caller, counted by the client
        address ``ip`` in the same bucket :meth:`check_request` counts it in (never in a
        user's, whatever the user id says). A ``per: ip`` limit counts ``ip``, or the
        identity when no ``ip`` is given. ``tier`` defaults to the policy's lowest. Every
        rate of the tier is checked atomically: nothing is consumed unless all of them
        admit the request.
        """
        return self._decide(self.core.for_limit("hit", name, identity, tier, cost, ip=ip))

    def peek(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        cost: int = 1,
        ip: str | None = None,
    ) -> Decision:
        """What :meth:`hit` would decide now, consuming nothing."""
        return self._decide(self.core.for_limit("peek", name, identity, tier, cost, ip=ip))

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
    ) -> Decision:
        """Hit every app limit whose ``match`` applies to this request, all or nothing.

        ``path`` is the request path (query allowed; it is normalised like the edge does).
        ``identity`` is the user, or None for an anonymous caller, who is counted by
        ``ip``. ``ip`` is the client address, needed by ``per: ip`` limits and anonymous
        callers (the middleware passes it). ``host`` is the Host header, for limits that
        match on hosts. A limit without a rate for ``tier`` does not apply.
        """
        return self._decide(
            self.core.for_request(
                "hit", method, path, identity, tier=tier, cost=cost, ip=ip, host=host
            )
        )

    def reset(
        self, name: str, identity: str | None, *, tier: str | None = None, ip: str | None = None
    ) -> bool:
        """Forget what limit ``name`` counted for ``identity`` (every tier, or one);
        identity None and ``ip`` as for :meth:`hit`.

        Returns False, and logs, when Redis could not be reached: unlike a decision, a
        reset has no failure policy to fall back on.
        """
        keys = self.core.reset_keys(name, identity, tier, ip=ip)
        self._forget(keys)
        try:
            client = self._connection()
            if self._wire is not None:
                self._wire.command("DEL", *keys)
            else:
                # One hash tag: every key of an identity is in one slot.
                client.delete(*keys)
        except REDIS_FAILURES as error:
            self._note_failure(error, self.breaker)
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the limiter's own connections (a client you passed stays open)."""
        with self._lock:
            client, self._client = self._client, None
            wire, self._wire = self._wire, None
            cluster, self._cluster = self._cluster, None
            self._closed = True
        if wire is not None:
            wire.close()
        if cluster is not None:
            cluster.close()
        if client is not None:
            _clients.close_sync(client, own_sentinels=self._owns_sentinels)

    def __enter__(self) -> Self:
        """Use as ``with Limiter.from_policy(...) as limiter:``; closes on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the limiter's connections."""
        self.close()

    # -- running calls --------------------------------------------------------------------

    def _connection(self) -> SyncClient:
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._closed:
                raise ApplimitError("this limiter is closed; build a new one to keep deciding.")
            if self._client is None:
                client = self._factory()
                if isinstance(client, redis.Redis):
                    self._wire = SyncWire(
                        client, max_connections=self.max_connections, timeout=self.timeout
                    )
                else:
                    self._cluster = ClusterWire(
                        client, max_connections=self.max_connections, timeout=self.timeout
                    )
                self._client = client
            return self._client

    def _decide(self, prepared: Prepared) -> Decision:
        if not prepared.checks:
            return UNLIMITED
        step = self._approx_begin(prepared) if not self._closed else None
        if step is None:
            return self._exact(prepared)
        if isinstance(step, Decision):
            return step
        # Approximate mode: the batch, then (when it is denied) the pending requests that
        # still fit, then the request alone, so a denial is Redis' own (see _approx.py).
        assert self.approx is not None
        decision = self._exact(step.batch)
        flush = self._approx_settle(step, decision)
        if flush is None:
            return decision
        flushed = self._exact(flush.prepared) if flush.prepared is not None else None
        if not self.approx.flushed(flush, flushed):
            return decision
        final = self._exact(prepared)
        self.approx.learn(prepared, final)
        return final

    def _exact(self, prepared: Prepared) -> Decision:
        # A closed limiter raises, as it would without the cache.
        if self.denials is not None and not self._closed:
            local = self.denials.answer(prepared)
            if local is not None:
                return local
        wire = self._wire
        if wire is not None:
            # A standalone or Sentinel-managed server: one call, under the one breaker.
            if not self.breaker.allow():
                return self._skipped(prepared, self.breaker)
            return self._on_wire(wire, prepared, self._clock())
        sent = self._clock()
        deadline = time.monotonic() + self.timeout
        if self._client is None:
            # A cluster client connects when it is made: while that keeps failing, the
            # breaker decides when to try again, like for any other call.
            if not self.breaker.allow():
                return self._skipped(prepared, self.breaker)
            try:
                client = self._connection()
            except REDIS_FAILURES as error:
                return self._failed(prepared, error, self.breaker)
            if isinstance(client, redis.cluster.RedisCluster):
                self.breaker.success()
        wire = self._wire
        if wire is not None:
            # The first decision made the client, and with it the wire (the breaker was
            # asked above).
            return self._on_wire(wire, prepared, sent)
        cluster = self._cluster
        if cluster is None:
            # Closed by another thread since this decision began.
            raise ApplimitError("this limiter is closed; build a new one to keep deciding.")
        breakers = [self._breaker_for(_node(cluster, call.slot)) for call in prepared.calls]
        closed = self._admit(breakers)
        if closed is not None:
            return self._skipped(prepared, closed)
        replies: list[object] = []
        for call, breaker in zip(prepared.calls, breakers, strict=True):
            try:
                # A request may need one call per slot: together they keep to the
                # decision's deadline.
                if replies and time.monotonic() > deadline:
                    raise TimeoutError("the decision's deadline passed between cluster calls")
                replies.append(cluster.run(call, deadline))
            except REDIS_FAILURES as error:
                return self._failed(prepared, error, breaker)
        decision, refunds = self._succeeded(prepared, replies, breakers, sent)
        for call in refunds:
            try:
                cluster.run(call, time.monotonic() + self.timeout)
            except REDIS_FAILURES as error:
                self._refund_failed(error)
        return decision

    def _on_wire(self, wire: SyncWire, prepared: Prepared, sent: float) -> Decision:
        """The one call of a decision on a standalone or Sentinel-managed server."""
        try:
            reply = wire.run(prepared.calls[0])
        except REDIS_FAILURES as error:
            return self._failed(prepared, error, self.breaker)
        return self._succeeded(prepared, [reply], (self.breaker,), sent)[0]


def _node(cluster: ClusterWire, slot: int | None) -> str | None:
    """The name of the cluster node serving ``slot``."""
    if slot is None:
        return None
    try:
        return cluster.node_name(slot)
    except (redis.exceptions.RedisClusterException, LookupError, TypeError):
        # The slot map is being rebuilt: count the call against the cluster as a whole.
        return None
