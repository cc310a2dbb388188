"""The ``applimit`` command line: an identity's usage of the app limits, resetting it, and
per-identity overrides (set, list, remove, and their audit trail).

::

    applimit usage POLICY --user alice [--tier pro] [--ip 203.0.113.9] [--keys org=acme]
                          [--format text|json] [--redis-url URL] [--cluster] [--timeout 2s]
    applimit reset POLICY --user alice [--limit NAME ...] [--tier T] [--yes]
    applimit override set POLICY --limit api (--user alice | --keys org=acme)
                          [--rate 1000/1m ...] [--quota month=2000000 ...]
                          [--concurrency 8] (--ttl 30d | --expires 2027-06-30)
                          --reason TEXT [--by NAME]
    applimit override list POLICY [--format text|json]
    applimit override remove POLICY --limit api (--user alice | --keys org=acme)
                          --reason TEXT [--by NAME] [--yes]
    applimit override log POLICY [--count 20] [--format text|json]

It reads the policy file and the Redis the app uses (``--redis-url``, else the environment
variable ``APPLIMIT_REDIS_URL``, else the policy's ``app.redis_url``) through a
:class:`~applimit.Limiter`, as the app does: ``usage`` only peeks (nothing is consumed) and
``reset`` calls :meth:`~applimit.Limiter.reset`. The core (which limits apply to the
subject, what each rate shows, the JSON document) is pure; :func:`main` is the shell that
parses arguments, talks to Redis and the terminal, and maps every error to a message and an
exit code in one place, so that a user mistake never ends in a traceback.

The CLI cannot know the identity's tier (the app's ``identify`` decides it), so without
``--tier`` usage is shown under every tier the limit gives a rate: the counts live in keys
per period, not per tier (docs/applimit.md, Keys), so each tier's line is how the same
counts stand against that tier's quota.

Exit codes: 0 done; 1 the policy did not load, Redis could not be read or written, or a
reset or removal was not confirmed, an override to remove was not set, or the policy reads
no run-time overrides; 2 the command line is wrong (an option, a limit, a tier, an
identity or address that cannot be used).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import ipaddress
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from edgegen_policy import (
    LEASE,
    OVERRIDE_TIER,
    CountWhen,
    Duration,
    Policy,
    PolicyLoadError,
    ip_bucket,
    load,
    override_expiry,
    write_diagnostics,
)

from ._clients import MEMORY_SCHEME, shown_url
from ._decision import Decision
from ._errors import REDIS_FAILURES, ApplimitError, ConfigurationError, InvalidArgumentError
from ._overrides import EXPIRED, IGNORED, IN_FORCE, Override, status, unfit
from ._rules import AppRule
from ._sync import Limiter
from .web._headers import quota_period

# Where the Redis URL comes from when --redis-url is not given (before the policy's).
ENV_REDIS_URL = "APPLIMIT_REDIS_URL"
# The version of the JSON document `usage --format json` prints (docs/applimit.md).
USAGE_FORMAT_VERSION = 1
# The longest --timeout, as for the policy's app.timeout.
MAX_TIMEOUT_MS = 10_000
OK = 0
FAILED = 1
USAGE_ERROR = 2


class CommandError(Exception):
    """A failure the CLI reports in one line, with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- the pure core -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subject:
    """Whom the command is about: a user, a client address, app keys (``org=acme``)."""

    user: str | None
    ip: str | None
    keys: Mapping[str, str]

    def describe(self) -> str:
        """``user 'alice', ip 203.0.113.9, org 'acme'``: for messages and prompts."""
        parts = []
        if self.user is not None:
            parts.append(f"user '{shown(self.user)}'")
        if self.ip is not None:
            parts.append(f"ip {self.ip}")
        parts.extend(f"{shown(name)} '{shown(value)}'" for name, value in self.keys.items())
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Counted:
    """How one limit counts the subject: by what (``user``, ``ip``, an app key) and which
    value; or, when the subject lacks what the limit counts by, why it is skipped."""

    kind: str
    value: str | None
    skipped: str | None = None


