"""What the Flask and Django helpers share: deciding for a request or for one named limit,
and merging rate-limit headers into a response that may already carry some.

Framework-free, like the rest of :mod:`applimit.web`, whose
:class:`~applimit.web._gate.Gate` turns every decision here into headers or a refusal, so
that the helpers answer exactly as the WSGI middleware does. The helpers themselves only
translate between these values and their framework's request and response objects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._decision import Decision, combine
from .._plan import RequestMatch
from .._sync import Limiter
from ._decorator import RateLimited
from ._gate import Answer, Gate
from ._options import request_cost
from ._request import Caller, RequestInfo, is_preflight

# Structured-field Lists: two sets of items (the request's limits and a view's own limit)
# join into one field value. Every other rate-limit header names a single value.
_LIST_FIELDS = frozenset({"ratelimit-policy", "ratelimit"})


def known_limit(limiter: Limiter, name: str) -> str:
    """``name`` when the policy has an app limit of that name; otherwise the limiter's own
    :class:`~applimit.UnknownLimitError` (the one ``hit`` raises), at start-up."""
    limiter.core.rule(name)
    return name


def limits_to_check(limiter: Limiter, request: RequestInfo) -> RequestMatch | None:
    """The limits the request check applies, or None when it does not apply at all,
    decided before ``identify`` runs; the match also says whether the response's status
    is to be recorded (:func:`record_response`), so the request is matched once.

    As in the WSGI middleware: a CORS preflight is neither counted nor refused, and a
    request that no limit the middleware applies matches (``/healthz``) never reaches the
    app's auth code.
    """
    if is_preflight(request):
        return None
    return limiter.match(request.method, request.path, request.host, request.mount)


def native_cost(cost: int | Callable[[Any], int], request: object, info: RequestInfo) -> int:
    """The cost of a request: ``cost``, or what it returns for the framework's own request
    object, checked as the middleware checks a cost function's answer (a whole number in
    range, or an InvalidArgumentError that names the function)."""
    if not callable(cost):
        return cost
    function = cost
    return request_cost(functools.wraps(function)(lambda _info: function(request)), info)


def identify_safely(
    gate: Gate, request: RequestInfo, identify: Callable[[], Caller | None]
) -> tuple[Caller | None, Answer | None]:
    """Run the app's ``identify`` under the gate's ``on_identify_error``: the caller, or
    the refusal (503) when it raised and the choice is to refuse; ``"raise"`` re-raises."""
    try:
        return identify(), None
    except Exception as error:
        return None, gate.identify_failed(request, error)


def resolve_caller(
    gate: Gate, request: RequestInfo, native: object, identify: Callable[[], Caller | None]
) -> tuple[Caller | None, Answer | None]:
    """The caller of a request the limits apply to, after the app's exemptions, in the
    middleware's order: ``exempt_when`` first (so that a request it spares never reaches
    ``identify``), then ``identify`` under ``on_identify_error``, then ``exempt_caller``
    for an identified caller. ``native`` is what the exemption functions get.

    The second place is None to count the request; :data:`~applimit.web._gate.EXEMPTED` to
    spare it; an answer with a 503 refusal when one of the functions raised and the
    choice is to refuse (``"raise"`` re-raises).
    """
    if gate.exempt_when is not None:
        spared = gate.exempts(request, native)
        if spared is not None:
            return None, spared
    caller, refused = identify_safely(gate, request, identify)
    if refused is not None:
        return None, refused
    if caller is not None and gate.exempt_caller is not None:
        spared = gate.exempts_caller(request, native, caller)
        if spared is not None:
            return caller, spared
    return caller, None


def check_request(
    limiter: Limiter, gate: Gate, request: RequestInfo, caller: Caller | None, cost: int = 1
) -> tuple[Decision, Answer]:
    """Every limit whose ``match:`` applies, decided in one call, as the WSGI middleware
    decides. Redis failures are decided by ``on_redis_error`` inside the limiter; what it
    raises (a bug, a misuse) reaches the framework as any exception of the app does."""
    subject = gate.subject(request, caller)
    decision = limiter.check_request(
        request.method,
        request.path,
        subject.identity,
        tier=subject.tier,
        cost=cost,
        ip=subject.ip,
        host=request.host,
        keys=subject.keys,
        mount=request.mount,
    )
    return decision, gate.answer(decision, subject.tier)


def record_response(
    limiter: Limiter,
    gate: Gate,
    request: RequestInfo,
    caller: Caller | None,
    *,
    cost: int,
    status: int,
) -> Decision:
    """Count a response of ``status`` against the count_when limits that
    :func:`check_request` checked for this request (the second step; see
    ``Limiter.record_request``)."""
    subject = gate.subject(request, caller)
    return limiter.record_request(
        request.method,
        request.path,
        subject.identity,
        status,
        tier=subject.tier,
        cost=cost,
        ip=subject.ip,
        host=request.host,
        keys=subject.keys,
        mount=request.mount,
    )


def counted_later(limiter: Limiter, name: str) -> bool:
    """Whether limit ``name`` has count_when: a decorator that hits it must record the
    response's status afterwards (``record_limit``)."""
    return bool(limiter.core.rule(name).count_when)


