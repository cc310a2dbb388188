"""Where each edge limit runs (a rule or the Worker), and lint's L2xx findings about it.

Placement is pure and deterministic, and it is the one decision both lint and the compiler
read, so ``edgegen validate`` and ``edgegen build`` always agree on where a limit runs:

- a limit goes to a **rule** when the plan can express it (period, mitigation timeout,
  action, every field its matcher and "unauthenticated only" need) and a rule slot is free;
- otherwise to the **Worker**, when the binding can express it (period 10 s or 60 s, the
  ``block`` action);
- otherwise nowhere, and the decision carries a sentence naming the limit, what is missing
  and the nearest thing that would work.

An "unauthenticated only" limit (with credentials listed in ``authenticated_when``) has two
counters: requests without a credential at ``rate``, requests that carry one at the looser
``policy.credentialed_rate``. As rules that is two rules (both count against the quota); in
the Worker, two bindings. Both counters must fit the target.

Rule slots go first to limits forced with ``target: rule``, then to limits only a rule can
carry, then to the rest in policy order, so a full quota pushes the most flexible limits to
the Worker rather than failing.

A limit with ``count_when`` (count only answers of some statuses) is a rule with a
counting expression where the plan has one (Business and up); elsewhere the Worker carries
it (L215), checking a spent mark before forwarding and counting after the origin's answer.
With ``unauthenticated_only`` both counters count only those statuses, each at its own
rate; with ``requests_to_origin`` a rule counts only answers that came from the origin
(the Worker still counts every answer, L212).

The findings are contributed to ``policy.lint`` and ``policy.check`` as :data:`EDGE_CHECKS`
(the policy package never imports edgegen). Their codes:

======  ========  =====  ==========================================================
code    severity  stops  meaning
======  ========  =====  ==========================================================
L201    error     edge   an edge limit that neither a rule on the plan nor the Worker can carry
L202    error     edge   ``target: rule``, but the plan cannot carry the limit as a rule
L203    error     edge   ``target: worker``, but the Worker binding cannot carry the limit
L204    error     edge   limits must run in the Worker but there is no ``cloudflare.worker``
L205    warning          a period or timeout the plan does not offer sends a limit to the Worker
L206    info             a field the plan's rules cannot use sends a limit to the Worker
L207    info             the plan's rule quota is used up, so a limit goes to the Worker
L208    info             a limit in the Worker has a timeout the Worker cannot honour
L209    warning          the Worker carries limits but has no routes
L210    warning          a rule counts each IPv6 address, the policy counts IPv6 per network
L211    warning          a limit in the Worker names hosts no route of the Worker covers
                         (info when only a rule can carry the limit)
L212    warning          a limit with ``requests_to_origin`` runs in the Worker, which counts
                         every request, cached ones included
L213    info             the plan's rules cannot count by the limit's key (``per``), so it
                         goes to the Worker
L214    warning          a limit ``per: ip_nat`` runs in the Worker, which counts per client IP
L216    warning          ``edge.tiers``: a tier whose app rates have no period the Worker
                         binding offers (10 s, 1 min) is held to ``rate`` at the edge
L215    info             a limit with ``count_when`` runs in the Worker because the plan's
                         rules have no counting expression
======  ========  =====  ==========================================================

A limit keyed by a header or a cookie takes two rules where a rule carries it: requests
that carry the key, counted per its value, and requests without it, counted per client IP
(a characteristic missing from a request would otherwise count all such requests together,
in one counter per data centre).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from edgegen_policy import (
    Action,
    Check,
    Checked,
    Diagnostic,
    Duration,
    EdgeKey,
    EdgeLimit,
    EdgeTarget,
    Layer,
    Limit,
    Policy,
    Rate,
    Severity,
    credentialed_rate,
    diagnostic_at,
)
from edgegen_policy import check as policy_check

from ._capabilities import (
    CHALLENGES,
    COOKIES,
    FIELD_LABELS,
    HEADERS,
    HOST,
    METHOD,
    PATH,
    PLANS,
    WORKER,
    PlanCapabilities,
    key_kind,
    key_text,
    lowest_plan_with_field,
    lowest_plan_with_key,
    rule_can_key,
)
from ._routes import route_parts


def rule_count(policy: Policy, limit: Limit) -> int:
    """How many rules the limit takes as rules: two when credentialed requests count apart,
    or when requests without its header or cookie key are counted apart by address."""
    if credentialed_rate(policy, limit) is not None:
        return 2
    return 2 if limit.edge is not None and key_kind(limit.edge.per) in ("header", "cookie") else 1


def key_shortfall(edge: EdgeLimit, caps: PlanCapabilities) -> Shortfall | None:
    """What rules on a plan lack to count by the limit's key (None: nothing)."""
    kind = key_kind(edge.per)
    if rule_can_key(caps, kind):
        return None
    plan = f"the {caps.plan.value} plan"
    if kind == "jwt":
        return Shortfall(
            "key",
            "rules can count by a JWT claim only through API Shield's token validation, which "
            "the policy does not configure",
            "let the Worker verify the token and count the claim (target: auto or worker)",
            ("edge", "per"),
        )
    lowest = lowest_plan_with_key(kind)
    assert lowest is not None
    return Shortfall(
        "key",
        f"rules on {plan} cannot count per {key_text(edge.per)}",
        f"use the {lowest.label} plan or above",
        ("edge", "per"),
    )


