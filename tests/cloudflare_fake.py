"""A stateful fake of the parts of the Cloudflare API that edgegen uses, for respx.

It follows /work/shared/reference/cloudflare.md and Cloudflare's API docs:

- every answer is the v4 envelope ``{"success", "errors", "messages", "result"}``;
- ``GET/PUT /zones/{z}/rulesets/phases/http_ratelimit/entrypoint``: 404 with code 10003
  while the zone has no entrypoint; each PUT makes a new ruleset ``version`` (a string);
  a rule sent with its ``id`` keeps that id (its own ``version`` goes up when it changed),
  a rule without one gets a new id, rules left out are deleted; ``?dry_run=true`` validates
  and returns ``result: null`` without saving;
- rule validation with 400s that carry ``source.pointer`` (``/rules/0/ratelimit/period``):
  expression over 4,096 characters, periods and timeouts the plan does not offer, the
  plan's rule quota, duplicate refs, unknown ids, challenge actions with a timeout below
  Enterprise, bad block responses, unknown fields, characteristics the plan does not offer
  (and ``ip.src`` together with ``cf.unique_visitor_id``);
- auth: 401 without a token or with an unknown one, 403 for a token without the permission
  the endpoint needs;
- 429 with ``Retry-After`` once a request budget is spent, and 5xx injected at chosen
  requests (optionally after the write was made, to model an ambiguous failure);
- Workers: multipart ``PUT /accounts/{a}/workers/scripts/{name}`` (a ``metadata`` part with
  ``main_module``, ``compatibility_date`` and ``bindings``, one part per module), then
  ``GET .../settings`` (bindings) and ``GET .../content/v2`` (multipart, ``CF-Entrypoint``);
  a missing script is 404 with code 10007;
- Worker routes: list, create (409 for a pattern already routed), update, delete;
- the GraphQL Analytics API (``FakeGraphQL``, ``POST /graphql``): ``{"data": {"viewer":
  {"zones"|"accounts": [...]}}, "errors": null}``, groups as ``{"count", "dimensions"}``
  (``firewallEventsAdaptiveGroups``) or ``{"sum", "dimensions"}``
  (``workersInvocationsAdaptive``); refusals as ``errors`` with ``extensions.code`` in a
  200 answer, an unknown token as HTTP 403, a 429 with ``Retry-After`` once its request
  budget is spent; and the limits a query must keep: fields per query, rows per list, how
  far back the plan may look;
- the zone's URL normalisation setting: ``GET/PUT /zones/{z}/url_normalization``, result
  ``{"scope": "incoming"|"both"|"none", "type": "cloudflare"|"rfc3986"}`` (default
  incoming + cloudflare), 403 for a token without Zone Settings permission.

Counting expressions are checked as Cloudflare documents them: none below Business, at most
4,096 characters, and response fields (``http.response.code``) only there, never in a
rule's matching expression.

Error codes other than 10003, 10007, 10000 (authentication), 971 (API limit) and 7003 (no
such object) are illustrative: edgegen matches on status and pointer, never on codes it
does not know. The fake is stricter than Cloudflare in one way: it rejects response-only
rule fields (``version``, ``last_updated``, ``categories``), which the reference says to strip.
"""

from __future__ import annotations

import copy
import email.parser
import email.policy
import hashlib
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
import respx

BASE_URL = "https://api.cloudflare.com/client/v4"
ZONE_ID = "0123456789abcdef0123456789abcdef"
ACCOUNT_ID = "fedcba9876543210fedcba9876543210"
TOKEN = "fake-token-for-tests-0000"
PHASE = "http_ratelimit"

# What a plan allows, taken from the reference's docs page list (not from edgegen's own
# capability table, so that the two can disagree and a test would show it).
PLAN_RULES = {"free": 1, "pro": 2, "business": 5, "enterprise": 100, "enterprise-arl": 100}
# The availability table: "all supported values up to" 10 s, 1 min, 10 min, 65,535 s
# (periods) and 10 s, 1 h, 1 day (timeouts), the values listed in its footnote 3.
_SUPPORTED = [10, 15, 20, 30, 40, 45, 60, 90, 120, 180, 240, 300, 480, 600, 900, 1200, 1800]
_SUPPORTED += [2400, 3600, 65535, 86400]
PLAN_PERIODS = {
    "free": {10},
    "pro": {p for p in _SUPPORTED if p <= 60},
    "business": {p for p in _SUPPORTED if p <= 600},
    "enterprise": {p for p in _SUPPORTED if p <= 65535},
    "enterprise-arl": {p for p in _SUPPORTED if p <= 65535},
}
PLAN_TIMEOUTS = {
    "free": {10},
    "pro": {p for p in _SUPPORTED if p <= 3600},
    "business": set(_SUPPORTED),
    "enterprise": set(_SUPPORTED),
    "enterprise-arl": set(_SUPPORTED),
}
# Characteristics besides cf.colo.id, from the reference's table (section 2) and the
# parameters page: IP everywhere, IP with NAT support from Business, and the header, cookie,
# query, host, path, ASN, country and fingerprint characteristics with Advanced Rate Limiting.
_NAT = {"ip.src", "cf.unique_visitor_id"}
PLAN_CHARACTERISTICS = {
    "free": {"ip.src"},
    "pro": {"ip.src"},
    "business": _NAT,
    "enterprise": _NAT,
    "enterprise-arl": _NAT
    | {
        "http.host",
        "http.request.uri.path",
        "ip.src.asnum",
        "ip.src.country",
        "cf.bot_management.ja3_hash",
        "cf.bot_management.ja4",
    },
}
# Advanced Rate Limiting's characteristics that name a header, cookie or query argument.
ARL_NAMED = re.compile(r'^http\.request\.(headers|cookies|uri\.args)\["(?:[^"\\]|\\.)+"\]$')
ACTIONS = {"block", "managed_challenge", "js_challenge", "challenge", "log"}
CHALLENGES = {"managed_challenge", "js_challenge", "challenge"}
CONTENT_TYPES = {"application/json", "text/html", "text/xml", "text/plain"}
RULE_FIELDS = {
    "id",
    "ref",
    "description",
    "expression",
    "action",
    "action_parameters",
    "ratelimit",
    "enabled",
    "logging",
}
RESPONSE_ONLY = {"version", "last_updated", "categories"}
RATELIMIT_FIELDS = {
    "characteristics",
    "period",
    "requests_per_period",
    "mitigation_timeout",
    "requests_to_origin",
    "counting_expression",
    "score_per_period",
    "score_response_header_name",
}
PERMISSIONS = frozenset({"waf", "scripts", "routes", "zone_settings"})
URL_NORMALIZATION_SCOPES = {"incoming", "both", "none"}
URL_NORMALIZATION_TYPES = {"cloudflare", "rfc3986"}
NOW = "2026-01-01T00:00:00.000000Z"


