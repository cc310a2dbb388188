"""Edge analytics: what the edgegen rules and the Worker did, from Cloudflare's GraphQL API.

``report(client, scope, since=...)`` reads the zone's http_ratelimit entrypoint to find the
rules edgegen owns (``ref`` starting with ``edgegen:``, as plan and apply identify them) and
their Cloudflare ids, then asks the GraphQL Analytics API (``POST /graphql``, through the
one transport: token, deadlines, size cap; a query is retried as a read is) for:

- ``firewallEventsAdaptiveGroups`` of the zone, ``source: "ratelimit"`` and ``ruleId`` of
  each owned rule: events by ``action``, by ``clientCountryName`` and by ``coloCode``;
- ``workersInvocationsAdaptive`` of the account, ``scriptName`` of the Worker:
  ``sum { requests errors subrequests }``.

Building the queries and reading their answers are pure functions over values; only
``report`` does I/O. GraphQL answers errors with HTTP 200 and an ``errors`` list: they
become a ``CloudflareAPIError`` whose message says what to change (the token's analytics
permission, the plan, a shorter ``--since``). When only the Worker's dataset is refused, the
rules are still reported and the Worker's entry says why it is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _json
from ._cloudflare import Client
from ._ids import RULE_REF_PREFIX
from ._state import Scope
from .errors import CloudflareAPIError, ErrorDetail, UsageError

GRAPHQL_PATH = "/graphql"
RULES_DATASET = "firewallEventsAdaptiveGroups"
WORKER_DATASET = "workersInvocationsAdaptive"
# Firewall event actions that mean a request was refused or made to prove itself; "log" is
# a rule that matched and counted but only logged.
MITIGATIONS = frozenset(
    {
        "block",
        "challenge",
        "jschallenge",
        "js_challenge",
        "managed_challenge",
        "connection_close",
        "force_connection_close",
    }
)
LOGGED = "log"
# Rules asked about in one GraphQL request: each costs three aliased fields, and Cloudflare
# caps the fields and the cost of one query.
RULES_PER_QUERY = 10
# The most actions a rule's events are expected to carry (a longer list is cut, and said so).
ACTION_LIMIT = 25
DEFAULT_TOP = 5
# The most rows one group list may show: one more is asked for (to know whether the list
# was cut), and Cloudflare's page size limit is 10,000.
MAX_TOP = 9_999
# Error codes (``extensions.code``) and phrases that mean "not allowed", in GraphQL answers.
_DENIED_CODES = frozenset({"authz", "authn", "unauthorized", "forbidden"})
_DENIED_WORDS = ("does not have access", "not authorized", "unauthorized", "permission")


# --- values --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Count:
    """One group of events: its value (an action, a country, a colo) and how many."""

    name: str
    count: int


@dataclass(frozen=True, slots=True)
class RuleReport:
    """What one edgegen-owned rate limiting rule did in the window.

    ``events``: every event Cloudflare recorded for the rule (it records one when a request
    passes the rule's threshold, not for each request counted below it); ``mitigated``:
    those blocked or challenged; ``logged``: those of a rule whose action is ``log``.
    ``truncated``: a list had more groups than it shows (each asks for one more than it
    shows, so a list that exactly fills its limit is not marked).
    """

    ref: str
    rule_id: str
    description: str
    action: str
    enabled: bool
    events: int
    mitigated: int
    logged: int
    actions: tuple[Count, ...] = ()
    countries: tuple[Count, ...] = ()
    colos: tuple[Count, ...] = ()
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What the Worker did in the window: invocations (requests it ran on), errors and
    subrequests; ``unavailable`` says why there are no numbers (None when there are)."""

    name: str
    requests: int = 0
    errors: int = 0
    subrequests: int = 0
    statuses: tuple[Count, ...] = ()
    unavailable: str | None = None


@dataclass(frozen=True, slots=True)
class EdgeReport:
    """The edge's numbers for one zone over ``[since, until]``."""

    zone_id: str
    since: datetime
    until: datetime
    rules: tuple[RuleReport, ...]
    worker: WorkerReport | None
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (times in ISO 8601, UTC)."""

        def counts(items: tuple[Count, ...]) -> list[dict[str, Any]]:
            return [{"name": c.name, "count": c.count} for c in items]

        worker = None
        if self.worker is not None:
            w = self.worker
            worker = {
                "name": w.name,
                "requests": w.requests,
                "errors": w.errors,
                "subrequests": w.subrequests,
                "statuses": counts(w.statuses),
                "unavailable": w.unavailable,
            }
        return {
            "zone_id": self.zone_id,
            "since": iso(self.since),
            "until": iso(self.until),
            "rules": [
                {
                    "ref": r.ref,
                    "rule_id": r.rule_id,
                    "description": r.description,
                    "action": r.action,
                    "enabled": r.enabled,
                    "events": r.events,
                    "mitigated": r.mitigated,
                    "logged": r.logged,
                    "actions": counts(r.actions),
                    "countries": counts(r.countries),
                    "colos": counts(r.colos),
                    "truncated": r.truncated,
                }
                for r in self.rules
            ],
            "worker": worker,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class OwnedRule:
    """An edgegen-owned rule as the zone holds it: what the report is about."""

    ref: str
    rule_id: str
    description: str
    action: str
    enabled: bool


# --- pure: what to ask -----------------------------------------------------------------


def iso(moment: datetime) -> str:
    """A moment as GraphQL's ``Time`` takes it: ISO 8601 in UTC, whole seconds."""
    return moment.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def window(since: timedelta, now: datetime) -> tuple[datetime, datetime]:
    """The report's window: ``since`` before ``now``, to ``now``."""
    if since <= timedelta(0):
        raise UsageError("--since must be a positive duration, like 1h, 24h or 7d")
    return now - since, now


def owned_rules(rules: Sequence[Mapping[str, Any]]) -> tuple[OwnedRule, ...]:
    """The entrypoint's rules whose ref starts with ``edgegen:``, in the zone's order."""
    out = []
    for rule in rules:
        ref = rule.get("ref")
        if isinstance(ref, str) and ref.startswith(RULE_REF_PREFIX):
            out.append(
                OwnedRule(
                    ref=ref,
                    rule_id=str(rule.get("id", "")),
                    description=str(rule.get("description", "")),
                    action=str(rule.get("action", "")),
                    enabled=rule.get("enabled", True) is not False,
                )
            )
    return tuple(out)


def _group_field(alias: str, variable: str, dimension: str, limit: int) -> str:
    return (
        f"{alias}: {RULES_DATASET}(limit: {limit}, orderBy: [count_DESC], filter: "
        f'{{source: "ratelimit", ruleId: ${variable}, datetime_geq: $since, '
        f"datetime_leq: $until}}) {{ count dimensions {{ {dimension} }} }}"
    )


def rules_query(
    zone_id: str, rule_ids: Sequence[str], since: datetime, until: datetime, top: int
) -> dict[str, Any]:
    """The GraphQL request (``query`` and ``variables``) for a batch of rules.

    Three aliased groupings per rule (``r{i}_actions``, ``r{i}_countries``,
    ``r{i}_colos``), each filtered to that rule's id and asking for one row more than is
    shown (``top`` countries and colos, ``ACTION_LIMIT`` actions), so that a cut list is
    known; ids travel as variables, never as query text.
    """
    declared = ["$zoneTag: string", "$since: Time", "$until: Time"]
    fields = []
    variables: dict[str, Any] = {"zoneTag": zone_id, "since": iso(since), "until": iso(until)}
    for index, rule_id in enumerate(rule_ids):
        name = f"rule{index}"
        declared.append(f"${name}: string")
        variables[name] = rule_id
        fields.append(_group_field(f"r{index}_actions", name, "action", ACTION_LIMIT + 1))
        fields.append(_group_field(f"r{index}_countries", name, "clientCountryName", top + 1))
        fields.append(_group_field(f"r{index}_colos", name, "coloCode", top + 1))
    body = "\n      ".join(fields)
    query = (
        f"query EdgegenRules({', '.join(declared)}) {{\n"
        "  viewer {\n"
        "    zones(filter: {zoneTag: $zoneTag}) {\n"
        f"      {body}\n"
        "    }\n"
        "  }\n"
        "}"
    )
    return {"query": query, "variables": variables}


def worker_query(account_id: str, script: str, since: datetime, until: datetime) -> dict[str, Any]:
    """The GraphQL request for the Worker's invocations, grouped by status."""
    query = (
        "query EdgegenWorker($accountTag: string, $script: string, $since: Time, "
        "$until: Time) {\n"
        "  viewer {\n"
        "    accounts(filter: {accountTag: $accountTag}) {\n"
        f"      {WORKER_DATASET}(limit: 100, filter: {{scriptName: $script, "
        "datetime_geq: $since, datetime_leq: $until}) {\n"
        "        sum { requests errors subrequests }\n"
        "        dimensions { status }\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "}"
    )
    variables = {
        "accountTag": account_id,
        "script": script,
        "since": iso(since),
        "until": iso(until),
    }
    return {"query": query, "variables": variables}


