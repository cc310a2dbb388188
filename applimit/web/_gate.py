"""The gate: a decision in, the answer to the request out, and the app's hooks around it.

:class:`Gate` turns a :class:`~applimit.Decision` into an :class:`Answer`: the response
headers, or the refusal (status, headers, RFC 9457 problem body) when the request is
denied. It also says what a failing ``identify`` means (``on_identify_error``), whether the
app's ``exempt_when`` / ``exempt_caller`` spare a request (:data:`EXEMPT` is the Decision
left for the app then), and what body the app's ``refusal`` function gives a refusal. The
ASGI and WSGI middleware, the FastAPI dependency and the Flask and Django helpers all
answer through it. No I/O, no web framework.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from edgegen_policy import LEASE, OVERRIDE_TIER, has_control_character

from .._decision import Decision, LimitResult
from .._errors import ConfigurationError
from .._memo import Memo
from ._client_ip import TrustedProxies
from ._headers import (
    PROBLEM_JSON,
    QUOTA_EXCEEDED,
    TEMPORARY_REDUCED_CAPACITY,
    PolicyItem,
    binding_item,
    delay_seconds,
    denied_delay,
    period_text,
    problem_body,
    quota_period,
    seconds_text,
    sf_string,
)
from ._request import NO_KEYS, Caller, RequestInfo

logger = logging.getLogger("applimit")

# Unknown tiers logged once each; past this many, further ones are not logged.
MAX_WARNED_TIERS = 64
# Rates whose RateLimit-Policy member a Gate keeps formatted, at most (see Gate._admitted):
# more than a policy's limits, tiers and rates make in practice.
_MEMBERS = 4096
# What a failing identify() means (Gate's on_identify_error): "raise" propagates the app's
# exception (a 500, as before this option existed), "anonymous" counts the caller by IP in
# the lowest tier, "refuse" answers 503 (the app's auth, not the client, is at fault).
OnIdentifyError = Literal["raise", "anonymous", "refuse"]
# Seconds a client is told to wait after a "refuse": an auth backend's failure is usually
# brief, and a client that retries at once would only add to its load.
IDENTIFY_RETRY_AFTER = 5
# A quota's period as a refusal says it ("3 requests per billing month").
_PERIOD_WORDS = {"billing": "billing month"}
ON_IDENTIFY_ERROR: tuple[OnIdentifyError, ...] = ("raise", "anonymous", "refuse")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A response the middleware sends instead of calling the app.

    ``status`` is 429 (a limit refused), 503 (a limit failing closed, or a failing
    ``identify`` or exemption function under ``on_identify_error="refuse"``) or 400 (a path
    holding a control character). ``headers`` are the rate-limit headers
    (``RateLimit-Policy``, ``RateLimit``, ``Retry-After``) and the body's own; ``body`` is
    the RFC 9457 problem document. ``decision`` is the limiter's answer, None when nothing
    was decided (the 400, the 503 of a failing function). An app's ``refusal=`` function
    receives this default and may replace the body.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    decision: Decision | None = None

    @property
    def retry_after(self) -> int | None:
        """The seconds of its ``Retry-After`` header, or None (a 400 has none)."""
        for name, value in self.headers:
            if name == "Retry-After":
                return int(value)
        return None


# Built for every request: a plain slotted dataclass, not a frozen one, whose __init__
# pays an object.__setattr__ per field. Nothing changes it after construction.
@dataclass(slots=True)
class Answer:
    """The gate's answer to a request: headers to add to the app's response, or a refusal."""

    headers: tuple[tuple[str, str], ...] = ()
    refusal: Refusal | None = None

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """``headers`` encoded for an ASGI ``http.response.start`` message."""
        return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers]


PASS = Answer()
# The answer of an exemption (exempt_when, exempt_caller): pass the request to the app
# without counting it or adding headers. An Answer of its own, so that shells can tell
# it from PASS.
EXEMPTED = Answer()


class _Exempt(Decision):
    """The Decision left for the app when an exemption spared the request (``exempt_when``,
    ``exempt_caller``, a view marked exempt): allowed, nothing counted, no limit results.
    There is one, ``applimit.EXEMPT``: test it with ``decision is applimit.EXEMPT``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "applimit.EXEMPT"


EXEMPT: Final[Decision] = _Exempt(True, 0, 0, 0.0, None, None, (), False)

