"""The limiter's script calls on the wire: packed once, sent on connections it holds.

A decision is one script call, so on a standalone (or Sentinel-managed) server the
limiter's cost above the round trip is whatever the client does around it. redis-py's
generic command path takes a connection from the pool and gives it back (a lock, a
``poll`` to check the socket is clean, metrics bookkeeping), encodes every argument in
Python and runs the reply through its callbacks: about as much time as the round trip
itself on a small machine. The script call needs none of that, so the shells use these:

- the command is packed by hiredis in one C call (:func:`pack`);
- connections are the limiter's own, kept between decisions: a decision pops an idle
  one, sends, reads, and pushes it back; at most ``max_connections`` exist, and a caller
  that finds none idle waits for one within the timeout (:class:`SyncWire`);
- the reply is read by the connection's own parser (hiredis), with its socket timeout;
- the call is an FCALL of the limiter's Redis Functions library (see ``_script.py``),
  loaded on "Function not found"; where Redis refuses Functions (before 7, or an ACL
  without FCALL or FUNCTION LOAD) it is EVALSHA, and EVAL once after NOSCRIPT.

The connections stay redis-py's: connecting, AUTH, SELECT, TLS, unix sockets, Sentinel
master discovery and the socket timeouts are theirs. A connection that fails mid-call is
disconnected by redis-py and reconnects on its next use, as in the pool. On Redis Cluster
the sync limiter runs one such wire per master (:class:`ClusterWire`), on the slot map of
redis-py's cluster client; the async limiter keeps redis-py's asyncio cluster client, which
follows MOVED and ASK redirections, with EVALSHA.

:class:`AsyncWire` also batches: the calls submitted in one turn of the event loop are
written to one connection in one write, and their replies are read in order, one future
each (auto-pipelining). Each call is still one script call, atomic on its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
import redis.asyncio
import redis.cluster
from redis.exceptions import NoScriptError

from . import _script
from ._breaker import CircuitBreaker
from ._core import ScriptCall, wrote
from ._errors import REDIS_FAILURES, PoolExhausted, error_code, is_outage

# Answer this many callers of a batch, then let them run before answering the rest: the
# first ones send their next calls (a new batch) while this one is still being answered,
# so Redis works on one batch while the event loop works through another. Without it all
# of a batch's callers wake at once, and Redis and the loop take turns idling. 32 is in
# the middle of the range that measured best (16 to 64 calls) in bench/bench_async.py.
_YIELD_EVERY = 32
_FCALL = b"FCALL"
_EVALSHA = b"EVALSHA"
_EVAL = b"EVAL"
_HEADS = {
    _FCALL: (_FCALL, _script.FUNCTION),
    _EVALSHA: (_EVALSHA, _script.SHA),
    _EVAL: (_EVAL, _script.SOURCE),
}

logger = logging.getLogger("applimit")


def _pack(args: tuple[str | bytes | int, ...]) -> bytes:
    # hiredis' stub types its argument as a one-element tuple; it takes any length.
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def pack(call: ScriptCall, how: bytes) -> bytes:
    """``call`` as one RESP command: FCALL of the library's function, EVALSHA by the
    script's SHA, or EVAL with the script's text."""
    return _pack((*_HEADS[how], len(call.keys), *call.keys, *call.args))


def pack_many(calls: Sequence[ScriptCall], how: bytes) -> bytes:
    """Several calls as one buffer, for one write."""
    return b"".join([pack(call, how) for call in calls])


_LOAD = _pack((b"FUNCTION", b"LOAD", _script.LIBRARY))
_ASKING = _pack((b"ASKING",))


def _exchange(connection: Any, packed: bytes, replies: int) -> object:
    """Write ``packed`` and read its ``replies`` replies; return the last one."""
    # A list: redis-py writes each item, and a bare bytes would be iterated.
    connection.send_packed_command([packed], check_health=False)
    if replies == 1:
        return connection.read_response()
    # ASKING, then the call: both replies are read, so that the connection stays in step
    # even when the first is an error.
    first: redis.exceptions.ResponseError | None = None
    try:
        connection.read_response()
    except redis.exceptions.ResponseError as error:
        first = error
    reply = connection.read_response()
    if first is not None:
        raise first
    return reply


def _function_missing(reply: object) -> bool:
    """The server has no such function: load the library and call again."""
    return isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith(
        "Function not found"
    )


# How servers and proxies say that a command is not for this client: Redis before 7
# ("unknown command"), managed services and proxies ("unsupported", "not allowed",
# "disabled"...).
_REFUSALS = (
    "unknown command",
    "unknown subcommand",
    "unsupported",
    "not supported",
    "not allowed",
    "disabled",
)
# Codes of error replies about the server's state or the call's keys, never about the
# command: out of memory ("OOM command not allowed when used memory > 'maxmemory'"), a
# replica, a failing save, a key of another type, a cluster in motion. Such an error is the
# decision's, and says nothing about whether Redis Functions can be used.
_STATE_CODES = frozenset(
    {
        "OOM", "READONLY", "MISCONF", "NOREPLICAS", "LOADING", "BUSY", "MASTERDOWN",
        "CLUSTERDOWN", "TRYAGAIN", "MOVED", "ASK", "CROSSSLOT", "WRONGTYPE", "NOSCRIPT",
        "EXECABORT", "NOAUTH", "WRONGPASS",
    }
)  # fmt: skip


def _refused(reply: object) -> bool:
    """FCALL or FUNCTION LOAD itself is not for us here: Redis before 7, an ACL without
    them, a proxy or managed service that does not pass them on.

    Only an error about those commands says so. An error about the server's state (out of
    memory, read-only...), about a key (an ACL's key patterns), or raised by a command the
    script runs ("... script: applimit_..., on @user_function:12.") is the decision's own.
    """
    if not isinstance(reply, redis.exceptions.ResponseError):
        return False
    code = error_code(reply)
    text = str(reply).lower()
    if code == "NOPERM":
        # "this user has no permissions to run the 'fcall' command" (or 'function|load'),
        # not "... to access one of the keys used as arguments".
        return "'fcall'" in text or "'function" in text
    if code in _STATE_CODES or "script:" in text:
        return False
    return any(word in text for word in _REFUSALS)


def _loaded(reply: object) -> bool | None:
    """FUNCTION LOAD's reply: True loaded (or another caller did), False refused, None
    any other error (raised by the caller)."""
    if not isinstance(reply, BaseException):
        return True
    if isinstance(reply, redis.exceptions.ResponseError) and "already exists" in str(reply):
        return True
    return False if _refused(reply) else None


class _Dialect:
    """Whether this server takes FCALL: yes until it refuses, then EVALSHA for good."""

    def __init__(self) -> None:
        self.functions = True

    def refuse(self, reply: object) -> None:
        if self.functions:
            self.functions = False
            logger.info(
                "Redis refused Redis Functions (%s); the limiter runs its script with "
                "EVALSHA instead, which costs about 2 µs more per decision in Redis.",
                reply,
            )


# --- sync ----------------------------------------------------------------------------------


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


class SyncWire:
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
    """

    def __init__(self, client: redis.Redis, *, max_connections: int, timeout: float) -> None:
        self._pool = client.connection_pool
        self._max = max_connections
        self._timeout = timeout
        self._start()

    def _start(self) -> None:
        self._dialect = _Dialect()
        self._idle: list[Any] = []
        self._all: list[Any] = []
        # Callers waiting for a connection, longest first; each is handed one in turn.
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self._generation = _GENERATION

    def run(self, call: ScriptCall, *, asking: bool = False) -> object:
        """FCALL the call, loading the library when the server lacks it; where Redis
        Functions are refused, EVALSHA, and on NOSCRIPT EVAL once.

        ``asking`` sends ASKING first, on the same connection: a cluster node importing
        the call's slot answers it only then (an ASK redirection).
        """
        head, replies = (_ASKING, 2) if asking else (b"", 1)
        dialect = self._dialect
        if dialect.functions:
            try:
                return self.send(head + pack(call, _FCALL), replies)
            except redis.exceptions.ResponseError as error:
                if _function_missing(error):
                    if self._load():
                        return self.send(head + pack(call, _FCALL), replies)
                elif _refused(error):
                    dialect.refuse(error)
                else:
                    raise
        try:
            return self.send(head + pack(call, _EVALSHA), replies)
        except NoScriptError:
            # EVAL runs the script and caches it again, so the next EVALSHA finds it.
            return self.send(head + pack(call, _EVAL), replies)

    def _load(self) -> bool:
        """FUNCTION LOAD the library; False (and EVALSHA from now on) if refused."""
        try:
            self.send(_LOAD)
        except redis.exceptions.ResponseError as error:
            loaded = _loaded(error)
            if loaded is None:
                raise
            if not loaded:
                self._dialect.refuse(error)
            return loaded
        return True

    def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset), on the same connections."""
        return self.send(_pack(args))

    def send(self, packed: bytes, replies: int = 1) -> object:
        """Send packed commands and read ``replies`` replies (1, or 2 after ASKING); the
        last is returned; error replies are raised, after every reply has been read."""
        if self._generation != _GENERATION:
            self._after_fork()
        try:
            connection, reused = self._idle.pop(), True
        except IndexError:
            connection, reused = self._acquire()
        try:
            try:
                return _exchange(connection, packed, replies)
            except redis.exceptions.ConnectionError:
                if not reused:
                    raise
                # A connection that sat idle may have been closed by the other end (a
                # restart, the server's `timeout`, a proxy's idle cutoff): the first use
                # finds out. redis-py has disconnected it, so this connects afresh, as
                # the pool's check before handing out a connection would have. The
                # server had closed the socket, so the first send did not run; in the
                # rare case that it ran and only the reply was lost, the request counts
                # twice, which errs on the strict side.
                return _exchange(connection, packed, replies)
        finally:
            # A connection that failed was disconnected by redis-py; it reconnects on its
            # next use. One that read an error reply is clean and reusable.
            self._idle.append(connection)
            if self._waiters:
                self._hand_over()

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
            fresh: Any = self._pool.get_connection()
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
            self._pool.release(fresh)
            raise redis.exceptions.ConnectionError("the limiter was closed")
        return fresh, False

    def close(self) -> None:
        """Give every connection back to the pool, disconnected."""
        with self._lock:
            connections, self._all, self._idle = self._all, [], []
        for connection in connections:
            if connection is not None:
                connection.disconnect()
                self._pool.release(connection)


class _Waiter:
    """A caller waiting for a connection: ``ready`` is released once one is handed over."""

    __slots__ = ("connection", "ready")

    def __init__(self) -> None:
        self.connection: Any = None
        self.ready = threading.Lock()
        self.ready.acquire()


class ClusterWire:
    """Runs script calls on Redis Cluster: each on a :class:`SyncWire` of the master that
    serves its slot.

    redis-py's cluster client keeps the topology (the slot map, one client per node with
    the settings copied, the startup nodes); its command path is not used, because it
    sleeps 0.25 s on CLUSTERDOWN and re-reads the slot map inline after a failed call, and
    a decision must keep to its deadline. Here:

    - MOVED updates the slot map and the call goes to the new owner; ASK sends ASKING and
      the call to the importing node; both count against the decision's deadline;
    - TRYAGAIN (the call's keys split between two nodes mid-migration) is retried until
      the deadline, with short pauses, then raised;
    - CLUSTERDOWN, a failed connection and a timeout are raised at once, and the slot map
      is read again in the background, so that the calls after a failover find the new
      master while the breaker answers for the old one.
    """

    def __init__(
        self, client: redis.cluster.RedisCluster, *, max_connections: int, timeout: float
    ) -> None:
        self._client = client
        self._nodes = client.nodes_manager
        self._max = max_connections
        self._timeout = timeout
        # Node name -> (the node's client the wire was made for, the wire).
        self._wires: dict[str, tuple[redis.Redis, SyncWire]] = {}
        self._lock = threading.Lock()
        self._refreshing = False
        self._closed = False

    def node_name(self, slot: int) -> str:
        """The name (host:port) of the master serving ``slot``."""
        return str(self._master(slot).name)

    def run(self, call: ScriptCall, deadline: float) -> object:
        """The call's reply, from the master of its slot, following redirections until
        ``deadline`` (a ``time.monotonic()`` value)."""
        assert call.slot is not None
        node = self._master(call.slot)
        asking = False
        for _ in range(_MAX_REDIRECTIONS):
            try:
                return self._wire(node).run(call, asking=asking)
            except redis.exceptions.MovedError as moved:
                self._nodes.move_slot(moved)
                node, asking = self._master(call.slot), False
            except redis.exceptions.AskError as ask:
                found = self._nodes.get_node(host=ask.host, port=ask.port)
                if found is None:
                    self.refresh()
                    raise
                node, asking = found, True
            except redis.exceptions.TryAgainError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                # The slot's keys are moving one by one; wait a little for this call's.
                time.sleep(min(_TRYAGAIN_PAUSE, left))
                node, asking = self._master(call.slot), False
            except _TOPOLOGY_ERRORS:
                self.refresh(node.name)
                raise
            if time.monotonic() > deadline:
                raise TimeoutError("the decision's deadline passed following cluster redirections")
        raise redis.exceptions.ClusterError(
            f"more than {_MAX_REDIRECTIONS} redirections for one call; the cluster's slots "
            "are moving faster than they can be followed"
        )

    def _master(self, slot: int) -> Any:
        try:
            return self._nodes.get_node_from_slot(slot)
        except redis.exceptions.SlotNotCoveredError:
            self.refresh()
            raise

    def _wire(self, node: Any) -> SyncWire:
        client = node.redis_connection or self._client.get_redis_connection(node)
        entry = self._wires.get(node.name)
        if entry is not None and entry[0] is client:
            return entry[1]
        with self._lock:
            if self._closed:
                raise redis.exceptions.ConnectionError("the limiter was closed")
            entry = self._wires.get(node.name)
            if entry is None or entry[0] is not client:
                if entry is not None:
                    entry[1].close()
                entry = (
                    client,
                    SyncWire(client, max_connections=self._max, timeout=self._timeout),
                )
                self._wires[node.name] = entry
        return entry[1]

    def refresh(self, failed: str | None = None) -> None:
        """Read the slot map again, in the background (one refresh at a time); ``failed``
        names a node that just failed, asked last."""
        with self._lock:
            if self._refreshing or self._closed:
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
            logger.debug("reading the cluster's slot map failed: %s", error)
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
        """Give every node's connections back to its pool, disconnected."""
        with self._lock:
            self._closed = True
            wires, self._wires = list(self._wires.values()), {}
        for _, wire in wires:
            wire.close()


# At most this many MOVED/ASK/TRYAGAIN answers are followed for one call (redis-py: 16).
_MAX_REDIRECTIONS = 8
# How long a call waits before it asks again after TRYAGAIN.
_TRYAGAIN_PAUSE = 0.005
# Answers after which the slot map may be out of date: read it again.
_TOPOLOGY_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
    OSError,  # with the builtin TimeoutError
)


