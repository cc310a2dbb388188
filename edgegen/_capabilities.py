"""What each Cloudflare plan, and the Workers Rate Limiting binding, can express.

This is the one place that knows Cloudflare's limits. Lint reads it to tell the author what
a policy will turn into; ``edgegen build`` reads it (through :func:`place`) to decide where
each edge limit runs. Every value carries the page or schema it comes from, so that when
Cloudflare changes a limit the fix is one edit here, checked against one source.

Where sources disagree, the table says so and keeps the values both sources list (the
conservative choice): Cloudflare's ``?dry_run=true`` on the ruleset ``PUT`` remains the final
check. docs/edge.md shows this table; ``capability_table_markdown()`` renders it and a test
keeps the two in step.

Placement (pure, deterministic) is also here, because lint must report the same decisions
the compiler makes:

- a limit goes to a **rule** when the plan can express it (period, mitigation timeout,
  action, every field its matcher and "unauthenticated only" need) and a rule slot is free;
- otherwise to the **Worker**, when the binding can express it (period 10 s or 60 s, the
  ``block`` action);
- otherwise nowhere, and the decision carries a sentence naming the limit, what is missing
  and the nearest thing that would work.

An "unauthenticated only" limit (with credentials listed in ``authenticated_when``) has two
counters: requests without a credential at ``rate``, requests that carry one at the looser
:func:`credentialed_rate`. As rules that is two rules (both count against the quota); in the
Worker, two bindings. Both counters must fit the target.

Rule slots go first to limits forced with ``target: rule``, then to limits only a rule can
carry, then to the rest in policy order, so a full quota pushes the most flexible limits to
the Worker rather than failing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ._errors import Severity
from ._model import EdgeLimit, Limit, Policy
from ._vocab import MAX_LIMIT, Action, Duration, EdgeTarget, Plan, Rate

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Source:
    """Where a capability value comes from: a documentation page or an API schema."""

    title: str
    url: str


@dataclass(frozen=True, slots=True)
class Sourced(Generic[T]):
    """A capability value, the source that states it, and a note where sources disagree."""

    value: T
    source: Source
    note: str = ""


AVAILABILITY = Source(
    "Cloudflare docs, Rate limiting rules: Availability",
    "https://developers.cloudflare.com/waf/rate-limiting-rules/#availability",
)
PARAMETERS = Source(
    "Cloudflare docs, Rate limiting parameters",
    "https://developers.cloudflare.com/waf/rate-limiting-rules/parameters/",
)
RULESETS_API = Source(
    "Cloudflare API schema, Rulesets: rate limit rule (cloudflare/api-schemas)",
    "https://developers.cloudflare.com/api/resources/rulesets/",
)
WORKERS_BINDING = Source(
    "Cloudflare docs, Workers Rate Limiting binding",
    "https://developers.cloudflare.com/workers/runtime-apis/bindings/rate-limit/",
)
EDGEGEN_WORKER = Source(
    "edgegen's Worker (workers/templates/limiter.js): it answers 429, it cannot challenge",
    "docs/edge.md#worker",
)

_PERIOD_NOTE = (
    "Sources disagree: the parameters page lists the API values 10, 60, 120, 300, 600 and "
    "3600; the availability footnote also lists 15, 20, 30, 40, 45, 90, 180, 240, 480, 900, "
    "1200, 1800, 2400 and 65535. Kept: the values both list, up to the plan's maximum."
)
_TIMEOUT_NOTE = (
    "Sources disagree: the parameters page lists 10, 60, 120, 300, 600, 3600 and 86400; the "
    "availability footnote lists more. Kept: the values both list, up to the plan's maximum."
)

# The fields edgegen writes into expressions, named as in the Rules language.
PATH = "http.request.uri.path"
HOST = "http.host"
METHOD = "http.request.method"
HEADERS = "http.request.headers"
COOKIES = "http.request.cookies"

_FREE_FIELDS = frozenset({PATH, "cf.bot_management.verified_bot"})
_PRO_FIELDS = _FREE_FIELDS | {
    HOST,
    "http.request.uri",
    "http.request.full_uri",
    "http.request.uri.query",
}
_BUSINESS_FIELDS = _PRO_FIELDS | {METHOD, "ip.src", "http.user_agent"}
_ENTERPRISE_FIELDS = _BUSINESS_FIELDS | {HEADERS, COOKIES, "http.cookie", "http.referer"}
_ARL_FIELDS = _ENTERPRISE_FIELDS | {"http.request.body.raw", "http.request.body.form"}

# What a field is called in messages, and the lowest plan that offers it.
FIELD_LABELS: dict[str, str] = {
    PATH: "the request path",
    HOST: "the host name",
    METHOD: "the request method",
    HEADERS: "request header fields",
    COOKIES: "cookie fields",
}

_CHALLENGES = (Action.MANAGED_CHALLENGE, Action.JS_CHALLENGE, Action.CHALLENGE)
_BELOW_ENTERPRISE_ACTIONS = (Action.BLOCK, *_CHALLENGES)
_ENTERPRISE_ACTIONS = (*_BELOW_ENTERPRISE_ACTIONS, Action.LOG)


@dataclass(frozen=True, slots=True)
class PlanCapabilities:
    """What rate limiting rules can express on one plan; every value carries its source."""

    plan: Plan
    label: str
    max_rules: Sourced[int]
    periods: Sourced[tuple[int, ...]]
    mitigation_timeouts: Sourced[tuple[int, ...]]
    block_throttle: Sourced[bool]
    challenge_timeout: Sourced[bool]
    expression_fields: Sourced[frozenset[str]]
    characteristics: Sourced[tuple[str, ...]]
    actions: Sourced[tuple[Action, ...]]
    counting_expression: Sourced[bool]
    custom_response: Sourced[bool]
    max_expression_length: Sourced[int]

    def has_field(self, name: str) -> bool:
        """True when rule expressions on this plan may use the field."""
        return name in self.expression_fields.value


@dataclass(frozen=True, slots=True)
class WorkerCapabilities:
    """What the Workers Rate Limiting binding, as edgegen's Worker uses it, can express."""

    periods: Sourced[tuple[int, ...]]
    actions: Sourced[tuple[Action, ...]]
    mitigation_timeout: Sourced[bool]
    fields: Sourced[str]
    keys: Sourced[str]
    custom_response: Sourced[bool]
    counting: Sourced[str]


