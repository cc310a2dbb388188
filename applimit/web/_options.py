"""The middleware's options, checked when it is built; a request's cost.

:func:`middleware_gate` checks every option of a middleware (or dependency) in its
constructor, so that a bad option stops the app at start-up with a
:class:`~applimit.ConfigurationError` that names it, rather than failing (or, worse,
passing) on every request later. :func:`request_cost` is a request's cost, from a number
or the app's function of the request.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._arguments import MAX_COST
from .._errors import ConfigurationError, InvalidArgumentError
from ._client_ip import TrustedProxies
from ._gate import ON_IDENTIFY_ERROR, Gate
from ._request import RequestInfo

Cost = Callable[[RequestInfo], int]
"""A request's cost, computed from the request (the middleware's ``cost=`` may be one)."""


def _option_error(owner: str, option: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"{owner} option {option}: {problem}")


def middleware_gate(
    owner: str,
    *,
    tiers: Sequence[str],
    identify: object,
    cost: object,
    trusted_proxies: object,
    behind_cloudflare: object,
    legacy_headers: object,
    problem_type: object,
    on_identify_error: object,
    exempt_when: object = None,
    exempt_caller: object = None,
    refusal: object = None,
) -> Gate:
    """The gate for a middleware (or dependency) called ``owner``, every option checked.

    Called from the constructor, so a mistake stops the app where it is configured, with a
    :class:`~applimit.ConfigurationError` that names the option and the fix, rather than
    failing (or, worse, passing) on every request later.
    """
    if identify is not None and not callable(identify):
        raise _option_error(
            owner, "identify", f"{identify!r} is not callable; pass a function or None."
        )
    if not callable(cost) and (
        isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST
    ):
        raise _option_error(
            owner,
            "cost",
            f"{cost!r} is not a cost; pass a whole number from 1 to {MAX_COST:,}, or a "
            "function of the request that returns one.",
        )
    if isinstance(trusted_proxies, (str, bytes)) or not isinstance(trusted_proxies, Iterable):
        raise _option_error(
            owner,
            "trusted_proxies",
            f"{trusted_proxies!r} is not a list; pass a list such as ['10.0.0.0/8'].",
        )
    entries = list(trusted_proxies)
    if not all(isinstance(entry, str) for entry in entries):
        raise _option_error(
            owner, "trusted_proxies", f"{entries!r} holds a value that is not a str."
        )
    cloudflare = _flag(owner, "behind_cloudflare", behind_cloudflare)
    legacy = _flag(owner, "legacy_headers", legacy_headers)
    if not isinstance(problem_type, str) or not problem_type:
        raise _option_error(
            owner, "problem_type", f"{problem_type!r} is not a URI; pass a non-empty str."
        )
    if on_identify_error not in ON_IDENTIFY_ERROR:
        choices = ", ".join(repr(c) for c in ON_IDENTIFY_ERROR)
        raise _option_error(
            owner, "on_identify_error", f"{on_identify_error!r} is not one of {choices}."
        )
    try:
        proxies = TrustedProxies(entries, behind_cloudflare=cloudflare)
    except ValueError as error:
        raise _option_error(owner, "trusted_proxies", str(error)) from None
    return Gate(
        tiers=tiers,
        proxies=proxies,
        legacy_headers=legacy,
        problem_type=problem_type,
        on_identify_error=on_identify_error,
        exempt_when=_plain_function(
            owner, "exempt_when", exempt_when, "(request, client_ip) -> bool"
        ),
        exempt_caller=_plain_function(
            owner, "exempt_caller", exempt_caller, "(request, caller) -> bool"
        ),
        refusal=_plain_function(
            owner, "refusal", refusal, "(request, refusal) -> (body, content_type) | None"
        ),
    )


def _plain_function(owner: str, option: str, value: object, shape: str) -> Any:
    """``value`` when it is None or a plain (not async) function; else the option's error.

    These functions run inside the decision, which does not await them: a coroutine
    function's answer would be a coroutine, not an answer.
    """
    if value is None:
        return None
    if not callable(value):
        raise _option_error(
            owner, option, f"{value!r} is not callable; pass a function {option}{shape} or None."
        )
    # An object whose __call__ is async is one too.
    if inspect.iscoroutinefunction(value) or inspect.iscoroutinefunction(type(value).__call__):
        raise _option_error(
            owner,
            option,
            f"{getattr(value, '__name__', value)!r} is an async function; pass a plain "
            f"function {option}{shape} (it runs inside the decision, which does not await it).",
        )
    return value


def _flag(owner: str, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _option_error(owner, option, f"{value!r} is not True or False.")
    return value


def request_cost(cost: int | Cost, request: RequestInfo) -> int:
    """The cost of ``request``: ``cost`` itself, or what the function returns for it.

    A function's exceptions are the app's and propagate; a value that is not a cost is an
    :class:`~applimit.InvalidArgumentError` naming the function.
    """
    if not callable(cost):
        return cost
    value = cost(request)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COST:
        raise InvalidArgumentError(
            "cost",
            f"the cost function {getattr(cost, '__name__', cost)!r} returned {value!r} for "
            f"{request.method} {request.path}; return a whole number from 1 to {MAX_COST:,}.",
        )
    return value
