"""Flask integration: an extension, a per-view decorator and the 429 handler (imports Flask).

::

    from applimit import Limiter
    from applimit.flask import Limits

    limiter = Limiter.from_policy("policy.yaml", redis_url=os.environ["REDIS_URL"])
    limits = Limits(app, limiter=limiter, identify=identify)     # or limits.init_app(app)

    @app.get("/reports/<name>")
    @limits.limit("search", cost=5)
    def report(name: str) -> Response: ...

Once installed on an app, every request is checked against each limit whose ``match:``
applies, as the WSGI middleware checks it (``check_requests=False`` leaves that to the
middleware or turns it off), and ``limits.limit(name)`` hits one named limit on one view,
whatever its ``match:`` says. A refusal raises :class:`RateLimitExceeded`, which the
extension's error handler answers exactly as the WSGI middleware would: 429 (503 when a
limit fails closed), ``Retry-After``, ``RateLimit-Policy``/``RateLimit`` and the RFC 9457
problem body. The same handler turns :class:`~applimit.RateLimited`, raised by a function
decorated with ``rate_limited`` inside a view, into that answer instead of a 500.

``@limits.exempt`` leaves a view (``limits.exempt(blueprint)``: a blueprint) out of the
request check; ``exempt_when`` and ``exempt_caller`` spare requests from every check, and
``refusal`` gives the refusals a body of the app's own, as for the WSGI middleware.

The check runs as a ``before_request`` function, so Flask's request context (``flask.g``,
``flask.session``, ``flask.request``) is there for ``identify``; it also means that a
refused request passes through the app's ``after_request`` functions (Flask-CORS adds its
headers to the 429 too). The WSGI middleware, which runs before Flask, is the cheaper
choice when none of that is needed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from flask import Blueprint, Flask, Request, Response, current_app, g, request
from werkzeug.exceptions import HTTPException

from ._decision import Decision, Leased
from ._errors import ConfigurationError
from ._sync import Limiter
from .web._client_ip import TrustedProxies
from .web._decorator import RateLimited
from .web._gate import (
    EXEMPT,
    Answer,
    ExemptCaller,
    ExemptWhen,
    OnIdentifyError,
    Refusal,
    RenderRefusal,
    bad_path,
)
from .web._headers import PROBLEM_JSON, QUOTA_EXCEEDED, delay_seconds, problem_body
from .web._options import Cost as RequestCost
from .web._options import middleware_gate, request_cost
from .web._request import Caller, RequestInfo, identify_sync
from .web._views import (
    check_request,
    counted_later,
    hit_limit,
    joined,
    known_limit,
    limits_to_check,
    merge_headers,
    native_cost,
    rate_limited_answer,
    record_limit,
    record_response,
    resolve_caller,
)
from .wsgi import DECISION_ENVIRON_KEY

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

__all__ = ["Caller", "Limits", "RateLimitExceeded", "RequestInfo", "TrustedProxies"]

P = ParamSpec("P")
R = TypeVar("R")
V = TypeVar("V")

SyncIdentify = Callable[[RequestInfo], "Caller | None"]
Cost = int | Callable[[Request], int]

# Per-request state lives in the WSGI environ: one dict per request, whatever app context
# (tests often push one for a whole block) is active.
_CALLER = "applimit.caller"
_HEADERS = "applimit.headers"
_REFUSED = "applimit.refused"
# A count_when request's (info, caller, cost), left by the check for _add_headers to record.
_RECORD = "applimit.record"
# The (limit, info, caller, cost) of each count_when limit a decorator hit, to record too.
_RECORD_LIMITS = "applimit.record_limits"
# The decisions of the request that hold concurrency leases, to give back (_add_headers).
_LEASES = "applimit.leases"
_BODY_HEADERS = {"content-type", "content-length"}
# The mark Limits.exempt puts on a view; functools.wraps carries it to wrappers.
_EXEMPT_VIEW = "applimit_exempt"


class RateLimitExceeded(HTTPException):
    """A request refused by :class:`Limits` (429, or 503 when a limit fails closed).

    ``refusal`` is the response the WSGI middleware would send (status, headers, problem
    body) and ``decision`` the limiter's answer. Its own ``get_response`` builds that
    response, so it is answered correctly even by an app that catches ``HTTPException``
    and returns ``error.get_response()``.
    """

    def __init__(self, refusal: Refusal, decision: Decision | None = None) -> None:
        """Carry the refusal; ``code`` is its status. ``get_response()`` answers with the
        refusal's own bytes and content type (the app's ``refusal=`` body, if any)."""
        super().__init__(description="Too Many Requests", response=problem_response(refusal))
        self.code = refusal.status
        self.refusal = refusal
        self.decision = decision

    def get_body(
        self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None
    ) -> str:
        """The refusal's body as text (``get_response`` sends its bytes as they are)."""
        return self.refusal.body.decode("utf-8", "replace")

    def get_headers(
        self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None
    ) -> list[tuple[str, str]]:
        """The refusal's headers; the response computes its own Content-Length."""
        return [(k, v) for k, v in self.refusal.headers if k.lower() != "content-length"]


