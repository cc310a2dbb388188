"""The replay engine: recorded requests through the policy's layers, in the order traffic
meets them (Cloudflare's rate limiting rules, the Worker, the app), each with its own
counting model (``_models``).

Pure: it takes :class:`~edgegen.replay._types.Record` values in time order and returns
counts; reading files (``edgegen.traffic``) and formatting (``_report``) live elsewhere.
A request refused at one layer does not reach the next. Memory is bounded by the identities
active within a period (the models forget idle keys; ``sweep``), plus what the report keeps
by design: one entry per distinct identity that a limit counted (for "identities affected"
and the headroom figures) and a timeline of at most ``TIMELINE_BUCKETS`` buckets.

What each layer sees, and the assumptions this module makes (``ASSUMPTIONS``, printed in
every report), are in docs/replay.md.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from edgegen_policy import (
    OVERRIDE_TIER,
    Action,
    CountWhen,
    EdgeTarget,
    Limit,
    Policy,
    Rate,
    Verdict,
    checked_rates,
    decide,
    ip_bucket,
    request_paths,
)
from edgegen_policy import Matcher as PolicyMatcher

from .. import _placement
from .._capabilities import key_kind, key_text
from .._routes import route_covers, route_parts
from ._models import RuleCounter, WorkerCounter, app_model
from ._types import AppModel, Record

# Forget idle counters every this many records (and at the end): cheap, and often enough
# that memory follows the active identities.
_SWEEP_EVERY = 65_536
# The matching caches: requests repeat a small set of (method, host, path) combinations;
# past this many entries a cache is cleared rather than grown (a scanner's random paths).
_CACHE_LIMIT = 65_536
_MINUTE_US = 60_000_000
_SWEEP_SLACK_US = 60_000_000
_TOP = 10

ASSUMPTIONS = (
    "Rules and the Worker see the path as the app does after normalisation (decoded, "
    "canonical); the spellings docs/edge.md lists as gaps of the rule expressions are not "
    "modelled.",
    "A rule counts per data centre and client address (ip.src: each IPv6 address apart); "
    "records without a data centre are counted in one.",
    "The Worker sees only requests on its routes, counted per data centre and client network "
    "(the policy's ipv6_prefix), in fixed windows of its binding's period.",
    "A challenged request stops at the edge unless --challenges pass is given (a client "
    "that solves challenges reaches the app).",
    "The app decides every limit exactly (approximate mode and the denial cache are "
    "modelled as exact decisions); a caller keeps one tier through the replay.",
    "A limit that counts by an app key (per: org) counts the record's user in its place.",
)
# Said in the notes of a replay whose policy has a limit with count_when.
CALENDAR_NOTE = (
    "Calendar quotas and concurrency limits are not replayed: a log does not hold a "
    "caller's use of the period before it began, nor how long each request ran."
)
OVERRIDE_EVENTS_NOTE = (
    "Decision events of an identity's override (tier 'override') are not replayed: the "
    "event log hashes the identity, so the override it had cannot be told."
)
COUNT_WHEN_NOTE = (
    "Limits with count_when check a request before it runs and count it after, when its "
    "logged status is listed: a request that a later layer refused counts as its 429, one "
    "refused at or before the limit's own layer is not counted, and a record without a "
    "status is not counted."
)


class ReplayLayer(StrEnum):
    """Where a request was decided, in the order traffic meets the layers."""

    RULES = "rules"
    WORKER = "worker"
    APP = "app"


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How to replay: ``challenges`` is "stop" (a challenged request goes no further) or
    "pass"; ``show_identities`` prints identities as they are instead of hashed;
    ``layers`` limits the replay to some layers (all by default)."""

    challenges: str = "stop"
    show_identities: bool = False
    layers: frozenset[ReplayLayer] = frozenset(ReplayLayer)


