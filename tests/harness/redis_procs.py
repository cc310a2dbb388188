"""Real ``redis-server`` processes for tests: one standalone server or a small Redis Cluster.

Nothing here fakes Redis. Each :class:`RedisServer` is a child process listening on a free
loopback port with persistence switched off and its own temporary directory; a
:class:`RedisCluster` is six of them joined by ``redis-cli --cluster create``.

Every wait is a poll against a deadline (see :func:`wait_until`), never a fixed sleep, so
start-up is as fast as the machine allows and a stuck server produces a clear timeout error
instead of a flaky test.

Processes and directories are released by ``close()``/``stop()`` (the pytest fixtures call
these in teardown) and, as a backstop for anything a crashed test left behind, by an
``atexit`` hook.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.cluster import RedisCluster as RedisClusterClient
from redis.crc import key_slot
from redis.retry import Retry

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

HOST = "127.0.0.1"
CLUSTER_SLOTS = 16384

INSTALL_HINT = (
    "Install Redis to run these tests: `apt-get install redis-server` on Debian/Ubuntu "
    "(it provides both redis-server and redis-cli), or `brew install redis` on macOS."
)

# A probe port can be taken by another process between our probe and redis-server's bind.
# That is rare, so a handful of fresh ports is plenty.
_PORT_ATTEMPTS = 5
# Poll interval for every wait: short enough that start-up is not slowed down noticeably,
# long enough not to busy-loop on a two-core machine running six servers.
_POLL_INTERVAL = 0.02


class HarnessError(RuntimeError):
    """A Redis process could not be started, driven or checked as the harness expected."""


class RedisNotInstalledError(HarnessError):
    """``redis-server`` or ``redis-cli`` is not installed; the message says how to install it."""


class PortInUseError(HarnessError):
    """redis-server could not bind its port because another process holds it."""


def find_redis_binary(name: str, explicit: str | os.PathLike[str] | None = None) -> str:
    """Return the path of the Redis executable ``name`` (``redis-server`` or ``redis-cli``).

    ``explicit`` overrides the ``PATH`` lookup. Raises :class:`RedisNotInstalledError`, whose
    message gives the install command, when the binary cannot be found.
    """
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise RedisNotInstalledError(f"`{name}` was not found at {path}. {INSTALL_HINT}")
    found = shutil.which(name)
    if found is None:
        search_path = os.environ.get("PATH", "")
        raise RedisNotInstalledError(
            f"`{name}` was not found on PATH ({search_path!r}). {INSTALL_HINT}"
        )
    return found


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = _POLL_INTERVAL,
) -> None:
    """Call ``predicate`` until it returns true, or raise :class:`HarnessError` at the deadline.

    Redis and OS errors raised by the predicate count as "not yet" (a node that is still
    starting refuses connections); the last one is quoted in the timeout message so a
    failure explains itself. ``what`` describes the awaited condition for that message.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            if predicate():
                return
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise HarnessError(f"timed out after {timeout:.1f}s waiting for {what}{detail}")
        # Polling interval, not a race workaround: the condition is re-checked every round.
        time.sleep(interval)


