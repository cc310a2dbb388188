"""What each Cloudflare plan, and the Workers Rate Limiting binding, can express.

This is the one place that knows Cloudflare's limits. Placement (``_placement.py``) reads
it to decide where each edge limit runs, for lint's L2xx findings and for ``build`` alike;
the expression builder (``compiler/_expr.py``) reads the expression length limit from it.
Every value carries the page or schema it comes from, so that when Cloudflare changes a
limit the fix is one edit here, checked against one source.

Where sources disagree, the table says so and keeps the values both sources list (the
conservative choice): Cloudflare's ``?dry_run=true`` on the ruleset ``PUT`` remains the final
check. docs/edge.md shows this table; ``capability_table_markdown()`` renders it and a test
keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from edgegen_policy import (
    Action,
    CloudflarePlan,
    CookieKey,
    EdgeKey,
    EdgeKeySpec,
    HeaderKey,
    JwtKey,
)

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
API_SHIELD_JWT = Source(
    "Cloudflare docs, API Shield JWT validation (claims in rules need a token configuration)",
    "https://developers.cloudflare.com/api-shield/security/jwt-validation/",
)
EDGEGEN_WORKER = Source(
    "edgegen's Worker (workers/templates/limiter.js): it answers 429, it cannot challenge",
    "docs/edge.md#worker",
)

# The longest rule expression, in characters, on every plan: the only definition of it
# (the expression builder refuses longer ones, the table shows it).
MAX_EXPRESSION_LENGTH = 4096

# Every counting and mitigation period Cloudflare supports, in seconds: footnote 3 of the
# availability table, which gives each plan "all supported values up to" its maximum.
SUPPORTED_PERIODS: tuple[int, ...] = (
    10, 15, 20, 30, 40, 45, 60, 90, 120, 180, 240, 300, 480, 600, 900, 1200, 1800, 2400, 3600,
    65535, 86400,
)  # fmt: skip
# The values the parameters page lists as the API's: a subset of the footnote's. A value only
# the footnote lists is still offered (it is the per-plan source), marked in the table so a
# reader knows the two pages disagree; Cloudflare's dry run settles a doubt.
API_PERIODS: frozenset[int] = frozenset({10, 60, 120, 300, 600, 3600})
API_TIMEOUTS: frozenset[int] = frozenset({10, 60, 120, 300, 600, 3600, 86400})

_PERIOD_NOTE = (
    "each plan offers every supported value up to its maximum (availability table, footnote "
    "3); values marked * are not among the parameters page's API values (10, 60, 120, 300, "
    "600, 3600), so the two pages disagree on them"
)
_TIMEOUT_NOTE = (
    "each plan offers every supported value up to its maximum (availability table, footnote "
    "3); values marked * are not among the parameters page's API values (0, 10, 60, 120, "
    "300, 600, 3600, 86400)"
)


def supported_up_to(maximum: int) -> tuple[int, ...]:
    """The supported period values (footnote 3 of the availability table) up to a maximum."""
    return tuple(value for value in SUPPORTED_PERIODS if value <= maximum)


def period_sources(value: int, *, timeout: bool = False) -> tuple[Source, ...]:
    """The pages that list a period (or, with ``timeout``, a mitigation timeout) value."""
    listed = API_TIMEOUTS if timeout else API_PERIODS
    found = [AVAILABILITY] if value in SUPPORTED_PERIODS else []
    if value in listed:
        found.append(PARAMETERS)
    return tuple(found)


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

# The parameters page documents requests_to_origin ("Also apply rate limiting to cached
# assets", inverted) without a plan; the availability table has no row for it. edgegen
# offers it where the dashboard's neighbouring counting options are (Business and up): the
# conservative reading, which Cloudflare's dry run confirms or refutes.
_ORIGIN_NOTE = (
    "the availability table has no row for it; edgegen assumes Business and up, like the "
    "custom counting expression"
)

CHALLENGES = (Action.MANAGED_CHALLENGE, Action.JS_CHALLENGE, Action.CHALLENGE)
_BELOW_ENTERPRISE_ACTIONS = (Action.BLOCK, *CHALLENGES)
_ENTERPRISE_ACTIONS = (*_BELOW_ENTERPRISE_ACTIONS, Action.LOG)


@dataclass(frozen=True, slots=True)
class PlanCapabilities:
    """What rate limiting rules can express on one plan; every value carries its source."""

    plan: CloudflarePlan
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
    requests_to_origin: Sourced[bool]
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
    jwt: Sourced[str]
    custom_response: Sourced[bool]
    counting: Sourced[str]
    requests_to_origin: Sourced[bool]


def _plan(
    plan: CloudflarePlan,
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
        periods=Sourced(periods, AVAILABILITY, _PERIOD_NOTE if len(periods) > 1 else ""),
        mitigation_timeouts=Sourced(
            timeouts, AVAILABILITY, _TIMEOUT_NOTE if len(timeouts) > 1 else ""
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
        requests_to_origin=Sourced(
            counting,
            PARAMETERS,
            "" if counting else _ORIGIN_NOTE,
        ),
        custom_response=Sourced(
            custom, PARAMETERS, "block only; content types json, html, xml or plain text"
        ),
        max_expression_length=Sourced(MAX_EXPRESSION_LENGTH, RULESETS_API),
    )


PLANS: dict[CloudflarePlan, PlanCapabilities] = {
    CloudflarePlan.FREE: _plan(
        CloudflarePlan.FREE,
        "Free",
        rules=1,
        periods=supported_up_to(10),
        timeouts=supported_up_to(10),
        throttle=False,
        fields=_FREE_FIELDS,
        characteristics=("ip.src",),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=False,
        custom=False,
    ),
    CloudflarePlan.PRO: _plan(
        CloudflarePlan.PRO,
        "Pro",
        rules=2,
        periods=supported_up_to(60),
        timeouts=supported_up_to(3600),
        throttle=False,
        fields=_PRO_FIELDS,
        characteristics=("ip.src",),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=False,
        custom=True,
    ),
    CloudflarePlan.BUSINESS: _plan(
        CloudflarePlan.BUSINESS,
        "Business",
        rules=5,
        periods=supported_up_to(600),
        timeouts=supported_up_to(86400),
        throttle=False,
        fields=_BUSINESS_FIELDS,
        characteristics=("ip.src", "cf.unique_visitor_id"),
        actions=_BELOW_ENTERPRISE_ACTIONS,
        counting=True,
        custom=True,
    ),
    CloudflarePlan.ENTERPRISE: _plan(
        CloudflarePlan.ENTERPRISE,
        "Enterprise",
        rules=100,
        rules_note="the number of rules depends on the contract; 100 is the documented default",
        periods=supported_up_to(65535),
        timeouts=supported_up_to(86400),
        throttle=True,
        fields=_ENTERPRISE_FIELDS,
        characteristics=("ip.src", "cf.unique_visitor_id"),
        actions=_ENTERPRISE_ACTIONS,
        counting=True,
        custom=True,
    ),
    CloudflarePlan.ENTERPRISE_ARL: _plan(
        CloudflarePlan.ENTERPRISE_ARL,
        "Enterprise with Advanced Rate Limiting",
        rules=100,
        periods=supported_up_to(65535),
        timeouts=supported_up_to(86400),
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
    keys=Sourced(
        "client IP from CF-Connecting-IP, or a keyed hash (HMAC-SHA-256) of a header, a "
        "cookie or a verified JWT claim (any string key)",
        WORKERS_BINDING,
    ),
    jwt=Sourced(
        "verifies HS256 (a secret binding), RS256 and ES256 (a JWKS it fetches and caches) "
        "with Web Crypto before it trusts a claim",
        EDGEGEN_WORKER,
    ),
    custom_response=Sourced(True, EDGEGEN_WORKER, "429 application/problem+json"),
    counting=Sourced(
        "per Cloudflare location, eventually consistent ('permissive')", WORKERS_BINDING
    ),
    requests_to_origin=Sourced(
        False,
        WORKERS_BINDING,
        "the binding counts when the Worker calls it, before the request goes on; whether the "
        "answer comes from the cache is known only afterwards, so every request counts",
    ),
)


def plan_capabilities(plan: CloudflarePlan) -> PlanCapabilities:
    """The capabilities of a plan."""
    return PLANS[plan]


def lowest_plan_with_field(name: str) -> PlanCapabilities | None:
    """The cheapest plan whose rule expressions may use a field (None: no plan has it)."""
    for caps in PLANS.values():
        if caps.has_field(name):
            return caps
    return None


# --- what a limit counts by (edge.per) ----------------------------------------------------

# The characteristic family each kind of key needs in a rule; a JWT claim has none that
# edgegen can write (API Shield's token configurations are not part of the policy).
KEY_CHARACTERISTICS: dict[str, str | None] = {
    "ip": "ip.src",
    "ip_nat": "cf.unique_visitor_id",
    "header": "http.request.headers",
    "cookie": "http.request.cookies",
    "jwt": None,
}
KEY_LABELS: dict[str, str] = {
    "ip": "the client IP (`ip`)",
    "ip_nat": "IP with NAT support (`ip_nat`)",
    "header": "a header's value (`{header: NAME}`)",
    "cookie": "a cookie's value (`{cookie: NAME}`)",
    "jwt": "a verified JWT claim (`{jwt: {...}}`)",
}


def key_kind(per: EdgeKeySpec) -> str:
    """The kind of an edge limit's key: ip, ip_nat, header, cookie or jwt."""
    if isinstance(per, HeaderKey):
        return "header"
    if isinstance(per, CookieKey):
        return "cookie"
    if isinstance(per, JwtKey):
        return "jwt"
    return "ip_nat" if per is EdgeKey.IP_NAT else "ip"


