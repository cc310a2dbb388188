"""The wire protocol of the limiter's script calls: what a reply means, and what to send next.

No I/O here. The wires (``_wire.py`` blocking, ``_awire.py`` asyncio) write the bytes
``_calls.py`` packs and hand back the replies they read, error replies as exception
values; what to send next, and what an error reply means, is decided here once for all of
them: standalone and Redis Cluster, sync and async alike.

The script runs as an FCALL of the limiter's Redis Functions library (``_script.py``). A
server without the library answers "Function not found": the library is loaded
(FUNCTION LOAD) and the calls sent again, in one write. Where Redis refuses Functions
(before 7, an ACL without FCALL or FUNCTION LOAD, a proxy that does not pass them on) the
protocol says so once and uses EVALSHA from then on, EVAL for the calls at hand; an
EVALSHA answered NOSCRIPT (a restarted or flushed server) is sent again as EVAL, which
caches the script again. :class:`ScriptProtocol` holds that one bit of state, per server
(or per cluster); :meth:`ScriptProtocol.recover` is the exchange after an error reply, as
a generator that yields each :class:`Step` to send and receives its replies.

On Redis Cluster, :func:`redirection` says what an error reply means for the call's way
to its keys: MOVED (the slot has a new owner), ASK (send ASKING and the call to the
importing node), TRYAGAIN (the call's keys are split mid-migration) or a sign that the
slot map is out of date.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Generator, Sequence
from typing import Any

import redis.exceptions

from ._calls import EVAL, EVALSHA, FCALL, LOAD, ScriptCall, Write, pack_calls
from ._errors import error_code

logger = logging.getLogger("applimit")

# The replies of one write, in order: a value, or the error reply as an exception.
Replies = list[object]

_LIST = frozenset((list,))


def only_lists(replies: Replies) -> bool:
    """True when every reply is a plain list (a script's reply: nearly always), checked in
    one C loop rather than one isinstance per reply."""
    return _LIST.issuperset(map(type, replies))


def unpair(raw: Replies) -> Replies:
    """The calls' replies from a write that sent ASKING before each call: the call's own
    reply, or ASKING's when that was refused (then the call's is moot)."""
    out: Replies = []
    for index in range(0, len(raw), 2):
        first = raw[index]
        out.append(first if isinstance(first, BaseException) else raw[index + 1])
    return out


# --- what an error reply means -----------------------------------------------------------


def function_missing(reply: object) -> bool:
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


def refused(reply: object) -> bool:
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


def loaded(reply: object) -> bool | None:
    """FUNCTION LOAD's reply: True loaded (or another caller did), False refused, None
    any other error (the calls it was for fail with it)."""
    if not isinstance(reply, BaseException):
        return True
    if isinstance(reply, redis.exceptions.ResponseError) and "already exists" in str(reply):
        return True
    return False if refused(reply) else None


class ScriptProtocol:
    """Which command runs the script on one server (or cluster), and what to send after
    an error reply: FCALL until the server refuses Redis Functions, then EVALSHA for good.

    A wire writes ``pack_calls(calls, protocol.how)``, reads the replies (error replies
    as values) and, unless :meth:`settled` says they are final, runs :meth:`recover`. The
    state is one attribute, read without a lock: two threads that meet a refusal at once
    both fall back, and the log line may appear twice.
    """

    __slots__ = ("how",)

    def __init__(self, *, functions: bool = True) -> None:
        """Start with FCALL, or (``functions`` False) with EVALSHA, where Functions are
        known not to be used."""
        self.how = FCALL if functions else EVALSHA

    @property
    def functions(self) -> bool:
        """True while the script runs as a Redis Functions call."""
        return self.how is FCALL

    def refuse(self, reply: object) -> None:
        """The server refused Redis Functions (``reply`` says how): EVALSHA from now on."""
        if self.how is FCALL:
            self.how = EVALSHA
            logger.info(
                "Redis refused Redis Functions (%s); the limiter runs its script with "
                "EVALSHA instead, which costs about 2 µs more per decision in Redis.",
                reply,
                extra={"applimit_event": "functions_refused"},
            )

    @staticmethod
    def settled(replies: Replies) -> bool:
        """True when no reply calls for another command (the common case: no error)."""
        if only_lists(replies):
            return True
        for reply in replies:
            if isinstance(reply, redis.exceptions.ResponseError) and (
                isinstance(reply, redis.exceptions.NoScriptError)
                or function_missing(reply)
                or refused(reply)
            ):
                return False
        return True

    def recover(self, how: bytes, replies: Replies) -> Generator[Step, Replies, None]:
        """After calls were sent with ``how`` and got ``replies``: yields each
        :class:`Step` that redoes the calls whose replies asked for another command,
        receiving that step's replies (:meth:`Step.write` says which), and puts the new
        replies in ``replies`` (in place).

        - "Function not found": the library and those calls again, in one write; where
          the load is refused, EVALSHA from now on and those calls with EVAL; where it
          fails otherwise, the calls fail with its error.
        - FCALL refused: EVALSHA from now on, those calls with EVAL.
        - NOSCRIPT after EVALSHA: those calls with EVAL, which caches the script again.
        """
        if how is FCALL:
            redo = [i for i, r in enumerate(replies) if function_missing(r) or refused(r)]
            refusal = next((replies[i] for i in redo if refused(replies[i])), None)
            if redo and refusal is None:
                again = yield Step(FCALL, redo, load=True)
                outcome = loaded(again[0])
                if outcome is None:
                    for index in redo:
                        replies[index] = again[0]
                elif outcome:
                    _replace(replies, redo, again[1:])
                else:
                    refusal = again[0]
            if refusal is not None:
                self.refuse(refusal)
                _replace(replies, redo, (yield Step(EVAL, redo)))
        missing = [
            i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)
        ]
        if missing:
            _replace(replies, missing, (yield Step(EVAL, missing)))


class Step:
    """One write of a recovery: the calls at ``indices`` sent with ``how``, after
    FUNCTION LOAD when ``load``. Its replies, as sent back to the recovery: the load's
    first (if any), then one per call, ASKING's already taken out (see :func:`unpair`)."""

    __slots__ = ("how", "indices", "load")

    def __init__(self, how: bytes, indices: list[int], *, load: bool = False) -> None:
        self.how = how
        self.indices = indices
        self.load = load

    def write(self, calls: Sequence[ScriptCall], *, asking: bool = False) -> Write:
        """The step as one write for a wire that packs its own commands."""
        packed, count = pack_calls([calls[i] for i in self.indices], self.how, asking=asking)
        if self.load:
            return LOAD + packed, 1 + count
        return packed, count

    def replies(self, raw: Replies, *, asking: bool = False) -> Replies:
        """The step's replies, from what was read for :meth:`write`."""
        if not asking:
            return raw
        if self.load:
            return [raw[0], *unpair(raw[1:])]
        return unpair(raw)


