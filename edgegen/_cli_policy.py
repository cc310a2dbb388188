"""``edgegen validate``, ``edgegen show`` and ``edgegen schema``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import edgegen_policy as policy
from edgegen_policy import Policy, Quotas, Severity

from ._placement import check
from .cloudflare._messages import shown_url


def register(sub: Any) -> None:
    """Add the policy commands to the CLI."""
    validate = sub.add_parser(
        "validate",
        help="check a policy file (exit 0 valid, 1 errors)",
        description="Load a policy, report every error with file, line and field, and lint it.",
    )
    validate.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    validate.add_argument(
        "--strict", action="store_true", help="treat warnings as errors (exit 1 on any warning)"
    )
    validate.add_argument("--format", choices=("text", "json"), default="text")
    validate.add_argument("--quiet", "-q", action="store_true", help="print errors only")
    validate.set_defaults(func=run_validate)

    show = sub.add_parser(
        "show", help="print what a policy defines", description="Summarise a policy's limits."
    )
    show.add_argument("policy", metavar="POLICY")
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(func=run_show)

    schema = sub.add_parser(
        "schema",
        help="print the policy file's JSON Schema",
        description="Print the JSON Schema of the policy file, for editors and CI.",
    )
    schema.set_defaults(func=run_schema)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def run_validate(args: argparse.Namespace) -> int:
    """Validate and check; exit 1 on errors (or warnings with --strict)."""
    try:
        loaded = policy.load(args.policy)
    except policy.PolicyLoadError as exc:
        if args.format == "json":
            _print_json(
                {
                    "file": args.policy,
                    "valid": False,
                    "diagnostics": [policy.diagnostic_json(d) for d in exc.diagnostics],
                }
            )
            return 1
        raise
    checked = check(loaded)
    failing = checked.failing(strict=args.strict)
    if args.format == "json":
        _print_json(
            {
                "file": args.policy,
                "valid": failing == 0,
                "strict": args.strict,
                "limits": len(loaded.limits),
                "diagnostics": [policy.diagnostic_json(d) for d in checked.diagnostics],
            }
        )
        return 1 if failing else 0
    policy.write_diagnostics(
        checked.diagnostics, sys.stderr, info=sys.stdout, errors_only=args.quiet
    )
    summary = (
        f"{_plural(checked.count(Severity.ERROR), 'error')}, "
        f"{_plural(checked.count(Severity.WARNING), 'warning')}, "
        f"{checked.count(Severity.INFO)} info"
    )
    if failing:
        why = " (--strict: warnings count as errors)" if args.strict else ""
        sys.stderr.write(f"{args.policy}: invalid{why}: {summary}\n")
        return 1
    if not args.quiet:
        edge = sum(1 for limit in loaded.limits if limit.edge)
        app = sum(1 for limit in loaded.limits if limit.app)
        sys.stdout.write(
            f"{args.policy}: valid: {_plural(len(loaded.limits), 'limit')} "
            f"({edge} edge, {app} app), {summary}\n"
        )
    return 0


def _quota_texts(quotas: Quotas | None) -> list[str]:
    """A tier's calendar quotas as ``50000/month``."""
    if quotas is None:
        return []
    return [f"{units}/{period.value}" for period, units in quotas.periods()]


def describe(loaded: Policy) -> list[dict[str, Any]]:
    """A plain summary of each limit: what it matches and how it is enforced."""
    rows: list[dict[str, Any]] = []
    for limit in loaded.limits:
        match = limit.match
        parts = []
        if match.methods:
            parts.append(" ".join(match.methods))
        parts.extend(match.paths)
        parts.extend(f"{p}*" for p in match.path_prefix)
        if match.hosts:
            parts.append("on " + ", ".join(match.hosts))
        row: dict[str, Any] = {"name": limit.name, "match": " ".join(parts) or "every request"}
        if limit.edge:
            edge = limit.edge
            who = "unauthenticated " if edge.unauthenticated_only else ""
            row["edge"] = f"{edge.rate} per {who}IP, {edge.action.value}"
        if limit.app:
            app = limit.app
            quotas = app.quotas or {}
            at_once = app.concurrency_of(loaded.tiers)
            named = [*app.tiers, *(t for t in loaded.tiers if t in at_once and t not in app.tiers)]
            tiers = ", ".join(
                f"{tier} "
                + " + ".join(
                    [str(r) for r in app.tiers.get(tier, ())]
                    + _quota_texts(quotas.get(tier))
                    + ([f"{at_once[tier]} at once"] if tier in at_once else [])
                )
                for tier in named
            )
            if quotas and app.quota_timezone != "UTC":
                tiers += f" (quotas in {app.quota_timezone})"
            shadow = " (shadow)" if not app.enforce else ""
            approx = " (approximate)" if app.mode.value == "approximate" else ""
            # A limit of concurrency alone counts no rate: no algorithm applies to it.
            rated = any(app.tiers.values())
            how = f"{app.algorithm.value} per" if rated else "per"
            row["app"] = f"{how} {app.per.value}{shadow}{approx}: {tiers}"
            if rated and app.algorithm.value == "sliding_window":
                # The previous window's weighted count can hold a refused client for up to
                # two periods, which fixed-window users do not expect (docs/web.md, 429).
                row["note"] = "a refused client may wait up to two periods (Retry-After)"
        rows.append(row)
    return rows


SHOW_FORMAT = 1


def show_data(loaded: Policy, file: str) -> dict[str, Any]:
    """``show --format json``: the policy as data (docs/policy.md, "edgegen show").

    Every section and field as the policy model holds it, in the file's own spelling
    (``"100/1m"``, ``"10s"``, ``null`` for a field left to its default), with each limit's
    ``effective`` values (the defaults resolved), and ``app.redis_url`` with any user and
    password shown as ``***``. ``format`` changes only when a field is removed or changes
    meaning.
    """
    data: dict[str, Any] = loaded.model_dump(mode="json")
    data["app"]["redis_url"] = shown_url(loaded.app.redis_url)
    for limit, shown in zip(loaded.limits, data["limits"], strict=True):
        effective: dict[str, Any] = {}
        if limit.edge is not None:
            extra = policy.credentialed_rate(loaded, limit)
            effective["edge_credentialed_rate"] = str(extra) if extra is not None else None
        if limit.app is not None:
            effective["on_redis_error"] = (
                limit.app.on_redis_error or loaded.app.on_redis_error
            ).value
        shown["effective"] = effective
    return {"format": SHOW_FORMAT, "file": file, **data}


def run_show(args: argparse.Namespace) -> int:
    """Print a table of the policy's limits (or, with ``--format json``, the policy as data)."""
    loaded = policy.load(args.policy)
    if args.format == "json":
        _print_json(show_data(loaded, args.policy))
        return 0
    rows = describe(loaded)
    plan = loaded.cloudflare.plan.value if loaded.cloudflare else "none (no cloudflare section)"
    out = [f"{args.policy}: {len(rows)} limits, tiers {' < '.join(loaded.tiers)}, plan {plan}"]
    for row in rows:
        out.append(f"  {row['name']}: {row['match']}")
        if "edge" in row:
            out.append(f"      edge: {row['edge']}")
        if "app" in row:
            out.append(f"      app:  {row['app']}")
        if "note" in row:
            out.append(f"            {row['note']}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def run_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema."""
    _print_json(policy.json_schema())
    return 0


def _print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False) + "\n")