# --- async ---------------------------------------------------------------------------------


class AsyncWire:
    """Sends the script calls submitted in one turn of the event loop together.

    One connection per batch, taken from the limiter's own pool: all the batch's commands
    in one write, then the replies read in order, each resolving its caller's future.

    Two clocks bound a batch. The callers' deadline (``timeout`` after the batch's first
    call was submitted) is one timer for the whole batch: when it fires, the futures not
    yet answered fail with TimeoutError, which is not reported to the circuit breaker (the
    event loop may simply be busy). The socket timeout (the same length, on the reads of
    the batch) detects a Redis that stopped answering: the batch then fails as a whole,
    each call with that error, and the breaker hears of it once. An error reply (NOSCRIPT
    aside, which is retried with EVAL) fails only its own call.
    """

    def __init__(self, client: redis.asyncio.Redis, breaker: CircuitBreaker, *, timeout: float):
        self._dialect = _Dialect()
        self._pool = client.connection_pool
        self._breaker = breaker
        self._timeout = timeout
        self._pending: list[tuple[ScriptCall, asyncio.Future[object]]] = []
        self._deadline = 0.0
        # Strong references: the event loop keeps only weak ones to running tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        # The tasks waiting for a connection of the pool now.
        self._pool_waits: set[asyncio.Task[Any] | None] = set()

    def submit(self, call: ScriptCall) -> asyncio.Future[object]:
        """A future for the call's reply (or its error, TimeoutError past the deadline)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if not self._pending:
            # Flush after the coroutines runnable now have had their turn and submitted.
            loop.call_soon(self._flush)
            self._deadline = loop.time() + self._timeout
        self._pending.append((call, future))
        return future

    async def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset) on a connection of the same pool."""
        connection = await self._connection()
        try:
            await connection.send_packed_command(_pack(args), check_health=False)
            return await connection.read_response()
        finally:
            await self._pool.release(connection)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._send(batch))
        timer = loop.call_at(self._deadline, self._expire, batch, task)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: timer.cancel())

    async def _send(self, batch: list[tuple[ScriptCall, asyncio.Future[object]]]) -> None:
        live = [(call, future) for call, future in batch if not future.done()]
        if not live:
            return
        try:
            await self._answer(live)
        except asyncio.CancelledError:
            for _, future in live:
                future.cancel()
            raise
        except BaseException as error:
            # Whatever ends the batch, no caller is left waiting: the batch's timer is its
            # callers' only deadline, and it is cancelled when the batch ends.
            for _, future in live:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(error, Exception):
                raise

    async def _answer(self, live: list[tuple[ScriptCall, asyncio.Future[object]]]) -> None:
        """Run the batch and give each caller its reply, or the batch's Redis error."""
        calls = [call for call, _ in live]
        try:
            replies = await self._round_trip(calls)
        except REDIS_FAILURES as error:
            if is_outage(error):
                self._breaker.failure(error)
            raise
        # An error reply about the server (out of memory, read-only...) fails the batch
        # for the breaker, once; one about a key (WRONGTYPE) is its call's alone.
        failed = next((r for r in replies if isinstance(r, BaseException) and is_outage(r)), None)
        if failed is not None:
            self._breaker.failure(failed)
        elif self._breaker.in_outage:
            self._breaker.success(wrote=any(map(wrote, calls, replies)))
        else:
            self._breaker.success()
        for index, ((_, future), reply) in enumerate(zip(live, replies, strict=True), 1):
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)
            if index % _YIELD_EVERY == 0 and index < len(live):
                await asyncio.sleep(0)

    async def _connection(self) -> Any:
        """A connection of the pool; PoolExhausted when none came free within the pool's
        timeout (a wait for the limiter's own connections, not a Redis failure)."""
        task = asyncio.current_task()
        self._pool_waits.add(task)
        try:
            return await self._pool.get_connection()  # type: ignore[no-untyped-call]
        except redis.exceptions.ConnectionError as error:
            # The blocking pool's wait: "No connection available.", from its timeout.
            if isinstance(error.__cause__, TimeoutError):
                raise self._exhausted() from error
            raise
        finally:
            self._pool_waits.discard(task)

    def _exhausted(self) -> PoolExhausted:
        return PoolExhausted(
            f"no connection free: all {self._pool.max_connections} of the limiter's "
            f"connections stayed busy for {self._timeout} s"
        )

    def _expire(
        self, batch: list[tuple[ScriptCall, asyncio.Future[object]]], task: asyncio.Task[None]
    ) -> None:
        """The callers' deadline: fail the calls of the batch that have no answer yet,
        saying why: the batch still waits for a connection of the pool, or for Redis (or
        for a busy event loop)."""
        waiting = task in self._pool_waits
        for _, future in batch:
            if not future.done():
                future.set_exception(
                    self._exhausted()
                    if waiting
                    else TimeoutError(
                        f"no answer from Redis within the decision's {self._timeout} s"
                    )
                )

    async def _round_trip(self, calls: list[ScriptCall]) -> list[object]:
        connection = await self._connection()
        try:
            how = _FCALL if self._dialect.functions else _EVALSHA
            packed = pack_many(calls, how)
            try:
                replies = await self._exchange(connection, packed, len(calls))
            except _ClosedUnread:
                # The pool checks a connection before handing it out, but a close by the
                # other end (a restart, the server's `timeout`, a proxy's idle cutoff)
                # that the event loop has not yet read passes the check. Nothing was
                # answered; the connection is disconnected, and sending connects afresh.
                replies = await self._exchange(connection, packed, len(calls))
            if how == _FCALL:
                await self._recover_functions(connection, calls, replies)
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                # EVAL runs the script and caches it again, so later EVALSHAs find it.
                await self._again(connection, calls, replies, missing, _EVAL)
            return replies
        finally:
            await self._pool.release(connection)

    async def _recover_functions(
        self, connection: Any, calls: list[ScriptCall], replies: list[object]
    ) -> None:
        """Calls the server could not FCALL: load the library and call again, or, where
        Redis Functions are refused, run them with EVAL (and EVALSHA from now on)."""
        redo = [i for i, r in enumerate(replies) if _function_missing(r) or _refused(r)]
        if not redo:
            return
        refusal = next((replies[i] for i in redo if _refused(replies[i])), None)
        if refusal is not None:
            self._dialect.refuse(refusal)
            await self._again(connection, calls, replies, redo, _EVAL)
            return
        # The library and the calls again, in one write.
        again = await self._exchange(
            connection, _LOAD + pack_many([calls[i] for i in redo], _FCALL), 1 + len(redo)
        )
        loaded = _loaded(again[0])
        if loaded:
            for index, reply in zip(redo, again[1:], strict=True):
                replies[index] = reply
            return
        if loaded is None:
            for index in redo:
                replies[index] = again[0]
            return
        self._dialect.refuse(again[0])
        await self._again(connection, calls, replies, redo, _EVAL)

    async def _again(
        self,
        connection: Any,
        calls: list[ScriptCall],
        replies: list[object],
        indices: list[int],
        how: bytes,
    ) -> None:
        """Send ``calls[i]`` for each index again, the new replies replacing the old."""
        again = await self._exchange(
            connection, pack_many([calls[i] for i in indices], how), len(indices)
        )
        for index, reply in zip(indices, again, strict=True):
            replies[index] = reply

    async def _exchange(self, connection: Any, packed: bytes, count: int) -> list[object]:
        """Write ``count`` packed commands at once and read their replies, in order.

        One socket timeout covers all the reads: a timer per reply would cost as much as
        the rest of the read.
        """
        await connection.send_packed_command(packed, check_health=False)
        replies: list[object] = []
        try:
            async with asyncio.timeout(self._timeout):
                for _ in range(count):
                    try:
                        replies.append(
                            await connection.read_response(
                                timeout=math.inf, disconnect_on_error=False
                            )
                        )
                    except redis.exceptions.ResponseError as error:
                        # An error reply is the call's own; the connection is clean.
                        replies.append(error)
        except redis.exceptions.ConnectionError as error:
            await connection.disconnect(nowait=True)
            if not replies:
                raise _ClosedUnread(str(error)) from error
            raise
        except TimeoutError:
            await connection.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError(
                f"Redis did not answer {count} limiter calls within {self._timeout} s"
            ) from None
        except BaseException:
            # Replies left unread would be taken for the next batch's: drop the socket.
            await connection.disconnect(nowait=True)
            raise
        return replies


class _ClosedUnread(redis.exceptions.ConnectionError):
    """The connection was closed before any reply of the batch was read."""
