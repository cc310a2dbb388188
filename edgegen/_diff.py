"""``edgegen diff``: what changes between two versions of a policy, for review.

First the meaning (limits added or removed, rates tightened or loosened by how much, tiers,
algorithms, shadow mode, failure policy, edge targets moving between a rule and the
Worker), then the change in every generated file as a unified diff. Pure, except
``load_version``, which reads a file or runs ``git show``.

Values that may hold secrets (``app.redis_url``) are reported as changed, never printed.
"""

from __future__ import annotations

import difflib
import html
import re
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import edgegen_policy as policy
from edgegen_policy import (
    App,
    AppLimit,
    AuthenticatedWhen,
    Clients,
    Cloudflare,
    CookieKey,
    CountWhen,
    Diagnostic,
    EdgeLimit,
    HeaderKey,
    JwtClaim,
    JwtKey,
    Limit,
    Match,
    Override,
    Policy,
    Rate,
    Worker,
)
from pydantic import BaseModel

from ._placement import check
from ._text import code, markdown_text, terminal_text
from .compiler._artifacts import Artifacts, Target
from .compiler._compile import build
from .errors import CompileError, UsageError

GIT_PREFIX = "git:"
# GitHub refuses comments over 65,536 characters; leave room for a plan beside the diff.
MAX_COMMENT_CHARS = 50_000


@dataclass(frozen=True, slots=True)
class Version:
    """One side of a diff: its label, the policy, and what it builds (or why it cannot)."""

    label: str
    policy: Policy
    artifacts: Artifacts | None
    build_error: str | None = None
    # The validity gate's errors (policy.check with the edge's checks): a version with any
    # is not diffed (the command fails, listing them).
    errors: tuple[Diagnostic, ...] = ()


@dataclass(frozen=True, slots=True)
class Change:
    """One semantic change. ``template`` has ``{0}``-style slots for ``args`` (names and
    values), which text output quotes and Markdown puts in code spans."""

    kind: str
    limit: str | None
    template: str
    args: tuple[str, ...] = ()

    def render(self, markdown: bool) -> str:
        """The sentence, with its names and values marked up for the output."""
        quoted = [code(a) if markdown else f"'{a}'" for a in self.args]
        return self.template.format(*quoted)


@dataclass(frozen=True, slots=True)
class FileDiff:
    """One generated file: ``added``, ``removed``, ``changed`` or ``unchanged``."""

    path: str
    status: str
    lines: tuple[str, ...] = ()

    @property
    def counts(self) -> tuple[int, int]:
        """Lines added and removed."""
        added = sum(1 for ln in self.lines if ln.startswith("+") and not ln.startswith("+++"))
        removed = sum(1 for ln in self.lines if ln.startswith("-") and not ln.startswith("---"))
        return added, removed


@dataclass(frozen=True, slots=True)
class PolicyDiff:
    """The result: semantic changes, then per-file diffs of the artifacts."""

    old: Version
    new: Version
    changes: tuple[Change, ...]
    files: tuple[FileDiff, ...] = field(default=())


# --- loading -------------------------------------------------------------------------


# git learned --end-of-options for rev-parse in 2.30: older versions would read it as a
# revision and fail, so the version is checked before it is relied on.
MIN_GIT = (2, 30)
# No revision holds control characters (refnames cannot; ``HEAD@{2 days ago}`` has spaces).
_UNSAFE_REF = re.compile(r"[\x00-\x1f\x7f]")


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run git with fixed arguments (never a shell); UsageError when git is not installed."""
    try:
        return subprocess.run(["git", *args], capture_output=True, check=False, timeout=60)
    except FileNotFoundError:
        raise UsageError(
            "reading git:REF:PATH needs git, which is not installed; give a file"
        ) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} did not finish in 60 s; give a file instead") from None


def _git_version() -> tuple[int, ...]:
    said = _git("version").stdout.decode("ascii", "replace")
    found = re.search(r"(\d+)\.(\d+)", said)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _first_line(result: subprocess.CompletedProcess[bytes]) -> str:
    said = result.stderr.decode("utf-8", "replace").strip().splitlines()
    return terminal_text(said[0]) if said else f"git exited with {result.returncode}"


def _git_show(spec: str) -> str:
    """The text of PATH at REF. REF is data: a ref that looks like an option is refused,
    and it is resolved to a commit (``rev-parse --verify --end-of-options REF^{commit}``)
    before the file is read by that commit's id, so git never reads it as an option."""
    rest = spec[len(GIT_PREFIX) :]
    ref, sep, path = rest.partition(":")
    if not sep or not ref or not path:
        raise UsageError(
            f"{spec!r} is not git:REF:PATH; write it like git:main:examples/policy.yaml "
            "(PATH from the repository's root, or ./PATH from here)"
        )
    if ref.startswith("-") or _UNSAFE_REF.search(ref):
        raise UsageError(
            f"{ref!r} in {spec!r} is not a git revision: it must not start with '-' and may "
            "not hold control characters; write a branch, tag or commit, like "
            "git:main:policy.yaml"
        )
    if _git_version() < MIN_GIT:
        raise UsageError(
            f"reading {spec} needs git {MIN_GIT[0]}.{MIN_GIT[1]} or later (git version shows "
            "the installed one); upgrade git or give a file"
        )
    resolved = _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    commit = resolved.stdout.decode("ascii", "replace").strip()
    if resolved.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        raise UsageError(
            f"cannot read {spec}: {ref!r} names no commit; check that the ref {ref!r} exists "
            f"(git log {ref})"
        )
    result = _git("cat-file", "blob", f"{commit}:{path}")
    if result.returncode != 0:
        raise UsageError(
            f"cannot read {spec}: {_first_line(result)}; check that the ref {ref!r} exists "
            f"(git log {ref}) and that {path!r} is in it (git ls-tree -r {ref} --name-only)"
        )
    try:
        return result.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{spec} is not UTF-8 text; a policy file is UTF-8") from None


