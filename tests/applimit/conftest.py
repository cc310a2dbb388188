"""Fixtures of the applimit tests: limiters on the real standalone server and cluster,
and on the in-process ``memory://`` backend.

``make_limiter`` builds limiters for the parametrized backend ({standalone, cluster,
memory}) and flavour ({Limiter, AsyncLimiter}), so the contract suite runs six times. Each
Redis limiter is built from a client of the harness (the limiter copies its settings into
connections of its own); each memory limiter on one store, cleared before the test, as
the Redis fixtures flush theirs. Every limiter is closed after the test.

A test about Redis itself (its TTLs, its script cache, keys older versions wrote) is
marked ``redis_only("why")`` and skipped on the memory backend with that reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import edgegen_policy as policy
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from harness import RedisCluster, RedisServer
from limiter_support import Driver, MakeLimiter, MemoryAdmin

from applimit import AsyncLimiter, Limiter, _memory

# The store of the memory backend's limiters (cleared before each test).
MEMORY_URL = "memory://contract"


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker of tests that only make sense on Redis."""
    config.addinivalue_line(
        "markers", "redis_only(reason): about Redis itself; skipped on the memory backend"
    )


@pytest.fixture(
    params=[
        pytest.param("standalone"),
        pytest.param("cluster", marks=pytest.mark.cluster),
        pytest.param("memory"),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    """Which Redis the limiter talks to (or the in-process memory:// store)."""
    marker = request.node.get_closest_marker("redis_only")
    if request.param == "memory" and marker is not None:
        pytest.skip(f"about Redis itself: {marker.args[0]}")
    return str(request.param)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    """Limiter or AsyncLimiter."""
    return str(request.param)


@pytest.fixture
def redis_admin(backend: str, request: pytest.FixtureRequest) -> Any:
    """A sync client of the backend, flushed, for looking at keys from the outside (on
    the memory backend, the store, cleared, behind the few commands the tests use)."""
    if backend == "memory":
        store = _memory.store(MEMORY_URL.removeprefix("memory://"))
        store.clear()
        return MemoryAdmin(store)
    if backend == "cluster":
        return request.getfixturevalue("cluster_client")
    return request.getfixturevalue("redis_client")


@pytest.fixture
async def make_limiter(
    backend: str, flavour: str, redis_admin: Any, request: pytest.FixtureRequest
) -> AsyncIterator[MakeLimiter]:
    """A factory: ``make_limiter(policy_yaml, **options)`` -> Driver, closed at teardown."""
    made: list[Driver] = []
    user_clients: list[Any] = []
    if backend == "memory":
        url = MEMORY_URL
    elif backend == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url

    def make(text: str, **options: Any) -> Driver:
        loaded = policy.loads(text)
        limiter: Limiter | AsyncLimiter
        if backend == "memory":
            cls = Limiter if flavour == "sync" else AsyncLimiter
            limiter = cls(loaded, redis_url=url, **options)
        elif flavour == "sync":
            client: Any = redis_admin
            limiter = Limiter(loaded, redis=client, **options)
        else:
            if backend == "cluster":
                client = redis.asyncio.cluster.RedisCluster.from_url(url)
            else:
                client = redis.asyncio.Redis.from_url(url)
            user_clients.append(client)
            limiter = AsyncLimiter(loaded, redis=client, **options)
        driver = Driver(limiter)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        await driver.close()
    for client in user_clients:
        await client.aclose()