class Row:
    """What one limit (one rule, binding or app limit and tier) did to the replayed traffic.

    ``counted`` requests reached it and matched; ``refused`` were refused by it (``shadow``
    would have been, for a limit in shadow mode; ``challenged`` got a challenge). Per
    identity: how many it counted and refused, and the peak count in one fixed period
    (aligned to the epoch) against ``limit`` for the headroom figure.
    """

    __slots__ = (
        "action",
        "challenged",
        "counted",
        "enforced",
        "layer",
        "limit",
        "name",
        "peaks",
        "period_us",
        "rate",
        "refused",
        "refused_by",
        "shadow",
        "tier",
        "who",
        "windows",
    )

    def __init__(
        self,
        layer: ReplayLayer,
        name: str,
        tier: str | None,
        rate: Rate,
        *,
        enforced: bool = True,
        action: str | None = None,
        who: str | None = None,
    ) -> None:
        self.layer = layer
        self.name = name
        self.tier = tier
        # The user whose override this row counts (tier "override"), else None.
        self.who = who
        self.rate = rate
        self.limit = rate.limit
        self.period_us = round(rate.period.seconds * 1_000_000)
        self.enforced = enforced
        self.action = action
        self.counted = 0
        self.refused = 0
        self.shadow = 0
        self.challenged = 0
        # identity -> [window index, count in that window, peak count in one window]
        self.windows: dict[Hashable, list[int]] = {}
        self.refused_by: dict[Hashable, int] = {}
        self.peaks: dict[Hashable, int] = {}

    def count(self, identity: Hashable, at_us: int, cost: int) -> None:
        """One request counted by this limit, for its identity."""
        self.counted += 1
        window = at_us // self.period_us
        state = self.windows.get(identity)
        if state is None:
            self.windows[identity] = [window, cost, cost]
        elif state[0] == window:
            state[1] += cost
            state[2] = max(state[2], state[1])
        else:
            state[0] = window
            state[1] = cost
            state[2] = max(state[2], cost)

    def refuse(self, identity: Hashable) -> None:
        """That request was refused by this limit."""
        self.refused_by[identity] = self.refused_by.get(identity, 0) + 1

    @property
    def identities(self) -> int:
        """Distinct identities this limit counted."""
        return len(self.windows)

    def peak_of(self, identity: Hashable) -> int:
        """An identity's peak count in one period."""
        return self.windows[identity][2]

    def busiest(self, n: int = 3) -> list[tuple[Hashable, int]]:
        """The ``n`` identities with the highest peak, highest first."""
        peaks = ((identity, state[2]) for identity, state in self.windows.items())
        return sorted(peaks, key=lambda item: (-item[1], str(item[0])))[:n]

    def top_refused(self, n: int = _TOP) -> list[tuple[Hashable, int]]:
        """The ``n`` identities refused most often."""
        return sorted(self.refused_by.items(), key=lambda item: (-item[1], str(item[0])))[:n]


@dataclass(slots=True)
class _Rule:
    """One Cloudflare rule as the replay runs it."""

    row: Row
    matcher: PolicyMatcher
    counter: RuleCounter
    # None: every request; True: only requests with a credential; False: only without.
    credentialed: bool | None
    challenge: bool
    # The limit's count_when: checked before, counted after the answer (_Answer).
    count_when: CountWhen | None = None


@dataclass(slots=True)
class _Binding:
    """One counter of the Worker (a limit's own, or its credentialed one)."""

    row: Row
    matcher: PolicyMatcher
    counter: WorkerCounter
    credentialed: bool | None
    count_when: CountWhen | None = None


@dataclass(slots=True)
class _Answer:
    """A count_when check one request passed, to count once its answer is known."""

    layer: ReplayLayer
    count_when: CountWhen
    count: Callable[[Hashable, int], None]
    key: Hashable
    row: Row
    identity: Hashable


@dataclass(slots=True)
class _AppCheck:
    """One rate of one app limit for one tier."""

    row: Row
    model: AppModel
    # None: by the caller (user, or address when anonymous); "ip": always by address.
    per_ip: bool
    shadow: bool


@dataclass(slots=True)
class _AppLimit:
    name: str
    matcher: PolicyMatcher
    per_ip: bool
    shadow: bool
    tiers: dict[str, list[_AppCheck]]
    count_when: CountWhen | None = None
    # The policy's overrides of this limit, by user: until when (µs) and their checks,
    # which replace the user's tier's while it lasts (tier "override" in the rows).
    overrides: dict[str, tuple[int, list[_AppCheck]]] = field(default_factory=dict)


# The order traffic meets the layers in.
_LAYER_ORDER = {layer: index for index, layer in enumerate(ReplayLayer)}

# The timeline keeps at most this many buckets: past that, its buckets widen to the next
# of _TIMELINE_WIDTHS (each a multiple of the one before; then whole days, doubling), so
# its memory is bounded whatever the records' span (one record in 1970 and one in 9999).
TIMELINE_BUCKETS = 1 << 14
# What a timeline bucket counts, in order: each request in exactly one of them ("rules" are
# the requests a rule blocked; "challenged" those a rule challenged and that went no
# further).
TIMELINE_COLUMNS = ("admitted", "rules", "worker", "app", "challenged")
_TIMELINE_WIDTHS = (1, 5, 15, 30, 60, 180, 360, 720, 1440)


