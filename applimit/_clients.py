"""The limiter's own Redis clients, built so that one decision never outlasts the timeout.

redis-py retries a failed command 10 times by default, with backoff, and waits 5 s on a
socket: with such a client a hung Redis costs seconds per decision. So the limiter never
runs its script through a client it did not configure. From a URL it builds one; from a
client you pass it builds its own from that client's settings (address, database, ACL
user and password or credential provider, TLS options, the Sentinel service and its
sentinels, the cluster's nodes) with:

- ``socket_timeout`` and ``socket_connect_timeout`` set to the policy's ``app.timeout``;
- no retries (the circuit breaker decides when to try again);
- a blocking pool of ``max_connections`` that waits for a free connection at most the
  timeout, instead of failing at once when many callers arrive together.

Your client is left as it is and stays yours to close. Cluster clients connect when they
are created, so they are built lazily, on the first decision, where a failure is answered
by the failure policy rather than raised.

What this module resolves, before the limiter builds anything else, is a :class:`Target`:
how to make the client, whether it is a Redis Cluster, and whether the Sentinel clients
behind it are the limiter's to close. URLs are shown with their password as ``***``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar, cast
from urllib.parse import unquote

import edgegen_policy as policy
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.sentinel
from pydantic import ValidationError
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._errors import ConfigurationError

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
ClientT = TypeVar("ClientT")

SENTINEL_SCHEME = "redis+sentinel://"
# The in-process store (applimit/_memory.py), for tests: never Redis, never shared
# between processes.
MEMORY_SCHEME = "memory://"
# Every scheme redis_url= takes, with an example of each, for the message that refuses
# another one.
SCHEMES = (
    ("redis://", "redis://host:6379/0"),
    ("rediss://", "rediss://host:6380/0 (TLS)"),
    ("unix://", "unix:///run/redis.sock"),
    (SENTINEL_SCHEME, "redis+sentinel://host:26379,host2:26379/mymaster/0"),
    (MEMORY_SCHEME, "memory:// (in this process only, for tests)"),
)
DEFAULT_SENTINEL_PORT = 26379
# Settings copied from a client you pass, besides address and database: who we are and
# how we talk TLS. Everything about timing and retries is ours.
_IDENTITY_KEYS = (
    "username",
    "password",
    "credential_provider",
    "client_name",
    "socket_keepalive",
    "socket_keepalive_options",
)


@dataclass(frozen=True, slots=True)
class Target(Generic[ClientT]):
    """Where the limiter's connections go, resolved before the limiter is built.

    ``factory`` makes the limiter's own client (a cluster client connects when made);
    ``cluster`` says whether it is a Redis Cluster (plans are then split by hash slot);
    ``owns_sentinels``, whether the Sentinel clients behind it are the limiter's to close
    (made from a ``redis+sentinel://`` URL; a Sentinel behind a client you passed is
    yours).
    """

    factory: Callable[[], ClientT]
    cluster: bool
    owns_sentinels: bool = False
    # The name of the in-process store of a memory:// URL (None: Redis).
    memory: str | None = None


def shown_url(url: str) -> str:
    """``url`` as it may be shown: its password (and a password query argument) as
    ``***``, like ``redis://:***@host:6379/0``."""
    head, at, tail = url.rpartition("@")
    shown = url
    if at:
        # Everything before the last "@" is user information (a password may hold "/").
        prefix, sep, userinfo = head.rpartition("://") if "://" in head else ("", "", head)
        user, colon, _ = userinfo.partition(":")
        shown = f"{prefix}{sep}{user + ':***' if colon else '***'}@{tail}"
    return re.sub(r"(?i)([?&;](?:password|pass|pwd)=)[^&;#]*", r"\1***", shown)


