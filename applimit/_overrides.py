"""Per-customer overrides: one identity's own rates for one limit, as values. No I/O.

An :class:`Override` gives one identity (a user, or the value of an app key such as
``org``) its own list of rates for one limit, replacing the rates of its tier, until it
expires; it carries a reason and who set it. Overrides come from two places: set at run
time in Redis (``applimit override set``, :class:`~applimit.Overrides`; see
``_override_store.py``) and written in the policy file (``overrides:``, reviewed with the
policy). :func:`checked` is the one gate of a run-time override; :func:`table` turns every
override in force into what the planner reads: per (limit, hash tag), the encoded blocks
of the override's rates (``_calls.blocks``, under the tier name :data:`OVERRIDE_TIER`).

The shape leaves room for the other kinds of limit an override may later carry (quotas
on calendar periods, concurrency): each would be a field beside ``rates``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from edgegen_policy import Policy, Rate, checked_rates, period_us

from . import _keys
from ._arguments import check_identity, check_rule
from ._calls import Block, blocks
from ._errors import InvalidArgumentError
from ._rules import AppRule, CompiledPolicy, RateSpec

# The tier name a decision's results carry when an override's rates applied.
OVERRIDE_TIER = "override"
# The version of an override's JSON document in Redis.
FORMAT = 1
# Bounds of what an override may hold.
MAX_RATES = 8
MAX_REASON = 500
MAX_BY = 200
MAX_VALUE = 1024
# The furthest an override set at run time may expire: contract rates that last longer
# belong in the reviewed file (``overrides:`` in the policy).
MAX_LIFETIME = 400 * 86_400.0
USER = "user"
RUNTIME = "runtime"
FILE = "file"


@dataclass(frozen=True, slots=True)
class Override:
    """One identity's own rates for one limit, until ``expires`` (Unix seconds).

    ``kind`` is what the limit counts by: ``user``, or the app key's name (``org``);
    ``value`` the user id or the key's value. ``by`` and ``at`` say who set it and when;
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

    @property
    def field(self) -> str:
        """The override's name in Redis' hash of overrides: limit, kind and value."""
        return field(self.limit, self.kind, self.value)

    def describe(self) -> str:
        """``limit 'api' for org 'acme'``: for messages."""
        return f"limit {self.limit!r} for {self.kind} {self.value!r}"

    def document(self) -> dict[str, Any]:
        """The override as a JSON object (Redis, ``applimit override list --format json``)."""
        return {
            "version": FORMAT,
            "limit": self.limit,
            "kind": self.kind,
            "value": self.value,
            "rates": list(self.rates),
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
    """An override from its JSON document; ValueError when it is not one."""
    raw = json.loads(text)
    if not isinstance(raw, dict) or raw.get("version") != FORMAT:
        raise ValueError("not an override document of version 1")
    rates = raw.get("rates")
    strings = (raw.get("limit"), raw.get("kind"), raw.get("value"), raw.get("reason"))
    if not isinstance(rates, list) or not all(isinstance(s, str) for s in strings):
        raise ValueError("an override document without its limit, kind, value or rates")
    expires = raw.get("expires")
    if not isinstance(expires, int | float) or isinstance(expires, bool):
        raise ValueError("an override document without its expiry")
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
    )


def counted_kind(rule: AppRule) -> str | None:
    """What an override of ``rule`` names: ``user``, the app key's name, or None for a
    limit that counts client addresses (which no override names)."""
    if rule.per_ip:
        return None
    return rule.per_key if rule.per_key is not None else USER


def _text(argument: str, value: object, bound: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(argument, f"{argument} must be a non-empty str.")
    if len(value) > bound or not value.isprintable():
        raise InvalidArgumentError(
            argument,
            f"{argument} must be at most {bound} characters, without control characters.",
        )
    return value


def checked_rates_of(rates: object, argument: str = "rates") -> tuple[str, ...]:
    """``rates`` (``["100/1m", "5000/1d"]``) checked and written as the policy writes them."""
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
    return Override(
        limit=rule.name,
        kind=wanted,
        value=name,
        rates=checked_rates_of(rates),
        expires=float(expires),
        reason=_text("reason", reason, MAX_REASON),
        by=_text("by", by, MAX_BY),
        at=now,
    )


@dataclass(frozen=True, slots=True)
class Applied:
    """An override as the planner uses it: its blocks for a hit, and for ``record``."""

    override: Override
    blocks: tuple[Block, ...]
    record_blocks: tuple[Block, ...]


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


def applied(policy: CompiledPolicy, override: Override) -> tuple[tuple[str, str], Applied] | None:
    """The planner's entry for ``override``: its (limit, tag) and blocks; None when the
    policy no longer has its limit, or the limit counts by something else now."""
    rule = policy.by_name.get(override.limit)
    if rule is None or counted_kind(rule) != override.kind:
        return None
    try:
        specs = _specs(override.rates)
    except ValueError:
        return None
    own = replace(rule, tiers=MappingProxyType({OVERRIDE_TIER: specs}))
    prefix = policy.key_prefix
    entry = Applied(
        override,
        # The checks keep the policy's rule; only the rates and the tier name differ.
        blocks(prefix, own, OVERRIDE_TIER),
        blocks(prefix, own, OVERRIDE_TIER, record=True),
    )
    return (rule.name, tag(rule, override.value)), entry


def table(
    policy: CompiledPolicy, overrides: Iterable[Override], now: float
) -> Mapping[tuple[str, str], Applied]:
    """Every override in force at ``now`` (Unix seconds), by (limit, tag). A run-time
    override wins over the file's for the same identity and limit."""
    found: dict[tuple[str, str], Applied] = {}
    for override in sorted(overrides, key=lambda o: o.source == RUNTIME):
        if override.expires <= now:
            continue
        entry = applied(policy, override)
        if entry is not None:
            found[entry[0]] = entry[1]
    return MappingProxyType(found)


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
            rates=tuple(str(rate) for rate in entry.rates),
            expires=entry.expires_at,
            reason=entry.reason,
            by="policy file",
            source=FILE,
        )
        for entry in policy.overrides
    )