@dataclass(slots=True)
class Timeline:
    """Admitted, refused by each layer, and challenged at the edge, per bucket of ``width``
    minutes: the counts of :data:`TIMELINE_COLUMNS`, each request in one of them.

    ``minutes`` maps a bucket's first minute (minutes since the epoch, a multiple of
    ``width``) to its counts; ``start_minute`` is the first record's minute. A bucket is one
    minute until more than :data:`TIMELINE_BUCKETS` would be kept.
    """

    start_minute: int | None = None
    minutes: dict[int, list[int]] = field(default_factory=dict)
    width: int = 1

    def counts(self, minute: int) -> list[int]:
        """The counts of the bucket that holds ``minute`` (minutes since the epoch), to be
        added to in place (until the next call: a call may merge buckets)."""
        if self.start_minute is None or minute < self.start_minute:
            self.start_minute = minute
        at = minute - minute % self.width
        counts = self.minutes.get(at)
        if counts is None:
            if len(self.minutes) >= TIMELINE_BUCKETS:
                self._widen()
                return self.counts(minute)
            counts = self.minutes[at] = [0] * len(TIMELINE_COLUMNS)
        return counts

    def _widen(self) -> None:
        """Merge the buckets into the next width (at least halving their number)."""
        width = self.width
        while len({at - at % width for at in self.minutes}) > TIMELINE_BUCKETS // 2:
            later = [w for w in _TIMELINE_WIDTHS if w > width]
            width = later[0] if later else width * 2
        merged: dict[int, list[int]] = {}
        for at, counts in self.minutes.items():
            into = merged.setdefault(at - at % width, [0] * len(TIMELINE_COLUMNS))
            for index, value in enumerate(counts):
                into[index] += value
        self.minutes = merged
        self.width = width


_COLUMN = {None: 0, ReplayLayer.RULES: 1, ReplayLayer.WORKER: 2, ReplayLayer.APP: 3}
# A request a rule challenged and that went no further (--challenges stop): apart from the
# rules' blocks, since a managed challenge does not refuse (a person may pass it).
_CHALLENGED = 4


@dataclass(slots=True)
class ReplayResult:
    """What a replay found: one row per limit and tier per layer, totals, a timeline."""

    rows: list[Row]
    requests: int = 0
    admitted: int = 0
    refused: dict[ReplayLayer, int] = field(default_factory=lambda: dict.fromkeys(ReplayLayer, 0))
    challenged: int = 0
    first_us: int | None = None
    last_us: int | None = None
    timeline: Timeline = field(default_factory=Timeline)
    layers: tuple[ReplayLayer, ...] = ()
    notes: list[str] = field(default_factory=list)
    label: Callable[[Hashable], str] = str
    # Requests without a host, replayed through a policy where a Worker route or a limit
    # names hosts: they can match none of those.
    hostless: int = 0
    # Requests a count_when limit would have counted by their answer, logged without one.
    statusless: int = 0

    @property
    def warnings(self) -> list[str]:
        """What makes the figures less than they seem, with counts, for every report."""
        found = []
        if self.hostless:
            found.append(
                f"{self.hostless:,} of {self.requests:,} requests have no host, so they match "
                "no Worker route and no limit that names hosts; log the host (append "
                "host=$host to a combined log's format, or a host column; docs/replay.md)"
            )
        if self.statusless:
            found.append(
                f"{self.statusless:,} of {self.requests:,} requests reached a limit with "
                "count_when but have no status in the log, so they were not counted; replay "
                "a log that records the answer's status (docs/replay.md)"
            )
        return found

    def rows_of(self, layer: ReplayLayer) -> list[Row]:
        """The rows of one layer, in policy order."""
        return [row for row in self.rows if row.layer is layer]


def _identity_label(show: bool) -> Callable[[Hashable], str]:
    """How identities are printed: as they are, or hashed with a key that lives only in
    this process (the same identity hashes the same within one run, so two policies
    replayed side by side name it alike, but a report cannot be reversed by guessing)."""
    if show:
        return _plain
    key = os.urandom(16)

    def hashed(identity: Hashable) -> str:
        kind, _, _ = _plain(identity).partition(":")
        digest = hmac.new(key, _plain(identity).encode(), hashlib.sha256).hexdigest()[:10]
        return f"{kind}:{digest}"

    return hashed


def _plain(identity: Hashable) -> str:
    if isinstance(identity, tuple):
        return ":".join(str(part) for part in identity)
    return str(identity)


