"""Django integration: a ``MIDDLEWARE`` class and a per-view decorator (imports Django).

::

    # settings.py
    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "applimit.django.RateLimitMiddleware",     # after whatever identify reads
        ...,
    ]
    APPLIMIT = {
        "policy": BASE_DIR / "policy.yaml",
        "redis_url": os.environ.get("REDIS_URL"),  # overrides the policy's app.redis_url
        "identify": "yourproject.ratelimit.identify",
    }

    # views.py
    from applimit.django import rate_limit

    @rate_limit("search", cost=5)
    def report(request, name): ...

The middleware checks every request against each limit whose ``match:`` applies, as the WSGI
middleware does (``"check_requests": False`` leaves that to the WSGI middleware or turns it
off), and ``@rate_limit(name)`` hits one named limit on one view, whatever its ``match:``
says. Both answer a refusal as the WSGI middleware would: 429 (503 when a limit fails
closed), ``Retry-After``, ``RateLimit-Policy``/``RateLimit`` and the RFC 9457 problem
body. The middleware also turns :class:`~applimit.RateLimited`, raised by a function
decorated with ``rate_limited`` inside a view, into that answer instead of a 500 page.

``@rate_limit_exempt`` leaves a view out of the middleware's request check; the
``exempt_when``, ``exempt_caller`` and ``refusal`` settings mean what the WSGI middleware's
options mean, each getting the ``HttpRequest`` where the middleware's get the request info.

``identify(request)`` gets Django's ``HttpRequest``, so behind ``AuthenticationMiddleware``
it can read ``request.user``; it runs at most once per request. One ``Limiter`` is built
from the settings on first use and shared by the process (it is safe across threads).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings  # type: ignore[import-untyped]  # Django ships no types
from django.core.exceptions import (  # type: ignore[import-untyped]
    ImproperlyConfigured,
    PermissionDenied,
    SuspiciousOperation,
)
from django.core.signals import setting_changed  # type: ignore[import-untyped]
from django.http import Http404, HttpResponse  # type: ignore[import-untyped]
from django.urls import Resolver404, get_resolver  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]
from edgegen_policy import PolicyError

from ._decision import Decision, Leased
from ._errors import ConfigurationError, did_you_mean
from ._sync import Limiter
from .web._decorator import RateLimited
from .web._gate import EXEMPT, EXEMPTED, PASS, Answer, Gate, Refusal, bad_path
from .web._headers import QUOTA_EXCEEDED
from .web._options import middleware_gate
from .web._request import Caller, RequestInfo
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

__all__ = [
    "Caller",
    "RateLimitMiddleware",
    "get_limiter",
    "rate_limit",
    "rate_limit_exempt",
    "request_info",
]

SETTING = "APPLIMIT"
V = TypeVar("V", bound=Callable[..., Any])

DjangoIdentify = Callable[[Any], "Caller | None"]
Cost = int | Callable[[Any], int]

# What APPLIMIT may hold, each with what it means; an unknown key is a typo to report.
_OPTIONS = {
    "policy": "path of the policy file (required)",
    "redis_url": "the Redis URL; overrides the policy's app.redis_url",
    "identify": "dotted path of identify(request) -> Caller | None, or the function",
    "on_identify_error": "what an exception from identify means: raise, anonymous, refuse",
    "check_requests": "check every request against the limits whose match: applies",
    "cost": "units one request uses in that check: an int, or cost(request) (or its path)",
    "trusted_proxies": "addresses and CIDR networks of your proxies",
    "behind_cloudflare": "read CF-Connecting-IP from trusted peers",
    "legacy_headers": "also send X-RateLimit-Limit, -Remaining, -Reset",
    "problem_type": "the type URI of the 429 problem body",
    "exempt_when": "exempt_when(request, client_ip) -> bool: True spares it (or its path)",
    "exempt_caller": "exempt_caller(request, caller) -> bool, for identified callers (or its path)",
    "refusal": "refusal(request, default) -> (body, content_type) | None (or its dotted path)",
}
_CALLER = "_applimit_caller"
# Where the Decision of a request is left for its view (see docs/web.md).
DECISION_ATTRIBUTE = "applimit_decision"
# The (limit, info, caller, cost) of each count_when limit a decorator checked for the
# request, recorded once the view has a status.
_PENDING_ATTRIBUTE = "_applimit_pending_records"
# The request's decisions that hold concurrency leases, given back once it is answered.
_LEASES_ATTRIBUTE = "_applimit_leases"
_REFUSAL = "_applimit_refusal"
# The mark rate_limit_exempt puts on a view (functools.wraps and method_decorator carry it
# to wrappers, as csrf_exempt's), and whether any view has it: until one has, the
# middleware resolves no URL of its own.
_EXEMPT_VIEW = "applimit_exempt"
_exempt_views = False


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings, resolved once: the shared limiter, the gate and ``identify``."""

    limiter: Limiter
    gate: Gate
    identify: DjangoIdentify | None
    check_requests: bool
    cost: Cost = 1


