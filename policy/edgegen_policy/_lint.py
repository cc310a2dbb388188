"""The lint pass: checks that need the whole policy, each with a stable code and severity.

Codes are part of the public contract (CI configurations filter on them). An error makes
the policy invalid; "stops" names the layers it also makes impossible (``Diagnostic.stops``,
which ``policy.check`` reads to decide whether a layer can go ahead):

======  ========  =========  ====================================================
code    severity  stops      meaning
======  ========  =========  ====================================================
L001    error     app, edge  two limits have the same name (edge: two edge limits)
L002    error     app        an app limit names a tier that ``tiers`` does not list
L003    warning              a ``${VAR}`` without default is not set in the environment
L004    error     edge       edge limits are defined but there is no ``cloudflare`` section
L005    error     app        an app limit's ``per`` names no usable key (not a lower-case
                             identifier, or a built-in key in another case)
L006    error     app        an override names a limit that has no app part
L007    error     app        an override names another kind of identity than its limit counts
L008    error     app        two overrides name one limit and identity
L009    error     app        an override gives what its limit cannot count (rates, quotas or
                             concurrency on a limit without any, a billing quota without
                             billing_day_from, concurrency in approximate mode)
L101    warning              a higher tier gets less than a lower one
L102    warning              an edge limit is stricter than the app's lowest tier on its route
L103    warning              a sliding log whose limit makes memory per identity large
L104    warning              two limits have identical matchers
L105    info                 two limits' matchers overlap (a request counts against both)
L106    warning              an app limit gives no rate for some tier (that tier is unlimited)
L107    info                 a limit runs in shadow mode (enforce: false)
L108    warning              unauthenticated_only with no credentials in authenticated_when
L109    error                an edge credentialed_rate that is not looser than the limit's rate
L110    warning              an edge credentialed_rate that nothing uses
L111    info                 a limit counts per an app key in the app, per IP at the edge
L112    info                 app.redis_url is memory://: each process counts alone
L020    error     app        an app limit's quota_timezone is not in the time zone database
L120    warning              a calendar quota below a rate whose period fits in the quota's
L113    warning              an override is looser than the limit's highest tier (rates,
                             quotas or concurrency)
L114    warning              an override has expired
======  ========  =========  ====================================================

Checks that know more than the policy are contributed by their owner, as ``checks``
(functions from a Policy to Diagnostics, made with :func:`diagnostic_at`): edgegen
contributes L201-L210, what the zone's Cloudflare plan can express, decided by the same
placement its compiler uses (``edgegen/_placement.py`` lists them). The policy package
never imports edgegen.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable

from ._calendar import SHORTEST_PERIOD_MS, UnknownTimeZoneError, time_zone
from ._edge import credentialed_rate
from ._errors import Diagnostic, Layer, Severity
from ._loader import FieldPath, format_path
from ._model import AppLimit, CookieKey, EdgeLimit, HeaderKey, JwtKey, Limit, Override, Policy
from ._vocab import Algorithm, AppKey, Duration, KeyName, Mode, Rate

# A check contributed by a consumer of the policy (edgegen's placement): it returns its
# findings, each made with diagnostic_at so that it names its place in the file.
Check = Callable[[Policy], Iterable[Diagnostic]]

# Above this, a sliding log costs more Redis memory per identity than users expect; the
# sorted set leaves its compact listpack encoding after 128 entries (see docs/policy.md).
SLIDING_LOG_MEMORY_WARN_BYTES = 32 * 1024
_LISTPACK_MAX_ENTRIES = 128
_LISTPACK_BYTES_PER_ENTRY = 40
_SKIPLIST_BYTES_PER_ENTRY = 140


def sliding_log_bytes(limit: int) -> int:
    """Estimated Redis memory of a full sliding log of ``limit`` entries (Redis 7)."""
    per_entry = (
        _LISTPACK_BYTES_PER_ENTRY if limit <= _LISTPACK_MAX_ENTRIES else _SKIPLIST_BYTES_PER_ENTRY
    )
    return limit * per_entry


def allowance(rates: tuple[Rate, ...], window_ms: int) -> float:
    """The most requests a set of rates admits in a window of ``window_ms`` (all must hold)."""
    best = float("inf")
    for rate in rates:
        periods = max(1.0, window_ms / rate.period.ms)
        best = min(best, rate.limit * periods)
    return best


def diagnostic_at(
    policy: Policy,
    path: FieldPath,
    code: str,
    severity: Severity,
    message: str,
    *,
    limit: str | None = None,
    fix: str = "",
    stops: Iterable[Layer] = (),
) -> Diagnostic:
    """A diagnostic about the field at ``path`` (``("limits", 0, "edge")``) of a policy.

    It names the file, and the line and column of the field (or of its nearest ancestor
    written in the file) when the policy was loaded from text.
    """
    source = policy._source
    pos = source.locate(path) if source else None
    return Diagnostic(
        message=message,
        code=code,
        severity=severity,
        file=source.file if source else None,
        line=pos.line if pos else None,
        column=pos.column if pos else None,
        path=format_path(path),
        limit=limit,
        fix=fix,
        stops=frozenset(stops),
    )


class _Linter:
    def __init__(self, policy: Policy, checks: Iterable[Check]) -> None:
        self.policy = policy
        self.source = policy._source
        self.checks = tuple(checks)
        self.found: list[Diagnostic] = []

    def add(
        self,
        code: str,
        severity: Severity,
        path: FieldPath,
        message: str,
        limit: str | None = None,
        *,
        fix: str = "",
        stops: Iterable[Layer] = (),
    ) -> None:
        self.found.append(
            diagnostic_at(
                self.policy, path, code, severity, message, limit=limit, fix=fix, stops=stops
            )
        )

    def run(self) -> list[Diagnostic]:
        self.env()
        self.store()
        self.names()
        self.cloudflare()
        for index, limit in enumerate(self.policy.limits):
            if limit.app is not None:
                self.app_limit(index, limit, limit.app)
                self.app_key(index, limit, limit.app)
            if limit.edge is not None:
                self.edge_limit(index, limit)
        self.matchers()
        self.edge_versus_app()
        self.overrides()
        for contributed in self.checks:
            self.found.extend(contributed(self.policy))
        return sorted(self.found, key=lambda d: (d.line or 0, d.column or 0, d.code))

    def overrides(self) -> None:
        checker = _Overrides(self, time.time())
        for index, entry in enumerate(self.policy.overrides):
            checker.check(index, entry)

    def store(self) -> None:
        url = self.policy.app.redis_url
        if url.startswith("memory://") and any(limit.app for limit in self.policy.limits):
            self.add(
                "L112",
                Severity.INFO,
                ("app", "redis_url"),
                f"app.redis_url is {url}: each process counts on its own, in its memory (for "
                "an app's tests); every instance of a deployed app must share one Redis URL",
                None,
            )

    def env(self) -> None:
        if self.source is None:
            return
        for path, name in self.source.unset_env:
            self.add(
                "L003",
                Severity.WARNING,
                path,
                f"environment variable {name} is not set; set it, or give a default with "
                f"${{{name}:-value}}",
            )

    def names(self) -> None:
        first: dict[str, int] = {}
        # Names of edge limits seen so far: two edge limits of one name cannot be built
        # (they would share a rule ref and a binding); an edge and an app limit can.
        edge_names: set[str] = set()
        for index, limit in enumerate(self.policy.limits):
            if limit.name in first:
                stops = {Layer.APP}
                if limit.edge is not None and limit.name in edge_names:
                    stops.add(Layer.EDGE)
                self.add(
                    "L001",
                    Severity.ERROR,
                    ("limits", index, "name"),
                    f"limit name {limit.name!r} is already used by limits[{first[limit.name]}];"
                    " names must be unique (they name rules and Redis keys)",
                    limit.name,
                    fix="rename one of the limits",
                    stops=stops,
                )
            else:
                first[limit.name] = index
            if limit.edge is not None:
                edge_names.add(limit.name)

    def cloudflare(self) -> None:
        if self.policy.cloudflare is None:
            for index, limit in enumerate(self.policy.limits):
                if limit.edge is not None:
                    self.add(
                        "L004",
                        Severity.ERROR,
                        ("limits", index, "edge"),
                        f"limit {limit.name!r} has an edge part but the policy has no "
                        "'cloudflare' section; add one with the zone's plan",
                        limit.name,
                        fix="add cloudflare: { plan: ... }",
                        stops={Layer.EDGE},
                    )

    def _known_tiers(self, limit: Limit, path: FieldPath, tiers: Iterable[str]) -> None:
        """L002 for each tier of ``tiers`` (the keys at ``path``) the policy does not list."""
        known = self.policy.tiers
        for tier in tiers:
            if tier not in known:
                self.add(
                    "L002",
                    Severity.ERROR,
                    (*path, tier),
                    f"tier {tier!r} is not one of the policy's tiers ({', '.join(known)}); "
                    "fix the name or add it to 'tiers'",
                    limit.name,
                    stops={Layer.APP},
                )

    def app_limit(self, index: int, limit: Limit, app: AppLimit) -> None:
        base: FieldPath = ("limits", index, "app")
        known = self.policy.tiers
        self._known_tiers(limit, (*base, "tiers"), app.tiers)
        if isinstance(app.concurrency, dict):
            self._known_tiers(limit, (*base, "concurrency"), app.concurrency)
        missing = [t for t in known if t not in app.tiers]
        if missing and any(t in known for t in app.tiers):
            self.add(
                "L106",
                Severity.WARNING,
                (*base, "tiers"),
                f"no rate for tier(s) {', '.join(missing)}: callers in them are not limited by "
                f"{limit.name!r}; give every tier a rate",
                limit.name,
            )
        ordered = [(t, app.tiers[t]) for t in known if t in app.tiers]
        windows = sorted({r.period.ms for _, rates in ordered for r in rates})
        for (low_name, low), (high_name, high) in itertools.pairwise(ordered):
            for window in windows:
                if allowance(high, window) < allowance(low, window):
                    self.add(
                        "L101",
                        Severity.WARNING,
                        (*base, "tiers", high_name),
                        f"tier {high_name!r} admits fewer requests than the lower tier "
                        f"{low_name!r} ({_fmt(allowance(high, window))} vs "
                        f"{_fmt(allowance(low, window))} per {_window(window)}); tiers are "
                        "ordered least to most generous",
                        limit.name,
                    )
                    break
        if app.algorithm is Algorithm.SLIDING_LOG:
            for tier, rates in app.tiers.items():
                for rate in rates:
                    size = sliding_log_bytes(rate.limit)
                    if size > SLIDING_LOG_MEMORY_WARN_BYTES:
                        self.add(
                            "L103",
                            Severity.WARNING,
                            (*base, "tiers", tier),
                            f"sliding_log keeps one entry per request: {rate} needs about "
                            f"{size // 1024} KB of Redis memory per {app.per.value}; use "
                            "algorithm gcra or sliding_window (constant memory)",
                            limit.name,
                        )
        self.quotas(base, limit, app)
        if not app.enforce:
            self.add(
                "L107",
                Severity.INFO,
                (*base, "enforce"),
                f"limit {limit.name!r} is in shadow mode: decisions are reported, never enforced",
                limit.name,
            )

    def quotas(self, base: FieldPath, limit: Limit, app: AppLimit) -> None:
        """Calendar quotas: a time zone the database has, and quotas no rate outgrows."""
        if app.quota_timezone != "UTC":
            try:
                time_zone(app.quota_timezone)
            except UnknownTimeZoneError as error:
                self.add(
                    "L020",
                    Severity.ERROR,
                    (*base, "quota_timezone"),
                    f"limit {limit.name!r}: {error}",
                    limit.name,
                    fix="write an IANA zone name such as Europe/Berlin (the tz database's); "
                    "install the tzdata package where the system has no database",
                    stops={Layer.APP},
                )
        for tier, quotas in (app.quotas or {}).items():
            for period, units in quotas.periods():
                for rate in app.tiers.get(tier, ()):
                    if rate.period.ms <= SHORTEST_PERIOD_MS[period] and units < rate.limit:
                        self.add(
                            "L120",
                            Severity.WARNING,
                            (*base, "quotas", tier, period.value),
                            f"limit {limit.name!r}, tier {tier!r}: the {period.value} quota "
                            f"({units}) is below the rate {rate}, which admits more than the "
                            f"quota allows in a whole {period.value}, so the rate never binds",
                            limit.name,
                            fix=f"raise the quota to at least {rate.limit}, or lower the rate",
                        )

    def app_key(self, index: int, limit: Limit, app: AppLimit) -> None:
        """A ``per:`` naming a key of the app's own: usable, and what the edge counts."""
        per = app.per
        if not isinstance(per, KeyName):
            return
        path: FieldPath = ("limits", index, "app", "per")
        if not per.valid:
            builtin = per.lower() if per.lower() in set(AppKey) else None
            if builtin is not None:
                why = (
                    f"{per!r} is the built-in key {builtin!r} in another case; key names are "
                    "case-sensitive"
                )
                fix = f"write per: {builtin}"
            else:
                why = (
                    f"{per!r} is not a key name: use a lower-case letter, then up to 31 "
                    "lower-case letters, digits or '_' (the name identify() returns in "
                    "Caller.keys, e.g. org)"
                )
                fix = "rename the key, e.g. per: org or per: api_key"
            self.add(
                "L005",
                Severity.ERROR,
                path,
                f"limit {limit.name!r}: {why}",
                limit.name,
                fix=fix,
                stops={Layer.APP},
            )
            return
        if limit.edge is not None and _edge_who(limit.edge) == "IP":
            # Cloudflare sees no app key: the edge part counts every client IP on its own,
            # as it does for per: user limits, whatever the app counts by.
            self.add(
                "L111",
                Severity.INFO,
                ("limits", index, "edge"),
                f"limit {limit.name!r} counts per {per} in the app, but the edge cannot see "
                f"app keys: its edge part counts per client IP ({limit.edge.rate} per IP)",
                limit.name,
            )

    def edge_limit(self, index: int, limit: Limit) -> None:
        assert limit.edge is not None
        when = self.policy.authenticated_when
        if limit.edge.unauthenticated_only and not (when.headers or when.cookies):
            self.add(
                "L108",
                Severity.WARNING,
                ("limits", index, "edge"),
                f"limit {limit.name!r} counts unauthenticated requests only, but "
                "authenticated_when lists no headers or cookies, so every request counts; "
                "add authenticated_when or set unauthenticated_only: false",
                limit.name,
            )
        self.credentialed(index, limit)

    def credentialed(self, index: int, limit: Limit) -> None:
        edge = limit.edge
        assert edge is not None
        given = edge.credentialed_rate
        if given is None:
            return
        path: FieldPath = ("limits", index, "edge", "credentialed_rate")
        if credentialed_rate(self.policy, limit) is None:
            why = (
                "the limit counts every request alike (unauthenticated_only: false)"
                if not edge.unauthenticated_only
                else "authenticated_when lists no headers or cookies"
            )
            if _edge_who(edge) != "IP":
                why = f"the limit counts per {_edge_who(edge)}, or per client IP without one"
            self.add(
                "L110",
                Severity.WARNING,
                path,
                f"limit {limit.name!r} sets credentialed_rate {given}, which has no effect: "
                f"{why}; remove it",
                limit.name,
            )
            return
        # Looser: never fewer requests than rate over either period, more over at least one.
        windows = sorted({edge.rate.period.ms, given.period.ms}, reverse=True)
        counts = [(allowance((given,), w), allowance((edge.rate,), w), w) for w in windows]
        worse = [c for c in counts if c[0] < c[1]]
        if worse or all(mine <= anonymous for mine, anonymous, _ in counts):
            mine, anonymous, window = (worse or counts)[0]
            self.add(
                "L109",
                Severity.ERROR,
                path,
                f"limit {limit.name!r}: credentialed_rate {given} is not looser than rate "
                f"{edge.rate} ({_fmt(mine)} against {_fmt(anonymous)} per "
                f"{_window(window)}), so a request that carries a credential would get no "
                "more than an anonymous one; raise it (the default is ten times rate) or "
                "remove it",
                limit.name,
            )

    def matchers(self) -> None:
        limits = self.policy.limits
        compiled = [limit.match.matcher() for limit in limits]
        # A limit with no edge part that the middleware never applies counts only where
        # code names it: its match selects nothing, so it overlaps nothing.
        matched = [
            limit.edge is not None or (limit.app is not None and limit.app.middleware)
            for limit in limits
        ]
        for i in range(len(limits)):
            for j in range(i + 1, len(limits)):
                if limits[i].name == limits[j].name or not (matched[i] and matched[j]):
                    continue
                if compiled[i].same_as(compiled[j]):
                    self.add(
                        "L104",
                        Severity.WARNING,
                        ("limits", j, "match"),
                        f"limits {limits[i].name!r} and {limits[j].name!r} match exactly the "
                        "same requests; merge them into one limit",
                        limits[j].name,
                    )
                elif compiled[i].overlaps(compiled[j]):
                    self.add(
                        "L105",
                        Severity.INFO,
                        ("limits", j, "match"),
                        f"limits {limits[i].name!r} and {limits[j].name!r} overlap: a request "
                        "matching both counts against both",
                        limits[j].name,
                    )

    def edge_versus_app(self) -> None:
        limits = self.policy.limits
        lowest = self.policy.tiers[0] if self.policy.tiers else None
        for i, edge_owner in enumerate(limits):
            edge = edge_owner.edge
            if edge is None:
                continue
            for app_owner in limits:
                app = app_owner.app
                if app is None or lowest is None or lowest not in app.tiers:
                    continue
                # Edge counts anonymous traffic per IP and the app counts users (or an app
                # key such as an organisation): no conflict.
                if edge.unauthenticated_only and app.per is not AppKey.IP:
                    continue
                # Only an edge limit covering the app limit's whole route hides it.
                if app_owner is not edge_owner and not edge_owner.match.matcher().covers(
                    app_owner.match.matcher()
                ):
                    continue
                window = edge.rate.period.ms
                edge_allows = allowance((edge.rate,), window)
                app_allows = allowance(app.tiers[lowest], window)
                if edge_allows < app_allows:
                    self.add(
                        "L102",
                        Severity.WARNING,
                        ("limits", i, "edge", "rate"),
                        f"edge limit {edge.rate} per {_edge_who(edge)} on {edge_owner.name!r} is "
                        "stricter than "
                        f"the {lowest!r} tier of {app_owner.name!r} "
                        f"({_fmt(app_allows)} per {_window(window)}), so clients hit the edge "
                        "first and the app limit never applies; loosen the edge limit",
                        edge_owner.name,
                    )