def one_of(value: Any, options: set[Any]) -> bool:
    """``value in options``, false for values that cannot be in a set (lists, objects)."""
    return isinstance(value, (str, int, float, type(None))) and value in options


def envelope(result: Any = None, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The v4 envelope."""
    return {"success": not errors, "errors": errors or [], "messages": [], "result": result}


def error(code: int, message: str, pointer: str | None = None) -> dict[str, Any]:
    """One envelope error, with a JSON pointer when given."""
    out: dict[str, Any] = {"code": code, "message": message}
    if pointer is not None:
        out["source"] = {"pointer": pointer}
    return out


def respond(
    status: int, result: Any = None, errors: list[dict[str, Any]] | None = None, **headers: str
) -> httpx.Response:
    """A JSON envelope response."""
    return httpx.Response(status, json=envelope(result, errors), headers=headers)


@dataclass
class Fault:
    """An injected failure: the ``nth`` matching request answers ``status``.

    ``after_write``: the write is made first, then the failure is reported (the client
    cannot know whether it happened).
    """

    method: str
    path_contains: str
    status: int = 500
    times: int = 1
    after_write: bool = False
    retry_after: str | None = None


@dataclass
class Script:
    """A stored Worker script."""

    main_module: str
    modules: dict[str, tuple[bytes, str]]
    bindings: list[dict[str, Any]]
    compatibility_date: str
    etag: str


@dataclass
class Recorded:
    """One request the fake answered."""

    method: str
    path: str
    query: str
    status: int
    body: bytes = b""

    @property
    def is_write(self) -> bool:
        """Anything but a GET (a dry_run PUT counts: it is sent with a write method)."""
        return self.method != "GET"


@dataclass
class FakeCloudflare:
    """The fake API. Install it with ``with fake.mock(): ...`` (a respx router)."""

    zone_id: str = ZONE_ID
    account_id: str = ACCOUNT_ID
    plan: str = "business"
    base_url: str = BASE_URL
    tokens: dict[str, frozenset[str]] = field(default_factory=lambda: {TOKEN: PERMISSIONS})
    entrypoint: dict[str, Any] | None = None
    scripts: dict[str, Script] = field(default_factory=dict)
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)
    url_normalization: dict[str, str] = field(
        default_factory=lambda: {"scope": "incoming", "type": "cloudflare"}
    )
    faults: list[Fault] = field(default_factory=list)
    budget: int | None = None
    throttled_for: int = 1
    retry_after: str = "2"
    log: list[Recorded] = field(default_factory=list)
    _served: int = 0
    _throttled: int = 0
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # --- test helpers ------------------------------------------------------------------

    @contextmanager
    def mock(self) -> Iterator[respx.MockRouter]:
        """Route every request to ``base_url`` through this fake."""
        with respx.mock(base_url=self.base_url, assert_all_called=False) as router:
            router.route().mock(side_effect=self.handle)
            yield router

    def seed_rules(self, rules: list[dict[str, Any]], description: str = "") -> None:
        """Give the zone an entrypoint with these rules (as if made in the dashboard)."""
        self.entrypoint = {
            "id": self._new_id(),
            "name": "default",
            "description": description,
            "kind": "zone",
            "phase": PHASE,
            "version": "1",
            "last_updated": NOW,
            "rules": [],
        }
        self.entrypoint["rules"] = [self._stored_rule(rule, None, "1") for rule in rules]

    def add_route(self, pattern: str, script: str | None) -> str:
        """Add a route directly; returns its id."""
        route_id = self._new_id()
        self.routes[route_id] = {"id": route_id, "pattern": pattern, "script": script}
        return route_id

    def set_script(
        self,
        name: str,
        source: str,
        bindings: list[dict[str, Any]] | None = None,
        *,
        main_module: str = "worker.js",
        compatibility_date: str = "2025-01-01",
    ) -> None:
        """Store a Worker script directly."""
        data = source.encode()
        self.scripts[name] = Script(
            main_module,
            {main_module: (data, "application/javascript+module")},
            list(bindings or []),
            compatibility_date,
            hashlib.sha256(data).hexdigest(),
        )

    def throttle(self, after: int, times: int = 1, retry_after: str = "2") -> None:
        """Answer 429 (with Retry-After) to ``times`` requests after ``after`` more."""
        self.budget = self._served + after
        self.throttled_for = times
        self.retry_after = retry_after
        self._throttled = 0

    def fail(self, method: str, path_contains: str, status: int = 500, **options: Any) -> None:
        """Inject a failure for matching requests (see Fault)."""
        self.faults.append(Fault(method, path_contains, status, **options))

    @property
    def writes(self) -> list[Recorded]:
        """Every non-GET request answered."""
        return [r for r in self.log if r.is_write]

    @property
    def rules(self) -> list[dict[str, Any]]:
        """The rules now stored (empty without an entrypoint)."""
        return list(self.entrypoint["rules"]) if self.entrypoint else []

    @property
    def version(self) -> str | None:
        """The entrypoint's version now."""
        return self.entrypoint["version"] if self.entrypoint else None

    # --- dispatch ----------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request (the respx side effect)."""
        base_path = urlsplit(self.base_url).path.rstrip("/")
        path = request.url.path
        if not path.startswith(base_path + "/"):
            return self._record(
                request, respond(404, errors=[error(7000, "No route for that URI")])
            )
        path = path[len(base_path) :]
        response = self._dispatch(request, path)
        return self._record(request, response)

    def _record(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        self.log.append(
            Recorded(
                request.method,
                request.url.path,
                request.url.query.decode(),
                response.status_code,
                request.content,
            )
        )
        return response

    def _dispatch(self, request: httpx.Request, path: str) -> httpx.Response:
        need = self._permission(path)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        if token is None or token not in self.tokens:
            return respond(401, errors=[error(10000, "Authentication error")])
        if need is not None and need not in self.tokens[token]:
            return respond(403, errors=[error(10000, "Authentication error")])
        self._served += 1
        if self.budget is not None and self._served > self.budget:
            if self._throttled < self.throttled_for:
                self._throttled += 1
                return respond(
                    429,
                    errors=[error(971, "Please wait and consider throttling your request speed")],
                    **{"Retry-After": self.retry_after},
                )
            self.budget = None
        fault = self._fault(request, path)
        if fault is not None and not fault.after_write:
            return self._fault_response(fault)
        response = self._route(request, path)
        if fault is not None:
            return self._fault_response(fault)
        return response

    def _fault(self, request: httpx.Request, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == request.method and fault.path_contains in path:
                fault.times -= 1
                return fault
        return None

    @staticmethod
    def _fault_response(fault: Fault) -> httpx.Response:
        headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
        if fault.status >= 500 and fault.status != 503:
            return respond(fault.status, errors=[error(10013, "Internal server error")], **headers)
        return respond(fault.status, errors=[error(10013, "Service unavailable")], **headers)

    @staticmethod
    def _permission(path: str) -> str | None:
        if "/rulesets/" in path:
            return "waf"
        if "/workers/routes" in path:
            return "routes"
        if "/workers/scripts/" in path:
            return "scripts"
        if path.endswith("/url_normalization"):
            return "zone_settings"
        return None

    def _route(self, request: httpx.Request, path: str) -> httpx.Response:
        method = request.method
        table: list[tuple[str, str, Callable[..., httpx.Response]]] = [
            ("GET", rf"/zones/(?P<zone>[^/]+)/rulesets/phases/{PHASE}/entrypoint", self.get_entry),
            ("PUT", rf"/zones/(?P<zone>[^/]+)/rulesets/phases/{PHASE}/entrypoint", self.put_entry),
            ("GET", r"/zones/(?P<zone>[^/]+)/url_normalization", self.get_url_normalization),
            ("PUT", r"/zones/(?P<zone>[^/]+)/url_normalization", self.put_url_normalization),
            ("GET", r"/zones/(?P<zone>[^/]+)/workers/routes", self.list_routes),
            ("POST", r"/zones/(?P<zone>[^/]+)/workers/routes", self.create_route),
            ("PUT", r"/zones/(?P<zone>[^/]+)/workers/routes/(?P<rid>[^/]+)", self.update_route),
            ("DELETE", r"/zones/(?P<zone>[^/]+)/workers/routes/(?P<rid>[^/]+)", self.delete_route),
            ("PUT", r"/accounts/(?P<acc>[^/]+)/workers/scripts/(?P<name>[^/]+)", self.put_script),
            (
                "GET",
                r"/accounts/(?P<acc>[^/]+)/workers/scripts/(?P<name>[^/]+)/settings",
                self.get_settings,
            ),
            (
                "GET",
                r"/accounts/(?P<acc>[^/]+)/workers/scripts/(?P<name>[^/]+)/content/v2",
                self.get_content,
            ),
        ]
        for verb, pattern, handler in table:
            match = re.fullmatch(pattern, path)
            if match and verb == method:
                args = match.groupdict()
                if args.get("zone", self.zone_id) != self.zone_id or (
                    args.get("acc", self.account_id) != self.account_id
                ):
                    return respond(
                        404,
                        errors=[
                            error(
                                7003,
                                f"Could not route to {path}, perhaps your object identifier "
                                "is invalid?",
                            )
                        ],
                    )
                args.pop("zone", None)
                args.pop("acc", None)
                return handler(request, **args)
        return respond(404, errors=[error(7000, "No route for that URI")])

    def _new_id(self) -> str:
        return uuid.UUID(int=next(self._ids)).hex

    # --- rulesets ----------------------------------------------------------------------

    def get_entry(self, request: httpx.Request) -> httpx.Response:
        """GET the entrypoint, or 404 code 10003."""
        if self.entrypoint is None:
            return respond(
                404,
                errors=[error(10003, f"could not find entrypoint ruleset in the {PHASE} phase")],
            )
        return respond(200, copy.deepcopy(self.entrypoint))

    def put_entry(self, request: httpx.Request) -> httpx.Response:
        """PUT the entrypoint: validate, then save as a new version (unless dry_run)."""
        try:
            body = json.loads(request.content)
        except ValueError:
            return respond(400, errors=[error(10026, "filters.api.invalid_json")])
        if not isinstance(body, dict) or not isinstance(body.get("rules", []), list):
            return respond(400, errors=[error(20003, "rules must be a list", "/rules")])
        rules = body.get("rules", [])
        errors = self.validate_rules(rules)
        if errors:
            return respond(400, errors=errors)
        if request.url.params.get("dry_run") == "true":
            return respond(200, None)
        old = self.entrypoint
        old_rules = {r["id"]: r for r in old["rules"]} if old else {}
        version = str(int(old["version"]) + 1) if old else "1"
        stored = [
            self._stored_rule(rule, old_rules.get(rule.get("id", "")), version) for rule in rules
        ]
        self.entrypoint = {
            "id": old["id"] if old else self._new_id(),
            "name": old["name"] if old else "default",
            "description": body.get("description", old["description"] if old else ""),
            "kind": "zone",
            "phase": PHASE,
            "version": version,
            "last_updated": NOW,
            "rules": stored,
        }
        return respond(200, copy.deepcopy(self.entrypoint))

    def _stored_rule(
        self, rule: dict[str, Any], old: dict[str, Any] | None, ruleset_version: str
    ) -> dict[str, Any]:
        """A rule as Cloudflare stores and returns it: defaults and response fields added."""
        out = copy.deepcopy(rule)
        rule_id = out.pop("id", None) or self._new_id()
        out.setdefault("ref", rule_id)
        out.setdefault("enabled", True)
        out.setdefault("description", "")
        if isinstance(out.get("ratelimit"), dict):
            out["ratelimit"].setdefault("requests_to_origin", False)
        if old is not None:
            same = {k: v for k, v in old.items() if k not in RESPONSE_ONLY | {"id"}} == out
            rule_version = old["version"] if same else str(int(old["version"]) + 1)
            updated = old["last_updated"] if same else NOW
        else:
            rule_version, updated = "1", NOW
        return {"id": rule_id, **out, "version": rule_version, "last_updated": updated}

    def validate_rules(self, rules: list[Any]) -> list[dict[str, Any]]:
        """Every problem with a rule list, each with its JSON pointer."""
        errors: list[dict[str, Any]] = []
        plan = self.plan
        enterprise = plan.startswith("enterprise")
        existing = {r["id"] for r in self.entrypoint["rules"]} if self.entrypoint else set()
        refs: dict[str, int] = {}
        if len(rules) > PLAN_RULES[plan]:
            errors.append(
                error(
                    20120,
                    f"exceeded maximum number of rules in the phase {PHASE}: "
                    f"{len(rules)} out of {PLAN_RULES[plan]}",
                    "/rules",
                )
            )
        for index, rule in enumerate(rules):
            at = f"/rules/{index}"
            if not isinstance(rule, dict):
                errors.append(error(20003, "a rule must be an object", at))
                continue
            for key in sorted(set(rule) - RULE_FIELDS):
                why = "is a response-only field" if key in RESPONSE_ONLY else "is not a rule field"
                errors.append(error(20003, f"{key!r} {why}", f"{at}/{key}"))
            rule_id = rule.get("id")
            if rule_id is not None and (not isinstance(rule_id, str) or rule_id not in existing):
                errors.append(error(20004, f"could not find rule {rule_id}", f"{at}/id"))
            ref = rule.get("ref")
            if ref is not None and not isinstance(ref, str):
                errors.append(error(20005, "ref must be a string", f"{at}/ref"))
            elif ref is not None:
                if ref in refs:
                    errors.append(
                        error(20005, f"ref {ref!r} is also used by rule {refs[ref]}", f"{at}/ref")
                    )
                refs.setdefault(ref, index)
            expression = rule.get("expression")
            if not isinstance(expression, str) or not expression:
                errors.append(error(20006, "an expression is required", f"{at}/expression"))
            elif len(expression) > 4096:
                errors.append(
                    error(
                        20007,
                        f"the expression is {len(expression)} characters long; the maximum is 4096",
                        f"{at}/expression",
                    )
                )
            action = rule.get("action")
            if not one_of(action, ACTIONS):
                errors.append(error(20008, f"unknown action {action!r}", f"{at}/action"))
            elif action == "log" and not enterprise:
                errors.append(
                    error(
                        20009, f"the log action is not available on the {plan} plan", f"{at}/action"
                    )
                )
            errors.extend(self._validate_parameters(rule, at))
            errors.extend(self._validate_ratelimit(rule, at, enterprise))
        return errors

    def _validate_parameters(self, rule: dict[str, Any], at: str) -> list[dict[str, Any]]:
        params = rule.get("action_parameters")
        if params is None:
            return []
        if rule.get("action") != "block":
            return [
                error(20010, "action_parameters apply to block only", f"{at}/action_parameters")
            ]
        if self.plan == "free":
            return [
                error(
                    20011,
                    "custom responses are not available on the free plan",
                    f"{at}/action_parameters",
                )
            ]
        response = params.get("response") if isinstance(params, dict) else None
        if not isinstance(response, dict):
            return [error(20012, "response must be an object", f"{at}/action_parameters/response")]
        errors = []
        status = response.get("status_code")
        if not isinstance(status, int) or not 400 <= status <= 499:
            errors.append(
                error(
                    20013,
                    "status_code must be between 400 and 499",
                    f"{at}/action_parameters/response/status_code",
                )
            )
        if not one_of(response.get("content_type"), CONTENT_TYPES):
            errors.append(
                error(
                    20014,
                    "content_type is not supported",
                    f"{at}/action_parameters/response/content_type",
                )
            )
        return errors

    def _validate_characteristics(self, characteristics: object, at: str) -> list[dict[str, Any]]:
        """Characteristics the plan does not offer, and IP with IP with NAT support."""
        if not isinstance(characteristics, list):
            return []
        errors = []
        allowed = PLAN_CHARACTERISTICS[self.plan]
        for index, name in enumerate(characteristics):
            if name == "cf.colo.id":
                continue
            named = isinstance(name, str) and ARL_NAMED.match(name) is not None
            if not (one_of(name, allowed) or (named and self.plan == "enterprise-arl")):
                errors.append(
                    error(
                        20024,
                        f"the characteristic {name!r} is not available on the {self.plan} plan",
                        f"{at}/characteristics/{index}",
                    )
                )
        if "ip.src" in characteristics and "cf.unique_visitor_id" in characteristics:
            errors.append(
                error(
                    20025,
                    "ip.src and cf.unique_visitor_id cannot be used together",
                    f"{at}/characteristics",
                )
            )
        return errors

    def _validate_ratelimit(
        self, rule: dict[str, Any], at: str, enterprise: bool
    ) -> list[dict[str, Any]]:
        limit = rule.get("ratelimit")
        if not isinstance(limit, dict):
            return [error(20015, "ratelimit is required", f"{at}/ratelimit")]
        errors = []
        at = f"{at}/ratelimit"
        for key in sorted(set(limit) - RATELIMIT_FIELDS):
            errors.append(error(20003, f"{key!r} is not a ratelimit field", f"{at}/{key}"))
        characteristics = limit.get("characteristics")
        if not isinstance(characteristics, list) or "cf.colo.id" not in characteristics:
            errors.append(
                error(20016, "characteristics must include cf.colo.id", f"{at}/characteristics")
            )
        errors.extend(self._validate_characteristics(characteristics, at))
        period = limit.get("period")
        if not one_of(period, PLAN_PERIODS[self.plan]):
            allowed = ", ".join(str(p) for p in sorted(PLAN_PERIODS[self.plan]))
            errors.append(
                error(
                    20017,
                    f"period {period} is not available on the {self.plan} plan (use {allowed})",
                    f"{at}/period",
                )
            )
        count = limit.get("requests_per_period")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            errors.append(
                error(20018, "requests_per_period must be at least 1", f"{at}/requests_per_period")
            )
        timeout = limit.get("mitigation_timeout", 0)
        if timeout != 0 and not one_of(timeout, PLAN_TIMEOUTS[self.plan]):
            errors.append(
                error(
                    20019,
                    f"mitigation_timeout {timeout} is not available on the {self.plan} plan",
                    f"{at}/mitigation_timeout",
                )
            )
        if one_of(rule.get("action"), CHALLENGES) and timeout != 0 and not enterprise:
            errors.append(
                error(
                    20020,
                    "challenge actions need mitigation_timeout 0 below Enterprise",
                    f"{at}/mitigation_timeout",
                )
            )
        if rule.get("action") == "block" and timeout == 0 and not enterprise:
            errors.append(
                error(20021, "throttling with block needs Enterprise", f"{at}/mitigation_timeout")
            )
        if limit.get("counting_expression") == "":
            errors.append(
                error(
                    20022,
                    "omit counting_expression rather than send it empty",
                    f"{at}/counting_expression",
                )
            )
        errors.extend(self._validate_counting(rule, limit, at))
        if limit.get("requests_to_origin") and self.plan in {"free", "pro"}:
            errors.append(
                error(
                    20023,
                    f"requests_to_origin is not available on the {self.plan} plan",
                    f"{at}/requests_to_origin",
                )
            )
        return errors

    def _validate_counting(
        self, rule: dict[str, Any], limit: dict[str, Any], at: str
    ) -> list[dict[str, Any]]:
        """A custom counting expression: Business and up (availability table), a string
        of at most 4,096 characters; response fields (``http.response.*``) only there, never
        in the rule's matching expression, which is decided before there is a response."""
        errors = []
        expression = rule.get("expression")
        if isinstance(expression, str) and "http.response." in expression:
            errors.append(
                error(
                    20024,
                    "response fields are only available in the counting expression",
                    at.rsplit("/ratelimit", 1)[0] + "/expression",
                )
            )
        counting = limit.get("counting_expression")
        if counting is None or counting == "":
            return errors
        pointer = f"{at}/counting_expression"
        if self.plan in {"free", "pro"}:
            errors.append(
                error(
                    20025,
                    f"a custom counting expression is not available on the {self.plan} plan",
                    pointer,
                )
            )
        elif not isinstance(counting, str):
            errors.append(error(20026, "counting_expression must be a string", pointer))
        elif len(counting) > 4096:
            errors.append(
                error(
                    20007,
                    f"the counting expression is {len(counting)} characters long; the maximum "
                    "is 4096",
                    pointer,
                )
            )
        return errors

    # --- zone settings -----------------------------------------------------------------

    def get_url_normalization(self, request: httpx.Request) -> httpx.Response:
        """The zone's URL normalisation setting."""
        return respond(200, dict(self.url_normalization))

    def put_url_normalization(self, request: httpx.Request) -> httpx.Response:
        """Change the setting: both fields, each one of the known values."""
        try:
            body = json.loads(request.content)
        except ValueError:
            return respond(400, errors=[error(10026, "invalid JSON")])
        if not isinstance(body, dict) or not one_of(body.get("scope"), URL_NORMALIZATION_SCOPES):
            return respond(400, errors=[error(1004, "scope must be incoming, both or none")])
        if not one_of(body.get("type"), URL_NORMALIZATION_TYPES):
            return respond(400, errors=[error(1004, "type must be cloudflare or rfc3986")])
        self.url_normalization = {"scope": body["scope"], "type": body["type"]}
        return respond(200, dict(self.url_normalization))

    # --- Workers -----------------------------------------------------------------------

    def put_secret(self, script: str, name: str) -> None:
        """What ``wrangler secret put NAME`` does: a secret_text binding on the script (its
        settings show the name and type only, never the text)."""
        bindings = [b for b in self.scripts[script].bindings if b.get("name") != name]
        bindings.append({"type": "secret_text", "name": name})
        self.scripts[script].bindings = bindings

    def put_script(self, request: httpx.Request, name: str) -> httpx.Response:
        """Upload a module Worker (multipart)."""
        content_type = request.headers.get("Content-Type", "")
        if not content_type.startswith("multipart/form-data"):
            return respond(400, errors=[error(10001, "expected a multipart/form-data upload")])
        parts = parse_multipart(content_type, request.content)
        if "metadata" not in parts:
            return respond(400, errors=[error(10001, "the upload has no metadata part")])
        try:
            metadata = json.loads(parts["metadata"][0])
        except ValueError:
            return respond(400, errors=[error(10001, "the metadata part is not JSON")])
        main = metadata.get("main_module")
        if not isinstance(main, str) or main not in parts:
            return respond(
                400,
                errors=[error(10021, f"main_module {main!r} is not one of the uploaded parts")],
            )
        if parts[main][1] != "application/javascript+module":
            return respond(
                400,
                errors=[error(10021, f"the part {main!r} is not application/javascript+module")],
            )
        if b"export default" not in parts[main][0]:
            return respond(
                400, errors=[error(10068, "The uploaded script has no registered event handlers.")]
            )
        date = metadata.get("compatibility_date")
        if not isinstance(date, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
            return respond(400, errors=[error(10021, "compatibility_date must be YYYY-MM-DD")])
        bindings = metadata.get("bindings", [])
        problem = _binding_problem(bindings)
        if problem:
            return respond(400, errors=[error(10021, problem)])
        modules = {k: v for k, v in parts.items() if k != "metadata"}
        etag = hashlib.sha256(b"".join(modules[k][0] for k in sorted(modules))).hexdigest()
        # Bindings the upload does not list are dropped, except those of the types it names
        # in keep_bindings (secrets set with wrangler, say).
        kept_types = metadata.get("keep_bindings") or []
        listed = {b.get("name") for b in bindings}
        previous = self.scripts[name].bindings if name in self.scripts else []
        kept = [b for b in previous if b.get("type") in kept_types and b.get("name") not in listed]
        self.scripts[name] = Script(main, modules, copy.deepcopy(bindings) + kept, date, etag)
        return respond(
            200,
            {
                "id": name,
                "etag": etag,
                "handlers": ["fetch"],
                "modified_on": NOW,
                "created_on": NOW,
                "usage_model": "standard",
                "compatibility_date": date,
            },
        )

    def _missing_script(self) -> httpx.Response:
        return respond(404, errors=[error(10007, "workers.api.error.script_not_found")])

    def get_settings(self, request: httpx.Request, name: str) -> httpx.Response:
        """A script's settings: bindings and compatibility date."""
        script = self.scripts.get(name)
        if script is None:
            return self._missing_script()
        return respond(
            200,
            {
                "bindings": copy.deepcopy(script.bindings),
                "compatibility_date": script.compatibility_date,
                "compatibility_flags": [],
                "logpush": False,
                "placement": {},
                "tags": [],
                "tail_consumers": [],
                "usage_model": "standard",
            },
        )

    def get_content(self, request: httpx.Request, name: str) -> httpx.Response:
        """A script's modules as multipart/form-data, the entry point in CF-Entrypoint."""
        script = self.scripts.get(name)
        if script is None:
            return self._missing_script()
        boundary = "fake-cloudflare-boundary"
        chunks = []
        for module, (data, content_type) in script.modules.items():
            chunks.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{module}"; '
                f'filename="{module}"\r\nContent-Type: {content_type}\r\n\r\n'.encode()
                + data
                + b"\r\n"
            )
        body = b"".join(chunks) + f"--{boundary}--\r\n".encode()
        return httpx.Response(
            200,
            content=body,
            headers={
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "CF-Entrypoint": script.main_module,
            },
        )

    # --- routes ------------------------------------------------------------------------

    def list_routes(self, request: httpx.Request) -> httpx.Response:
        """Every route of the zone."""
        return respond(200, [dict(r) for r in self.routes.values()])

    def _route_body(
        self, request: httpx.Request
    ) -> tuple[dict[str, Any] | None, httpx.Response | None]:
        try:
            body = json.loads(request.content)
        except ValueError:
            return None, respond(400, errors=[error(10026, "invalid JSON")])
        if not isinstance(body, dict) or not isinstance(body.get("pattern"), str):
            return None, respond(400, errors=[error(10022, "pattern is required", "/pattern")])
        script = body.get("script")
        if script is not None and script not in self.scripts:
            return None, respond(
                400, errors=[error(10019, f"the Worker {script!r} does not exist", "/script")]
            )
        return body, None

    def create_route(self, request: httpx.Request) -> httpx.Response:
        """Add a route; 409 when the pattern is already routed."""
        body, problem = self._route_body(request)
        if problem is not None or body is None:
            return problem or respond(400)
        if any(r["pattern"] == body["pattern"] for r in self.routes.values()):
            return respond(
                409, errors=[error(10020, "A route with the same pattern already exists.")]
            )
        route_id = self.add_route(body["pattern"], body.get("script"))
        return respond(200, dict(self.routes[route_id]))

    def update_route(self, request: httpx.Request, rid: str) -> httpx.Response:
        """Change a route's pattern or script."""
        if rid not in self.routes:
            return respond(404, errors=[error(10009, "route not found")])
        body, problem = self._route_body(request)
        if problem is not None or body is None:
            return problem or respond(400)
        self.routes[rid] = {"id": rid, "pattern": body["pattern"], "script": body.get("script")}
        return respond(200, dict(self.routes[rid]))

    def delete_route(self, request: httpx.Request, rid: str) -> httpx.Response:
        """Remove a route."""
        if rid not in self.routes:
            return respond(404, errors=[error(10009, "route not found")])
        del self.routes[rid]
        return respond(200, {"id": rid})


def _binding_problem(bindings: Any) -> str | None:
    if not isinstance(bindings, list):
        return "bindings must be a list"
    names = set()
    for binding in bindings:
        if not isinstance(binding, dict) or not isinstance(binding.get("name"), str):
            return "each binding needs a name"
        if binding["name"] in names:
            return f"binding name {binding['name']!r} is used twice"
        names.add(binding["name"])
        kind = binding.get("type")
        if kind == "ratelimit":
            namespace = binding.get("namespace_id")
            if not isinstance(namespace, str) or not namespace.isdigit() or int(namespace) < 1:
                return f"binding {binding['name']}: namespace_id must be a positive integer string"
            simple = binding.get("simple")
            if not isinstance(simple, dict):
                return f"binding {binding['name']}: simple is required"
            if not isinstance(simple.get("limit"), int) or simple["limit"] < 1:
                return f"binding {binding['name']}: simple.limit must be at least 1"
            if simple.get("period") not in (10, 60):
                return f"binding {binding['name']}: simple.period must be 10 or 60"
        elif kind not in {"plain_text", "secret_text", "kv_namespace", "service"}:
            return f"binding {binding['name']}: unknown type {kind!r}"
    return None


def parse_multipart(content_type: str, body: bytes) -> dict[str, tuple[bytes, str]]:
    """Part name -> (bytes, content type) of a multipart/form-data body."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    out: dict[str, tuple[bytes, str]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            out[name] = (payload, part.get_content_type())
    return out


# --- the GraphQL Analytics API ----------------------------------------------------------

# Cloudflare's limits on one GraphQL query: fields (aliased groupings), rows per list.
GRAPHQL_MAX_FIELDS = 30
GRAPHQL_MAX_ROWS = 10_000

_GROUPS = re.compile(
    r"(\w+): firewallEventsAdaptiveGroups\(limit: (\d+), orderBy: \[count_DESC\], filter: "
    r'\{source: "ratelimit", ruleId: \$(\w+), datetime_geq: \$since, datetime_leq: \$until\}\) '
    r"\{ count dimensions \{ (\w+) \} \}"
)
_INVOCATIONS = re.compile(
    r"workersInvocationsAdaptive\(limit: (\d+), filter: \{scriptName: \$script, "
    r"datetime_geq: \$since, datetime_leq: \$until\}\)"
)
_DECLARED = re.compile(r"\$(\w+): (\w+)")


def gql_error(message: str, code: str, path: list[str] | None = None) -> dict[str, Any]:
    """One GraphQL error as Cloudflare writes it."""
    return {
        "message": message,
        "path": path,
        "extensions": {"code": code, "timestamp": "2026-12-03T12:00:00Z"},
    }


@dataclass
class FakeGraphQL:
    """Cloudflare's GraphQL Analytics API, for the two datasets edgegen reads.

    ``events``: firewall events (``ruleId``, ``action``, ``clientCountryName``, ``coloCode``,
    ``datetime``, ``source``, ``count``); ``invocations``: Worker invocations
    (``scriptName``, ``status``, ``datetime``, ``requests``, ``errors``, ``subrequests``).
    ``datasets``: what the zone's plan offers; ``grants``: per token, which scopes
    (``zone``, ``account``) it may read; ``max_age``: how far back the plan may look.
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[dict[str, Any]] = field(default_factory=list)
    datasets: set[str] = field(
        default_factory=lambda: {"firewallEventsAdaptiveGroups", "workersInvocationsAdaptive"}
    )
    grants: dict[str, set[str]] = field(default_factory=lambda: {TOKEN: {"zone", "account"}})
    max_age: timedelta = timedelta(days=30)
    budget: int | None = None
    retry_after: str = "3"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one POST /graphql."""
        response = self._answer(request)
        self.statuses.append(response.status_code)
        return response

    def _answer(self, request: httpx.Request) -> httpx.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.grants:
            return httpx.Response(
                403, json={"data": None, "errors": [gql_error("not authorized", "authz")]}
            )
        if self.budget is not None:
            if self.budget <= 0:
                self.budget = None
                return httpx.Response(
                    429,
                    json={"data": None, "errors": [gql_error("rate limited", "ratelimit")]},
                    headers={"Retry-After": self.retry_after},
                )
            self.budget -= 1
        body = json.loads(request.content)
        self.bodies.append(body)
        query, variables = body["query"], body["variables"]
        declared = dict(_DECLARED.findall(query.split("{", 1)[0]))
        assert set(declared) == set(variables), "every variable declared and given"
        since = datetime.fromisoformat(variables["since"])
        until = datetime.fromisoformat(variables["until"])
        if until - since > self.max_age:
            message = (
                f"cannot request data older than {int(self.max_age.total_seconds())}s "
                "(time range too large for this plan)"
            )
            return httpx.Response(200, json={"data": None, "errors": [gql_error(message, "")]})
        if "zones(" in query:
            return self._zone(query, variables, token, since, until)
        return self._account(query, variables, token, since, until)

    def _zone(
        self, query: str, variables: dict[str, Any], token: str, since: datetime, until: datetime
    ) -> httpx.Response:
        fields = _GROUPS.findall(query)
        assert fields and query.count("firewallEventsAdaptiveGroups") == len(fields)
        if len(fields) > GRAPHQL_MAX_FIELDS:
            message = f"query has {len(fields)} fields, more than the {GRAPHQL_MAX_FIELDS} allowed"
            return httpx.Response(200, json={"data": None, "errors": [gql_error(message, "")]})
        path = ["viewer", "zones", "0", "firewallEventsAdaptiveGroups"]
        if "zone" not in self.grants[token]:
            message = "zone does not have access to the path"
            errors = [gql_error(message, "authz", path)]
            return httpx.Response(200, json={"data": None, "errors": errors})
        if "firewallEventsAdaptiveGroups" not in self.datasets:
            message = "zone does not have access to the path: not available on this plan"
            errors = [gql_error(message, "authz", path)]
            return httpx.Response(200, json={"data": None, "errors": errors})
        assert variables["zoneTag"] == ZONE_ID
        node: dict[str, Any] = {}
        for alias, limit, variable, dimension in fields:
            assert int(limit) <= GRAPHQL_MAX_ROWS
            totals: dict[str, int] = {}
            for event in self.events:
                if (
                    event["ruleId"] == variables[variable]
                    and event.get("source", "ratelimit") == "ratelimit"
                    and since <= event["datetime"] <= until
                ):
                    key = event[dimension]
                    totals[key] = totals.get(key, 0) + event.get("count", 1)
            ranked = sorted(totals.items(), key=lambda kv: -kv[1])[: int(limit)]
            node[alias] = [{"count": n, "dimensions": {dimension: k}} for k, n in ranked]
        return httpx.Response(200, json={"data": {"viewer": {"zones": [node]}}, "errors": None})

    def _account(
        self, query: str, variables: dict[str, Any], token: str, since: datetime, until: datetime
    ) -> httpx.Response:
        assert _INVOCATIONS.search(query)
        assert variables["accountTag"] == ACCOUNT_ID
        if "account" not in self.grants[token] or "workersInvocationsAdaptive" not in (
            self.datasets
        ):
            path = ["viewer", "accounts", "0", "workersInvocationsAdaptive"]
            errors = [gql_error("account does not have access to the path", "authz", path)]
            return httpx.Response(200, json={"data": None, "errors": errors})
        groups: dict[str, dict[str, int]] = {}
        for item in self.invocations:
            if item["scriptName"] == variables["script"] and since <= item["datetime"] <= until:
                sums = groups.setdefault(
                    item["status"], {"requests": 0, "errors": 0, "subrequests": 0}
                )
                for key in sums:
                    sums[key] += item.get(key, 0)
        rows = [{"sum": s, "dimensions": {"status": k}} for k, s in groups.items()]
        data = {"viewer": {"accounts": [{"workersInvocationsAdaptive": rows}]}}
        return httpx.Response(200, json={"data": data, "errors": None})
