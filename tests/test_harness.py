"""Tests of the Redis test harness itself: real processes, real failures."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import redis
from harness import (
    CLUSTER_SLOTS,
    RedisCluster,
    RedisNotInstalledError,
    RedisServer,
    redis_procs,
    running,
)
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster as RedisClusterClient
from redis.crc import key_slot
from redis.retry import Retry

# --- standalone --------------------------------------------------------------------------


def test_server_answers_on_its_url(redis_server: RedisServer, redis_client: redis.Redis) -> None:
    """The shared server answers PING on loopback, and its URL reaches the same process."""
    assert redis_server.host == "127.0.0.1"
    assert redis_client.ping()
    with redis.Redis.from_url(redis_server.url) as by_url:
        assert by_url.info("server")["process_id"] == redis_server.pid
    # Persistence is off, so tests never leave data on disk.
    assert redis_client.config_get("save") == {"save": ""}
    assert redis_client.config_get("appendonly") == {"appendonly": "no"}


@pytest.mark.parametrize("run", ["first", "second"])
def test_each_test_starts_with_an_empty_database(redis_client: redis.Redis, run: str) -> None:
    """Each run finds the database empty, then leaves a key behind: whichever run goes
    second only passes because ``redis_client`` flushed before it."""
    assert redis_client.dbsize() == 0
    redis_client.set(f"left-behind:{run}", "1")
    assert redis_client.dbsize() == 1


def test_restart_comes_back_empty_on_the_same_port(fresh_redis_server: RedisServer) -> None:
    """restart() stops the process and starts a new one on the same port with no data."""
    port, pid = fresh_redis_server.port, fresh_redis_server.pid
    with fresh_redis_server.client() as client:
        client.set("k", "v")
        fresh_redis_server.restart()
        assert fresh_redis_server.port == port
        assert fresh_redis_server.pid != pid
        # The pooled connection died with the old process; the client reconnects by itself.
        assert client.dbsize() == 0


def test_kill_drops_connections_and_restart_recovers(fresh_redis_server: RedisServer) -> None:
    """kill() is a crash: clients get connection errors until the server is restarted."""
    with fresh_redis_server.client(retry=Retry(NoBackoff(), 0)) as client:
        assert client.ping()
        fresh_redis_server.kill()
        assert not fresh_redis_server.running
        with pytest.raises(redis.ConnectionError):
            client.ping()
        fresh_redis_server.restart()
        assert client.ping()


def test_pause_times_out_and_resume_recovers(fresh_redis_server: RedisServer) -> None:
    """A paused (SIGSTOP) server accepts connections but never answers, so a client with a
    short socket timeout times out; after resume (SIGCONT) the same client works again."""
    # No retries: one timeout should surface as one TimeoutError, quickly.
    with fresh_redis_server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0)) as client:
        assert client.ping()
        fresh_redis_server.pause()
        assert fresh_redis_server.paused
        with pytest.raises(redis.TimeoutError):
            client.ping()
        fresh_redis_server.resume()
        assert client.ping()


def test_stop_shuts_down_a_paused_server(fresh_redis_server: RedisServer) -> None:
    """stop() also works on a paused server (SIGTERM is pending until SIGCONT)."""
    fresh_redis_server.pause()
    fresh_redis_server.stop(timeout=5.0)
    assert not fresh_redis_server.running
    assert not fresh_redis_server.paused


def test_taken_port_is_retried_with_another(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the probed port is taken before redis-server binds it (here: by the shared
    server, which would even answer PING), start() notices and moves to a fresh port."""
    real_free_ports = redis_procs._free_ports
    picks = iter([[redis_server.port]])

    def first_pick_is_taken(count: int) -> list[int]:
        return next(picks, None) or real_free_ports(count)

    monkeypatch.setattr(redis_procs, "_free_ports", first_pick_is_taken)
    with running(RedisServer()) as server:
        assert server.port != redis_server.port
        with server.client() as client:
            assert client.info("server")["process_id"] == server.pid