_config: Config | None = None
_lock = threading.Lock()


def _setting_error(option: str | None, problem: str) -> ImproperlyConfigured:
    # Worded as the middleware's ConfigurationError is ("<owner> option <name>: ..."), so
    # that one message names the option whichever shell is configured.
    where = f"settings.{SETTING}" + (f" option {option}" if option else "")
    return ImproperlyConfigured(f"{where}: {problem}")


def _function(option: str, value: object) -> Callable[..., Any] | None:
    """A function given as itself or as its dotted path (None stays None)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as error:
            raise _setting_error(
                option,
                f"{value!r} cannot be imported ({error}); give the dotted path of a "
                f"function such as 'yourproject.ratelimit.{option}'.",
            ) from error
    if not callable(value):
        raise _setting_error(option, f"{value!r} is not a function or its dotted path.")
    return value


def load_config(options: object) -> Config:
    """Build the shared state from the ``APPLIMIT`` setting; ImproperlyConfigured names
    the option at fault and says how to write it."""
    if not isinstance(options, Mapping):
        raise _setting_error(
            None,
            f"a dict such as {{'policy': 'policy.yaml'}} is needed, not {type(options).__name__}.",
        )
    unknown = sorted(str(k) for k in options if k not in _OPTIONS)
    if unknown:
        hints = "".join(did_you_mean(k, _OPTIONS) for k in unknown)
        known = "; ".join(f"{k!r}: {v}" for k, v in _OPTIONS.items())
        raise _setting_error(
            None, f"unknown option(s) {', '.join(map(repr, unknown))}{hints}; known: {known}."
        )
    policy = options.get("policy")
    if not isinstance(policy, (str, os.PathLike)):
        raise _setting_error("policy", "it is required: the path of the rate-limit policy file.")
    redis_url = options.get("redis_url")
    if redis_url is not None and not isinstance(redis_url, str):
        raise _setting_error("redis_url", f"{redis_url!r} is not a URL such as 'redis://host'.")
    check_requests = options.get("check_requests", True)
    if not isinstance(check_requests, bool):
        raise _setting_error("check_requests", f"{check_requests!r} is not True or False.")
    identify = _function("identify", options.get("identify"))
    # Given as dotted paths, imported here; middleware_gate checks what they are.
    hooks = {
        option: _function(option, value) if isinstance(value, str) else value
        for option in ("exempt_when", "exempt_caller", "refusal")
        if (value := options.get(option)) is not None
    }
    cost: object = options.get("cost", 1)
    if isinstance(cost, str):
        cost = _function("cost", cost)
    try:
        limiter = (
            Limiter.from_policy(policy, redis_url=redis_url)
            if redis_url
            else Limiter.from_policy(policy)
        )
    except (PolicyError, ConfigurationError) as error:
        raise _setting_error("policy", str(error)) from error
    try:
        gate = middleware_gate(
            f"settings.{SETTING}",
            tiers=limiter.tiers,
            identify=identify,
            cost=cost,
            trusted_proxies=options.get("trusted_proxies", ()),
            behind_cloudflare=options.get("behind_cloudflare", False),
            legacy_headers=options.get("legacy_headers", False),
            problem_type=options.get("problem_type", QUOTA_EXCEEDED),
            on_identify_error=options.get("on_identify_error", "raise"),
            **hooks,
        )
    except ConfigurationError as error:
        limiter.close()
        raise ImproperlyConfigured(str(error)) from error
    # middleware_gate has checked the cost: a whole number in range, or a function.
    checked_cost: Cost = cost  # type: ignore[assignment]
    return Config(
        limiter=limiter,
        gate=gate,
        identify=identify,
        check_requests=check_requests,
        cost=checked_cost,
    )


def configured() -> Config:
    """The shared state, built from the settings on first use."""
    global _config
    config = _config
    if config is None:
        with _lock:
            if _config is None:
                _config = load_config(getattr(settings, SETTING, None))
            config = _config
    return config


def get_limiter() -> Limiter:
    """The ``Limiter`` the settings configure, for ``rate_limited`` functions and ``hit``."""
    return configured().limiter


def _forget(*, setting: str, **_: object) -> None:
    """A changed ``APPLIMIT`` (``override_settings`` in tests) takes effect on next use."""
    global _config
    if setting != SETTING:
        return
    with _lock:
        old, _config = _config, None
    if old is not None:
        old.limiter.close()


setting_changed.connect(_forget)


# --- requests and responses ----------------------------------------------------------------


def request_info(request: Any) -> RequestInfo:
    """The framework-free view of a Django request.

    ``path`` is Django's own ``request.path`` (already decoded as UTF-8) and ``mount`` the
    script name in front of ``request.path_info``, which is what the URL resolver matches;
    everything else is read from ``request.META`` as the WSGI middleware reads its environ.
    """
    info = RequestInfo.from_wsgi(request.META)
    path = request.path or "/"
    route = request.path_info or "/"
    mount = path[: -len(route)] if path.endswith(route) and len(path) > len(route) else ""
    return dataclasses.replace(info, path=path, mount=mount)


def _call_identify(config: Config, request: Any) -> Caller | None:
    caller = config.identify(request) if config.identify is not None else None
    if caller is not None and not isinstance(caller, Caller):
        raise TypeError(
            f"identify() returned {type(caller).__name__}; return applimit.Caller(user, "
            "tier) for a known caller or None for an anonymous one"
        )
    return caller


def _caller(config: Config, request: Any, info: RequestInfo) -> tuple[Caller | None, Answer | None]:
    """The caller from ``identify``, once per request, after the app's exemptions, under
    ``on_identify_error``: in the second place ``EXEMPTED`` when an exemption spares the
    request, a refusal when a function raised and the choice is to refuse."""
    if not hasattr(request, _CALLER):
        setattr(
            request,
            _CALLER,
            resolve_caller(config.gate, info, request, lambda: _call_identify(config, request)),
        )
    found: tuple[Caller | None, Answer | None] = getattr(request, _CALLER)
    return found


def _rendered(config: Config, request: Any, info: RequestInfo, answer: Answer) -> Answer:
    """``answer`` with its refusal given the app's own body (``refusal``), if any."""
    if answer.refusal is None or config.gate.refusal is None:
        return answer
    return Answer(answer.headers, config.gate.render(answer.refusal, info, request))


