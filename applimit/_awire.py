"""The async limiter's wires: its script calls sent from one event loop, never blocking.

On a standalone or Sentinel-managed server :class:`AsyncWire` batches: the calls
submitted in one turn of the event loop are written to one connection in one write, and
their replies are read in order, one future each (auto-pipelining). Each call is still one
script call, atomic on its own, but hundreds of concurrent requests no longer queue for
connections one command at a time, which is what made limiters time out (and fail open)
under load when Redis itself was fine. The command is packed by hiredis; which command
(FCALL, EVALSHA, EVAL, FUNCTION LOAD first) and what an error reply means is the wire
protocol's (``_protocol.py``): the wire only writes and reads.

On Redis Cluster :class:`AsyncClusterClient` goes through redis-py's asyncio cluster
client, which follows MOVED and ASK redirections, with EVALSHA (and EVAL after NOSCRIPT,
as the same protocol says), every decision under ``asyncio.timeout(app.timeout)``.

Both are the async limiter's transports: built without I/O, they make the client on
first use, and run a decision's calls (``run``) returning one outcome per call, a reply
or the failure, as the decision flow (``_flow.py``) takes them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

from . import _clients
from ._breaker import CircuitBreaker
from ._clients import AsyncClient, Target
from ._core import ScriptCall, wrote
from ._errors import CLOSED, REDIS_FAILURES, ApplimitError, PoolExhausted, is_outage
from ._protocol import Replies, ScriptProtocol, command_args, pack_calls, pack_command

# Answer this many callers of a batch, then let them run before answering the rest: the
# first ones send their next calls (a new batch) while this one is still being answered,
# so Redis works on one batch while the event loop works through another. Without it all
# of a batch's callers wake at once, and Redis and the loop take turns idling. 32 is in
# the middle of the range that measured best (16 to 64 calls) in bench/bench_async.py.
_YIELD_EVERY = 32


class AsyncWire:
    """Sends the script calls submitted in one turn of the event loop together.

    One connection per batch, taken from the limiter's own pool: all the batch's commands
    in one write, then the replies read in order, each resolving its caller's future.

    Two clocks bound a batch. The callers' deadline (``timeout`` after the batch's first
    call was submitted) is one timer for the whole batch: when it fires, the futures not
    yet answered fail with TimeoutError, which is not reported to the circuit breaker (the
    event loop may simply be busy). The socket timeout (the same length, on the reads of
    the batch) detects a Redis that stopped answering: the batch then fails as a whole,
    each call with that error, and the breaker hears of it once. An error reply (unless
    the protocol recovers from it) fails only its own call.

    The client is made from the target on first use, and closed with the limiter.
    """

    # Each batch tells the breaker how Redis answered, once for all its calls.
    reports = True

    def __init__(
        self, target: Target[AsyncClient], breaker: CircuitBreaker, *, timeout: float
    ) -> None:
        """Send to ``target``, telling ``breaker`` of each batch's outcome."""
        self._target = target
        self._client: redis.asyncio.Redis | None = None
        self._pool: Any = None
        self.protocol = ScriptProtocol()
        self._breaker = breaker
        self._timeout = timeout
        self.closed = False
        self._pending: list[tuple[ScriptCall, asyncio.Future[object]]] = []
        self._deadline = 0.0
        # Strong references: the event loop keeps only weak ones to running tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        # The tasks waiting for a connection of the pool now.
        self._pool_waits: set[asyncio.Task[Any] | None] = set()

    # -- the transport --------------------------------------------------------------------

    @staticmethod
    def route(slot: int) -> str | None:
        """One server: no node to name."""
        return None

    @staticmethod
    def serving_nodes() -> set[str] | None:
        """One server: no slot map."""
        return None

    async def run(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of each call, in order (a reply, or the failure), each batched with
        the other calls of this event-loop turn."""
        if self.closed:
            raise ApplimitError(CLOSED)
        if len(calls) == 1:
            try:
                return [await self.submit(calls[0])]
            except REDIS_FAILURES as error:
                return [error]
        outcomes = await asyncio.gather(*map(self.submit, calls), return_exceptions=True)
        return _failures_only(outcomes)

    async def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset) on a connection of the same pool."""
        if self.closed:
            raise ApplimitError(CLOSED)
        await self.command("DEL", *keys)

    def client(self) -> redis.asyncio.Redis:
        """The client the connections come from (made now if not yet: no I/O)."""
        if self._client is None:
            if self.closed:
                raise redis.exceptions.ConnectionError("the limiter was closed")
            client = self._target.factory()
            assert isinstance(client, redis.asyncio.Redis)
            self._pool = client.connection_pool
            self._client = client
        return self._client

    async def close(self) -> None:
        """Close the client (and the Sentinel clients the limiter made for it)."""
        self.closed = True
        client, self._client = self._client, None
        if client is not None:
            await _clients.close_async(client, own_sentinels=self._target.owns_sentinels)

    # -- batches --------------------------------------------------------------------------

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
            await connection.send_packed_command(pack_command(args), check_health=False)
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
        pool = self._pool if self._pool is not None else self.client().connection_pool
        task = asyncio.current_task()
        self._pool_waits.add(task)
        try:
            return await pool.get_connection()
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

    async def _round_trip(self, calls: list[ScriptCall]) -> Replies:
        connection = await self._connection()
        try:
            protocol = self.protocol
            how = protocol.how
            packed, count = pack_calls(calls, how)
            try:
                replies = await self._exchange(connection, packed, count)
            except _ClosedUnread:
                # The pool checks a connection before handing it out, but a close by the
                # other end (a restart, the server's `timeout`, a proxy's idle cutoff)
                # that the event loop has not yet read passes the check. Nothing was
                # answered; the connection is disconnected, and sending connects afresh.
                replies = await self._exchange(connection, packed, count)
            if not protocol.settled(replies):
                # The recovery's writes go on the same connection, in turn.
                steps = protocol.recover(how, replies)
                try:
                    step = next(steps)
                    while True:
                        again = await self._exchange(connection, *step.write(calls))
                        step = steps.send(again)
                except StopIteration:
                    pass
            return replies
        finally:
            await self._pool.release(connection)

    async def _exchange(self, connection: Any, packed: bytes, count: int) -> Replies:
        """Write ``count`` packed commands at once and read their replies, in order.

        One socket timeout covers all the reads: a timer per reply would cost as much as
        the rest of the read.
        """
        await connection.send_packed_command(packed, check_health=False)
        replies: Replies = []
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


def _failures_only(outcomes: Sequence[object]) -> Replies:
    """Gathered outcomes as the flow takes them; an exception that is no Redis failure (a
    bug) is raised, as it would be without the gather."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, REDIS_FAILURES):
            raise outcome
    return list(outcomes)


class AsyncClusterClient:
    """Runs script calls on Redis Cluster through redis-py's asyncio cluster client.

    The client follows MOVED and ASK redirections and keeps the slot map; the calls are
    EVALSHA (the protocol starts there: the client cannot send FUNCTION LOAD where a call
    goes), EVAL after NOSCRIPT. A decision's calls (one per hash slot) run concurrently,
    together under ``asyncio.timeout(app.timeout)``.
    """

    # The flow tells the breakers of each call's outcome.
    reports = False

    def __init__(self, target: Target[AsyncClient], *, timeout: float) -> None:
        """Send to the cluster of ``target``, whose client is made on first use."""
        self._factory = target.factory
        self._client: redis.asyncio.cluster.RedisCluster | None = None
        self.protocol = ScriptProtocol(functions=False)
        self._timeout = timeout
        self.closed = False

    def route(self, slot: int) -> str | None:
        """The name of the master serving ``slot``; None before the client has read the
        slot map, or while it rebuilds it."""
        client = self._client
        if client is None:
            return None
        try:
            return str(client.nodes_manager.get_node_from_slot(slot).name)
        except (redis.exceptions.RedisClusterException, LookupError, TypeError):
            return None

    def serving_nodes(self) -> set[str] | None:
        """The masters in the client's slot map (None before the client is made)."""
        client = self._client
        if client is None:
            return None
        return {str(node.name) for node in client.nodes_manager.get_nodes_by_server_type("primary")}

    def client(self) -> redis.asyncio.cluster.RedisCluster:
        """The cluster client (made now if not yet: it connects on its first command)."""
        if self._client is None:
            if self.closed:
                raise ApplimitError(CLOSED)
            client = self._factory()
            assert isinstance(client, redis.asyncio.cluster.RedisCluster)
            self._client = client
        return self._client

    async def run(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of each call, in order; a timeout is the first call's."""
        if self.closed:
            raise ApplimitError(CLOSED)
        client = self.client()
        try:
            async with asyncio.timeout(self._timeout):
                if len(calls) == 1:
                    return [await self._call(client, calls[0])]
                # One call per cluster slot, concurrently: still one round trip of time.
                outcomes = await asyncio.gather(
                    *(self._call(client, call) for call in calls), return_exceptions=True
                )
        except REDIS_FAILURES as error:
            return [error]
        return _failures_only(outcomes)

    async def _call(self, client: redis.asyncio.cluster.RedisCluster, call: ScriptCall) -> object:
        """The call's reply (its error reply raised), recovering as the protocol says."""
        protocol = self.protocol
        how = protocol.how
        replies: Replies = [await self._send(client, call, how)]
        if not protocol.settled(replies):
            steps = protocol.recover(how, replies, load=False)
            try:
                step = next(steps)
                while True:
                    step = steps.send([await self._send(client, call, step.how)])
            except StopIteration:
                pass
        reply = replies[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    @staticmethod
    async def _send(
        client: redis.asyncio.cluster.RedisCluster, call: ScriptCall, how: bytes
    ) -> object:
        try:
            return await client.execute_command(*command_args(call, how))
        except redis.exceptions.ResponseError as error:
            return error

    async def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset; one hash tag, so one slot) through the cluster client."""
        if self.closed:
            raise ApplimitError(CLOSED)
        await self.client().delete(*keys)

    async def close(self) -> None:
        """Close the cluster client."""
        self.closed = True
        client, self._client = self._client, None
        if client is not None:
            await _clients.close_async(client, own_sentinels=False)


AsyncTransport = AsyncWire | AsyncClusterClient
"""The async limiter's wire: one server, or a cluster."""


def open_async(
    target: Target[AsyncClient], breaker: CircuitBreaker, *, timeout: float
) -> AsyncTransport:
    """The async wire to ``target``, built without I/O (``breaker``: the limiter's own)."""
    if target.cluster:
        return AsyncClusterClient(target, timeout=timeout)
    return AsyncWire(target, breaker, timeout=timeout)
