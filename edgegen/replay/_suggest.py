"""Suggested app limits from recorded traffic: for each app limit, tier and rate, the
smallest count per period at which no more than a target share of identities would ever
be refused (a floor), and what to make of it.

The method (docs/replay.md, "Suggestions"): the replay runs the policy as it is, so the
edge's refusals still apply; every request that reaches an app limit is counted, admitted
or not, in a sliding window of that rate's period for its identity, and each identity's
peak (the most it ever sent within one period) is kept. Under sliding_log an identity is
refused at least once exactly when its peak exceeds the limit: if no window holds more than
``limit`` requests nothing is refused, and in a window that holds more, the request that
would be the ``limit + 1``-th is refused because refused requests are not recorded. So the
limit that refuses at most a share ``p`` of the N identities is the peak of the
``floor(p * N) + 1``-th busiest identity. A limit with ``count_when`` counts only the
requests whose logged status it lists (a record without a status counts nothing), and
refuses the request after the ``limit``-th of them, so there the figure is a guide too.
For sliding_window (a weighted estimate of that
count) and gcra (a smooth rate with a burst) the same figure is a close guide, not exact;
the report says which.

A floor is not advice to loosen a limit, so three rules turn floors into suggestions:

- **Tier order.** Tiers are ordered least to most generous; a tier's suggestion is raised
  to what the tier below it admits in a window of the same length (the policy's own
  ``allowance``, as lint L101 compares tiers), so the suggestions never invert the tiers.
- **Small samples.** Fewer than :data:`MIN_IDENTITIES` identities, fewer than
  :data:`MIN_REQUESTS` requests, or less than :data:`MIN_SPAN_PERIODS` periods of the
  rate observed: the row says so, and a floor above today's rate is not suggested.
- **Refusals that may be attacks.** A limit that guards exact paths for POST (a login, a
  form), or whose refusals today come mostly from a few identities: a floor above today's
  rate would admit them, so today's rate is kept and the report says why.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from edgegen_policy import Algorithm, CountWhen, Limit, Policy, Rate, allowance

from .._text import markdown_text
from ._engine import Replay, ReplayLayer, ReplayOptions, Row, _AppCheck
from ._types import Record

# A sample too small to say anything about one limit, tier and rate: fewer identities than
# this (or than 1/target, so that the target allows at least one identity refused), fewer
# requests, or a span of traffic shorter than this many periods of the rate.
MIN_IDENTITIES: Final = 100
MIN_REQUESTS: Final = 1_000
MIN_SPAN_PERIODS: Final = 10
# Refusals concentrated on few identities: at least this share of the requests a rate
# refuses today come from at most this many identities.
FEW_IDENTITIES: Final = 5
CONCENTRATED_SHARE: Final = 0.9
# Methods that read: a limit on them is no login or form.
_READS = frozenset(("GET", "HEAD", "OPTIONS"))


class _Peaks:
    """Sliding-window peaks per identity for one period."""

    __slots__ = ("open", "peaks", "period_us")

    def __init__(self, period_us: int) -> None:
        self.period_us = period_us
        # identity -> (entries within one period, their total)
        self.open: dict[Hashable, tuple[deque[tuple[int, int]], list[int]]] = {}
        self.peaks: dict[Hashable, int] = {}

    def add(self, identity: Hashable, at_us: int, cost: int) -> None:
        entry = self.open.get(identity)
        if entry is None:
            entry = self.open[identity] = (deque(), [0])
        queue, total = entry
        cutoff = at_us - self.period_us
        while queue and queue[0][0] <= cutoff:
            total[0] -= queue.popleft()[1]
        queue.append((at_us, cost))
        total[0] += cost
        if total[0] > self.peaks.get(identity, 0):
            self.peaks[identity] = total[0]

    def sweep(self, now_us: int) -> None:
        cutoff = now_us - self.period_us
        idle = [identity for identity, (queue, _) in self.open.items() if queue[-1][0] <= cutoff]
        for identity in idle:
            del self.open[identity]


class _SuggestReplay(Replay):
    """A replay that also keeps every app rate's sliding peaks per identity."""

    def __init__(self, policy: Policy, options: ReplayOptions | None = None) -> None:
        super().__init__(policy, options)
        self._status: int | None = None
        self.peaks: dict[int, _Peaks] = {
            id(row): _Peaks(row.period_us) for row in self.rows if row.layer is ReplayLayer.APP
        }

    def _refused(  # type: ignore[override]
        self, checks: list[tuple[_AppCheck, Hashable]], at: int, cost: int
    ) -> bool:
        for check, identity in checks:
            self.peaks[id(check.row)].add(identity, at, cost)
        return Replay._refused(checks, at, cost)

    def _request(self, request: Record) -> ReplayLayer | None:
        self._status = request.status
        return super()._request(request)

    def _refused_then_answered(
        self,
        checks: list[tuple[_AppCheck, Hashable]],
        later: dict[int, CountWhen],
        at: int,
        cost: int,
    ) -> bool:
        # A limit with count_when: the peaks hold the requests whose logged answer it lists,
        # admitted or not today, as the peaks of other limits hold every request.
        status = self._status
        for index, (check, identity) in enumerate(checks):
            count_when = later.get(index)
            if count_when is None or (status is not None and count_when.counts(status)):
                self.peaks[id(check.row)].add(identity, at, cost)
        return super()._refused_then_answered(checks, later, at, cost)

    def sweep(self, now_us: int) -> None:
        super().sweep(now_us)
        for peaks in self.peaks.values():
            peaks.sweep(now_us)


