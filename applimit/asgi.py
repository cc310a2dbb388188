"""ASGI middleware: one shared, exact rate limit in front of any ASGI app.

Pure ASGI, so it needs no framework: FastAPI, Starlette, Quart, Django's ASGI handler...::

    from applimit import AsyncLimiter
    from applimit.asgi import RateLimitMiddleware

    limiter = AsyncLimiter.from_policy("policy.yaml", redis_url=os.environ["REDIS_URL"])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, identify=identify)

Each HTTP request is matched against the policy's app limits; every limit that applies is
decided in one Redis call before the app runs. A request no limit matches passes straight
through, without running ``identify``. A refusal is answered here (429, or 503 when Redis is
down and the limit fails closed); otherwise the app's response passes through unbuffered,
with the rate-limit headers added to its ``http.response.start`` message. WebSocket and
lifespan scopes pass through untouched, and so do CORS preflights.

Options are checked when the middleware is built. Starlette and FastAPI build it on their
first call, the lifespan start-up under a server such as uvicorn: a bad option then fails
that start-up with the message (uvicorn prints it and exits) instead of failing every
request.

A refusal carries the CORS headers of a Starlette ``CORSMiddleware`` whichever order the
two are added in: when the CORS middleware is inside this one, the refusal is sent through
a copy of it (docs/web.md, "CORS").
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ._async import AsyncLimiter
from ._decision import Leased
from ._errors import ConfigurationError
from .web._client_ip import TrustedProxies
from .web._gate import (
    EXEMPT,
    PASS,
    Answer,
    ExemptCaller,
    ExemptWhen,
    OnIdentifyError,
    Refusal,
    RenderRefusal,
    Subject,
    bad_path,
)
from .web._headers import QUOTA_EXCEEDED
from .web._options import Cost, middleware_gate, request_cost
from .web._request import Caller, Identify, RequestInfo, identified, is_preflight

__all__ = ["Caller", "RateLimitMiddleware", "RequestInfo", "TrustedProxies"]

logger = logging.getLogger("applimit")

# Where the middleware leaves the Decision of a request it decided, in scope["state"], for the
# app (see docs/web.md): a request no limit matches has none.
DECISION_STATE_KEY = "applimit_decision"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# How deep to look through wrapped apps (``.app``) for a CORS middleware.
MAX_INNER_APPS = 32


class RateLimitMiddleware:
    """Rate-limit every HTTP request of an ASGI app with an ``AsyncLimiter``.

    ``identify(request)`` returns a :class:`Caller` (user id and tier from the app's own
    auth) or ``None`` for anonymous callers, who are counted by client IP in the lowest tier;
    it may be a coroutine function, and it runs only for requests some limit matches.
    ``on_identify_error`` says what an exception from ``identify`` means: ``"raise"`` (the
    default: it propagates, a 500), ``"anonymous"`` (logged; the caller is counted by IP) or
    ``"refuse"`` (logged; a 503 problem response, nothing counted). ``cost`` is what one
    request uses, or a function of the :class:`RequestInfo` returning it. ``trusted_proxies``
    and ``behind_cloudflare`` decide how the client IP is read (see
    :class:`TrustedProxies`); ``legacy_headers`` adds the ``X-RateLimit-*`` headers. The
    limiter itself never makes a request fail (its failure policy decides).

    ``exempt_when(request, client_ip) -> bool`` (asked before ``identify``; ``client_ip``
    is the one the limits count) and ``exempt_caller(request, caller) -> bool`` (asked
    after it, for an identified caller) spare a request: neither counted nor refused, no
    rate-limit headers, and ``applimit.EXEMPT`` left as its Decision; an exception from
    either follows ``on_identify_error``. ``refusal(request, default) -> (body,
    content_type) | None`` gives a 429 or 503 the app's own body (status and rate-limit
    headers kept; should it fail, the default body is sent and the error logged). All
    three are plain functions, even where ``identify`` may be async.

    A bad option raises :class:`~applimit.ConfigurationError` naming it.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: AsyncLimiter,
        identify: Identify | None = None,
        on_identify_error: OnIdentifyError = "raise",
        cost: int | Cost = 1,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
        exempt_when: ExemptWhen | None = None,
        exempt_caller: ExemptCaller | None = None,
        refusal: RenderRefusal | None = None,
    ) -> None:
        """Wrap ``app``; ``limiter`` is an ``applimit.AsyncLimiter``."""
        self.app = app
        self.limiter = limiter
        self.identify = identify
        self.cost = cost
        self.startup_error: ConfigurationError | None = None
        try:
            if not isinstance(limiter, AsyncLimiter):
                raise ConfigurationError(
                    "RateLimitMiddleware option limiter: an ASGI app needs an "
                    f"applimit.AsyncLimiter, not {type(limiter).__name__}; build it with "
                    "AsyncLimiter.from_policy(...)."
                )
            self.gate = middleware_gate(
                "RateLimitMiddleware",
                tiers=limiter.tiers,
                identify=identify,
                cost=cost,
                trusted_proxies=trusted_proxies,
                behind_cloudflare=behind_cloudflare,
                legacy_headers=legacy_headers,
                problem_type=problem_type,
                on_identify_error=on_identify_error,
                exempt_when=exempt_when,
                exempt_caller=exempt_caller,
                refusal=refusal,
            )
        except ConfigurationError as error:
            # Starlette builds its middleware on the first call, which under uvicorn is
            # the lifespan start-up; raised from there, uvicorn takes the error for "no
            # lifespan support", keeps running and every request fails. Built that way,
            # the error is kept and reported through the lifespan protocol instead.
            if sys._getframe(1).f_code.co_name != "build_middleware_stack":
                raise
            self.startup_error = error
            return
        self._cors = _inner_cors(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if self.startup_error is not None:
            await self._fail(scope, receive, send, self.startup_error)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = RequestInfo.from_asgi(scope)
        bad = bad_path(request)
        if bad is not None:
            await self._refuse(scope, receive, send, bad)
            return
        matched = (
            None
            if is_preflight(request)
            else self.limiter.match(request.method, request.path, request.host, request.mount)
        )
        if matched is None:
            await self.app(scope, receive, send)
            return
        await self._limited(scope, receive, send, request, matched.counts_responses)

    async def _limited(
        self, scope: Scope, receive: Receive, send: Send, request: RequestInfo, counts: bool
    ) -> None:
        """A request some limit matches: the exemptions, ``identify``, one decision of
        every matching limit, then the app with the headers or the refusal. ``counts``:
        a count_when limit matches, so the response's status is recorded.

        The Decision is left for the app in ``scope["state"]["applimit_decision"]``
        (``request.state.applimit_decision`` in Starlette and FastAPI): what a shadow
        limit would have decided, the remaining counts, whether Redis answered.
        """
        gate = self.gate
        if gate.exempt_when is not None:
            spared = gate.exempts(request, request)
            if spared is not None:
                await self._spare(scope, receive, send, request, spared)
                return
        try:
            identify = self.identify
            caller = identify(request) if identify is not None else None
            if caller is not None and type(caller) is not Caller:
                # An async identify's awaitable, or a value web._request checks (and refuses): the
                # usual plain Caller or None needs no coroutine of its own per request.
                caller = await identified(caller)
        except Exception as error:
            failed = gate.identify_failed(request, error)
            if failed is not None:
                await self._spare(scope, receive, send, request, failed)
                return
            caller = None
        if caller is not None and gate.exempt_caller is not None:
            spared = gate.exempts_caller(request, request, caller)
            if spared is not None:
                await self._spare(scope, receive, send, request, spared)
                return
        subject = gate.subject(request, caller)
        cost = request_cost(self.cost, request)
        # Redis failures are decided by on_redis_error inside the limiter; anything it
        # raises is a bug or a misuse, raised to the app rather than taken for an outage.
        decision = await self.limiter.check_request(
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
        scope.setdefault("state", {})[DECISION_STATE_KEY] = decision
        answer = gate.answer(decision, subject.tier)
        recorded = _Recorded(subject, cost) if counts else None
        if type(decision) is Leased:
            # A concurrency limit's lease, held until the app is done with the request
            # (its whole body sent, an error, a disconnect, a cancellation).
            try:
                await self._answer(scope, receive, send, request, answer=answer, recorded=recorded)
            finally:
                await self.limiter.release(decision)
            return
        await self._answer(scope, receive, send, request, answer=answer, recorded=recorded)

    async def _answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request: RequestInfo,
        *,
        answer: Answer,
        recorded: _Recorded | None,
    ) -> None:
        """The refusal, or the app with the answer's headers (and, for a request a
        count_when limit checked, its response recorded for ``recorded``)."""
        if answer.refusal is not None:
            await self._refuse(
                scope, receive, send, self.gate.render(answer.refusal, request, request)
            )
            return
        if answer is not PASS and answer.headers:
            send = _with_headers(send, answer)
        if recorded is not None:
            await self._counted(scope, receive, send, request, recorded)
            return
        await self.app(scope, receive, send)

    async def _counted(
        self, scope: Scope, receive: Receive, send: Send, request: RequestInfo, recorded: _Recorded
    ) -> None:
        """The app for a request a count_when limit checked: the response's status is
        recorded when the app starts the response, before it is sent, so that the
        client's next request already sees the count. An app that raises, or returns,
        without starting a response counts as 500, as the server answers it."""
        limiter = self.limiter
        subject = recorded.subject
        started = False

        async def record(status: int) -> None:
            await limiter.record_request(
                request.method,
                request.path,
                subject.identity,
                status,
                tier=subject.tier,
                cost=recorded.cost,
                ip=subject.ip,
                host=request.host,
                keys=subject.keys,
                mount=request.mount,
            )

        async def send_counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                await record(_status_of(message))
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except Exception:
            if not started:
                started = True
                await record(500)
            raise
        if not started:
            await record(500)

    async def _spare(
        self, scope: Scope, receive: Receive, send: Send, request: RequestInfo, spared: Answer
    ) -> None:
        """An exemption's answer: the app, uncounted and without headers, with
        ``applimit.EXEMPT`` as the Decision; or the 503 of a failing ``identify`` or
        exemption function under ``on_identify_error="refuse"``."""
        if spared.refusal is not None:
            await self._refuse(
                scope, receive, send, self.gate.render(spared.refusal, request, request)
            )
            return
        scope.setdefault("state", {})[DECISION_STATE_KEY] = EXEMPT
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, refusal: Refusal) -> None:
        """Send ``refusal``, through a copy of the inner CORS middleware when there is one,
        so that browser code can read it as it reads the app's own responses."""
        if self._cors is None:
            await _refuse(send, refusal)
            return

        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            await _refuse(send, refusal)

        cors = copy.copy(self._cors)
        cors.app = answer
        await cors(scope, receive, send)

    @staticmethod
    async def _fail(scope: Scope, receive: Receive, send: Send, error: Exception) -> None:
        """Report an option error: a failed lifespan start-up, or the error itself."""
        if scope["type"] != "lifespan":
            raise error
        message = await receive()
        if message["type"] == "lifespan.startup":
            logger.error("%s", error, extra={"applimit_event": "startup_failed"})
            await send({"type": "lifespan.startup.failed", "message": str(error)})


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Who a count_when request's response is recorded for, and at what cost."""

    subject: Subject
    cost: int


