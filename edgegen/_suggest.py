"""Suggested app limits from recorded traffic: for each app limit, tier and rate, the
smallest count per period at which no more than a target share of identities would ever
be refused.

The method (docs/replay.md, "Suggestions"): the replay runs the policy as it is, so the
edge's refusals still apply; every request that reaches an app limit is counted, admitted
or not, in a sliding window of that rate's period for its identity, and each identity's
peak (the most it ever sent within one period) is kept. Under sliding_log an identity is
refused at least once exactly when its peak exceeds the limit: if no window holds more than
``limit`` requests nothing is refused, and in a window that holds more, the request that
would be the ``limit + 1``-th is refused because refused requests are not recorded. So the
limit that refuses at most a share ``p`` of the N identities is the peak of the
``floor(p * N) + 1``-th busiest identity. For sliding_window (a weighted estimate of that
count) and gcra (a smooth rate with a burst) the same figure is a close guide, not exact;
the report says which.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from edgegen_policy import Algorithm, Policy

from ._replay import Layer, Replay, ReplayOptions, Row, _AppCheck
from ._replay_types import Request


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
        self.peaks: dict[int, _Peaks] = {
            id(row): _Peaks(row.period_us) for row in self.rows if row.layer is Layer.APP
        }

    def _decide(  # type: ignore[override]
        self, checks: list[tuple[_AppCheck, Hashable]], at: int, cost: int
    ) -> bool:
        for check, identity in checks:
            self.peaks[id(check.row)].add(identity, at, cost)
        return Replay._decide(checks, at, cost)

    def sweep(self, now_us: int) -> None:
        super().sweep(now_us)
        for peaks in self.peaks.values():
            peaks.sweep(now_us)


@dataclass(frozen=True, slots=True)
class Suggestion:
    """One app limit, tier and rate: what it is, and what the traffic suggests."""

    limit: str
    tier: str
    algorithm: Algorithm
    rate: str
    period: str
    identities: int
    refused_now: int
    suggested: int | None
    refused_suggested: int
    exact: bool

    @property
    def suggested_rate(self) -> str | None:
        """The suggested rate, written as the policy writes rates."""
        return None if self.suggested is None else f"{self.suggested}/{self.period}"


def _suggest_row(
    row: Row, peaks: dict[Hashable, int], target: float, algorithm: Algorithm
) -> Suggestion:
    values = sorted(peaks.values(), reverse=True)
    n = len(values)
    allowed = int(target * n)
    suggested = None if n == 0 else max(1, values[allowed] if allowed < n else 1)
    return Suggestion(
        limit=row.name,
        tier=row.tier or "",
        algorithm=algorithm,
        rate=str(row.rate),
        period=str(row.rate.period),
        identities=n,
        refused_now=sum(1 for value in values if value > row.limit),
        suggested=suggested,
        refused_suggested=0 if suggested is None else sum(1 for v in values if v > suggested),
        exact=algorithm is Algorithm.SLIDING_LOG,
    )


def suggest(
    policy: Policy,
    records: Iterable[Request],
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
    algorithms = {
        limit.name: limit.app.algorithm for limit in policy.limits if limit.app is not None
    }
    out = [
        _suggest_row(row, engine.peaks[id(row)].peaks, target, algorithms[row.name])
        for row in engine.rows
        if row.layer is Layer.APP
    ]
    return out, engine


def _pct(part: int, whole: int) -> str:
    return "-" if whole == 0 else f"{100 * part / whole:.1f}%"


def suggestions_table(items: list[Suggestion]) -> list[list[str]]:
    """Rows for a text or Markdown table."""
    header = ["limit", "tier", "rate", "identities", "refused now", "suggested", "refused then"]
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
                f"{item.refused_now:,} ({_pct(item.refused_now, item.identities)})",
                suggested,
                f"{item.refused_suggested:,} ({_pct(item.refused_suggested, item.identities)})",
            ]
        )
    return rows


def suggestions_json(items: list[Suggestion], target: float) -> dict[str, Any]:
    """The suggestions as JSON."""
    return {
        "version": 1,
        "target": target,
        "suggestions": [
            {
                "limit": item.limit,
                "tier": item.tier,
                "algorithm": item.algorithm.value,
                "rate": item.rate,
                "identities": item.identities,
                "refused_now": item.refused_now,
                "suggested": item.suggested_rate,
                "refused_suggested": item.refused_suggested,
                "exact": item.exact,
            }
            for item in items
        ],
    }