def load_version(spec: str) -> Version:
    """Load a policy from a path or ``git:REF:PATH``, run the validity gate on it, and build
    it (a failed build is kept). A version the gate stops carries its ``errors`` and no
    build; one whose Worker needs Jinja, where the edge extra is not installed, is compared
    as a policy only."""
    if spec.startswith(GIT_PREFIX):
        loaded = policy.loads(_git_show(spec), spec)
    else:
        loaded = policy.load(spec)
    checked = check(loaded)
    if not checked.ok:
        count = len(checked.errors)
        return Version(
            spec, loaded, None, f"{count} error{'s' if count != 1 else ''}", checked.errors
        )
    try:
        return Version(spec, loaded, build(loaded))
    except CompileError as exc:
        return Version(spec, loaded, None, str(exc))
    except ModuleNotFoundError as exc:
        if exc.name != "jinja2":
            raise
        return Version(
            spec,
            loaded,
            None,
            "the Worker is built with Jinja, which comes with the edge extra "
            "(pip install 'edgegen[edge]'): generated artifacts are not compared",
        )


# --- the semantic diff ---------------------------------------------------------------


def _percent(old: Rate, new: Rate) -> str:
    change = (new.per_second / old.per_second - 1) * 100
    rounded = round(change)
    if rounded == 0 and change != 0:
        return f"{change:+.1f}%"
    return f"{rounded:+d}%"


def _rate_change(
    kind: str, limit: str, what: str, old: Rate, new: Rate, *, what_args: tuple[str, ...] = ()
) -> Change | None:
    """``what`` names the rate; its slots ``{1}``... are filled from ``what_args``."""
    if old == new:
        return None
    first = len(what_args) + 1
    values = f"{{{first}}} to {{{first + 1}}}"
    args = (limit, *what_args, str(old), str(new))
    if new.per_second < old.per_second:
        verb = "tightened"
    elif new.per_second > old.per_second:
        verb = "loosened"
    else:
        return Change(
            kind,
            limit,
            f"limit {{0}}: {what} keeps its rate but changes its window, {values}",
            args,
        )
    return Change(
        kind, limit, f"limit {{0}}: {what} {verb} from {values} ({_percent(old, new)})", args
    )


def _rates_text(rates: Sequence[Rate]) -> str:
    return " + ".join(str(r) for r in rates)


def _tier_changes(limit: str, old: AppLimit, new: AppLimit) -> list[Change]:
    out: list[Change] = []
    for tier in [*old.tiers, *(t for t in new.tiers if t not in old.tiers)]:
        if tier not in new.tiers:
            out.append(
                Change(
                    "tier_removed",
                    limit,
                    "limit {0}: tier {1} no longer has an app rate (was {2}): it is unlimited",
                    (limit, tier, _rates_text(old.tiers[tier])),
                )
            )
        elif tier not in old.tiers:
            out.append(
                Change(
                    "tier_added",
                    limit,
                    "limit {0}: tier {1} now has an app rate of {2}",
                    (limit, tier, _rates_text(new.tiers[tier])),
                )
            )
        else:
            before = sorted(old.tiers[tier], key=lambda r: r.period.ms)
            after = sorted(new.tiers[tier], key=lambda r: r.period.ms)
            if before == after:
                continue
            if len(before) == len(after):
                for a, b in zip(before, after, strict=True):
                    found = _rate_change(
                        "app_rate", limit, "app rate for tier {1}", a, b, what_args=(tier,)
                    )
                    if found is not None:
                        out.append(found)
            else:
                out.append(
                    Change(
                        "app_rate",
                        limit,
                        "limit {0}: app rates for tier {1} change from {2} to {3}",
                        (limit, tier, _rates_text(before), _rates_text(after)),
                    )
                )
    return out