def credentialed_timeout(edge: EdgeLimit, rate: Rate) -> int | None:
    """The mitigation timeout of the rule for credentialed requests (at ``rate``)."""
    if edge.action is Action.BLOCK and edge.timeout is None:
        return rate.period.whole_seconds
    return _effective_timeout(edge)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """One thing a target lacks for a limit: what, where in the limit, and the fix."""

    kind: str  # "period", "timeout", "action", "field", "quota"
    what: str
    fix: str
    field: tuple[str | int, ...] = ("edge",)


@dataclass(frozen=True, slots=True)
class EdgePlacement:
    """Where one edge limit runs, and why; ``target`` is None when nothing can carry it.

    ``period`` is the limit's period in seconds (None when not whole seconds);
    ``mitigation_timeout`` is what the rule sends (only meaningful for rules).
    ``credentialed`` is the rate for requests that carry a credential when the limit counts
    them apart (a second rule or binding), with that rule's ``credentialed_timeout``.
    ``findings`` are the limit's L2xx diagnostics; ``error`` (with what it ``lacks`` and the
    ``fix``) the sentence of the one that stops the build, when nothing can carry it.
    """

    index: int
    limit: str
    target: EdgeTarget | None
    reasons: tuple[str, ...]
    period: int | None
    mitigation_timeout: int | None
    rule_shortfalls: tuple[Shortfall, ...] = ()
    worker_shortfalls: tuple[Shortfall, ...] = ()
    error: str | None = None
    error_lacks: str | None = None
    error_fix: str | None = None
    findings: tuple[Diagnostic, ...] = field(default=())
    credentialed: Rate | None = None
    credentialed_timeout: int | None = None


def _seconds_text(seconds: int) -> str:
    return str(Duration(seconds * 1000))


def _list_text(values: Iterable[str], joiner: str = "or") -> str:
    items = list(values)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {joiner} {items[-1]}"


def _periods_text(periods: tuple[int, ...]) -> str:
    return _list_text(_seconds_text(p) for p in periods)


def _nearest(value_ms: int, candidates: Iterable[int]) -> list[int]:
    """The one or two candidate periods (seconds) closest to a period, by ratio."""
    ordered = sorted(set(candidates))
    if not ordered:
        return []
    below = [c for c in ordered if c * 1000 <= value_ms]
    above = [c for c in ordered if c * 1000 > value_ms]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    if len(picks) == 2:
        # Keep both unless one is far closer (by ratio) than the other.
        low, high = picks
        ratio_low = math.log(value_ms / (low * 1000))
        ratio_high = math.log((high * 1000) / value_ms)
        if ratio_low * 4 < ratio_high:
            picks = [low]
        elif ratio_high * 4 < ratio_low:
            picks = [high]
    return picks


def _scaled_rates(limit: int, period_ms: int, periods: list[int]) -> str:
    rates = [f"{max(1, round(limit * p * 1000 / period_ms))}/{_seconds_text(p)}" for p in periods]
    return _list_text(rates)


def _effective_timeout(edge: EdgeLimit) -> int | None:
    """The mitigation timeout a rule would send (None: not a whole number of seconds)."""
    if edge.action is Action.BLOCK:
        chosen = edge.timeout if edge.timeout is not None else edge.rate.period
        return chosen.whole_seconds
    if edge.action is Action.LOG:
        return 0 if edge.timeout is None else edge.timeout.whole_seconds
    # Challenges: throttle (0) unless a timeout is given, which only Enterprise allows.
    if edge.timeout is None:
        return 0
    return edge.timeout.whole_seconds


