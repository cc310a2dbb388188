"""Fixtures of the applimit tests: limiters on the real standalone server and cluster.

``make_limiter`` builds limiters for the parametrized backend ({standalone, cluster}) and
flavour ({Limiter, AsyncLimiter}), so the contract suite runs four times. Each limiter is
built from a client of the harness (the limiter copies its settings into connections of
its own) and is closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
from harness import RedisCluster, RedisServer
from limiter_support import Driver, MakeLimiter

import policy
from applimit import AsyncLimiter, Limiter


@pytest.fixture(
    params=[
        pytest.param("standalone"),
        pytest.param("cluster", marks=pytest.mark.cluster),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    """Which Redis the limiter talks to."""
    return str(request.param)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    """Limiter or AsyncLimiter."""
    return str(request.param)


@pytest.fixture
def redis_admin(backend: str, request: pytest.FixtureRequest) -> Any:
    """A sync client of the backend, flushed, for looking at keys from the outside."""
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
    if backend == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url

    def make(text: str, **options: Any) -> Driver:
        loaded = policy.loads(text)
        limiter: Limiter | AsyncLimiter
        if flavour == "sync":
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