class Replay:
    """The layers of one policy, fed one request at a time (:meth:`feed`), then
    :meth:`result`. Two Replays fed the same records compare two policies (``diff
    --traffic``)."""

    def __init__(
        self,
        policy: Policy,
        options: ReplayOptions | None = None,
        *,
        label: Callable[[Hashable], str] | None = None,
    ) -> None:
        self.policy = policy
        self.options = options or ReplayOptions()
        self.tiers = tuple(policy.tiers)
        self.lowest = self.tiers[0] if self.tiers else "default"
        self.prefix = policy.clients.ipv6_prefix
        self.rows: list[Row] = []
        self.rules: list[_Rule] = []
        self.bindings: list[_Binding] = []
        self.routes: list[tuple[str, str]] = []
        self.apps: list[_AppLimit] = []
        self.app_by_name: dict[str, _AppLimit] = {}
        self.notes: list[str] = []
        layers = self.options.layers
        if policy.cloudflare is not None and (layers & {ReplayLayer.RULES, ReplayLayer.WORKER}):
            self._edge(policy)
        if ReplayLayer.APP in layers:
            self._app(policy)
        if any(limit.count_when is not None for limit in policy.limits):
            self.notes.append(COUNT_WHEN_NOTE)
        if ReplayLayer.APP in layers and any(
            limit.app is not None and (limit.app.quotas or limit.app.concurrency)
            for limit in policy.limits
        ):
            self.notes.append(CALENDAR_NOTE)
        self.result_ = ReplayResult(
            rows=self.rows,
            layers=tuple(layer for layer in ReplayLayer if layer in layers),
            notes=self.notes,
            label=label or _identity_label(self.options.show_identities),
        )
        self._next_sweep = _SWEEP_EVERY
        self._minute = -1
        self._counts: list[int] = [0] * len(TIMELINE_COLUMNS)
        # Set by _rules when the request it stops was challenged rather than blocked.
        self._challenge_stopped = False
        self._tier_names = frozenset(self.tiers)
        self._paths: dict[str, tuple[str, ...]] = {}
        self._buckets: dict[str, str] = {}
        self._rule_cache: dict[tuple[str, str, str, bool], list[_Rule]] = {}
        self._binding_cache: dict[tuple[str, str, str, bool], list[_Binding] | None] = {}
        self._app_cache: dict[tuple[str, str, str], list[_AppLimit]] = {}
        # The count_when checks the current request passed, counted once it is decided.
        self._answers: list[_Answer] = []
        # Whether a request without a host misses something a request with one could match.
        matchers = [rule.matcher for rule in self.rules]
        matchers += [binding.matcher for binding in self.bindings]
        matchers += [app.matcher for app in self.apps]
        routed = bool(self.bindings) and any(host != "*" for host, _ in self.routes)
        self._needs_host = routed or any(matcher.hosts for matcher in matchers)

    # -- set-up ---------------------------------------------------------------------------

    def _edge(self, policy: Policy) -> None:
        assert policy.cloudflare is not None
        when = policy.authenticated_when
        lists_credentials = bool(when.headers or when.cookies)
        worker = policy.cloudflare.worker
        if worker is not None:
            self.routes = [route_parts(route) for route in worker.routes]
        for placement in _placement.place(policy):
            limit = policy.limits[placement.index]
            edge = limit.edge
            if edge is None or placement.target is None or placement.period is None:
                continue
            unauthenticated = edge.unauthenticated_only and lists_credentials
            matcher = limit.match.matcher()
            credentialed = placement.credentialed
            if key_kind(edge.per) != "ip":
                self.notes.append(
                    f"Limit {limit.name!r} counts per {key_text(edge.per)} at the edge; traffic "
                    "records carry no such value, so the replay counts it per client IP, "
                    "which refuses sooner than the edge would."
                )
            if placement.target is EdgeTarget.RULE and ReplayLayer.RULES in self.options.layers:
                assert placement.mitigation_timeout is not None
                self._rule(limit, matcher, edge.rate, placement.mitigation_timeout, unauthenticated)
                if credentialed is not None:
                    timeout = placement.credentialed_timeout or 0
                    self._rule(limit, matcher, credentialed, timeout, True, credentialed=True)
            elif (
                placement.target is EdgeTarget.WORKER and ReplayLayer.WORKER in self.options.layers
            ):
                self._binding(limit, matcher, edge.rate, placement.period, unauthenticated)
                if credentialed is not None:
                    period = credentialed.period.whole_seconds or placement.period
                    self._binding(limit, matcher, credentialed, period, True, credentialed=True)
        if self.bindings and not self.routes:
            self.notes.append(
                "The Worker has no routes, so it would see no traffic; the replay gives it "
                "every request to show what its limits would do."
            )

    def _rule(
        self,
        limit: Limit,
        matcher: PolicyMatcher,
        rate: Rate,
        timeout: int,
        unauthenticated: bool,
        *,
        credentialed: bool = False,
    ) -> None:
        edge = limit.edge
        assert edge is not None
        period = rate.period.whole_seconds
        assert period is not None
        name = f"{limit.name} (credentialed)" if credentialed else limit.name
        row = Row(ReplayLayer.RULES, name, None, rate, action=edge.action.value)
        self.rows.append(row)
        self.rules.append(
            _Rule(
                row=row,
                matcher=matcher,
                counter=RuleCounter(period, rate.limit, timeout, edge.action),
                credentialed=True if credentialed else (False if unauthenticated else None),
                challenge=edge.action is not Action.BLOCK,
                count_when=limit.count_when,
            )
        )

    def _binding(
        self,
        limit: Limit,
        matcher: PolicyMatcher,
        rate: Rate,
        period: int,
        unauthenticated: bool,
        *,
        credentialed: bool = False,
    ) -> None:
        name = f"{limit.name} (credentialed)" if credentialed else limit.name
        row = Row(ReplayLayer.WORKER, name, None, rate, action="block")
        self.rows.append(row)
        self.bindings.append(
            _Binding(
                row=row,
                matcher=matcher,
                counter=WorkerCounter(rate.limit, period),
                credentialed=True if credentialed else (False if unauthenticated else None),
                count_when=limit.count_when,
            )
        )

    def _app(self, policy: Policy) -> None:
        for limit in policy.limits:
            app = limit.app
            if app is None:
                continue
            shadow = not app.enforce
            per_ip = str(app.per) == "ip"
            tiers: dict[str, list[_AppCheck]] = {}
            for tier in self.tiers:
                rates = app.tiers.get(tier)
                if not rates:
                    continue
                checks = []
                for rate in checked_rates(rates):
                    row = Row(ReplayLayer.APP, limit.name, tier, rate, enforced=not shadow)
                    self.rows.append(row)
                    checks.append(
                        _AppCheck(row, app_model(app.algorithm, rate, app.burst), per_ip, shadow)
                    )
                tiers[tier] = checks
            entry = _AppLimit(
                limit.name, limit.match.matcher(), per_ip, shadow, tiers, limit.count_when
            )
            self.apps.append(entry)
            self.app_by_name[limit.name] = entry
        self._overrides(policy)

    def _overrides(self, policy: Policy) -> None:
        """The policy's overrides, on the limits they name: a user's own rates replace its
        tier's until the override expires (by the records' time)."""
        for entry in policy.overrides:
            app = self.app_by_name.get(entry.limit)
            limit = next((x for x in policy.limits if x.name == entry.limit), None)
            if app is None or limit is None or limit.app is None or app.per_ip:
                continue
            if entry.user is None:
                self.notes.append(
                    f"the override of {entry.limit} for {entry.kind} {entry.value} is not "
                    "replayed: recorded requests carry no app keys"
                )
                continue
            if entry.rates is None:
                # Its quotas and concurrency are not replayed (as the tiers' are not).
                continue
            checks = []
            for rate in checked_rates(entry.rates):
                row = Row(
                    ReplayLayer.APP,
                    entry.limit,
                    OVERRIDE_TIER,
                    rate,
                    enforced=not app.shadow,
                    who=entry.user,
                )
                self.rows.append(row)
                model = app_model(limit.app.algorithm, rate, limit.app.burst)
                checks.append(_AppCheck(row, model, False, app.shadow))
            app.overrides[entry.user] = (round(entry.expires_at * 1_000_000), checks)

    # -- feeding --------------------------------------------------------------------------

    def _forms(self, path: str) -> tuple[str, ...]:
        forms = self._paths.get(path)
        if forms is None:
            if len(self._paths) >= _CACHE_LIMIT:
                self._paths.clear()
            forms = self._paths[path] = request_paths(path)
        return forms

    def _bucket(self, ip: str) -> str:
        bucket = self._buckets.get(ip)
        if bucket is None:
            if len(self._buckets) >= _CACHE_LIMIT:
                self._buckets.clear()
            bucket = self._buckets[ip] = ip_bucket(ip, self.prefix)
        return bucket

    def feed(self, request: Record) -> ReplayLayer | None:
        """Replay one request; the layer that refused it, or None when it reached the app
        (or the last layer replayed) and was admitted."""
        result = self.result_
        at = request.at_us
        if result.first_us is None:
            result.first_us = at
        result.last_us = at
        result.requests += 1
        if result.requests >= self._next_sweep:
            self._next_sweep += _SWEEP_EVERY
            # A little before this record's time: a sweep at t may change the decision of a
            # record dated before t, and readers tolerate records a few seconds out of order.
            self.sweep(at - _SWEEP_SLACK_US)
        refused = self._app_event(request) if request.limit is not None else self._request(request)
        if refused is None:
            result.admitted += 1
            column = 0
        else:
            result.refused[refused] += 1
            column = _COLUMN[refused]
            if self._challenge_stopped:
                self._challenge_stopped = False
                column = _CHALLENGED
        # The timeline, inlined for the common case of a record in the same minute.
        minute = at // _MINUTE_US
        if minute != self._minute:
            self._minute = minute
            self._counts = result.timeline.counts(minute)
        self._counts[column] += 1
        return refused

    def _request(self, request: Record) -> ReplayLayer | None:
        method = "GET" if request.method == "HEAD" else request.method
        host = request.host
        if not host and self._needs_host:
            self.result_.hostless += 1
        path = request.path
        authenticated = (
            request.authenticated if request.authenticated is not None else request.user is not None
        )
        refused: ReplayLayer | None = None
        if self.rules and self._rules(request, method, host, path, authenticated):
            refused = ReplayLayer.RULES
        elif self.bindings and self._worker(request, method, host, path, authenticated):
            refused = ReplayLayer.WORKER
        elif self.apps and self._app_request(request, method, host, path):
            refused = ReplayLayer.APP
        if self._answers:
            self._count_answers(request, refused)
        return refused

    def _count_answers(self, request: Record, refused: ReplayLayer | None) -> None:
        """Count the answer of a request in the count_when checks it passed.

        Each layer sees the answer of what lies behind it: the logged status when nothing
        refused the request, a 429 when a later layer refused it. A check of the layer that
        refused it, or of one behind that, saw no answer and counts nothing.
        """
        answers = self._answers
        self._answers = []
        order = _LAYER_ORDER
        status = request.status if refused is None else 429
        at = request.at_us
        missing = False
        for answer in answers:
            if refused is not None and order[answer.layer] >= order[refused]:
                continue
            if status is None:
                missing = True
            elif answer.count_when.counts(status):
                answer.row.count(answer.identity, at, 1)
                answer.count(answer.key, at)
        if missing:
            self.result_.statusless += 1

    def _rules(
        self, request: Record, method: str, host: str, path: str, authenticated: bool
    ) -> bool:
        cache_key = (method, host, path, authenticated)
        rules = self._rule_cache.get(cache_key)
        if rules is None:
            forms = self._forms(path)
            rules = [
                rule
                for rule in self.rules
                if (rule.credentialed is None or rule.credentialed == authenticated)
                and rule.matcher.matches_any(method, forms, host)
            ]
            if len(self._rule_cache) >= _CACHE_LIMIT:
                self._rule_cache.clear()
            self._rule_cache[cache_key] = rules
        if not rules:
            return False
        # Characteristics cf.colo.id and ip.src: each address apart, per data centre.
        key = (request.colo or "", request.ip)
        identity = ("ip", request.ip)
        at = request.at_us
        for rule in rules:
            row = rule.row
            if rule.count_when is None:
                row.count(identity, at, 1)
                acts = rule.counter.hit(key, at)
            else:
                acts = rule.counter.check_before_answer(key, at)
                if not acts:
                    self._answers.append(
                        _Answer(
                            ReplayLayer.RULES,
                            rule.count_when,
                            rule.counter.count_answer,
                            key,
                            row,
                            identity,
                        )
                    )
            if acts:
                row.refuse(identity)
                if rule.challenge:
                    row.challenged += 1
                    self.result_.challenged += 1
                    if self.options.challenges == "pass":
                        # A client that solves the challenge goes on to the next rule.
                        continue
                    self._challenge_stopped = True
                else:
                    row.refused += 1
                return True
        return False

    def _on_routes(self, host: str, forms: tuple[str, ...]) -> bool:
        """Whether a route sends the request to the Worker: routes see the URL as the
        zone normalised it, so any of the path's forms counts (as the matchers do), never
        the logged spelling alone (``/%77ebhooks/`` is on a ``/webhooks/*`` route)."""
        if not self.routes:
            return True
        return any(route_covers(route, host, form) for route in self.routes for form in forms)

    def _worker(
        self, request: Record, method: str, host: str, path: str, authenticated: bool
    ) -> bool:
        cache_key = (method, host, path, authenticated)
        bindings = self._binding_cache.get(cache_key, ())
        if bindings == ():
            forms = self._forms(path)
            if self._on_routes(host, forms):
                bindings = [
                    binding
                    for binding in self.bindings
                    if (binding.credentialed is None or binding.credentialed == authenticated)
                    and binding.matcher.matches_any(method, forms, host)
                ]
            else:
                bindings = None
            if len(self._binding_cache) >= _CACHE_LIMIT:
                self._binding_cache.clear()
            self._binding_cache[cache_key] = bindings
        if not bindings:
            return False
        bucket = self._bucket(request.ip)
        key = (request.colo or "", bucket)
        identity = ("ip", bucket)
        at = request.at_us
        for binding in bindings:
            if binding.count_when is not None:
                if binding.counter.spent(key, at):
                    binding.row.refused += 1
                    binding.row.refuse(identity)
                    return True
                self._answers.append(
                    _Answer(
                        ReplayLayer.WORKER,
                        binding.count_when,
                        binding.counter.count_answer,
                        key,
                        binding.row,
                        identity,
                    )
                )
                continue
            binding.row.count(identity, at, 1)
            if binding.counter.hit(key, at):
                binding.row.refused += 1
                binding.row.refuse(identity)
                return True
        return False

    def _tier(self, request: Record) -> str:
        tier = request.tier
        return tier if tier is not None and tier in self._tier_names else self.lowest

    def _app_request(  # noqa: C901 (one flat loop per request; split, it costs calls)
        self, request: Record, method: str, host: str, path: str
    ) -> bool:
        cache_key = (method, host, path)
        limits = self._app_cache.get(cache_key)
        if limits is None:
            forms = self._forms(path)
            limits = [app for app in self.apps if app.matcher.matches_any(method, forms, host)]
            if len(self._app_cache) >= _CACHE_LIMIT:
                self._app_cache.clear()
            self._app_cache[cache_key] = limits
        if not limits:
            return False
        user = request.user
        tier = self.lowest if user is None else self._tier(request)
        by_user: Hashable = None if user is None else ("user", user)
        by_ip: Hashable = None
        checks: list[tuple[_AppCheck, Hashable]] = []
        later: dict[int, CountWhen] = {}
        for limit in limits:
            rates = limit.tiers.get(tier)
            if not rates:
                continue
            if by_user is None or limit.per_ip:
                if by_ip is None:
                    by_ip = ("ip", self._bucket(request.ip))
                identity = by_ip
            else:
                identity = by_user
                if limit.overrides:
                    rates = _own_rates(limit, user, request.at_us, rates)  # type: ignore[arg-type]
            for check in rates:
                if limit.count_when is not None:
                    later[len(checks)] = limit.count_when
                checks.append((check, identity))
        if later:
            return self._refused_then_answered(checks, later, request.at_us, request.cost)
        return self._refused(checks, request.at_us, request.cost)

    def _app_event(self, request: Record) -> ReplayLayer | None:
        """A record of the app's decision-event log: one hit of one named limit."""
        limit = self.app_by_name.get(request.limit or "")
        if limit is None:
            return None
        if request.tier == OVERRIDE_TIER:
            # Not the lowest tier's rates, which _tier would give it: not replayed at all.
            if OVERRIDE_EVENTS_NOTE not in self.notes:
                self.notes.append(OVERRIDE_EVENTS_NOTE)
            return None
        rates = limit.tiers.get(self._tier(request))
        if not rates:
            return None
        identity: Hashable = ("user", request.user or "")
        checks = [(check, identity) for check in rates]
        if limit.count_when is not None:
            # A hit of a count_when limit is its check; the count came later, with a status
            # the event log does not hold (applimit's record), so nothing is counted here.
            later = dict.fromkeys(range(len(checks)), limit.count_when)
            refused = self._refused_then_answered(checks, later, request.at_us, request.cost)
            layer = ReplayLayer.APP if refused else None
            self._count_answers(request, layer)
            return layer
        return ReplayLayer.APP if self._refused(checks, request.at_us, request.cost) else None

    @staticmethod
    def _refused(checks: list[tuple[_AppCheck, Hashable]], at: int, cost: int) -> bool:
        """One request through the app checks that apply to it, decided as decide.lua
        does (``edgegen_policy.decide``), and counted in their rows. True: refused.

        Row.count is inlined: this runs for every check of every request.
        """
        passed, verdicts = decide(
            [(check.model, identity, cost, check.shadow) for check, identity in checks], at
        )
        for (check, identity), verdict in zip(checks, verdicts, strict=True):
            row = check.row
            row.counted += 1
            window = at // row.period_us
            state = row.windows.get(identity)
            if state is None:
                row.windows[identity] = [window, cost, cost]
            elif state[0] == window:
                state[1] += cost
                if state[1] > state[2]:  # noqa: PLR1730 (cheaper than max() per check)
                    state[2] = state[1]
            else:
                state[0] = window
                state[1] = cost
                if cost > state[2]:  # noqa: PLR1730
                    state[2] = cost
            if not verdict.allowed:
                row.refused_by[identity] = row.refused_by.get(identity, 0) + 1
                if check.shadow:
                    row.shadow += 1
                else:
                    row.refused += 1
        return not passed

    def _refused_then_answered(
        self,
        checks: list[tuple[_AppCheck, Hashable]],
        later: dict[int, CountWhen],
        at: int,
        cost: int,
    ) -> bool:
        """:meth:`_refused` for a request some of whose checks have count_when (``later``,
        by index): every check decides before the request runs, as decide.lua's first
        phase; an admitted request counts the other checks at once and those after its
        answer (:meth:`_count_answers`). True: refused."""
        passed, verdicts = decide(
            [(check.model, identity, cost, check.shadow) for check, identity in checks],
            at,
            hit=False,
        )
        for index, ((check, identity), verdict) in enumerate(zip(checks, verdicts, strict=True)):
            row = check.row
            if not verdict.allowed:
                row.count(identity, at, cost)
                row.refuse(identity)
                if check.shadow:
                    row.shadow += 1
                else:
                    row.refused += 1
            elif index in later:
                # Counted after the answer, if the request runs and its status is listed.
                if passed:
                    self._answers.append(
                        _Answer(
                            ReplayLayer.APP,
                            later[index],
                            _recorder(check.model, verdict, cost),
                            identity,
                            row,
                            identity,
                        )
                    )
            else:
                # Reached, so counted in the row as _refused counts it, refused by another
                # limit or not; the model records only what the app records.
                row.count(identity, at, cost)
                if passed:
                    check.model.record(identity, verdict, at, cost)
        return not passed

    def sweep(self, now_us: int) -> None:
        """Let every model forget what can no longer change a decision."""
        for rule in self.rules:
            rule.counter.sweep(now_us)
        for binding in self.bindings:
            binding.counter.sweep(now_us)
        for app in self.apps:
            for checks in (*app.tiers.values(), *(own for _, own in app.overrides.values())):
                for check in checks:
                    check.model.sweep(now_us)

    def result(self) -> ReplayResult:
        """The counts so far."""
        return self.result_


