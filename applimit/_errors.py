"""Errors of the applimit package.

Exception tree::

    ApplimitError               base of everything applimit raises
    ├── ConfigurationError      the policy or the limiter's options cannot work in the app
    │                           (also a ValueError)
    ├── UnknownLimitError       hit/peek/reset named a limit with no app part (also a LookupError)
    ├── UnknownTierError        a tier the policy does not list (also a LookupError)
    └── InvalidArgumentError    a bad cost, identity or missing client IP (also a ValueError)

Redis failures are never raised to the caller: they become degraded decisions under the
policy's ``on_redis_error`` (see :class:`applimit.Decision`). Programming errors are raised,
since no failure policy can answer a question that has no meaning.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import redis.exceptions as rexc


class ApplimitError(Exception):
    """Base class of the errors raised by applimit."""


class ConfigurationError(ApplimitError, ValueError):
    """The policy or the limiter's options cannot be used; the message says what to change."""


def did_you_mean(given: object, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``known`` to a misspelt name, else ""."""
    if not isinstance(given, str):
        return ""
    close = difflib.get_close_matches(given, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownLimitError(ApplimitError, LookupError):
    """A limit name that the policy does not define with an ``app`` part."""

    def __init__(self, name: str, known: Iterable[str], *, edge_only: bool = False) -> None:
        self.name = name
        self.known = tuple(known)
        listed = ", ".join(repr(k) for k in self.known) or "none"
        if edge_only:
            message = (
                f"limit {name!r} has no app part, so applimit cannot enforce it; add an "
                f"`app:` section to it in the policy, or use one of: {listed}."
            )
        else:
            message = f"the policy has no limit named {name!r}{did_you_mean(name, self.known)}"
            message += f"; its app limits are: {listed}."
        super().__init__(message)

    def __str__(self) -> str:
        # KeyError-like classes quote their message; LookupError does not, keep it readable.
        return str(self.args[0])


class UnknownTierError(ApplimitError, LookupError):
    """A tier name that the policy's ``tiers`` list does not contain."""

    def __init__(self, tier: str, known: Iterable[str]) -> None:
        self.tier = tier
        self.known = tuple(known)
        listed = ", ".join(repr(k) for k in self.known)
        super().__init__(
            f"tier {tier!r} is not in the policy's tiers ({listed}){did_you_mean(tier, self.known)}"
            "; pass one of them, or add "
            f"{tier!r} to `tiers:` in the policy."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidArgumentError(ApplimitError, ValueError):
    """An argument no decision can be made for: the message names it and the fix."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(message)


# What a closed limiter raises when asked to decide (not a Redis failure: a bug in the app).
CLOSED = "this limiter is closed; build a new one to keep deciding."


class DeadlinePassed(TimeoutError):
    """A decision's deadline passed before its answer came: the event loop may have been
    too busy to send the call, or Redis may have stopped answering. It says nothing of
    Redis' health by itself (the socket timeout tells the breaker when Redis is down), so
    the decision follows the failure policy and the breaker is not told."""


class PoolExhausted(Exception):
    """Every connection of the limiter's own pool stayed busy for the whole timeout.

    The app asked more of the limiter at once than ``max_connections`` serves, while Redis
    may be perfectly well: the decision follows the failure policy, but the circuit breaker
    is not told (it is about Redis, not about the app's own concurrency).
    """


# Errors that say nothing about Redis' health: "this one key is in a state the script cannot
# use" (WRONGTYPE, below, and keys in different slots), or a wait for one of the limiter's
# own connections. They make that decision degraded but do not trip the circuit breaker.
_NOT_OUTAGES: tuple[type[BaseException], ...] = (
    rexc.ClusterCrossSlotError,
    PoolExhausted,
    DeadlinePassed,
)

# What a call to Redis may raise that the failure policy answers. RedisClusterException is
# not a RedisError; TimeoutError covers asyncio's deadline; OSError covers socket failures
# that a client let through; PoolExhausted is a wait for the limiter's own connections.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    rexc.RedisError,
    rexc.RedisClusterException,
    TimeoutError,
    OSError,
    PoolExhausted,
)

# Error codes of a server that answers but stores nothing now: out of memory under
# `noeviction`, a replica, a failing RDB save (`stop-writes-on-bgsave-error`), too few
# replicas for `min-replicas-to-write`. Every decision that would write fails alike.
_WRITE_REFUSALS = frozenset({"OOM", "READONLY", "MISCONF", "NOREPLICAS"})


def error_code(error: BaseException) -> str:
    """The code of an error reply (``ERR``, ``OOM``, ``WRONGTYPE``...); "" for other errors.

    redis-py strips the codes it knows from the message (and keeps them as
    ``status_code``); the others stay the message's first word.
    """
    if not isinstance(error, rexc.ResponseError):
        return ""
    if error.status_code:
        return error.status_code
    return str(error).split(" ", 1)[0]


def refuses_writes(error: BaseException) -> bool:
    """True for an error reply saying the server stores nothing now (out of memory,
    read-only, ...): reads still work, so only a call that writes shows it is over."""
    return error_code(error) in _WRITE_REFUSALS


def is_outage(error: BaseException) -> bool:
    """True when ``error`` says Redis is unavailable (counts for the circuit breaker).

    False for an error specific to one key (a value of the wrong type that something else
    wrote under our key, keys in different cluster slots), and for a wait for one of the
    limiter's own connections: Redis is up, and other decisions must not be degraded
    because of it.
    """
    if isinstance(error, _NOT_OUTAGES):
        return False
    return error_code(error) != "WRONGTYPE"