def rule_shortfalls(policy: Policy, limit: Limit, caps: PlanCapabilities) -> list[Shortfall]:
    """Everything a rule on this plan lacks to express the limit (empty: it can)."""
    edge = limit.edge
    assert edge is not None
    out: list[Shortfall] = []
    plan = f"the {caps.plan.value} plan"
    period = edge.rate.period.whole_seconds
    if period not in caps.periods.value:
        picks = _nearest(edge.rate.period.ms, caps.periods.value)
        out.append(
            Shortfall(
                "period",
                f"period {edge.rate.period} is not available on {plan} (it offers "
                f"{_periods_text(caps.periods.value)})",
                f"use {_scaled_rates(edge.rate.limit, edge.rate.period.ms, picks)}",
                ("edge", "rate"),
            )
        )
    if edge.action not in caps.actions.value:
        out.append(
            Shortfall(
                "action",
                f"the {edge.action.value} action is not available on {plan}",
                "use action: block, or an Enterprise plan",
                ("edge", "action"),
            )
        )
    timeout = _effective_timeout(edge)
    period_lacks = period not in caps.periods.value
    if edge.action in CHALLENGES and edge.timeout is not None and not caps.challenge_timeout.value:
        out.append(
            Shortfall(
                "timeout",
                f"{edge.action.value} cannot have a timeout on {plan} (Cloudflare requires "
                "mitigation_timeout 0 for challenges below Enterprise)",
                "remove timeout",
                ("edge", "timeout"),
            )
        )
    elif (timeout is None or (timeout != 0 and timeout not in caps.mitigation_timeouts.value)) and (
        # A timeout that only follows from an unavailable period is not a second problem.
        edge.timeout is not None or not period_lacks
    ):
        what = edge.timeout if edge.timeout is not None else edge.rate.period
        picks = _nearest(what.ms, caps.mitigation_timeouts.value)
        out.append(
            Shortfall(
                "timeout",
                f"a timeout of {what} is not available on {plan} (it offers "
                f"{_periods_text(caps.mitigation_timeouts.value)})",
                f"set timeout: {_list_text(_seconds_text(p) for p in picks)}",
                ("edge", "timeout") if edge.timeout is not None else ("edge", "rate"),
            )
        )
    if edge.requests_to_origin and not caps.requests_to_origin.value:
        origin_plan = next(c for c in PLANS.values() if c.requests_to_origin.value)
        out.append(
            Shortfall(
                "origin",
                f"rules on {plan} cannot count only requests that reach the origin "
                "(requests_to_origin)",
                f"use the {origin_plan.label} plan or above",
                ("edge", "requests_to_origin"),
            )
        )
    out.extend(_counter_shortfalls(policy, limit, caps))
    matcher = limit.match.matcher()
    needed: list[str] = []
    if not matcher.matches_all_paths:
        needed.append(PATH)
    if matcher.hosts:
        needed.append(HOST)
    if matcher.methods:
        needed.append(METHOD)
    when = policy.authenticated_when
    if edge.unauthenticated_only:
        if when.headers:
            needed.append(HEADERS)
        if when.cookies:
            needed.append(COOKIES)
    missing = [name for name in needed if not caps.has_field(name)]
    if missing:
        labels = _list_text((FIELD_LABELS[name] for name in missing), "and")
        lowest = max(
            (lowest_plan_with_field(name) for name in missing),
            key=lambda c: list(PLANS).index(c.plan) if c else len(PLANS),
        )
        auth = edge.unauthenticated_only and (HEADERS in missing or COOKIES in missing)
        why = '"unauthenticated only" needs ' if auth else "its matcher needs "
        fix = f"use the {lowest.label} plan or above" if lowest else "remove them from match"
        if auth:
            fix += ", or set unauthenticated_only: false"
        out.append(
            Shortfall(
                "field",
                f"{why}{labels}, which rules on {plan} cannot use",
                fix,
                ("edge", "unauthenticated_only") if auth else ("match",),
            )
        )
    out.extend(_counting_shortfalls(limit, caps))
    return out


def _counter_shortfalls(policy: Policy, limit: Limit, caps: PlanCapabilities) -> list[Shortfall]:
    """What a rule lacks to count as the limit does: the credentialed rule, and the key."""
    edge = limit.edge
    assert edge is not None
    out: list[Shortfall] = []
    credentialed = credentialed_rate(policy, limit)
    if credentialed is not None and credentialed.period != edge.rate.period:
        out.extend(_credentialed_rule_shortfalls(edge, credentialed, caps))
    keyed = key_shortfall(edge, caps)
    if keyed is not None:
        out.append(keyed)
    return out


def _credentialed_rule_shortfalls(
    edge: EdgeLimit, credentialed: Rate, caps: PlanCapabilities
) -> list[Shortfall]:
    """What the second rule (requests with a credential) lacks when its period is its own."""
    plan = f"the {caps.plan.value} plan"
    if credentialed.period.whole_seconds not in caps.periods.value:
        picks = _nearest(credentialed.period.ms, caps.periods.value)
        return [
            Shortfall(
                "period",
                f"credentialed_rate period {credentialed.period} is not available on {plan} "
                f"(it offers {_periods_text(caps.periods.value)})",
                "use credentialed_rate: "
                + _scaled_rates(credentialed.limit, credentialed.period.ms, picks),
                ("edge", "credentialed_rate"),
            )
        ]
    timeout = credentialed_timeout(edge, credentialed)
    if timeout is None or (timeout != 0 and timeout not in caps.mitigation_timeouts.value):
        picks = _nearest(credentialed.period.ms, caps.mitigation_timeouts.value)
        return [
            Shortfall(
                "timeout",
                f"a timeout of {credentialed.period} (the credentialed_rate period) is not "
                f"available on {plan} (it offers "
                f"{_periods_text(caps.mitigation_timeouts.value)})",
                f"set timeout: {_list_text(_seconds_text(p) for p in picks)}",
                ("edge", "credentialed_rate"),
            )
        ]
    return []


