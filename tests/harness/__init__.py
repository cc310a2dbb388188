"""Test harness that runs real Redis: standalone servers and a Redis Cluster.

Import from here in tests and fixtures, e.g. ``from harness import RedisServer``.
"""

from .redis_procs import (
    CLUSTER_SLOTS,
    HOST,
    INSTALL_HINT,
    ClusterNodeInfo,
    HarnessError,
    PortInUseError,
    RedisCluster,
    RedisNotInstalledError,
    RedisServer,
    find_redis_binary,
    running,
    wait_until,
)

__all__ = [
    "CLUSTER_SLOTS",
    "HOST",
    "INSTALL_HINT",
    "ClusterNodeInfo",
    "HarnessError",
    "PortInUseError",
    "RedisCluster",
    "RedisNotInstalledError",
    "RedisServer",
    "find_redis_binary",
    "running",
    "wait_until",
]
