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

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from ._decision import Decision, Leased
from ._errors import ConfigurationError
from ._sync import Limiter
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
    bad_path,
)
from .web._headers import QUOTA_EXCEEDED
from .web._options import Cost, middleware_gate, request_cost
from .web._request import Caller, RequestInfo, identify_sync, is_preflight
from .web._views import check_request, record_response

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

    ``exempt_when(request, client_ip) -> bool`` (asked before ``identify``; ``client_ip``
    is the one the limits count) and ``exempt_caller(request, caller) -> bool`` (asked
    after it, for an identified caller) spare a request: neither counted nor refused, no
    rate-limit headers, and ``applimit.EXEMPT`` left as its Decision; an exception from
    either follows ``on_identify_error``. ``refusal(request, default) -> (body,
    content_type) | None`` gives a 429 or 503 the app's own body (status and rate-limit
    headers kept; should it fail, the default body is sent and the error logged).
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
        exempt_when: ExemptWhen | None = None,
        exempt_caller: ExemptCaller | None = None,
        refusal: RenderRefusal | None = None,
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
            exempt_when=exempt_when,
            exempt_caller=exempt_caller,
            refusal=refusal,
        )

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """Handle one WSGI request."""
        request = RequestInfo.from_wsgi(environ)
        bad = bad_path(request)
        if bad is not None:
            return _refuse(start_response, bad)
        matched = (
            None
            if is_preflight(request)
            else self.limiter.match(request.method, request.path, request.host, request.mount)
        )
        if matched is None:
            return self.app(environ, start_response)
        return self._limited(environ, start_response, request, matched.counts_responses)

    def _limited(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: RequestInfo,
        counts: bool,
    ) -> Iterable[bytes]:
        """A request some limit matches: the exemptions, ``identify``, one decision of
        every matching limit, then the app with the headers or the refusal. ``counts``:
        a count_when limit matches, so the response's status is recorded.

        The Decision is left for the app in ``environ["applimit.decision"]``
        (``request.environ`` in Flask): what a shadow limit would have decided, the
        remaining counts, whether Redis answered.
        """
        gate = self.gate
        if gate.exempt_when is not None:
            spared = gate.exempts(request, request)
            if spared is not None:
                return self._spare(environ, start_response, request, spared)
        try:
            caller = identify_sync(self.identify, request)
        except Exception as error:
            failed = gate.identify_failed(request, error)
            if failed is not None:
                return self._spare(environ, start_response, request, failed)
            caller = None
        if caller is not None and gate.exempt_caller is not None:
            spared = gate.exempts_caller(request, request, caller)
            if spared is not None:
                return self._spare(environ, start_response, request, spared)
        cost = request_cost(self.cost, request)
        decision, answer = check_request(self.limiter, gate, request, caller, cost)
        environ[DECISION_ENVIRON_KEY] = decision
        if answer.refusal is not None:
            return _refuse(start_response, gate.render(answer.refusal, request, request))
        if answer is not PASS and answer.headers:
            start_response = _with_headers(start_response, answer)
        return self._admitted(
            environ,
            start_response,
            request,
            caller=caller,
            cost=cost,
            decision=decision,
            counts=counts,
        )

    def _admitted(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: RequestInfo,
        *,
        caller: Caller | None,
        cost: int,
        decision: Decision,
        counts: bool,
    ) -> Iterable[bytes]:
        """The app for an admitted request: its response recorded when a count_when limit
        checked it (``counts``), its concurrency leases held until the server closes the
        body."""
        limiter = self.limiter
        if not counts and type(decision) is not Leased:
            return self.app(environ, start_response)
        run: Callable[[], Iterable[bytes]]
        if counts:
            gate = self.gate
            counted = _Counted(
                start_response,
                lambda status: record_response(
                    limiter, gate, request, caller, cost=cost, status=status
                ),
            )
            run = functools.partial(counted.run, self.app, environ)
        else:
            run = functools.partial(self.app, environ, start_response)
        return _held(run, decision, limiter) if type(decision) is Leased else run()

    def _spare(
        self,
        environ: WSGIEnvironment,
        start_response: StartResponse,
        request: RequestInfo,
        spared: Answer,
    ) -> Iterable[bytes]:
        """An exemption's answer: the app, uncounted and without headers, with
        ``applimit.EXEMPT`` as the Decision; or the 503 of a failing ``identify`` or
        exemption function under ``on_identify_error="refuse"``."""
        if spared.refusal is not None:
            return _refuse(start_response, self.gate.render(spared.refusal, request, request))
        environ[DECISION_ENVIRON_KEY] = EXEMPT
        return self.app(environ, start_response)


def _refuse(start_response: StartResponse, refusal: Refusal) -> list[bytes]:
    start_response(f"{refusal.status} {_REASONS[refusal.status]}", list(refusal.headers))
    return [refusal.body]


def _with_headers(start_response: StartResponse, answer: Answer) -> StartResponse:
    extra = list(answer.headers)

    def start_with_headers(
        status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /
    ) -> Callable[[bytes], object]:
        return start_response(status, [*headers, *extra], exc_info)

    return start_with_headers


class _Counted:
    """The app run for a request a count_when limit checked: its response's status is
    recorded (``record_response``) when the app starts the response, before the server
    sends it, so that a client's next request already sees the count. An app that raises
    before starting a response counts as 500, as the server answers it."""

    __slots__ = ("record", "start_response", "started")

    def __init__(self, start_response: StartResponse, record: Callable[[int], object]) -> None:
        self.start_response = start_response
        self.record = record
        self.started = False

    def run(self, app: WSGIApplication, environ: WSGIEnvironment) -> Iterable[bytes]:
        try:
            body = app(environ, self.start)
        except Exception:
            self._failed()
            raise
        if self.started:
            return body
        # A generator app starts its response on its first iteration.
        return self._body(body)

    def start(
        self, status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None, /
    ) -> Callable[[bytes], object]:
        if not self.started:
            self.started = True
            self.record(_status_code(status))
        return self.start_response(status, headers, exc_info)

    def _failed(self) -> None:
        if not self.started:
            self.started = True
            self.record(500)

    def _body(self, body: Iterable[bytes]) -> Iterator[bytes]:
        try:
            yield from body
        except Exception:
            self._failed()
            raise
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def _status_code(status: str) -> int:
    """The code of a WSGI status line ("401 Unauthorized"); 500 for one that has none."""
    code = status[:3]
    return int(code) if code.isdigit() and 100 <= int(code) <= 599 else 500


def _held(
    run: Callable[[], Iterable[bytes]], decision: Decision, limiter: Limiter
) -> Iterable[bytes]:
    """The app's response to a request holding concurrency leases: given back when the
    server closes the body (PEP 3333: after the last byte, or on a disconnect), or at once
    when the app raises."""
    try:
        body = run()
    except BaseException:
        limiter.release(decision)
        raise
    return _Releasing(body, lambda: limiter.release(decision))


class _Releasing:
    """A response body that gives the request's leases back when it is closed."""

    __slots__ = ("body", "release", "released")

    def __init__(self, body: Iterable[bytes], release: Callable[[], None]) -> None:
        self.body = body
        self.release = release
        self.released = False

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.body)

    def close(self) -> None:
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            if not self.released:
                self.released = True
                self.release()