def _quotas_text(app: AppLimit) -> str:
    """The calendar quotas of every tier: ``pro: 50000/month; free: 1000/day``, or none."""
    if not app.quotas:
        return "none"
    return "; ".join(f"{tier}: {q.text()}" for tier, q in app.quotas.items())


def _failure_policy(loaded: Policy, app: AppLimit) -> str:
    return (app.on_redis_error or loaded.app.on_redis_error).value


def _app_changes(
    old_policy: Policy, new_policy: Policy, limit: str, old: AppLimit, new: AppLimit
) -> list[Change]:
    out = _tier_changes(limit, old, new)
    simple = [
        ("algorithm", "algorithm", old.algorithm.value, new.algorithm.value),
        ("app_key", "app counts per", old.per.value, new.per.value),
        ("mode", "mode", old.mode.value, new.mode.value),
        ("burst", "burst", str(old.burst or "default"), str(new.burst or "default")),
        ("quotas", "quotas", _quotas_text(old), _quotas_text(new)),
        ("quota_timezone", "the quotas' time zone", old.quota_timezone, new.quota_timezone),
        (
            "billing_day_from",
            "the billing day's key",
            str(old.billing_day_from or "none"),
            str(new.billing_day_from or "none"),
        ),
        # Requests of one caller at once: 3, "free: 1, pro: 4", or none.
        ("concurrency", "concurrency", _value_text(old.concurrency), _value_text(new.concurrency)),
        ("lease", "lease", str(old.lease), str(new.lease)),
    ]
    for kind, what, a, b in simple:
        if a != b:
            out.append(
                Change(
                    kind, limit, f"limit {{0}}: {what} changed from {{1}} to {{2}}", (limit, a, b)
                )
            )
    if old.enforce != new.enforce:
        text = (
            "limit {0}: now enforced (was shadow mode: it reported but never denied)"
            if new.enforce
            else "limit {0}: now in shadow mode (enforce: false): it reports but never denies"
        )
        out.append(Change("shadow", limit, text, (limit,)))
    if old.middleware != new.middleware:
        text = (
            "limit {0}: now applied by the middleware to every request its match covers"
            if new.middleware
            else "limit {0}: no longer applied by the middleware (middleware: false); only "
            "code that names it applies it"
        )
        out.append(Change("middleware", limit, text, (limit,)))
    a = _failure_policy(old_policy, old)
    b = _failure_policy(new_policy, new)
    if a != b:
        out.append(
            Change(
                "failure_policy",
                limit,
                "limit {0}: when Redis cannot answer, it now fails "
                + ("open" if b == "allow" else "closed")
                + " ({1}, was {2})",
                (limit, b, a),
            )
        )
    return out


def _timeout_text(edge: EdgeLimit) -> str:
    return str(edge.timeout) if edge.timeout is not None else "default"


def _rate_text(rate: Rate | None) -> str:
    return str(rate) if rate is not None else "default"


def _edge_key_text(edge: EdgeLimit) -> str:
    """What an edge limit counts by, in a diff: ip, ip_nat, or the key and its source."""
    per = edge.per
    if isinstance(per, JwtKey):
        jwt = per.jwt
        where = f"cookie {jwt.cookie}" if jwt.cookie else f"header {jwt.token_header}"
        how = f"secret {jwt.secret}" if jwt.secret else f"JWKS {jwt.jwks}"
        return f"JWT claim {jwt.claim} ({where}, {how})"
    if isinstance(per, HeaderKey):
        return f"header {per.header}"
    if isinstance(per, CookieKey):
        return f"cookie {per.cookie}"
    return per.value


def _yes_no(value: bool) -> str:
    return "on" if value else "off"