def _edge_who(edge: EdgeLimit) -> str:
    """What one edge counter counts, as messages name it."""
    per = edge.per
    if isinstance(per, HeaderKey):
        return f"header {per.header}"
    if isinstance(per, CookieKey):
        return f"cookie {per.cookie}"
    if isinstance(per, JwtKey):
        return f"JWT claim {per.jwt.claim}"
    return "IP"


class _Overrides:
    """The checks of the file's ``overrides:`` (L006-L009, L113, L114)."""

    def __init__(self, linter: _Linter, now: float) -> None:
        self.linter = linter
        self.now = now
        self.seen: dict[tuple[str, str, str], int] = {}

    def check(self, index: int, entry: Override) -> None:
        base: FieldPath = ("overrides", index)
        policy, add = self.linter.policy, self.linter.add
        found = [limit for limit in policy.limits if limit.name == entry.limit]
        app = found[0].app if found else None
        if app is None:
            known = ", ".join(limit.name for limit in policy.limits if limit.app) or "none"
            add(
                "L006",
                Severity.ERROR,
                (*base, "limit"),
                f"override of {entry.limit!r}: no limit of that name has an app part, and "
                f"only the app applies overrides; use one of: {known}",
                entry.limit,
                stops={Layer.APP},
            )
            return
        wanted = (
            "ip" if app.per is AppKey.IP else ("user" if app.per is AppKey.USER else str(app.per))
        )
        if entry.kind != wanted:
            add(
                "L007",
                Severity.ERROR,
                (*base, "user" if entry.user is not None else "key"),
                f"limit {entry.limit!r} counts per {wanted}, so its override must name "
                + (
                    "a user (user: ID) or an app key; per-IP limits take no override"
                    if wanted == "ip"
                    else ("a user: user: ID" if wanted == "user" else f"key: {{{wanted}: VALUE}}")
                ),
                entry.limit,
                stops={Layer.APP},
            )
            return
        identity = (entry.limit, entry.kind, entry.value)
        if identity in self.seen:
            add(
                "L008",
                Severity.ERROR,
                base,
                f"a second override of {entry.limit!r} for {entry.kind} {entry.value!r} (the "
                f"first is overrides[{self.seen[identity]}]); keep one",
                entry.limit,
                stops={Layer.APP},
            )
            return
        self.seen[identity] = index
        if not self.countable(base, entry, app):
            return
        if entry.expires_at <= self.now:
            add(
                "L114",
                Severity.WARNING,
                (*base, "expires"),
                f"the override of {entry.limit!r} for {entry.kind} {entry.value!r} expired on "
                f"{entry.expires}: the tier's limits apply; remove it or extend it",
                entry.limit,
            )
        self.looser(base, entry, app)

    def countable(self, base: FieldPath, entry: Override, app: AppLimit) -> bool:
        """L009: whether the limit can count what the override gives."""
        whose = f"the override of {entry.limit!r} for {entry.kind} {entry.value!r}"
        problem: tuple[str, str] | None = None
        if entry.rates is not None and not any(app.tiers.values()):
            problem = (
                "rates",
                f"{whose} gives rates, but limit {entry.limit!r} has none (concurrency "
                "alone); give a tier of the limit rates first, or drop the override's",
            )
        elif entry.quotas is not None and not app.quotas:
            problem = (
                "quotas",
                f"{whose} gives quotas, but limit {entry.limit!r} has none; give a tier of "
                "the limit quotas first (quotas: {TIER: {month: N}}), or drop the override's",
            )
        elif entry.quotas is not None and entry.quotas.billing and app.billing_day_from is None:
            problem = (
                "quotas",
                f"{whose} gives a billing quota, but limit {entry.limit!r} has no "
                "billing_day_from to read a caller's billing day from; set it, or use month",
            )
        elif entry.concurrency is not None and app.mode is Mode.APPROXIMATE:
            problem = (
                "concurrency",
                f"{whose} gives a concurrency limit, which needs mode: exact (a slot is "
                f"taken and given back in Redis), and limit {entry.limit!r} is approximate",
            )
        elif entry.concurrency is not None and not app.concurrency:
            problem = (
                "concurrency",
                f"{whose} gives a concurrency limit, but limit {entry.limit!r} has none; give "
                "a tier of the limit one first (concurrency: {TIER: N}), or drop the "
                "override's",
            )
        if problem is None:
            return True
        self.linter.add(
            "L009", Severity.ERROR, (*base, problem[0]), problem[1], entry.limit, stops={Layer.APP}
        )
        return False

    def looser(self, base: FieldPath, entry: Override, app: AppLimit) -> None:
        """L113: the first of the override's rates, quotas and concurrency that admits more
        than the limit's highest tier that has one."""
        found = self.looser_rates(entry, app) or self.looser_quotas(entry, app)
        found = found or self.looser_concurrency(entry, app)
        if found is not None:
            field, tier, what = found
            self.linter.add(
                "L113",
                Severity.WARNING,
                (*base, field),
                f"the override of {entry.limit!r} for {entry.kind} {entry.value!r} admits "
                f"more than the highest tier {tier!r} ({what}); check it is the contract's",
                entry.limit,
            )

    def top(self, tiers: Iterable[str]) -> str | None:
        """The highest tier of the policy among ``tiers``."""
        among = set(tiers)
        return next((t for t in reversed(self.linter.policy.tiers) if t in among), None)

    def looser_rates(self, entry: Override, app: AppLimit) -> tuple[str, str, str] | None:
        tier = self.top(t for t, rates in app.tiers.items() if rates)
        if entry.rates is None or tier is None:
            return None
        top = app.tiers[tier]
        for window in sorted({r.period.ms for r in (*top, *entry.rates)}):
            own, theirs = allowance(entry.rates, window), allowance(top, window)
            if own > theirs:
                return "rates", tier, f"{_fmt(own)} vs {_fmt(theirs)} per {_window(window)}"
        return None

    def looser_quotas(self, entry: Override, app: AppLimit) -> tuple[str, str, str] | None:
        if entry.quotas is None:
            return None
        by_tier = {t: dict(q.periods()) for t, q in (app.quotas or {}).items()}
        for period, units in entry.quotas.periods():
            tier = self.top(t for t, periods in by_tier.items() if period in periods)
            if tier is not None and units > by_tier[tier][period]:
                theirs = by_tier[tier][period]
                return "quotas", tier, f"{units:,} vs {theirs:,} per {period.value}"
        return None

    def looser_concurrency(self, entry: Override, app: AppLimit) -> tuple[str, str, str] | None:
        slots = app.concurrency_of(self.linter.policy.tiers)
        tier = self.top(slots)
        if entry.concurrency is None or tier is None or entry.concurrency <= slots[tier]:
            return None
        return "concurrency", tier, f"{entry.concurrency} vs {slots[tier]} at once"


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _window(ms: int) -> str:
    return str(Duration(ms))


def lint(policy: Policy, checks: Iterable[Check] = ()) -> list[Diagnostic]:
    """Check a loaded policy as a whole; returns findings sorted by their place in the file.

    ``checks`` adds the findings of checks contributed by a consumer of the policy
    (edgegen passes its placement checks, L2xx).
    """
    return _Linter(policy, checks).run()
