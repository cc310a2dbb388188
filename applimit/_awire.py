"""The async limiter's wires: its script calls sent from one event loop, never blocking.

On a standalone or Sentinel-managed server :class:`AsyncWire` batches: the calls
submitted in one turn of the event loop are written to one connection in one write, and
their replies are read in order, one future each (auto-pipelining), which resolves to the
call's outcome as the decision flow takes it: a one-call decision awaits that future
itself, with no coroutine between. Each call is still one
script call, atomic on its own, but hundreds of concurrent requests no longer queue for
connections one command at a time, which is what made limiters time out (and fail open)
under load when Redis itself was fine. The command is packed by hiredis; which command
(FCALL, EVALSHA, EVAL, FUNCTION LOAD first) and what an error reply means is the wire
protocol's (``_protocol.py``): the wire only writes and reads.

On Redis Cluster :class:`AsyncClusterWire` runs one such wire per master, on the slot map
of redis-py's asyncio cluster client, and follows MOVED, ASK and TRYAGAIN itself, within
the decision's deadline, as the sync limiter's wire does.

Both are the async limiter's transports: built without I/O, they make the client on
first use, and run a decision's calls (``run``) returning one outcome per call, a reply
or the failure, as the decision flow (``_flow.py``) takes them.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

from . import _clients, _hiredis
from ._calls import ScriptCall, pack_calls, pack_command
from ._clients import AsyncClient, Target
from ._errors import CLOSED, REDIS_FAILURES, ApplimitError, DeadlinePassed, PoolExhausted
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

# Where a wire hands the outcomes of calls whose callers stopped waiting (the decider's
# ledger of the breakers, see _flow.Decider.late).
Late = Callable[[Sequence[ScriptCall], Sequence[object]], None]

# A batch's callers are answered in parts (half the calls in flight, at least this many),
# so that Redis works on one batch while the event loop answers another, instead of the two
# taking turns idling (docs/benchmarks-compare.md, "Why each speed trick stays").
_MIN_PART = 32
# Connections a wire keeps from one batch for the next (see AsyncWire._kept): about as
# many batches as are in flight at once at a steady load.
_KEEP = 4

logger = logging.getLogger("applimit")


class AsyncWire(OneServer):
    """Sends the script calls submitted in one turn of the event loop together.

    One connection per batch, taken from the limiter's own pool: all the batch's commands
    in one write, then the replies read in order, each resolving its caller's future.

    Two clocks bound a batch. The callers' deadline (``timeout`` after the batch's first
    call was submitted) is one timer for the whole batch: when it fires, the futures not
    yet answered get :class:`DeadlinePassed`, which is no outage (the event loop may
    simply be busy). The socket timeout (the same length, on the reads of the batch)
    detects a Redis that stopped answering: the batch then fails as a whole, each call
    with that one error (the breaker counts it once). An error reply (unless the protocol
    recovers from it) fails only its own call. The wire tells no breaker: each outcome
    goes to its caller, or, when the caller stopped waiting, to ``late`` (the decider's
    :meth:`~applimit._flow.Decider.late`), which keeps the ledger.

    As the transport of a standalone or Sentinel-managed server it makes the client from
    its target on first use and closes it with the limiter; as one master's wire in an
    :class:`AsyncClusterWire` it is given a pool of its own for that node.
    """

    def __init__(
        self,
        source: Target[AsyncClient] | redis.asyncio.ConnectionPool,
        late: Late,
        *,
        timeout: float,
        protocol: ScriptProtocol | None = None,
    ) -> None:
        """Send to ``source`` (a target, whose client is made on first use, or a pool);
        outcomes whose callers stopped waiting go to ``late``."""
        self._target = source if isinstance(source, Target) else None
        self._client: redis.asyncio.Redis | None = None
        self._pool: Any = None if isinstance(source, Target) else source
        self.protocol = protocol if protocol is not None else ScriptProtocol()
        self._late = late
        self._timeout = timeout
        self.closed = False
        self._pending: list[tuple[ScriptCall, asyncio.Future[Replies]]] = []
        # The calls of the batches sent and not yet answered in full (see _answer).
        self._in_flight = 0
        self._deadline = 0.0
        # Strong references: the event loop keeps only weak ones to running tasks.
        self._tasks: set[asyncio.Task[None]] = set()
        # The tasks waiting for a connection of the pool now.
        self._pool_waits: set[asyncio.Task[Any] | None] = set()
        # Connections kept from one batch for the next (see _kept).
        self._idle: list[Any] = []

    # -- the transport --------------------------------------------------------------------

    def run(self, calls: Sequence[ScriptCall]) -> Awaitable[Replies]:
        """The outcome of each call, in order (a reply, or the failure), each batched with
        the other calls of this event-loop turn."""
        if self.closed:
            raise ApplimitError(CLOSED)
        if len(calls) == 1:
            # Most decisions: the caller awaits the call's own future, no coroutine made.
            return self.submit(calls[0])
        return self._gathered(calls)

    async def _gathered(self, calls: Sequence[ScriptCall]) -> Replies:
        return [outcomes[0] for outcomes in await asyncio.gather(*map(self.submit, calls))]

    async def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset) on a connection of the same pool."""
        if self.closed:
            raise ApplimitError(CLOSED)
        await self.command("DEL", *keys)

    def client(self) -> redis.asyncio.Redis:
        """The client the connections come from (made now if not yet: no I/O)."""
        if self._client is None:
            if self.closed or self._target is None:
                raise redis.exceptions.ConnectionError("the limiter was closed")
            client = self._target.factory()
            assert isinstance(client, redis.asyncio.Redis)
            self._pool = client.connection_pool
            self._client = client
        return self._client

    async def close(self) -> None:
        """Close the client (and the Sentinel clients the limiter made for it), or the
        node's pool."""
        self.closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await self._pool.release(connection)
        client, self._client = self._client, None
        if self._target is None:
            await self._pool.disconnect()
        elif client is not None:
            await _clients.close_async(client, own_sentinels=self._target.owns_sentinels)

    async def alone(self, call: ScriptCall, *, asking: bool = False) -> object:
        """The call's reply (its error reply raised), sent on its own, outside the
        batches: with ASKING first when ``asking`` (an ASK redirection)."""
        reply = (await self._round_trip([call], asking=asking))[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    # -- batches --------------------------------------------------------------------------

    def submit(self, call: ScriptCall) -> asyncio.Future[Replies]:
        """A future for the call's outcome, as a list of one: its reply, or its Redis
        failure (TimeoutError past the deadline); an error that is no Redis failure (a
        bug) is the future's exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Replies] = loop.create_future()
        if not self._pending:
            # Flush after the coroutines runnable now have had their turn and submitted.
            loop.call_soon(self._flush)
            self._deadline = loop.time() + self._timeout
        self._pending.append((call, future))
        return future

    async def command(self, *args: str | bytes | int) -> object:
        """Any other command (DEL for reset) on a connection of the same pool."""
        # From the pool, which checks it before handing it out: this command is sent once,
        # without _round_trip's second try on a connection closed by the other end. A kept
        # connection goes back to the pool first, which may have no other to give.
        if self._idle:
            await self._pool.release(self._idle.pop())
        connection = await self._connection(kept=False)
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
        size = len(batch)
        self._in_flight += size

        def done(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            timer.cancel()
            self._in_flight -= size

        task.add_done_callback(done)

    async def _send(self, batch: list[tuple[ScriptCall, asyncio.Future[Replies]]]) -> None:
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
            failed = isinstance(error, REDIS_FAILURES)
            left = []
            for call, future in live:
                if not future.done():
                    if failed:
                        future.set_result([error])
                    else:
                        future.set_exception(error)
                elif failed:
                    left.append(call)
            if left:
                self._late(left, [error] * len(left))
            if not isinstance(error, Exception):
                raise

    async def _answer(self, live: list[tuple[ScriptCall, asyncio.Future[Replies]]]) -> None:
        """Run the batch and give each caller its reply, or the batch's Redis error."""
        replies = await self._round_trip([call for call, _ in live])
        left: list[ScriptCall] = []
        left_replies: Replies = []
        # Half the calls in flight (this batch's, the others sent and those waiting to
        # be): this batch's first half, answered, sends its next calls while Redis works
        # on the rest (see _MIN_PART).
        part = max(_MIN_PART, (self._in_flight + len(self._pending)) // 2)
        for index, ((call, future), reply) in enumerate(zip(live, replies, strict=True), 1):
            if not future.done():
                # An error reply is its call's outcome, as a reply is.
                future.set_result([reply])
            else:
                left.append(call)
                left_replies.append(reply)
            if index % part == 0 and index < len(live):
                await asyncio.sleep(0)
        if left:
            self._late(left, left_replies)

    async def _connection(self, *, kept: bool = True) -> Any:
        """A connection kept from an earlier batch (with ``kept``), else one of the pool;
        PoolExhausted when none came free within the pool's timeout (a wait for the
        limiter's own connections, not a Redis failure)."""
        if kept and self._idle:
            return self._idle.pop()
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

    def _kept(self, connection: Any) -> bool:
        """Keep ``connection`` for the next batch instead of returning it to the pool,
        unless enough are kept, a batch waits for the pool (which it would then wait on
        in vain), the wire is closed, or the connection was dropped after a failure.
        redis-py's checkout and return (a condition, a lock, a health check that reads
        the socket) are worth skipping (docs/benchmarks-compare.md, "Why each speed trick
        stays"); the health check's one case that matters here, a connection the other
        end has closed, is _round_trip's second try."""
        if (
            len(self._idle) < _KEEP
            and not self._pool_waits
            and not self.closed
            and connection.is_connected
        ):
            self._idle.append(connection)
            return True
        return False

    def _exhausted(self) -> PoolExhausted:
        return PoolExhausted(
            f"no connection free: all {self._pool.max_connections} of the limiter's "
            f"connections stayed busy for {self._timeout} s"
        )

    def _expire(
        self, batch: list[tuple[ScriptCall, asyncio.Future[Replies]]], task: asyncio.Task[None]
    ) -> None:
        """The callers' deadline: fail the calls of the batch that have no answer yet,
        saying why: the batch still waits for a connection of the pool, or for Redis (or
        for a busy event loop)."""
        waiting = task in self._pool_waits
        for _, future in batch:
            if not future.done():
                future.set_result(
                    [
                        self._exhausted()
                        if waiting
                        else DeadlinePassed(
                            f"no answer from Redis within the decision's {self._timeout} s"
                        )
                    ]
                )

    async def _round_trip(self, calls: list[ScriptCall], *, asking: bool = False) -> Replies:
        connection = await self._connection()
        try:
            protocol = self.protocol
            how = protocol.how
            packed, count = pack_calls(calls, how, asking=asking)
            try:
                replies = await self._exchange(connection, packed, count)
            except _ClosedUnread:
                # The pool checks a connection before handing it out, but a close by the
                # other end (a restart, the server's `timeout`, a proxy's idle cutoff)
                # that the event loop has not yet read passes the check. Nothing was
                # answered; the connection is disconnected, and sending connects afresh.
                replies = await self._exchange(connection, packed, count)
            if asking:
                replies = unpair(replies)
            if not protocol.settled(replies):
                # The recovery's writes go on the same connection, in turn.
                steps = protocol.recover(how, replies)
                try:
                    step = next(steps)
                    while True:
                        raw = await self._exchange(connection, *step.write(calls, asking=asking))
                        step = steps.send(step.replies(raw, asking=asking))
                except StopIteration:
                    pass
            return replies
        finally:
            if not self._kept(connection):
                await self._pool.release(connection)

    async def _exchange(self, connection: Any, packed: bytes, count: int) -> Replies:
        """Write ``count`` packed commands at once and read their replies, in order.

        One timeout covers the write and all the reads: a timer per reply would cost as
        much as the rest of the read. A connected connection with redis-py's hiredis parser
        is written directly, to its stream: redis-py's ``send_packed_command`` runs each
        write in ``asyncio.wait_for``, a task and a timer of its own per batch (about 4% of
        an async decision's CPU), where the batch's deadline already bounds it.
        """
        direct = _hiredis.direct(connection) and _hiredis.plain_send(connection)
        if not direct:
            # Not connected (redis-py connects it), a parser read through redis-py, or a
            # connection class that sends its own way (counting or tracing what it sends).
            await connection.send_packed_command(packed, check_health=False)
        replies: Replies = []
        try:
            async with asyncio.timeout(self._timeout):
                if direct:
                    writer = connection._writer
                    writer.write(packed)
                    # Waits only while the socket's buffer is full; raises if the
                    # connection was lost (then nothing of the batch was answered).
                    await writer.drain()
                if direct or _hiredis.direct(connection):
                    await _hiredis.read_async(connection, count, replies)
                else:
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
        except OSError as error:
            # The direct write's (the reads translate theirs): the connection was lost
            # before any of the batch was answered.
            await connection.disconnect(nowait=True)
            if replies:
                raise
            raise _ClosedUnread(f"Error while writing to socket: {error.args}") from error
        except BaseException:
            # Replies left unread would be taken for the next batch's: drop the socket.
            await connection.disconnect(nowait=True)
            raise
        return replies


class _ClosedUnread(redis.exceptions.ConnectionError):
    """The connection was closed before any reply of the batch was read."""


def _retrieved(task: asyncio.Task[None]) -> None:
    """Take a background task's outcome, so that a failure nobody awaited any more is not
    reported by the event loop as never retrieved (the callers saw it, or timed out)."""
    if not task.cancelled():
        task.exception()


def _raised(outcome: object) -> object:
    """A reply, or its failure raised."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _failures_only(outcomes: Sequence[object]) -> Replies:
    """Gathered outcomes as the flow takes them; an exception that is no Redis failure (a
    bug) is raised, as it would be without the gather."""
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, REDIS_FAILURES):
            raise outcome
    return list(outcomes)


class AsyncClusterWire(SlotMap):
    """Runs script calls on Redis Cluster: each in the batches of an :class:`AsyncWire` of
    the master that serves its slot, as FCALL (the same protocol for every master).

    redis-py's asyncio cluster client keeps the topology (the slot map, each node's
    settings); it reads the slot map on the first call, under the decision's timeout.
    Its command path is not used: its CLUSTERDOWN handling waits and re-reads the slot
    map inline, which can hold a decision past its timeout. What a redirection means is
    the protocol's (``_protocol.redirection``); here:

    - MOVED updates the slot map and the call goes to the new owner's batch; ASK sends
      ASKING and the call, on their own, to the importing node; both count against the
      decision's deadline;
    - TRYAGAIN (the call's keys split between two nodes mid-migration) is retried until
      the deadline, with short pauses, then raised;
    - CLUSTERDOWN, a failed connection and a timeout are raised at once, and the slot map
      is read again in the background, so that the calls after a failover find the new
      master while the breaker answers for the old one.

    Like every wire it tells no breaker: each call's outcome (the slot map's failure to
    be read, a call redirected past its deadline or too often) is its caller's, and the
    decider tells the breaker of the master the call was routed to; outcomes whose
    callers stopped waiting go to ``late``.
    """

    def __init__(
        self,
        target: Target[AsyncClient],
        late: Late,
        *,
        max_connections: int,
        timeout: float,
    ) -> None:
        """Send to the cluster of ``target``, whose slot map is read on the first call."""
        self._factory = target.factory
        self._client: redis.asyncio.cluster.RedisCluster | None = None
        self._nodes: Any = None
        self.protocol = ScriptProtocol()
        self._late = late
        self._max = max_connections
        self._timeout = timeout
        self._wires: dict[str, AsyncWire] = {}
        self._connecting: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self.closed = False

    # -- the transport --------------------------------------------------------------------

    def client(self) -> redis.asyncio.cluster.RedisCluster:
        """The cluster client (made now if not yet: it reads the slot map when told to)."""
        if self._client is None:
            if self.closed:
                raise ApplimitError(CLOSED)
            client = self._factory()
            assert isinstance(client, redis.asyncio.cluster.RedisCluster)
            self._client = client
        return self._client

    async def run(self, calls: Sequence[ScriptCall]) -> Replies:
        """The outcome of each call, in order; together they keep to the timeout."""
        if self.closed:
            raise ApplimitError(CLOSED)
        if self._nodes is None:
            failure = await self._connect()
            if failure is not None:
                return [failure]
        deadline = asyncio.get_running_loop().time() + self._timeout
        if len(calls) == 1:
            try:
                return [await self._call(calls[0], deadline)]
            except REDIS_FAILURES as error:
                return [error]
        # One call per cluster slot, concurrently: still one round trip of time.
        outcomes = await asyncio.gather(
            *(self._call(call, deadline) for call in calls), return_exceptions=True
        )
        return _failures_only(outcomes)

    async def delete(self, keys: Sequence[str]) -> None:
        """DEL ``keys`` (a reset; one hash tag, so one slot) through the cluster client."""
        if self.closed:
            raise ApplimitError(CLOSED)
        await self.client().delete(*keys)

    async def close(self) -> None:
        """Close every master's pool and the cluster client."""
        self.closed = True
        wires, self._wires = list(self._wires.values()), {}
        for task in (self._connecting, self._refreshing):
            if task is not None:
                task.cancel()
        for wire in wires:
            await wire.close()
        client, self._client = self._client, None
        if client is not None:
            await _clients.close_async(client, own_sentinels=False)

    # -- calls ----------------------------------------------------------------------------

    async def _connect(self) -> BaseException | None:
        """Read the slot map (the first call): None when done, else the failure.

        The reading is one task, which the callers await within their timeout: one that
        takes longer goes on for the next callers rather than starting over for each.
        """
        task = self._connecting
        if task is None:
            task = self._connecting = asyncio.get_running_loop().create_task(self._read_map())
            task.add_done_callback(_retrieved)
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.shield(task)
        except REDIS_FAILURES as error:
            return error
        return None

    async def _read_map(self) -> None:
        try:
            client = self.client()
            await client.initialize()
            self._nodes = client.nodes_manager
        finally:
            # Done, or failed: the next caller reads it again (or finds it read).
            self._connecting = None

    async def _call(self, call: ScriptCall, deadline: float) -> object:
        """The call's reply, from the master of its slot, following redirections until
        ``deadline`` (the event loop's time)."""
        assert call.slot is not None
        loop = asyncio.get_running_loop()
        node = self._master(call.slot)
        asking = False
        for attempt in range(MAX_REDIRECTIONS):
            try:
                wire = self._wire(node)
                if not attempt:
                    # The batch's deadline is the decision's.
                    return _raised((await wire.submit(call))[0])
                async with asyncio.timeout_at(deadline):
                    if asking:
                        return await wire.alone(call, asking=True)
                    return _raised((await wire.submit(call))[0])
            except REDIS_FAILURES as error:
                node, asking = await self._follow(error, call.slot, node, deadline)
            if loop.time() > deadline:
                raise TimeoutError("the decision's deadline passed following cluster redirections")
        raise too_many_redirections()

    async def _follow(
        self, error: BaseException, slot: int, node: Any, deadline: float
    ) -> tuple[Any, bool]:
        """Where a call goes after ``error`` met it at ``node`` (and whether with ASKING);
        raises when it goes nowhere."""
        if isinstance(error, TimeoutError):
            # The callers' deadline, or the decision's after a redirection.
            raise error
        step = redirection(error)
        if step is Redirect.MOVED:
            assert isinstance(error, redis.exceptions.MovedError)
            await self._nodes.move_slot(error)
            # Where the answer says, not where the map says: a refresh running meanwhile
            # may have read a node that has not heard of the move yet.
            moved = self._nodes.get_node(host=error.host, port=error.port)
            if moved is not None:
                return moved, False
            return self._master(slot), False
        if step is Redirect.ASK:
            assert isinstance(error, redis.exceptions.AskError)
            found = self._nodes.get_node(host=error.host, port=error.port)
            if found is None:
                self.refresh()
                raise error
            return found, True
        if step is Redirect.TRYAGAIN:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise error
            # The slot's keys are moving one by one; wait a little for this call's.
            await asyncio.sleep(min(TRYAGAIN_PAUSE, left))
            return self._master(slot), False
        # The call's own failure.
        if step is Redirect.REFRESH:
            self.refresh(node.name)
        raise error

    def _wire(self, node: Any) -> AsyncWire:
        wire = self._wires.get(node.name)
        if wire is None:
            if self.closed:
                raise redis.exceptions.ConnectionError("the limiter was closed")
            settings = dict(node.connection_kwargs)
            settings.pop("retry", None)
            # The node's settings (address, credentials, TLS, timeouts) in a pool of the
            # limiter's own, which waits for a free connection at most the timeout.
            pool = redis.asyncio.BlockingConnectionPool(
                connection_class=node.connection_class,
                max_connections=self._max,
                timeout=self._timeout,
                retry=_clients.async_retry(),
                **settings,
            )
            wire = AsyncWire(
                pool,
                self._late,
                timeout=self._timeout,
                protocol=self.protocol,
            )
            self._wires[node.name] = wire
        return wire

    # -- topology -------------------------------------------------------------------------

    def refresh(self, failed: str | None = None) -> None:
        """Read the slot map again, in the background (one refresh at a time); ``failed``
        names a node that just failed, asked last."""
        if self._refreshing is not None or self.closed or self._nodes is None:
            return
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh(failed))

    async def _refresh(self, failed: str | None) -> None:
        try:
            try:
                await self._nodes.initialize(last_failed_node_name=failed)
            except Exception as error:
                # A cluster still failing over: the next failed call asks again, and the
                # breaker answers meanwhile.
                logger.debug(
                    "reading the cluster's slot map failed: %s",
                    error,
                    extra={"applimit_event": "slot_map_failed", "error": type(error).__name__},
                )
            known = self._nodes.nodes_cache
            gone = [name for name in self._wires if name not in known]
            for name in gone:
                await self._wires.pop(name).close()
        finally:
            self._refreshing = None


AsyncTransport = AsyncWire | AsyncClusterWire
"""The async limiter's wire: one server, or a cluster."""


def open_async(
    target: Target[AsyncClient], late: Late, *, max_connections: int, timeout: float
) -> AsyncTransport:
    """The async wire to ``target``, built without I/O."""
    if target.cluster:
        return AsyncClusterWire(target, late, max_connections=max_connections, timeout=timeout)
    return AsyncWire(target, late, timeout=timeout)
