"""Per-customer overrides: one identity's own limits for one limit, as values. No I/O.

An :class:`Override` gives one identity (a user, or the value of an app key such as
``org``) its own rates, calendar quotas or concurrency limit for one limit, until it
expires: each it gives replaces its tier's, each it leaves out keeps the tier's. It
carries a reason and who set it. Overrides come from two places: set at run
time in Redis (``applimit override set``, :class:`~applimit.Overrides`; see
``_override_store.py``) and written in the policy file (``overrides:``, reviewed with the
policy). :func:`checked` is the one gate of a run-time override; :func:`table` turns every
override in force into what the planner reads: per (limit, hash tag), the encoded blocks
of what the override gives (``_calls.blocks``, under the tier name :data:`OVERRIDE_TIER`)
and the kinds of block they replace.

An override's quotas count on the same keys as its tier's (the keys name the period, not
the tier): a raised monthly quota starts from what the identity used this month.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeGuard

from edgegen_policy import (
    OVERRIDE_MAX_RATES,
    OVERRIDE_MAX_UNITS,
    OVERRIDE_TIER,
    Period,
    Policy,
    Rate,
    checked_rates,
    period_us,
)

from . import _keys
from ._arguments import check_identity, check_rule
from ._calls import LEASES, QUOTAS, RATES, Block, block_kind, blocks
from ._errors import InvalidArgumentError
from ._rules import AppRule, CompiledPolicy, QuotaSpec, RateSpec

# The version of an override's JSON document in Redis.
FORMAT = 1
# Bounds of what an override may hold.
MAX_RATES = OVERRIDE_MAX_RATES
MAX_UNITS = OVERRIDE_MAX_UNITS
MAX_CONCURRENCY = 1_000_000
MAX_REASON = 500
MAX_BY = 200
MAX_VALUE = 1024
# The furthest an override set at run time may expire: contract rates that last longer
# belong in the reviewed file (``overrides:`` in the policy).
MAX_LIFETIME = 400 * 86_400.0
# How far instances' clocks may differ: an override set on a clock this far ahead is still
# read (and kept by the next change) everywhere. One that expires later than a set could
# write, counted from now, was written by hand: it is ignored and the next change drops it.
MAX_SKEW = 86_400.0
USER = "user"
RUNTIME = "runtime"
FILE = "file"


@dataclass(frozen=True, slots=True)
class Override:
    """One identity's own limits for one limit, until ``expires`` (Unix seconds).

    ``kind`` is what the limit counts by: ``user``, or the app key's name (``org``);
    ``value`` the user id or the key's value. ``rates`` (``("1000/1m",)``), ``quotas``
    (``(("month", 2000000),)``, shortest period first) and ``concurrency`` replace the
    tier's; empty (None) keeps the tier's. ``by`` and ``at`` say who set it and when;
    ``source`` is ``runtime`` (set in Redis) or ``file`` (the policy's ``overrides:``).
    """

    limit: str
    kind: str
    value: str
    rates: tuple[str, ...]
    expires: float
    reason: str
    by: str = ""
    at: float = 0.0
    source: str = RUNTIME
    quotas: tuple[tuple[str, int], ...] = ()
    concurrency: int | None = None

    @property
    def field(self) -> str:
        """The override's name in Redis' hash of overrides: limit, kind and value."""
        return field(self.limit, self.kind, self.value)

    def describe(self) -> str:
        """``limit 'api' for org 'acme'``: for messages."""
        return f"limit {self.limit!r} for {self.kind} {self.value!r}"

    def gives(self) -> str:
        """What it gives, as the policy's review shows it (``edgegen_policy.Override``):
        ``rates 1000/1m + 20000/1h; quotas 2000000/month; concurrency 8``."""
        parts = []
        if self.rates:
            parts.append("rates " + " + ".join(self.rates))
        if self.quotas:
            parts.append("quotas " + ", ".join(f"{n}/{period}" for period, n in self.quotas))
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        return "; ".join(parts)

    def document(self) -> dict[str, Any]:
        """The override as a JSON object (Redis, ``applimit override list --format json``)."""
        return {
            "version": FORMAT,
            "limit": self.limit,
            "kind": self.kind,
            "value": self.value,
            "rates": list(self.rates),
            "quotas": dict(self.quotas),
            "concurrency": self.concurrency,
            "expires": self.expires,
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
            "source": self.source,
        }


def field(limit: str, kind: str, value: str) -> str:
    """The hash field of one (limit, kind, value): a JSON array, so no value can be spelt
    to name another's field."""
    return json.dumps([limit, kind, value], ensure_ascii=True)


def parse(text: str | bytes) -> Override:
    """An override from its JSON document; ValueError when it is not one (whatever Redis
    holds: anyone may have written it)."""
    try:
        return _parse(text)
    except (TypeError, OverflowError, RecursionError) as error:
        raise ValueError(f"not an override document: {error}") from None


def _parse(text: str | bytes) -> Override:
    raw = json.loads(text)
    if not isinstance(raw, dict) or raw.get("version") != FORMAT:
        raise ValueError("not an override document of version 1")
    rates = raw.get("rates")
    strings = (raw.get("limit"), raw.get("kind"), raw.get("value"), raw.get("reason"))
    if not isinstance(rates, list) or not all(isinstance(s, str) for s in strings):
        raise ValueError("an override document without its limit, kind, value or rates")
    expires = raw.get("expires")
    if not _number(expires) or not math.isfinite(expires):
        raise ValueError("an override document without its expiry")
    quotas = raw.get("quotas") or {}
    concurrency = raw.get("concurrency")
    if not isinstance(quotas, dict) or not all(_whole(v) for v in quotas.values()):
        raise ValueError("an override document whose quotas are not periods and units")
    if concurrency is not None and not _whole(concurrency):
        raise ValueError("an override document whose concurrency is not a whole number")
    return Override(
        limit=str(raw["limit"]),
        kind=str(raw["kind"]),
        value=str(raw["value"]),
        rates=tuple(str(rate) for rate in rates),
        expires=float(expires),
        reason=str(raw["reason"]),
        by=str(raw.get("by", "")),
        at=float(raw.get("at", 0.0)),
        source=RUNTIME,
        quotas=tuple((str(period), int(units)) for period, units in quotas.items()),
        concurrency=None if concurrency is None else int(concurrency),
    )


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> TypeGuard[int]:
    # JSON's 1e400 and Infinity are floats: refused here, never converted.
    return isinstance(value, int) and not isinstance(value, bool)


def counted_kind(rule: AppRule) -> str | None:
    """What an override of ``rule`` names: ``user``, the app key's name, or None for a
    limit that counts client addresses (which no override names)."""
    if rule.per_ip:
        return None
    return rule.per_key if rule.per_key is not None else USER


def text_argument(argument: str, value: object, bound: int) -> str:
    """``value`` checked: a non-empty str of at most ``bound`` printable characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(argument, f"{argument} must be a non-empty str.")
    if len(value) > bound or not value.isprintable():
        raise InvalidArgumentError(
            argument,
            f"{argument} must be at most {bound} characters, without control characters.",
        )
    return value


def checked_rates_of(rates: object, argument: str = "rates") -> tuple[str, ...]:
    """``rates`` (``["100/1m", "5000/1d"]``) checked and written as the policy writes them;
    None: none given."""
    if rates is None:
        return ()
    if isinstance(rates, str) or not isinstance(rates, Iterable):
        raise InvalidArgumentError(argument, f"{argument} must be a list such as ['100/1m'].")
    parsed: list[Rate] = []
    for item in rates:
        try:
            parsed.append(Rate.parse(item))
        except ValueError as error:
            raise InvalidArgumentError(argument, f"{argument}: {error}.") from None
    if not 1 <= len(parsed) <= MAX_RATES:
        raise InvalidArgumentError(
            argument, f"{argument} must hold from 1 to {MAX_RATES} rates, not {len(parsed)}."
        )
    return tuple(str(rate) for rate in parsed)


def checked_quotas_of(rule: AppRule, quotas: object) -> tuple[tuple[str, int], ...]:
    """``quotas`` (``{"month": 2000000}``) checked against ``rule``, shortest period first;
    None: none given."""
    if quotas is None:
        return ()
    periods = [p.value for p in Period]
    if not isinstance(quotas, Mapping) or not quotas:
        raise InvalidArgumentError("quotas", "quotas must be a dict such as {'month': 2000000}.")
    for period, units in quotas.items():
        if period not in periods:
            raise InvalidArgumentError(
                "quotas", f"quotas: {period!r} is not a period; use {', '.join(periods)}."
            )
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_UNITS:
            raise InvalidArgumentError(
                "quotas", f"quotas: the units per {period} must be an int from 1 to {MAX_UNITS}."
            )
    if not rule.quotas:
        raise InvalidArgumentError(
            "quotas",
            f"limit {rule.name!r} has no calendar quotas; give a tier of it quotas in the "
            "policy first (an override changes a quota, it does not start counting one).",
        )
    if "billing" in quotas and rule.billing_day_from is None:
        raise InvalidArgumentError(
            "quotas",
            f"limit {rule.name!r} has no billing_day_from, so it cannot count a billing "
            "quota; use month, or set billing_day_from in the policy.",
        )
    return tuple((p, quotas[p]) for p in periods if p in quotas)


def checked_concurrency_of(rule: AppRule, concurrency: object) -> int | None:
    """``concurrency`` checked against ``rule``; None: none given."""
    if concurrency is None:
        return None
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise InvalidArgumentError(
            "concurrency", f"concurrency must be an int from 1 to {MAX_CONCURRENCY:,}."
        )
    if rule.approximate:
        raise InvalidArgumentError(
            "concurrency",
            f"limit {rule.name!r} is approximate, and a concurrency limit needs mode: exact "
            "(a slot is taken and given back in Redis).",
        )
    if not rule.concurrency:
        raise InvalidArgumentError(
            "concurrency",
            f"limit {rule.name!r} has no concurrency limit; give a tier of it one in the "
            "policy first (an override changes a concurrency limit, it does not start one).",
        )
    return concurrency


def checked(
    policy: CompiledPolicy,
    limit: object,
    *,
    kind: object,
    value: object,
    rates: object,
    expires: object,
    reason: object,
    by: object,
    now: float,
    quotas: object = None,
    concurrency: object = None,
) -> Override:
    """A run-time override, every argument checked against ``policy``; the package's own
    errors say what is wrong and how to fix it."""
    rule = check_rule(policy, limit)
    wanted = counted_kind(rule)
    if wanted is None:
        raise InvalidArgumentError(
            "limit",
            f"limit {rule.name!r} counts per client IP; an override names a user or an app "
            "key, so give the address's users their own limit instead.",
        )
    if kind != wanted:
        raise InvalidArgumentError(
            "kind",
            f"limit {rule.name!r} counts per {wanted}, so its override names a {wanted} "
            f"(not {kind!r}).",
        )
    name = check_identity(value, "value")
    if len(name) > MAX_VALUE:
        raise InvalidArgumentError("value", f"value must be at most {MAX_VALUE} characters.")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise InvalidArgumentError("expires", "expires must be a Unix time in seconds.")
    if not math.isfinite(expires) or not now < expires <= now + MAX_LIFETIME:
        raise InvalidArgumentError(
            "expires",
            "expires must lie in the future, at most 400 days ahead; write a longer contract "
            "rate under overrides: in the policy, where it is reviewed.",
        )
    own_rates = checked_rates_of(rates)
    if own_rates and not any(rule.tiers.values()):
        raise InvalidArgumentError(
            "rates",
            f"limit {rule.name!r} has no rates (concurrency alone); give a tier of it rates "
            "in the policy first (an override changes rates, it does not start counting them).",
        )
    own_quotas = checked_quotas_of(rule, quotas)
    own_concurrency = checked_concurrency_of(rule, concurrency)
    if not own_rates and not own_quotas and own_concurrency is None:
        raise InvalidArgumentError(
            "rates", "give the override rates, quotas or concurrency (or several)."
        )
    return Override(
        limit=rule.name,
        kind=wanted,
        value=name,
        rates=own_rates,
        expires=float(expires),
        reason=text_argument("reason", reason, MAX_REASON),
        by=text_argument("by", by, MAX_BY),
        at=now,
        quotas=own_quotas,
        concurrency=own_concurrency,
    )


@dataclass(frozen=True, slots=True)
class Applied:
    """An override as the planner uses it: its blocks for a hit, and for ``record``, and
    the kinds of block (``_calls.block_kind``) of the tier's that they replace."""

    override: Override
    blocks: tuple[Block, ...]
    record_blocks: tuple[Block, ...]
    replaces: frozenset[str]

    def merged(
        self, tier_blocks: Iterable[Block], tier: str, *, record: bool = False
    ) -> list[tuple[str, Block]]:
        """The blocks a decision runs, each with the tier its results name: the
        override's (:data:`OVERRIDE_TIER`), and those of ``tier`` of the kinds it leaves
        in place, in the order ``_calls.blocks`` gives (rates, quotas, lease)."""
        own = self.record_blocks if record else self.blocks
        found = [(OVERRIDE_TIER, b) for b in own]
        found += [(tier, b) for b in tier_blocks if block_kind(b) not in self.replaces]
        return sorted(found, key=lambda pair: _ORDER[block_kind(pair[1])])


_ORDER = {RATES: 0, QUOTAS: 1, LEASES: 2}


def tag(rule: AppRule, value: str) -> str:
    """The hash tag the limit counts ``value`` by (as ``_arguments.request_tag`` makes it)."""
    if rule.per_key is not None:
        return _keys.identity_tag(_keys.named_kind(rule.per_key), value)
    return _keys.identity_tag(_keys.USER, value)


def _specs(rates: Iterable[str]) -> tuple[RateSpec, ...]:
    return tuple(
        RateSpec(quota=r.limit, period_us=period_us(r), period_text=str(r.period))
        for r in checked_rates(Rate.parse(text) for text in rates)
    )


def unfit(policy: CompiledPolicy, override: Override) -> str | None:
    """Why ``policy`` cannot apply ``override`` (None: it can). Checked again whenever the
    overrides are read: the policy may have changed since it was set, and Redis holds what
    anyone wrote there."""
    rule = policy.by_name.get(override.limit)
    if rule is None:
        return f"the policy has no app limit {override.limit!r}"
    kind = counted_kind(rule)
    if kind != override.kind:
        return f"limit {rule.name!r} counts per {kind or 'client IP'}, not per {override.kind}"
    try:
        if override.rates:
            checked_rates_of(list(override.rates))
            if not any(rule.tiers.values()):
                return f"limit {rule.name!r} has no rates (concurrency alone)"
        checked_quotas_of(rule, dict(override.quotas) if override.quotas else None)
        checked_concurrency_of(rule, override.concurrency)
    except ValueError as error:
        return str(error).rstrip(".")
    return None


def applied(policy: CompiledPolicy, override: Override) -> tuple[tuple[str, str], Applied] | None:
    """The planner's entry for ``override``: its (limit, tag) and blocks; None when the
    policy no longer has its limit, the limit counts by something else now, or it cannot
    count what the override gives (the checks of :func:`checked`)."""
    rule = policy.by_name.get(override.limit)
    if rule is None or unfit(policy, override) is not None:
        return None
    specs = _specs(checked_rates_of(list(override.rates)) if override.rates else ())
    quotas = checked_quotas_of(rule, dict(override.quotas) if override.quotas else None)
    own = replace(
        rule,
        tiers=MappingProxyType({OVERRIDE_TIER: specs}),
        quotas=MappingProxyType({OVERRIDE_TIER: tuple(QuotaSpec(p, units) for p, units in quotas)}),
        concurrency=MappingProxyType(
            {} if override.concurrency is None else {OVERRIDE_TIER: override.concurrency}
        ),
    )
    replaces = frozenset(
        kind
        for kind, given in (
            (RATES, override.rates),
            (QUOTAS, override.quotas),
            (LEASES, override.concurrency is not None),
        )
        if given
    )
    prefix = policy.key_prefix
    entry = Applied(
        override,
        # The checks keep the policy's rule; only what the override gives and the tier's
        # name differ.
        blocks(prefix, own, OVERRIDE_TIER),
        blocks(prefix, own, OVERRIDE_TIER, record=True),
        replaces,
    )
    return (rule.name, tag(rule, override.value)), entry


def table(
    policy: CompiledPolicy, overrides: Iterable[Override], now: float
) -> Mapping[tuple[str, str], Applied]:
    """Every override in force at ``now`` (Unix seconds), by (limit, tag). A run-time
    override wins over the file's for the same identity and limit in what it gives; what
    it leaves out stays the file's (a contract's terms are not lost to a run-time bump of
    one of them)."""
    found: dict[tuple[str, str], Applied] = {}
    in_file: dict[str, Override] = {}
    for given in sorted(overrides, key=lambda o: o.source == RUNTIME):
        if status(given, now) != IN_FORCE:
            continue
        if given.source != RUNTIME:
            in_file[given.field] = given
        contract = in_file.get(given.field) if given.source == RUNTIME else None
        entry = applied(policy, given if contract is None else _over(contract, given))
        if entry is not None:
            found[entry[0]] = entry[1]
    return MappingProxyType(found)


def _over(contract: Override, runtime: Override) -> Override:
    """``runtime``, with what it leaves out taken from the file's ``contract``."""
    return replace(
        runtime,
        rates=runtime.rates or contract.rates,
        quotas=runtime.quotas or contract.quotas,
        concurrency=contract.concurrency if runtime.concurrency is None else runtime.concurrency,
    )


def in_bounds(expires: float, now: float) -> bool:
    """Whether a stored override's expiry is in the future and within what a set could
    have written (a change script in Redis applies the same rule, see _override_store)."""
    return now < expires <= now + MAX_LIFETIME + MAX_SKEW


IN_FORCE, EXPIRED, IGNORED = "in force", "expired", "ignored"


def status(override: Override, now: float) -> str:
    """Whether ``override`` applies at ``now``: ``in force``, ``expired``, or ``ignored``
    (one in Redis that expires further ahead than a set could write: written by hand)."""
    if override.expires <= now:
        return EXPIRED
    if override.source == RUNTIME and not in_bounds(override.expires, now):
        return IGNORED
    return IN_FORCE


def next_expiry(overrides: Iterable[Override], now: float) -> float:
    """When the first override in force at ``now`` expires (``inf`` with none)."""
    return min((o.expires for o in overrides if o.expires > now), default=math.inf)


def by_field(overrides: Iterable[Override]) -> Mapping[str, Override]:
    """Overrides by their hash field (the last of two with one field wins)."""
    return {o.field: o for o in overrides}


def from_file(policy: Policy) -> tuple[Override, ...]:
    """The policy file's ``overrides:`` as overrides (source ``file``)."""
    return tuple(
        Override(
            limit=entry.limit,
            kind=entry.kind,
            value=entry.value,
            rates=tuple(str(rate) for rate in entry.rates or ()),
            expires=entry.expires_at,
            reason=entry.reason,
            by="policy file",
            source=FILE,
            quotas=tuple(
                (period.value, units)
                for period, units in (entry.quotas.periods() if entry.quotas else ())
            ),
            concurrency=entry.concurrency,
        )
        for entry in policy.overrides
    )
