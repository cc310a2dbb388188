"""Replies read from a connection's hiredis reader directly, for the limiter's own wires.

redis-py reads a reply through two or three levels of its own per call (the connection's
``read_response``, then its parser's): it formats the error text it would raise before
reading (``_host_error``), enters a timeout context (asyncio), and checks for client-side
caching and push messages: for the limiter's script calls, on connections of its own, a
measurable share of a decision (docs/benchmarks-compare.md, "Why each speed trick stays").
Here the replies are taken from the parser's hiredis reader with the socket read only when
no whole reply is buffered, which is what redis-py's parser does underneath, and the
failures end as redis-py's would: the connection disconnected and a ``redis.exceptions``
error raised. A push message (RESP3: client tracking, server maintenance notices) goes to
the parser's handler, as redis-py does.

Only redis-py's own hiredis parser is read this way (``direct``); any other parser (a
redis-py whose internals differ, or hiredis missing) is read through ``read_response``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis
import redis.asyncio.connection
import redis.connection

from ._protocol import Replies

_SYNC_PARSER: type | None
_ASYNC_PARSER: type | None
_PUSH: type | None
try:
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
    from redis._parsers.hiredis import _AsyncHiredisParser, _HiredisParser

    _SYNC_PARSER, _ASYNC_PARSER = _HiredisParser, _AsyncHiredisParser
except ImportError:  # pragma: no cover - another redis-py: read through read_response
    _NOT_ENOUGH_DATA = _SYNC_PARSER = _ASYNC_PARSER = None
try:
    import hiredis

    _PUSH = hiredis.PushNotification
except (ImportError, AttributeError):  # no hiredis, or one before 3.2 (no push type)
    _PUSH = None

_CLOSED = "Connection closed by server."


# redis-py's own way to send, sync and asyncio: a connection class that overrides it (to
# count, trace or alter what it sends) is written through it, never directly.
_OWN_SENDS = (
    redis.connection.AbstractConnection.send_packed_command,
    redis.asyncio.connection.AbstractConnection.send_packed_command,
)


def plain_send(connection: Any) -> bool:
    """Whether ``connection``'s class sends as redis-py does (it does not override
    ``send_packed_command``), so that the limiter's wire may write its socket itself."""
    return type(connection).send_packed_command in _OWN_SENDS


def direct(connection: Any) -> bool:
    """Whether ``connection`` (sync or asyncio) has redis-py's hiredis parser, connected."""
    parser = connection._parser
    kind = type(parser)
    if kind is _SYNC_PARSER:
        return parser._reader is not None and parser._sock is not None
    if kind is _ASYNC_PARSER:
        return bool(parser._connected) and isinstance(parser._stream, asyncio.StreamReader)
    return False


def read(connection: Any) -> object:
    """The next reply on a sync ``connection`` whose parser is ``direct``: an error reply
    returned as its exception (not raised); a failure of the connection raised, the
    connection disconnected."""
    parser = connection._parser
    reader = parser._reader
    try:
        while True:
            reply = reader.gets()
            while reply is _NOT_ENOUGH_DATA:
                parser.read_from_socket()
                reply = reader.gets()
            if _PUSH is None or not isinstance(reply, _PUSH):
                break
            _pushed(parser, reply)
    except OSError as error:
        # A socket error the parser does not translate (a reset): redis-py's words.
        connection.disconnect()
        raise redis.exceptions.ConnectionError(
            f"Error while reading from {_where(connection)} : {error.args}"
        ) from error
    except BaseException:
        connection.disconnect()
        raise
    if isinstance(reply, redis.exceptions.ConnectionError):
        connection.disconnect()
        raise reply
    return reply


async def read_async(connection: Any, count: int, replies: Replies) -> None:
    """Read ``count`` replies into ``replies`` on an asyncio ``connection`` whose parser
    is ``direct``: every reply already buffered in one loop, the socket read only when
    none is. Error replies are values; a failure of the connection is raised (the caller
    disconnects it, and bounds the whole read with its timeout)."""
    parser = connection._parser
    reader = parser._reader
    stream = parser._stream
    size = parser._read_size
    gets = reader.gets
    while len(replies) < count:
        reply = gets()
        if type(reply) is list:
            # A script's reply (nearly every one): a push is of its own type.
            replies.append(reply)
        elif reply is _NOT_ENOUGH_DATA:
            try:
                data = await stream.read(size)
            except OSError as error:
                # A reset: redis-py's translation (the deadline is the caller's, outside).
                raise redis.exceptions.ConnectionError(
                    f"Error while reading from socket: {error.args}"
                ) from error
            if not data:
                raise redis.exceptions.ConnectionError(_CLOSED)
            reader.feed(data)
        elif isinstance(reply, redis.exceptions.ConnectionError):
            raise reply
        elif _PUSH is not None and isinstance(reply, _PUSH):
            handle = getattr(parser, "handle_push_response", None)
            if handle is not None:
                await handle(reply)
        else:
            replies.append(reply)


def exchange(connection: Any, sock: Any, packed: bytes, count: int) -> Replies:
    """Write ``packed`` on a sync ``connection`` and read its ``count`` replies, on the
    connection's blocking ``sock`` itself (see ``_wire.py``: its timeouts are the
    kernel's, so a read is one ``recv`` and no ``poll``). Error replies are values; a
    failure of the connection is raised as redis-py raises it (a timeout as its
    ``TimeoutError``), the connection disconnected."""
    parser = connection._parser
    reader = parser._reader
    replies: Replies = []
    doing = "writing to"
    try:
        sock.sendall(packed)
        doing = "reading from"
        while True:
            reply = reader.gets()
            if reply is _NOT_ENOUGH_DATA:
                buffer = parser._buffer
                size = sock.recv_into(buffer)
                if not size:
                    raise redis.exceptions.ConnectionError(_CLOSED)
                reader.feed(buffer, 0, size)
            elif isinstance(reply, redis.exceptions.ConnectionError):
                # What redis-py raises rather than returns (LOADING, a protocol error).
                raise reply
            elif _PUSH is not None and isinstance(reply, _PUSH):
                _pushed(parser, reply)
            else:
                replies.append(reply)
                if len(replies) == count:
                    return replies
    except (BlockingIOError, TimeoutError) as error:
        # EAGAIN: the socket's SO_SNDTIMEO or SO_RCVTIMEO ran out (TimeoutError where
        # redis-py itself has set a timeout on the socket since).
        connection.disconnect()
        raise redis.exceptions.TimeoutError(f"Timeout {doing} socket") from error
    except OSError as error:
        connection.disconnect()
        raise redis.exceptions.ConnectionError(
            f"Error while {doing} {_where(connection)} : {error.args}"
        ) from error
    except BaseException:
        connection.disconnect()
        raise


def _where(connection: Any) -> str:
    """The server's address as redis-py words it: host:port, or a unix socket's path."""
    path = getattr(connection, "path", None)
    if path:
        return str(path)
    return f"{connection.host}:{connection.port}"


def _pushed(parser: Any, reply: object) -> None:
    handle = getattr(parser, "handle_push_response", None)
    if handle is not None:
        handle(reply)