def check_url(url: object) -> None:
    """A ``redis_url=`` given to the limiter, checked as the policy checks
    ``app.redis_url`` (scheme, port, database, query arguments, Sentinel form), so that a
    URL that passes connects; ConfigurationError (password shown as ``***``) if not."""
    if not isinstance(url, str):
        raise ConfigurationError(
            f"redis_url must be a str such as 'redis://host:6379/0', not {type(url).__name__}."
        )
    if url.startswith(MEMORY_SCHEME):
        memory_name(url)
        return
    scheme, sep, _ = url.partition("://")
    if not sep or f"{scheme}://" not in {known for known, _ in SCHEMES}:
        said = f"scheme {scheme + '://'!r}" if sep else "no scheme"
        listed = "; ".join(example for _, example in SCHEMES)
        raise ConfigurationError(
            f"redis_url= {shown_url(url)!r} has {said}, which the limiter does not "
            f"support; use one of: {listed}."
        )
    problem = _url_problem(url)
    if problem is not None:
        # Raised here, outside the handler: the validation error holds the URL as given,
        # which must not ride along as the ConfigurationError's context.
        raise ConfigurationError(f"redis_url= {problem}")


def memory_name(url: str) -> str:
    """The store named by a ``memory://[name]`` URL (``""`` for the default store)."""
    name = url[len(MEMORY_SCHEME) :]
    if not re.fullmatch(r"[A-Za-z0-9_-]*", name):
        raise ConfigurationError(
            f"redis_url= {url!r}: a memory URL is memory:// or memory://name, where name "
            "(letters, digits, - and _) picks one of the process's in-memory stores."
        )
    return name


def memory_target(url: str) -> Target[Any]:
    """The target of a ``memory://`` URL: no client, the store's name."""
    return Target(_no_client, cluster=False, memory=memory_name(url))


def _no_client() -> Any:
    raise ConfigurationError("a memory:// limiter has no Redis client")


def _url_problem(url: str) -> str | None:
    """What the policy's check says about ``url`` (its password shown as ``***``)."""
    try:
        policy.App.model_validate({"redis_url": url})
    except ValidationError as error:
        found = error.errors(include_url=False, include_input=False, include_context=True)
        cause = found[0].get("ctx", {}).get("error") if found else None
        if cause is not None:
            return str(cause)
        return f"{shown_url(url)!r} is not a Redis URL; write it like redis://host:6379/0"
    return None


def _settings(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: kwargs[k] for k in _IDENTITY_KEYS if k in kwargs}
    out.update({k: v for k, v in kwargs.items() if k.startswith("ssl_")})
    return out


# Options a URL may carry that would undo the limiter's bound on each decision.
_TIMING_KEYS = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "retry_on_timeout",
        "retry_on_error",
        "health_check_interval",
        "max_connections",
        "timeout",
        "decode_responses",
    }
)


def _timing(timeout: float) -> dict[str, Any]:
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "health_check_interval": 0,
        "decode_responses": False,
    }


def _address(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    if kwargs.get("path"):
        return {"path": kwargs["path"], "db": kwargs.get("db", 0)}
    return {
        "host": kwargs.get("host", "localhost"),
        "port": kwargs.get("port", 6379),
        "db": kwargs.get("db", 0),
    }


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any]]:
    """Split ``redis+sentinel://[user:password@]host[:port][,host[:port]]/service[/db]``.

    Returns the sentinels, the service name and the master's connection settings
    (``username``, ``password``, ``db``). The credentials are the master's.
    """
    rest = url[len(SENTINEL_SCHEME) :]
    if "?" in rest or "#" in rest:
        raise ConfigurationError(
            f"{shown_url(url)!r}: a Sentinel URL takes no query or fragment; write it like "
            "redis+sentinel://host:26379,host2:26379/mymaster/0"
        )
    netloc, _, path = rest.partition("/")
    options: dict[str, Any] = {}
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, _, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    sentinels: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, port = part, DEFAULT_SENTINEL_PORT
        if part.startswith("["):
            end = part.find("]")
            host, tail = part[1:end], part[end + 1 :]
            if tail.startswith(":"):
                port = int(tail[1:])
        elif ":" in part:
            host, port_text = part.rsplit(":", 1)
            port = int(port_text)
        if not host:
            raise ConfigurationError(f"{shown_url(url)!r}: a sentinel address is empty")
        sentinels.append((host, port))
    service, _, db = path.partition("/")
    if not service:
        raise ConfigurationError(
            f"{shown_url(url)!r} names no service; write it like "
            "redis+sentinel://host:26379/mymaster/0"
        )
    if db:
        if not db.isdigit():
            raise ConfigurationError(f"{shown_url(url)!r}: database {db!r} is not a number")
        options["db"] = int(db)
    return sentinels, unquote(service), options