# --- pure: reading answers -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GraphQLError:
    """One entry of a GraphQL ``errors`` list."""

    message: str
    code: str
    path: tuple[str, ...]

    @property
    def denied(self) -> bool:
        """Whether it says the token or the plan may not read this."""
        text = self.message.lower()
        return self.code.lower() in _DENIED_CODES or any(w in text for w in _DENIED_WORDS)


def graphql_errors(body: Any) -> tuple[GraphQLError, ...]:
    """The ``errors`` of a GraphQL answer (empty when there are none)."""
    errors = body.get("errors") if isinstance(body, dict) else None
    out = []
    for entry in errors or ():
        if not isinstance(entry, dict):
            continue
        extensions = entry.get("extensions")
        code = extensions.get("code") if isinstance(extensions, dict) else None
        path = entry.get("path")
        out.append(
            GraphQLError(
                str(entry.get("message", "")),
                str(code) if code is not None else "",
                tuple(str(p) for p in path) if isinstance(path, list) else (),
            )
        )
    return tuple(out)


def _bad_shape(expected: str) -> CloudflareAPIError:
    return CloudflareAPIError(
        f"Cloudflare's GraphQL API answered POST {GRAPHQL_PATH} with data edgegen cannot "
        f"read (expected {expected}); if CLOUDFLARE_API_BASE_URL points at a proxy, check "
        "that it forwards to the Cloudflare API",
        method="POST",
        path=GRAPHQL_PATH,
        status=200,
    )