def shown(text: str) -> str:
    """``text`` safe to print: control characters escaped, never sent to the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def counted_by(rule: AppRule, subject: Subject, ipv6_prefix: int) -> Counted:
    """What ``rule`` counts ``subject`` by, as the middleware's ``check_request`` does: a
    per-IP limit the address; a ``per: <key>`` limit the key, else the address; a per-user
    limit the user, else (an anonymous caller) the address."""
    address = None if subject.ip is None else ip_bucket(subject.ip, ipv6_prefix)
    if rule.per_ip:
        wanted, value, hint = "ip", None, "counts per client IP; pass --ip"
    elif rule.per_key is not None:
        wanted, value = rule.per_key, subject.keys.get(rule.per_key)
        hint = f"counts per {rule.per_key}; pass --keys {rule.per_key}=VALUE"
    else:
        wanted, value = "user", subject.user
        hint = "counts per user; pass --user (or --ip for an anonymous caller)"
    if value is not None:
        return Counted(wanted, value)
    # Without what the limit counts, the caller is counted by address (never unlimited).
    if address is None:
        return Counted(wanted, None, hint)
    return Counted("ip", address)


def algorithm_shown(rule: AppRule) -> str | None:
    """The algorithm ``rule`` counts rates with, or None where it counts none: a limit
    with no rate in any tier (concurrency alone; no override may give it rates). The
    policy's default algorithm is set on every limit, but means nothing without a rate."""
    return rule.algorithm if any(rule.tiers.values()) else None


def tiers_shown(rule: AppRule, tier: str | None, policy_tiers: Sequence[str]) -> list[str]:
    """The tiers to show ``rule`` under: the one asked for, else every tier it has a rate
    for, in the policy's order (least generous first)."""
    if tier is not None:
        return [tier]
    return [t for t in policy_tiers if rule.tiers.get(t) or t in rule.concurrency]


def rate_usage(rule: AppRule, tier: str, decision: Decision) -> list[dict[str, Any]]:
    """One entry per rate of ``tier`` in a peeked decision: quota, used, remaining, reset.

    ``capacity`` is how many requests fit at once: the quota, or for GCRA the burst;
    ``used`` is capacity minus ``remaining`` (what a request of cost 1 still finds).
    """
    out = []
    # The decision has one result per rate of the tier, in the tier's order (Core.checks),
    # or per rate of the subject's override (tier "override"), whose rates it carries; then
    # one per calendar quota (quota_usage) and the concurrency limit's (lease_usage).
    texts = [f"{rate.quota}/{rate.period_text}" for rate in rule.tiers.get(tier, ())]
    rates = [r for r in decision.results if r.algorithm != LEASE and not quota_period(r)]
    for index, result in enumerate(rates):
        capacity = result.quota
        if rule.algorithm == "gcra" and rule.burst is not None:
            capacity = rule.burst
        out.append(
            {
                "rate": (
                    texts[index]
                    if result.tier != OVERRIDE_TIER
                    else f"{result.quota}/{Duration(round(result.window * 1000))}"
                ),
                "tier": result.tier,
                "quota": result.quota,
                "window": result.window,
                "capacity": capacity,
                "used": max(0, capacity - result.remaining),
                "remaining": result.remaining,
                "reset_after": round(result.reset_after, 3),
                "allowed": result.allowed,
            }
        )
    return out


def lease_usage(decision: Decision) -> dict[str, Any] | None:
    """A concurrency limit's slots in a peeked decision (``limit``, ``running``,
    ``free``, and the ``tier`` whose limit it is: ``override`` for the subject's own), or
    None for a limit without one."""
    for result in decision.results:
        if result.algorithm == LEASE:
            free = max(0, result.remaining)
            return {
                "limit": result.quota,
                "running": result.quota - free,
                "free": free,
                "tier": result.tier,
            }
    return None