def record_limit(
    limiter: Limiter,
    gate: Gate,
    name: str,
    request: RequestInfo,
    caller: Caller | None,
    *,
    cost: int,
    status: int,
) -> Decision:
    """Count a response of ``status`` against the count_when limit ``name`` that
    :func:`hit_limit` checked (the second step; see ``Limiter.record``)."""
    subject = gate.subject(request, caller)
    return limiter.record(
        name,
        subject.identity,
        status,
        tier=subject.tier,
        cost=cost,
        ip=subject.ip,
        keys=subject.keys,
    )


def hit_limit(
    limiter: Limiter,
    gate: Gate,
    name: str,
    request: RequestInfo,
    *,
    caller: Caller | None,
    cost: int,
) -> tuple[Decision, Answer]:
    """One named limit, whatever its ``match:`` says, for a per-view decorator.

    An anonymous caller is counted by client address in the bucket ``check_request`` uses
    for it, as the FastAPI dependency counts it.
    """
    subject = gate.subject(request, caller)
    decision = limiter.hit(
        name, subject.identity, tier=subject.tier, cost=cost, ip=subject.ip, keys=subject.keys
    )
    return decision, gate.answer(decision, subject.tier)


def rate_limited_answer(gate: Gate, error: RateLimited) -> Answer:
    """The refusal for a :class:`~applimit.RateLimited` raised inside a view (a function
    decorated with ``rate_limited``), so that it is a 429 rather than a server error."""
    results = error.decision.results
    tier = results[0].tier if results else gate.lowest_tier
    return gate.answer(error.decision, tier)


def joined(previous: Decision | None, decision: Decision) -> Decision:
    """The Decision a request carries for the app once ``decision`` is made too.

    A request may be decided more than once (the request's check, then a view's own
    limit): the app sees one Decision holding every limit result, denied when any
    enforced one denied and degraded when either was, so ``shadow_denied_by`` names every
    shadow limit that would have refused it.
    """
    if previous is None or not previous.results:
        return decision
    if not decision.results:
        return previous
    return combine(
        (*previous.results, *decision.results), degraded=previous.degraded or decision.degraded
    )


class HeaderMap(Protocol):
    """A response's headers as Flask (werkzeug) and Django both offer them."""

    def __contains__(self, name: str, /) -> bool: ...
    def __getitem__(self, name: str, /) -> str: ...
    def __setitem__(self, name: str, value: str, /) -> None: ...


def merge_headers(headers: HeaderMap, extra: Iterable[tuple[str, str]]) -> None:
    """Add rate-limit headers to a response's headers without losing ones already set.

    ``RateLimit-Policy`` and ``RateLimit`` are Lists, so a second set of items is appended
    to the first; any other header (``X-RateLimit-*``) keeps the value set first (the
    request's decision comes before a view's). ``headers`` must look names up
    case-insensitively, as Flask's and Django's response headers do.
    """
    for name, value in extra:
        if name not in headers:
            headers[name] = value
        elif name.lower() in _LIST_FIELDS:
            headers[name] = f"{headers[name]}, {value}"