def _node(body: Any, scope: str) -> dict[str, Any]:
    """``data.viewer.{zones|accounts}[0]``: the one zone or account asked about."""
    data = body.get("data") if isinstance(body, dict) else None
    viewer = data.get("viewer") if isinstance(data, dict) else None
    items = viewer.get(scope) if isinstance(viewer, dict) else None
    if not isinstance(items, list):
        raise _bad_shape(f"data.viewer.{scope} as a list")
    if not items:
        raise CloudflareAPIError(
            f"Cloudflare's GraphQL API returned no {scope[:-1]} for the id asked about; check "
            f"the {scope[:-1]} id in the policy and that the token covers it",
            method="POST",
            path=GRAPHQL_PATH,
            status=200,
        )
    if not isinstance(items[0], dict):
        raise _bad_shape(f"data.viewer.{scope}[0] as an object")
    return items[0]


def _counts(node: Mapping[str, Any], alias: str, dimension: str) -> tuple[Count, ...]:
    rows = node.get(alias)
    if not isinstance(rows, list):
        raise _bad_shape(f"{alias} as a list of groups")
    out = []
    for row in rows:
        dims = row.get("dimensions") if isinstance(row, dict) else None
        count = row.get("count") if isinstance(row, dict) else None
        if not isinstance(dims, dict) or not isinstance(count, int) or isinstance(count, bool):
            raise _bad_shape(f"{alias} groups with a count and dimensions")
        out.append(Count(str(dims.get(dimension) or "(unknown)"), count))
    return tuple(out)


