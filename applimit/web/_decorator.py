"""``rate_limited``: a policy limit on a plain function (a task, a CLI command, an RPC handler).

::

    @rate_limited(limiter, "search", identity=lambda user, query: user.id,
                  tier=lambda user, query: user.plan)
    def search(user: User, query: str) -> list[Hit]: ...

Each call hits the named limit for the identity (and tier) computed from the call's own
arguments; an identity of None is an anonymous caller, counted by the address ``ip``
computes (``ip=lambda request: request.client_ip``). A limit that counts by an app key
(``per: org``) takes its value from ``keys`` (``keys=lambda user, query: {"org": user.org}``).
A denied call raises
:class:`RateLimited` without running the function. With a sync ``Limiter`` the function
must be sync, with an ``AsyncLimiter`` async: a blocking Redis call inside a coroutine
would stall its event loop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar, overload

from .._async import AsyncLimiter
from .._decision import Decision, Leased
from .._errors import ApplimitError
from .._sync import Limiter
from ._headers import delay_seconds

P = ParamSpec("P")
R = TypeVar("R")

Tier = str | Callable[..., str | None] | None
Cost = int | Callable[..., int]
Address = Callable[..., str | None] | None
Keys = Callable[..., Mapping[str, str] | None] | None


class RateLimited(ApplimitError):
    """A call refused by a :func:`rate_limited` function; nothing was run or consumed.

    ``decision`` is the limiter's answer; ``retry_after`` is whole seconds, rounded up, as
    a ``Retry-After`` header would say it.
    """

    def __init__(self, name: str, decision: Decision) -> None:
        """Describe the refusal of limit ``name``."""
        self.name = name
        self.decision = decision
        self.retry_after = max(1, delay_seconds(decision.retry_after))
        why = "Redis cannot be reached and it fails closed" if decision.degraded else "exceeded"
        super().__init__(
            f"rate limit {name!r} refuses this call ({why}); retry in {self.retry_after} s."
        )


@overload
def rate_limited(
    limiter: AsyncLimiter,
    name: str,
    *,
    identity: Callable[..., str | None],
    ip: Address = None,
    tier: Tier = None,
    cost: Cost = 1,
    keys: Keys = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]: ...


@overload
def rate_limited(
    limiter: Limiter,
    name: str,
    *,
    identity: Callable[..., str | None],
    ip: Address = None,
    tier: Tier = None,
    cost: Cost = 1,
    keys: Keys = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def rate_limited(
    limiter: AsyncLimiter | Limiter,
    name: str,
    *,
    identity: Callable[..., str | None],
    ip: Address = None,
    tier: Tier = None,
    cost: Cost = 1,
    keys: Keys = None,
) -> Callable[[Callable[P, Any]], Callable[P, Any]]:
    """Decorate a function so that each call hits limit ``name`` first.

    ``identity``, ``ip``, and ``tier`` or ``cost`` when they are callables, receive the
    call's arguments and return the user (None: an anonymous caller), the client address,
    the tier name and the cost. An anonymous caller is counted by its address, in the
    bucket ``check_request`` counts it in, never in a user's; a ``per: ip`` limit counts
    the address ``ip`` returns, and needs ``ip`` (an identity is never taken for an
    address: a user-chosen name could otherwise spend any address's quota). A fixed ``tier`` string
    or ``cost`` may be given instead; ``tier=None`` is the lowest tier. ``keys``, a
    callable, returns the call's app keys (``{"org": ...}``): a ``per: org`` limit needs it,
    and counts a call whose keys lack ``org`` by the address ``ip`` returns. Raises
    :class:`RateLimited` when the limit denies the call.
    """
    if name not in limiter.limits:
        known = ", ".join(repr(n) for n in limiter.limits) or "none"
        raise ValueError(f"the policy has no app limit named {name!r}; its app limits are: {known}")
    if ip is None and any(r.per_ip for r in limiter.compiled.rules if r.name == name):
        raise ValueError(
            f"app limit {name!r} counts per client IP; give ip= (a callable that returns the "
            "client's address from the call's arguments)"
        )
    if any(r.count_when for r in limiter.compiled.rules if r.name == name):
        raise ValueError(
            f"app limit {name!r} has count_when: it counts responses by their status, which a "
            "plain function has none of; call limiter.hit() before the work and "
            "limiter.record() with the outcome's status after it"
        )
    per_key = next((r.per_key for r in limiter.compiled.rules if r.name == name), None)
    if per_key is not None and keys is None:
        raise ValueError(
            f"app limit {name!r} counts per {per_key}; give keys= (a callable that returns "
            f"{{{per_key!r}: value}} from the call's arguments), and ip= for calls without one"
        )

    def arguments(
        args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str | None, str | None, int, str | None, Mapping[str, str] | None]:
        who = identity(*args, **kwargs)
        level = tier(*args, **kwargs) if callable(tier) else tier
        units = cost(*args, **kwargs) if callable(cost) else cost
        address = ip(*args, **kwargs) if ip is not None else None
        named = keys(*args, **kwargs) if keys is not None else None
        return who, level, units, address, named

    def decorate(func: Callable[P, Any]) -> Callable[P, Any]:
        is_async = inspect.iscoroutinefunction(func)
        if isinstance(limiter, AsyncLimiter):
            if not is_async:
                raise TypeError(
                    f"{func.__qualname__} is not async, but the limiter is an AsyncLimiter; "
                    "use a Limiter for plain functions"
                )

            @functools.wraps(func)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                who, level, units, address, named = arguments(args, kwargs)
                decision = await limiter.hit(
                    name, who, tier=level, cost=units, ip=address, keys=named
                )
                if not decision.allowed:
                    raise RateLimited(name, decision)
                if type(decision) is not Leased:
                    return await func(*args, **kwargs)
                try:
                    return await func(*args, **kwargs)
                finally:
                    # A concurrency limit's slot, held while the call runs.
                    await limiter.release(decision)

            return async_wrapper
        if is_async:
            raise TypeError(
                f"{func.__qualname__} is async, but the limiter is a blocking Limiter, which "
                "would stall the event loop; use an AsyncLimiter"
            )

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            who, level, units, address, named = arguments(args, kwargs)
            decision = limiter.hit(name, who, tier=level, cost=units, ip=address, keys=named)
            if not decision.allowed:
                raise RateLimited(name, decision)
            if type(decision) is not Leased:
                return func(*args, **kwargs)
            try:
                return func(*args, **kwargs)
            finally:
                limiter.release(decision)

        return wrapper

    return decorate