def _recorder(model: AppModel, verdict: Verdict, cost: int) -> Callable[[Hashable, int], None]:
    """Phase 2 of an app check, for when the answer says the request counts."""

    def record(key: Hashable, now_us: int) -> None:
        model.record(key, verdict, now_us, cost)

    return record


def replay(
    policy: Policy, records: Iterable[Record], options: ReplayOptions | None = None
) -> ReplayResult:
    """Replay ``records`` (in time order) through ``policy``'s layers."""
    engine = Replay(policy, options)
    feed = engine.feed
    for record in records:
        feed(record)
    return engine.result()


def replay_pair(
    old: Policy, new: Policy, records: Iterable[Record], options: ReplayOptions | None = None
) -> tuple[ReplayResult, ReplayResult]:
    """Replay the same records through two policies in one pass (identities are labelled
    alike in both results)."""
    options = options or ReplayOptions()
    label = _identity_label(options.show_identities)
    before = Replay(old, options, label=label)
    after = Replay(new, options, label=label)
    for record in records:
        before.feed(record)
        after.feed(record)
    return before.result(), after.result()


__all__ = [
    "ASSUMPTIONS",
    "TIMELINE_COLUMNS",
    "Replay",
    "ReplayLayer",
    "ReplayOptions",
    "ReplayResult",
    "Row",
    "replay",
    "replay_pair",
]


def _own_rates(limit: _AppLimit, user: str, at: int, rates: list[_AppCheck]) -> list[_AppCheck]:
    """``rates``, or the checks of ``user``'s override of ``limit`` while it lasts."""
    own = limit.overrides.get(user)
    if own is not None and at < own[0]:
        return own[1]
    return rates