@dataclass(frozen=True, slots=True)
class Suggestion:
    """One app limit, tier and rate: what it is, what the traffic shows, and what is
    suggested.

    ``floor`` is the least count per period that refuses at most the target share of the
    ``identities`` (None without traffic); ``suggested`` is the floor after the tier order
    (``raised_for``: the lower tier it was raised to match) and, when the floor is above
    today's ``current`` count and the sample is small or the refusals may be attacks, today's
    count (``kept``). ``small_sample`` says why the sample is too small (empty when it is
    not); ``attack`` why refusals may be attacks (only for a floor above today's rate).
    """

    limit: str
    tier: str
    algorithm: Algorithm
    rate: str
    period: str
    current: int
    identities: int
    requests: int
    span_us: int
    refused_now: int
    floor: int | None
    refused_floor: int
    suggested: int | None
    refused_suggested: int
    exact: bool
    raised_for: str | None = None
    kept: bool = False
    small_sample: tuple[str, ...] = ()
    attack: str | None = None

    @property
    def suggested_rate(self) -> str | None:
        """The suggested rate, written as the policy writes rates."""
        return None if self.suggested is None else f"{self.suggested}/{self.period}"

    @property
    def floor_rate(self) -> str | None:
        """The floor, written as the policy writes rates."""
        return None if self.floor is None else f"{self.floor}/{self.period}"

    @property
    def looser(self) -> bool:
        """Whether the suggestion admits more than today's rate."""
        return self.suggested is not None and self.suggested > self.current

    @property
    def name(self) -> str:
        """The limit, tier and rate in a few words."""
        return f"{self.limit} {self.tier} {self.rate}".replace("  ", " ")


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


def _login_style(limit: Limit) -> bool:
    """A limit on exact paths for POST and no reading method: a login or a form, where
    refusals are what brute force and credential stuffing meet."""
    match = limit.match
    methods = set(match.methods)
    return (
        bool(match.paths) and not match.path_prefix and "POST" in methods and not (methods & _READS)
    )


def _attack(limit: Limit, row: Row) -> str | None:
    """Why the requests this rate refuses today may be attacks, or None."""
    reasons = []
    if _login_style(limit):
        reasons.append(f"{limit.name} guards exact paths for POST, as a login or a form does")
    refused = sorted(row.refused_by.values(), reverse=True)
    total = sum(refused)
    few = sum(refused[:FEW_IDENTITIES])
    if total and few >= CONCENTRATED_SHARE * total:
        whom = _plural(min(len(refused), FEW_IDENTITIES), "identity", "identities")
        reasons.append(
            f"{few / total:.0%} of the {total:,} requests it refuses today come from {whom}"
        )
    return "; ".join(reasons) or None


def _length(us: int) -> str:
    seconds = us / 1_000_000
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def min_identities(target: float) -> int:
    """The fewest identities that say anything at ``target``: :data:`MIN_IDENTITIES`, or
    more when fewer would let the target refuse no identity at all (the floor would then be
    the busiest identity's peak, whoever that is)."""
    if target <= 0:
        return MIN_IDENTITIES
    return max(MIN_IDENTITIES, math.ceil(round(1 / target, 6)))