def _edge_changes(limit: str, old: EdgeLimit, new: EdgeLimit) -> list[Change]:
    out: list[Change] = []
    found = _rate_change("edge_rate", limit, "edge rate", old.rate, new.rate)
    if found is not None:
        out.append(found)
    was, now = old.credentialed_rate, new.credentialed_rate
    if was is not None and now is not None:
        found = _rate_change("edge_credentialed_rate", limit, "edge credentialed rate", was, now)
        if found is not None:
            out.append(found)
    elif was != now:
        # Left out, it is ten times the rate: say "default", as for the timeout.
        out.append(
            Change(
                "edge_credentialed_rate",
                limit,
                "limit {0}: edge credentialed rate changed from {1} to {2}",
                (limit, _rate_text(was), _rate_text(now)),
            )
        )
    pairs = [
        ("edge_action", "edge action", old.action.value, new.action.value),
        ("edge_timeout", "edge timeout", _timeout_text(old), _timeout_text(new)),
        ("edge_target_setting", "edge target setting", old.target.value, new.target.value),
        ("edge_key", "edge counts per", _edge_key_text(old), _edge_key_text(new)),
        ("edge_tiers", "edge tiers", _yes_no(old.tiers), _yes_no(new.tiers)),
    ]
    if isinstance(old.per, JwtKey) and isinstance(new.per, JwtKey):
        # What the Worker checks before it trusts a claim: a change here lets other
        # tokens in (or keeps valid ones out), so each has its own line.
        was_jwt, now_jwt = old.per.jwt, new.per.jwt
        pairs += [
            ("edge_jwt", f"the edge's JWT {what}", _value_text(a), _value_text(b))
            for what, a, b in [
                ("issuer", was_jwt.issuer, now_jwt.issuer),
                ("audience", was_jwt.audience, now_jwt.audience),
                ("leeway", was_jwt.leeway, now_jwt.leeway),
                ("tier claim", was_jwt.tier, now_jwt.tier),
            ]
        ]
    for kind, what, a, b in pairs:
        if a != b:
            out.append(
                Change(
                    kind, limit, f"limit {{0}}: {what} changed from {{1}} to {{2}}", (limit, a, b)
                )
            )
    if old.unauthenticated_only != new.unauthenticated_only:
        text = (
            "limit {0}: the edge now counts only unauthenticated requests"
            if new.unauthenticated_only
            else "limit {0}: the edge now counts every request, signed in or not"
        )
        out.append(Change("edge_scope", limit, text, (limit,)))
    if old.requests_to_origin != new.requests_to_origin:
        text = (
            "limit {0}: the edge now counts only requests that reach the origin (cached "
            "responses no longer count)"
            if new.requests_to_origin
            else "limit {0}: the edge now counts every request, cached responses included"
        )
        out.append(Change("edge_counting", limit, text, (limit,)))
    return out


def _slots(count: int, first: int = 1) -> str:
    """``{1}, {2}, ...``: template slots for a list of values."""
    return ", ".join(f"{{{i}}}" for i in range(first, first + count))


def _match_changes(limit: str, old: Match, new: Match) -> list[Change]:
    out: list[Change] = []
    fields = [
        ("paths", old.paths, new.paths),
        ("path prefixes", old.path_prefix, new.path_prefix),
        ("methods", old.methods, new.methods),
        ("hosts", old.hosts, new.hosts),
    ]
    for what, a, b in fields:
        added = [x for x in b if x not in a]
        removed = [x for x in a if x not in b]
        if added:
            out.append(
                Change(
                    "match",
                    limit,
                    f"limit {{0}}: now also matches {what} {_slots(len(added))}",
                    (limit, *added),
                )
            )
        if removed:
            out.append(
                Change(
                    "match",
                    limit,
                    f"limit {{0}}: no longer matches {what} {_slots(len(removed))}",
                    (limit, *removed),
                )
            )
    return out


def _count_when_changes(limit: str, old: CountWhen | None, new: CountWhen | None) -> list[Change]:
    """A change of which answers count: every layer counts differently from then on."""
    if old == new:
        return []
    if old is None:
        assert new is not None
        text = (
            "limit {0}: now counts only answers with status {1} (checked before a request "
            "runs, counted after its answer); other answers no longer count"
        )
        return [Change("count_when", limit, text, (limit, new.describe()))]
    if new is None:
        text = "limit {0}: now counts every request (it counted only answers with status {1})"
        return [Change("count_when", limit, text, (limit, old.describe()))]
    text = "limit {0}: now counts answers with status {1} (was {2})"
    return [Change("count_when", limit, text, (limit, new.describe(), old.describe()))]


def _same_but_name(a: Limit, b: Limit) -> bool:
    return a.model_copy(update={"name": b.name}) == b


def _targets(artifacts: Artifacts | None) -> dict[str, Target]:
    if artifacts is None:
        return {}
    return {p.limit: p.target for p in artifacts.placements}


def _where(target: Target) -> str:
    return "a Cloudflare rule" if target is Target.RULE else "the Worker"


