"""applimit: exact, shared, per-tier rate limits in Redis for Python apps.

Public surface::

    Limiter.from_policy(path, redis=... | redis_url=...)        blocking
    AsyncLimiter.from_policy(path, redis=... | redis_url=...)   asyncio
        redis_url="memory://"                    in this process, no Redis (tests only)
        enabled=False                            every decision allowed, nothing touched
        .hit(name, identity, tier=, cost=)       consume if allowed
        .peek(name, identity, tier=, cost=)      look, consume nothing
        .check_request(method, path, identity, tier=, cost=, ip=, host=)
        .match(method, path, host=)              the limits a request matches (RequestMatch),
                                                 or None: no Redis, for middleware
        .reset(name, identity, tier=)
    Decision, LimitResult                        what a call answers
    Caller, RequestInfo                          who calls (identify's answer), and the request
                                                 it reads (the same classes the web modules
                                                 export)
    Refusal, EXEMPT                              what a refusal= function receives; the
                                                 Decision of a request an exemption spared
    ApplimitError and its subclasses             see applimit._errors
    rate_limited(limiter, name, identity=...)    a limit on a plain function (RateLimited)
    Observer, DecisionEvent, Outcome             observers=[...]: every decision, per limit
    OvershootObserver                            on_overshoot: approximate mode's overshoot
    EventLogObserver(path_or_stream)             one NDJSON line per hit result, for replay
    .overrides: Overrides / AsyncOverrides       one identity's own rates for one limit:
        .set(name, identity, rates=, reason=, by=, ttl= | expires=), .remove(...),
        .stored(), .in_force(), .log(); Override, OverrideChange (the audit trail)

    applimit.prometheus / applimit.otel          exporters of the decisions as metrics

    applimit.asgi / applimit.wsgi                RateLimitMiddleware for web apps
    applimit.fastapi                             RateLimit, a per-route FastAPI dependency
    applimit.pytest_plugin                       fixtures for an app's tests (loaded by pytest)

docs/applimit.md describes the algorithms, keys and failure policy; docs/web.md the web layer.
"""

from __future__ import annotations

# First: outside the redis-py range it was tested on, applimit fails at import, loudly.
from . import _compat  # noqa: F401 (imported for its check)
from ._async import AsyncLimiter
from ._breaker import BreakerState
from ._decision import Decision, LimitResult
from ._errors import (
    ApplimitError,
    ConfigurationError,
    InvalidArgumentError,
    UnknownLimitError,
    UnknownTierError,
)
from ._eventlog import EventLogObserver
from ._observe import DecisionEvent, Observer, Outcome, OvershootObserver
from ._override_store import AsyncOverrides, OverrideChange, Overrides
from ._overrides import Override
from ._plan import RequestMatch
from ._sync import Limiter
from .web._decorator import RateLimited, rate_limited
from .web._gate import EXEMPT, Refusal
from .web._request import Caller, RequestInfo

__all__ = [
    "EXEMPT",
    "ApplimitError",
    "AsyncLimiter",
    "AsyncOverrides",
    "BreakerState",
    "Caller",
    "ConfigurationError",
    "Decision",
    "DecisionEvent",
    "EventLogObserver",
    "InvalidArgumentError",
    "LimitResult",
    "Limiter",
    "Observer",
    "Outcome",
    "Override",
    "OverrideChange",
    "Overrides",
    "OvershootObserver",
    "RateLimited",
    "Refusal",
    "RequestInfo",
    "RequestMatch",
    "UnknownLimitError",
    "UnknownTierError",
    "rate_limited",
]
