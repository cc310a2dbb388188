"""The sync limiter's wires: its script calls sent on connections it holds, blocking.

A decision is one script call, so on a standalone (or Sentinel-managed) server the
limiter's cost above the round trip is whatever the client does around it. redis-py's
generic command path takes a connection from the pool and gives it back (a lock, a
``poll`` to check the socket is clean, metrics bookkeeping), encodes every argument in
Python and runs the reply through its callbacks: about as much time as the round trip
itself on a small machine. The script call needs none of that, so the limiter sends it
itself:

- the command is packed by hiredis in one C call (``_protocol.pack``);
- connections are the limiter's own, kept between decisions: a decision pops an idle
  one, sends, reads, and pushes it back; at most ``max_connections`` exist, and a caller
  that finds none idle waits for one within the timeout (:class:`SyncWire`);
- the reply is read from the connection's own hiredis reader (``_hiredis.py``);
- a plain TCP or unix socket is written and read directly, blocking, with its timeout set
  in the kernel (``SO_SNDTIMEO``, ``SO_RCVTIMEO``) rather than by Python: a socket with a
  Python timeout polls before every send and every receive, so a decision took four
  system calls where two do (:func:`_adopt`);
- which command carries the call (FCALL, EVALSHA, EVAL, FUNCTION LOAD first), and what an
  error reply means, is the wire protocol's (``_protocol.py``): these classes only write
  and read.

The connections stay redis-py's: connecting, AUTH, SELECT, TLS, unix sockets, Sentinel
master discovery and the socket timeouts are theirs. A connection that fails mid-call is
disconnected by redis-py and reconnects on its next use, as in the pool. On Redis Cluster
the limiter runs one such wire per master (:class:`ClusterWire`), on the slot map of
redis-py's cluster client.

Both are the sync limiter's transports: built without I/O, they make the client on first
use, and run a decision's calls (:meth:`SyncWire.run`) returning one outcome per call, a
reply or the failure, as the decision flow (``_flow.py``) takes them.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.cluster

from . import _clients, _hiredis
from ._batch import Combiner
from ._calls import ScriptCall, pack, pack_calls, pack_command
from ._clients import SyncClient, Target
from ._errors import CLOSED, REDIS_FAILURES, ApplimitError, PoolExhausted
from ._protocol import (
    MAX_REDIRECTIONS,
    TRYAGAIN_PAUSE,
    OneServer,
    Redirect,
    Replies,
    ScriptProtocol,
    SlotMap,
    redirection,
    too_many_redirections,
    unpair,
)

logger = logging.getLogger("applimit")


def _exchange(connection: Any, packed: bytes, count: int) -> Replies:
    """Write ``packed`` and read its ``count`` replies, error replies as values: all are
    read, so that the connection stays in step whatever they say."""
    sock = connection._sock
    if sock is not None and sock is getattr(connection, _DIRECT, None):
        return _hiredis.exchange(connection, sock, packed, count)
    # A list: redis-py writes each item, and a bare bytes would be iterated.
    connection.send_packed_command([packed], check_health=False)
    # Connected now (redis-py connects a connection on its first write after a failure).
    replies = _redis_py_replies(connection, count)
    if getattr(connection, _SEEN, None) is not connection._sock:
        _adopt(connection)
    return replies


def _redis_py_replies(connection: Any, count: int) -> Replies:
    """``count`` replies read through redis-py's parser (hiredis' reader where it can)."""
    if _hiredis.direct(connection):
        if count == 1:
            return [_hiredis.read(connection)]
        return [_hiredis.read(connection) for _ in range(count)]
    replies: Replies = []
    for _ in range(count):
        try:
            replies.append(connection.read_response())
        except redis.exceptions.ResponseError as error:
            # An error reply is the call's own; the connection is clean.
            replies.append(error)
        except (OSError, ValueError) as error:
            # redis-py's Python parser (no hiredis) before 8.2 lets a socket closed under
            # it (the limiter closed by another thread) surface as OSError or ValueError
            # ("I/O operation on closed file"): a lost connection, like any other.
            raise redis.exceptions.ConnectionError(f"the connection was closed: {error}") from error
    return replies


# The attribute of a connection that holds the socket :func:`_adopt` made blocking: the
# connection's own socket while it is that one (redis-py makes a new one to reconnect).
_DIRECT = "_applimit_direct"
# The socket :func:`_adopt` last looked at, adopted or not (a TLS one is looked at once).
_SEEN = "_applimit_seen"
# Where SO_SNDTIMEO and SO_RCVTIMEO take a struct timeval of two C longs.
_KERNEL_TIMEOUTS = sys.platform.startswith("linux")
_TIMEVAL = struct.Struct("@ll")


def _adopt(connection: Any) -> None:
    """Make a connected plain socket blocking, its timeouts the kernel's, so that the
    wire can write and read it directly (:func:`applimit._hiredis.exchange`).

    A Python socket with a timeout is non-blocking underneath: every send and every receive
    first waits in ``poll`` for the socket to be ready, so a decision took four system calls
    where a blocking socket takes two, its send and its receive; the kernel's own timeouts
    bound them the same way, per call. Only redis-py's plain sockets on Linux with its
    hiredis parser are adopted: a TLS socket buffers inside OpenSSL, and elsewhere the
    timeval's layout is not known here; those keep redis-py's reads and writes, as does a
    connection class that overrides ``send_packed_command`` (to count or trace what it
    sends). The connection's other users (redis-py's ``read_response`` in a push handler,
    ``disconnect``) work the same on a blocking socket, a timeout there read as a failure
    of the connection.
    """
    sock = connection._sock
    setattr(connection, _SEEN, sock)
    setattr(connection, _DIRECT, None)
    if (
        not _KERNEL_TIMEOUTS
        or type(sock) is not socket.socket
        or not _hiredis.direct(connection)
        or not _hiredis.plain_send(connection)
    ):
        return
    timeout = connection.socket_timeout
    if timeout is not None:
        if timeout <= 0:
            return  # a non-blocking socket is redis-py's to read
        seconds = int(timeout)
        # A zero timeval is no timeout at all: a timeout under a microsecond is one.
        micros = max(round((timeout - seconds) * 1_000_000), 0 if seconds else 1)
        seconds, micros = seconds + micros // 1_000_000, micros % 1_000_000
        value = _TIMEVAL.pack(seconds, micros)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.settimeout(None)
    setattr(connection, _DIRECT, sock)


def _forked() -> None:
    global _FORK_LOCK, _GENERATION
    _FORK_LOCK = threading.Lock()
    _GENERATION += 1


# Which process this is: 0, plus one for each fork into a child. Cheaper to compare on
# every call than os.getpid(), a system call.
_GENERATION = 0
# Serialises a forked child's first calls on a wire; made anew in every child, so that a
# lock some thread of the parent held at the fork cannot stay locked there.
_FORK_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_forked)


class SyncWire(OneServer):
    """Runs script calls on connections the limiter keeps between decisions.

    Thread-safe. A decision pops an idle connection (``list.pop`` is atomic, no lock),
    uses it alone, and pushes it back. Only when none is idle does it take the lock: it
    opens a new connection (through the client's pool, which connects it) while fewer
    than ``max_connections`` exist, or else waits up to ``timeout`` for one to come back,
    as a blocking pool would, and then raises :class:`PoolExhausted` (not a Redis
    failure). Waiters are served in turn: a connection pushed back while some wait goes
    to the one that has waited longest, not to whichever thread next finds the idle list
    (without that, a few threads could keep the connections among themselves while
    another waits out the timeout). After a fork the child forgets the parent's
    connections without closing them (the sockets are the parent's), as redis-py's
    pools do.

    As the transport of a standalone or Sentinel-managed server it makes the client from
    its target on first use and closes it with the limiter; as one master's wire in a
    :class:`ClusterWire` it is given the node's client, which the cluster client owns.
    """

    # The flow tells the breaker of each call's outcome.

    def __init__(
        self,
        target: Target[SyncClient] | redis.Redis,
        *,
        max_connections: int,
        timeout: float,
        protocol: ScriptProtocol | None = None,
        batch: bool = False,
    ) -> None:
        """Send to ``target`` (made on first use), or to a client already made.

        ``batch``: the single calls of concurrent threads are sent together, one write at
        a time (see ``_batch.py``); other commands use the connections as before.
        """
        self._target = target if isinstance(target, Target) else None
        self._client: redis.Redis | None = target if isinstance(target, redis.Redis) else None
        self._pool: Any = self._client.connection_pool if self._client is not None else None
        self.protocol = protocol if protocol is not None else ScriptProtocol()
        self._max = max_connections
        self._timeout = timeout
        self._batch = batch
        self.closed = False
        self._start()

    def _start(self) -> None:
        self._idle: list[Any] = []
        self._all: list[Any] = []
        # Callers waiting for a connection, longest first; each is handed one in turn.
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self._generation = _GENERATION
        self._combiner = Combiner(self.run_together, timeout=self._timeout) if self._batch else None

    # -- the transport --------------------------------------------------------------------

    def run(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of each call, in order (a reply, or the failure), stopping at the
        first failure; the socket timeout bounds each."""
        if self.closed:
            raise ApplimitError(CLOSED)
        if len(calls) == 1:
            # One server: every decision is one call.
            if self._combiner is not None:
                if self._generation != _GENERATION:
                    # A forked child: a fresh combiner, not the parent's (its lock may
                    # have been held at the fork).
                    self._after_fork()
                return [self._combiner.run(calls[0])]
            try:
                return [self.call(calls[0])]
            except REDIS_FAILURES as error:
                return [error]
        outcomes: Replies = []
        for call in calls:
            try:
                outcomes.append(self.call(call))
            except REDIS_FAILURES as error:
                outcomes.append(error)
                break
        return outcomes

    def run_together(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of every call, sent in one write and read in order (the combined
        calls of several threads): a connection that fails, fails them all."""
        protocol = self.protocol
        how = protocol.how
        try:
            replies = self.send(*pack_calls(calls, how))
            if not protocol.settled(replies):
                self._recover(calls, how, replies, asking=False)
        except REDIS_FAILURES as error:
            return [error] * len(calls)
        return replies

    def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset), on the same connections."""
        if self.closed:
            raise ApplimitError(CLOSED)
        self.command("DEL", *keys)

    def client(self) -> redis.Redis:
        """The client the connections come from (made now if not yet)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    if self.closed or self._target is None:
                        raise redis.exceptions.ConnectionError("the limiter was closed")
                    client = self._target.factory()
                    assert isinstance(client, redis.Redis)
                    self._pool = client.connection_pool
                    self._client = client
        return self._client

    # -- calls ----------------------------------------------------------------------------

    def call(self, call: ScriptCall, *, asking: bool = False) -> object:
        """The call's reply; its error reply raised. The protocol picks the command
        (FCALL, or EVALSHA where Functions are refused) and the recovery after an error
        reply (the library loaded, EVAL after NOSCRIPT).

        ``asking`` sends ASKING first, on the same connection: a cluster node importing
        the call's slot answers it only then (an ASK redirection).
        """
        protocol = self.protocol
        how = protocol.how
        if asking:
            replies = unpair(self.send(*pack_calls((call,), how, asking=True)))
        else:
            replies = self.send(pack(call, how))
        reply = replies[0]
        if isinstance(reply, BaseException):
            if not protocol.settled(replies):
                self._recover((call,), how, replies, asking=asking)
                reply = replies[0]
            if isinstance(reply, BaseException):
                raise reply
        return reply

    def _recover(
        self, calls: Sequence[ScriptCall], how: bytes, replies: Replies, *, asking: bool
    ) -> None:
        """Run the protocol's recovery after an error reply (replies updated in place)."""
        steps = self.protocol.recover(how, replies)
        try:
            step = next(steps)
            while True:
                raw = self.send(*step.write(calls, asking=asking))
                step = steps.send(step.replies(raw, asking=asking))
        except StopIteration:
            return

    def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset), on the same connections; an error reply is
        raised."""
        reply = self.send(pack_command(args))[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def send(self, packed: bytes, count: int = 1) -> Replies:
        """Write packed commands and read their ``count`` replies, error replies as
        values, on a connection of the limiter's own."""
        if self._generation != _GENERATION:
            self._after_fork()
        try:
            connection, reused = self._idle.pop(), True
        except IndexError:
            connection, reused = self._acquire()
        try:
            try:
                return _exchange(connection, packed, count)
            except redis.exceptions.ConnectionError:
                if not reused or self.closed:
                    # A new connection's failure is Redis'; after close() the
                    # connection was shut under this call, and must not reconnect.
                    raise
                # A connection that sat idle may have been closed by the other end (a
                # restart, the server's `timeout`, a proxy's idle cutoff): the first use
                # finds out. redis-py has disconnected it, so this connects afresh, as
                # the pool's check before handing out a connection would have. The
                # server had closed the socket, so the first send did not run; in the
                # rare case that it ran and only the reply was lost, the request counts
                # twice, which errs on the strict side.
                return _exchange(connection, packed, count)
        finally:
            # A connection that failed was disconnected by redis-py; it reconnects on its
            # next use. One that read an error reply is clean and reusable.
            self._idle.append(connection)
            if self._waiters:
                self._hand_over()

    # -- connections ----------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Give idle connections to the callers waiting for one, longest waiting first."""
        with self._lock:
            while self._waiters:
                try:
                    connection = self._idle.pop()
                except IndexError:
                    return
                waiter = self._waiters.popleft()
                waiter.connection = connection
                waiter.ready.release()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections (they are its to use)."""
        with _FORK_LOCK:
            if self._generation != _GENERATION:
                self._start()

    def _acquire(self) -> tuple[Any, bool]:
        """An idle connection, a new one, or one handed over within the timeout; and
        whether it was used before (False for a new one)."""
        if self.closed:
            # A call that was under way when the limiter was closed.
            raise redis.exceptions.ConnectionError("the limiter was closed")
        pool = self.client().connection_pool
        deadline = time.monotonic() + self._timeout
        while True:
            waiter = _Waiter()
            with self._lock:
                # Queued before looking: a connection pushed back after this line is
                # handed over by send(), which sees the queue; one pushed back before it
                # is found here.
                self._waiters.append(waiter)
                try:
                    # send() pops without the lock: the list may empty under us.
                    connection = self._idle.pop()
                except IndexError:
                    connection = None
                if connection is not None or len(self._all) < self._max:
                    self._waiters.remove(waiter)
                    if connection is not None:
                        return connection, True
                    self._all.append(None)  # a place, held while connecting
                    break
            left = deadline - time.monotonic()
            if left <= 0 or not waiter.ready.acquire(timeout=left):
                with self._lock:
                    if waiter.connection is None and waiter in self._waiters:
                        self._waiters.remove(waiter)
            if waiter.connection is not None:
                # Handed over (perhaps just as the wait ran out).
                return waiter.connection, True
            if time.monotonic() >= deadline:
                raise PoolExhausted(
                    f"no connection free: all {self._max} of the limiter's connections "
                    f"stayed busy for {self._timeout} s"
                )
            # Woken without a connection: a place to connect came free; look again.
        try:
            # The pool builds and connects it (settings, AUTH, TLS, Sentinel) and keeps
            # track of it, so closing the client closes it too.
            fresh: Any = pool.get_connection()
        except BaseException:
            with self._lock:
                if None in self._all:  # not if close() came in between
                    self._all.remove(None)
                # The place is free again: every waiter looks again (one takes it).
                waiters, self._waiters = self._waiters, deque()
            for waiter in waiters:
                waiter.ready.release()
            raise
        with self._lock:
            placed = None in self._all
            if placed:
                self._all[self._all.index(None)] = fresh
        if not placed:
            # close() ran while this connected: the connection is nobody's.
            fresh.disconnect()
            pool.release(fresh)
            raise redis.exceptions.ConnectionError("the limiter was closed")
        return fresh, False

    def close(self) -> None:
        """Give every connection back to the pool, disconnected; and close the client if
        the wire made it."""
        with self._lock:
            self.closed = True
            connections, self._all, self._idle = self._all, [], []
            client = self._client if self._target is not None else None
        if self._combiner is not None:
            # The threads waiting their turn fail now; a write in flight fails as its
            # connection is closed below.
            self._combiner.close()
        for connection in connections:
            if connection is not None:
                connection.disconnect()
                self._pool.release(connection)
        if client is not None:
            assert self._target is not None
            _clients.close_sync(client, own_sentinels=self._target.owns_sentinels)


class _Waiter:
    """A caller waiting for a connection: ``ready`` is released once one is handed over."""

    __slots__ = ("connection", "ready")

    def __init__(self) -> None:
        self.connection: Any = None
        self.ready = threading.Lock()
        self.ready.acquire()


class ClusterWire(SlotMap):
    """Runs script calls on Redis Cluster: each on a :class:`SyncWire` of the master that
    serves its slot.

    redis-py's cluster client keeps the topology (the slot map, one client per node with
    the settings copied, the startup nodes); it is made (which connects) on the first
    call, and its command path is not used, because it sleeps 0.25 s on CLUSTERDOWN and
    re-reads the slot map inline after a failed call, and a decision must keep to its
    deadline. What a redirection means is the protocol's (``_protocol.redirection``);
    here:

    - MOVED updates the slot map and the call goes to the new owner; ASK sends ASKING and
      the call to the importing node; both count against the decision's deadline;
    - TRYAGAIN (the call's keys split between two nodes mid-migration) is retried until
      the deadline, with short pauses, then raised;
    - CLUSTERDOWN, a failed connection and a timeout are raised at once, and the slot map
      is read again in the background, so that the calls after a failover find the new
      master while the breaker answers for the old one.

    One protocol serves every master: they run the same Redis.
    """

    def __init__(self, target: Target[SyncClient], *, max_connections: int, timeout: float) -> None:
        """Send to the cluster of ``target``, whose client is made on the first call."""
        self._factory = target.factory
        self._client: redis.cluster.RedisCluster | None = None
        self._nodes: Any = None
        self.protocol = ScriptProtocol()
        self._max = max_connections
        self._timeout = timeout
        # Node name -> (the node's client the wire was made for, the wire).
        self._wires: dict[str, tuple[redis.Redis, SyncWire]] = {}
        self._lock = threading.Lock()
        self._connecting = threading.Lock()
        self._refreshing = False
        self.closed = False

    # -- the transport --------------------------------------------------------------------

    def run(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of each call, in order, stopping at the first failure; together
        they keep to the timeout."""
        if self.closed:
            raise ApplimitError(CLOSED)
        deadline = time.monotonic() + self._timeout
        outcomes: Replies = []
        try:
            self.connect()
        except REDIS_FAILURES as error:
            return [error]
        for call in calls:
            try:
                # A request may need one call per slot: together they keep to the
                # decision's deadline.
                if outcomes and time.monotonic() > deadline:
                    raise TimeoutError("the decision's deadline passed between cluster calls")
                outcomes.append(self.call(call, deadline))
            except REDIS_FAILURES as error:
                outcomes.append(error)
                break
        return outcomes

    def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset; one hash tag, so one slot) through the cluster client."""
        if self.closed:
            raise ApplimitError(CLOSED)
        self.connect().delete(*keys)

    def connect(self) -> redis.cluster.RedisCluster:
        """The cluster client, made (and connected) on first use; one caller makes it."""
        client = self._client
        if client is not None:
            return client
        with self._connecting:
            if self.closed:
                raise ApplimitError(CLOSED)
            if self._client is None:
                made = self._factory()
                assert isinstance(made, redis.cluster.RedisCluster)
                self._nodes = made.nodes_manager
                self._client = made
            return self._client

    # -- calls ----------------------------------------------------------------------------

    def call(self, call: ScriptCall, deadline: float) -> object:
        """The call's reply, from the master of its slot, following redirections until
        ``deadline`` (a ``time.monotonic()`` value)."""
        assert call.slot is not None
        node = self._master(call.slot)
        asking = False
        for _ in range(MAX_REDIRECTIONS):
            try:
                return self._wire(node).call(call, asking=asking)
            except REDIS_FAILURES as error:
                step = redirection(error)
                if step is Redirect.MOVED:
                    assert isinstance(error, redis.exceptions.MovedError)
                    self._nodes.move_slot(error)
                    # Where the answer says, not where the map says: a refresh running
                    # meanwhile may have read a node that has not heard of the move yet,
                    # and sent every retry back to the old owner.
                    moved = self._nodes.get_node(host=error.host, port=error.port)
                    node = moved if moved is not None else self._master(call.slot)
                    asking = False
                elif step is Redirect.ASK:
                    assert isinstance(error, redis.exceptions.AskError)
                    found = self._nodes.get_node(host=error.host, port=error.port)
                    if found is None:
                        self.refresh()
                        raise
                    node, asking = found, True
                elif step is Redirect.TRYAGAIN:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise
                    # The slot's keys are moving one by one; wait a little for this call's.
                    time.sleep(min(TRYAGAIN_PAUSE, left))
                    node, asking = self._master(call.slot), False
                else:
                    if step is Redirect.REFRESH:
                        self.refresh(node.name)
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError("the decision's deadline passed following cluster redirections")
        raise too_many_redirections()

    def _wire(self, node: Any) -> SyncWire:
        client = node.redis_connection or self.connect().get_redis_connection(node)
        entry = self._wires.get(node.name)
        if entry is not None and entry[0] is client:
            return entry[1]
        with self._lock:
            if self.closed:
                raise redis.exceptions.ConnectionError("the limiter was closed")
            entry = self._wires.get(node.name)
            if entry is None or entry[0] is not client:
                if entry is not None:
                    entry[1].close()
                wire = SyncWire(
                    client, max_connections=self._max, timeout=self._timeout, protocol=self.protocol
                )
                entry = (client, wire)
                self._wires[node.name] = entry
        return entry[1]

    # -- topology -------------------------------------------------------------------------

    def refresh(self, failed: str | None = None) -> None:
        """Read the slot map again, in the background (one refresh at a time); ``failed``
        names a node that just failed, asked last."""
        with self._lock:
            if self._refreshing or self.closed:
                return
            self._refreshing = True
        threading.Thread(
            target=self._refresh, args=(failed,), name="applimit-cluster-refresh", daemon=True
        ).start()

    def _refresh(self, failed: str | None) -> None:
        try:
            self._nodes.initialize(last_failed_node_name=failed)
        except Exception as error:
            # A cluster still failing over: the next failed call asks again, and the
            # breaker answers meanwhile.
            logger.debug(
                "reading the cluster's slot map failed: %s",
                error,
                extra={"applimit_event": "slot_map_failed", "error": type(error).__name__},
            )
        finally:
            with self._lock:
                self._refreshing = False
                # A copy first: another thread's MOVED may add a node meanwhile.
                known = self._nodes.nodes_cache.copy()
                gone = [name for name in self._wires if name not in known]
                wires = [self._wires.pop(name)[1] for name in gone]
            for wire in wires:
                wire.close()

    def close(self) -> None:
        """Give every node's connections back to its pool, disconnected, and close the
        cluster client."""
        with self._connecting, self._lock:
            self.closed = True
            wires, self._wires = list(self._wires.values()), {}
            client = self._client
        for _, wire in wires:
            wire.close()
        if client is not None:
            _clients.close_sync(client, own_sentinels=False)


SyncTransport = SyncWire | ClusterWire
"""The sync limiter's wire: one server, or a cluster."""


def open_sync(
    target: Target[SyncClient], *, max_connections: int, timeout: float, batch: bool = False
) -> SyncTransport:
    """The sync wire to ``target``, built without I/O. ``batch`` combines concurrent
    threads' calls on one server; a cluster's calls are sent one per thread (each master
    has a wire of its own, and a call may be redirected on its own)."""
    if target.cluster:
        return ClusterWire(target, max_connections=max_connections, timeout=timeout)
    return SyncWire(target, max_connections=max_connections, timeout=timeout, batch=batch)
