"""A ruleset write Cloudflare refused, traced back to the policy: each error to the rule at
fault (by its index in the body sent), so to its limit, and to the policy line of the
limit's field that the rule's refused part is compiled from. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from edgegen_policy import Policy

from ..compiler import _compile
from ..errors import CloudflareAPIError, Rejection


def rejections(
    error: CloudflareAPIError, body: Mapping[str, Any], names: Mapping[str, str]
) -> list[Rejection]:
    """Trace each error of a rejected ruleset PUT to the rule, and so the limit, at fault.

    Cloudflare's ``source.pointer`` is ``/rules/N/...``: N is the rule's index in the body
    sent, whose ``ref`` names the limit.
    """
    rules = body.get("rules") or []
    out = []
    for detail in error.errors:
        pointer = detail.pointer or ""
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
        index: int | None = None
        ref: str | None = None
        if len(parts) >= 2 and parts[0] == "rules" and parts[1].isdigit():
            index = int(parts[1])
            if index < len(rules) and isinstance(rules[index], Mapping):
                raw_ref = rules[index].get("ref")
                ref = raw_ref if isinstance(raw_ref, str) else None
            parts = parts[2:]
        elif parts[:1] == ["rules"]:
            parts = parts[1:]
        out.append(
            Rejection(
                index=index,
                ref=ref,
                limit=names.get(ref) if ref else None,
                field=".".join(parts),
                code=detail.code,
                message=detail.message,
            )
        )
    return out


# The policy field (under limits[i]) each part of a generated rule is compiled from; the
# first prefix that matches wins, so a rejected part is reported at its line in the file.
_RULE_FIELD_SOURCES: Final = (
    ("ratelimit.period", ("edge", "rate")),
    ("ratelimit.requests_per_period", ("edge", "rate")),
    ("ratelimit.mitigation_timeout", ("edge", "timeout")),
    ("ratelimit.counting_expression", ("count_when",)),
    ("ratelimit.characteristics", ("edge", "per")),
    ("action", ("edge", "action")),
    ("expression", ("match",)),
)


_CREDENTIALED_RATE_FIELDS: Final = ("ratelimit.period", "ratelimit.requests_per_period")


def policy_field(rule_field: str, *, credentialed_rate: bool = False) -> tuple[str, ...]:
    """The field of a limit that a rule's ``rule_field`` (``ratelimit.period``) comes from.

    ``credentialed_rate``: the rule is the limit's second rule, for requests that carry a
    credential, and the limit writes the ``credentialed_rate`` its rate comes from (one
    left out is ten times ``rate``, so ``rate`` is where to change it).
    """
    for prefix, source in _RULE_FIELD_SOURCES:
        if rule_field == prefix or rule_field.startswith(prefix + "."):
            if credentialed_rate and prefix in _CREDENTIALED_RATE_FIELDS:
                return ("edge", "credentialed_rate")
            return source
    return ("edge",)


def locate_rejections(found: Iterable[Rejection], source: Policy) -> list[Rejection]:
    """``found`` with ``where`` set to the policy line each limit's rejected field is on.

    Rules edgegen does not manage, and limits the policy does not have (a plan made from
    another version), stay as they are.
    """
    out = []
    for rejection in found:
        where = None
        if rejection.limit is not None:
            try:
                index = source.limit_index(rejection.limit)
            except KeyError:
                index = None
            if index is not None:
                edge = source.limits[index].edge
                second = rejection.ref == _compile.credentialed_rule_ref(rejection.limit)
                written = second and edge is not None and edge.credentialed_rate is not None
                path = policy_field(rejection.field, credentialed_rate=written)
                position = source.locate("limits", index, *path)
                if position is not None:
                    where = f"{position[0]}:{position[1]}:{position[2]}"
        out.append(replace(rejection, where=where) if where else rejection)
    return out