def read_rules(body: Any, rules: Sequence[OwnedRule], top: int) -> tuple[RuleReport, ...]:
    """The answer to ``rules_query`` for ``rules`` (in the same order), as RuleReports."""
    node = _node(body, "zones")
    out = []
    for index, rule in enumerate(rules):
        actions = _counts(node, f"r{index}_actions", "action")
        countries = _counts(node, f"r{index}_countries", "clientCountryName")
        colos = _counts(node, f"r{index}_colos", "coloCode")
        # Events are summed over every action returned, the extra row included.
        out.append(
            RuleReport(
                ref=rule.ref,
                rule_id=rule.rule_id,
                description=rule.description,
                action=rule.action,
                enabled=rule.enabled,
                events=sum(c.count for c in actions),
                mitigated=sum(c.count for c in actions if c.name in MITIGATIONS),
                logged=sum(c.count for c in actions if c.name == LOGGED),
                actions=actions[:ACTION_LIMIT],
                countries=countries[:top],
                colos=colos[:top],
                truncated=len(actions) > ACTION_LIMIT or len(countries) > top or len(colos) > top,
            )
        )
    return tuple(out)


def read_worker(body: Any, name: str) -> WorkerReport:
    """The answer to ``worker_query``, summed over the statuses."""
    node = _node(body, "accounts")
    rows = node.get(WORKER_DATASET)
    if not isinstance(rows, list):
        raise _bad_shape(f"{WORKER_DATASET} as a list of groups")
    requests = errors = subrequests = 0
    statuses = []
    for row in rows:
        sums = row.get("sum") if isinstance(row, dict) else None
        dims = row.get("dimensions") if isinstance(row, dict) else None
        if not isinstance(sums, dict):
            raise _bad_shape(f"{WORKER_DATASET} groups with a sum")
        values = [sums.get(k, 0) for k in ("requests", "errors", "subrequests")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise _bad_shape(f"{WORKER_DATASET} sums that are whole numbers")
        requests += values[0]
        errors += values[1]
        subrequests += values[2]
        status = dims.get("status") if isinstance(dims, dict) else None
        statuses.append(Count(str(status or "(unknown)"), values[0]))
    statuses.sort(key=lambda c: (-c.count, c.name))
    return WorkerReport(name, requests, errors, subrequests, tuple(statuses))


def refused(errors: Sequence[GraphQLError], what: str, permission: str) -> CloudflareAPIError:
    """The error for a GraphQL answer with ``errors``: what Cloudflare said and the fix."""
    said = "; ".join(f"{e.message}" + (f" (code {e.code})" if e.code else "") for e in errors[:3])
    if any(e.denied for e in errors):
        fix = (
            f"give the token {permission}, or check that the zone's plan includes "
            f"{what} (see docs/zone.md, Edge analytics)"
        )
    elif any(w in said.lower() for w in ("older than", "time range", "duration")):
        fix = "ask for a shorter window with --since (e.g. 24h), which every plan can query"
    else:
        fix = "fix what it names and run again"
    return CloudflareAPIError(
        f"Cloudflare's GraphQL API refused {what}: {said}; {fix}",
        method="POST",
        path=GRAPHQL_PATH,
        status=200,
        errors=tuple(ErrorDetail(None, e.message) for e in errors),
    )


# --- I/O ------------------------------------------------------------------------------

ZONE_PERMISSION = "Zone > Analytics > Read"
ACCOUNT_PERMISSION = "Account > Account Analytics > Read"


def _post(client: Client, request: dict[str, Any], permission: str) -> Any:
    """Send one GraphQL request; its JSON body (errors in it are the caller's to read).

    The client retries a query as a read (5xx, 429, no answer) with its backoff; a query
    changes nothing, so no error says it "may have been made". 401 and 403 (the token, or
    its permissions) get a message that names the analytics permission, a 5xx that
    outlasted the retries one that says the fault is Cloudflare's.
    """
    try:
        content = client.post_graphql(GRAPHQL_PATH, request)
    except CloudflareAPIError as exc:
        if exc.status in (401, 403):
            raise CloudflareAPIError(
                f"Cloudflare refused the API token for its GraphQL Analytics API (HTTP "
                f"{exc.status}); check that CLOUDFLARE_API_TOKEN (or --token-file) is valid "
                f"and give it {permission}",
                method="POST",
                path=GRAPHQL_PATH,
                status=exc.status,
                errors=exc.errors,
            ) from None
        if exc.status is not None and exc.status >= 500:
            raise CloudflareAPIError(
                f"Cloudflare failed to answer a GraphQL Analytics query (HTTP {exc.status}), "
                "also when asked again; this is on Cloudflare's side: run edgegen report "
                "again later, and check https://www.cloudflarestatus.com",
                method="POST",
                path=GRAPHQL_PATH,
                status=exc.status,
                errors=exc.errors,
            ) from None
        raise
    try:
        body = _json.loads(content)
    except ValueError:
        raise _bad_shape("a JSON body") from None
    return _redacted(body, client.redact)


def _redacted(body: Any, redact: Callable[[str], str]) -> Any:
    """The answer with the token taken out of every error message (errors are quoted)."""
    if isinstance(body, dict) and isinstance(body.get("errors"), list):
        body = dict(body)
        body["errors"] = [
            {**e, "message": redact(str(e.get("message", "")))} if isinstance(e, dict) else e
            for e in body["errors"]
        ]
    return body


def report(
    client: Client,
    scope: Scope,
    *,
    since: timedelta = timedelta(hours=24),
    top: int = DEFAULT_TOP,
    now: Callable[[], datetime] | None = None,
    rules_per_query: int = RULES_PER_QUERY,
) -> EdgeReport:
    """What the zone's edgegen rules and the Worker did over the last ``since``.

    Reads the entrypoint (GET), then asks the GraphQL API about the owned rules,
    ``rules_per_query`` at a time, with the ``top`` countries and colos of each; then about
    the Worker when ``scope`` names one and its account. Raises CloudflareAPIError with the
    fix when Cloudflare refuses (see ``refused``).
    """
    if not 1 <= top <= MAX_TOP:
        raise UsageError(f"--top must be between 1 and {MAX_TOP:,}; it is {top}")
    start, end = window(since, (now or (lambda: datetime.now(UTC)))())
    entrypoint = client.get_entrypoint(scope.zone_id)
    rules = owned_rules(entrypoint.rules if entrypoint is not None else ())
    notes = []
    if not rules:
        notes.append(
            f"zone {scope.zone_id} has no edgegen rate limiting rules; "
            "edgegen apply puts them there"
        )
    reports: list[RuleReport] = []
    step = max(1, rules_per_query)
    for first in range(0, len(rules), step):
        batch = rules[first : first + step]
        request = rules_query(scope.zone_id, [r.rule_id for r in batch], start, end, top)
        body = _post(client, request, ZONE_PERMISSION)
        errors = graphql_errors(body)
        if errors:
            raise refused(errors, f"the rate limiting events ({RULES_DATASET})", ZONE_PERMISSION)
        reports.extend(read_rules(body, batch, top))
    worker = None
    if scope.worker_name is not None and scope.account_id is not None:
        request = worker_query(scope.account_id, scope.worker_name, start, end)
        body = _post(client, request, ACCOUNT_PERMISSION)
        errors = graphql_errors(body)
        if errors and all(e.denied for e in errors):
            # The rules' numbers are worth having without the Worker's: say why it is missing.
            reason = refused(
                errors, f"the Worker's invocations ({WORKER_DATASET})", ACCOUNT_PERMISSION
            )
            worker = WorkerReport(scope.worker_name, unavailable=str(reason))
        elif errors:
            raise refused(
                errors, f"the Worker's invocations ({WORKER_DATASET})", ACCOUNT_PERMISSION
            )
        else:
            worker = read_worker(body, scope.worker_name)
    return EdgeReport(scope.zone_id, start, end, tuple(reports), worker, tuple(notes))