ExemptWhen = Callable[[RequestInfo, str], bool]
"""``exempt_when(request, client_ip) -> bool``: True spares the request (neither counted
nor refused, no headers); asked before ``identify``, for requests some limit matches.
``client_ip`` is the client's address as the limits count it (``trusted_proxies``
applied): a forwarding header a client wrote cannot make it an internal address."""

ExemptCaller = Callable[[RequestInfo, Caller], bool]
"""``exempt_caller(request, caller) -> bool``: True spares the request of an identified
caller; asked after ``identify``, only when it returned a :class:`Caller`."""

RefusalBody = tuple[bytes | str, str]
"""What a ``refusal=`` function returns: the body (``str`` is sent as UTF-8) and its
``Content-Type``."""

RenderRefusal = Callable[[RequestInfo, Refusal], RefusalBody | None]
"""``refusal(request, default) -> (body, content_type) | None``: the app's own body for a
429 or 503; None sends the default problem document. Status and rate-limit headers are
kept."""


# Built for every request, as Answer is.
@dataclass(slots=True)
class Subject:
    """The arguments of one ``check_request`` call, resolved from a request and its caller."""

    identity: str | None
    tier: str
    ip: str
    # The caller's app keys (Caller.keys), passed as keys= wherever the identity goes.
    keys: Mapping[str, str]


