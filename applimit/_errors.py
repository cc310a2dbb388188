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

from collections.abc import Iterable

import redis.exceptions as rexc


class ApplimitError(Exception):
    """Base class of the errors raised by applimit."""


class ConfigurationError(ApplimitError, ValueError):
    """The policy or the limiter's options cannot be used; the message says what to change."""


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
            message = f"the policy has no limit named {name!r}; its app limits are: {listed}."
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
            f"tier {tier!r} is not in the policy's tiers ({listed}); pass one of them, or add "
            f"{tier!r} to `tiers:` in the policy."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidArgumentError(ApplimitError, ValueError):
    """An argument no decision can be made for: the message names it and the fix."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(message)


# Errors that mean "this one key is in a state the script cannot use" rather than "Redis is
# unavailable": they make that decision degraded but do not trip the circuit breaker.
_KEY_ERRORS: tuple[type[BaseException], ...] = (rexc.ClusterCrossSlotError,)

# What a call to Redis may raise that the failure policy answers. RedisClusterException is
# not a RedisError; TimeoutError covers asyncio's deadline; OSError covers socket failures
# that a client let through.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    rexc.RedisError,
    rexc.RedisClusterException,
    TimeoutError,
    OSError,
)


def is_outage(error: BaseException) -> bool:
    """True when ``error`` says Redis is unavailable (counts for the circuit breaker).

    False for an error specific to one key (a value of the wrong type that something else
    wrote under our key, keys in different cluster slots): Redis is up, and other
    decisions must not be degraded because of it.
    """
    if isinstance(error, _KEY_ERRORS):
        return False
    return not (isinstance(error, rexc.ResponseError) and str(error).startswith("WRONGTYPE"))
