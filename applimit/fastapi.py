"""FastAPI integration: a dependency for per-route limits (this module imports FastAPI).

::

    from applimit.fastapi import RateLimit, add_problem_handler

    reports = RateLimit(limiter, "search", identify=identify, cost=5)
    add_problem_handler(app)                       # 429s as application/problem+json

    @app.get("/reports/{name}", dependencies=[Depends(reports)])
    async def report(name: str) -> dict[str, str]: ...

``RateLimit(limiter, "name")`` hits one named limit of the policy on the routes that depend
on it, whatever its ``match`` says; ``RateLimit(limiter)`` checks every limit whose matcher
applies to the request, like the middleware but only on those routes. Do not count one limit
both here and in the middleware: each would consume.

On an allowed request the rate-limit headers are set on the response FastAPI builds from the
endpoint's return value (an endpoint that returns its own ``Response`` object keeps only the
headers it sets itself). A denied request raises :class:`RateLimitExceeded`, an
``HTTPException``: with :func:`add_problem_handler` it is answered with the RFC 9457 body;
without it, FastAPI's default handler answers ``{"detail": ...}`` with the same headers.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from ._async import AsyncLimiter
from ._decision import Decision
from ._errors import ConfigurationError, UnknownLimitError
from ._flow import UNLIMITED
from ._sync import Limiter
from .asgi import DECISION_STATE_KEY
from .web._client_ip import TrustedProxies
from .web._gate import EXEMPT, ExemptCaller, ExemptWhen, Refusal, RenderRefusal, Subject, bad_path
from .web._headers import PROBLEM_JSON, QUOTA_EXCEEDED
from .web._options import middleware_gate
from .web._request import Caller, Identify, RequestInfo, identify_async
from .web._views import joined

__all__ = [
    "Caller",
    "RateLimit",
    "RateLimitExceeded",
    "RequestInfo",
    "TrustedProxies",
    "add_problem_handler",
    "problem_response",
]

_BODY_HEADERS = {"content-type", "content-length"}


class RateLimitExceeded(HTTPException):
    """A request refused by a :class:`RateLimit` dependency (429, or 503 failing closed; 400
    for a path holding a control character, which the middleware refuses too).

    ``decision`` is the limiter's answer and ``refusal`` the response applimit would send:
    status, headers and the problem+json body (:func:`problem_response` builds it).
    """

    def __init__(self, decision: Decision, refusal: Refusal) -> None:
        """Carry the decision and the refusal; headers exclude the body's own headers."""
        headers = {k: v for k, v in refusal.headers if k.lower() not in _BODY_HEADERS}
        super().__init__(
            status_code=refusal.status, detail=HTTPStatus(refusal.status).phrase, headers=headers
        )
        self.decision = decision
        self.refusal = refusal


def problem_response(exc: RateLimitExceeded) -> Response:
    """The refusal as a response: status, rate-limit headers, the problem+json body (or
    the body and content type of the app's ``refusal=`` function)."""
    refusal = exc.refusal
    # Content-Type is the refusal's own; Content-Length is the response's to compute.
    headers = {k: v for k, v in refusal.headers if k.lower() != "content-length"}
    headers.setdefault("Content-Type", PROBLEM_JSON)
    return Response(content=refusal.body, status_code=refusal.status, headers=headers)


def add_problem_handler(app: FastAPI) -> None:
    """Answer :class:`RateLimitExceeded` with the RFC 9457 problem body."""

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RateLimitExceeded)  # registered for this class only
        return problem_response(exc)

    app.add_exception_handler(RateLimitExceeded, handle)


def _refuse_after_response(limiter: AsyncLimiter | Limiter, name: str | None) -> None:
    """A dependency never sees the response, so it can neither count a count_when limit
    nor give a concurrency limit's slot back when the response is sent: say so when it
    is built rather than leave such a limit uncounted or its slots held."""
    needing = [
        rule.name
        for rule in limiter.compiled.rules
        if (rule.count_when or rule.concurrency)
        and (rule.name == name or (name is None and rule.middleware))
    ]
    if needing:
        raise ConfigurationError(
            f"RateLimit cannot apply {', '.join(repr(n) for n in needing)}: a limit with "
            "count_when or concurrency acts after the response (it counts the status, or "
            "gives the slot back), which a dependency never sees. Apply it with "
            "applimit.asgi.RateLimitMiddleware, or call the limiter in the route "
            "(hit() and record(), or hit() and release())."
        )


