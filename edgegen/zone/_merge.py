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
hash, Worker hash, routes hash), so a saved plan can refuse to apply to a changed zone
(``_saved``, which merges a saved plan's rules again with what is here).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..cloudflare._state import (
    RemoteRoute,
    RemoteState,
    canonical_bindings,
    canonical_json,
    content_sha256,
    sha256_text,
    worker_fingerprint,
)
from ..compiler import _compile, _ids
from ..compiler._artifacts import Artifacts, Target, WorkerArtifact
from ..errors import ZoneError
from ._plan import (
    ABSENT,
    FieldChange,
    Fingerprints,
    ForeignRule,
    RouteChange,
    RuleChange,
    WorkerChange,
    ZonePlan,
)

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


@dataclass(frozen=True)
class _Layout:
    """Where each rule of the PUT goes: ``slots`` in order, each ("foreign", rule) or
    ("ours", ref); ``existing`` our rules the zone has and the policy wants (by ref);
    ``deletes`` ours the policy no longer wants (or that the zone has twice); ``moved`` the
    refs whose order among our rules changes."""

    slots: list[tuple[str, Any]]
    existing: dict[str, Mapping[str, Any]]
    deletes: list[Mapping[str, Any]]
    moved: frozenset[str]


def _new_position(slots: Sequence[tuple[str, Any]], earlier: Sequence[str]) -> int:
    """Where a new rule goes: right after the last of ours that precedes it in the policy
    (``earlier``), or before the first of ours, or after every rule."""
    placed = {v: i for i, (kind, v) in enumerate(slots) if kind == "ours"}
    before = [placed[r] for r in earlier if r in placed]
    if before:
        return max(before) + 1
    if placed:
        return min(placed.values())
    return len(slots)


def _layout(remote: Sequence[Mapping[str, Any]], desired_refs: Sequence[str]) -> _Layout:
    """The rules' places (see the module docstring): foreign rules where they are, ours in
    their slots in the policy's order, new ones after their predecessor in the policy."""
    wanted = set(desired_refs)
    existing: dict[str, Mapping[str, Any]] = {}
    deletes: list[Mapping[str, Any]] = []
    # ("slot", None) marks a place of ours, filled below in the policy's order.
    slots: list[tuple[str, Any]] = []
    for rule in remote:
        if not owned(rule):
            slots.append(("foreign", rule))
            continue
        ref = str(rule["ref"])
        if ref in wanted and ref not in existing:
            existing[ref] = rule
            slots.append(("slot", None))
        else:
            deletes.append(rule)
    existing_order = [ref for ref in desired_refs if ref in existing]
    remote_order = dict.fromkeys(
        str(r["ref"]) for r in remote if owned(r) and str(r["ref"]) in wanted
    )
    was_at = {ref: i for i, ref in enumerate(remote_order)}
    fill = iter(existing_order)
    slots = [("ours", next(fill)) if kind == "slot" else (kind, v) for kind, v in slots]
    for index, ref in enumerate(desired_refs):
        if ref not in existing:
            slots.insert(_new_position(slots, desired_refs[:index]), ("ours", ref))
    moved = frozenset(ref for i, ref in enumerate(existing_order) if was_at[ref] != i)
    return _Layout(slots, existing, deletes, moved)


def _ours(
    ref: str, position: int, desired: Mapping[str, Any], layout: _Layout, names: Mapping[str, str]
) -> tuple[dict[str, Any], RuleChange | None]:
    """One of our rules as it is sent, and its change (None when it stays as it is)."""
    wanted = dict(desired)
    limit = names.get(ref)
    description = str(wanted.get("description", ""))
    existing = layout.existing.get(ref)
    if existing is None:
        # A new rule is shown exactly as it is sent, defaults and all.
        fields = tuple(field_changes({}, wanted))
        return wanted, RuleChange("create", ref, limit, description, position, fields)
    sent = {"id": existing["id"], **wanted} if "id" in existing else wanted
    fields = tuple(field_changes(comparable(existing), comparable(wanted)))
    if fields:
        return sent, RuleChange("update", ref, limit, description, position, fields)
    if ref in layout.moved:
        return sent, RuleChange("move", ref, limit, description, position)
    return sent, None


def merge_rules(
    remote: Sequence[Mapping[str, Any]],
    desired: Sequence[Mapping[str, Any]],
    names: Mapping[str, str],
) -> _Merge:
    """The rule list to PUT, and the rule-level changes it makes (see the module docstring)."""
    by_ref = {str(d["ref"]): d for d in desired}
    layout = _layout(remote, list(by_ref))
    merged = _Merge([], [], [])
    for position, (kind, value) in enumerate(layout.slots):
        if kind == "foreign":
            merged.rules.append(request_rule(value))
            merged.foreign.append(
                ForeignRule(position, str(value.get("ref", "")), str(value.get("description", "")))
            )
            continue
        sent, change = _ours(value, position, by_ref[value], layout, names)
        merged.rules.append(sent)
        if change is not None:
            merged.changes.append(change)
    for rule in layout.deletes:
        ref = str(rule["ref"])
        merged.changes.append(
            RuleChange("delete", ref, names.get(ref), str(rule.get("description", "")))
        )
    return merged


def worker_change(
    desired: WorkerArtifact | None, state: RemoteState
) -> tuple[WorkerChange | None, list[str]]:
    """The Worker upload a plan makes (None: the deployed one is the same), and its notes."""
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


def route_changes(patterns: Sequence[str], state: RemoteState) -> list[RouteChange]:
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
    changed_worker, notes = worker_change(desired_worker, state)
    patterns = desired_worker.routes if desired_worker else ()
    routes = route_changes(patterns, state)
    return ZonePlan(
        scope=scope,
        fingerprints=fingerprints(state, patterns),
        rule_changes=tuple(merged.changes),
        foreign_rules=tuple(merged.foreign),
        ruleset_body=body,
        ruleset_version=ruleset.version if ruleset else None,
        worker_change=changed_worker,
        worker=desired_worker if changed_worker else None,
        route_changes=tuple(routes),
        route_patterns=tuple(patterns),
        limits_by_ref=names,
        notes=tuple(notes),
        warnings=url_warnings(state, bool(names)),
    )
