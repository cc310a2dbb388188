"""The policy as the app's hot path reads it: plain frozen objects, made once at start-up.

:func:`compile_policy` turns the pydantic policy into a :class:`CompiledPolicy` of
:class:`AppRule` objects (each limit's app part) and :class:`RateSpec` values (each rate of
a tier); the decision path never touches pydantic. Compiled by mypyc (setup.py): the
planning modules read these objects' fields on every plan they make.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from edgegen_policy import (
    Algorithm,
    AppKey,
    Layer,
    Matcher,
    Mode,
    OnRedisError,
    Policy,
    Quotas,
    Rate,
    checked_rates,
    period_us,
    status_counts,
)
from edgegen_policy import check as check_policy

from . import _keys
from ._errors import ConfigurationError

# The key suffix of each algorithm: a policy that switches a limit's algorithm starts on
# fresh keys instead of reading another algorithm's state (which would be WRONGTYPE).
_KEY_SUFFIX = {
    Algorithm.SLIDING_LOG: "log",
    Algorithm.SLIDING_WINDOW: "sw",
    Algorithm.GCRA: "gcra",
}
# What built-in limits count by (AppRule.kind), as plain strings for the hot path.
USER_KIND = AppKey.USER.value
IP_KIND = AppKey.IP.value
# Approximate mode's defaults: sync after this many requests, or this many seconds.
DEFAULT_SYNC_EVERY = 10
DEFAULT_SYNC_INTERVAL = 0.1


@dataclass(frozen=True, slots=True)
class RateSpec:
    """One rate of a tier: ``quota`` requests per ``period_us`` microseconds."""

    quota: int
    period_us: int
    period_text: str

    @property
    def window(self) -> float:
        """The period in seconds."""
        return self.period_us / 1_000_000


@dataclass(frozen=True, slots=True)
class QuotaSpec:
    """One calendar quota of a tier: ``quota`` units per ``period`` (``day``, ``week``,
    ``month`` or ``billing``), in the calendar of the limit's time zone."""

    period: str
    quota: int


