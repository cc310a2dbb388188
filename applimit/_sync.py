"""``Limiter``: the blocking shell around the core, for threads and WSGI apps.

It only drives the decision machine (``_flow.py``): each Send is run on the limiter's
wire (``_wire.py``), blocking, and its outcomes handed back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self

from edgegen_policy import Policy

from . import _clients
from ._clients import SyncClient, Target
from ._decision import Decision
from ._errors import REDIS_FAILURES
from ._flow import UNLIMITED, Wait, drive
from ._memory import MemoryWire
from ._observe import Observer
from ._override_store import Overrides
from ._shell import LimiterBase, load_policy, released, releases_of
from ._wire import SyncTransport, open_sync


class Limiter(LimiterBase[SyncTransport | MemoryWire]):
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
        enabled: bool = True,
        observers: Iterable[Observer] = (),
        log_identities: bool = False,
        override_refresh: float | None = None,
        batch: bool = False,
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

        ``observers`` hear of every decision (see :class:`~applimit.Observer` and the
        exporters ``applimit.prometheus`` and ``applimit.otel``). Identities reach them,
        and the shadow-mode log line, hashed; ``log_identities=True`` gives the raw
        counter key instead (only where logs may hold user ids).

        ``batch=True`` is for apps that decide in many threads at once (gunicorn's
        threads, waitress): while one thread's call is in flight, the calls of the others
        queue, and the next write sends them all on one connection, each thread getting
        its own reply (see docs/applimit.md, "Batching threads"). Decisions, timeouts
        and the failure policy are as without it; the breaker counts failed round trips,
        so a batch that fails as a whole is one failure (as for the async limiter). On
        Redis Cluster it changes nothing: calls go one per thread.
        """
        # Read by _open, which the base's constructor calls.
        self.batch = batch
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

    def _resolve(self, client: object | None, url: str, cluster: bool) -> Target[SyncClient]:
        return _clients.sync_target(
            client, url, cluster=cluster, timeout=self.timeout, max_connections=self.max_connections
        )

    def _open(self, target: Target[SyncClient]) -> SyncTransport | MemoryWire:
        if self.memory_store is not None:
            # memory:// or enabled=False: the in-process store (_memory.py), no Redis.
            return MemoryWire(self.memory_store)
        # The script calls bypass redis-py's generic command path (see _wire.py): one wire
        # on a standalone or Sentinel-managed server, one per master on Redis Cluster.
        return open_sync(
            target, max_connections=self.max_connections, timeout=self.timeout, batch=self.batch
        )

    @classmethod
    def from_policy(cls, source: str | os.PathLike[str] | Policy, **options: Any) -> Self:
        """A limiter for the policy file at ``source`` (or a loaded Policy).

        ``options`` are those of the constructor (``redis=``, ``redis_url=``, ...; a
        ``redis_url=`` is checked like the policy's ``app.redis_url``). Raises
        ``policy.PolicyLoadError`` for a file that does not load and
        :class:`ConfigurationError` for a policy or option the app cannot use.
        """
        return cls(load_policy(source), **options)

    @property
    def overrides(self) -> Overrides:
        """The per-identity overrides: set, remove, list and their audit trail
        (docs/applimit.md, "Per-customer overrides")."""
        return Overrides(self)

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
    ) -> Decision:
        """Count a request of ``cost`` against limit ``name`` for ``identity``, if it fits.

        ``identity`` is the user; None is an anonymous caller, counted by the client
        address ``ip`` in the same bucket :meth:`check_request` counts it in (never in a
        user's, whatever the user id says). A ``per: ip`` limit counts ``ip`` and needs
        it (an identity is never taken for an address). A limit that counts by an app key
        (``per: org``) takes its value only from ``keys`` (``keys={"org": "acme"}``), and
        counts a caller without it by ``ip``, as :meth:`check_request` does. ``tier``
        defaults to the policy's lowest. Every rate of the tier is checked atomically:
        nothing is consumed unless all of them admit the request.
        """
        prepared = self.core.for_limit("hit", name, identity, tier, cost, ip=ip, keys=keys)
        return drive(self.decider, prepared, self._wire.run, _wait)

    def peek(
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
        prepared = self.core.for_limit("peek", name, identity, tier, cost, ip=ip, keys=keys)
        return drive(self.decider, prepared, self._wire.run, _wait)

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
    ) -> Decision:
        """Hit every app limit whose ``match`` applies to this request, all or nothing.

        ``path`` is the request path (query allowed; it is normalised like the edge does).
        ``identity`` is the user, or None for an anonymous caller, who is counted by
        ``ip``. ``ip`` is the client address, needed by ``per: ip`` limits and anonymous
        callers (the middleware passes it). ``keys`` holds the app keys (``{"org": ...}``)
        that ``per: <key>`` limits count by (the middleware passes those of the
        :class:`~applimit.Caller`). ``host`` is the Host header, for limits that
        match on hosts. ``mount`` is the prefix of ``path`` the server took off before
        routing (WSGI ``SCRIPT_NAME``, ASGI ``root_path``): limits are checked on the path
        with and without it. A limit without a rate for ``tier`` does not apply, nor does one
        marked ``middleware: false`` (only :meth:`hit` applies it, by name).
        """
        prepared = self.core.for_request(
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
        return drive(self.decider, prepared, self._wire.run, _wait)

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
    ) -> Decision:
        """Count a response of ``status`` against ``name``, a limit with ``count_when``,
        when the limit counts that status (the second step of such a limit).

        A ``count_when`` limit is checked before the work and counted after it:
        :meth:`hit` (or :meth:`check_request`) refuses a caller whose count is spent and
        counts nothing; once the answer is known, ``record`` counts it if its status is
        one the policy lists (``count_when: {status: [401]}``). The other arguments name
        the caller as for :meth:`hit`. Returns the count's decision (denied: the count was
        already spent, so this response was not added), or an allowed decision without
        results when the status does not count. Calls that were admitted together may all
        record: the limit holds callers to its rate plus those already running when it
        was spent (docs/applimit.md, "Counting only some responses").
        """
        prepared = self.core.for_record(
            name, identity, status, tier=tier, cost=cost, ip=ip, keys=keys
        )
        if prepared is None:
            return UNLIMITED
        return drive(self.decider, prepared, self._wire.run, _wait)

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
    ) -> Decision:
        """Count a response of ``status`` against every ``count_when`` limit that
        :meth:`check_request` checked for this request (same arguments), where the limit
        counts that status; the middleware calls it once the response has started. See
        :meth:`record`."""
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
        if prepared is None:
            return UNLIMITED
        return drive(self.decider, prepared, self._wire.run, _wait)

    def release(self, decision: Decision) -> None:
        """Give back the concurrency leases ``decision`` took, once the request it admitted
        has ended (a limit with ``concurrency``; nothing for any other decision). The
        middleware and the helpers call it when the response is sent. A release Redis does
        not take is logged: the leases then run out after the limit's ``lease``."""
        releases = releases_of(decision)
        if not releases:
            return
        try:
            outcomes = self._wire.run(releases)
        except REDIS_FAILURES as error:
            outcomes = [error]
        released(outcomes)

    def reset(
        self,
        name: str,
        identity: str | None,
        *,
        tier: str | None = None,
        ip: str | None = None,
        keys: Mapping[str, str] | None = None,
    ) -> bool:
        """Forget what limit ``name`` counted for ``identity`` (every tier, or one);
        identity None and ``ip`` as for :meth:`hit`.

        Returns False, and logs, when Redis could not be reached: unlike a decision, a
        reset has no failure policy to fall back on.
        """
        redis_keys = self.core.reset_keys(name, identity, tier, ip=ip, keys=keys)
        self._forget(redis_keys)
        try:
            self._wire.delete(redis_keys)
        except REDIS_FAILURES as error:
            self.decider.note_failure(error, self.breaker)
            return False
        return True

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the limiter's own connections (a client you passed stays open).

        The limiter stays usable: a decision after ``close()`` opens new connections (an
        app's shutdown hook followed by another start-up in the same process, as a test
        suite's apps do). What it counted is in Redis, so nothing is forgotten.
        """
        self._reopened().close()
        if self.override_source is not None:
            # The overrides' own connection; the feed, if it runs, opens a new one.
            self.override_source.close()

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


def _wait(wait: Wait) -> list[object]:
    """Block until the sync ``wait`` is for lands: ``[]``, or ``[TimeoutError]`` when
    its deadline passed first."""
    event = wait.flight.event()
    if event is None or event.wait(max(0.0, wait.deadline - time.monotonic())):
        return []
    return [TimeoutError("the sync waited for did not land in time")]