def _refused(config: Config, request: Any, info: RequestInfo, refusal: Refusal) -> Any:
    """The response to a refusal, with the app's own body (``refusal``), if any."""
    return refusal_response(config.gate.render(refusal, info, request))


def _view_is_exempt(request: Any) -> bool:
    """Whether the view the request resolves to is marked by :func:`rate_limit_exempt`.

    Resolved as Django's handler resolves it (the request's own ``urlconf`` when a
    middleware set one); a path that resolves to no view is checked.
    """
    try:
        match = get_resolver(getattr(request, "urlconf", None)).resolve(request.path_info)
    except Resolver404:
        return False
    return getattr(match.func, _EXEMPT_VIEW, False) is True


def refusal_response(refusal: Refusal) -> Any:
    """A :class:`~applimit.web._gate.Refusal` as a Django ``HttpResponse``."""
    response = HttpResponse(refusal.body, status=refusal.status)
    for key, value in refusal.headers:
        response.headers[key] = value
    setattr(response, _REFUSAL, True)
    return response


def _add_headers(response: Any, answer: Answer) -> Any:
    # A refusal carries its own, complete headers: items of a limit that allowed the
    # request would put a t later than Retry-After into its RateLimit field.
    if answer.headers and not getattr(response, _REFUSAL, False):
        merge_headers(response.headers, answer.headers)
    return response


