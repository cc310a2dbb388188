"""Shared pytest fixtures.

Redis fixtures start REAL redis-server processes through ``tests/harness`` (no fakes). If
Redis is not installed, every test that needs it fails with the install command; it is never
skipped. Add new fixtures in the section they belong to.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import redis
from harness import RedisCluster, RedisServer, running
from redis.cluster import RedisCluster as RedisClusterClient

# --- collection --------------------------------------------------------------------------


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything collection made lives for the whole run: moved out of the collector's
    way, so a full collection late in the run scans only what the tests made since (tests
    that bound a decision's time would otherwise meet pauses that grow with the suite)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the cluster, so ``-m "not cluster"`` skips its start-up."""
    for item in items:
        if "redis_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


# --- standalone Redis --------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One standalone redis-server shared by the session. Do not kill or pause it:
    use ``fresh_redis_server`` for that."""
    with running(RedisServer()) as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the shared server; the database is flushed before each test."""
    with redis_server.client() as client:
        client.flushall()
        yield client


@pytest.fixture
def fresh_redis_server() -> Iterator[RedisServer]:
    """A private redis-server for this test only, free to stop, kill, pause or restart."""
    with running(RedisServer()) as server:
        yield server


# --- Redis Cluster -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-master, 1-replica-each cluster shared by the session. Failover and migration
    tests should start their own ``RedisCluster`` rather than damage this one."""
    with running(RedisCluster()) as cluster:
        yield cluster


@pytest.fixture
def cluster_client(redis_cluster: RedisCluster) -> Iterator[RedisClusterClient]:
    """A cluster client; every master is flushed (and replicas caught up) before each test."""
    for master in redis_cluster.masters():
        with master.client() as node:
            node.flushall()
            # WAIT for the replicas so a test reading from them never sees the old data.
            node.wait(redis_cluster.replicas_per_master, 5000)
    client = redis_cluster.client()
    try:
        yield client
    finally:
        client.close()
