"""``edgegen report``: what the edge rules and the Worker did, from Cloudflare's analytics.

A thin shell over ``cloudflare._analytics.report``: it reads the command line, the policy (for the
zone, account and Worker) and the token, and prints the report as text, Markdown or JSON.
The formatters are pure functions of an ``EdgeReport``. Everything quoted from Cloudflare
(descriptions, countries, colos, error messages) is shown escaped: on a terminal no
character acts as a control, in Markdown none is markup.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

from edgegen_policy import Duration

from ._cli_zone import make_client, scope_of
from ._pipeline import load_and_build
from ._text import code, markdown_text, terminal_text
from .cloudflare._analytics import DEFAULT_TOP, Count, EdgeReport, RuleReport, report
from .errors import UsageError


def register(sub: Any) -> None:
    """Add ``report`` to the CLI."""
    parser = sub.add_parser(
        "report",
        help="show what the edge rules and the Worker did (Cloudflare analytics)",
        description="Read Cloudflare's GraphQL Analytics API for the policy's zone and show, "
        "for each edgegen rate limiting rule and for the Worker, how many requests were "
        "counted and mitigated, with the top client countries and colos.",
    )
    parser.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    parser.add_argument(
        "--since",
        default="24h",
        metavar="DURATION",
        help="how far back to look, e.g. 1h, 24h, 7d (default 24h; how far a plan can look "
        "back is in docs/zone.md)",
    )
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    parser.add_argument(
        "--top",
        type=int,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"how many countries and colos to show per rule (default {DEFAULT_TOP})",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the API token from FILE instead of CLOUDFLARE_API_TOKEN",
    )
    parser.set_defaults(func=run_report)


def parse_since(text: str) -> timedelta:
    """``--since`` as a timedelta; a UsageError that says how to write it."""
    try:
        return timedelta(milliseconds=Duration.parse(text.strip()).ms)
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None


def run_report(args: argparse.Namespace) -> int:
    """Build the report for the policy's zone and print it."""
    since = parse_since(args.since)
    loaded, artifacts = load_and_build(args.policy)
    scope = scope_of(loaded, artifacts, args.policy)
    with make_client(args) as client:
        made = report(client, scope, since=since, top=args.top)
    if args.format == "json":
        sys.stdout.write(json.dumps(made.to_json(), indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(terminal_text(to_markdown(made)))
    else:
        sys.stdout.write(terminal_text(to_text(made)))
    return 0


# --- formats -------------------------------------------------------------------------


def _span(made: EdgeReport) -> str:
    return f"{made.since:%Y-%m-%d %H:%M} to {made.until:%Y-%m-%d %H:%M} UTC"


def _list(items: tuple[Count, ...]) -> str:
    return ", ".join(f"{c.name} {c.count:,}" for c in items) or "none"


def _rule_name(rule: RuleReport) -> str:
    return rule.description or rule.ref


def to_text(made: EdgeReport) -> str:
    """The report for a terminal."""
    lines = [f"Edge report for zone {made.zone_id}, {_span(made)}", ""]
    for rule in made.rules:
        state = "" if rule.enabled else " (disabled)"
        lines.append(f"rule {_rule_name(rule)}{state}")
        lines.append(f"  ref {rule.ref}, id {rule.rule_id}, action {rule.action}")
        lines.append(
            f"  {rule.events:,} events: {rule.mitigated:,} mitigated, {rule.logged:,} logged"
        )
        if rule.events:
            lines.append(f"  by action: {_list(rule.actions)}")
            lines.append(f"  top countries: {_list(rule.countries)}")
            lines.append(f"  top colos: {_list(rule.colos)}")
        if rule.truncated:
            lines.append("  (lists cut at their limit; raise --top to see more)")
        lines.append("")
    if made.worker is not None:
        worker = made.worker
        lines.append(f"Worker {worker.name}")
        if worker.unavailable is not None:
            lines.append(f"  no numbers: {worker.unavailable}")
        else:
            lines.append(
                f"  {worker.requests:,} requests, {worker.errors:,} errors, "
                f"{worker.subrequests:,} subrequests"
            )
            if worker.statuses:
                lines.append(f"  by status: {_list(worker.statuses)}")
        lines.append("")
    lines.extend(f"note: {note}" for note in made.notes)
    return "\n".join(lines).rstrip("\n") + "\n"


def _md_list(items: tuple[Count, ...]) -> str:
    return ", ".join(f"{markdown_text(c.name)} {c.count:,}" for c in items) or "none"


def to_markdown(made: EdgeReport) -> str:
    """The report as Markdown (a table per layer), e.g. for a CI summary."""
    lines = [f"## Edge report for zone {code(made.zone_id)}", "", _span(made), ""]
    if made.rules:
        lines.append("| rule | action | events | mitigated | logged | top countries | top colos |")
        lines.append("|---|---|---:|---:|---:|---|---|")
        for rule in made.rules:
            name = markdown_text(_rule_name(rule)) + ("" if rule.enabled else " (disabled)")
            lines.append(
                f"| {name} ({code(rule.ref)}) | {code(rule.action)} | {rule.events:,} | "
                f"{rule.mitigated:,} | {rule.logged:,} | {_md_list(rule.countries)} | "
                f"{_md_list(rule.colos)} |"
            )
        lines.append("")
    if made.worker is not None:
        worker = made.worker
        lines.append(f"### Worker {code(worker.name)}")
        lines.append("")
        if worker.unavailable is not None:
            lines.append(f"No numbers: {markdown_text(worker.unavailable)}")
        else:
            lines.append("| requests | errors | subrequests | by status |")
            lines.append("|---:|---:|---:|---|")
            lines.append(
                f"| {worker.requests:,} | {worker.errors:,} | {worker.subrequests:,} | "
                f"{_md_list(worker.statuses)} |"
            )
        lines.append("")
    lines.extend(f"> {markdown_text(note)}" for note in made.notes)
    return "\n".join(lines).rstrip("\n") + "\n"
