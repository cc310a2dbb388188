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
``report`` does I/O. An answer is read through strict pydantic models, as plan and state
files are: a field of the wrong JSON type, a negative or impossibly large count, or a
dimension that is not a string is one ``CloudflareAPIError`` naming the field, and every
string the server sent (error messages and codes, dimension values, the rules' names) is
redacted as every server message is (``_messages.Redactor``). GraphQL answers errors with
HTTP 200 and an ``errors`` list: they become a ``CloudflareAPIError`` whose message says what
to change (the token's analytics permission, the plan, a shorter ``--since``). When only
the Worker's dataset is refused, the rules are still reported and the Worker's entry says
why it is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import _json
from ..compiler._ids import RULE_REF_PREFIX
from ..errors import CloudflareAPIError, ErrorDetail, UsageError
from ._messages import MAX_QUOTED_ERRORS
from ._state import Scope

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

if TYPE_CHECKING:
    # The client (httpx) only as a type: importing this module needs no edge extra.
    from ._client import Client
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
#
# An answer is untrusted input, read as plan and state files are: its shape is a pydantic
# model whose every field has its JSON type (strict: a number is never read from a string),
# so a malformed answer is one clear error naming the field at fault, never a TypeError or
# numbers printed as they came. Every string the server sent passes through the client's
# redactor (``_messages.Redactor``) before it is kept, in errors and in the report alike.

# The largest count believed: JSON's largest exact integer, far above any real count of
# requests in a window; a larger one is not a number Cloudflare computed.
MAX_COUNT = 2**53 - 1
Redact = Callable[[str], str]
_Tally = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class _Shape(BaseModel):
    """An object of a GraphQL answer: each field of its JSON type, others ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _ErrorExtensions(_Shape):
    code: str | None = None


class _ErrorEntry(_Shape):
    """One entry of ``errors``, as the GraphQL spec writes it."""

    message: str
    path: list[Any] | None = None
    extensions: _ErrorExtensions | None = None

    @field_validator("path")
    @classmethod
    def _names_and_indexes(cls, path: list[Any] | None) -> list[Any] | None:
        if path is not None and not all(
            isinstance(p, str | int) and not isinstance(p, bool) for p in path
        ):
            raise ValueError("each part of a path is a field name or an index")
        return path


class _Answer(_Shape):
    """The top of every GraphQL answer; ``data`` is read by the query's own model once
    there are no ``errors`` (a refused query's data may be null or partial)."""

    data: dict[str, Any] | None = None
    errors: list[_ErrorEntry] | None = None


class _Group(_Shape):
    """A row of ``firewallEventsAdaptiveGroups``: events counted, by one dimension."""

    count: _Tally
    dimensions: dict[str, str | None]


class _Zones(_Shape):
    # Each zone node holds exactly the aliased fields asked for, each a list of groups.
    zones: list[dict[str, list[_Group]]]


class _RulesData(_Shape):
    viewer: _Zones


class _Sums(_Shape):
    requests: _Tally = 0
    errors: _Tally = 0
    subrequests: _Tally = 0


class _Invocations(_Shape):
    """A row of ``workersInvocationsAdaptive``: sums, by status."""

    sums: _Sums = Field(alias="sum")
    dimensions: dict[str, str | None] | None = None


class _Account(_Shape):
    invocations: list[_Invocations] = Field(alias=WORKER_DATASET)


class _Accounts(_Shape):
    accounts: list[_Account]


class _WorkerData(_Shape):
    viewer: _Accounts


_Data = TypeVar("_Data", bound=_Shape)
_Node = TypeVar("_Node")


@dataclass(frozen=True, slots=True)
class GraphQLError:
    """One entry of a GraphQL ``errors`` list, every string redacted."""

    message: str
    code: str
    path: tuple[str, ...]

    @property
    def denied(self) -> bool:
        """Whether it says the token or the plan may not read this."""
        text = self.message.lower()
        return self.code.lower() in _DENIED_CODES or any(w in text for w in _DENIED_WORDS)


def _why(error: ValidationError, where: str, redact: Redact) -> str:
    """The first thing wrong in an answer, in words: ``data.viewer.zones[0].r0_actions[1].
    count is -5: input should be greater than or equal to 0``. The place (keys are the
    server's) and the value are redacted each on its own, so a value that quotes the token
    is withheld without hiding where it was."""
    first = error.errors(include_url=False)[0]
    for part in first["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    where = redact(where) if where else "the answer"
    if first["type"] == "missing":
        return f"{where} is missing"
    if first["type"] in ("model_type", "model_attributes_type", "dict_type"):
        message = "input should be an object"
    else:
        message = str(first["msg"]).removeprefix("Value error, ")
    shown = redact(_json.shown(first["input"]))
    return f"{where} is {shown}: {message[:1].lower()}{message[1:]}"


def _bad_shape(reason: str) -> CloudflareAPIError:
    """The error for an answer edgegen cannot read; ``reason`` is already redacted."""
    return CloudflareAPIError(
        f"Cloudflare's GraphQL API answered POST {GRAPHQL_PATH} with data edgegen cannot "
        f"read ({reason}); if CLOUDFLARE_API_BASE_URL points at a proxy, check that it "
        "forwards to the Cloudflare API",
        method="POST",
        path=GRAPHQL_PATH,
        status=200,
    )


def read_answer(body: Any, redact: Redact) -> tuple[tuple[GraphQLError, ...], dict[str, Any]]:
    """The ``errors`` of a parsed GraphQL answer (redacted; at most ``MAX_QUOTED_ERRORS``)
    and its ``data`` (empty when there are errors); CloudflareAPIError when the answer is
    not shaped like one, or has neither."""
    try:
        answer = _Answer.model_validate(body)
    except ValidationError as exc:
        raise _bad_shape(_why(exc, "", redact)) from None
    errors = tuple(
        GraphQLError(
            redact(entry.message),
            redact(entry.extensions.code or "") if entry.extensions is not None else "",
            tuple(redact(str(part)) for part in entry.path or ()),
        )
        for entry in (answer.errors or ())[:MAX_QUOTED_ERRORS]
    )
    if errors:
        return errors, {}
    if answer.data is None:
        raise _bad_shape("data is null, and there are no errors to say why")
    return (), answer.data


def _validated(model: type[_Data], data: dict[str, Any], redact: Redact) -> _Data:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _bad_shape(_why(exc, "data", redact)) from None


def _first(items: Sequence[_Node], scope: str) -> _Node:
    """The one zone or account asked about."""
    if not items:
        raise CloudflareAPIError(
            f"Cloudflare's GraphQL API returned no {scope[:-1]} for the id asked about; check "
            f"the {scope[:-1]} id in the policy and that the token covers it",
            method="POST",
            path=GRAPHQL_PATH,
            status=200,
        )
    return items[0]


def _name(dimensions: Mapping[str, str | None] | None, dimension: str, redact: Redact) -> str:
    value = (dimensions or {}).get(dimension)
    return redact(value) if value else "(unknown)"


def _counts(
    node: Mapping[str, list[_Group]], alias: str, dimension: str, redact: Redact
) -> tuple[Count, ...]:
    groups = node.get(alias)
    if groups is None:
        raise _bad_shape(f"data.viewer.zones[0].{alias} is missing")
    return tuple(Count(_name(g.dimensions, dimension, redact), g.count) for g in groups)


def read_rules(
    data: dict[str, Any], rules: Sequence[OwnedRule], top: int, redact: Redact
) -> tuple[RuleReport, ...]:
    """The ``data`` of the answer to ``rules_query`` for ``rules`` (in the same order), as
    RuleReports; every string in them redacted."""
    node = _first(_validated(_RulesData, data, redact).viewer.zones, "zones")
    cached = functools.lru_cache(maxsize=4096)(redact)
    out = []
    for index, rule in enumerate(rules):
        actions = _counts(node, f"r{index}_actions", "action", cached)
        countries = _counts(node, f"r{index}_countries", "clientCountryName", cached)
        colos = _counts(node, f"r{index}_colos", "coloCode", cached)
        # Events are summed over every action returned, the extra row included.
        out.append(
            RuleReport(
                ref=redact(rule.ref),
                rule_id=redact(rule.rule_id),
                description=redact(rule.description),
                action=redact(rule.action),
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


def read_worker(data: dict[str, Any], name: str, redact: Redact) -> WorkerReport:
    """The ``data`` of the answer to ``worker_query``, summed over the statuses."""
    account = _first(_validated(_WorkerData, data, redact).viewer.accounts, "accounts")
    cached = functools.lru_cache(maxsize=4096)(redact)
    statuses = [
        Count(_name(row.dimensions, "status", cached), row.sums.requests)
        for row in account.invocations
    ]
    statuses.sort(key=lambda c: (-c.count, c.name))
    return WorkerReport(
        name,
        requests=sum(row.sums.requests for row in account.invocations),
        errors=sum(row.sums.errors for row in account.invocations),
        subrequests=sum(row.sums.subrequests for row in account.invocations),
        statuses=tuple(statuses),
    )


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


def _post(
    client: Client, request: dict[str, Any], permission: str
) -> tuple[tuple[GraphQLError, ...], dict[str, Any]]:
    """Send one GraphQL request; the answer's errors and data (``read_answer``: the
    errors are the caller's to act on).

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
    except _json.UnusableJSONError as exc:
        raise _bad_shape(f"its body is JSON edgegen cannot use: {exc}") from None
    except ValueError:
        raise _bad_shape("its body is not JSON") from None
    return read_answer(body, client.redact)


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
        errors, data = _post(client, request, ZONE_PERMISSION)
        if errors:
            raise refused(errors, f"the rate limiting events ({RULES_DATASET})", ZONE_PERMISSION)
        reports.extend(read_rules(data, batch, top, client.redact))
    worker = None
    if scope.worker_name is not None and scope.account_id is not None:
        request = worker_query(scope.account_id, scope.worker_name, start, end)
        errors, data = _post(client, request, ACCOUNT_PERMISSION)
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
            worker = read_worker(data, scope.worker_name, client.redact)
    return EdgeReport(scope.zone_id, start, end, tuple(reports), worker, tuple(notes))