def _tier_lines(tier: Mapping[str, Any]) -> list[str]:
    """The lines of one tier of a limit in the usage text: its slots, then its rates."""
    lines = []
    held = tier.get("concurrency")
    if held is not None:
        lines.append(
            f"  {tier['tier']:<12} {'at once':>12}  running {held['running']:>3} of "
            f"{held['limit']:<6} free {held['free']}"
            + ("  (override)" if held["tier"] == OVERRIDE_TIER else "")
        )
    elif not tier["rates"]:
        lines.append(f"  {tier['tier']:<12} no rate in this tier: not limited")
    for index, rate in enumerate(tier["rates"]):
        name = tier["tier"] if index == 0 and held is None else ""
        lines.append(
            f"  {name:<12} {rate['rate']:>12}  used {rate['used']:>6} of "
            f"{rate['capacity']:<6} remaining {rate['remaining']:>6}  "
            f"resets in {rate['reset_after']:g}s"
            + ("  (override)" if rate["tier"] == OVERRIDE_TIER else "")
        )
    for quota in tier.get("quotas", ()):
        label = f"{quota['quota']}/{quota['period']}"
        lines.append(
            f"  {'':<12} {label:>12}  used {quota['used']:>6} of "
            f"{quota['quota']:<6} remaining {quota['remaining']:>6}  "
            f"period ends in {_span(quota['reset_after'])}"
            + ("  (override)" if quota["tier"] == OVERRIDE_TIER else "")
        )
    return lines


