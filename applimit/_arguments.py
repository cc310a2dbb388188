"""What a caller passes, checked, and what each limit counts the caller by.

``hit``, ``peek``, ``reset`` and ``check_request`` take a limit's name, a tier, an
identity, ``ip=``, ``keys=`` and a cost. Each is checked here, and a wrong one raises the
package's own error (:class:`~applimit.UnknownLimitError`,
:class:`~applimit.UnknownTierError`, :class:`~applimit.InvalidArgumentError`) with a
message that names the argument and the fix. The tags (:func:`request_tag`,
:func:`limit_tag`) are the hash-tag content a limit's keys count a caller by: the user, an
app key (``per: org``) or the client address.

These functions take what a caller passed as ``object``, not as the limiters document it:
a build compiled with mypyc (setup.py) checks every typed argument on entry, and would
raise a bare TypeError before these checks could say what is wrong and how to fix it. The
errors show a value of the wrong type as it was given: through a variable typed Any, which
mypyc does not check (it checks a cast()). Compiled by mypyc.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from edgegen_policy import ip_bucket

from . import _keys
from ._errors import InvalidArgumentError, UnknownLimitError, UnknownTierError
from ._rules import AppRule, CompiledPolicy

MAX_COST = 1_000_000_000


def check_tier(policy: CompiledPolicy, tier: object) -> str:
    """The tier to use: the given one if the policy lists it, else the lowest one."""
    if tier is None:
        return policy.tiers[0]
    if not isinstance(tier, str) or tier not in policy.tiers:
        given: Any = tier
        raise UnknownTierError(given, policy.tiers)
    return tier


def check_rule(policy: CompiledPolicy, name: object) -> AppRule:
    """The app limit called ``name``; UnknownLimitError names the ones that exist."""
    rule = policy.by_name.get(name) if isinstance(name, str) else None
    if rule is None:
        given: Any = name
        raise UnknownLimitError(given, policy.by_name, edge_only=name in policy.edge_only)
    return rule


def check_cost(cost: object) -> int:
    """``cost`` checked: a whole number from 1 to a billion."""
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise InvalidArgumentError(
            "cost", f"cost must be a whole number of requests, not {cost!r}."
        )
    if not 1 <= cost <= MAX_COST:
        raise InvalidArgumentError(
            "cost",
            f"cost {cost} is out of range; a request costs from 1 to {MAX_COST:,} "
            "(use peek() to look without consuming).",
        )
    return cost


def check_status(status: object) -> int:
    """A response's ``status`` checked: a whole number from 100 to 599."""
    if isinstance(status, bool) or not isinstance(status, int):
        raise InvalidArgumentError(
            "status", f"status must be the response's HTTP status as a number, not {status!r}."
        )
    if not 100 <= status <= 599:
        raise InvalidArgumentError("status", f"status {status} is not an HTTP status (100 to 599).")
    return status


def check_counted_later(rule: AppRule) -> AppRule:
    """``rule``, which record() was asked to count: it must say count_when."""
    if not rule.count_when:
        raise InvalidArgumentError(
            "name",
            f"limit {rule.name!r} counts every request (it has no count_when), so hit() "
            "already counted this one; record() is for limits with count_when.",
        )
    return rule


def check_identity(identity: object, argument: str) -> str:
    """An identity (or ``ip=``, or an app key's value) passed as ``argument``, checked: a
    non-empty str."""
    if not isinstance(identity, str):
        raise InvalidArgumentError(
            argument,
            f"{argument} must be a str, not {type(identity).__name__}; convert it, "
            f"e.g. str(user.id).",
        )
    if not identity:
        raise InvalidArgumentError(
            argument,
            f"{argument} is empty; every caller with an empty {argument} would share "
            "one quota. Pass the user's id, or None with ip= for anonymous callers.",
        )
    return identity


