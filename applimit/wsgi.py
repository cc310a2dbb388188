"""WSGI middleware: one shared, exact rate limit in front of any WSGI app (Flask, Django).

::

    from applimit import Limiter
    from applimit.wsgi import RateLimitMiddleware

    limiter = Limiter.from_policy("policy.yaml", redis_url=os.environ["REDIS_URL"])
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, identify=identify)

Each request is matched against the policy's app limits and every limit that applies is
decided in one Redis call before the app runs. A refusal is answered here; otherwise the
app's iterable is returned as it is (never buffered) and the rate-limit headers are added
through ``start_response``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from types import TracebackType
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ._sync import Limiter
from ._web import (
    PASS,
    QUOTA_EXCEEDED,
    Caller,
    Gate,
    Outcome,
    RequestInfo,
    TrustedProxies,
    identify_sync,
)

__all__ = ["Caller", "RateLimitMiddleware", "RequestInfo", "TrustedProxies"]

logger = logging.getLogger("applimit")

OptExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]
SyncIdentify = Callable[[RequestInfo], "Caller | None"]

_REASONS = {429: "Too Many Requests", 503: "Service Unavailable"}


class RateLimitMiddleware:
    """Rate-limit every request of a WSGI app with a (sync) ``applimit.Limiter``.

    ``identify(request)`` returns a :class:`Caller` or ``None`` for anonymous callers, who
    are counted by client IP in the lowest tier. ``trusted_proxies`` and
    ``behind_cloudflare`` decide how the client IP is read (see :class:`TrustedProxies`);
    ``legacy_headers`` adds the ``X-RateLimit-*`` headers. Exceptions raised by ``identify``
    are the app's and propagate; the limiter itself never makes a request fail.
    """

    def __init__(
        self,
        app: WSGIApplication,
        *,
        limiter: Limiter,
        identify: SyncIdentify | None = None,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
    ) -> None:
        """Wrap ``app``; ``limiter`` is an ``applimit.Limiter``."""
        self.app = app
        self.limiter = limiter
        self.identify = identify
        self.gate = Gate(
            tiers=limiter.tiers,
            proxies=TrustedProxies(trusted_proxies, behind_cloudflare=behind_cloudflare),
            legacy_headers=legacy_headers,
            problem_type=problem_type,
        )

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Handle one WSGI request."""
        request = RequestInfo.from_wsgi(environ)
        caller = identify_sync(self.identify, request)
        outcome = self._check(request, caller)
        if outcome.refusal is not None:
            refusal = outcome.refusal
            start_response(f"{refusal.status} {_REASONS[refusal.status]}", list(refusal.headers))
            return [refusal.body]
        if outcome is PASS or not outcome.headers:
            return self.app(environ, start_response)
        return self.app(environ, _with_headers(start_response, outcome))

    def _check(self, request: RequestInfo, caller: Caller | None) -> Outcome:
        """Decide every matching limit in one call; never raise."""
        subject = self.gate.subject(request, caller)
        try:
            decision = self.limiter.check_request(
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


def _with_headers(start_response: StartResponse, outcome: Outcome) -> StartResponse:
    extra = list(outcome.headers)

    def start_with_headers(
        status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /
    ) -> Callable[[bytes], object]:
        return start_response(status, [*headers, *extra], exc_info)

    return start_with_headers