def _span(seconds: float) -> str:
    """``42.5s``, ``12m 3s``, ``26d 16h``: a wait as a person reads it (the two largest
    units; a quota's period ends weeks ahead)."""
    if seconds < 60:
        return f"{seconds:g}s"
    whole = round(seconds)
    parts = [(whole // 86_400, "d"), (whole % 86_400 // 3600, "h"), (whole % 3600 // 60, "m")]
    parts.append((whole % 60, "s"))
    first = next(i for i, (count, _) in enumerate(parts) if count)
    return " ".join(f"{count}{unit}" for count, unit in parts[first : first + 2])


def quota_usage(decision: Decision) -> list[dict[str, Any]]:
    """One entry per calendar quota in a peeked decision (the tier's, or the subject's own
    override's: ``tier``): its period, quota, used, remaining, the period's length and the
    seconds until it ends."""
    out = []
    for result in decision.results:
        period = quota_period(result)
        if not period:
            continue
        out.append(
            {
                "period": period,
                "tier": result.tier,
                "quota": result.quota,
                "window": result.window,
                "used": max(0, result.quota - result.remaining),
                "remaining": result.remaining,
                "reset_after": round(result.reset_after, 3),
                "allowed": result.allowed,
            }
        )
    return out


def format_text(document: Mapping[str, Any]) -> str:
    """The usage document as lines for a terminal."""
    subject = document["subject"]
    lines = [f"usage of {subject['description']} in {document['redis']}"]
    if document["tier"] is None and any(len(limit["tiers"]) > 1 for limit in document["limits"]):
        # The app's identify() knows the caller's tier; the counts are the same under each.
        lines.append(
            "(the tier is the app's to know: the same counts are shown against each tier's "
            "quota; --tier TIER shows one)"
        )
    for limit in document["limits"]:
        flags = [f"per {limit['per']}"]
        if limit["algorithm"] is not None:
            flags.insert(0, limit["algorithm"])
        if limit["shadow"]:
            flags.append("shadow")
        if not limit["middleware"]:
            flags.append("middleware: false")
        if limit["count_when"]:
            flags.append(f"counts responses {limit['count_when']}")
        head = f"{limit['name']} ({', '.join(flags)})"
        counted = limit["counted_by"]
        if limit["skipped"] is not None:
            lines.append(f"{head}: skipped, {limit['skipped']}")
            continue
        lines.append(f"{head}: counted by {counted['kind']} '{shown(counted['value'])}'")
        for tier in limit["tiers"]:
            lines += _tier_lines(tier)
    return "\n".join(lines) + "\n"


# --- the shell ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one clear line (no traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"applimit: error: {message}\n")
        raise SystemExit(USAGE_ERROR)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``applimit`` (exposed for docs and tests)."""
    parser = _Parser(
        prog="applimit",
        description="Show or reset an identity's usage of a policy's app limits in Redis, "
        "and give identities rates of their own (override).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    usage = sub.add_parser(
        "usage", help="show the usage of every app limit that counts the identity (no cost)"
    )
    _common(usage)
    usage.add_argument(
        "--tier", help="show this tier's rates only (default: every tier each limit has)"
    )
    usage.add_argument("--format", choices=("text", "json"), default="text")
    reset = sub.add_parser("reset", help="forget what the app limits counted for the identity")
    _common(reset)
    reset.add_argument(
        "--limit",
        action="append",
        dest="limits",
        metavar="NAME",
        help="reset this limit only (repeatable; default: every limit that counts the identity)",
    )
    reset.add_argument("--tier", help="reset only the keys of this tier's rates")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _override_parsers(sub)
    return parser


def _override_parsers(sub: Any) -> None:
    override = sub.add_parser(
        "override",
        help="give one identity its own rates, quotas or concurrency for one limit, at run time",
    )
    actions = override.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    actions.required = True
    change = actions.add_parser("set", help="set (or replace) an identity's override")
    _common(change)
    change.add_argument("--limit", required=True, help="the limit the override is for")
    change.add_argument(
        "--rate",
        action="append",
        dest="rates",
        metavar="RATE",
        help="a rate of the identity's own, e.g. 1000/1m (repeatable); replaces its tier's",
    )
    change.add_argument(
        "--quota",
        action="append",
        dest="quotas",
        metavar="PERIOD=UNITS",
        help="a calendar quota of its own, e.g. month=2000000 (repeatable; day, week, month, "
        "billing); replaces its tier's",
    )
    change.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="its own limit of requests at once; replaces its tier's",
    )
    change.add_argument("--ttl", metavar="DURATION", help="how long it lasts, e.g. 30d")
    change.add_argument("--expires", metavar="TIME", help="when it ends: 2027-06-30 or a UTC time")
    change.add_argument("--reason", required=True, help="why (a contract, a ticket): audited")
    change.add_argument("--by", help="who sets it (default: the login name)")
    remove = actions.add_parser("remove", help="end an identity's override: its tier applies")
    _common(remove)
    remove.add_argument("--limit", required=True, help="the limit the override is for")
    remove.add_argument("--reason", required=True, help="why: audited")
    remove.add_argument("--by", help="who removes it (default: the login name)")
    remove.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    listed = actions.add_parser("list", help="the overrides stored in Redis and in the policy")
    _common(listed, subject=False)
    listed.add_argument("--format", choices=("text", "json"), default="text")
    logged = actions.add_parser("log", help="the audit trail: who changed what, when and why")
    _common(logged, subject=False)
    logged.add_argument("--count", type=int, default=20, help="how many changes (newest first)")
    logged.add_argument("--format", choices=("text", "json"), default="text")


def _common(parser: argparse.ArgumentParser, *, subject: bool = True) -> None:
    parser.add_argument("policy", metavar="POLICY", help="the policy file the app uses")
    if subject:
        parser.add_argument("--user", help="the user id, as the app's identify returns it")
        parser.add_argument("--ip", help="the client address (per-IP limits, anonymous callers)")
        parser.add_argument(
            "--keys",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="an app key of a per: <key> limit, e.g. org=acme (repeatable, or comma-separated)",
        )
    parser.add_argument(
        "--redis-url",
        help=f"the Redis to read (default: ${ENV_REDIS_URL}, else the policy's app.redis_url)",
    )
    parser.add_argument("--cluster", action="store_true", help="the URL is a Redis Cluster node")
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        help="how long to wait for Redis, e.g. 2s (default: the policy's app.timeout, which "
        "is set for the app's own network)",
    )


def _subject(args: argparse.Namespace) -> Subject:
    keys: dict[str, str] = {}
    for item in args.keys:
        for pair in item.split(","):
            name, eq, value = pair.partition("=")
            if not eq or not name.strip() or not value:
                raise CommandError(
                    f"--keys '{shown(pair)}' is not NAME=VALUE; e.g. --keys org=acme.",
                    USAGE_ERROR,
                )
            keys[name.strip()] = value
    if args.user == "":
        raise CommandError("--user is empty; pass the user id the app counts.", USAGE_ERROR)
    ip = args.ip
    if ip is not None:
        try:
            ip = str(ipaddress.ip_address(ip))
        except ValueError:
            raise CommandError(
                f"--ip '{shown(ip)}' is not an IPv4 or IPv6 address.", USAGE_ERROR
            ) from None
    if args.user is None and ip is None and not keys:
        raise CommandError("say whose usage: pass --user, --ip or --keys NAME=VALUE.", USAGE_ERROR)
    return Subject(args.user, ip, keys)


def _open(args: argparse.Namespace) -> tuple[Limiter, str]:
    """The limiter and the URL it reads, as it may be shown (no password)."""
    url = args.redis_url or os.environ.get(ENV_REDIS_URL) or None
    loaded = load(args.policy)
    if args.timeout is not None:
        loaded = _with_timeout(loaded, args.timeout)
    limiter = Limiter(loaded, redis_url=url, cluster=args.cluster)
    if limiter.url.startswith(MEMORY_SCHEME):
        limiter.close()
        raise CommandError(
            f"the Redis URL is {limiter.url!r}, a store inside one process: this command "
            f"would read an empty one. Pass --redis-url (or ${ENV_REDIS_URL}) with the "
            "Redis the app uses.",
            USAGE_ERROR,
        )
    feed = limiter.override_feed
    if feed is not None:
        # The command reads the overrides once, as the app would decide now: not in the
        # background.
        feed.stop()
        try:
            feed.poll(force=True)
        except REDIS_FAILURES:
            limiter.close()
            raise _unreachable(shown_url(limiter.url)) from None
    return limiter, shown_url(limiter.url)


def _with_timeout(loaded: Policy, text: str) -> Policy:
    """``loaded`` with ``app.timeout`` replaced: an operator's terminal may be further from
    Redis than the app is, and the policy's timeout is chosen for the app."""
    try:
        timeout = Duration.parse(text)
    except ValueError:
        timeout = None
    if timeout is None or not 0 < timeout.ms <= MAX_TIMEOUT_MS:
        raise CommandError(
            f"--timeout '{shown(text)}' is not a duration from 1ms to 10s; e.g. --timeout 2s.",
            USAGE_ERROR,
        )
    return loaded.model_copy(update={"app": loaded.app.model_copy(update={"timeout": timeout})})


def _unreachable(url: str, done: Sequence[str] = ()) -> CommandError:
    """Redis did not answer; ``done`` names the limits a reset had already reset."""
    changed = f"only {', '.join(done)} was reset" if done else "nothing was read or changed"
    return CommandError(
        f"Redis at {url} did not answer (unreachable, too slow or refusing); {changed}. "
        f"Check that it runs and that --redis-url (or ${ENV_REDIS_URL}, or the policy's "
        "app.redis_url) names it.",
        FAILED,
    )


def _rules(limiter: Limiter, names: Sequence[str] | None) -> list[AppRule]:
    """The limits named (each checked: UnknownLimitError names those that exist), or all."""
    if names is None:
        return list(limiter.compiled.rules)
    return [limiter.core.rule(name) for name in names]


def run_usage(args: argparse.Namespace, out: TextIO) -> int:
    """``applimit usage``: peek every limit under each tier shown, print the document."""
    subject = _subject(args)
    limiter, url = _open(args)
    with limiter:
        tier = None if args.tier is None else limiter.core.tier(args.tier)
        limits = []
        for rule in _rules(limiter, None):
            limits.append(_limit_usage(limiter, rule, subject, tier, url))
    document = {
        "version": USAGE_FORMAT_VERSION,
        "policy": str(args.policy),
        "redis": url,
        "subject": {
            "user": subject.user,
            "ip": subject.ip,
            "keys": dict(subject.keys),
            "description": subject.describe(),
        },
        "tier": tier,
        "limits": limits,
    }
    if args.format == "json":
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        out.write(format_text(document))
    return OK


def _limit_usage(
    limiter: Limiter, rule: AppRule, subject: Subject, tier: str | None, url: str
) -> dict[str, Any]:
    counted = counted_by(rule, subject, limiter.compiled.ipv6_prefix)
    tiers = []
    if counted.skipped is None:
        for name in tiers_shown(rule, tier, limiter.tiers):
            decision = _peek(limiter, rule, subject, name)
            if decision.degraded:
                raise _unreachable(url)
            entry: dict[str, Any] = {
                "tier": name,
                "rates": rate_usage(rule, name, decision),
                "concurrency": lease_usage(decision),
            }
            quotas = quota_usage(decision)
            if quotas:
                entry["quotas"] = quotas
            tiers.append(entry)
    return {
        "name": rule.name,
        "algorithm": algorithm_shown(rule),
        "per": rule.kind,
        "shadow": rule.shadow,
        "middleware": rule.middleware,
        "count_when": _statuses(rule.count_when),
        "counted_by": {"kind": counted.kind, "value": counted.value},
        "skipped": counted.skipped,
        "tiers": tiers,
    }


def _statuses(ranges: tuple[tuple[int, int], ...]) -> str | None:
    """count_when's statuses as the policy writes them (``401, 5xx``), or None."""
    if not ranges:
        return None
    return CountWhen(status=[f"{low}-{high}" for low, high in ranges]).describe()


def _peek(limiter: Limiter, rule: AppRule, subject: Subject, tier: str) -> Decision:
    # A per-IP limit takes the address only as ip=, with no identity (Core._limit_tag).
    identity = None if rule.per_ip else subject.user
    try:
        return limiter.peek(rule.name, identity, tier=tier, ip=subject.ip, keys=subject.keys)
    except InvalidArgumentError as error:
        day = rule.billing_day_from
        if error.argument != "keys" or day is None or day in subject.keys:
            raise
        # The library's message tells an app what to pass to hit(); this is a command line.
        raise CommandError(
            f"limit {rule.name!r} has a billing quota, counted from the customer's billing "
            f"day: give it with --keys, e.g. --keys {day}=15 (a day of the month, 1 to 31).",
            USAGE_ERROR,
        ) from None


def run_reset(args: argparse.Namespace, out: TextIO, stdin: TextIO, err: TextIO) -> int:
    """``applimit reset``: confirm, then forget the subject's counts of each limit."""
    subject = _subject(args)
    limiter, url = _open(args)
    with limiter:
        tier = None if args.tier is None else limiter.core.tier(args.tier)
        chosen = _to_reset(limiter, args.limits, subject, tier)
        if not chosen:
            raise CommandError(
                f"no app limit counts {subject.describe()}; nothing to reset.", USAGE_ERROR
            )
        listed = ", ".join(rule.name for rule in chosen)
        what = f"{listed} for {subject.describe()}" + (f" (tier {tier})" if tier else "")
        if not args.yes:
            _confirm(what, url, stdin, err)
        done: list[str] = []
        for rule in chosen:
            identity = None if rule.per_ip else subject.user
            if not limiter.reset(rule.name, identity, tier=tier, ip=subject.ip, keys=subject.keys):
                raise _unreachable(url, done)
            done.append(rule.name)
    out.write(f"reset {what} in {url}\n")
    return OK


def _to_reset(
    limiter: Limiter, names: Sequence[str] | None, subject: Subject, tier: str | None
) -> list[AppRule]:
    """The limits to reset: those named (each must count the subject and, with a tier, give
    it a rate), or every limit that does."""
    chosen = []
    for rule in _rules(limiter, names):
        counted = counted_by(rule, subject, limiter.compiled.ipv6_prefix)
        problem = counted.skipped
        if problem is None and tier is not None and tier not in tiers_shown(rule, None, [tier]):
            problem = f"gives tier {tier!r} no rate or concurrency, so it counts nothing there"
        if problem is None:
            chosen.append(rule)
        elif names is not None:
            raise CommandError(f"limit {rule.name!r} {problem}.", USAGE_ERROR)
    return chosen


def _confirm(
    what: str, url: str, stdin: TextIO, err: TextIO, *, verb: str = "reset", lost: str = "counts"
) -> None:
    """Ask on a terminal; refuse when nobody can answer (a script must say --yes)."""
    if not stdin.isatty():
        raise CommandError(
            f"refusing to {verb} {what} without confirmation: stdin is not a terminal. "
            f"Pass --yes to {verb} from a script.",
            FAILED,
        )
    err.write(f"{verb.capitalize()} {what} in {url}? The {lost} are lost. [y/N] ")
    err.flush()
    answer = stdin.readline().strip().lower()
    if answer not in {"y", "yes"}:
        done = "reset" if verb == "reset" else f"{verb}d"
        raise CommandError(f"not {done}: the answer was not yes.", FAILED)


# --- overrides ---------------------------------------------------------------------------


def run_override(args: argparse.Namespace, out: TextIO, stdin: TextIO, err: TextIO) -> int:
    """``applimit override set|remove|list|log``."""
    limiter, url = _open(args)
    try:
        if args.action == "set":
            return _override_set(args, limiter, url, out)
        if args.action == "remove":
            return _override_remove(args, limiter, url, out, stdin=stdin, err=err)
        if args.action == "list":
            return _override_list(args, limiter, url, out)
        return _override_log(args, limiter, url, out)
    except BrokenPipeError:
        # An OSError too, but the reader of a pipe went away, not Redis (main says OK).
        raise
    except REDIS_FAILURES:
        raise _unreachable(url) from None
    finally:
        limiter.close()


def _identity(args: argparse.Namespace, limiter: Limiter) -> tuple[AppRule, str]:
    """The limit named by --limit and the identity (--user or --keys) it counts."""
    rule = limiter.core.rule(args.limit)
    subject = _subject(args)
    if rule.per_ip:
        raise CommandError(
            f"limit {rule.name!r} counts per client IP; an override names a user or an app key.",
            USAGE_ERROR,
        )
    if rule.per_key is not None:
        value = subject.keys.get(rule.per_key)
        hint = f"--keys {rule.per_key}=VALUE"
    else:
        value, hint = subject.user, "--user ID"
    extra = subject.ip is not None or len(subject.keys) + (subject.user is not None) != 1
    if value is None or extra:
        raise CommandError(
            f"limit {rule.name!r} counts per {rule.kind}: name exactly one identity with {hint}.",
            USAGE_ERROR,
        )
    return rule, value


def _by(args: argparse.Namespace) -> str:
    if args.by is not None:
        return str(args.by)
    try:
        # $LOGNAME, $USER, then the password database: a container's root has no $USER.
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _until(args: argparse.Namespace) -> dict[str, Any]:
    if args.ttl is not None and args.expires is not None:
        raise CommandError("pass --ttl or --expires, not both.", USAGE_ERROR)
    if args.ttl is None and args.expires is None:
        raise CommandError("say how long: pass --ttl 30d or --expires 2027-06-30.", USAGE_ERROR)
    if args.ttl is not None:
        try:
            ttl = Duration.parse(args.ttl)
        except ValueError:
            raise CommandError(
                f"--ttl '{shown(args.ttl)}' is not a duration; e.g. --ttl 30d.", USAGE_ERROR
            ) from None
        return {"ttl": ttl.ms / 1000}
    try:
        return {"expires": override_expiry(args.expires)}
    except ValueError as error:
        raise CommandError(f"--expires: {shown(str(error))}.", USAGE_ERROR) from None


def _quotas(given: list[str] | None) -> dict[str, int] | None:
    """``--quota month=2000000`` (repeatable) as a dict, or None when none is given."""
    if not given:
        return None
    found: dict[str, int] = {}
    for text in given:
        period, _, units = text.partition("=")
        units = units.strip()
        if not (units.isascii() and units.isdigit()) or period.strip() in found:
            raise CommandError(
                f"--quota '{shown(text)}' is not PERIOD=UNITS given once per period; e.g. "
                "--quota month=2000000.",
                USAGE_ERROR,
            )
        found[period.strip()] = int(units)
    return found


def _override_set(args: argparse.Namespace, limiter: Limiter, url: str, out: TextIO) -> int:
    rule, value = _identity(args, limiter)
    if not (args.rates or args.quotas or args.concurrency is not None):
        raise CommandError(
            "say what the identity gets: --rate 1000/1m, --quota month=2000000 or "
            "--concurrency 8 (or several).",
            USAGE_ERROR,
        )
    done = limiter.overrides.set(
        rule.name,
        value,
        rates=args.rates,
        quotas=_quotas(args.quotas),
        concurrency=args.concurrency,
        reason=args.reason,
        by=_by(args),
        **_until(args),
    )
    out.write(f"set {done.describe()}: {done.gives()} until {_when(done.expires)} in {url}\n")
    return OK


def _override_remove(
    args: argparse.Namespace,
    limiter: Limiter,
    url: str,
    out: TextIO,
    *,
    stdin: TextIO,
    err: TextIO,
) -> int:
    rule, value = _identity(args, limiter)
    what = f"the override of limit {rule.name!r} for {rule.kind} '{shown(value)}'"
    if not args.yes:
        _confirm(what, url, stdin, err, verb="remove", lost="override's limits")
    if not limiter.overrides.remove(rule.name, value, by=_by(args), reason=args.reason):
        raise CommandError(f"{what} is not set in {url}; nothing was removed.", FAILED)
    now = time.time()
    contract = next(
        (
            o
            for o in limiter.file_overrides
            if (o.limit, o.value) == (rule.name, value) and _status(limiter, o, now)[0] == IN_FORCE
        ),
        None,
    )
    then = (
        "its tier's limits apply"
        if contract is None
        else f"the policy file's override applies ({contract.gives()} until "
        f"{_when(contract.expires)})"
    )
    out.write(f"removed {what} in {url}: {then}\n")
    return OK


def _when(moment: float) -> str:
    try:
        return dt.datetime.fromtimestamp(moment, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        # A time no calendar holds (a document written by hand): the number itself.
        return f"{moment:g} (no date)"


NOT_APPLIED = "not applied"


def _status(limiter: Limiter, override: Override, now: float) -> tuple[str, str | None]:
    """An override's status as the limiter would decide now, and why it does not apply
    where the policy cannot take it (a limit changed since it was set)."""
    found = status(override, now)
    if found != IN_FORCE:
        return found, None
    why = unfit(limiter.compiled, override)
    return (IN_FORCE, None) if why is None else (NOT_APPLIED, why)


def _override_list(args: argparse.Namespace, limiter: Limiter, url: str, out: TextIO) -> int:
    stored = limiter.overrides.stored()
    now = time.time()
    found = [*stored, *limiter.file_overrides]
    if args.format == "json":
        documents = [
            {**o.document(), "expired": o.expires <= now, "status": _status(limiter, o, now)[0]}
            for o in found
        ]
        json.dump({"version": 1, "redis": url, "overrides": documents}, out, indent=2)
        out.write("\n")
        return OK
    if not found:
        out.write(f"no overrides in {url} or in the policy\n")
    for o in found:
        kind, why = _status(limiter, o, now)
        state = {
            IN_FORCE: f"until {_when(o.expires)}",
            EXPIRED: "expired",
            IGNORED: f"ignored: expires {_when(o.expires)}, further ahead than a set writes",
            NOT_APPLIED: f"not applied: {why}",
        }[kind]
        out.write(
            f"{o.limit} {o.kind} '{shown(o.value)}': {o.gives()} {state} "
            f"({o.source}, by {shown(o.by)}: {shown(o.reason)})\n"
        )
    return OK


def _override_log(args: argparse.Namespace, limiter: Limiter, url: str, out: TextIO) -> int:
    if not 1 <= args.count <= 10_000:
        raise CommandError("--count must be from 1 to 10000.", USAGE_ERROR)
    changes = limiter.overrides.log(args.count)
    if args.format == "json":
        documents = [change.document() for change in changes]
        json.dump({"version": 1, "redis": url, "changes": documents}, out, indent=2)
        out.write("\n")
        return OK
    if not changes:
        out.write(f"no override changes in {url}\n")
    for change in changes:
        target = "?" if change.override is None else change.override.describe()
        gives = (
            ""
            if change.override is None or change.op != "set"
            else (": " + change.override.gives())
        )
        out.write(
            f"{_when(change.at)} {change.op} {shown(target)}{gives} by {shown(change.by)}: "
            f"{shown(change.reason)}\n"
        )
    return OK


def main(  # noqa: PLR0911 (one exit code per kind of error, mapped in one place)
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run ``applimit``; returns the exit code (0 done, 1 failed, 2 usage error).

    The streams default to the process' own (tests pass theirs).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    inp = stdin or sys.stdin
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    # The limiter logs Redis failures for a long-running app; here the command says what
    # failed in its own message, so the log records would only repeat it on stderr.
    logger = logging.getLogger("applimit")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())
    try:
        if args.command == "usage":
            return run_usage(args, out)
        if args.command == "override":
            return run_override(args, out, inp, err)
        return run_reset(args, out, inp, err)
    except PolicyLoadError as error:
        write_diagnostics(error.diagnostics, err)
        err.write("applimit: error: the policy was not loaded\n")
        return FAILED
    except CommandError as error:
        err.write(f"applimit: error: {error}\n")
        return error.exit_code
    except ConfigurationError as error:
        err.write(f"applimit: error: {shown(str(error))}\n")
        return FAILED
    except ApplimitError as error:
        # Unknown limit or tier, an argument no limit can count: the command line is wrong.
        err.write(f"applimit: error: {shown(str(error))}\n")
        return USAGE_ERROR
    except KeyboardInterrupt:
        err.write("applimit: interrupted\n")
        return 130
    except BrokenPipeError:
        # `applimit usage ... | head` closes the pipe early; that is not an error.
        return OK