def _plan(
    plan: Plan,
    label: str,
    *,
    rules: int,
    rules_note: str = "",
    periods: tuple[int, ...],
    timeouts: tuple[int, ...],
    throttle: bool,
    fields: frozenset[str],
    characteristics: tuple[str, ...],
    actions: tuple[Action, ...],
    counting: bool,
    custom: bool,
) -> PlanCapabilities:
    enterprise = throttle
    return PlanCapabilities(
        plan=plan,
        label=label,
        max_rules=Sourced(rules, AVAILABILITY, rules_note),
        periods=Sourced(periods, PARAMETERS, _PERIOD_NOTE if len(periods) > 1 else ""),
        mitigation_timeouts=Sourced(
            timeouts, PARAMETERS, _TIMEOUT_NOTE if len(timeouts) > 1 else ""
        ),
        block_throttle=Sourced(
            throttle, PARAMETERS, "mitigation_timeout 0 with block throttles: Enterprise only"
        ),
        challenge_timeout=Sourced(
            enterprise,
            PARAMETERS,
            "" if enterprise else "challenge actions need mitigation_timeout 0 below Enterprise",
        ),
        expression_fields=Sourced(fields, AVAILABILITY),
        characteristics=Sourced(characteristics, AVAILABILITY),
        actions=Sourced(actions, PARAMETERS, "" if Action.LOG in actions else "log: Enterprise"),
        counting_expression=Sourced(counting, AVAILABILITY),
        custom_response=Sourced(
            custom, PARAMETERS, "block only; content types json, html, xml or plain text"
        ),
        max_expression_length=Sourced(4096, RULESETS_API),
    )