def worker_shortfalls(limit: Limit, policy: Policy | None = None) -> list[Shortfall]:
    """Everything the Worker binding lacks to express the limit (empty: it can).

    With the policy, the binding for credentialed requests is checked too.
    """
    edge = limit.edge
    assert edge is not None
    out: list[Shortfall] = []
    periods = WORKER.periods.value
    if edge.rate.period.whole_seconds not in periods:
        picks = _nearest(edge.rate.period.ms, periods)
        out.append(
            Shortfall(
                "period",
                f"the Worker binding only offers periods of {_periods_text(periods)}, not "
                f"{edge.rate.period}",
                f"use {_scaled_rates(edge.rate.limit, edge.rate.period.ms, picks)}",
                ("edge", "rate"),
            )
        )
    credentialed = credentialed_rate(policy, limit) if policy is not None else None
    if (
        credentialed is not None
        and credentialed.period != edge.rate.period
        and credentialed.period.whole_seconds not in periods
    ):
        picks = _nearest(credentialed.period.ms, periods)
        out.append(
            Shortfall(
                "period",
                f"the Worker binding only offers periods of {_periods_text(periods)}, not "
                f"{credentialed.period} (credentialed_rate)",
                "use credentialed_rate: "
                + _scaled_rates(credentialed.limit, credentialed.period.ms, picks),
                ("edge", "credentialed_rate"),
            )
        )
    if edge.action not in WORKER.actions.value:
        out.append(
            Shortfall(
                "action",
                f"the Worker can only answer 429 (block), not {edge.action.value}",
                "use action: block",
                ("edge", "action"),
            )
        )
    return out


def _error_message(
    limit: str, rule_lacks: list[Shortfall], worker_lacks: list[Shortfall], forced: EdgeTarget
) -> tuple[str, str, str]:
    """The sentence for a limit nothing can carry: (message, what is lacking, the fix)."""
    rule_what = "; ".join(s.what for s in rule_lacks)
    worker_what = "; ".join(s.what for s in worker_lacks)
    worker_fix = " and ".join(dict.fromkeys(s.fix for s in worker_lacks))
    rule_fix = " and ".join(dict.fromkeys(s.fix for s in rule_lacks))
    if forced is EdgeTarget.RULE:
        lacks, fix = rule_what, f"{rule_fix}, or set target: auto so the Worker can carry it"
        if worker_lacks:
            fix = rule_fix
    elif forced is EdgeTarget.WORKER:
        lacks, fix = worker_what, worker_fix
        if not rule_lacks:
            fix += ", or remove target: worker (a rule can carry it)"
    else:
        lacks = f"{rule_what}, and {worker_what}"
        fix = worker_fix
        if rule_fix and rule_fix != worker_fix:
            fix += f"; or, to make it a rule, {rule_fix}"
    return f"limit {limit!r}: {lacks}; {fix}", lacks, fix


def place(policy: Policy) -> tuple[EdgePlacement, ...]:
    """Decide where every edge limit of the policy runs; pure and deterministic.

    Returns one placement per limit with an ``edge`` part, in policy order. A policy without
    a ``cloudflare`` section has no plan, so nothing is placed (lint reports L004).
    """
    if policy.cloudflare is None:
        return ()
    caps = PLANS[policy.cloudflare.plan]
    edges = [(i, limit) for i, limit in enumerate(policy.limits) if limit.edge is not None]
    targets = {i: limit.edge.target for i, limit in edges if limit.edge is not None}
    rule_lacks = {i: rule_shortfalls(policy, limit, caps) for i, limit in edges}
    worker_lacks = {i: worker_shortfalls(limit, policy) for i, limit in edges}
    slots = {i: rule_count(policy, limit) for i, limit in edges}

    # Rule slots: forced rules first, then limits only a rule can carry, then the rest; a
    # limit that needs two rules and finds one free goes on, and later limits may take it.
    candidates = [i for i, _ in edges if targets[i] is not EdgeTarget.WORKER and not rule_lacks[i]]
    forced = [i for i in candidates if targets[i] is EdgeTarget.RULE]
    # A limit that counts only requests to the origin is honoured by a rule alone, so it
    # comes before the limits the Worker carries just as well.
    rule_only = [
        i for i in candidates if i not in forced and (worker_lacks[i] or _rule_preferred(policy, i))
    ]
    flexible = [i for i in candidates if i not in forced and i not in rule_only]
    quota = caps.max_rules.value
    granted: set[int] = set()
    used = 0
    for index in forced + rule_only + flexible:
        if used + slots[index] <= quota:
            granted.add(index)
            used += slots[index]
    placements: list[EdgePlacement] = []
    for index, limit in edges:
        lacks = list(rule_lacks[index])
        if not lacks and index not in granted and targets[index] is not EdgeTarget.WORKER:
            lacks.append(_quota_full(caps, slots[index]))
        placements.append(
            _place(
                policy,
                caps,
                index,
                limit,
                rule_lacks=lacks,
                worker_lacks=worker_lacks[index],
                credentialed=credentialed_rate(policy, limit),
            )
        )
    return tuple(placements)