def _small_sample(row: Row, identities: int, span_us: int, target: float) -> tuple[str, ...]:
    """Why the traffic is too little to say anything about this row (empty: it is not)."""
    requests = row.counted
    if identities == 0:
        return ()
    reasons = []
    fewest = min_identities(target)
    if identities < fewest:
        reasons.append(f"{_plural(identities, 'identity', 'identities')}, fewer than {fewest:,}")
    if requests < MIN_REQUESTS:
        reasons.append(f"{_plural(requests, 'request', 'requests')}, fewer than {MIN_REQUESTS:,}")
    if span_us < MIN_SPAN_PERIODS * row.period_us:
        reasons.append(
            f"{_length(span_us)} of traffic, less than {MIN_SPAN_PERIODS} periods of "
            f"{row.rate.period}"
        )
    return tuple(reasons)


@dataclass(frozen=True, slots=True)
class _Below:
    """The rates the tier below ends with (its suggestions, else today's rates)."""

    tier: str
    rates: tuple[Rate, ...]


def _suggest_row(
    row: Row,
    peaks: dict[Hashable, int],
    target: float,
    *,
    limit: Limit,
    span_us: int,
    below: _Below | None,
) -> Suggestion:
    assert limit.app is not None
    values = sorted(peaks.values(), reverse=True)
    n = len(values)
    allowed = int(target * n)
    floor = None if n == 0 else max(1, values[allowed] if allowed < n else 1)
    current = row.limit
    small = _small_sample(row, n, span_us, target)
    attack = _attack(limit, row) if floor is not None and floor > current else None
    kept = floor is not None and floor > current and bool(small or attack)
    # What the tier below admits in one period of this rate: never suggest less.
    need = 0
    if below is not None:
        need = math.ceil(allowance(below.rates, row.rate.period.ms) - 1e-9)
    base = current if kept else floor
    if base is None:
        # No traffic: a rate is suggested only when the tier order asks for one.
        suggested = need if need > current else None
        raised = suggested is not None
    else:
        suggested = max(base, need)
        raised = need > base

    def refused_at(count: int | None) -> int:
        return 0 if count is None else sum(1 for value in values if value > count)

    return Suggestion(
        limit=row.name,
        tier=row.tier or "",
        algorithm=limit.app.algorithm,
        rate=str(row.rate),
        period=str(row.rate.period),
        current=current,
        identities=n,
        requests=row.counted,
        span_us=span_us,
        refused_now=refused_at(current),
        floor=floor,
        refused_floor=refused_at(floor),
        suggested=suggested,
        refused_suggested=refused_at(suggested),
        exact=limit.app.algorithm is Algorithm.SLIDING_LOG,
        raised_for=below.tier if raised and below is not None else None,
        kept=kept,
        small_sample=small,
        attack=attack,
    )


def suggest(
    policy: Policy,
    records: Iterable[Record],
    target: float,
    options: ReplayOptions | None = None,
) -> tuple[list[Suggestion], Replay]:
    """Suggestions for every app limit, tier and rate of ``policy`` from ``records``;
    ``target`` is the share of identities that may be refused (0.01 for 1 %)."""
    if not 0 <= target < 1:
        raise ValueError("the target share must be at least 0 and below 1")
    engine = _SuggestReplay(policy, options)
    for record in records:
        engine.feed(record)
    first, last = engine.result().first_us, engine.result().last_us
    span_us = 0 if first is None or last is None else last - first
    limits = {limit.name: limit for limit in policy.limits if limit.app is not None}
    # limit -> tier -> its rows, in the policy's order of limits and of tiers.
    grouped: dict[str, dict[str, list[Row]]] = {}
    for row in engine.rows:
        if row.layer is ReplayLayer.APP:
            grouped.setdefault(row.name, {}).setdefault(row.tier or "", []).append(row)
    out: list[Suggestion] = []
    for name, tiers in grouped.items():
        below: _Below | None = None
        for tier in policy.tiers:
            rows = tiers.get(tier)
            if not rows:
                continue
            items = [
                _suggest_row(
                    row,
                    engine.peaks[id(row)].peaks,
                    target,
                    limit=limits[name],
                    span_us=span_us,
                    below=below,
                )
                for row in rows
            ]
            out.extend(items)
            below = _Below(
                tier,
                tuple(
                    Rate(
                        item.suggested if item.suggested is not None else item.current,
                        row.rate.period,
                    )
                    for item, row in zip(items, rows, strict=True)
                ),
            )
    return out, engine