PLANS: dict[Plan, PlanCapabilities] = {
    Plan.FREE: _plan(
        Plan.FREE,
        "Free",
        rules=1,
        periods=(10,),
        timeouts=(10,),
        throttle=False,
        fields=_FREE_FIELDS,
        characteristics=("ip.src",),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=False,
        custom=False,
    ),
    Plan.PRO: _plan(
        Plan.PRO,
        "Pro",
        rules=2,
        periods=(10, 60),
        timeouts=(10, 60, 120, 300, 600, 3600),
        throttle=False,
        fields=_PRO_FIELDS,
        characteristics=("ip.src",),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=False,
        custom=True,
    ),
    Plan.BUSINESS: _plan(
        Plan.BUSINESS,
        "Business",
        rules=5,
        periods=(10, 60, 120, 300, 600),
        timeouts=(10, 60, 120, 300, 600, 3600, 86400),
        throttle=False,
        fields=_BUSINESS_FIELDS,
        characteristics=("ip.src", "cf.unique_visitor_id"),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=True,
        custom=True,
    ),
    Plan.ENTERPRISE: _plan(
        Plan.ENTERPRISE,
        "Enterprise",
        rules=100,
        rules_note="the number of rules depends on the contract; 100 is the documented default",
        periods=(10, 60, 120, 300, 600, 3600),
        timeouts=(10, 60, 120, 300, 600, 3600, 86400),
        throttle=True,
        fields=_ENTERPRISE_FIELDS,
        characteristics=("ip.src", "cf.unique_visitor_id"),
        actions=_ENTERPRISE_ACTIONS,
        counting=True,
        custom=True,
    ),
    Plan.ENTERPRISE_ARL: _plan(
        Plan.ENTERPRISE_ARL,
        "Enterprise with Advanced Rate Limiting",
        rules=100,
        periods=(10, 60, 120, 300, 600, 3600),
        timeouts=(10, 60, 120, 300, 600, 3600, 86400),
        throttle=True,
        fields=_ARL_FIELDS,
        characteristics=(
            "ip.src",
            "cf.unique_visitor_id",
            "http.request.headers",
            "http.request.cookies",
            "http.request.uri.args",
            "http.host",
            "http.request.uri.path",
            "ip.src.asnum",
            "ip.src.country",
            "cf.bot_management.ja3_hash",
            "cf.bot_management.ja4",
            "http.request.body.raw",
            "custom",
        ),
        actions=_ENTERPRISE_ACTIONS,
        counting=True,
        custom=True,
    ),
}

WORKER = WorkerCapabilities(
    periods=Sourced(
        (10, 60),
        WORKERS_BINDING,
        "wrangler's config validation (workers-sdk) rejects any other period",
    ),
    actions=Sourced((Action.BLOCK,), EDGEGEN_WORKER),
    mitigation_timeout=Sourced(
        False,
        WORKERS_BINDING,
        "fixed windows: a client over the limit is refused until the window ends",
    ),
    fields=Sourced("any: the Worker reads the whole request", EDGEGEN_WORKER),
    keys=Sourced("client IP from CF-Connecting-IP (any string key)", WORKERS_BINDING),
    custom_response=Sourced(True, EDGEGEN_WORKER, "429 application/problem+json"),
    counting=Sourced(
        "per Cloudflare location, eventually consistent ('permissive')", WORKERS_BINDING
    ),
)


def plan_capabilities(plan: Plan) -> PlanCapabilities:
    """The capabilities of a plan."""
    return PLANS[plan]


def lowest_plan_with_field(name: str) -> PlanCapabilities | None:
    """The cheapest plan whose rule expressions may use a field (None: no plan has it)."""
    for caps in PLANS.values():
        if caps.has_field(name):
            return caps
    return None


# --- placement ---------------------------------------------------------------------------

# A credentialed_rate left out is this many times the rate, over the same period.
CREDENTIALED_FACTOR = 10