def _rule_preferred(policy: Policy, index: int) -> bool:
    limit = policy.limits[index]
    edge = limit.edge
    # count_when too: a rule's counter is the one it decides on, where the Worker's spent
    # mark reaches the location's other isolates through the Cache API, with a lag
    # (docs/edge.md, "Counting only some answers").
    return edge is not None and (edge.requests_to_origin or limit.count_when is not None)


def _quota_full(caps: PlanCapabilities, needed: int) -> Shortfall:
    quota = caps.max_rules.value
    rules = f"{quota} rate limiting rule{'s' if quota != 1 else ''}"
    if needed == 1:
        what = f"the {caps.plan.value} plan allows {rules} and other limits already use " + (
            "them" if quota != 1 else "it"
        )
    else:
        what = (
            f"the {caps.plan.value} plan allows {rules}; this limit needs {needed} (one more "
            "for requests that carry a credential, or that lack its key) and other limits "
            "leave fewer free"
        )
    return Shortfall(
        "quota", what, "move another limit to the Worker with target: worker, or use a larger plan"
    )


# The finding of a shortfall that sends a limit to the Worker, by its kind (L206 else).
_SHORTFALL_CODES = {
    "period": "L205",
    "timeout": "L205",
    "quota": "L207",
    "key": "L213",
    "counting": "L215",
}


def _place(
    policy: Policy,
    caps: PlanCapabilities,
    index: int,
    limit: Limit,
    *,
    rule_lacks: list[Shortfall],
    worker_lacks: list[Shortfall],
    credentialed: Rate | None,
) -> EdgePlacement:
    ipv6_prefix = policy.clients.ipv6_prefix
    edge = limit.edge
    assert edge is not None
    target = edge.target
    period = edge.rate.period.whole_seconds
    base: tuple[str | int, ...] = ("limits", index)

    if target is not EdgeTarget.WORKER and not rule_lacks:
        reasons = [f"the {caps.plan.value} plan can express it as a rule"]
        if target is EdgeTarget.RULE:
            reasons.insert(0, "target: rule")
        if edge.action in CHALLENGES and not caps.challenge_timeout.value:
            reasons.append(f"{edge.action.value} throttles (mitigation_timeout 0) below Enterprise")
        if credentialed is not None:
            reasons.append(
                f"requests that carry a credential: a second rule, {credentialed} per client IP"
            )
        if key_kind(edge.per) != "ip":
            reasons.append(_rule_key_reason(edge))
        per_address: tuple[Diagnostic, ...] = ()
        if ipv6_prefix < 128 and edge.per is not EdgeKey.IP_NAT:
            per_address = (_per_address_finding(policy, limit.name, base, worker_lacks),)
        return EdgePlacement(
            index,
            limit.name,
            EdgeTarget.RULE,
            tuple(reasons),
            period,
            _effective_timeout(edge),
            findings=per_address,
            credentialed=credentialed,
            credentialed_timeout=(
                None if credentialed is None else credentialed_timeout(edge, credentialed)
            ),
        )

    if target is EdgeTarget.RULE or worker_lacks:
        message, lacks, fix = _error_message(limit.name, rule_lacks, worker_lacks, target)
        if target is EdgeTarget.RULE:
            code, path = "L202", (*base, "edge", "target")
        elif target is EdgeTarget.WORKER:
            code, path = "L203", (*base, "edge", "target")
        else:
            code, path = "L201", (*base, *worker_lacks[0].field)
        return EdgePlacement(
            index,
            limit.name,
            None,
            (lacks,),
            period,
            None,
            tuple(rule_lacks),
            tuple(worker_lacks),
            message,
            lacks,
            fix,
            (
                diagnostic_at(
                    policy,
                    path,
                    code,
                    Severity.ERROR,
                    message,
                    limit=limit.name,
                    fix=fix,
                    stops={Layer.EDGE},
                ),
            ),
        )

    why: list[str] = []
    found: list[Diagnostic] = []
    if target is EdgeTarget.WORKER:
        why.append("target: worker")
    else:
        for shortfall in rule_lacks:
            why.append(f"not a rule: {shortfall.what}")
            if shortfall.kind == "origin":
                # L212 below says it, with what the Worker does instead.
                continue
            value_kind = shortfall.kind in ("period", "timeout")
            # counting: rules below Business have no counting expression (count_when).
            code = _SHORTFALL_CODES.get(shortfall.kind, "L206")
            found.append(
                diagnostic_at(
                    policy,
                    (*base, *shortfall.field),
                    code,
                    Severity.WARNING if value_kind else Severity.INFO,
                    f"limit {limit.name!r} runs in the Worker: {shortfall.what}; to make it "
                    f"a rule, {shortfall.fix}",
                    limit=limit.name,
                    fix=shortfall.fix,
                )
            )
    if edge.timeout is not None and edge.timeout != edge.rate.period:
        why.append(
            f"the Worker has no mitigation timeout: a client is refused until the current "
            f"{edge.rate.period} window ends, not for {edge.timeout}"
        )
        found.append(
            diagnostic_at(
                policy,
                (*base, "edge", "timeout"),
                "L208",
                # Info, not a warning: the policy is right and the same file honours the
                # timeout on a plan whose rules carry the limit; this plan just cannot.
                Severity.INFO,
                f"limit {limit.name!r} runs in the Worker, which has no mitigation timeout: a "
                f"client over the limit is refused until the current {edge.rate.period} "
                f"window ends, not for {edge.timeout}; remove timeout, or use a plan whose "
                "rules can carry this limit",
                limit=limit.name,
                fix="remove timeout, or use a plan whose rules can carry this limit",
            )
        )
    if edge.requests_to_origin:
        why.append(
            "the Worker counts every request, cached ones included: requests_to_origin is "
            "not honoured there"
        )
        found.append(_origin_finding(policy, limit.name, base, target, rule_lacks))
    _worker_key_notes(policy, limit, base, why, found)
    why.append("the Worker binding can express it")
    if limit.count_when is not None:
        why.append(
            f"count_when (status {limit.count_when.describe()}): the Worker refuses a caller "
            "it has marked spent before forwarding, and counts after the origin's answer"
        )
    if credentialed is not None:
        why.append(
            f"requests that carry a credential: a second binding, {credentialed} per client IP"
        )
    return EdgePlacement(
        index,
        limit.name,
        EdgeTarget.WORKER,
        tuple(why),
        period,
        None,
        tuple(rule_lacks),
        (),
        findings=tuple(found),
        credentialed=credentialed,
    )