# --- sync --------------------------------------------------------------------------------


def _sync_retry() -> Retry:
    return Retry(NoBackoff(), 0)


def _url_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A parsed URL's options without those about timing and retries, which are ours
    (redis-py lets URL query arguments override keyword arguments)."""
    return {k: v for k, v in options.items() if k not in _TIMING_KEYS}


def sync_from_url(
    url: str, *, timeout: float, cluster: bool, max_connections: int
) -> Callable[[], SyncClient]:
    """A factory for the limiter's sync client for ``url`` (redis, rediss, unix, sentinel)."""
    timing = _timing(timeout)
    if url.startswith(SENTINEL_SCHEME):
        sentinels, service, options = parse_sentinel_url(url)

        def sentinel_master() -> SyncClient:
            # Older redis-py releases carry no annotations on their Sentinel API.
            sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
                sentinels,
                sentinel_kwargs={**timing, "retry": _sync_retry()},
            )
            master = sentinel.master_for(  # type: ignore[no-untyped-call,unused-ignore]
                service,
                retry=_sync_retry(),
                max_connections=max_connections,
                **timing,
                **options,
            )
            return cast(redis.Redis, master)

        return sentinel_master
    options = _url_options(redis.connection.parse_url(url))  # type: ignore[no-untyped-call]
    if cluster:
        if options.pop("db", 0):
            raise ConfigurationError(f"{shown_url(url)!r}: Redis Cluster has only database 0.")

        def cluster_client() -> SyncClient:
            return redis.cluster.RedisCluster(
                retry=_sync_retry(), max_connections=max_connections, **options, **timing
            )

        return cluster_client

    def standalone() -> SyncClient:
        pool = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
            max_connections=max_connections,
            timeout=timeout,
            retry=_sync_retry(),
            **options,
            **timing,
        )
        return redis.Redis.from_pool(pool)

    return standalone


def _blocking_clone(
    connection_class: Any, kwargs: dict[str, Any], timeout: float, max_connections: int
) -> Callable[[], SyncClient]:
    """A factory of a blocking client on ``kwargs``' address and settings, through
    ``connection_class`` (TCP, TLS or a Unix socket)."""
    timing = _timing(timeout)

    def clone() -> SyncClient:
        own = redis.BlockingConnectionPool(  # type: ignore[no-untyped-call]
            connection_class=connection_class,
            max_connections=max_connections,
            timeout=timeout,
            retry=_sync_retry(),
            **_address(kwargs),
            **_settings(kwargs),
            **timing,
        )
        return redis.Redis.from_pool(own)

    return clone


def sync_from_client(
    client: object, *, timeout: float, max_connections: int
) -> tuple[Callable[[], SyncClient], bool]:
    """A factory for the limiter's own client built from ``client``'s settings.

    Also returns whether it is a cluster client (checks are then grouped by slot).
    """
    timing = _timing(timeout)
    if isinstance(client, redis.cluster.RedisCluster):
        kwargs = client.nodes_manager.connection_kwargs
        nodes = [(n.host, n.port) for n in client.get_nodes()]  # type: ignore[no-untyped-call]
        remap = client.nodes_manager.address_remap
        connection_class = kwargs.get("connection_class")

        def cluster_clone() -> SyncClient:
            extra: dict[str, Any] = {}
            if connection_class is not None:
                extra["connection_class"] = connection_class
            return redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in nodes],  # type: ignore[no-untyped-call]
                retry=_sync_retry(),
                address_remap=remap,
                max_connections=max_connections,
                **_settings(kwargs),
                **timing,
                **extra,
            )

        return cluster_clone, True
    if isinstance(client, redis.Redis):
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        if isinstance(pool, redis.sentinel.SentinelConnectionPool):
            manager, service = pool.sentinel_manager, pool.service_name
            db = kwargs.get("db", 0)

            def sentinel_clone() -> SyncClient:
                master = manager.master_for(
                    service,
                    connection_class=pool.connection_class,
                    retry=_sync_retry(),
                    max_connections=max_connections,
                    db=db,
                    **_settings(kwargs),
                    **timing,
                )
                return cast(redis.Redis, master)

            return sentinel_clone, False
        connection_class = pool.connection_class

        return _blocking_clone(connection_class, kwargs, timeout, max_connections), False
    raise ConfigurationError(
        f"Limiter needs a redis.Redis or redis.cluster.RedisCluster client, not "
        f"{type(client).__module__}.{type(client).__qualname__}; for redis.asyncio clients "
        "use AsyncLimiter."
    )