def test_close_removes_process_and_directory() -> None:
    """close() leaves nothing behind: the process is gone and the temp dir deleted."""
    with running(RedisServer()) as server:
        workdir = server.dir
        proc_pid = server.pid
        assert workdir.is_dir()
    assert not server.running
    assert not workdir.exists()
    with pytest.raises(ProcessLookupError):
        # Signal 0 only checks existence; the child was reaped, so the pid is gone.
        os.kill(proc_pid, 0)


# --- missing installation ----------------------------------------------------------------


def _assert_install_hint(message: str, binary: str) -> None:
    assert binary in message
    assert "apt-get install redis-server" in message
    assert "brew install redis" in message


def test_missing_redis_server_on_path_explains_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With redis-server absent from PATH, start() raises with the install commands."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: nothing to find
    server = RedisServer()
    with pytest.raises(RedisNotInstalledError) as excinfo:
        server.start()
    _assert_install_hint(str(excinfo.value), "redis-server")
    assert not server.running


def test_missing_binary_path_explains_install(tmp_path: Path) -> None:
    """An explicit binary path that does not exist gives the same instructions."""
    with pytest.raises(RedisNotInstalledError) as excinfo:
        RedisServer(server_bin=tmp_path / "redis-server").start()
    _assert_install_hint(str(excinfo.value), "redis-server")


def test_missing_redis_cli_fails_before_starting_nodes(tmp_path: Path) -> None:
    """A cluster without redis-cli fails up front, with no node process left running."""
    cluster = RedisCluster(cli_bin=tmp_path / "redis-cli")
    with pytest.raises(RedisNotInstalledError) as excinfo:
        cluster.start()
    _assert_install_hint(str(excinfo.value), "redis-cli")
    assert cluster.nodes == []


def test_fixtures_fail_rather_than_skip_without_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper the fixtures use turns a missing install into a test failure, not a skip."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception) as excinfo, running(RedisServer()):
        pass
    _assert_install_hint(str(excinfo.value), "redis-server")


# --- cluster -----------------------------------------------------------------------------


def test_cluster_has_three_masters_with_one_replica_each(redis_cluster: RedisCluster) -> None:
    """3 masters, each followed by exactly one replica, together serving all 16384 slots
    with no slot served twice."""
    masters = redis_cluster.masters()
    replicas = redis_cluster.replicas()
    assert len(masters) == 3
    assert len(replicas) == 3
    assert sorted(str(r.master_id) for r in replicas) == sorted(m.node_id for m in masters)

    covered = sorted(r for m in masters for r in m.slots)
    assert sum(m.slot_count for m in masters) == CLUSTER_SLOTS
    expected_start = 0
    for start, end in covered:
        assert start == expected_start, f"gap or overlap at slot {expected_start}"
        expected_start = end + 1
    assert expected_start == CLUSTER_SLOTS

    for server in redis_cluster.nodes:
        info = redis_cluster.cluster_info(server)
        assert info["cluster_state"] == "ok"
        assert info["cluster_slots_assigned"] == str(CLUSTER_SLOTS)


def test_keys_land_on_the_master_that_owns_their_slot(
    redis_cluster: RedisCluster, cluster_client: RedisClusterClient
) -> None:
    """Write one key per master through the cluster client, then check on each master's own
    connection that it holds exactly that key. Keys are chosen with redis-py's own slot
    function (the one ``redis.cluster`` routes by), independent of the harness."""
    masters = redis_cluster.masters()
    key_for_port: dict[int, str] = {}
    for master in masters:
        key_for_port[master.port] = next(
            key
            for key in (f"harness:{i}" for i in itertools.count())
            if master.owns_slot(key_slot(key.encode()))
        )
    for port, key in key_for_port.items():
        assert cluster_client.set(key, str(port))

    for master in masters:
        key = key_for_port[master.port]
        with master.client() as node:
            assert node.exists(key) == 1
            assert node.get(key) == str(master.port).encode()
            # Only this master's key: the others went to the other masters.
            assert node.dbsize() == 1
        assert redis_cluster.master_for_key(key).port == master.port