def _policy_level(old: Policy, new: Policy) -> list[Change]:
    out: list[Change] = []
    old_cf, new_cf = old.cloudflare, new.cloudflare
    old_plan = old_cf.plan.value if old_cf else "none"
    new_plan = new_cf.plan.value if new_cf else "none"
    if old_plan != new_plan:
        out.append(
            Change("plan", None, "the zone's plan changed from {0} to {1}", (old_plan, new_plan))
        )
    old_worker = old_cf.worker if old_cf else None
    new_worker = new_cf.worker if new_cf else None
    if old_worker is None and new_worker is not None:
        out.append(Change("worker", None, "a Worker is configured: {0}", (new_worker.name,)))
    elif old_worker is not None and new_worker is None:
        out.append(
            Change("worker", None, "the Worker {0} is no longer configured", (old_worker.name,))
        )
    elif old_worker is not None and new_worker is not None:
        if old_worker.name != new_worker.name:
            out.append(
                Change(
                    "worker",
                    None,
                    "the Worker is renamed from {0} to {1}",
                    (old_worker.name, new_worker.name),
                )
            )
        for route in new_worker.routes:
            if route not in old_worker.routes:
                out.append(
                    Change("worker_route", None, "the Worker now also runs on {0}", (route,))
                )
        for route in old_worker.routes:
            if route not in new_worker.routes:
                out.append(
                    Change("worker_route", None, "the Worker no longer runs on {0}", (route,))
                )
    for tier in new.tiers:
        if tier not in old.tiers:
            out.append(Change("tiers", None, "tier {0} is added", (tier,)))
    for tier in old.tiers:
        if tier not in new.tiers:
            out.append(Change("tiers", None, "tier {0} is removed", (tier,)))
    common_old = [t for t in old.tiers if t in new.tiers]
    common_new = [t for t in new.tiers if t in old.tiers]
    if common_old != common_new:
        out.append(
            Change(
                "tiers",
                None,
                "tiers are reordered: {0} (least to most generous)",
                (" < ".join(new.tiers),),
            )
        )
    if old.clients.ipv6_prefix != new.clients.ipv6_prefix:
        out.append(
            Change(
                "ipv6_prefix",
                None,
                "IPv6 clients are now counted per {0} network (was {1})",
                (f"/{new.clients.ipv6_prefix}", f"/{old.clients.ipv6_prefix}"),
            )
        )
    if old.authenticated_when != new.authenticated_when:
        when = new.authenticated_when
        creds = [f"header {h}" for h in when.headers] + [f"cookie {c}" for c in when.cookies]
        out.append(
            Change(
                "authenticated_when",
                None,
                "a request now counts as authenticated with {0}",
                (", ".join(creds) or "no credentials",),
            )
        )
    if old.app.on_redis_error != new.app.on_redis_error:
        b = new.app.on_redis_error.value
        out.append(
            Change(
                "failure_policy",
                None,
                "the app's default when Redis cannot answer is now to fail "
                + ("open" if b == "allow" else "closed")
                + " ({0}, was {1})",
                (b, old.app.on_redis_error.value),
            )
        )
    if old.app.timeout != new.app.timeout:
        out.append(
            Change(
                "app_timeout",
                None,
                "the app waits at most {0} for Redis (was {1})",
                (str(new.app.timeout), str(old.app.timeout)),
            )
        )
    if old.app.key_prefix != new.app.key_prefix:
        out.append(
            Change(
                "key_prefix",
                None,
                "Redis keys move from prefix {0} to {1}: counts start again from zero",
                (old.app.key_prefix, new.app.key_prefix),
            )
        )
    if old.app.redis_url != new.app.redis_url:
        # The URL may carry a password: say that it changed, not what it is.
        out.append(
            Change("redis_url", None, "app.redis_url changed (not shown: it may hold a password)")
        )
    return out