def _pct(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f}%"


def meaning(target: float) -> str:
    """What a suggestion is, in two sentences, for every format of the report."""
    return (
        "Each suggestion is a floor: the least rate that admits the observed traffic with at "
        f"most {target:.2%} of identities refused. It is not a recommendation to loosen a "
        'limit: a suggestion above today\'s rate is marked "looser than today", and a floor '
        "above today's rate is not suggested (today's rate is kept) when the sample is small "
        "or today's refusals may be attacks."
    )


def _notes(item: Suggestion) -> list[str]:
    """The short marks of a row, for the table's last column."""
    notes = []
    if item.small_sample:
        notes.append("small sample")
    if item.kept:
        notes.append(f"kept: floor {item.floor_rate} is looser than today")
    if item.looser:
        notes.append("looser than today")
    if item.raised_for is not None:
        notes.append(f"raised for tier order (floor {item.floor_rate or 'none'})")
    return notes


def _kept_why(item: Suggestion) -> str:
    if item.attack is not None:
        return (
            f"today's refusals may be attacks ({item.attack}): brute force, credential "
            "stuffing or scraping, which a looser rate would admit; loosen it only if you "
            "know those callers"
        )
    return "the sample is too small to loosen a limit on"


def warning_groups(items: Sequence[Suggestion], target: float) -> list[tuple[str, list[str]]]:
    """What a reader must know before acting on the suggestions: (heading, one entry per
    row) for each kind of warning that applies, in the order to read them."""
    small = [f"{item.name}: {'; '.join(item.small_sample)}" for item in items if item.small_sample]
    kept = [
        f"{item.name}: the floor {item.floor_rate} is looser; {_kept_why(item)}"
        for item in items
        if item.kept
    ]
    looser = [
        f"{item.name}: {item.suggested_rate}" + (" (for the tier order)" if item.raised_for else "")
        for item in items
        if item.looser
    ]
    raised = [
        f"{item.name}: floor {item.floor_rate or 'none (no traffic)'}, raised to "
        f"{item.suggested_rate} to admit no less than the {item.raised_for} tier"
        for item in items
        if item.raised_for is not None
    ]
    groups = [
        (
            "Small sample: too little traffic to say anything (fewer than "
            f"{min_identities(target):,} identities, fewer than {MIN_REQUESTS:,} requests, or "
            f"less than {MIN_SPAN_PERIODS} periods of the rate observed); these suggestions "
            "are no evidence for a change",
            small,
        ),
        ("Kept at today's rate: the floor is looser than today, and not suggested", kept),
        (
            "Looser than today: the traffic went over today's rate; loosen a limit only if "
            "the callers it refuses are ones you mean to serve",
            looser,
        ),
        (
            "Raised to keep the tiers in order: a higher tier is never suggested less than "
            "the tier below it admits",
            raised,
        ),
    ]
    return [(heading, entries) for heading, entries in groups if entries]


def row_warnings(item: Suggestion) -> list[str]:
    """What a reader must know about one row before acting on it, in sentences that stand
    alone (for JSON)."""
    out = []
    name = item.name
    if item.small_sample:
        out.append(
            f"{name}: small sample ({'; '.join(item.small_sample)}): too little traffic to "
            "say anything; the suggestion is no evidence for a change."
        )
    if item.kept:
        out.append(
            f"{name}: the floor {item.floor_rate} is looser than today's {item.rate} and is "
            f"not suggested: {_kept_why(item)}."
        )
    if item.looser:
        out.append(
            f"{name}: {item.suggested_rate} is looser than today's {item.rate}: the traffic "
            "went over today's rate; loosen it only if the callers it refuses are ones you "
            "mean to serve."
        )
    if item.raised_for is not None:
        out.append(
            f"{name}: raised from the floor {item.floor_rate or 'none (no traffic)'} to "
            f"{item.suggested_rate} so that it admits no less than the {item.raised_for} "
            "tier below it (tiers are ordered least to most generous)."
        )
    return out