def credentialed_rate(policy: Policy, limit: Limit) -> Rate | None:
    """The per-IP rate for requests that carry a listed credential, or None.

    Only "unauthenticated only" limits of a policy that lists credentials have one: such
    requests are not exempt (the edge can only see that a credential is present, not that it
    is valid), they are counted apart at this looser rate. Default: ten times ``rate``.
    """
    edge = limit.edge
    when = policy.authenticated_when
    if edge is None or not edge.unauthenticated_only or not (when.headers or when.cookies):
        return None
    if edge.credentialed_rate is not None:
        return edge.credentialed_rate
    return Rate(min(edge.rate.limit * CREDENTIALED_FACTOR, MAX_LIMIT), edge.rate.period)


def rule_count(policy: Policy, limit: Limit) -> int:
    """How many rules the limit takes as rules: two when credentialed requests count apart."""
    return 2 if credentialed_rate(policy, limit) is not None else 1


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
class Finding:
    """A placement finding for lint: a stable code, a severity and a full sentence."""

    code: str
    severity: Severity
    path: tuple[str | int, ...]
    message: str
    limit: str | None = None


@dataclass(frozen=True, slots=True)
class EdgePlacement:
    """Where one edge limit runs, and why; ``target`` is None when nothing can carry it.

    ``period`` is the limit's period in seconds (None when not whole seconds);
    ``mitigation_timeout`` is what the rule sends (only meaningful for rules).
    ``credentialed`` is the rate for requests that carry a credential when the limit counts
    them apart (a second rule or binding), with that rule's ``credentialed_timeout``.
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
    findings: tuple[Finding, ...] = field(default=())
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
    if edge.action in _CHALLENGES and edge.timeout is not None and not caps.challenge_timeout.value:
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
    credentialed = credentialed_rate(policy, limit)
    if credentialed is not None and credentialed.period != edge.rate.period:
        out.extend(_credentialed_rule_shortfalls(edge, credentialed, caps))
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
    rule_only = [i for i in candidates if i not in forced and worker_lacks[i]]
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
            _decide(
                caps,
                index,
                limit,
                lacks,
                worker_lacks[index],
                credentialed=credentialed_rate(policy, limit),
                ipv6_prefix=policy.clients.ipv6_prefix,
            )
        )
    return tuple(placements)


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
            "for requests that carry a credential) and other limits leave fewer free"
        )
    return Shortfall(
        "quota", what, "move another limit to the Worker with target: worker, or use a larger plan"
    )


def _decide(
    caps: PlanCapabilities,
    index: int,
    limit: Limit,
    rule_lacks: list[Shortfall],
    worker_lacks: list[Shortfall],
    *,
    credentialed: Rate | None,
    ipv6_prefix: int,
) -> EdgePlacement:
    edge = limit.edge
    assert edge is not None
    target = edge.target
    period = edge.rate.period.whole_seconds
    base: tuple[str | int, ...] = ("limits", index)

    if target is not EdgeTarget.WORKER and not rule_lacks:
        reasons = [f"the {caps.plan.value} plan can express it as a rule"]
        if target is EdgeTarget.RULE:
            reasons.insert(0, "target: rule")
        if edge.action in _CHALLENGES and not caps.challenge_timeout.value:
            reasons.append(f"{edge.action.value} throttles (mitigation_timeout 0) below Enterprise")
        if credentialed is not None:
            reasons.append(
                f"requests that carry a credential: a second rule, {credentialed} per client IP"
            )
        per_address: tuple[Finding, ...] = ()
        if ipv6_prefix < 128:
            per_address = (_per_address_finding(limit.name, base, ipv6_prefix, worker_lacks),)
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
            (Finding(code, Severity.ERROR, path, message, limit.name),),
        )

    why: list[str] = []
    found: list[Finding] = []
    if target is EdgeTarget.WORKER:
        why.append("target: worker")
    else:
        for shortfall in rule_lacks:
            why.append(f"not a rule: {shortfall.what}")
            value_kind = shortfall.kind in ("period", "timeout")
            code = {"period": "L205", "timeout": "L205", "quota": "L207"}.get(
                shortfall.kind, "L206"
            )
            found.append(
                Finding(
                    code,
                    Severity.WARNING if value_kind else Severity.INFO,
                    (*base, *shortfall.field),
                    f"limit {limit.name!r} runs in the Worker: {shortfall.what}; to make it "
                    f"a rule, {shortfall.fix}",
                    limit.name,
                )
            )
    if edge.timeout is not None and edge.timeout != edge.rate.period:
        why.append(
            f"the Worker has no mitigation timeout: a client is refused until the current "
            f"{edge.rate.period} window ends, not for {edge.timeout}"
        )
        found.append(
            Finding(
                "L208",
                # Info, not a warning: the policy is right and the same file honours the
                # timeout on a plan whose rules carry the limit; this plan just cannot.
                Severity.INFO,
                (*base, "edge", "timeout"),
                f"limit {limit.name!r} runs in the Worker, which has no mitigation timeout: a "
                f"client over the limit is refused until the current {edge.rate.period} "
                f"window ends, not for {edge.timeout}; remove timeout, or use a plan whose "
                "rules can carry this limit",
                limit.name,
            )
        )
    why.append("the Worker binding can express it")
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


def _per_address_finding(
    name: str, base: tuple[str | int, ...], ipv6_prefix: int, worker_lacks: list[Shortfall]
) -> Finding:
    """L210: a rule counts each IPv6 address, where the policy counts IPv6 per network.

    Cloudflare's docs do not say that ``ip.src`` groups IPv6 addresses, so edgegen assumes
    a rule counts every address apart: a client holding a /64 gets a fresh quota with each
    address it picks. A warning when the Worker could carry the limit instead (it counts
    per prefix); info when only a rule can (a challenge, a period the Worker lacks).
    """
    message = (
        f"limit {name!r} runs as a rule, and rules count each IPv6 address on its own "
        f"(ip.src), while clients.ipv6_prefix counts an IPv6 client per /{ipv6_prefix}: a "
        "client holding a whole network gets a fresh quota with every address it uses"
    )
    if worker_lacks:
        message += "; only a rule can carry this limit, so the Worker is no alternative here"
        return Finding("L210", Severity.INFO, (*base, "edge"), message, name)
    message += f"; set target: worker to count IPv6 clients per /{ipv6_prefix}"
    return Finding("L210", Severity.WARNING, (*base, "edge"), message, name)


def findings(policy: Policy) -> list[Finding]:
    """Every placement finding (L2xx) of a policy, for lint."""
    placements = place(policy)
    out = [finding for placement in placements for finding in placement.findings]
    in_worker = [p for p in placements if p.target is EdgeTarget.WORKER]
    cloudflare = policy.cloudflare
    if in_worker and cloudflare is not None:
        names = _list_text((repr(p.limit) for p in in_worker), "and")
        if cloudflare.worker is None:
            out.append(
                Finding(
                    "L204",
                    Severity.ERROR,
                    ("cloudflare",),
                    f"limit{'s' if len(in_worker) != 1 else ''} {names} must run in the "
                    "Worker, but the policy has no cloudflare.worker; add cloudflare.worker "
                    "with a name and routes",
                    in_worker[0].limit,
                )
            )
        elif not cloudflare.worker.routes:
            out.append(
                Finding(
                    "L209",
                    Severity.WARNING,
                    ("cloudflare", "worker"),
                    f"the Worker carries {names} but has no routes, so it never runs; add "
                    "routes like api.example.com/*",
                    in_worker[0].limit,
                )
            )
    return out


# --- the table as Markdown (docs/edge.md) -------------------------------------------------


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _growing(values: list[tuple[str, ...]]) -> list[str]:
    """Cells for values that only grow from plan to plan: the first in full, then "+ new"."""
    cells: list[str] = []
    previous: tuple[str, ...] = ()
    for current in values:
        added = [v for v in current if v not in previous]
        text = ", ".join(f"`{v}`" for v in added)
        if not previous:
            cells.append(text)
        else:
            cells.append(f"+ {text}" if added else "same")
        previous = current
    return cells


def _row_sources() -> list[tuple[str, str, tuple[Sourced[Any], ...]]]:
    """(row label, PlanCapabilities field, the Worker's values) for each table row."""
    return [
        ("rules", "max_rules", ()),
        ("period (s)", "periods", (WORKER.periods,)),
        ("mitigation timeout (s)", "mitigation_timeouts", (WORKER.mitigation_timeout,)),
        ("throttle with block (timeout 0)", "block_throttle", ()),
        ("challenge with a timeout", "challenge_timeout", ()),
        ("expression fields", "expression_fields", (WORKER.fields,)),
        ("characteristics besides `cf.colo.id`", "characteristics", (WORKER.keys,)),
        ("actions", "actions", (WORKER.actions,)),
        ("counting expression", "counting_expression", ()),
        ("custom response", "custom_response", (WORKER.custom_response,)),
        ("expression length (chars)", "max_expression_length", ()),
    ]


def capability_table_markdown() -> str:
    """The capability table as Markdown: one column per plan plus the Worker, with sources.

    Each row names its source by number; the notes under the table say where sources
    disagree and what was chosen.
    """
    plans = list(PLANS.values())
    numbers: dict[str, int] = {}
    sources: list[Source] = []

    def ref(value: Sourced[Any]) -> str:
        if value.source.url not in numbers:
            sources.append(value.source)
            numbers[value.source.url] = len(sources)
        return f"[{numbers[value.source.url]}]"

    def row_refs(name: str, worker: tuple[Sourced[Any], ...]) -> str:
        refs = [ref(getattr(caps, name)) for caps in plans] + [ref(w) for w in worker]
        return " ".join(dict.fromkeys(refs))

    def timeouts(caps: PlanCapabilities) -> str:
        values = ((0,) if caps.block_throttle.value else ()) + caps.mitigation_timeouts.value
        return ", ".join(map(str, values))

    cells: dict[str, list[str]] = {
        "max_rules": [str(c.max_rules.value) for c in plans] + ["one Worker"],
        "periods": [", ".join(map(str, c.periods.value)) for c in plans]
        + [", ".join(map(str, WORKER.periods.value))],
        "mitigation_timeouts": [timeouts(c) for c in plans] + ["none (fixed window)"],
        "block_throttle": [_yes(c.block_throttle.value) for c in plans] + ["no"],
        "challenge_timeout": [_yes(c.challenge_timeout.value) for c in plans] + ["no challenges"],
        "expression_fields": [
            *_growing([tuple(sorted(c.expression_fields.value)) for c in plans]),
            "any (JavaScript)",
        ],
        "characteristics": [
            *_growing([c.characteristics.value for c in plans]),
            "any key; edgegen uses the client IP",
        ],
        "actions": [
            *_growing([tuple(a.value for a in c.actions.value) for c in plans]),
            "`block` (429)",
        ],
        "counting_expression": [_yes(c.counting_expression.value) for c in plans] + ["n/a"],
        "custom_response": [_yes(c.custom_response.value) for c in plans]
        + [_yes(WORKER.custom_response.value)],
        "max_expression_length": [f"{c.max_expression_length.value:,}" for c in plans] + ["n/a"],
    }
    header = ["", *(c.label for c in plans), "Worker binding", "source"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    notes: dict[str, list[str]] = {}
    for label, name, worker in _row_sources():
        lines.append("| " + " | ".join([label, *cells[name], row_refs(name, worker)]) + " |")
        row_notes = [getattr(c, name).note for c in plans] + [w.note for w in worker]
        notes[label] = [n for n in dict.fromkeys(row_notes) if n]
    lines.extend(["", "Notes:"])
    for label, texts in notes.items():
        lines.extend(f"- {label}: {text}" for text in texts)
    lines.extend(["", "Sources:"])
    for number, source in enumerate(sources, start=1):
        link = f"<{source.url}>" if "://" in source.url else source.url
        lines.append(f"{number}. {source.title}: {link}")
    return "\n".join(lines) + "\n"