class RateLimit:
    """A FastAPI dependency that rate-limits the routes depending on it.

    ``limiter`` is an ``AsyncLimiter`` (or a sync ``Limiter``, run in the thread pool).
    ``name`` picks one limit of the policy; None checks every limit whose matcher applies
    to the request. ``identify``, ``trusted_proxies``, ``behind_cloudflare``,
    ``legacy_headers``, ``problem_type``, ``exempt_when``, ``exempt_caller`` and
    ``refusal`` mean what they mean for the middleware (an exception from ``identify`` or
    an exemption function propagates). ``cost`` is how many units one request uses. The
    dependency returns the :class:`~applimit.Decision`: ``applimit.EXEMPT`` for a request
    an exemption spared. The ``refusal=`` body is sent by :func:`add_problem_handler`'s
    handler.

    A named limit applies here even when the policy marks it ``middleware: false``; with no
    name, such limits are left out, as the middleware leaves them out. An unknown ``name``
    raises :class:`~applimit.UnknownLimitError`, a bad option
    :class:`~applimit.ConfigurationError`, both when the dependency is built.
    """

    def __init__(
        self,
        limiter: AsyncLimiter | Limiter,
        name: str | None = None,
        *,
        identify: Identify | None = None,
        cost: int = 1,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
        exempt_when: ExemptWhen | None = None,
        exempt_caller: ExemptCaller | None = None,
        refusal: RenderRefusal | None = None,
    ) -> None:
        """Configure the dependency; an unknown ``name`` fails here, at start-up."""
        if name is not None and name not in limiter.limits:
            # The limiter's own lookup: the same error (and message) as hit() would raise,
            # also for a limit that exists only at the edge.
            limiter.core.rule(name)
            raise UnknownLimitError(name, limiter.limits)  # pragma: no cover - rule() raised
        _refuse_after_response(limiter, name)
        self.limiter = limiter
        self.name = name
        self.identify = identify
        self.cost = cost
        self.gate = middleware_gate(
            "RateLimit",
            tiers=limiter.tiers,
            identify=identify,
            cost=cost,
            trusted_proxies=trusted_proxies,
            behind_cloudflare=behind_cloudflare,
            legacy_headers=legacy_headers,
            problem_type=problem_type,
            on_identify_error="raise",
            exempt_when=exempt_when,
            exempt_caller=exempt_caller,
            refusal=refusal,
        )

    async def __call__(self, request: Request, response: Response) -> Decision:
        """Decide for this request; set the headers, or raise :class:`RateLimitExceeded`."""
        info = RequestInfo.from_asgi(request.scope)
        bad = bad_path(info)
        if bad is not None:
            raise RateLimitExceeded(UNLIMITED, bad)
        if self.name is None and not self.limiter.matches(
            info.method, info.path, info.host, info.mount
        ):
            # No limit covers this request: the app's identify (its auth) is not run, as
            # the middleware does not run it.
            return UNLIMITED
        gate = self.gate
        # on_identify_error is "raise" here: an exemption function's exception propagates,
        # so an exemption's answer is EXEMPTED or None.
        if gate.exempt_when is not None and gate.exempts(info, info) is not None:
            return self._keep(request, EXEMPT)
        caller = await identify_async(self.identify, info)
        if (
            caller is not None
            and gate.exempt_caller is not None
            and gate.exempts_caller(info, info, caller) is not None
        ):
            return self._keep(request, EXEMPT)
        subject = gate.subject(info, caller)
        decision = self._keep(request, await self._limit(info, subject))
        answer = gate.answer(decision, subject.tier)
        if answer.refusal is not None:
            raise RateLimitExceeded(decision, gate.render(answer.refusal, info, info))
        for key, value in answer.headers:
            response.headers[key] = value
        return decision

    @staticmethod
    def _keep(request: Request, decision: Decision) -> Decision:
        """Leave the Decision for the app as the ASGI middleware leaves it (joined with
        its, or with an earlier dependency's, when the request was decided before);
        return ``decision``."""
        request.state.applimit_decision = joined(
            getattr(request.state, DECISION_STATE_KEY, None), decision
        )
        return decision

    async def _limit(self, info: RequestInfo, subject: Subject) -> Decision:
        """The limiter's decision for this request: awaited, or run in the thread pool."""
        limiter, tier, cost, keys = self.limiter, subject.tier, self.cost, subject.keys
        # The call, bound to its arguments: awaited from an AsyncLimiter, run in the thread
        # pool from a Limiter (typed Any: one of two limiters' methods).
        decide: Any
        if self.name is None:
            decide = functools.partial(
                limiter.check_request,
                info.method,
                info.path,
                subject.identity,
                tier=tier,
                cost=cost,
                ip=subject.ip,
                host=info.host,
                keys=keys,
                mount=info.mount,
            )
        else:
            # The user, or (identity None) an anonymous caller counted by address, in the
            # bucket check_request counts it in; a per-IP limit counts the address.
            decide = functools.partial(
                limiter.hit,
                self.name,
                subject.identity,
                tier=tier,
                cost=cost,
                ip=subject.ip,
                keys=keys,
            )
        if isinstance(limiter, AsyncLimiter):
            decision: Decision = await decide()
            return decision
        # A sync Limiter blocks: it decides in the thread pool, off the event loop.
        decided: Decision = await run_in_threadpool(decide)
        return decided
