"""Planning: the desired Artifacts and a RemoteState in, a ZonePlan out. Pure: no I/O.

Ownership: edgegen creates, changes and deletes only rules whose ``ref`` starts with
``edgegen:``; every other rule in the entrypoint is sent back exactly as read (with its
``id``, so Cloudflare keeps it as the same rule) at its place among the other rules. Our
rules keep their ids too, so an updated rule stays the same rule. The Worker named in the
policy is ours; routes are ours when they run that Worker, and a route the policy wants
that runs another Worker is a conflict, never taken over.

Where our rules go: rules that already exist stay where they are (in the policy's order
among themselves); a new rule goes right after the rule that precedes it in the policy,
or before the first of our rules, or, in a zone with none of ours yet, after every other
rule, so that rules made by hand keep their precedence.

A ZonePlan also holds fingerprints of the state it was made from (ruleset version and rules
hash, Worker hash, routes hash), so a saved plan can refuse to apply to a changed zone.

A saved plan is bound to what it shows. Its file records a hash of each write (the rules
body, each Worker module, the Worker's settings, each route change), checked when it is
read (``_file_formats``); and before anything is written, ``check_saved`` makes the plan again
from the plan's own writes and the zone as read then (the rules the body asks for, merged
with the zone's rules as planning merges them; the Worker against the deployed one; the
routes its patterns give), and refuses unless that is exactly the plan the file lists: the
same rules body, rule changes, Worker change and route changes (so a route is only removed
if it runs the policy's Worker, by the id the zone gives it). What apply shows is then what
it writes.

The change types are also the plan file's parts: their annotations say how each is read
from a file (``_file_formats`` holds the file's model and its JSON Schema).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Final, Literal

from edgegen_policy import Policy
from pydantic import Field, GetCoreSchemaHandler, StrictInt
from pydantic_core import core_schema

from ..cloudflare._state import (
    Flag,
    RemoteRoute,
    RemoteState,
    Scope,
    canonical_bindings,
    canonical_json,
    content_sha256,
    sha256_text,
    worker_fingerprint,
)
from ..compiler import _compile, _ids
from ..compiler._artifacts import Artifacts, Target, WorkerArtifact
from ..errors import CloudflareAPIError, Rejection, TamperedPlanError, ZoneError

RuleAction = Literal["create", "update", "move", "delete"]
OWNED_PREFIX = _ids.RULE_REF_PREFIX
# Fields Cloudflare adds to a rule it returns; never compared (the id is sent back so a
# rule keeps its identity, the others are stripped from what is sent).
RESPONSE_ONLY = ("version", "last_updated", "categories")
# Values Cloudflare fills in when a rule omits them: omitting and sending them mean the
# same, so neither side of a comparison may differ only by them (the Terraform provider's
# perpetual diff on mitigation_timeout 0 vs null is this bug).
RULE_DEFAULTS: Mapping[str, Any] = {"enabled": True, "description": ""}
RATELIMIT_DEFAULTS: Mapping[str, Any] = {
    "requests_to_origin": False,
    "counting_expression": "",
    "mitigation_timeout": 0,
}


class _Absent:
    """The value of a field that is not there (shown as ``(none)``)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "(none)"


ABSENT: Final = _Absent()


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field that differs: dotted ``path``, ``old`` and ``new`` (ABSENT when missing).

    In a file: ``{"path", "old"?, "new"?}``, a side that is absent left out.
    """

    path: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        """``{"path", "old"?, "new"?}``: a side that is absent is left out."""
        out: dict[str, Any] = {"path": self.path}
        if self.old is not ABSENT:
            out["old"] = self.old
        if self.new is not ABSENT:
            out["new"] = self.new
        return out

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """How a file holds a FieldChange: an object with a path, and old and new only
        when that side is there."""
        shape = core_schema.typed_dict_schema(
            {
                "path": core_schema.typed_dict_field(core_schema.str_schema()),
                "old": core_schema.typed_dict_field(core_schema.any_schema(), required=False),
                "new": core_schema.typed_dict_field(core_schema.any_schema(), required=False),
            }
        )

        def read(value: Any, check: core_schema.ValidatorFunctionWrapHandler) -> FieldChange:
            if isinstance(value, cls):
                return value
            data = check(value)
            return cls(data["path"], data.get("old", ABSENT), data.get("new", ABSENT))

        return core_schema.no_info_wrap_validator_function(
            read,
            shape,
            serialization=core_schema.plain_serializer_function_ser_schema(
                cls.to_json, return_schema=shape
            ),
        )


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule to ``create``, ``update``, ``move`` (order only) or ``delete``.

    ``limit`` is the policy limit the rule was made from (None for a rule whose limit is
    gone); ``position`` its place in the rules written (None for a delete).
    """

    action: RuleAction
    ref: str
    limit: str | None = None
    description: str = ""
    position: StrictInt | None = None
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True, slots=True)
class ForeignRule:
    """A rule edgegen does not manage, kept as it is."""

    position: StrictInt
    ref: str
    description: str


