"""A ZonePlan as text (the terminal) or Markdown (a pull request comment). Pure."""

from __future__ import annotations

import json
import re
from typing import Any

from .._text import code, terminal_text
from ._plan import ABSENT, FieldChange, RuleChange, ZonePlan


def _value(value: Any) -> str:
    if value is ABSENT:
        return "(none)"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(plan: ZonePlan) -> str:
    """One line: what apply would do."""
    if not plan.has_changes:
        return "No changes: the zone matches the policy."
    parts = []
    rule_counts = [
        (plan.count("create"), "to create"),
        (plan.count("update"), "to update"),
        (plan.count("move"), "to move"),
        (plan.count("delete"), "to delete"),
    ]
    rules = [f"{n} {what}" for n, what in rule_counts if n]
    if rules:
        parts.append(f"rules: {', '.join(rules)}")
    elif plan.ruleset_body is not None:
        parts.append("rules: reordered")
    if plan.worker_change:
        verb = "create" if plan.worker_change.action == "create" else "update"
        parts.append(f"Worker {plan.worker_change.name}: {verb} (upload)")
    adds = sum(1 for r in plan.route_changes if r.action == "create")
    removes = sum(1 for r in plan.route_changes if r.action == "delete")
    routes = [f"{n} {what}" for n, what in ((adds, "to add"), (removes, "to remove")) if n]
    if routes:
        parts.append(f"routes: {', '.join(routes)}")
    return "Plan: " + "; ".join(parts) + "."


def _rule_title(change: RuleChange) -> str:
    name = change.limit or change.description or change.ref
    return f"{name} ({change.ref})" if name != change.ref else change.ref


# An inline set of quoted strings in a rule expression: {"a" "b" ...}.
_STRING_SET = re.compile(r'\{("(?:[^"\\]|\\.)*"(?: "(?:[^"\\]|\\.)*")*)\}')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
# A set of at most this many spellings is shown whole.
FOLD_OVER = 4
FOLD_NOTE = (
    "(expressions folded: an exact path is also matched with %2F for its slashes, a trailing "
    "/ or %2F, and a final %0A, which apps read as the same path; the saved plan and the "
    "built ruleset hold every spelling, docs/edge.md, Expressions)"
)


def _spelling(member: str) -> bool:
    """Whether a quoted path of a set is one of the encoded spellings of another."""
    text = member[1:-1]
    return "%2F" in text or text.endswith("%0A") or (text.endswith("/") and text != "/")


def fold_expression(expression: str) -> str:
    """The expression with each long set of paths folded to its plain paths and a count of
    the other spellings (``{"/login" ... +5 spellings}``), for a terminal."""

    def fold(match: re.Match[str]) -> str:
        members = _QUOTED.findall(match.group(1))
        plain = [m for m in members if not _spelling(m)]
        if len(members) <= FOLD_OVER or not plain:
            return match.group(0)
        return "{" + " ".join(plain) + f" ... +{len(members) - len(plain)} spellings}}"

    return _STRING_SET.sub(fold, expression)


def _shown(path: str, value: Any) -> str:
    if path == "expression" and isinstance(value, str):
        return _value(fold_expression(value))
    return _value(value)


def _field_line(change: FieldChange, action: str) -> str:
    if action == "create":
        return f"{change.path}: {_shown(change.path, change.new)}"
    return f"{change.path}: {_shown(change.path, change.old)} -> {_shown(change.path, change.new)}"


_SIGNS = {"create": "+", "update": "~", "move": ">", "delete": "-"}


def _rule_lines(plan: ZonePlan) -> list[str]:
    """Each rule change and its fields; the note when an expression was folded."""
    out = []
    for change in plan.rule_changes:
        where = f", at position {change.position}" if change.position is not None else ""
        out.append(f"  {_SIGNS[change.action]} {change.action} {_rule_title(change)}{where}")
        out.extend(f"      {_field_line(f, change.action)}" for f in change.fields)
    if any(
        f.path == "expression" and _shown(f.path, f.new) != _value(f.new)
        for change in plan.rule_changes
        for f in change.fields
    ):
        out.append(f"  {FOLD_NOTE}")
    return out