def _status_of(message: Message) -> int:
    """The status of an ``http.response.start`` message; 500 for one without a valid one."""
    status = message.get("status")
    return status if type(status) is int and 100 <= status <= 599 else 500


def _inner_cors(app: object) -> Any | None:
    """Starlette's ``CORSMiddleware`` among the apps wrapped inside ``app``, or None.

    Middleware keep the app they wrap as ``.app`` (Starlette's, and this one), and Starlette
    builds the inner ones first, so the chain is complete when this middleware is built.
    """
    try:
        from starlette.middleware.cors import CORSMiddleware
    except ImportError:  # no Starlette, so no Starlette CORS middleware to find
        return None
    current: object = app
    for _ in range(MAX_INNER_APPS):
        if isinstance(current, CORSMiddleware):
            return current
        current = getattr(current, "app", None)
        if current is None:
            return None
    return None


def _with_headers(send: Send, answer: Answer) -> Send:
    """A ``send`` that adds the answer's headers to the response start, and nothing else.

    Body messages go straight through, so streaming responses stay streaming.
    """
    extra = answer.raw_headers

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            message["headers"] = [*message.get("headers", ()), *extra]
        await send(message)

    return send_with_headers


async def _refuse(send: Send, refusal: Refusal) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": refusal.status,
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in refusal.headers
            ],
        }
    )
    await send({"type": "http.response.body", "body": refusal.body, "more_body": False})