class Gate:
    """Everything the middleware decides that is not I/O.

    ``legacy_headers`` adds ``X-RateLimit-Limit``/``-Remaining``/``-Reset`` (delta seconds)
    for the most restrictive item. ``tiers`` is the policy's tier list (least generous first),
    used to place anonymous callers and callers with no tier in the lowest one.

    ``exempt_when``, ``exempt_caller`` and ``refusal`` are the app's functions (see
    :meth:`exempts`, :meth:`exempts_caller` and :meth:`render`); a shell tests them for
    None before calling, so that an unset one costs nothing. Their first argument is what
    the shell gives them: the :class:`RequestInfo`, or (Django) the framework's request.
    """

    def __init__(
        self,
        *,
        tiers: Sequence[str],
        proxies: TrustedProxies | None = None,
        legacy_headers: bool = False,
        problem_type: str = QUOTA_EXCEEDED,
        on_identify_error: OnIdentifyError = "raise",
        exempt_when: Callable[[Any, str], bool] | None = None,
        exempt_caller: Callable[[Any, Caller], bool] | None = None,
        refusal: Callable[[Any, Refusal], RefusalBody | None] | None = None,
    ) -> None:
        """Configure the gate; ``tiers`` must not be empty."""
        if not tiers:
            raise ValueError("the policy lists no tiers; the gate needs at least one")
        if on_identify_error not in ON_IDENTIFY_ERROR:
            choices = ", ".join(repr(c) for c in ON_IDENTIFY_ERROR)
            raise ConfigurationError(
                f"on_identify_error is {on_identify_error!r}; use one of {choices}."
            )
        self.tiers = tuple(tiers)
        self.proxies = proxies or TrustedProxies()
        self.legacy_headers = legacy_headers
        self.problem_type = problem_type
        self.on_identify_error: OnIdentifyError = on_identify_error
        self.exempt_when = exempt_when
        self.exempt_caller = exempt_caller
        self.refusal = refusal
        # Tier names come from identify(), which may pass on what a client sent: remember a
        # bounded number of them, so a stream of invented tiers cannot grow memory.
        self._warned_tiers: set[str] = set()
        # Each (limit, quota, window)'s RateLimit-Policy member and its sf-string key, made
        # on first use: a limit's rate is fixed by the policy, so these are formatted once
        # instead of for every response (the policy's limits and tiers bound them; results
        # handed to answer() by an app could hold others, hence the memo's bound).
        self._formatted: Memo[tuple[str, int, float], tuple[str, str]] = Memo(_MEMBERS)
        self._members = self._formatted.entries  # read for every admitted response

    @property
    def lowest_tier(self) -> str:
        """The least generous tier: anonymous callers are counted in it."""
        return self.tiers[0]

    def subject(self, request: RequestInfo, caller: Caller | None) -> Subject:
        """Who to count: the user and tier from ``identify``, or the client IP when anonymous.

        A tier the policy does not list is counted as the lowest tier (and logged once):
        an auth system that invents a tier must not lift the caller out of every limit.
        """
        ip = self.proxies.client_ip(request)
        if caller is None:
            return Subject(None, self.lowest_tier, ip, NO_KEYS)
        # Typed as object: identify() is the app's code, and its tier may not be a str.
        claimed: object = caller.tier or self.lowest_tier
        if isinstance(claimed, str) and claimed in self.tiers:
            tier = claimed
        else:
            # A tier often comes from a token claim a client may shape: whatever it is (an
            # unknown name, a number, a list), it is logged and counted as the lowest tier.
            shown = (claimed if isinstance(claimed, str) else repr(claimed))[:64]
            if shown not in self._warned_tiers and len(self._warned_tiers) < MAX_WARNED_TIERS:
                self._warned_tiers.add(shown)
                logger.warning(
                    "identify() returned tier %r, which the policy does not list (%s); "
                    "counting the caller in the lowest tier %r",
                    shown,
                    ", ".join(self.tiers),
                    self.lowest_tier,
                    extra={"applimit_event": "unknown_tier", "tier": shown},
                )
            tier = self.lowest_tier
        identity = caller.user
        return Subject(identity, tier, ip, caller.keys)

    def identify_failed(self, request: RequestInfo, error: Exception) -> Answer | None:
        """What ``on_identify_error`` makes of an exception raised by ``identify``.

        ``"raise"`` re-raises it (the caller of this method is inside ``except``);
        ``"anonymous"`` logs it and returns None: count the caller as anonymous, by IP;
        ``"refuse"`` logs it and returns a 503 refusal without consuming any quota.
        """
        return self._failed("identify", request, error)

    def exempts(self, request: RequestInfo, native: object) -> Answer | None:
        """``exempt_when(native, client_ip)``: :data:`EXEMPTED` when it spares the request,
        None when not (or when unset). ``client_ip`` is the one the limits would count.

        An exception (or an answer other than True or False, which is a bug: an async
        function's coroutine would otherwise spare everyone) follows ``on_identify_error``
        as identify's does: ``"raise"`` re-raises, ``"anonymous"`` logs it and does not
        exempt (the request is counted as any other), ``"refuse"`` logs it and returns the
        503 refusal.
        """
        hook = self.exempt_when
        if hook is None:
            return None
        try:
            answer = _yes_or_no("exempt_when", hook(native, self.proxies.client_ip(request)))
        except Exception as error:
            return self._failed("exempt_when", request, error)
        return EXEMPTED if answer else None

    def exempts_caller(self, request: RequestInfo, native: object, caller: Caller) -> Answer | None:
        """``exempt_caller(native, caller)`` for an identified caller, as :meth:`exempts`."""
        hook = self.exempt_caller
        if hook is None:
            return None
        try:
            answer = _yes_or_no("exempt_caller", hook(native, caller))
        except Exception as error:
            return self._failed("exempt_caller", request, error)
        return EXEMPTED if answer else None

    def _failed(self, option: str, request: RequestInfo, error: Exception) -> Answer | None:
        """``on_identify_error`` applied to an exception of the app's ``option`` function."""
        if self.on_identify_error == "raise":
            raise error
        if self.on_identify_error == "anonymous":
            meaning = (
                "counts the caller as anonymous"
                if option == "identify"
                else "does not exempt the request"
            )
        else:
            meaning = "refuses the request with 503"
        logger.error(
            "%s() raised on %s %s; on_identify_error=%r %s",
            option,
            request.method,
            request.raw_path,
            self.on_identify_error,
            meaning,
            exc_info=error,
            extra={
                "applimit_event": "identify_failed" if option == "identify" else "exempt_failed",
                "on_identify_error": self.on_identify_error,
                "error": type(error).__name__,
            },
        )
        if self.on_identify_error == "anonymous":
            return None
        what = "who is calling" if option == "identify" else "whether this request is rate limited"
        body = problem_body(
            type_=TEMPORARY_REDUCED_CAPACITY,
            title="Service Unavailable",
            status=503,
            detail=(
                f"The service cannot tell {what} right now; "
                f"retry in {seconds_text(IDENTIFY_RETRY_AFTER)}."
            ),
            extra={"retry-after": IDENTIFY_RETRY_AFTER},
        )
        headers = (
            ("Retry-After", str(IDENTIFY_RETRY_AFTER)),
            ("Content-Type", PROBLEM_JSON),
            ("Content-Length", str(len(body))),
        )
        return Answer(refusal=Refusal(status=503, headers=headers, body=body))

    def render(self, refusal: Refusal, request: RequestInfo, native: object) -> Refusal:
        """The refusal to send: ``refusal``, with the body of the app's ``refusal=``
        function (called with ``native`` and ``refusal``) when one is set.

        The status and every header but the body's own (``Content-Type``,
        ``Content-Length``) are kept: ``RateLimit-Policy``, ``RateLimit``, ``Retry-After``
        and ``X-RateLimit-*`` describe the refusal whatever the body says. A 400 (a path
        holding a control character) keeps its own body. The function answering None, or
        failing (raising, or an answer that is not ``(body, content_type)``), sends the
        default: a refusal must go out; a failure is logged with its traceback.
        """
        page = self.refusal
        if page is None or refusal.status == 400:
            return refusal
        try:
            answer = page(native, refusal)
            if answer is None:
                return refusal
            body, content_type = _refusal_body(answer)
        except Exception:
            logger.exception(
                "refusal() failed for the %d answer to %s %s; the default body is sent",
                refusal.status,
                request.method,
                request.raw_path,
                extra={"applimit_event": "refusal_failed", "status": refusal.status},
            )
            return refusal
        headers = [(k, v) for k, v in refusal.headers if k.lower() not in _BODY_HEADERS]
        headers += [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        return Refusal(refusal.status, tuple(headers), body, refusal.decision)

    # -- headers ----------------------------------------------------------------------------

    @staticmethod
    def items(results: Sequence[LimitResult]) -> list[PolicyItem]:
        """One header item per enforced rate; shadow limits are not advertised.

        A limit with one rate is named after the limit (``"api"``); a tier with several rates
        gets one item per rate, named ``limit/period`` (``"api/1m"``, ``"api/1h"``).
        """
        # Concurrency limits are no quota policy of the header draft: not advertised.
        enforced = [r for r in results if not r.shadow and r.algorithm != LEASE]
        counts: dict[str, int] = {}
        for result in enforced:
            counts[result.name] = counts.get(result.name, 0) + 1
        items: list[PolicyItem] = []
        for result in enforced:
            key = result.name
            period = quota_period(result)
            if period:
                # A calendar quota is always named by its period (``"api/month"``): its
                # window's length changes from one period to the next.
                key = f"{result.name}/{period}"
            elif counts[result.name] > 1:
                key = f"{result.name}/{period_text(result.window)}"
            # Allowed: r units may be used within t (the full quota is back by then).
            # Denied: t is when this request would fit, which Retry-After never undercuts.
            reset = delay_seconds(result.reset_after) if result.allowed else denied_delay(result)
            items.append(
                PolicyItem(
                    key=key,
                    limit=result.name,
                    quota=result.quota,
                    window=result.window,
                    # A GCRA burst above the quota can leave more than q; never advertise
                    # more than the policy's quota (the draft lets servers lower r).
                    remaining=min(max(0, result.remaining), result.quota),
                    reset=reset,
                    allowed=result.allowed,
                    period=period,
                )
            )
        return items

    def answer(self, decision: Decision, tier: str) -> Answer:
        """The answer to a request for a decision of ``check_request`` (or ``hit``)."""
        results = decision.results
        if len(results) == 1 and decision.allowed and not decision.degraded:
            only = results[0]
            if only.allowed and not only.shadow and only.algorithm != LEASE:
                # Most responses: one enforced rate that admitted the request.
                return self._admitted(only)
        items = self.items(results)
        if decision.degraded:
            return self._degraded(decision, items)
        denied = [i for i in items if not i.allowed]
        if not decision.allowed and not denied:
            # Refused by a concurrency limit alone.
            return self._too_many_at_once(decision, tier, items)
        if not items:
            # Nothing enforced applies (no matching limit, or only shadow limits): shadow
            # limits never deny, so a denial here cannot come from them.
            return PASS
        policy = ("RateLimit-Policy", ", ".join(i.policy_member() for i in items))
        if decision.allowed:
            headers = [policy, ("RateLimit", ", ".join(i.limit_member() for i in items))]
            headers += self._legacy(binding_item(items))
            return Answer(headers=tuple(headers))
        # Only the violated policies go into RateLimit on a refusal, so that Retry-After (the
        # largest of their waits) is never earlier than any reset parameter in the response.
        # At least 1: a refusal never says "retry now".
        retry = max(*(i.reset for i in denied), delay_seconds(decision.retry_after), 1)
        worst = max(denied, key=lambda i: i.reset)
        headers = [
            policy,
            ("RateLimit", ", ".join(i.limit_member() for i in denied)),
            ("Retry-After", str(retry)),
            *self._legacy(worst),
        ]
        body = problem_body(
            type_=self.problem_type,
            title="Too Many Requests",
            status=429,
            detail=(
                f"Rate limit {worst.limit!r} allows {worst.quota} requests per "
                f"{_PERIOD_WORDS.get(worst.period, worst.period) or period_text(worst.window)} "
                f"{_whose(decision, worst.limit, tier)}; retry in {seconds_text(retry)}."
            ),
            extra={
                "limit": worst.limit,
                "violated-policies": [i.key for i in denied],
                "retry-after": retry,
            },
        )
        headers.append(("Content-Type", PROBLEM_JSON))
        headers.append(("Content-Length", str(len(body))))
        return Answer(
            refusal=Refusal(status=429, headers=tuple(headers), body=body, decision=decision)
        )

    def _too_many_at_once(
        self, decision: Decision, tier: str, items: Sequence[PolicyItem]
    ) -> Answer:
        """The refusal of a request a concurrency limit denied (and no rate did): 429,
        a problem body that says it is a concurrency limit, and the rates' headers."""
        held = next(r for r in decision.results if not r.allowed and r.algorithm == LEASE)
        retry = max(delay_seconds(decision.retry_after), 1)
        headers = [("Retry-After", str(retry))]
        if items:
            headers[:0] = [
                ("RateLimit-Policy", ", ".join(i.policy_member() for i in items)),
                ("RateLimit", ", ".join(i.limit_member() for i in items)),
            ]
        requests = "request" if held.quota == 1 else "requests"
        body = problem_body(
            type_=self.problem_type,
            title="Too Many Requests",
            status=429,
            detail=(
                f"Concurrency limit {held.name!r} allows {held.quota} {requests} at once "
                f"{_whose(decision, held.name, tier)}, and that many are running; retry when "
                "one has finished."
            ),
            extra={"limit": held.name, "concurrency": held.quota, "retry-after": retry},
        )
        headers.append(("Content-Type", PROBLEM_JSON))
        headers.append(("Content-Length", str(len(body))))
        return Answer(
            refusal=Refusal(status=429, headers=tuple(headers), body=body, decision=decision)
        )

    def _admitted(self, result: LimitResult) -> Answer:
        """What :meth:`answer` makes of one enforced result that admits the request, with
        its policy member formatted once per limit and rate: the same headers, in the same
        order, as the general path's (a test holds the two to each other)."""
        member = self._members.get((result.name, result.quota, result.window))
        if member is None:
            item = PolicyItem(result.name, result.name, result.quota, result.window, 0, 0, True)
            member = (item.policy_member(), sf_string(result.name))
            self._formatted.keep((result.name, result.quota, result.window), member)
        policy, key = member
        quota = result.quota
        remaining = result.remaining
        # As items(): never below 0, never above the quota (a GCRA burst can exceed it).
        if remaining > quota:
            remaining = quota
        elif remaining < 0:
            remaining = 0
        reset = delay_seconds(result.reset_after)
        if self.legacy_headers:
            return Answer(
                (
                    ("RateLimit-Policy", policy),
                    ("RateLimit", f"{key};r={remaining};t={reset}"),
                    ("X-RateLimit-Limit", str(quota)),
                    ("X-RateLimit-Remaining", str(remaining)),
                    ("X-RateLimit-Reset", str(reset)),
                ),
                None,
            )
        return Answer(
            (
                ("RateLimit-Policy", policy),
                ("RateLimit", f"{key};r={remaining};t={reset}"),
            ),
            None,
        )

    def _legacy(self, item: PolicyItem | None) -> list[tuple[str, str]]:
        if not self.legacy_headers or item is None:
            return []
        return [
            ("X-RateLimit-Limit", str(item.quota)),
            ("X-RateLimit-Remaining", str(item.remaining)),
            ("X-RateLimit-Reset", str(item.reset)),
        ]

    def _degraded(self, decision: Decision, items: list[PolicyItem]) -> Answer:
        """Redis could not answer: the failure policy already decided allow or deny.

        The remaining counts are unknown, so ``RateLimit`` is left out rather than invented;
        the static ``RateLimit-Policy`` still describes the quotas. A fail-closed refusal is a
        503 (the service, not the client, is at fault) with the draft's
        temporary-reduced-capacity problem type.
        """
        headers: list[tuple[str, str]] = []
        if items:
            headers.append(("RateLimit-Policy", ", ".join(i.policy_member() for i in items)))
        if decision.allowed:
            return Answer(headers=tuple(headers))
        retry = max(1, delay_seconds(decision.retry_after))
        closed = [i.key for i in items if not i.allowed]
        body = problem_body(
            type_=TEMPORARY_REDUCED_CAPACITY,
            title="Service Unavailable",
            status=503,
            detail=(
                "The rate limiter cannot reach its store and this endpoint fails closed; "
                f"retry in {seconds_text(retry)}."
            ),
            extra={"violated-policies": closed, "retry-after": retry},
        )
        headers += [
            ("Retry-After", str(retry)),
            ("Content-Type", PROBLEM_JSON),
            ("Content-Length", str(len(body))),
        ]
        return Answer(
            refusal=Refusal(status=503, headers=tuple(headers), body=body, decision=decision)
        )


# The headers that describe a refusal's body, replaced with the body (Gate.render).
_BODY_HEADERS = frozenset({"content-type", "content-length"})


def _yes_or_no(option: str, answer: object) -> bool:
    """An exemption function's answer, which must be True or False: a coroutine (an async
    function given where a plain one is needed) or a forgotten return would otherwise be
    read as an answer, and a truthy one would spare every request."""
    if type(answer) is bool:
        return answer
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited: close it, or Python warns about it
    raise TypeError(
        f"{option}() returned {type(answer).__name__}; return True to exempt the request "
        "(neither counted nor refused) or False to limit it, from a plain function"
    )


def _refusal_body(answer: object) -> tuple[bytes, str]:
    """A ``refusal=`` function's ``(body, content_type)``, checked; the body as bytes."""
    if inspect.iscoroutine(answer):
        answer.close()  # never awaited: close it, or Python warns about it
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise TypeError(
            f"refusal() returned {type(answer).__name__}; return (body, content_type), such "
            "as (html, 'text/html; charset=utf-8'), or None for the default problem body, "
            "from a plain function"
        )
    body, content_type = answer
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, bytes):
        raise TypeError(f"refusal() returned a body of {type(body).__name__}; use bytes or str")
    # A header value the app chose: printable ASCII only, so that it cannot end the header.
    if (
        not isinstance(content_type, str)
        or not content_type
        or not content_type.isascii()
        or not content_type.isprintable()
    ):
        raise ValueError(
            f"refusal() returned the content type {content_type!r}; use a media type such "
            "as 'text/html; charset=utf-8' (printable ASCII)"
        )
    return body, content_type