def _replace(replies: Replies, indices: list[int], again: Replies) -> None:
    """The replies of a step that redid ``indices``, in their places."""
    for index, reply in zip(indices, again, strict=True):
        replies[index] = reply


# --- Redis Cluster -----------------------------------------------------------------------

# At most this many MOVED/ASK/TRYAGAIN answers are followed for one call (redis-py: 16).
MAX_REDIRECTIONS = 8
# How long a call waits before it asks again after TRYAGAIN.
TRYAGAIN_PAUSE = 0.005


class Redirect(enum.Enum):
    """What an error reply (or a failure) means for a call's way to its slot's keys."""

    MOVED = "moved"  # the slot has a new owner: update the slot map, call it
    ASK = "ask"  # the slot is moving: ASKING and the call to the importing node
    TRYAGAIN = "tryagain"  # the call's keys are split mid-migration: ask again shortly
    REFRESH = "refresh"  # the slot map may be out of date: read it again, and fail
    FAIL = "fail"  # the call's own failure


# Failures after which the slot map may be out of date.
_TOPOLOGY_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
    OSError,  # with the builtin TimeoutError
)


def redirection(error: BaseException) -> Redirect:
    """What ``error``, met by a call on a cluster node, means for the call."""
    if isinstance(error, redis.exceptions.MovedError):
        return Redirect.MOVED
    if isinstance(error, redis.exceptions.AskError):
        return Redirect.ASK
    if isinstance(error, redis.exceptions.TryAgainError):
        return Redirect.TRYAGAIN
    if isinstance(error, _TOPOLOGY_ERRORS):
        return Redirect.REFRESH
    return Redirect.FAIL


def redirected(error: BaseException) -> bool:
    """True when ``error`` sends the call elsewhere (MOVED, ASK, TRYAGAIN): the node
    answered, so it says nothing of the node's health."""
    return isinstance(
        error,
        (redis.exceptions.AskError, redis.exceptions.TryAgainError),  # MovedError is an AskError
    )


def too_many_redirections() -> redis.exceptions.ClusterError:
    """The error of a call redirected :data:`MAX_REDIRECTIONS` times."""
    return redis.exceptions.ClusterError(
        f"more than {MAX_REDIRECTIONS} redirections for one call; the cluster's slots "
        "are moving faster than they can be followed"
    )


class OneServer:
    """What a standalone wire (sync and async) says of slots: nothing, one server."""

    @staticmethod
    def route(slot: int) -> str | None:
        """One server: no node to name."""
        return None

    @staticmethod
    def serving_nodes() -> set[str] | None:
        """One server: no slot map."""
        return None


class SlotMap(ABC):
    """What the cluster wires (sync and async) read from the slot map that redis-py's
    cluster client keeps (``_nodes``, its NodesManager; None until it is first read).
    Each wire reads the map again its own way (:meth:`refresh`)."""

    _nodes: Any = None

    @abstractmethod
    def refresh(self, failed: str | None = None) -> None:
        """Read the slot map again, in the background; ``failed`` names a node that just
        failed, asked last."""
        ...

    def route(self, slot: int) -> str | None:
        """The name (host:port) of the master serving ``slot``; None before the slot map
        was read, or while it is being rebuilt."""
        if self._nodes is None:
            return None
        try:
            return str(self._master(slot).name)
        except (redis.exceptions.RedisClusterException, LookupError, TypeError):
            return None

    def serving_nodes(self) -> set[str] | None:
        """The masters in the slot map (None before it was read)."""
        nodes = self._nodes
        if nodes is None:
            return None
        return {str(node.name) for node in nodes.get_nodes_by_server_type("primary")}

    def _master(self, slot: int) -> Any:
        try:
            return self._nodes.get_node_from_slot(slot)
        except redis.exceptions.SlotNotCoveredError:
            self.refresh()
            raise