def _worker_key_notes(
    policy: Policy,
    limit: Limit,
    base: tuple[str | int, ...],
    why: list[str],
    found: list[Diagnostic],
) -> None:
    """How the Worker counts a limit keyed by more than the client IP (and L214)."""
    edge = limit.edge
    assert edge is not None
    kind = key_kind(edge.per)
    if kind == "ip_nat":
        why.append(
            "the Worker cannot see Cloudflare's NAT-aware visitor id: it counts per client IP"
        )
        found.append(_nat_finding(policy, limit.name, base))
    elif kind != "ip":
        unverified = ", or with a token that fails verification," if kind == "jwt" else ""
        why.append(
            f"counted per a keyed hash of {key_text(edge.per)}; requests without it{unverified} "
            "per client IP"
        )
    tiers = edge_tier_rates(limit)
    if tiers:
        shown = "; ".join(f"{t}: {', '.join(str(r) for r in rates)}" for t, rates in tiers.items())
        why.append(f"callers with a verified tier are held to their app rates ({shown})")
    found.extend(_tier_findings(policy, limit, base))


def edge_tier_rates(limit: Limit) -> dict[str, tuple[Rate, ...]]:
    """For ``edge.tiers``: each app tier's rates that the Worker binding can count (a period
    of 10 s or 1 min), in the app's order; a tier with none is left out (L216)."""
    edge, app = limit.edge, limit.app
    if edge is None or not edge.tiers or app is None:
        return {}
    periods = WORKER.periods.value
    out: dict[str, tuple[Rate, ...]] = {}
    for tier, rates in app.tiers.items():
        usable = tuple(r for r in rates if r.period.whole_seconds in periods)
        if usable:
            out[tier] = usable
    return out


def _tier_findings(policy: Policy, limit: Limit, base: tuple[str | int, ...]) -> list[Diagnostic]:
    """L216: tiers of an ``edge.tiers`` limit that the edge cannot hold to their app rates."""
    app = limit.app
    if limit.edge is None or not limit.edge.tiers or app is None:
        return []
    usable = edge_tier_rates(limit)
    out = []
    for tier, rates in app.tiers.items():
        if tier in usable:
            continue
        shown = ", ".join(str(r) for r in rates)
        fix = f"give tier {tier!r} a rate per 10s or 1m as well (the app holds it to all)"
        out.append(
            diagnostic_at(
                policy,
                (*base, "app", "tiers", tier),
                "L216",
                Severity.WARNING,
                f"limit {limit.name!r} applies its app tiers at the edge (edge.tiers), but "
                f"tier {tier!r} has no rate with a period the Worker binding offers (10s or "
                f"1m): {shown}; callers in it are held to rate ({limit.edge.rate}) there; {fix}",
                limit=limit.name,
                fix=fix,
            )
        )
    return out