@dataclass(frozen=True, slots=True)
class WorkerChange:
    """The Worker to ``create`` or ``update`` (upload), and what differs."""

    action: Literal["create", "update"]
    name: str
    replaces_foreign: Flag = False
    fields: tuple[FieldChange, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteChange:
    """A route to ``create`` or ``delete``."""

    action: Literal["create", "delete"]
    pattern: str
    script: str | None = None
    route_id: str | None = None


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """What the remote state looked like: enough to tell whether it changed since."""

    ruleset_version: Annotated[str | None, Field(default=None)]
    ruleset_sha256: Annotated[str | None, Field(default=None)]
    worker_sha256: Annotated[str | None, Field(default=None)]
    routes_sha256: str

    def differences(self, now: Fingerprints) -> list[str]:
        """What changed from ``self`` (the plan's) to ``now``, in words."""
        out = []
        if (self.ruleset_version, self.ruleset_sha256) != (now.ruleset_version, now.ruleset_sha256):
            out.append(
                f"the http_ratelimit rules (version {self.ruleset_version or 'none'} when "
                f"planned, {now.ruleset_version or 'none'} now)"
            )
        if self.worker_sha256 != now.worker_sha256:
            out.append("the Worker script or its bindings")
        if self.routes_sha256 != now.routes_sha256:
            out.append("the Worker routes")
        return out


@dataclass(frozen=True)
class ZonePlan:
    """What apply would change in a zone, and everything it needs to do it.

    ``ruleset_body`` is the PUT body (None: the rules stay as they are); ``worker`` the
    Worker to upload when ``worker_change`` is set; ``route_patterns`` the routes the
    policy wants (fingerprints cover them and every route of our Worker);
    ``limits_by_ref`` the policy limit each generated rule was made from.
    """

    scope: Scope
    fingerprints: Fingerprints
    rule_changes: tuple[RuleChange, ...]
    foreign_rules: tuple[ForeignRule, ...]
    ruleset_body: dict[str, Any] | None
    ruleset_version: str | None
    worker_change: WorkerChange | None
    worker: WorkerArtifact | None
    route_changes: tuple[RouteChange, ...]
    route_patterns: tuple[str, ...]
    limits_by_ref: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # About the zone rather than the changes (its URL normalisation): for stderr, each
    # starting "warning: " or "note: ".
    warnings: tuple[str, ...] = ()

    @property
    def has_changes(self) -> bool:
        """Whether apply would write anything."""
        return bool(self.ruleset_body is not None or self.worker_change or self.route_changes)

    def count(self, action: str) -> int:
        """How many rules the plan would ``create``, ``update``, ``move`` or ``delete``."""
        return sum(1 for c in self.rule_changes if c.action == action)


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """A plan read from a file (``source``), its write hashes checked, but not yet checked
    against the zone: ``edgegen.apply`` does that (the zone must be as it was when the plan
    was made, and the plan must write what it shows) before it shows or writes anything."""

    plan: ZonePlan
    source: str


def owned(rule: Mapping[str, Any]) -> bool:
    """Whether edgegen manages a rule: its ref starts with ``edgegen:``."""
    ref = rule.get("ref")
    return isinstance(ref, str) and ref.startswith(OWNED_PREFIX)


def comparable(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A rule without response-only fields and defaults, for comparing."""
    out = {k: copy.deepcopy(v) for k, v in rule.items() if k not in (*RESPONSE_ONLY, "id")}
    for key, default in RULE_DEFAULTS.items():
        if out.get(key, default) == default:
            out.pop(key, None)
    limit = out.get("ratelimit")
    if isinstance(limit, dict):
        for key, default in RATELIMIT_DEFAULTS.items():
            if limit.get(key, default) == default:
                limit.pop(key, None)
    return out


def request_rule(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A rule as read, ready to send back: response-only fields removed, ``id`` kept."""
    return {k: copy.deepcopy(v) for k, v in rule.items() if k not in RESPONSE_ONLY}


def field_changes(old: Any, new: Any, prefix: str = "") -> list[FieldChange]:
    """Every leaf that differs between two JSON values, by dotted path (lists are leaves)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[FieldChange] = []
        for key in sorted(set(old) | set(new)):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                # A whole new object is shown leaf by leaf, like a changed one.
                if isinstance(new[key], Mapping) and new[key]:
                    out.extend(
                        FieldChange(c.path, ABSENT, c.new)
                        for c in field_changes({}, new[key], path)
                    )
                else:
                    out.append(FieldChange(path, ABSENT, new[key]))
            elif key not in new:
                if isinstance(old[key], Mapping) and old[key]:
                    out.extend(
                        FieldChange(c.path, c.old, ABSENT)
                        for c in field_changes(old[key], {}, path)
                    )
                else:
                    out.append(FieldChange(path, old[key], ABSENT))
            else:
                out.extend(field_changes(old[key], new[key], path))
        return out
    if old != new:
        return [FieldChange(prefix, old, new)]
    return []


def _rules_sha256(rules: Iterable[Mapping[str, Any]]) -> str:
    return sha256_text(canonical_json(list(rules)))


def relevant_routes(
    routes: Iterable[RemoteRoute], worker_name: str | None, patterns: Iterable[str]
) -> list[RemoteRoute]:
    """The routes a plan looks at: those it wants, and every route of our Worker."""
    wanted = set(patterns)
    return [r for r in routes if r.pattern in wanted or (worker_name and r.script == worker_name)]


def fingerprints(state: RemoteState, patterns: Iterable[str]) -> Fingerprints:
    """The fingerprints of a state, for a plan that wants these route patterns."""
    ruleset = state.ruleset
    worker = state.worker
    routes = sorted(
        (r.id, r.pattern, r.script or "")
        for r in relevant_routes(state.routes, state.scope.worker_name, patterns)
    )
    return Fingerprints(
        ruleset_version=ruleset.version if ruleset else None,
        ruleset_sha256=_rules_sha256(ruleset.rules) if ruleset else None,
        worker_sha256=worker.fingerprint if worker else None,
        routes_sha256=sha256_text(canonical_json(routes)),
    )


def limits_by_ref(artifacts: Artifacts) -> dict[str, str]:
    """Rule ref -> the policy limit it was generated from: each limit placed as a rule, and
    its second rule (for requests that carry a credential) when it has one."""
    refs = {r.get("ref") for r in artifacts.ruleset.get("rules", ())}
    out: dict[str, str] = {}
    for placement in artifacts.placements:
        if placement.target is not Target.RULE:
            continue
        out[_ids.rule_ref(placement.limit)] = placement.limit
        second = _compile.credentialed_rule_ref(placement.limit)
        if second in refs:
            out[second] = placement.limit
    return out


@dataclass
class _Merge:
    rules: list[dict[str, Any]]
    changes: list[RuleChange]
    foreign: list[ForeignRule]


def merge_rules(
    remote: Sequence[Mapping[str, Any]],
    desired: Sequence[Mapping[str, Any]],
    names: Mapping[str, str],
) -> _Merge:
    """The rule list to PUT, and the rule-level changes it makes (see the module docstring)."""
    by_ref = {str(d["ref"]): d for d in desired}
    desired_refs = list(by_ref)
    remote_owned: dict[str, Mapping[str, Any]] = {}
    deletes: list[Mapping[str, Any]] = []
    # Entries: ("foreign", rule) or ("ours", ref); our slots are filled in the policy's order.
    layout: list[tuple[str, Any]] = []
    for rule in remote:
        if not owned(rule):
            layout.append(("foreign", rule))
            continue
        ref = str(rule["ref"])
        if ref in by_ref and ref not in remote_owned:
            remote_owned[ref] = rule
            layout.append(("slot", None))
        else:
            deletes.append(rule)
    existing_order = [ref for ref in desired_refs if ref in remote_owned]
    remote_order = [str(r["ref"]) for r in remote if owned(r) and str(r["ref"]) in by_ref]
    remote_order = list(dict.fromkeys(remote_order))
    fill = iter(existing_order)
    layout = [("ours", next(fill)) if kind == "slot" else (kind, v) for kind, v in layout]
    for index, ref in enumerate(desired_refs):
        if ref in remote_owned:
            continue
        placed = {v: i for i, (kind, v) in enumerate(layout) if kind == "ours"}
        before = [placed[r] for r in desired_refs[:index] if r in placed]
        if before:
            at = max(before) + 1
        elif placed:
            at = min(placed.values())
        else:
            at = len(layout)
        layout.insert(at, ("ours", ref))

    rules: list[dict[str, Any]] = []
    changes: list[RuleChange] = []
    foreign: list[ForeignRule] = []
    for position, (kind, value) in enumerate(layout):
        if kind == "foreign":
            rules.append(request_rule(value))
            foreign.append(
                ForeignRule(position, str(value.get("ref", "")), str(value.get("description", "")))
            )
            continue
        ref = value
        wanted = dict(by_ref[ref])
        limit = names.get(ref)
        description = str(wanted.get("description", ""))
        existing = remote_owned.get(ref)
        if existing is None:
            rules.append(wanted)
            # A new rule is shown exactly as it is sent, defaults and all.
            fields = tuple(field_changes({}, wanted))
            changes.append(RuleChange("create", ref, limit, description, position, fields))
            continue
        rules.append({"id": existing["id"], **wanted} if "id" in existing else wanted)
        fields = tuple(field_changes(comparable(existing), comparable(wanted)))
        if fields:
            changes.append(RuleChange("update", ref, limit, description, position, fields))
        elif existing_order.index(ref) != remote_order.index(ref):
            changes.append(RuleChange("move", ref, limit, description, position))
    for rule in deletes:
        ref = str(rule["ref"])
        changes.append(RuleChange("delete", ref, names.get(ref), str(rule.get("description", ""))))
    return _Merge(rules, changes, foreign)


def _worker_change(
    desired: WorkerArtifact | None, state: RemoteState
) -> tuple[WorkerChange | None, list[str]]:
    remote = state.worker
    notes: list[str] = []
    if desired is None:
        if remote is not None:
            notes.append(
                f"no limit runs in the Worker {remote.name} any more: its routes are removed "
                f"and the script is left in place (delete it with `wrangler delete "
                f"{remote.name}` once nothing else uses it)"
            )
        return None, notes
    source = desired.module_source.encode("utf-8")
    content = content_sha256(desired.main_module, {desired.main_module: source})
    bindings = canonical_bindings(desired.bindings)
    wanted = {
        "main_module": desired.main_module,
        "content_sha256": content,
        "compatibility_date": desired.compatibility_date,
        "bindings": {b["name"]: b for b in bindings},
    }
    if remote is None:
        fields = tuple(field_changes({}, wanted))
        return WorkerChange("create", desired.name, fields=fields), notes
    fingerprint = worker_fingerprint(
        desired.main_module, content, desired.compatibility_date, bindings
    )
    if fingerprint == remote.fingerprint:
        return None, notes
    had = {
        "main_module": remote.main_module,
        "content_sha256": remote.content_sha256,
        "compatibility_date": remote.compatibility_date,
        "bindings": {str(b.get("name")): b for b in remote.bindings},
    }
    foreign = not remote.generated_by_edgegen
    if foreign:
        notes.append(
            f"the Worker script {remote.name} was not generated by edgegen; apply replaces it "
            "(rename cloudflare.worker.name in the policy to keep it)"
        )
    change = WorkerChange("update", desired.name, foreign, tuple(field_changes(had, wanted)))
    return change, notes


def _route_changes(patterns: Sequence[str], state: RemoteState) -> list[RouteChange]:
    """Routes to add for ``patterns`` (to the policy's Worker) and routes of that Worker to
    remove; ZoneError when a wanted pattern runs another Worker."""
    name = state.scope.worker_name
    by_pattern = {r.pattern: r for r in state.routes}
    conflicts = []
    changes: list[RouteChange] = []
    for pattern in patterns:
        route = by_pattern.get(pattern)
        if route is None:
            changes.append(RouteChange("create", pattern, name))
        elif route.script != name:
            runs = f"runs the Worker {route.script!r}" if route.script else "runs no Worker"
            conflicts.append(f"the route {pattern} already exists and {runs}")
    if conflicts:
        raise ZoneError(
            "; ".join(conflicts)
            + ". edgegen only manages routes of its own Worker: remove or change that route "
            "in the Cloudflare dashboard, or change cloudflare.worker.routes in the policy"
        )
    for route in state.routes:
        if name and route.script == name and route.pattern not in patterns:
            changes.append(RouteChange("delete", route.pattern, route.script, route.id))
    return changes


_NORMALISE = (
    'turn on "Normalize incoming URLs" with type cloudflare (the zone\'s Rules > Settings '
    "in the dashboard, or PUT /zones/{zone}/url_normalization with "
    '{{"scope": "incoming", "type": "cloudflare"}})'
)


def url_warnings(state: RemoteState, rule_limits: bool) -> tuple[str, ...]:
    """What the zone's URL normalisation means for a policy with ``rule_limits`` (limits
    placed in rate limiting rules; the Worker and the app normalise paths on their own).

    Cloudflare normalises URLs before rules see them only when the zone says so. With scope
    ``none`` rules see each URL as sent: ``/%61pi/items`` and ``//api/items`` do not match a
    rule's limit on ``/api/`` (a warning). Type ``rfc3986`` keeps ``//`` and encodes
    ``\\`` as ``%5C``, so ``//api/`` spellings skip rules (a note). Also why the setting is
    unknown, when it is.
    """
    if not rule_limits:
        return ()
    out = list(state.notices)
    setting = state.url_normalization
    if setting is None:
        return tuple(out)
    zone = state.scope.zone_id
    fix = _NORMALISE.format(zone=zone)
    if setting.scope == "none":
        out.append(
            f'warning: zone {zone} does not normalise URLs (url_normalization scope "none"): '
            "its rate limiting rules see each URL as sent, so /%61pi/items or //api/items "
            f"skip a limit on /api/ placed in a rule; {fix}"
        )
    elif setting.scope not in ("incoming", "both"):
        out.append(
            f"note: zone {zone} has the URL normalisation scope {setting.scope!r}, which "
            f"edgegen does not know; to be sure rules see normalised URLs, {fix}"
        )
    elif setting.type == "rfc3986":
        out.append(
            f"note: zone {zone} normalises URLs the RFC 3986 way (url_normalization type "
            '"rfc3986"), which keeps // and encodes \\ as %5C, so spellings like '
            f"//api/items skip a rate limiting rule on /api/; {fix}"
        )
    elif setting.type != "cloudflare":
        out.append(
            f"note: zone {zone} has the URL normalisation type {setting.type!r}, which "
            f"edgegen does not know; to be sure rules see normalised URLs, {fix}"
        )
    return tuple(out)


def make_plan(artifacts: Artifacts, state: RemoteState) -> ZonePlan:
    """Compare what the policy builds with the zone; raises ZoneError on a route conflict."""
    scope = state.scope
    desired_worker = artifacts.worker
    if desired_worker is not None and desired_worker.name != scope.worker_name:
        raise ZoneError(
            f"the state was read for the Worker {scope.worker_name!r} but the policy's Worker "
            f"is {desired_worker.name!r}; pull the state again with this policy"
        )
    names = limits_by_ref(artifacts)
    ruleset = state.ruleset
    remote_rules = ruleset.rules if ruleset else ()
    merged = merge_rules(remote_rules, artifacts.ruleset["rules"], names)
    unchanged = [comparable(r) for r in merged.rules] == [comparable(r) for r in remote_rules]
    body = None
    if not unchanged:
        description = ruleset.description if ruleset else artifacts.ruleset["description"]
        # An existing entrypoint may be shared with rules made by hand: keep its
        # description rather than claim the whole ruleset for edgegen.
        body = {"description": description, "rules": merged.rules}
    worker_change, notes = _worker_change(desired_worker, state)
    patterns = desired_worker.routes if desired_worker else ()
    routes = _route_changes(patterns, state)
    return ZonePlan(
        scope=scope,
        fingerprints=fingerprints(state, patterns),
        rule_changes=tuple(merged.changes),
        foreign_rules=tuple(merged.foreign),
        ruleset_body=body,
        ruleset_version=ruleset.version if ruleset else None,
        worker_change=worker_change,
        worker=desired_worker if worker_change else None,
        route_changes=tuple(routes),
        route_patterns=tuple(patterns),
        limits_by_ref=names,
        notes=tuple(notes),
        warnings=url_warnings(state, bool(names)),
    )


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


# --- saved plans ---------------------------------------------------------------------


def refusal(source: str, problems: Sequence[str]) -> TamperedPlanError:
    """The error for a saved plan (the file ``source``) that does not write what it shows."""
    return TamperedPlanError(
        f"refusing to apply {source}: it does not write what it shows ("
        + "; ".join(problems)
        + "); it was edited or damaged since it was made. Nothing was written: make the plan "
        f"again with edgegen plan POLICY --out {source} and review it",
        problems,
    )


def check_saved(plan: ZonePlan, state: RemoteState, source: str) -> ZonePlan:
    """The plan a saved ``plan`` stands for, made again from its own writes and ``state``
    (the zone as read now, after the fingerprints matched); TamperedPlanError unless it is
    the plan the file lists.

    The rules: the body's rules that edgegen owns (without ids) are merged with the zone's
    rules as planning merges them, which must give the body itself (so rules edgegen does
    not own are sent back exactly as read, and ids are the zone's) and the rule changes
    listed. The Worker: the upload compared with the deployed Worker must give the Worker
    change listed. The routes: the plan's route patterns against the zone's routes must
    give the route changes listed (adding routes to the policy's Worker, removing only
    routes of that Worker, by the id the zone gives them).
    """
    problems: list[str] = []
    body = plan.ruleset_body
    ruleset = state.ruleset
    remote_rules = ruleset.rules if ruleset else ()
    foreign = [
        ForeignRule(i, str(r.get("ref", "")), str(r.get("description", "")))
        for i, r in enumerate(remote_rules)
        if not owned(r)
    ]
    if body is None:
        if plan.rule_changes:
            problems.append("it lists rule changes but writes no rules")
    else:
        rules = body.get("rules") or []
        desired = [{k: v for k, v in r.items() if k != "id"} for r in rules if owned(r)]
        merged = merge_rules(remote_rules, desired, plan.limits_by_ref)
        description = ruleset.description if ruleset else body.get("description")
        derived = {"description": description, "rules": merged.rules}
        unchanged = [comparable(r) for r in merged.rules] == [comparable(r) for r in remote_rules]
        if derived != body or unchanged or tuple(merged.changes) != plan.rule_changes:
            problems.append("the rules it writes are not the changes it lists")
        foreign = merged.foreign
    worker_change: WorkerChange | None = None
    notes: list[str] = []
    if plan.worker is not None:
        if plan.worker.routes != plan.route_patterns:
            problems.append("the Worker's routes are not the route patterns it lists")
        worker_change, notes = _worker_change(plan.worker, state)
    if worker_change != plan.worker_change:
        problems.append("the Worker it uploads is not the change it lists")
    if any(note not in plan.notes for note in notes):
        problems.append("it leaves out a note about the Worker")
    try:
        routes: tuple[RouteChange, ...] | None = tuple(_route_changes(plan.route_patterns, state))
    except ZoneError:
        routes = None
    if routes != plan.route_changes:
        problems.append("the route changes are not those the zone gives for its route patterns")
    if problems:
        raise refusal(source, problems)
    return replace(
        plan,
        foreign_rules=tuple(foreign),
        ruleset_version=ruleset.version if ruleset else None,
        warnings=url_warnings(state, bool(plan.limits_by_ref)),
    )