def problem_response(refusal: Refusal) -> Response:
    """A :class:`~applimit.web._gate.Refusal` as a Flask response, with its own content type
    (the problem document's, or the one of the app's ``refusal=`` body)."""
    content_type = PROBLEM_JSON
    for key, value in refusal.headers:
        if key.lower() == "content-type":
            content_type = value
    response = Response(refusal.body, status=refusal.status, content_type=content_type)
    for key, value in refusal.headers:
        if key.lower() not in _BODY_HEADERS:
            response.headers[key] = value
    return response


class Limits:
    """The Flask extension: the policy's limits on every request, per-view limits, 429s.

    ``limiter`` is a (sync) ``applimit.Limiter``. ``identify(request)`` returns a
    :class:`Caller` or ``None`` (anonymous: counted by client IP in the lowest tier); it
    gets the framework-free :class:`RequestInfo`, runs inside Flask's request context, and
    runs at most once per request, and only when a limit applies. ``check_requests`` checks
    every request against the limits whose ``match:`` applies (turn it off when the WSGI
    middleware does that, or to limit named views only); ``cost`` is what one request
    uses there, or a function of the :class:`RequestInfo` returning it. ``on_identify_error``,
    ``trusted_proxies``, ``behind_cloudflare``, ``legacy_headers``, ``problem_type``,
    ``exempt_when``, ``exempt_caller`` and ``refusal`` mean what they mean for the WSGI
    middleware (the exemptions spare a request from the request check and from the views'
    own limits alike); a bad option raises :class:`~applimit.ConfigurationError` here.
    :meth:`exempt` leaves a view, or a blueprint, out of the request check.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        limiter: Limiter,
        identify: SyncIdentify | None = None,
        on_identify_error: OnIdentifyError = "raise",
        cost: int | RequestCost = 1,
        check_requests: bool = True,
        trusted_proxies: Iterable[str] = (),
        behind_cloudflare: bool = False,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
        exempt_when: ExemptWhen | None = None,
        exempt_caller: ExemptCaller | None = None,
        refusal: RenderRefusal | None = None,
    ) -> None:
        """Configure the extension (a bad option fails here); install it when ``app`` is
        given, or later with :meth:`init_app`."""
        if not isinstance(limiter, Limiter):
            raise ConfigurationError(
                "Limits option limiter: a Flask app needs an applimit.Limiter, not "
                f"{type(limiter).__name__}; build it with Limiter.from_policy(...)."
            )
        self.limiter = limiter
        self.identify = identify
        self.check_requests = check_requests
        self.cost = cost
        self.gate = middleware_gate(
            "Limits",
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
        # Set by exempt(): until a view or blueprint is marked, the request check looks
        # for no mark.
        self._exempt_views = False
        self._exempt_blueprints: set[str] = set()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Install the request check, the header hook and the error handlers on ``app``.

        The extension is found again as ``app.extensions["applimit"]``.
        """
        app.extensions["applimit"] = self
        if self.check_requests:
            app.before_request(self._check_request)
        app.after_request(self._add_headers)
        app.teardown_request(self._release_leftovers)
        app.register_error_handler(RateLimitExceeded, self._answer_refusal)
        app.register_error_handler(RateLimited, self._answer_rate_limited)

    def limit(self, name: str, *, cost: Cost = 1) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorate a view so that each request to it hits the policy's limit ``name``.

        The limit is hit whatever its ``match:`` says, by the caller ``identify`` returns
        (an anonymous caller by client IP). ``cost`` is how many units a request uses, or a
        callable that computes them from the ``flask.Request``. An unknown name fails here,
        when the view is defined. A limit marked ``middleware: false`` in the policy is
        applied only here; any other whose ``match:`` covers this view is counted by the
        request check as well, and both would consume.
        """
        known_limit(self.limiter, name)
        if not callable(cost) and (not isinstance(cost, int) or cost < 1):
            raise ValueError(f"cost must be a positive int or a callable, not {cost!r}")

        def decorate(view: Callable[P, R]) -> Callable[P, R]:
            if inspect.iscoroutinefunction(view):

                @functools.wraps(view)
                async def async_view(*args: P.args, **kwargs: P.kwargs) -> Any:
                    self._hit(name, cost)
                    return await view(*args, **kwargs)

                return async_view  # type: ignore[return-value]  # same signature, awaited by Flask

            @functools.wraps(view)
            def limited_view(*args: P.args, **kwargs: P.kwargs) -> R:
                self._hit(name, cost)
                return view(*args, **kwargs)

            return limited_view

        return decorate

    def exempt(self, view: V) -> V:
        """Leave a view (or every view of a ``Blueprint``) out of the request check.

        Decorate the view (``@limits.exempt`` in either order with ``@app.get``), or pass
        a blueprint: ``limits.exempt(admin)``. Its requests are neither counted nor
        refused by the limits whose ``match:`` covers them, get no rate-limit headers,
        and carry ``applimit.EXEMPT`` as their Decision. A limit the view names itself
        (``@limits.limit``) still applies. The WSGI middleware, which runs before Flask
        routes the request, cannot see the mark: use ``exempt_when`` there.
        """
        if isinstance(view, Blueprint):
            self._exempt_blueprints.add(view.name)
        else:
            setattr(view, _EXEMPT_VIEW, True)
        self._exempt_views = True
        return view

    def close(self) -> None:
        """Close the limiter (its Redis connections), for an app's shutdown or a test."""
        self.limiter.close()

    # -- the hooks --------------------------------------------------------------------------

    def _caller(self, info: RequestInfo) -> tuple[Caller | None, bool]:
        """The caller, from ``identify`` once per request, and whether an exemption spares
        the request; a failure that the gate turns into a refusal is raised (again, for
        every check of the request)."""
        environ = request.environ
        found = environ.get(_CALLER)
        if found is None:
            found = environ[_CALLER] = resolve_caller(
                self.gate, info, info, lambda: identify_sync(self.identify, info)
            )
        caller, answer = found
        if answer is not None and answer.refusal is not None:
            raise RateLimitExceeded(self.gate.render(answer.refusal, info, info))
        return caller, answer is not None

    def _check_request(self) -> None:
        info = RequestInfo.from_wsgi(request.environ)
        bad = bad_path(info)
        if bad is not None:
            raise RateLimitExceeded(bad)
        matched = limits_to_check(self.limiter, info)
        if matched is None:
            return
        if self._exempt_views and self._view_is_exempt():
            self._keep(EXEMPT)
            return
        caller, exempt = self._caller(info)
        if exempt:
            self._keep(EXEMPT)
            return
        units = request_cost(self.cost, info)
        decision, answer = check_request(self.limiter, self.gate, info, caller, units)
        self._apply(answer, decision, info)
        if matched.counts_responses:
            # A count_when limit: the response is recorded in _add_headers (Flask runs the
            # after_request hooks for a view's exception too, on its 500).
            request.environ[_RECORD] = (info, caller, units)

    def _view_is_exempt(self) -> bool:
        """Whether :meth:`exempt` marked the view Flask routed the request to, or one of
        its blueprints (a 404 or 405 has no view, and is checked)."""
        endpoint = request.endpoint
        view = current_app.view_functions.get(endpoint) if endpoint else None
        if view is not None and getattr(view, _EXEMPT_VIEW, False) is True:
            return True
        # Nested blueprints are named "parent.child"; exempt() knows the child as "child".
        return any(
            name.rpartition(".")[2] in self._exempt_blueprints for name in request.blueprints
        )

    def _hit(self, name: str, cost: Cost) -> None:
        info = RequestInfo.from_wsgi(request.environ)
        caller, exempt = self._caller(info)
        if exempt:
            self._keep(EXEMPT)
            return
        units = native_cost(cost, request, info)
        decision, answer = hit_limit(self.limiter, self.gate, name, info, caller=caller, cost=units)
        self._apply(answer, decision, info)
        if counted_later(self.limiter, name):
            # Recorded in _add_headers, as the request check's count_when limits are.
            request.environ.setdefault(_RECORD_LIMITS, []).append((name, info, caller, units))

    @staticmethod
    def _keep(decision: Decision) -> None:
        """Leave the Decision for the app as the WSGI middleware leaves it (joined with
        its, when both decide), and in flask.g; g may outlive the request (an app context
        a test keeps), so the environ holds the request's own."""
        environ = request.environ
        kept = environ[DECISION_ENVIRON_KEY] = joined(environ.get(DECISION_ENVIRON_KEY), decision)
        g.applimit_decision = kept

    def _apply(self, answer: Answer, decision: Decision, info: RequestInfo) -> None:
        self._keep(decision)
        if answer.refusal is not None:
            raise RateLimitExceeded(self.gate.render(answer.refusal, info, info), decision)
        if answer.headers:
            request.environ.setdefault(_HEADERS, []).extend(answer.headers)
        if type(decision) is Leased:
            request.environ.setdefault(_LEASES, []).append(decision)

    def _add_headers(self, response: Response) -> Response:
        environ = request.environ
        status = response.status_code
        for decision in environ.pop(_LEASES, ()):
            # Given back when the server closes the response: after its last byte (a
            # streamed one too), or on a disconnect.
            response.call_on_close(functools.partial(self.limiter.release, decision))
        pending = environ.pop(_RECORD, None)
        if pending is not None:
            info, caller, units = pending
            record_response(self.limiter, self.gate, info, caller, cost=units, status=status)
        for name, info, caller, units in environ.pop(_RECORD_LIMITS, ()):
            record_limit(self.limiter, self.gate, name, info, caller, cost=units, status=status)
        # A refusal carries its own, complete headers: items of a limit that allowed the
        # request would put a t later than Retry-After into its RateLimit field.
        if not environ.get(_REFUSED):
            merge_headers(response.headers, environ.get(_HEADERS, ()))
        return response

    def _release_leftovers(self, error: BaseException | None) -> None:
        """Leases of a request that never reached ``_add_headers`` (an exception Flask
        propagates): given back now."""
        for decision in request.environ.pop(_LEASES, ()):
            self.limiter.release(decision)

    @staticmethod
    def _answer_refusal(error: RateLimitExceeded) -> Response:
        request.environ[_REFUSED] = True
        return problem_response(error.refusal)

    def _answer_rate_limited(self, error: RateLimited) -> Response:
        request.environ[_REFUSED] = True
        info = RequestInfo.from_wsgi(request.environ)
        refusal = rate_limited_answer(self.gate, error).refusal
        if refusal is None:
            # A denied decision always names what denied it; should one not, the answer is
            # still a refusal the client can act on.
            retry = max(1, delay_seconds(error.decision.retry_after))
            body = problem_body(
                type_=self.gate.problem_type,
                title="Too Many Requests",
                status=429,
                detail=f"Rate limit {error.name!r} refuses this request; retry in {retry} s.",
                extra={"limit": error.name, "retry-after": retry},
            )
            refusal = Refusal(
                status=429,
                headers=(("Retry-After", str(retry)),),
                body=body,
                decision=error.decision,
            )
        return problem_response(self.gate.render(refusal, info, info))