def bad_path(request: RequestInfo) -> Refusal | None:
    """The 400 refusal for a request whose path holds a control character, or None.

    Every middleware and helper asks this first, before matching: routers read control
    characters each their own way (a Starlette route's ``$`` matches before a final
    newline, so ``/login%0A`` runs the handler of ``/login``), and no resource is named with
    one, so the whole class is refused rather than counted spelling by spelling. The
    generated Worker answers the same.
    """
    path = request.path
    if path.isprintable() or not has_control_character(path):
        return None
    found = next(c for c in path if ord(c) < 0x20 or ord(c) == 0x7F)
    body = problem_body(
        type_="about:blank",
        title="Bad Request",
        status=400,
        detail=(
            f"The request path holds the control character U+{ord(found):04X}, which no "
            "resource is named with; remove it."
        ),
        extra={},
    )
    headers = (
        ("Content-Type", PROBLEM_JSON),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    )
    return Refusal(status=400, headers=headers, body=body)


def _whose(decision: Decision, limit: str, tier: str) -> str:
    """Whose allowance refused: ``for the pro tier``, or the caller's own (an override)."""
    if any(r.tier == OVERRIDE_TIER for r in decision.denied_by if r.name == limit):
        return "under this caller's own terms"
    return f"for the {tier} tier"