def check_keys(keys: object) -> Mapping[str, object] | None:
    """The app keys of a call (``keys=``, checked), or None."""
    if keys is not None:
        # A dict, and the read-only view a Caller keeps, skip the Mapping ABC's
        # isinstance: for a mappingproxy (registered with the ABC, not a subclass) it runs
        # the ABC's whole subclass check every time.
        if (
            type(keys) is not dict
            and type(keys) is not MappingProxyType
            and not isinstance(keys, Mapping)
        ):
            raise InvalidArgumentError(
                "keys",
                f"keys must be a mapping of key names to values, not "
                f"{type(keys).__name__}; e.g. keys={{'org': org.id}}.",
            )
        return keys
    return None


def _key_value(rule: AppRule, keys: Mapping[str, object] | None) -> str | None:
    """The value of the app key ``rule`` counts by, checked; None when it is missing."""
    assert rule.per_key is not None
    value = keys.get(rule.per_key) if keys else None
    if value is None:
        return None
    return check_identity(value, f"keys[{rule.per_key!r}]")


def request_tag(
    policy: CompiledPolicy,
    rule: AppRule,
    identity: object,
    ip: object,
    keys: Mapping[str, object] | None = None,
) -> str:
    """The hash-tag content ``check_request`` counts ``rule`` by: the user, the app key it
    names (``per: org``), or the client address for a per-IP limit and a caller without
    what the limit counts (an anonymous caller, or one whose identify returned no such
    key: counting by address keeps such callers limited, never unlimited)."""
    if rule.per_key is not None:
        value = _key_value(rule, keys)
        if value is not None:
            return _keys.identity_tag(_keys.named_kind(rule.per_key), value)
        return ip_tag(policy, rule, ip)
    if not rule.per_ip and identity is not None:
        return _keys.identity_tag(_keys.USER, check_identity(identity, "identity"))
    return ip_tag(policy, rule, ip)


def limit_tag(
    policy: CompiledPolicy,
    rule: AppRule,
    identity: object,
    ip: object,
    keys: object = None,
) -> str:
    """What ``hit``/``peek``/``reset`` count ``rule`` by: as ``check_request`` does.
    A per-IP limit takes the address only as ``ip=``: an identity in its place would be
    counted as an address, and a user who may choose their own name (a login form's
    username) could then exhaust the quota of any address they spell. Likewise a
    ``per: org`` limit takes the organisation only in ``keys=``, never as the identity."""
    if keys is None and rule.per_key is None and not rule.per_ip and type(identity) is str:
        # A user counted by a per-user limit (most calls): what the steps below give for
        # it, without the ones that do not apply.
        return _keys.identity_tag(_keys.USER, check_identity(identity, "identity"))
    if rule.per_ip and ip is None and identity is not None:
        raise InvalidArgumentError(
            "ip",
            f"limit {rule.name!r} counts per client IP, and hit/peek/reset take the "
            f"address only as ip=, never as the identity; call "
            f"hit({rule.name!r}, None, ip=client_address).",
        )
    checked = check_keys(keys)
    if rule.per_key is not None and ip is None and _key_value(rule, checked) is None:
        raise InvalidArgumentError(
            "keys",
            f"limit {rule.name!r} counts per {rule.per_key}, but no keys["
            f"{rule.per_key!r}] was given; call hit({rule.name!r}, user, "
            f"keys={{{rule.per_key!r}: value}}), or pass ip= to count a caller without "
            f"one by address (as check_request does).",
        )
    return request_tag(policy, rule, identity, ip, checked)


def ip_tag(policy: CompiledPolicy, rule: AppRule, ip: object) -> str:
    """A client address as a tag of kind ``i``: IPv4 per address, IPv6 per network of the
    policy's ``clients.ipv6_prefix`` (policy.ip_bucket)."""
    if ip is None:
        if rule.per_ip:
            what = "counts per client IP"
        elif rule.per_key is not None:
            what = f"counts callers without keys[{rule.per_key!r}] by IP"
        else:
            what = "counts anonymous callers by IP"
        raise InvalidArgumentError(
            "ip",
            f"limit {rule.name!r} {what}, but no ip= was given; pass the client's "
            "address (the middleware does).",
        )
    address = check_identity(ip, "ip")
    return _keys.identity_tag(_keys.IP, ip_bucket(address, policy.ipv6_prefix))