_NO_QUOTAS: Mapping[str, tuple[QuotaSpec, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AppRule:
    """The app part of one policy limit, as plain values for the hot path."""

    name: str
    key_name: str
    per_ip: bool
    algorithm: str
    key_suffix: str
    burst: int | None
    shadow: bool
    fail_open: bool
    matcher: Matcher
    tiers: Mapping[str, tuple[RateSpec, ...]]
    # The app key the limit counts by (``per: org``), or None for per user and per IP.
    per_key: str | None = None

    @property
    def kind(self) -> str:
        """What the limit counts by: ``user``, ``ip`` or the name of an app key."""
        if self.per_key is not None:
            return self.per_key
        return IP_KIND if self.per_ip else USER_KIND

    approximate: bool = False
    sync_every: int = 1
    sync_interval: float = 0.0
    # False: only hit/peek/reset name it; check_request (the middleware) never applies it.
    middleware: bool = True
    # count_when's statuses, as (lowest, highest) ranges: a hit only checks such a limit,
    # and record() counts a response whose status is in one. Empty: every request counts.
    count_when: tuple[tuple[int, int], ...] = ()
    # The concurrency limit per tier (no entry: none), and how long a request's lease
    # lasts, in µs, unless given back first.
    concurrency: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    lease_us: int = 60_000_000

    # The calendar quotas of each tier that has some, the zone whose calendar they follow,
    # and the key of Caller.keys / keys= holding a caller's billing day.
    quotas: Mapping[str, tuple[QuotaSpec, ...]] = field(default_factory=lambda: _NO_QUOTAS)
    quota_zone: str = "UTC"
    billing_day_from: str | None = None

    def counts(self, status: int) -> bool:
        """Whether a response of ``status`` counts against this count_when limit."""
        return status_counts(self.count_when, status)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """What the limiter needs of a policy: its app limits, tiers and settings."""

    rules: tuple[AppRule, ...]
    by_name: Mapping[str, AppRule]
    edge_only: frozenset[str]
    tiers: tuple[str, ...]
    key_prefix: str
    timeout: float
    redis_url: str
    # IPv6 clients are counted per network of this prefix length (policy clients:).
    ipv6_prefix: int = 64


def _rates(rates: Iterable[Rate]) -> tuple[RateSpec, ...]:
    """Rates of one tier as plain values, one per period (``checked_rates``: for equal
    periods the smaller quota decides alone)."""
    return tuple(
        RateSpec(quota=r.limit, period_us=period_us(r), period_text=str(r.period))
        for r in checked_rates(rates)
    )


def _quotas(quotas: Mapping[str, Quotas] | None) -> Mapping[str, tuple[QuotaSpec, ...]]:
    """Each tier's calendar quotas as plain values, shortest period first."""
    if not quotas:
        return _NO_QUOTAS
    return MappingProxyType(
        {
            tier: tuple(QuotaSpec(period.value, units) for period, units in q.periods())
            for tier, q in quotas.items()
        }
    )


def compile_policy(policy: Policy) -> CompiledPolicy:
    """Convert the policy into plain frozen values; ConfigurationError when it cannot work."""
    # The one validity gate (policy.check): what stops the app is decided there, for
    # edgegen validate and for the limiter alike (duplicate names, unknown tiers, ...).
    stopping = check_policy(policy).stopping(Layer.APP)
    if stopping:
        raise ConfigurationError(
            "the policy cannot be enforced by the app: " + "; ".join(d.format() for d in stopping)
        )
    rules: list[AppRule] = []
    edge_only: set[str] = set()
    known_tiers = tuple(policy.tiers)
    for limit in policy.limits:
        app = limit.app
        if app is None:
            edge_only.add(limit.name)
            continue
        on_error = app.on_redis_error or policy.app.on_redis_error
        tiers = {tier: _rates(rates) for tier, rates in app.tiers.items()}
        # A tier with a concurrency limit and no rate has the lease alone.
        concurrency = app.concurrency_of(known_tiers)
        for tier in concurrency:
            tiers.setdefault(tier, ())
        rules.append(
            AppRule(
                name=limit.name,
                key_name=_keys.limit_component(limit.name),
                per_ip=app.per is AppKey.IP,
                algorithm=app.algorithm.value,
                key_suffix=_KEY_SUFFIX[app.algorithm],
                burst=app.burst,
                shadow=not app.enforce,
                fail_open=on_error is OnRedisError.ALLOW,
                matcher=limit.match.matcher(),
                tiers=MappingProxyType(tiers),
                # A key of the app's own (policy KeyName); the lint pass (L005) has already
                # stopped a name that cannot be used.
                per_key=None if isinstance(app.per, AppKey) else str(app.per),
                approximate=app.mode is Mode.APPROXIMATE,
                sync_every=app.sync_every or DEFAULT_SYNC_EVERY,
                sync_interval=(
                    app.sync_interval.ms / 1000
                    if app.sync_interval is not None
                    else DEFAULT_SYNC_INTERVAL
                ),
                middleware=app.middleware,
                count_when=limit.count_when.status if limit.count_when is not None else (),
                concurrency=MappingProxyType(concurrency),
                lease_us=app.lease.ms * 1000,
                quotas=_quotas(app.quotas),
                quota_zone=app.quota_timezone,
                billing_day_from=(
                    None if app.billing_day_from is None else str(app.billing_day_from)
                ),
            )
        )
    return CompiledPolicy(
        rules=tuple(rules),
        by_name=MappingProxyType({r.name: r for r in rules}),
        edge_only=frozenset(edge_only),
        tiers=known_tiers,
        key_prefix=policy.app.key_prefix,
        timeout=policy.app.timeout.ms / 1000,
        redis_url=policy.app.redis_url,
        ipv6_prefix=policy.clients.ipv6_prefix,
    )
