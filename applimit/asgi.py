"""ASGI middleware: one shared, exact rate limit in front of any ASGI app.

Pure ASGI, so it needs no framework: FastAPI, Starlette, Quart, Django's ASGI handler...::

    from applimit import AsyncLimiter
    from applimit.asgi import RateLimitMiddleware

    limiter = AsyncLimiter.from_policy("policy.yaml", redis_url=os.environ["REDIS_URL"])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, identify=identify)

Each HTTP request is matched against the policy's app limits; every limit that applies is
decided in one Redis call before the app runs. A refusal is answered here (429, or 503 when
Redis is down and the limit fails closed); otherwise the app's response passes through
unbuffered, with the rate-limit headers added to its ``http.response.start`` message.
WebSocket and lifespan scopes pass through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from ._async import AsyncLimiter
from ._web import (
    PASS,
    QUOTA_EXCEEDED,
    Caller,
    Gate,
    Identify,
    Outcome,
    Refusal,
    RequestInfo,
    TrustedProxies,
    identify_async,
)

__all__ = ["Caller", "RateLimitMiddleware", "RequestInfo", "TrustedProxies"]

logger = logging.getLogger("applimit")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Rate-limit every HTTP request of an ASGI app with an ``AsyncLimiter``.

    ``identify(request)`` returns a :class:`Caller` (user id and tier from the app's own
    auth) or ``None`` for anonymous callers, who are counted by client IP in the lowest tier;
    it may be a coroutine function. ``trusted_proxies`` and ``behind_cloudflare`` decide how
    the client IP is read (see :class:`TrustedProxies`); ``legacy_headers`` adds the
    ``X-RateLimit-*`` headers. Exceptions raised by ``identify`` are the app's and propagate;
    the limiter itself never makes a request fail (its failure policy decides).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        limiter: AsyncLimiter,
        identify: Identify | None = None,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
    ) -> None:
        """Wrap ``app``; ``limiter`` is an ``applimit.AsyncLimiter``."""
        self.app = app
        self.limiter = limiter
        self.identify = identify
        self.gate = Gate(
            tiers=limiter.tiers,
            proxies=TrustedProxies(trusted_proxies, behind_cloudflare=behind_cloudflare),
            legacy_headers=legacy_headers,
            problem_type=problem_type,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = RequestInfo.from_asgi(scope)
        caller = await identify_async(self.identify, request)
        outcome = await self._check(request, caller)
        if outcome.refusal is not None:
            await _refuse(send, outcome.refusal)
            return
        if outcome is PASS or not outcome.headers:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _with_headers(send, outcome))

    async def _check(self, request: RequestInfo, caller: Caller | None) -> Outcome:
        """Decide every matching limit in one call; never raise."""
        subject = self.gate.subject(request, caller)
        try:
            decision = await self.limiter.check_request(
                request.method,
                request.path,
                subject.identity,
                tier=subject.tier,
                ip=subject.ip,
                host=request.host,
            )
        except Exception:
            return self.gate.failed()
        return self.gate.outcome(decision, subject.tier)


def _with_headers(send: Send, outcome: Outcome) -> Send:
    """A ``send`` that adds the outcome's headers to the response start, and nothing else.

    Body messages go straight through, so streaming responses stay streaming.
    """
    extra = outcome.raw_headers

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
