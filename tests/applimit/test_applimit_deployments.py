"""How the limiter reaches Redis: ACL users, TLS, a unix socket, Sentinel, a cluster URL,
for both limiters, against real processes. The limiter builds its own connections from a
client's settings or a URL, so each of these is a test of what it copies."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from harness import HOST, RedisCluster, RedisServer, find_redis_binary, running, wait_until
from limiter_support import Driver

from applimit import AsyncLimiter, Limiter, _wire

POLICY = policy.loads(
    """
version: 1
app: {key_prefix: dep, timeout: 2s}
limits:
  - name: api
    app: {algorithm: sliding_log, tiers: {default: 2/1m}}
"""
)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def build(flavour: str) -> AsyncIterator[Any]:
    """``build(sync_client_or_none, async_client_or_none, **options)`` -> Driver."""
    made: list[Driver] = []
    clients: list[Any] = []

    def make(sync_client: Any = None, async_client: Any = None, **options: Any) -> Driver:
        clients.extend(c for c in (sync_client, async_client) if c is not None)
        if flavour == "sync":
            limiter: Limiter | AsyncLimiter = Limiter(POLICY, redis=sync_client, **options)
        else:
            limiter = AsyncLimiter(POLICY, redis=async_client, **options)
        made.append(Driver(limiter))
        return made[-1]

    yield make
    for driver in made:
        await driver.close()
    for client in clients:
        if isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
            await client.aclose()
        else:
            client.close()


def _read_directly(driver: Driver) -> list[bool] | None:
    """For a sync limiter, whether each connection it holds is read on its socket directly
    (a plain socket on Linux: blocking, the kernel's timeouts; see applimit/_wire.py);
    None for an async one."""
    limiter = driver.limiter
    if not isinstance(limiter, Limiter):
        return None
    wire = limiter._wire
    assert isinstance(wire, _wire.SyncWire)
    return [getattr(c, _wire._DIRECT, None) is c._sock for c in wire._idle]


async def _counts(driver: Driver) -> list[tuple[bool, bool]]:
    who = uuid.uuid4().hex
    out = []
    for _ in range(3):
        decision = await driver.hit("api", who)
        out.append((decision.allowed, decision.degraded))
    return out


EXACT = [(True, False), (True, False), (False, False)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


# --- ACL -----------------------------------------------------------------------------------


@pytest.fixture(params=["functions", "scripts"])
def acl_server(fresh_redis_server: RedisServer, request: pytest.FixtureRequest) -> RedisServer:
    """A server whose default user is off; user 'limiter' may only run the limiter, with
    the commands docs/applimit.md lists: FCALL and FUNCTION LOAD, or (the other set it
    documents) EVALSHA and EVAL."""
    runs = ["+fcall", "+function|load"] if request.param == "functions" else ["+evalsha", "+eval"]
    with fresh_redis_server.client() as admin:
        admin.acl_setuser(
            "limiter",
            enabled=True,
            passwords=["+s3cret"],
            keys=["dep:*"],
            commands=[
                *runs,
                "+del",
                "+time",
                "+zcount",
                "+zrange",
                "+zrangebyscore",
                "+zremrangebyscore",
                "+zadd",
                "+zrem",
                "+pexpire",
                "+ping",
                "+client",
                "+hello",
                "+info",
            ],
        )
        admin.acl_setuser("default", enabled=False)
    return fresh_redis_server


async def test_acl_user_and_password_are_used(acl_server: RedisServer, build: Any) -> None:
    """The limiter's connections authenticate as the client's ACL user."""
    url = f"redis://limiter:s3cret@{HOST}:{acl_server.port}/0"
    driver = build(redis.Redis.from_url(url), redis.asyncio.Redis.from_url(url))
    assert await _counts(driver) == EXACT
    by_url = build(redis_url=url)
    assert await _counts(by_url) == EXACT


async def test_without_credentials_the_failure_policy_answers(
    acl_server: RedisServer, build: Any
) -> None:
    """Refused authentication is an outage like any other: degraded, never raised."""
    driver = build(redis_url=acl_server.url)
    decision = await driver.hit("api", "x")
    assert decision.degraded and decision.allowed


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made with openssl."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_server(certificate: tuple[Path, Path]) -> Iterator[tuple[RedisServer, int]]:
    """A server that also listens with TLS on a second port."""
    cert, key = certificate
    port = _free_port()
    server = RedisServer(
        extra_args=[
            "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
        ]
    )  # fmt: skip
    with running(server):
        yield server, port


async def test_tls_settings_are_copied(
    tls_server: tuple[RedisServer, int], certificate: tuple[Path, Path], build: Any
) -> None:
    """A client with ssl=True and a CA file: the limiter talks TLS with the same settings,
    and an rediss:// URL works too."""
    _, port = tls_server
    cert, _ = certificate
    options = {"host": HOST, "port": port, "ssl": True, "ssl_ca_certs": str(cert)}
    driver = build(redis.Redis(**options), redis.asyncio.Redis(**options))
    assert await _counts(driver) == EXACT
    by_url = build(redis_url=f"rediss://{HOST}:{port}/0?ssl_ca_certs={cert}")
    assert await _counts(by_url) == EXACT
    # A TLS socket is left to redis-py's reads and writes (OpenSSL buffers above it).
    for built in (driver, by_url):
        direct = _read_directly(built)
        assert direct is None or (direct and not any(direct))


# --- unix socket ---------------------------------------------------------------------------


async def test_unix_socket(tmp_path: Path, build: Any) -> None:
    """unix:// URLs and unix-socket clients."""
    path = tmp_path / "redis.sock"
    with running(RedisServer(extra_args=["--unixsocket", str(path)])):
        driver = build(
            redis.Redis(unix_socket_path=str(path)),
            redis.asyncio.Redis(unix_socket_path=str(path)),
        )
        assert await _counts(driver) == EXACT
        by_url = build(redis_url=f"unix://{path}")
        assert await _counts(by_url) == EXACT
        # A plain unix socket is read directly, as a TCP one is (on Linux).
        for built in (driver, by_url):
            direct = _read_directly(built)
            assert direct is None or (direct and all(direct) == sys.platform.startswith("linux"))
        await driver.close()
        await by_url.close()


# --- Sentinel ------------------------------------------------------------------------------


@pytest.fixture
def sentinel(fresh_redis_server: RedisServer, tmp_path: Path) -> Iterator[int]:
    """One redis-server in sentinel mode monitoring the private server as 'mymaster'."""
    port = _free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind {HOST}\ndir {tmp_path}\n"
        f"sentinel monitor mymaster {HOST} {fresh_redis_server.port} 1\n"
    )
    log = (tmp_path / "sentinel.log").open("wb")
    proc = subprocess.Popen(
        [find_redis_binary("redis-server"), str(conf), "--sentinel"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def knows_master() -> bool:
            with redis.Redis(host=HOST, port=port, socket_timeout=1) as probe:
                return probe.sentinel_get_master_addr_by_name("mymaster") is not None

        wait_until(knows_master, timeout=10, what="the sentinel to know its master")
        yield port
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log.close()


async def test_sentinel_managed_master(sentinel: int, build: Any) -> None:
    """redis+sentinel:// URLs, and clients from Sentinel.master_for, find the master."""
    sync_sentinel = redis.sentinel.Sentinel([(HOST, sentinel)])
    async_sentinel = redis.asyncio.sentinel.Sentinel([(HOST, sentinel)])
    try:
        driver = build(sync_sentinel.master_for("mymaster"), async_sentinel.master_for("mymaster"))
        assert await _counts(driver) == EXACT
        by_url = build(redis_url=f"redis+sentinel://{HOST}:{sentinel}/mymaster/0")
        assert await _counts(by_url) == EXACT
        await driver.close()
        await by_url.close()
    finally:
        for client in sync_sentinel.sentinels:
            client.close()
        for async_client in async_sentinel.sentinels:
            await async_client.aclose()


# --- cluster by URL ------------------------------------------------------------------------


@pytest.mark.cluster
async def test_cluster_url(redis_cluster: RedisCluster, cluster_client: Any, build: Any) -> None:
    """cluster=True with a node's URL discovers the cluster."""
    driver = build(redis_url=redis_cluster.url, cluster=True)
    assert await _counts(driver) == EXACT
