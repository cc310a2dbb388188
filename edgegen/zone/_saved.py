"""A saved plan is bound to what it shows.

Its file records a hash of each write (the rules body, each Worker module, the Worker's
settings, each route change), checked when it is read (``_file_formats``); and before
anything is written, ``check_saved`` makes the plan again from the plan's own writes and
the zone as read then (the rules the body asks for, merged with the zone's rules as
planning merges them; the Worker against the deployed one; the routes its patterns give),
and refuses unless that is exactly the plan the file lists: the same rules body, rule
changes, Worker change and route changes (so a route is only removed if it runs the
policy's Worker, by the id the zone gives it). What apply shows is then what it writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..cloudflare._state import RemoteState
from ..errors import TamperedPlanError, ZoneError
from ._merge import comparable, merge_rules, owned, route_changes, url_warnings, worker_change
from ._plan import ForeignRule, RouteChange, ZonePlan


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
    problems, foreign = _rules_problems(plan, state)
    problems += _worker_problems(plan, state)
    problems += _route_problems(plan, state)
    if problems:
        raise refusal(source, problems)
    ruleset = state.ruleset
    return replace(
        plan,
        foreign_rules=tuple(foreign),
        ruleset_version=ruleset.version if ruleset else None,
        warnings=url_warnings(state, bool(plan.limits_by_ref)),
    )


def _rules_problems(plan: ZonePlan, state: RemoteState) -> tuple[list[str], list[ForeignRule]]:
    """What is wrong with the rules a saved plan writes, and the foreign rules it keeps."""
    body = plan.ruleset_body
    ruleset = state.ruleset
    remote_rules = ruleset.rules if ruleset else ()
    if body is None:
        foreign = [
            ForeignRule(i, str(r.get("ref", "")), str(r.get("description", "")))
            for i, r in enumerate(remote_rules)
            if not owned(r)
        ]
        problems = ["it lists rule changes but writes no rules"] if plan.rule_changes else []
        return problems, foreign
    rules = body.get("rules") or []
    desired = [{k: v for k, v in r.items() if k != "id"} for r in rules if owned(r)]
    merged = merge_rules(remote_rules, desired, plan.limits_by_ref)
    description = ruleset.description if ruleset else body.get("description")
    derived = {"description": description, "rules": merged.rules}
    unchanged = [comparable(r) for r in merged.rules] == [comparable(r) for r in remote_rules]
    if derived != body or unchanged or tuple(merged.changes) != plan.rule_changes:
        return ["the rules it writes are not the changes it lists"], merged.foreign
    return [], merged.foreign


def _worker_problems(plan: ZonePlan, state: RemoteState) -> list[str]:
    """What is wrong with the Worker a saved plan uploads, and its notes about it."""
    problems: list[str] = []
    change = None
    notes: list[str] = []
    if plan.worker is not None:
        if plan.worker.routes != plan.route_patterns:
            problems.append("the Worker's routes are not the route patterns it lists")
        change, notes = worker_change(plan.worker, state)
    if change != plan.worker_change:
        problems.append("the Worker it uploads is not the change it lists")
    if any(note not in plan.notes for note in notes):
        problems.append("it leaves out a note about the Worker")
    return problems


def _route_problems(plan: ZonePlan, state: RemoteState) -> list[str]:
    """What is wrong with the route changes a saved plan lists."""
    try:
        routes: tuple[RouteChange, ...] | None = tuple(route_changes(plan.route_patterns, state))
    except ZoneError:
        routes = None
    if routes != plan.route_changes:
        return ["the route changes are not those the zone gives for its route patterns"]
    return []