def _unreached(items: Sequence[Suggestion]) -> str | None:
    names = [item.name for item in items if item.identities == 0 and item.suggested is None]
    if not names:
        return None
    return "No recorded request reached: " + ", ".join(names) + "."


def suggestions_table(items: list[Suggestion]) -> list[list[str]]:
    """Rows for a text or Markdown table (the first is the header)."""
    header = [
        "limit",
        "tier",
        "rate",
        "identities",
        "requests",
        "refused now",
        "suggested",
        "refused then",
        "note",
    ]
    rows = [header]
    for item in items:
        suggested = item.suggested_rate or "-"
        if not item.exact and item.suggested is not None:
            suggested += f" (guide: {item.algorithm.value})"
        rows.append(
            [
                item.limit,
                item.tier,
                item.rate,
                f"{item.identities:,}",
                f"{item.requests:,}",
                f"{item.refused_now:,} ({_pct(item.refused_now, item.identities)})",
                suggested,
                f"{item.refused_suggested:,} ({_pct(item.refused_suggested, item.identities)})",
                "; ".join(_notes(item)),
            ]
        )
    return rows


def _closing_lines(items: Sequence[Suggestion]) -> list[str]:
    lines = []
    unreached = _unreached(items)
    if unreached:
        lines.append(unreached)
    lines.append(
        "Exact for sliding_log; for sliding_window and gcra a guide (docs/replay.md, Suggestions)."
    )
    return lines


def _heading(target: float) -> str:
    return f"Suggested app rates (floors): at most {target:.2%} of identities refused"


def suggestions_text(
    items: list[Suggestion], target: float, traffic_lines: Sequence[str] = ()
) -> str:
    """The suggestions for a terminal: what was read, the table, what a suggestion is, and
    the warnings of each row."""
    table = suggestions_table(items)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [*traffic_lines, _heading(target) + ":"]
    lines.extend(
        "  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in table
    )
    lines.append(meaning(target))
    for heading, entries in warning_groups(items, target):
        lines.append(f"{heading}:")
        lines.extend(f"  - {entry}" for entry in entries)
    lines.extend(_closing_lines(items))
    return "\n".join(lines) + "\n"


def suggestions_markdown(items: list[Suggestion], target: float) -> str:
    """The suggestions for a PR comment (every cell and sentence escaped)."""
    table = suggestions_table(items)
    lines = [f"### {markdown_text(_heading(target))}", ""]
    lines.append("| " + " | ".join(table[0]) + " |")
    lines.append("|" + "|".join("---" for _ in table[0]) + "|")
    lines.extend("| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in table[1:])
    lines.extend(["", markdown_text(meaning(target)), ""])
    for heading, entries in warning_groups(items, target):
        lines.extend([f"**{markdown_text(heading)}:**", ""])
        lines.extend(f"- {markdown_text(entry)}" for entry in entries)
        lines.append("")
    lines.extend(f"{markdown_text(line)}  " for line in _closing_lines(items))
    return "\n".join(lines) + "\n"


def suggestions_json(items: list[Suggestion], target: float) -> dict[str, Any]:
    """The suggestions as JSON."""
    return {
        "version": 1,
        "target": target,
        "meaning": meaning(target),
        "thresholds": {
            "min_identities": min_identities(target),
            "min_requests": MIN_REQUESTS,
            "min_span_periods": MIN_SPAN_PERIODS,
            "few_identities": FEW_IDENTITIES,
            "concentrated_share": CONCENTRATED_SHARE,
        },
        "suggestions": [
            {
                "limit": item.limit,
                "tier": item.tier,
                "algorithm": item.algorithm.value,
                "rate": item.rate,
                "identities": item.identities,
                "requests": item.requests,
                "span_seconds": item.span_us / 1_000_000,
                "refused_now": item.refused_now,
                "floor": item.floor_rate,
                "refused_floor": item.refused_floor,
                "suggested": item.suggested_rate,
                "refused_suggested": item.refused_suggested,
                "exact": item.exact,
                "looser_than_today": item.looser,
                "kept_at_current": item.kept,
                "raised_for_tier": item.raised_for,
                "small_sample": list(item.small_sample),
                "refusals_may_be_attacks": item.attack,
                "warnings": row_warnings(item),
            }
            for item in items
        ],
        "warnings": [text for item in items for text in row_warnings(item)],
    }