# --- async -------------------------------------------------------------------------------


def async_retry() -> redis.asyncio.retry.Retry:
    return redis.asyncio.retry.Retry(NoBackoff(), 0)


def async_from_url(
    url: str, *, timeout: float, cluster: bool, max_connections: int
) -> Callable[[], AsyncClient]:
    """A factory for the limiter's asyncio client for ``url``."""
    timing = _timing(timeout)
    if url.startswith(SENTINEL_SCHEME):
        sentinels, service, sentinel_options = parse_sentinel_url(url)

        def sentinel_master() -> AsyncClient:
            sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
                sentinels, sentinel_kwargs={**timing, "retry": async_retry()}
            )
            master = sentinel.master_for(
                service,
                retry=async_retry(),
                max_connections=max_connections,
                **timing,
                **sentinel_options,
            )
            return cast(redis.asyncio.Redis, master)

        return sentinel_master
    options: dict[str, Any] = _url_options(redis.asyncio.connection.parse_url(url))
    if cluster:
        if options.pop("db", 0):
            raise ConfigurationError(f"{shown_url(url)!r}: Redis Cluster has only database 0.")
        # The asyncio cluster client takes ssl=True rather than a connection class.
        connection_class = options.pop("connection_class", None)
        ssl = connection_class is not None and issubclass(
            connection_class, redis.asyncio.SSLConnection
        )

        def cluster_client() -> AsyncClient:
            return redis.asyncio.cluster.RedisCluster(
                retry=async_retry(),
                max_connections=max_connections,
                ssl=ssl,
                **options,
                **timing,
            )

        return cluster_client

    def standalone() -> AsyncClient:
        pool = redis.asyncio.BlockingConnectionPool(
            max_connections=max_connections,
            timeout=timeout,
            retry=async_retry(),
            **options,
            **timing,
        )
        return redis.asyncio.Redis.from_pool(pool)

    return standalone


def async_from_client(
    client: object, *, timeout: float, max_connections: int
) -> tuple[Callable[[], AsyncClient], bool]:
    """A factory for the limiter's own asyncio client built from ``client``'s settings."""
    timing = _timing(timeout)
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        kwargs = client.connection_kwargs
        nodes = [(n.host, n.port) for n in client.get_nodes()] or [
            (n.host, n.port) for n in client.startup_nodes
        ]
        connection_class = kwargs.get("connection_class")
        ssl = connection_class is not None and issubclass(
            connection_class, redis.asyncio.SSLConnection
        )

        def cluster_clone() -> AsyncClient:
            return redis.asyncio.cluster.RedisCluster(
                startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in nodes],
                retry=async_retry(),
                max_connections=max_connections,
                ssl=ssl,
                **{k: v for k, v in _settings(kwargs).items() if k != "socket_keepalive_options"},
                **timing,
            )

        return cluster_clone, True
    if isinstance(client, redis.asyncio.Redis):
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
            manager, service = pool.sentinel_manager, pool.service_name
            db = kwargs.get("db", 0)

            def sentinel_clone() -> AsyncClient:
                master = manager.master_for(
                    service,
                    connection_class=pool.connection_class,
                    retry=async_retry(),
                    max_connections=max_connections,
                    db=db,
                    **_settings(kwargs),
                    **timing,
                )
                return cast(redis.asyncio.Redis, master)

            return sentinel_clone, False
        connection_class = pool.connection_class

        def clone() -> AsyncClient:
            own = redis.asyncio.BlockingConnectionPool(
                connection_class=connection_class,
                max_connections=max_connections,
                timeout=timeout,
                retry=async_retry(),
                **_address(kwargs),
                **_settings(kwargs),
                **timing,
            )
            return redis.asyncio.Redis.from_pool(own)

        return clone, False
    raise ConfigurationError(
        f"AsyncLimiter needs a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster "
        f"client, not {type(client).__module__}.{type(client).__qualname__}; for sync "
        "clients use Limiter."
    )