def to_text(plan: ZonePlan) -> str:
    """The plan for a terminal: each rule, then each field that changes."""
    out = [f"edgegen plan for zone {plan.scope.zone_id}", ""]
    version = f"version {plan.ruleset_version}" if plan.ruleset_version else "none yet"
    out.append(f"Rate limiting rules (http_ratelimit entrypoint, {version}):")
    if plan.ruleset_body is None:
        out.append("  no changes")
    out.extend(_rule_lines(plan))
    if plan.foreign_rules:
        n = len(plan.foreign_rules)
        out.append(f"  {_plural(n, 'rule')} not managed by edgegen kept in place:")
        for rule in plan.foreign_rules:
            label = rule.description or rule.ref
            out.append(f"      position {rule.position}: {label}")
    if plan.scope.worker_name:
        out.append("")
        out.append(f"Worker {plan.scope.worker_name}:")
        upload = plan.worker_change
        if upload is None:
            out.append("  no changes")
        else:
            sign = _SIGNS[upload.action]
            out.append(f"  {sign} {upload.action}: upload the script and its bindings")
            out.extend(f"      {_field_line(f, upload.action)}" for f in upload.fields)
        out.append("")
        out.append("Routes:")
        if not plan.route_changes:
            out.append("  no changes")
        for route in plan.route_changes:
            if route.action == "create":
                out.append(f"  + add {route.pattern} -> {route.script}")
            else:
                out.append(f"  - remove {route.pattern} (route {route.route_id})")
    if plan.notes:
        out.append("")
        out.append("Notes:")
        out.extend(f"  - {note}" for note in plan.notes)
    out.append("")
    out.append(summary(plan))
    # Rules made by hand and routes read from the zone are shown as they are: never as
    # escape sequences for the terminal.
    return terminal_text("\n".join(out) + "\n")


def _md_field(change: FieldChange, action: str) -> str:
    if action == "create":
        return f"  - {code(change.path)}: {code(_value(change.new))}"
    return f"  - {code(change.path)}: {code(_value(change.old))} → {code(_value(change.new))}"


def to_markdown(plan: ZonePlan) -> str:
    """The plan for a pull request comment."""
    out = ["### edgegen plan", "", f"**{summary(plan)}**", ""]
    version = f"version {plan.ruleset_version}" if plan.ruleset_version else "none yet"
    out.append(f"#### Rate limiting rules ({code('http_ratelimit')} entrypoint, {version})")
    out.append("")
    if plan.ruleset_body is None:
        out.append("No changes.")
    for change in plan.rule_changes:
        name = code(change.limit) if change.limit else code(change.description or change.ref)
        out.append(f"- **{change.action}** {name} ({code(change.ref)})")
        out.extend(_md_field(f, change.action) for f in change.fields)
    if plan.foreign_rules:
        n = len(plan.foreign_rules)
        out.append(f"- {_plural(n, 'rule')} not managed by edgegen kept in place")
    if plan.scope.worker_name:
        out.extend(["", f"#### Worker {code(plan.scope.worker_name)}", ""])
        upload = plan.worker_change
        if upload is None:
            out.append("No changes.")
        else:
            out.append(f"- **{upload.action}**: upload the script and its bindings")
            out.extend(_md_field(f, upload.action) for f in upload.fields)
        out.extend(["", "#### Routes", ""])
        if not plan.route_changes:
            out.append("No changes.")
        for route in plan.route_changes:
            if route.action == "create":
                out.append(f"- **add** {code(route.pattern)} → {code(route.script or '')}")
            else:
                out.append(f"- **remove** {code(route.pattern)}")
    if plan.notes:
        out.extend(["", "#### Notes", ""])
        out.extend(f"- {note}" for note in plan.notes)
    return "\n".join(out) + "\n"
