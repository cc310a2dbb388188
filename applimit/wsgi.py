"""WSGI middleware: one shared, exact rate limit in front of any WSGI app (Flask, Django).

::

    from applimit import Limiter
    from applimit.wsgi import RateLimitMiddleware

    limiter = Limiter.from_policy("policy.yaml", redis_url=os.environ["REDIS_URL"])
    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, identify=identify)

Each request is matched against the policy's app limits and every limit that applies is
decided in one Redis call before the app runs; a request no limit matches (and a CORS
preflight) passes straight through, without running ``identify``. A refusal is answered
here; otherwise the app's iterable is returned as it is (never buffered) and the rate-limit
headers are added through ``start_response``. Options are checked when the middleware is
built: a bad one raises :class:`~applimit.ConfigurationError` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from types import TracebackType
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ._errors import ConfigurationError
from ._sync import Limiter
from ._views import check_request
from ._web import (
    PASS,
    QUOTA_EXCEEDED,
    Caller,
    Cost,
    OnIdentifyError,
    Outcome,
    RequestInfo,
    TrustedProxies,
    bad_path,
    identify_sync,
    is_preflight,
    middleware_gate,
    request_cost,
)

__all__ = ["Caller", "RateLimitMiddleware", "RequestInfo", "TrustedProxies"]

logger = logging.getLogger("applimit")

# Where the middleware leaves the Decision of a request it decided, in the WSGI environ, for the
# app (see docs/web.md): a request no limit matches has none.
DECISION_ENVIRON_KEY = "applimit.decision"

OptExcInfo = tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None]
SyncIdentify = Callable[[RequestInfo], "Caller | None"]

_REASONS = {400: "Bad Request", 429: "Too Many Requests", 503: "Service Unavailable"}


class RateLimitMiddleware:
    """Rate-limit every request of a WSGI app with a (sync) ``applimit.Limiter``.

    ``identify(request)`` returns a :class:`Caller` or ``None`` for anonymous callers, who
    are counted by client IP in the lowest tier; it runs only for requests some limit
    matches. ``on_identify_error`` says what an exception from ``identify`` means:
    ``"raise"`` (the default: it propagates), ``"anonymous"`` (logged; counted by IP) or
    ``"refuse"`` (logged; a 503 problem response). ``cost`` is what one request uses, or a
    function of the :class:`RequestInfo` returning it. ``trusted_proxies`` and
    ``behind_cloudflare`` decide how the client IP is read (see :class:`TrustedProxies`);
    ``legacy_headers`` adds the ``X-RateLimit-*`` headers. The limiter itself never makes a
    request fail.
    """

    def __init__(
        self,
        app: WSGIApplication,
        *,
        limiter: Limiter,
        identify: SyncIdentify | None = None,
        on_identify_error: OnIdentifyError = "raise",
        cost: int | Cost = 1,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
    ) -> None:
        """Wrap ``app``; ``limiter`` is an ``applimit.Limiter``."""
        self.app = app
        self.limiter = limiter
        self.identify = identify
        self.cost = cost
        if not isinstance(limiter, Limiter):
            raise ConfigurationError(
                "RateLimitMiddleware option limiter: a WSGI app needs an applimit.Limiter, "
                f"not {type(limiter).__name__}; build it with Limiter.from_policy(...)."
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
        )

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Handle one WSGI request."""
        request = RequestInfo.from_wsgi(environ)
        bad = bad_path(request)
        if bad is not None:
            start_response(f"400 {_REASONS[400]}", list(bad.headers))
            return [bad.body]
        if is_preflight(request) or not self.limiter.matches(
            request.method, request.path, request.host, request.mount
        ):
            return self.app(environ, start_response)
        refused: Outcome | None = None
        try:
            caller = identify_sync(self.identify, request)
        except Exception as error:
            refused = self.gate.identify_failed(request, error)
            caller = None
        if refused is not None:
            outcome = refused
        else:
            outcome = self._check(environ, request, caller, request_cost(self.cost, request))
        if outcome.refusal is not None:
            refusal = outcome.refusal
            start_response(f"{refusal.status} {_REASONS[refusal.status]}", list(refusal.headers))
            return [refusal.body]
        if outcome is PASS or not outcome.headers:
            return self.app(environ, start_response)
        return self.app(environ, _with_headers(start_response, outcome))

    def _check(
        self, environ: WSGIEnvironment, request: RequestInfo, caller: Caller | None, cost: int
    ) -> Outcome:
        """Decide every matching limit in one call; never raise.

        The Decision is left for the app in ``environ["applimit.decision"]``
        (``request.environ`` in Flask): what a shadow limit would have decided, the
        remaining counts, whether Redis answered.
        """
        decision, outcome = check_request(self.limiter, self.gate, request, caller, cost)
        if decision is not None:
            environ[DECISION_ENVIRON_KEY] = decision
        return outcome


def _with_headers(start_response: StartResponse, outcome: Outcome) -> StartResponse:
    extra = list(outcome.headers)

    def start_with_headers(
        status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /
    ) -> Callable[[bytes], object]:
        return start_response(status, [*headers, *extra], exc_info)

    return start_with_headers