def _rule_key_reason(edge: EdgeLimit) -> str:
    """How the rule counts a limit keyed by more than the client IP."""
    if key_kind(edge.per) == "ip_nat":
        return "counted per IP with NAT support (cf.unique_visitor_id)"
    return (
        f"counted per {key_text(edge.per)}; requests without it: a second rule, "
        f"{edge.rate} per client IP"
    )


def _nat_finding(policy: Policy, name: str, base: tuple[str | int, ...]) -> Diagnostic:
    """L214: a limit per IP with NAT support, placed in the Worker.

    ``cf.unique_visitor_id`` is a rule characteristic; a Worker has no such value, so it
    counts per client IP: clients behind one address share a counter there. A warning: the
    limit holds, only more strictly for shared addresses than the policy says.
    """
    lowest = lowest_plan_with_key("ip_nat")
    assert lowest is not None
    fix = f"use the {lowest.label} plan or above so a rule carries it, or write per: ip"
    return diagnostic_at(
        policy,
        (*base, "edge", "per"),
        "L214",
        Severity.WARNING,
        f"limit {name!r} runs in the Worker, which cannot see Cloudflare's NAT-aware visitor "
        "id (cf.unique_visitor_id is a rule characteristic): it counts per client IP, so "
        f"clients behind one address share a counter; {fix}",
        limit=name,
        fix=fix,
    )


def _origin_finding(
    policy: Policy,
    name: str,
    base: tuple[str | int, ...],
    target: EdgeTarget,
    rule_lacks: list[Shortfall],
) -> Diagnostic:
    """L212: a limit that counts only requests to the origin, placed in the Worker.

    The binding counts when the Worker calls it, before the request goes on to the cache
    and the origin; only the answer says whether it came from the cache. So the Worker
    counts every request, and the limit refuses sooner than the policy says. A warning,
    not an error: the origin is protected at least as well as asked.
    """
    if target is EdgeTarget.WORKER:
        fix = "remove target: worker so a rule carries it"
    else:
        fix = next(
            (s.fix for s in rule_lacks if s.kind == "origin"),
            rule_lacks[0].fix if rule_lacks else "let a rule carry it",
        )
    fix += ", or remove requests_to_origin"
    return diagnostic_at(
        policy,
        (*base, "edge", "requests_to_origin"),
        "L212",
        Severity.WARNING,
        f"limit {name!r} runs in the Worker, which counts every request, cached responses "
        "included (the binding counts before the request reaches the cache, and only the "
        "answer says whether it came from there): requests_to_origin is not honoured, so "
        f"the limit refuses sooner than it says; {fix}",
        limit=name,
        fix=fix,
    )


def _per_address_finding(
    policy: Policy, name: str, base: tuple[str | int, ...], worker_lacks: list[Shortfall]
) -> Diagnostic:
    """L210: a rule counts each IPv6 address, where the policy counts IPv6 per network.

    Cloudflare's docs do not say that ``ip.src`` groups IPv6 addresses, so edgegen assumes
    a rule counts every address apart: a client holding a /64 gets a fresh quota with each
    address it picks. A warning when the Worker could carry the limit instead (it counts
    per prefix); info when only a rule can (a challenge, a period the Worker lacks).
    """
    ipv6_prefix = policy.clients.ipv6_prefix
    message = (
        f"limit {name!r} runs as a rule, and rules count each IPv6 address on its own "
        f"(ip.src), while clients.ipv6_prefix counts an IPv6 client per /{ipv6_prefix}: a "
        "client holding a whole network gets a fresh quota with every address it uses"
    )
    path = (*base, "edge")
    if worker_lacks:
        message += "; only a rule can carry this limit, so the Worker is no alternative here"
        return diagnostic_at(policy, path, "L210", Severity.INFO, message, limit=name)
    fix = "set target: worker"
    message += f"; {fix} to count IPv6 clients per /{ipv6_prefix}"
    return diagnostic_at(policy, path, "L210", Severity.WARNING, message, limit=name, fix=fix)


def _counting_shortfalls(limit: Limit, caps: PlanCapabilities) -> list[Shortfall]:
    """What a rule lacks to count only some answers (``count_when``): a counting expression
    on ``http.response.code``, which Cloudflare offers from Business up."""
    if limit.count_when is None or caps.counting_expression.value:
        return []
    lowest = next(c for c in PLANS.values() if c.counting_expression.value)
    return [
        Shortfall(
            "counting",
            f"rules on the {caps.plan.value} plan cannot count only some answers (count_when: "
            f"status {limit.count_when.describe()} needs a counting expression, "
            f"{lowest.label} and up)",
            f"use the {lowest.label} plan or above",
            ("count_when",),
        )
    ]