def semantic_changes(old: Version, new: Version) -> list[Change]:
    """Every change in meaning from ``old`` to ``new``, policy-wide first, then per limit."""
    out = _policy_level(old.policy, new.policy)
    old_limits = {limit.name: limit for limit in old.policy.limits}
    new_limits = {limit.name: limit for limit in new.policy.limits}
    removed = [n for n in old_limits if n not in new_limits]
    added = [n for n in new_limits if n not in old_limits]
    renamed: dict[str, str] = {}
    for gone in removed:
        for came in added:
            if came not in renamed.values() and _same_but_name(old_limits[gone], new_limits[came]):
                renamed[gone] = came
                break
    kept_old = [renamed.get(n, n) for n in old_limits if n in new_limits or n in renamed]
    kept_new = [n for n in new_limits if n in old_limits or n in renamed.values()]
    if kept_old != kept_new:
        # The edge checks a request against its rules (and the Worker its limits) in the
        # policy's order, and the first to refuse ends it: an order is a change of meaning.
        # The app decides all of a request's limits at once, so there it changes none.
        edged = [n for n in kept_new if new_limits[n].edge is not None]
        was_edged = [n for n in kept_old if new_limits[n].edge is not None]
        why = (
            "the edge checks a request in this order; the first to refuse it decides"
            if edged != was_edged
            else "the app decides a request's limits all at once: no decision changes"
        )
        out.append(
            Change(
                "limits_reordered",
                None,
                f"limits are reordered: {{0}} ({why})",
                (", ".join(kept_new),),
            )
        )
    for gone, came in renamed.items():
        out.append(
            Change(
                "limit_renamed",
                came,
                "limit {0} is renamed to {1}: its rule, Worker binding and Redis keys are new, so "
                "its counts start again from zero",
                (gone, came),
            )
        )
    for name in removed:
        if name not in renamed:
            out.append(Change("limit_removed", name, "limit {0} is removed", (name,)))
    for name in added:
        if name not in renamed.values():
            out.append(
                Change(
                    "limit_added",
                    name,
                    "limit {0} is added: {1}",
                    (name, _describe(new_limits[name])),
                )
            )
    old_targets, new_targets = _targets(old.artifacts), _targets(new.artifacts)
    for name, limit in new_limits.items():
        before = old_limits.get(name)
        if before is None:
            continue
        if before.edge is None and limit.edge is not None:
            out.append(
                Change(
                    "edge_added",
                    name,
                    "limit {0} now also has an edge limit of {1}",
                    (name, str(limit.edge.rate)),
                )
            )
        elif before.edge is not None and limit.edge is None:
            out.append(
                Change(
                    "edge_removed",
                    name,
                    "limit {0} no longer has an edge limit (was {1})",
                    (name, str(before.edge.rate)),
                )
            )
        elif before.edge is not None and limit.edge is not None:
            out.extend(_edge_changes(name, before.edge, limit.edge))
        if before.app is None and limit.app is not None:
            out.append(Change("app_added", name, "limit {0} now also has app limits", (name,)))
        elif before.app is not None and limit.app is None:
            out.append(Change("app_removed", name, "limit {0} no longer has app limits", (name,)))
        elif before.app is not None and limit.app is not None:
            out.extend(_app_changes(old.policy, new.policy, name, before.app, limit.app))
        out.extend(_match_changes(name, before.match, limit.match))
        out.extend(_count_when_changes(name, before.count_when, limit.count_when))
        if before.description != limit.description:
            out.append(Change("description", name, "limit {0}: the description changed", (name,)))
        was, now = old_targets.get(name), new_targets.get(name)
        if was is not None and now is not None and was is not now:
            out.append(
                Change(
                    "target_moved",
                    name,
                    f"limit {{0}} moves from {_where(was)} to {_where(now)}",
                    (name,),
                )
            )
    out.extend(_override_changes(old.policy, new.policy))
    out.extend(_unsaid(None, "", old.policy, new.policy))
    for name, limit in new_limits.items():
        before = old_limits.get(name)
        if before is not None:
            out.extend(_unsaid(name, "", before, limit))
    return out


# The fields the comparisons above describe in their own words, by model. A field of two
# models of the same type is walked into; any other field that differs and is not listed
# here is named by its path (``_unsaid``), so a field the policy gains is never left out of
# a review (tests/edgegen/test_diff_fields.py changes every field alone to keep it so).
_SAID: dict[type[BaseModel], frozenset[str]] = {
    Policy: frozenset(
        {"version", "cloudflare", "authenticated_when", "tiers", "limits", "overrides"}
    ),
    Cloudflare: frozenset({"plan", "worker"}),
    Worker: frozenset({"name", "routes"}),
    AuthenticatedWhen: frozenset({"headers", "cookies"}),
    Clients: frozenset({"ipv6_prefix"}),
    App: frozenset({"redis_url", "key_prefix", "on_redis_error", "timeout", "override_refresh"}),
    Limit: frozenset({"name", "description", "edge", "app", "count_when"}),
    Match: frozenset({"paths", "path_prefix", "methods", "hosts"}),
    CountWhen: frozenset({"status"}),
    EdgeLimit: frozenset(
        {
            "rate",
            "per",
            "action",
            "timeout",
            "unauthenticated_only",
            "credentialed_rate",
            "target",
            "tiers",
            "requests_to_origin",
        }
    ),
    HeaderKey: frozenset({"header"}),
    CookieKey: frozenset({"cookie"}),
    JwtClaim: frozenset(
        {"claim", "header", "cookie", "secret", "jwks", "issuer", "audience", "leeway", "tier"}
    ),
    AppLimit: frozenset(
        {
            "per",
            "algorithm",
            "tiers",
            "burst",
            "enforce",
            "on_redis_error",
            "mode",
            "concurrency",
            "lease",
            "middleware",
            "quotas",
            "quota_timezone",
            "billing_day_from",
        }
    ),
}


# A field whose name says it may hold a credential: its change is named, its values never.
_SECRET_FIELD = re.compile(r"url|token|password|secret|credential|private", re.IGNORECASE)