def _free_ports(count: int) -> list[int]:
    """Ask the kernel for ``count`` distinct free loopback ports.

    All probe sockets are held open together so the kernel cannot hand out the same port
    twice within one call.
    """
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def _admin_client(port: int) -> redis.Redis:
    """A client for harness checks: short timeouts and no retries, so polls fail fast."""
    return redis.Redis(
        host=HOST,
        port=port,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _parse_info(text: str) -> dict[str, str]:
    """Parse ``CLUSTER INFO``-style ``key:value`` lines."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


# Backstop registry for atexit: every server with a live process or an undeleted directory.
_LIVE: dict[int, RedisServer] = {}
_LIVE_LOCK = threading.Lock()


@atexit.register
def _close_leftovers() -> None:
    """Kill any server a test run left behind (for example after an interrupted session)."""
    with _LIVE_LOCK:
        leftovers = list(_LIVE.values())
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.close()


class RedisServer:
    """One ``redis-server`` child process on a free port of 127.0.0.1.

    The process runs with ``--save "" --appendonly no`` so it never writes data to disk, and
    with its own temporary directory (``dir``) for the log file and, in cluster mode, the
    node config file. Construct, then :meth:`start` (or use ``with RedisServer() as s:``).

    ``extra_args`` are appended to the command line, so they override the defaults. Cluster
    mode (``cluster=True``, or ``--cluster-enabled yes`` among ``extra_args``) also picks a
    free cluster bus port and a per-port ``nodes-<port>.conf``.
    """

    def __init__(
        self,
        *,
        extra_args: Sequence[str] = (),
        cluster: bool = False,
        server_bin: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        """Configure the server; no process is started until :meth:`start`."""
        self.host = HOST
        self._extra_args = tuple(extra_args)
        self._cluster = cluster or self._extra_flag("--cluster-enabled") == "yes"
        self._server_bin = server_bin
        self._startup_timeout = startup_timeout
        self._port: int | None = None
        self._bus_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._paused = False

    # -- properties -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; fixed from the first successful start, reused by :meth:`restart`."""
        if self._port is None:
            raise HarnessError("RedisServer has not been started")
        return self._port

    @property
    def cluster_bus_port(self) -> int | None:
        """The cluster bus port in cluster mode, otherwise ``None``."""
        return self._bus_port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        """The process id of the running server."""
        if self._proc is None:
            raise HarnessError(f"redis-server on port {self._port} is not running")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the process exists (a paused process counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    @property
    def dir(self) -> Path:
        """The server's private temporary working directory."""
        if self._dir is None:
            raise HarnessError("RedisServer has not been started")
        return self._dir

    @property
    def logfile(self) -> Path:
        """redis-server's own log file, useful when a test needs to see what it did."""
        return self.dir / "redis.log"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the process and return once it answers PING.

        The first start picks a free port, retrying with a new one if another process grabs
        it first. Raises :class:`RedisNotInstalledError` before touching anything when
        redis-server is missing.
        """
        if self.running:
            raise HarnessError(f"redis-server on port {self.port} is already running")
        binary = find_redis_binary("redis-server", self._server_bin)
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="redis-harness-"))
            with _LIVE_LOCK:
                _LIVE[id(self)] = self
        if self._port is not None:
            # Restarting: the port is part of the server's identity (clients and cluster peers
            # know it), so a collision is an error rather than a reason to move.
            self._launch(binary)
            return self
        for _ in range(_PORT_ATTEMPTS):
            ports = _free_ports(2 if self._cluster else 1)
            self._port = ports[0]
            self._bus_port = ports[1] if self._cluster else None
            try:
                self._launch(binary)
            except PortInUseError:
                continue
            return self
        self._port = self._bus_port = None
        raise HarnessError(f"no free port found for redis-server after {_PORT_ATTEMPTS} tries")

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down with SIGTERM and wait for it to exit (SIGKILL after ``timeout``).

        The directory is kept so :meth:`restart` can reuse it; no-op if not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            # A stopped (paused) process keeps SIGTERM pending until it is continued.
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._proc = None
        self._paused = False

    def kill(self) -> None:
        """Kill the server with SIGKILL (a crash: no shutdown work) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()  # SIGKILL also ends a stopped process, no SIGCONT needed
        proc.wait()
        self._proc = None
        self._paused = False

    def pause(self) -> None:
        """Freeze the server with SIGSTOP; returns once the kernel reports it stopped.

        Connections stay open and new ones are still accepted by the kernel, but nothing is
        answered: clients see timeouts, the way they would with a hung server.
        """
        proc = self._require_proc()
        proc.send_signal(signal.SIGSTOP)
        # Wait for the stop to take effect so a command sent right after pause() cannot be
        # served; WUNTRACED makes waitpid report the stopped state.
        pid, status = os.waitpid(proc.pid, os.WUNTRACED)
        if pid == proc.pid and not os.WIFSTOPPED(status):
            # It died instead of stopping; record that so Popen does not wait for it again.
            proc.returncode = os.waitstatus_to_exitcode(status)
            self._proc = None
            raise HarnessError(f"redis-server on port {self._port} exited instead of pausing")
        self._paused = True

    def resume(self) -> None:
        """Continue a paused server with SIGCONT."""
        self._require_proc().send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> Self:
        """Stop the server (SIGTERM) if running and start it again on the same port.

        Persistence is off, so the dataset comes back empty. The directory is kept: a
        cluster node therefore rejoins with its old identity from ``nodes-<port>.conf``.
        """
        if self._port is None:
            raise HarnessError("restart() needs a server that was started before")
        self.stop()
        return self.start()

    def close(self) -> None:
        """Kill the process (if any) and delete the directory; the server cannot be reused."""
        self.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        with _LIVE_LOCK:
            _LIVE.pop(id(self), None)

    def __enter__(self) -> Self:
        """Start the server unless it is already running."""
        return self if self.running else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the server: process killed, directory removed."""
        self.close()

    def __repr__(self) -> str:
        """Show port, pid and state for assertion messages."""
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        pid = self._proc.pid if self._proc is not None else None
        return f"RedisServer(port={self._port}, pid={pid}, {state})"

    # -- clients ----------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new ``redis.Redis`` for this server; ``kwargs`` go to the constructor.

        The caller owns it and must close it (``with server.client() as c:`` does), since
        unclosed sockets fail tests under ``filterwarnings = error``.
        """
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    # -- internals --------------------------------------------------------------------------

    def _extra_flag(self, name: str) -> str | None:
        """The value following ``name`` in ``extra_args``, if present."""
        args = self._extra_args
        for index, arg in enumerate(args[:-1]):
            if arg == name:
                return args[index + 1]
        return None

    def _require_proc(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise HarnessError(f"redis-server on port {self._port} is not running")
        return proc

    def _argv(self, binary: str) -> list[str]:
        port = self.port
        argv = [
            binary,
            "--port", str(port),
            "--bind", self.host,
            "--daemonize", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.logfile),
            # Replicas sync from empty masters; the default 5 s diskless delay would dominate
            # cluster start-up.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if self._cluster:
            argv += [
                "--cluster-enabled", "yes",
                "--cluster-port", str(self._bus_port),
                "--cluster-config-file", f"nodes-{port}.conf",
            ]  # fmt: skip
        return argv + list(self._extra_args)

    def _launch(self, binary: str) -> None:
        """Spawn the process and wait until it is ours that answers on the port."""
        out_path = self.dir / "stdout.log"
        # Only output from this launch decides what went wrong (restarts append to the logs).
        offsets = {p: p.stat().st_size if p.exists() else 0 for p in (out_path, self.logfile)}
        with out_path.open("ab") as out:
            # Early errors (bad arguments) go to stdout/stderr before the log file is opened.
            self._proc = subprocess.Popen(
                self._argv(binary), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        try:
            self._wait_ready(self._proc)
        except BaseException as exc:
            log = "".join(
                p.read_bytes()[start:].decode(errors="replace")
                for p, start in offsets.items()
                if p.exists()
            )
            self.kill()
            if "Address already in use" in log:
                raise PortInUseError(f"port {self._port} is taken:\n{log}") from exc
            if isinstance(exc, HarnessError):
                raise HarnessError(f"{exc}\nredis-server output:\n{log}") from exc
            raise

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self._startup_timeout
        with _admin_client(self.port) as probe:
            while True:
                try:
                    # Doubles as the poll interval and as early-exit detection.
                    code = proc.wait(timeout=_POLL_INTERVAL)
                except subprocess.TimeoutExpired:
                    pass
                else:
                    raise HarnessError(f"redis-server exited with code {code} during start-up")
                try:
                    # Another Redis already on this port would answer PING too; only our own
                    # pid proves that this process is the one listening.
                    if probe.ping() and probe.info("server").get("process_id") == proc.pid:
                        return
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() >= deadline:
                    raise HarnessError(
                        f"redis-server on port {self._port} did not answer PING within "
                        f"{self._startup_timeout:.1f}s"
                    )


@dataclass(frozen=True)
class ClusterNodeInfo:
    """One node as seen in ``CLUSTER NODES`` at the time of the call.

    ``server`` is the harness process behind it, so tests can kill, pause or restart it.
    """

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...]
    link_state: str
    server: RedisServer

    @property
    def is_master(self) -> bool:
        """True for a master (primary)."""
        return "master" in self.flags

    @property
    def is_failed(self) -> bool:
        """True if the cluster flags the node as failed (``fail``) or suspected (``fail?``)."""
        return bool(self.flags & {"fail", "fail?"})

    @property
    def slot_count(self) -> int:
        """How many hash slots the node serves."""
        return sum(end - start + 1 for start, end in self.slots)

    def owns_slot(self, slot: int) -> bool:
        """True if ``slot`` falls in one of the node's ranges."""
        return any(start <= slot <= end for start, end in self.slots)

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain ``redis.Redis`` connected to this node only (caller closes it)."""
        return self.server.client(**kwargs)


def _parse_slots(fields: Sequence[str]) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    for field in fields:
        if field.startswith("["):
            continue  # "[slot->-id]" / "[slot-<-id]": a migration in progress, not ownership
        start, _, end = field.partition("-")
        ranges.append((int(start), int(end or start)))
    return tuple(sorted(ranges))


class _Resource(Protocol):
    def start(self) -> Any: ...

    def close(self) -> None: ...


R = TypeVar("R", bound=_Resource)


class RedisCluster:
    """A Redis Cluster of real processes: by default 3 masters with 1 replica each.

    Nodes are started in cluster mode, joined with ``redis-cli --cluster create`` and
    :meth:`start` returns only once every node reports ``cluster_state:ok`` with all 16384
    slots assigned, agrees on the topology, and every replica's link to its master is up.

    Topology queries (:meth:`masters`, :meth:`replicas`, :meth:`nodes_info`) read
    ``CLUSTER NODES`` live, so they reflect failovers and slot migrations done by tests.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
        server_bin: str | os.PathLike[str] | None = None,
        cli_bin: str | os.PathLike[str] | None = None,
        startup_timeout: float = 30.0,
    ) -> None:
        """Configure the cluster; nothing runs until :meth:`start`.

        ``node_timeout_ms`` is ``cluster-node-timeout``: how long until a silent node is
        considered failed, which bounds how fast failover tests can be.
        """
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.masters_wanted = masters
        self.replicas_per_master = replicas_per_master
        self._node_args = ("--cluster-node-timeout", str(node_timeout_ms), *extra_args)
        self._server_bin = server_bin
        self._cli_bin = cli_bin
        self._startup_timeout = startup_timeout
        self._nodes: list[RedisServer] = []

    @property
    def nodes(self) -> list[RedisServer]:
        """All node processes, in start order (running or not)."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """``redis.cluster.ClusterNode`` entries for every running node."""
        # ClusterNode.__init__ carries no annotations in redis-py.
        return [ClusterNode(s.host, s.port) for s in self._running()]  # type: ignore[no-untyped-call]

    @property
    def url(self) -> str:
        """``redis://`` URL of one running node; cluster clients discover the rest."""
        node = self._running()[0]
        return f"redis://{node.host}:{node.port}"

    def start(self) -> Self:
        """Start and join the nodes; on any failure everything started so far is torn down."""
        if self._nodes:
            raise HarnessError("RedisCluster already started")
        # Check both binaries first so a missing redis-cli fails before any process starts.
        cli = find_redis_binary("redis-cli", self._cli_bin)
        find_redis_binary("redis-server", self._server_bin)
        total = self.masters_wanted * (1 + self.replicas_per_master)
        try:
            for _ in range(total):
                node = RedisServer(
                    cluster=True, extra_args=self._node_args, server_bin=self._server_bin
                )
                self._nodes.append(node)
                # Sequential on purpose: a listening node can never be handed out as another
                # node's "free" port, and each start takes only milliseconds.
                node.start()
            self._create(cli)
            self.wait_until_stable()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node and delete their directories."""
        for node in self._nodes:
            node.close()
        self._nodes.clear()

    close = stop

    def __enter__(self) -> Self:
        """Start the cluster unless already started."""
        return self if self._nodes else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the cluster."""
        self.stop()

    # -- clients ----------------------------------------------------------------------------

    def client(self, **kwargs: Any) -> RedisClusterClient:
        """A new ``redis.cluster.RedisCluster`` client (caller closes it)."""
        return RedisClusterClient(startup_nodes=self.startup_nodes, **kwargs)

    # -- topology ---------------------------------------------------------------------------

    def node(self, port: int) -> RedisServer:
        """The node process listening on ``port``."""
        for server in self._nodes:
            if server.port == port:
                return server
        raise KeyError(f"no cluster node on port {port}")

    def kill_node(self, port: int) -> RedisServer:
        """SIGKILL the node on ``port`` (its directory stays, so it can be restarted)."""
        server = self.node(port)
        server.kill()
        return server

    def nodes_info(self, via: RedisServer | None = None) -> list[ClusterNodeInfo]:
        """Every node in ``CLUSTER NODES`` as seen by ``via`` (default: a responsive node)."""
        if via is not None:
            return self._nodes_view(via)
        last_error: BaseException | None = None
        for server in self._running():
            try:
                return self._nodes_view(server)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                last_error = exc
        raise HarnessError(f"no cluster node answered CLUSTER NODES: {last_error!r}")

    def masters(self) -> list[ClusterNodeInfo]:
        """Masters not flagged as failed, ordered by their first slot."""
        found = [n for n in self.nodes_info() if n.is_master and not n.is_failed]
        return sorted(found, key=lambda n: n.slots[0] if n.slots else (CLUSTER_SLOTS, 0))

    def replicas(self) -> list[ClusterNodeInfo]:
        """Replicas not flagged as failed, ordered by port."""
        found = [n for n in self.nodes_info() if "slave" in n.flags and not n.is_failed]
        return sorted(found, key=lambda n: n.port)

    def master_for_slot(self, slot: int) -> ClusterNodeInfo:
        """The master serving hash slot ``slot``."""
        for master in self.masters():
            if master.owns_slot(slot):
                return master
        raise HarnessError(f"no master serves slot {slot}")

    def master_for_key(self, key: str | bytes) -> ClusterNodeInfo:
        """The master serving ``key`` (hash tags respected)."""
        return self.master_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def cluster_info(self, server: RedisServer) -> dict[str, str]:
        """``CLUSTER INFO`` of one node as a dict of strings."""
        with _admin_client(server.port) as admin:
            return _parse_info(str(admin.execute_command("CLUSTER", "INFO")))

    def wait_until_stable(self, timeout: float | None = None) -> None:
        """Wait until the full cluster is healthy on every node.

        Healthy means: ``cluster_state:ok``, all slots assigned and ok, every node known and
        not failed, the expected masters/replicas in the same topology from every node's view,
        and each replica's replication link up. Use after restarting nodes in a test.
        """
        wait_until(
            self._is_stable,
            timeout=self._startup_timeout if timeout is None else timeout,
            what=f"a stable cluster on ports {[s.port for s in self._nodes]}",
        )

    # -- internals --------------------------------------------------------------------------

    def _running(self) -> list[RedisServer]:
        running = [s for s in self._nodes if s.running and not s.paused]
        if not running:
            raise HarnessError("no cluster node is running")
        return running

    def _nodes_view(self, via: RedisServer) -> list[ClusterNodeInfo]:
        with _admin_client(via.port) as admin:
            text = str(admin.execute_command("CLUSTER", "NODES"))
        by_port = {s.port: s for s in self._nodes}
        infos: list[ClusterNodeInfo] = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            # "<ip>:<port>@<cport>[,<hostname>]"
            address = fields[1].split("@", 1)[0]
            host, _, port_text = address.rpartition(":")
            port = int(port_text)
            if port not in by_port:
                continue  # a node we did not start (never expected, but not ours to drive)
            infos.append(
                ClusterNodeInfo(
                    node_id=fields[0],
                    host=host,
                    port=port,
                    flags=frozenset(fields[2].split(",")) - {"myself"},
                    master_id=None if fields[3] == "-" else fields[3],
                    slots=_parse_slots(fields[8:]),
                    link_state=fields[7],
                    server=by_port[port],
                )
            )
        return infos

    def _create(self, cli: str) -> None:
        addresses = [f"{s.host}:{s.port}" for s in self._nodes]
        argv = [
            cli,
            "--cluster", "create", *addresses,
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self._startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"redis-cli --cluster create timed out: {argv}") from exc
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            # redis-cli colours its output even when it is not a terminal.
            output = re.sub(r"\x1b\[[0-9;]*m", "", output)
            raise HarnessError(
                f"redis-cli --cluster create failed ({result.returncode}):\n{output}"
            )

    def _is_stable(self) -> bool:
        total = len(self._nodes)
        views: list[frozenset[tuple[int, bool, str | None]]] = []
        for server in self._nodes:
            if not server.running or server.paused:
                return False
            info = self.cluster_info(server)
            if not (
                info.get("cluster_state") == "ok"
                and info.get("cluster_slots_assigned") == str(CLUSTER_SLOTS)
                and info.get("cluster_slots_ok") == str(CLUSTER_SLOTS)
                and info.get("cluster_known_nodes") == str(total)
            ):
                return False
            nodes = self._nodes_view(server)
            if len(nodes) != total or any(
                n.is_failed or n.flags & {"handshake", "noaddr"} for n in nodes
            ):
                return False
            masters = [n for n in nodes if n.is_master]
            if len(masters) != self.masters_wanted or any(m.slot_count == 0 for m in masters):
                return False
            master_ids = {m.node_id for m in masters}
            replicas = [n for n in nodes if not n.is_master]
            per_master = [sum(r.master_id == mid for r in replicas) for mid in master_ids]
            if any(count != self.replicas_per_master for count in per_master):
                return False
            views.append(frozenset((n.port, n.is_master, n.master_id) for n in nodes))
            if not self._link_up(server, is_master=server.port in {m.port for m in masters}):
                return False
        # Every node must hold the same picture, or clients may be redirected mid-test.
        return len(set(views)) == 1

    @staticmethod
    def _link_up(server: RedisServer, *, is_master: bool) -> bool:
        if is_master:
            return True
        with _admin_client(server.port) as admin:
            replication = admin.info("replication")
        return bool(replication.get("master_link_status") == "up")


@contextlib.contextmanager
def running(resource: R) -> Iterator[R]:
    """Start ``resource`` (a RedisServer or RedisCluster), yield it, always close it.

    A missing Redis installation turns into ``pytest.fail`` with the install instructions,
    so tests that need Redis fail loudly instead of being skipped.
    """
    missing: str | None = None
    try:
        resource.start()
    except RedisNotInstalledError as exc:
        missing = str(exc)
    if missing is not None:
        # Outside the except block, so the report shows just the instructions rather than a
        # chained "during handling of the above exception" traceback.
        pytest.fail(missing, pytrace=False)
    try:
        yield resource
    finally:
        resource.close()