def key_text(per: EdgeKeySpec) -> str:
    """The key as a sentence names it: "the header x-api-key", "the JWT claim sub"."""
    if isinstance(per, HeaderKey):
        return f"the header {per.header}"
    if isinstance(per, CookieKey):
        return f"the cookie {per.cookie}"
    if isinstance(per, JwtKey):
        return f"the JWT claim {per.jwt.claim}"
    return "IP with NAT support" if per is EdgeKey.IP_NAT else "client IP"


def rule_can_key(caps: PlanCapabilities, kind: str) -> bool:
    """Whether rules on a plan can count by this kind of key."""
    family = KEY_CHARACTERISTICS[kind]
    return family is not None and family in caps.characteristics.value


def lowest_plan_with_key(kind: str) -> PlanCapabilities | None:
    """The cheapest plan whose rules can count by a kind of key (None: no plan's rules)."""
    return next((caps for caps in PLANS.values() if rule_can_key(caps, kind)), None)


def key_table_markdown() -> str:
    """What each plan's rules, and the Worker, count an edge limit by, with sources."""
    plans = list(PLANS.values())
    header = ["`per`", *(c.label for c in plans), "Worker", "source"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    worker_cells = {
        "ip": "yes (CF-Connecting-IP)",
        "ip_nat": "no: counts per client IP (L214)",
        "header": "yes (keyed hash)",
        "cookie": "yes (keyed hash)",
        "jwt": "yes (verified; keyed hash)",
    }
    for kind, label in KEY_LABELS.items():
        family = KEY_CHARACTERISTICS[kind]
        cells = [
            f"`{family}`" if rule_can_key(caps, kind) and family else "Worker" for caps in plans
        ]
        sources = "[2] [3] [4]" if kind == "jwt" else "[1] [2] [3]"
        lines.append("| " + " | ".join([label, *cells, worker_cells[kind], sources]) + " |")
    lines.extend(
        [
            "",
            f"1. {AVAILABILITY.title}: <{AVAILABILITY.url}>",
            f"2. {PARAMETERS.title}: <{PARAMETERS.url}>",
            f"3. {WORKERS_BINDING.title}: <{WORKERS_BINDING.url}>",
            f"4. {API_SHIELD_JWT.title}: <{API_SHIELD_JWT.url}>",
        ]
    )
    return "\n".join(lines) + "\n"


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


# The parameters page's own lists, cited by the period rows for the values marked *.
_API_PERIOD_VALUES = Sourced(API_PERIODS, PARAMETERS)
_API_TIMEOUT_VALUES = Sourced(API_TIMEOUTS, PARAMETERS)


def _row_sources() -> list[tuple[str, str, tuple[Sourced[Any], ...]]]:
    """(row label, PlanCapabilities field, the other values it cites: the Worker's, the
    parameters page's lists) for each table row."""
    return [
        ("rules", "max_rules", ()),
        ("period (s)", "periods", (_API_PERIOD_VALUES, WORKER.periods)),
        (
            "mitigation timeout (s)",
            "mitigation_timeouts",
            (_API_TIMEOUT_VALUES, WORKER.mitigation_timeout),
        ),
        ("throttle with block (timeout 0)", "block_throttle", ()),
        ("challenge with a timeout", "challenge_timeout", ()),
        ("expression fields", "expression_fields", (WORKER.fields,)),
        ("characteristics besides `cf.colo.id`", "characteristics", (WORKER.keys,)),
        ("actions", "actions", (WORKER.actions,)),
        ("counting expression", "counting_expression", ()),
        (
            "count only requests to the origin (`requests_to_origin`)",
            "requests_to_origin",
            (WORKER.requests_to_origin,),
        ),
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

    def marked(values: tuple[int, ...], timeout: bool = False) -> str:
        # A value the parameters page does not list carries a *: the note says why.
        return ", ".join(
            f"{v}" if v == 0 or PARAMETERS in period_sources(v, timeout=timeout) else f"{v}*"
            for v in values
        )

    def timeouts(caps: PlanCapabilities) -> str:
        values = ((0,) if caps.block_throttle.value else ()) + caps.mitigation_timeouts.value
        return marked(values, timeout=True)

    cells: dict[str, list[str]] = {
        "max_rules": [str(c.max_rules.value) for c in plans] + ["one Worker"],
        "periods": [marked(c.periods.value) for c in plans]
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
            "any key; edgegen uses the client IP, or a keyed hash of a header, cookie or JWT claim",
        ],
        "actions": [
            *_growing([tuple(a.value for a in c.actions.value) for c in plans]),
            "`block` (429)",
        ],
        "counting_expression": [_yes(c.counting_expression.value) for c in plans]
        + ["none; `count_when` is counted after the answer"],
        "requests_to_origin": [_yes(c.requests_to_origin.value) for c in plans]
        + ["no (counts every request)"],
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