def _value_text(value: object) -> str:
    """A field's value as a reviewer reads it: ``none``, ``30s``, ``free: 1, pro: 4``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ", ".join(_value_text(v) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_value_text(v)}" for k, v in value.items()) or "none"
    if isinstance(value, BaseModel):
        return _value_text(value.model_dump(mode="json", exclude_defaults=True))
    return str(getattr(value, "value", value))


def _unsaid(limit: str | None, path: str, old: BaseModel, new: BaseModel) -> list[Change]:
    """Every field of ``old`` and ``new`` that differs and that no comparison above
    describes, named by its path under the limit (or the policy) with both values."""
    out: list[Change] = []
    said = _SAID.get(type(old), frozenset())
    for name in type(old).model_fields:
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        where = f"{path}.{name}" if path else name
        if isinstance(a, BaseModel) and type(a) is type(b):
            out.extend(_unsaid(limit, where, a, b))
        elif name not in said:
            if _SECRET_FIELD.search(name):
                values = (where, "not shown", "not shown")
            else:
                values = (where, _value_text(a), _value_text(b))
            if limit is None:
                out.append(Change("field", None, "{0} changed from {1} to {2}", values))
            else:
                text = "limit {0}: {1} changed from {2} to {3}"
                out.append(Change("field", limit, text, (limit, *values)))
    return out


def _override_text(entry: Override) -> str:
    return f"{entry.gives()} until {entry.expires} ({entry.reason})"


def _override_changes(old: Policy, new: Policy) -> list[Change]:
    """Added, removed and changed ``overrides:``, each by its limit and identity, and a
    change of how often the app reads the run-time ones."""
    out: list[Change] = []
    was, now = old.app.override_refresh, new.app.override_refresh
    if was != now:
        out.append(
            Change(
                "override_refresh",
                None,
                "the app reads run-time overrides {0} (was {1})",
                (f"every {now}" if now else "never", f"every {was}" if was else "never"),
            )
        )
    before = {(o.limit, o.kind, o.value): o for o in old.overrides}
    after = {(o.limit, o.kind, o.value): o for o in new.overrides}
    for key, entry in after.items():
        limit, kind, value = key
        previous = before.get(key)
        who = f"{kind} {value}"
        if previous is None:
            out.append(
                Change(
                    "override_added",
                    limit,
                    "limit {0}: an override for {1} is added: {2}",
                    (limit, who, _override_text(entry)),
                )
            )
        elif previous != entry:
            out.append(
                Change(
                    "override_changed",
                    limit,
                    "limit {0}: the override for {1} changes from {2} to {3}",
                    (limit, who, _override_text(previous), _override_text(entry)),
                )
            )
    for key, entry in before.items():
        if key not in after:
            limit, kind, value = key
            out.append(
                Change(
                    "override_removed",
                    limit,
                    "limit {0}: the override for {1} is removed (was {2}): the tier's limits apply",
                    (limit, f"{kind} {value}", _override_text(entry)),
                )
            )
    return out


def _describe(limit: Limit) -> str:
    parts = []
    if limit.edge is not None:
        parts.append(f"edge {limit.edge.rate} {limit.edge.action.value}")
    if limit.app is not None:
        tiers = ", ".join(f"{t} {_rates_text(r)}" for t, r in limit.app.tiers.items())
        parts.append(f"app {limit.app.algorithm.value} ({tiers})")
    if limit.count_when is not None:
        parts.append(f"counting answers with status {limit.count_when.describe()}")
    return "; ".join(parts)


def file_diffs(old: Artifacts | None, new: Artifacts | None) -> list[FileDiff]:
    """A unified diff of every file the two builds write."""
    a = old.files() if old else {}
    b = new.files() if new else {}
    out = []
    for path in sorted(set(a) | set(b)):
        before = a.get(path)
        after = b.get(path)
        if before == after:
            out.append(FileDiff(path, "unchanged"))
            continue
        status = "added" if before is None else "removed" if after is None else "changed"
        lines = difflib.unified_diff(
            (before or "").splitlines(),
            (after or "").splitlines(),
            fromfile=f"a/{path}" if before is not None else "/dev/null",
            tofile=f"b/{path}" if after is not None else "/dev/null",
            lineterm="",
        )
        out.append(FileDiff(path, status, tuple(lines)))
    return out


def diff(old: Version, new: Version) -> PolicyDiff:
    """The semantic changes and the artifact diff between two versions.

    When either side does not build, there are no artifacts to compare (an empty side
    would read as "every file removed"), so ``files`` is empty and the outputs say why.
    """
    changes = tuple(semantic_changes(old, new))
    if old.artifacts is None or new.artifacts is None:
        return PolicyDiff(old, new, changes)
    return PolicyDiff(old, new, changes, tuple(file_diffs(old.artifacts, new.artifacts)))


def has_changes(result: PolicyDiff) -> bool:
    """Whether anything changes: in meaning, or in a generated file (``--detailed-exitcode``).

    A version that does not build while the other does is a change too, though no file
    can be compared.
    """
    if result.changes or _changed_files(result):
        return True
    return (result.old.build_error is None) != (result.new.build_error is None)


def _comparable(result: PolicyDiff) -> bool:
    return result.old.artifacts is not None and result.new.artifacts is not None


# --- output --------------------------------------------------------------------------


def _changed_files(result: PolicyDiff) -> list[FileDiff]:
    return [f for f in result.files if f.status != "unchanged"]


def _build_notes(result: PolicyDiff) -> list[tuple[str, str]]:
    notes = []
    for version in (result.old, result.new):
        if version.build_error is not None:
            notes.append((version.label, version.build_error))
    return notes


def to_text(result: PolicyDiff) -> str:
    """The diff for a terminal."""
    out = [f"edgegen diff {result.old.label} -> {result.new.label}", ""]
    count = len(result.changes)
    if count:
        out.append(f"Policy changes ({count}):")
        out.extend(f"  - {c.render(markdown=False)}" for c in result.changes)
    else:
        out.append("Policy changes: none")
    out.append("")
    for label, error in _build_notes(result):
        out.append(f"{label} does not build:")
        out.extend(f"  {line}" for line in error.splitlines())
        out.append("")
    changed = _changed_files(result)
    if not _comparable(result):
        out.append("Generated artifacts: not compared, since one version does not build")
    elif not changed:
        out.append("Generated artifacts: no changes")
    else:
        out.append("Generated artifacts:")
        for item in changed:
            added, removed = item.counts
            out.append(f"  {item.path}: {item.status} (+{added} -{removed})")
        for item in changed:
            out.append("")
            out.extend(item.lines)
    return terminal_text("\n".join(out) + "\n")


DIFF_FORMAT = 1


def _side(version: Version) -> dict[str, Any]:
    return {
        "label": version.label,
        "builds": version.build_error is None,
        "build_error": version.build_error,
    }


def to_json(result: PolicyDiff) -> dict[str, Any]:
    """The diff as data for ``--format json`` (its shape is in docs/zone.md).

    Each change has its ``kind`` (stable names, e.g. ``edge_rate``), the ``limit`` it is
    about (None for policy-wide changes), the ``message`` as the text output writes it, and
    the names and values the message quotes as ``values``.
    """
    comparable = _comparable(result)
    files = []
    for item in result.files if comparable else ():
        added, removed = item.counts
        files.append(
            {
                "path": item.path,
                "status": item.status,
                "added": added,
                "removed": removed,
                "diff": list(item.lines),
            }
        )
    return {
        "format": DIFF_FORMAT,
        "old": _side(result.old),
        "new": _side(result.new),
        "changed": has_changes(result),
        "changes": [
            {
                "kind": change.kind,
                "limit": change.limit,
                "message": change.render(markdown=False),
                "values": list(change.args),
            }
            for change in result.changes
        ],
        "artifacts": {"compared": comparable, "files": files},
    }


def _fence(lines: Iterable[str]) -> str:
    longest = 2
    for line in lines:
        run = 0
        for char in line:
            run = run + 1 if char == "`" else 0
            longest = max(longest, run)
    return "`" * (longest + 1)


def to_markdown(result: PolicyDiff) -> str:
    """The diff for a pull request comment: changes as a list, files collapsed."""
    out = [f"### Policy diff: {code(result.old.label)} → {code(result.new.label)}", ""]
    if result.changes:
        count = len(result.changes)
        out.append(f"**{count} change{'s' if count != 1 else ''} in meaning:**")
        out.append("")
        out.extend(f"- {c.render(markdown=True)}" for c in result.changes)
    else:
        out.append("No change in meaning.")
    for label, error in _build_notes(result):
        out.extend(["", f"> **{code(label)} does not build:**"])
        # The error names limits and paths from the policy: plain text, never markup.
        out.extend(f"> {markdown_text(line)}" for line in error.splitlines())
    out.extend(["", "#### Generated artifacts", ""])
    changed = _changed_files(result)
    if not _comparable(result):
        out.append("Not compared, since one version does not build.")
        return "\n".join(out) + "\n"
    if not changed:
        out.append("No changes.")
        return "\n".join(out) + "\n"
    out.extend(["| file | change |", "|---|---|"])
    for item in changed:
        added, removed = item.counts
        cell = code(item.path).replace("|", "\\|")
        out.append(f"| {cell} | {item.status} (+{added} −{removed}) |")
    budget = MAX_COMMENT_CHARS - sum(len(line) + 1 for line in out)
    for item in changed:
        fence = _fence(item.lines)
        lines, cut = _fit(item.lines, budget - 200)
        budget -= sum(len(line) + 1 for line in lines) + 200
        section = [
            "",
            f"<details><summary><code>{html.escape(item.path)}</code></summary>",
            "",
            f"{fence}diff",
            *lines,
            fence,
        ]
        if cut:
            section.append(
                f"{cut} more line(s) not shown, to fit a comment; run edgegen diff locally "
                "for all of it."
            )
        out.extend([*section, "", "</details>"])
    return "\n".join(out) + "\n"


def _fit(lines: Sequence[str], budget: int) -> tuple[list[str], int]:
    """As many lines as fit in ``budget`` characters, and how many were left out."""
    kept: list[str] = []
    used = 0
    for line in lines:
        used += len(line) + 1
        if used > budget:
            break
        kept.append(line)
    return kept, len(lines) - len(kept)