class RateLimitMiddleware:
    """A Django middleware: the policy's limits on every request, and 429s for
    ``RateLimited`` raised in views. Configured by ``settings.APPLIMIT``; a setting that is
    wrong fails when Django loads its middleware (start-up under gunicorn)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        """Keep the next handler and read the settings now, so that mistakes show early.

        The root URLconf is loaded now too (as Django's system checks load it), so that
        every view marked :func:`rate_limit_exempt` is marked before the first request.
        """
        self.get_response = get_response
        configured()
        if getattr(settings, "ROOT_URLCONF", None):
            get_resolver().url_patterns  # noqa: B018 (imports the URLconf and its views)

    def __call__(self, request: Any) -> Any:
        """Check the request; answer the refusal, or add the headers to the response."""
        config = configured()
        info = request_info(request)
        bad = bad_path(info)
        if bad is not None:
            return refusal_response(bad)
        matched = limits_to_check(config.limiter, info) if config.check_requests else None
        if matched is None:
            return self.get_response(request)
        caller, early = (
            (None, EXEMPTED)
            if _exempt_views and _view_is_exempt(request)
            else _caller(config, request, info)
        )
        if early is not None:
            if early.refusal is None:
                # An exemption spares the request (a view marked exempt, exempt_when,
                # exempt_caller).
                _keep(request, EXEMPT)
                return self.get_response(request)
            answer = early
        else:
            units = native_cost(config.cost, request, info)
            decision, answer = check_request(config.limiter, config.gate, info, caller, units)
            _keep(request, decision)
            if answer.refusal is None:
                _hold(request, decision)
                response = self._admitted(
                    config, request, info, caller, units, counts=matched.counts_responses
                )
                return _add_headers(response, answer)
        if answer.refusal is not None:
            return _refused(config, request, info, answer.refusal)
        return _add_headers(self.get_response(request), answer)

    def _admitted(
        self,
        config: Config,
        request: Any,
        info: RequestInfo,
        caller: Caller | None,
        units: int,
        *,
        counts: bool,
    ) -> Any:
        """The view's response to an admitted request: its status recorded when a
        count_when limit checked it (``counts``; Django turns a view's exception into its
        response, a 500, inside get_response, so every outcome has a status here), its
        concurrency leases given back once it is sent."""
        try:
            response = self.get_response(request)
        except BaseException:
            _release_held(request, None)
            raise
        if counts:
            record_response(
                config.limiter, config.gate, info, caller, cost=units, status=response.status_code
            )
        return _release_held(request, response)

    def process_exception(self, request: Any, exception: Exception) -> Any:
        """A view's ``RateLimited`` becomes the limiter's refusal; anything else is not ours."""
        if not isinstance(exception, RateLimited):
            return None
        config = configured()
        refusal = rate_limited_answer(config.gate, exception).refusal
        if refusal is None:
            return None
        return _refused(config, request, request_info(request), refusal)


def _hit(name: str, cost: Cost, request: Any) -> Answer:
    config = configured()
    info = request_info(request)
    caller, answer = _caller(config, request, info)
    if answer is not None:
        if answer.refusal is None:
            # An exemption spares the request.
            _keep(request, EXEMPT)
            return PASS
        return _rendered(config, request, info, answer)
    units = native_cost(cost, request, info)
    decision, answer = hit_limit(config.limiter, config.gate, name, info, caller=caller, cost=units)
    _keep(request, decision)
    if answer.refusal is None:
        _hold(request, decision)
    if answer.refusal is None and counted_later(config.limiter, name):
        # The decorator records the view's status once it has one (_record_pending).
        pending = getattr(request, _PENDING_ATTRIBUTE, None) or []
        pending.append((name, info, caller, units))
        setattr(request, _PENDING_ATTRIBUTE, pending)
    return _rendered(config, request, info, answer)


def _record_pending(request: Any, status: int) -> None:
    """Record ``status`` against the count_when limits a decorator checked for
    ``request``."""
    config = configured()
    for name, info, caller, units in getattr(request, _PENDING_ATTRIBUTE, None) or ():
        record_limit(config.limiter, config.gate, name, info, caller, cost=units, status=status)
    setattr(request, _PENDING_ATTRIBUTE, None)


def _status_of_exception(error: Exception) -> int:
    """The status Django answers a view's exception with."""
    if isinstance(error, Http404):
        return 404
    if isinstance(error, PermissionDenied):
        return 403
    if isinstance(error, SuspiciousOperation):
        return 400
    return 500


def _counted_view(request: Any, call: Callable[[], Any]) -> Any:
    """``call()`` (the view), its status recorded when a count_when limit is pending."""
    if not getattr(request, _PENDING_ATTRIBUTE, None):
        return call()
    try:
        response = call()
    except Exception as error:
        _record_pending(request, _status_of_exception(error))
        raise
    _record_pending(request, response.status_code)
    return response


async def _counted_async_view(request: Any, call: Callable[[], Awaitable[Any]]) -> Any:
    """:func:`_counted_view` for an async view; the limiter blocks, off the event loop."""
    if not getattr(request, _PENDING_ATTRIBUTE, None):
        return await call()
    try:
        response = await call()
    except Exception as error:
        await sync_to_async(_record_pending)(request, _status_of_exception(error))
        raise
    await sync_to_async(_record_pending)(request, response.status_code)
    return response


def _keep(request: Any, decision: Decision | None) -> None:
    """Leave the Decision for the view as ``request.applimit_decision`` (joined with one
    made before for the same request)."""
    if decision is not None:
        setattr(
            request,
            DECISION_ATTRIBUTE,
            joined(getattr(request, DECISION_ATTRIBUTE, None), decision),
        )


def _hold(request: Any, decision: Decision) -> None:
    """Keep a decision that took concurrency leases, to give them back (_release_held)."""
    if type(decision) is Leased:
        held = getattr(request, _LEASES_ATTRIBUTE, None)
        if held is None:
            held = []
            setattr(request, _LEASES_ATTRIBUTE, held)
        held.append(decision)


def _release_held(request: Any, response: Any) -> Any:
    """Give back the leases the request holds: once a streamed ``response`` has sent its
    last chunk (or was closed), at once otherwise. Returns ``response``."""
    held = getattr(request, _LEASES_ATTRIBUTE, None)
    if not held:
        return response
    setattr(request, _LEASES_ATTRIBUTE, None)
    limiter = configured().limiter
    if response is not None and getattr(response, "streaming", False):
        content = response.streaming_content
        if hasattr(content, "__aiter__"):
            response.streaming_content = _released_after_async(content, limiter, held)
        else:
            response.streaming_content = _released_after(content, limiter, held)
        return response
    for decision in held:
        limiter.release(decision)
    return response


def _released_after(
    content: Iterable[Any], limiter: Limiter, held: list[Decision]
) -> Iterator[Any]:
    try:
        yield from content
    finally:
        for decision in held:
            limiter.release(decision)


async def _released_after_async(
    content: AsyncIterable[Any], limiter: Limiter, held: list[Decision]
) -> AsyncIterator[Any]:
    """:func:`_released_after` for an async stream."""
    try:
        async for chunk in content:
            yield chunk
    finally:
        for decision in held:
            await sync_to_async(limiter.release)(decision)


def rate_limit_exempt(view: V) -> V:
    """Leave a view out of the middleware's request check.

    Its requests are neither counted nor refused by the limits whose ``match:`` covers
    them, get no rate-limit headers, and carry ``applimit.EXEMPT`` as
    ``request.applimit_decision``. A limit the view names itself (``@rate_limit``) still
    applies. Decorate a function view (in any order with Django's decorators, which carry
    the mark as they carry ``csrf_exempt``'s), a class-based view's ``as_view()`` in the
    URLconf, or its ``dispatch`` through ``method_decorator``. A WSGI middleware wrapping
    the callable runs before Django resolves the URL and cannot see the mark: use
    ``exempt_when`` there.
    """
    global _exempt_views
    setattr(view, _EXEMPT_VIEW, True)
    _exempt_views = True
    return view


def rate_limit(name: str, *, cost: Cost = 1) -> Callable[[V], V]:
    """Decorate a function view so that each request to it hits the policy's limit ``name``.

    The limit is hit whatever its ``match:`` says, by the caller the configured
    ``identify`` returns (an anonymous caller by client IP). ``cost`` is how many units a
    request uses, or a callable that computes them from the request. A refusal is answered
    here, so the view does not run; an allowed response gets the rate-limit headers. An
    unknown name fails when the view is defined. Class-based views take it through
    ``django.utils.decorators.method_decorator``. Do not also let the middleware count the
    same limit (its ``match:`` covering this view): both would consume.
    """
    known_limit(configured().limiter, name)
    if not callable(cost) and (not isinstance(cost, int) or cost < 1):
        raise ValueError(f"cost must be a positive int or a callable, not {cost!r}")

    def decorate(view: V) -> V:
        if inspect.iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_view(request: Any, *args: Any, **kwargs: Any) -> Any:
                # The limiter blocks on Redis: run it off the event loop.
                answer = await sync_to_async(_hit)(name, cost, request)
                if answer.refusal is not None:
                    return refusal_response(answer.refusal)
                try:
                    response = await _counted_async_view(
                        request, lambda: view(request, *args, **kwargs)
                    )
                except BaseException:
                    await sync_to_async(_release_held)(request, None)
                    raise
                response = await sync_to_async(_release_held)(request, response)
                return _add_headers(response, answer)

            return async_view  # type: ignore[return-value]  # same signature as the view

        @functools.wraps(view)
        def limited_view(request: Any, *args: Any, **kwargs: Any) -> Any:
            answer = _hit(name, cost, request)
            if answer.refusal is not None:
                return refusal_response(answer.refusal)
            try:
                response = _counted_view(request, lambda: view(request, *args, **kwargs))
            except BaseException:
                _release_held(request, None)
                raise
            return _add_headers(_release_held(request, response), answer)

        return limited_view  # type: ignore[return-value]  # same signature as the view

    return decorate
