"""The limiter's script calls on the wire: packed once, sent on connections it holds.

A decision is one EVALSHA, so on a standalone (or Sentinel-managed) server the limiter's
cost above the round trip is whatever the client does around it. redis-py's generic
command path takes a connection from the pool and gives it back (a lock, a ``poll`` to
check the socket is clean, metrics bookkeeping), encodes every argument in Python and
runs the reply through its callbacks: about as much time as the round trip itself on a
small machine. The script call needs none of that, so the shells use these instead:

- the command is packed by hiredis in one C call (:func:`pack`);
- connections are borrowed from the limiter's own pool and kept on a free list while
  idle, so a decision pops one, sends, reads, and pushes it back (the pool's bound on
  connections still holds: a borrowed connection is in use as far as the pool knows);
- the reply is read by the connection's own parser (hiredis), with its socket timeout.

The connections stay redis-py's: connecting, AUTH, SELECT, TLS, unix sockets, Sentinel
master discovery and the socket timeouts are theirs. A connection that fails mid-call is
disconnected by redis-py and reconnects on its next use, as in the pool. Redis Cluster
keeps redis-py's cluster client, which follows MOVED and ASK redirections.

:class:`AsyncWire` also batches: the calls submitted in one turn of the event loop are
written to one connection in one write, and their replies are read in order, one future
each (auto-pipelining). Each call is still one EVALSHA, atomic on its own.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import hiredis
import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from . import _script
from ._breaker import CircuitBreaker
from ._core import ScriptCall
from ._errors import REDIS_FAILURES, is_outage

_EVALSHA = b"EVALSHA"
_EVAL = b"EVAL"


def _pack(args: tuple[str | bytes | int, ...]) -> bytes:
    # hiredis' stub types its argument as a one-element tuple; it takes any length.
    return bytes(hiredis.pack_command(args))  # type: ignore[arg-type]


def pack(call: ScriptCall, *, source: bool = False) -> bytes:
    """``call`` as one RESP command: EVALSHA by the script's SHA, or EVAL with its text."""
    head = (_EVAL, _script.SOURCE) if source else (_EVALSHA, _script.SHA)
    return _pack((*head, len(call.keys), *call.keys, *call.args))


def pack_many(calls: Sequence[ScriptCall]) -> bytes:
    """Several EVALSHA calls as one buffer, for one write."""
    return b"".join([pack(call) for call in calls])


# --- sync ----------------------------------------------------------------------------------


class SyncWire:
    """Runs script calls on connections borrowed from a ``redis.Redis`` client's pool.

    Thread-safe: ``list.pop`` and ``list.append`` are atomic, so each thread works on a
    connection no other thread holds. After a fork the child drops the free list without
    closing it (the sockets are the parent's), as redis-py's pools do.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def run(self, call: ScriptCall) -> object:
        """EVALSHA the call; on NOSCRIPT (a restarted or flushed server) EVAL it once."""
        try:
            return self.send(pack(call))
        except NoScriptError:
            # EVAL runs the script and caches it again, so the next EVALSHA finds it.
            return self.send(pack(call, source=True))

    def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset), on the same connections."""
        return self.send(_pack(args))

    def send(self, packed: bytes) -> object:
        """Send one packed command and read its reply; error replies are raised."""
        if self._pid != os.getpid():
            # A forked child: the idle sockets are the parent's; leave them to it.
            self._idle, self._pid = [], os.getpid()
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._pool.get_connection()
        try:
            # A list: redis-py writes each item, and a bare bytes would be iterated.
            connection.send_packed_command([packed], check_health=False)
            return connection.read_response()
        finally:
            # A connection that failed was disconnected by redis-py; it reconnects on its
            # next use. One that read an error reply is clean and reusable.
            self._idle.append(connection)

    def close(self) -> None:
        """Disconnect the idle connections and give them back to the pool."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()
            self._pool.release(connection)


# --- async ---------------------------------------------------------------------------------


class AsyncWire:
    """Sends the script calls submitted in one turn of the event loop together.

    One connection per batch, taken from the limiter's own pool: all the batch's commands
    in one write, then the replies read in order, each resolving its caller's future.
    A batch that fails as a whole (connection lost, socket timeout) fails each of its
    calls with that error and is reported to the circuit breaker once; an error reply
    (NOSCRIPT aside, which is retried with EVAL) fails only its own call. A batch is not
    cut short by any caller's deadline: the socket timeout (the policy's timeout, per
    batch) detects a hung Redis, while callers keep their own deadlines.
    """

    def __init__(self, client: redis.asyncio.Redis, breaker: CircuitBreaker) -> None:
        self._pool = client.connection_pool
        self._breaker = breaker
        self._pending: list[tuple[ScriptCall, asyncio.Future[object]]] = []
        # Strong references: the event loop keeps only weak ones to running tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        self._timeout: float | None = self._pool.connection_kwargs.get("socket_timeout")

    def submit(self, call: ScriptCall) -> asyncio.Future[object]:
        """A future for the call's reply (or its error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if not self._pending:
            # Flush after the coroutines runnable now have had their turn and submitted.
            loop.call_soon(self._flush)
        self._pending.append((call, future))
        return future

    async def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset) on a connection of the same pool."""
        connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_packed_command(_pack(args), check_health=False)
            return await connection.read_response()
        finally:
            await self._pool.release(connection)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[ScriptCall, asyncio.Future[object]]]) -> None:
        live = [(call, future) for call, future in batch if not future.done()]
        if not live:
            return
        try:
            replies = await self._round_trip([call for call, _ in live])
        except asyncio.CancelledError:
            for _, future in live:
                future.cancel()
            raise
        except REDIS_FAILURES as error:
            if is_outage(error):
                self._breaker.failure(error)
            for _, future in live:
                if not future.done():
                    future.set_exception(error)
            return
        self._breaker.success()
        for (_, future), reply in zip(live, replies, strict=True):
            if future.done():
                continue
            if isinstance(reply, BaseException):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _round_trip(self, calls: list[ScriptCall]) -> list[object]:
        connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            replies = await self._exchange(connection, pack_many(calls), len(calls))
            missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if missing:
                # EVAL runs the script and caches it again, so later EVALSHAs find it.
                again = await self._exchange(
                    connection,
                    b"".join(pack(calls[i], source=True) for i in missing),
                    len(missing),
                )
                for index, reply in zip(missing, again, strict=True):
                    replies[index] = reply
            return replies
        finally:
            await self._pool.release(connection)

    async def _exchange(self, connection: Any, packed: bytes, count: int) -> list[object]:
        """Write ``count`` packed commands at once and read their replies, in order.

        One deadline covers all the reads: a per-reply timeout would cost a timer for
        every reply of a large batch.
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