def placement_diagnostics(
    policy: Policy, placements: tuple[EdgePlacement, ...] | None = None
) -> list[Diagnostic]:
    """Every placement finding (L2xx) of a policy: the check edgegen contributes to lint.

    ``placements`` are ``place(policy)`` when the caller has them already.
    """
    if placements is None:
        placements = place(policy)
    out = [finding for placement in placements for finding in placement.findings]
    in_worker = [p for p in placements if p.target is EdgeTarget.WORKER]
    cloudflare = policy.cloudflare
    if in_worker and cloudflare is not None:
        names = _list_text((repr(p.limit) for p in in_worker), "and")
        if cloudflare.worker is None:
            out.append(
                diagnostic_at(
                    policy,
                    ("cloudflare",),
                    "L204",
                    Severity.ERROR,
                    f"limit{'s' if len(in_worker) != 1 else ''} {names} must run in the "
                    "Worker, but the policy has no cloudflare.worker; add cloudflare.worker "
                    "with a name and routes",
                    limit=in_worker[0].limit,
                    fix="add cloudflare.worker: { name: ..., routes: [...] }",
                    stops={Layer.EDGE},
                )
            )
        elif cloudflare.worker.routes:
            for placed in in_worker:
                covered = _route_coverage(policy, placed.limit, cloudflare.worker.routes)
                if covered is not None:
                    out.append(covered)
        elif not cloudflare.worker.routes:
            out.append(
                diagnostic_at(
                    policy,
                    ("cloudflare", "worker"),
                    "L209",
                    Severity.WARNING,
                    f"the Worker carries {names} but has no routes, so it never runs; add "
                    "routes like api.example.com/*",
                    limit=in_worker[0].limit,
                    fix="add routes like api.example.com/*",
                )
            )
    return out


def _host_covered(route_host: str, host: str) -> bool:
    """Whether a route's host pattern (a leading ``*`` matches any prefix) covers a policy
    host (``*.example.com`` needs a route host that covers every subdomain)."""
    if route_host.startswith("*"):
        suffix = route_host[1:]
        return host.endswith(suffix) if not host.startswith("*.") else host[1:].endswith(suffix)
    return route_host == host


def _path_covered(route_path: str, limit: Limit) -> bool:
    """Whether a route's path pattern (a trailing ``*`` matches any rest) covers every path
    the limit matches."""
    if route_path.endswith("*"):
        stem = route_path[:-1]
        wanted = (*limit.match.paths, *limit.match.path_prefix)
        return stem == "/" or (bool(wanted) and all(p.startswith(stem) for p in wanted))
    return (
        bool(limit.match.paths)
        and not limit.match.path_prefix
        and all(p == route_path for p in limit.match.paths)
    )


def _route_coverage(policy: Policy, name: str, routes: tuple[str, ...]) -> Diagnostic | None:
    """L211: a limit placed in the Worker, on hosts or paths the Worker's routes never run on.

    A rule applies to the whole zone; the Worker runs only where a route sends requests to
    it. A limit that moves from a rule to the Worker would silently stop covering every
    host name (and path) outside the routes. A warning when the limit names hosts that no
    route covers (a warning, not an error: a Custom Domain may reach the Worker too, which
    edgegen does not manage); info when the limit names no host (it means every host of the
    zone, and only the routes' hosts are covered: edgegen cannot know the zone's names).
    """
    limit = policy.limit(name)
    parts = [route_parts(r) for r in routes]
    hosts = limit.match.hosts
    path = ("limits", policy.limit_index(name), "match")
    if not hosts:
        if any(h == "*" for h, _ in parts):
            return None
        shown = _list_text((r for r in routes), "and")
        return diagnostic_at(
            policy,
            path,
            "L211",
            Severity.INFO,
            f"limit {name!r} runs in the Worker and names no host, but the Worker runs only on "
            f"its routes ({shown}): requests to other host names of the zone are not limited "
            "by it",
            limit=name,
            fix="list the limit's hosts, or add a route for every host the limit must cover",
        )
    uncovered = [
        h
        for h in hosts
        if not any(_host_covered(rh, h) and _path_covered(rp, limit) for rh, rp in parts)
    ]
    if not uncovered:
        return None
    host = uncovered[0]
    route_host = f"*{host[1:]}" if host.startswith("*.") else host
    prefixes = limit.match.path_prefix
    route_path = f"{prefixes[0]}*" if len(prefixes) == 1 and not limit.match.paths else "/*"
    example = f"{route_host}{route_path}"
    return diagnostic_at(
        policy,
        path,
        "L211",
        Severity.WARNING,
        f"limit {name!r} runs in the Worker for {_list_text(repr(h) for h in uncovered)}, "
        "but no route of cloudflare.worker sends those requests to the Worker, so the limit "
        f"never applies there; add a route such as {example!r}",
        limit=name,
        fix=f"add the route {example} to cloudflare.worker.routes",
    )


# What edgegen contributes to policy.lint and policy.check.
EDGE_CHECKS: tuple[Check, ...] = (placement_diagnostics,)


def check(policy: Policy) -> Checked:
    """The validity gate with edgegen's checks: ``policy.check(policy, EDGE_CHECKS)``."""
    return policy_check(policy, EDGE_CHECKS)