def sync_from_async_client(
    client: object, *, timeout: float, max_connections: int
) -> Callable[[], SyncClient]:
    """A factory of a blocking client with the settings of the asyncio ``client`` (its
    address, credentials and TLS, as :func:`sync_from_client` copies them): what the
    overrides' feed of an :class:`~applimit.AsyncLimiter` reads with, in its thread. A
    Sentinel-managed client cannot be copied (its manager is asyncio's):
    ConfigurationError."""
    timing = _timing(timeout)
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        kwargs = client.connection_kwargs
        nodes = [(n.host, n.port) for n in client.get_nodes()] or [
            (n.host, n.port) for n in client.startup_nodes
        ]
        ssl = _ssl(kwargs.get("connection_class"))

        def cluster_clone() -> SyncClient:
            return redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in nodes],  # type: ignore[no-untyped-call]
                retry=_sync_retry(),
                max_connections=max_connections,
                ssl=ssl,
                **_settings(kwargs),
                **timing,
            )

        return cluster_clone
    if isinstance(client, redis.asyncio.Redis) and not isinstance(
        client.connection_pool, redis.asyncio.sentinel.SentinelConnectionPool
    ):
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        connection_class: type[redis.Connection | redis.UnixDomainSocketConnection] = (
            redis.UnixDomainSocketConnection if kwargs.get("path") else redis.Connection
        )
        if _ssl(pool.connection_class):
            connection_class = redis.SSLConnection

        return _blocking_clone(connection_class, kwargs, timeout, max_connections)
    raise ConfigurationError(
        "run-time overrides need the Redis the limiter uses, and this client's settings "
        "cannot be copied into a blocking one (a Sentinel-managed asyncio client); pass "
        "redis_url= instead, or leave app.override_refresh out."
    )


def _ssl(connection_class: object) -> bool:
    """Whether an asyncio client's connections are TLS ones."""
    return isinstance(connection_class, type) and issubclass(
        connection_class, redis.asyncio.SSLConnection
    )


# --- targets -------------------------------------------------------------------------------


def sync_target(
    client: object | None, url: str, *, cluster: bool, timeout: float, max_connections: int
) -> Target[SyncClient]:
    """The sync limiter's target: from ``client``'s settings if given, else from ``url``
    (``cluster`` says whether that is a cluster node's)."""
    if client is not None:
        factory, is_cluster = sync_from_client(
            client, timeout=timeout, max_connections=max_connections
        )
        return Target(factory, is_cluster)
    factory = sync_from_url(url, timeout=timeout, cluster=cluster, max_connections=max_connections)
    return Target(factory, cluster, owns_sentinels=url.startswith(SENTINEL_SCHEME))


def async_target(
    client: object | None, url: str, *, cluster: bool, timeout: float, max_connections: int
) -> Target[AsyncClient]:
    """The async limiter's target, as :func:`sync_target`."""
    if client is not None:
        factory, is_cluster = async_from_client(
            client, timeout=timeout, max_connections=max_connections
        )
        return Target(factory, is_cluster)
    factory = async_from_url(url, timeout=timeout, cluster=cluster, max_connections=max_connections)
    return Target(factory, cluster, owns_sentinels=url.startswith(SENTINEL_SCHEME))


# --- closing -------------------------------------------------------------------------------


def close_sync(client: SyncClient, *, own_sentinels: bool) -> None:
    """Close a client the limiter built, and the sentinel clients it built for it."""
    client.close()
    pool = client.connection_pool if isinstance(client, redis.Redis) else None
    if own_sentinels and isinstance(pool, redis.sentinel.SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            sentinel.close()


async def close_async(client: AsyncClient, *, own_sentinels: bool) -> None:
    """Close an asyncio client the limiter built, and its sentinel clients if it built them."""
    await client.aclose()
    pool = client.connection_pool if isinstance(client, redis.asyncio.Redis) else None
    if own_sentinels and isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        for sentinel in pool.sentinel_manager.sentinels:
            await sentinel.aclose()
