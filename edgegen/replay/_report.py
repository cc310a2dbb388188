"""A replay's report: text for a terminal, Markdown for a PR comment, JSON for tools, and
a timeline chart (matplotlib, optional); and the impact of a policy change on recorded
traffic, for ``edgegen diff --traffic``.

Pure functions of :class:`~edgegen.replay._engine.ReplayResult` values, except :func:`write_chart`,
which writes the picture.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._text import code, markdown_text
from ..errors import UsageError
from ._engine import ASSUMPTIONS, TIMELINE_COLUMNS, ReplayLayer, ReplayResult, Row

REPORT_VERSION = 1
# At most this many points in a timeline (minutes are merged into wider buckets).
_TIMELINE_POINTS = 48
_NICE_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)


def _share(part: int, whole: int) -> str:
    if whole == 0:
        return "-"
    share = 100 * part / whole
    if part and share < 0.1:
        return "<0.1%"
    return f"{share:.1f}%"


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _when(at_us: int | None) -> str:
    # In whole microseconds: a float of seconds rounds the last moment of 9999 into 10000.
    if at_us is None:
        return "-"
    moment = _EPOCH + dt.timedelta(microseconds=at_us)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def _tier(row: Row) -> str:
    if row.who is not None:
        return f"{row.tier} ({row.who})"
    return row.tier if row.tier is not None else "-"


def _headroom(row: Row) -> str:
    """The busiest identity's peak count in one period against the limit."""
    busiest = row.busiest(1)
    if not busiest:
        return "-"
    _, peak = busiest[0]
    if peak <= row.limit:
        room = 100 * (row.limit - peak) / row.limit
        return f"peak {peak}/{row.rate.period} of {row.limit} ({room:.0f}% headroom)"
    return f"peak {peak}/{row.rate.period} of {row.limit} (over by {peak - row.limit})"


def _row_data(row: Row, result: ReplayResult) -> dict[str, Any]:
    label = result.label
    return {
        "layer": row.layer.value,
        "limit": row.name,
        "tier": row.tier,
        "user": row.who,
        "rate": str(row.rate),
        "action": row.action,
        "enforced": row.enforced,
        "counted": row.counted,
        "refused": row.refused,
        "challenged": row.challenged,
        "shadow_refused": row.shadow,
        "share_refused": (row.refused + row.challenged + row.shadow) / row.counted
        if row.counted
        else 0.0,
        "identities": row.identities,
        "identities_refused": len(row.refused_by),
        "busiest": [
            {"identity": label(identity), "peak": peak, "limit": row.limit}
            for identity, peak in row.busiest(3)
        ],
        "top_refused": [
            {"identity": label(identity), "refused": count} for identity, count in row.top_refused()
        ],
    }


def _bucket_minutes(first: int, last: int, stored: int) -> int:
    """The narrowest bucket width (a multiple of the timeline's own) that shows the minutes
    ``first`` to ``last`` in at most _TIMELINE_POINTS aligned buckets: one of
    _NICE_BUCKETS, else whole days, doubling, so the count stays bounded whatever the
    span."""
    for width in _NICE_BUCKETS:
        if width % stored == 0 and last // width - first // width < _TIMELINE_POINTS:
            return width
    width = 2 * _NICE_BUCKETS[-1]
    while width % stored or last // width - first // width >= _TIMELINE_POINTS:
        width *= 2
    return width


def timeline(result: ReplayResult) -> tuple[int, list[tuple[int, list[int]]]]:
    """The timeline in at most _TIMELINE_POINTS buckets: (bucket minutes, [(start minute,
    [admitted, blocked by rules, refused by the Worker, by the app, challenged at the edge])]),
    each request counted once (:data:`~edgegen.replay._engine.TIMELINE_COLUMNS`)."""
    line = result.timeline
    if line.start_minute is None or not line.minutes:
        return 1, []
    first = line.start_minute
    last = max(line.minutes) + line.width - 1
    width = _bucket_minutes(first, last, line.width)
    start = first - first % width
    buckets: dict[int, list[int]] = {}
    for minute, counts in line.minutes.items():
        into = buckets.setdefault(minute - minute % width, [0] * len(TIMELINE_COLUMNS))
        for index, value in enumerate(counts):
            into[index] += value
    empty = [0] * len(TIMELINE_COLUMNS)
    points = [(at, buckets.get(at, empty)) for at in range(start, last + 1, width)]
    return width, points


def to_json(
    result: ReplayResult, traffic: dict[str, Any] | None = None, policy: str | None = None
) -> dict[str, Any]:
    """The report as one JSON document (``version`` 1; docs/replay.md describes it)."""
    width, points = timeline(result)
    return {
        "version": REPORT_VERSION,
        "policy": policy,
        "traffic": traffic,
        "span": {"first": _when(result.first_us), "last": _when(result.last_us)},
        "requests": result.requests,
        "admitted": result.admitted,
        "refused": {layer.value: result.refused[layer] for layer in result.layers},
        "challenged": result.challenged,
        "layers": [layer.value for layer in result.layers],
        "rows": [_row_data(row, result) for row in result.rows],
        "timeline": {
            "bucket_minutes": width,
            "columns": ["start", "admitted", "rules", "worker", "app"],
            "points": [_json_point(at, counts) for at, counts in points],
        },
        "assumptions": list(ASSUMPTIONS),
        "notes": list(result.notes),
        "warnings": result.warnings,
    }


def _json_point(at: int, counts: Sequence[int]) -> list[Any]:
    """One timeline point as JSON: its "rules" count every request a rule stopped, blocked
    or challenged, as the report's "refused" totals do."""
    admitted, rules, worker, app, challenged = counts
    return [_when(at * 60_000_000), admitted, rules + challenged, worker, app]


_LAYER_NAME = {
    ReplayLayer.RULES: "Cloudflare's rules",
    ReplayLayer.WORKER: "the Worker",
    ReplayLayer.APP: "the app",
}
# What the reports call each outcome of a request, by timeline column: the summary's lines
# and the chart's legend say the same words.
OUTCOME_NAMES = {
    "admitted": "Admitted",
    "rules": f"Refused by {_LAYER_NAME[ReplayLayer.RULES]}",
    "worker": f"Refused by {_LAYER_NAME[ReplayLayer.WORKER]}",
    "app": f"Refused by {_LAYER_NAME[ReplayLayer.APP]}",
    "challenged": "Challenged at the edge",
}
_LAYER_COLUMN = {ReplayLayer.RULES: "rules", ReplayLayer.WORKER: "worker", ReplayLayer.APP: "app"}


def _quiet(rows: Sequence[Row], name: Callable[[str], str] = str) -> str | None:
    """A line naming the limits no recorded request reached (they have no row)."""
    names: list[str] = []
    for row in rows:
        if row.counted == 0:
            tier = f"{name(row.tier)} " if row.tier else ""
            names.append(f"{name(row.name)} ({tier}{row.rate})")
    if not names:
        return None
    return "No recorded request reached: " + ", ".join(names) + "."


def _layer_title(layer: ReplayLayer) -> str:
    return {
        ReplayLayer.RULES: "Cloudflare rules",
        ReplayLayer.WORKER: "Worker",
        ReplayLayer.APP: "App",
    }[layer]


def _table(rows: Sequence[Row], result: ReplayResult) -> list[list[str]]:
    out = []
    for row in rows:
        if row.counted == 0:
            continue
        refused = row.refused + row.challenged
        what = f"{refused:,}"
        if row.challenged:
            what += f" ({row.challenged:,} challenged)"
        if row.shadow:
            what = f"{row.shadow:,} (shadow: would refuse)"
        out.append(
            [
                row.name,
                _tier(row),
                str(row.rate),
                f"{row.counted:,}",
                what,
                _share(refused + row.shadow, row.counted),
                f"{len(row.refused_by):,} of {row.identities:,}",
                _headroom(row),
            ]
        )
    return out


_HEADER = [
    "limit",
    "tier",
    "rate",
    "requests",
    "refused",
    "share",
    "identities refused",
    "headroom",
]


def _summary(result: ReplayResult) -> list[str]:
    lines = [
        f"{result.requests:,} requests from {_when(result.first_us)} to {_when(result.last_us)}: "
        f"{result.admitted:,} admitted ({_share(result.admitted, result.requests)})."
    ]
    for layer in result.layers:
        refused = result.refused[layer]
        name = OUTCOME_NAMES[_LAYER_COLUMN[layer]]
        lines.append(f"{name}: {refused:,} ({_share(refused, result.requests)}).")
    if result.challenged:
        lines.append(f"{OUTCOME_NAMES['challenged']}: {result.challenged:,}.")
    lines.extend(f"Warning: {warning}." for warning in result.warnings)
    return lines


def _top_lines(result: ReplayResult) -> list[str]:
    lines = []
    for row in result.rows:
        top = row.top_refused(5)
        if not top:
            continue
        names = ", ".join(f"{result.label(identity)} ({count:,})" for identity, count in top)
        tier = f", {row.tier}" if row.tier else ""
        lines.append(f"{row.layer.value} {row.name}{tier}: {names}")
    return lines


def _timeline_lines(result: ReplayResult) -> list[str]:
    width, points = timeline(result)
    if not points:
        return []
    peak = max(sum(counts) for _, counts in points) or 1
    lines = [f"Timeline ({width} min per line; # admitted, x refused):"]
    for at, counts in points:
        admitted, refused = counts[0], sum(counts[1:])
        bar_admitted = round(40 * admitted / peak)
        bar_refused = round(40 * refused / peak) if refused else 0
        if refused and not bar_refused:
            bar_refused = 1
        stamp = _when(at * 60_000_000)[:16]
        lines.append(
            f"  {stamp}  {'#' * bar_admitted}{'x' * bar_refused}  {admitted:,} / {refused:,}"
        )
    return lines


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table
    ]


def to_text(result: ReplayResult, traffic_lines: Sequence[str] = ()) -> str:
    """The report for a terminal."""
    lines = [*traffic_lines, *_summary(result), ""]
    for layer in result.layers:
        rows = result.rows_of(layer)
        if not rows:
            continue
        lines.append(f"{_layer_title(layer)}:")
        table = _table(rows, result)
        if table:
            lines.extend("  " + line for line in _aligned([_HEADER, *table]))
        quiet = _quiet(rows)
        if quiet:
            lines.append("  " + quiet)
        lines.append("")
    top = _top_lines(result)
    if top:
        lines.append("Most refused identities:")
        lines.extend("  " + line for line in top)
        lines.append("")
    lines.extend(_timeline_lines(result))
    lines.append("")
    lines.append("Assumptions (docs/replay.md):")
    lines.extend(f"  - {text}" for text in (*ASSUMPTIONS, *result.notes))
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return lines


def to_markdown(result: ReplayResult, traffic_lines: Sequence[str] = ()) -> str:
    """The report for a PR comment."""
    lines = ["### Replay of recorded traffic", ""]
    lines.extend(f"{line}  " for line in traffic_lines)
    lines.extend(_summary(result))
    lines.append("")
    for layer in result.layers:
        rows = result.rows_of(layer)
        if not rows:
            continue
        lines.append(f"**{_layer_title(layer)}**")
        lines.append("")
        cells = [
            [markdown_text(row[0]), markdown_text(row[1]), *(_md_cell(c) for c in row[2:])]
            for row in _table(rows, result)
        ]
        if cells:
            lines.extend(_md_table(_HEADER, cells))
            lines.append("")
        quiet = _quiet(rows, code)
        if quiet:
            lines.append(quiet)
            lines.append("")
    top = _top_lines(result)
    if top:
        lines.append("<details><summary>Most refused identities</summary>")
        lines.append("")
        lines.extend(f"- {code(line)}" for line in top)
        lines.append("")
        lines.append("</details>")
        lines.append("")
    lines.append("<details><summary>Assumptions</summary>")
    lines.append("")
    # The assumptions are the tool's own prose; a note may name what the policy names.
    lines.extend(f"- {text}" for text in ASSUMPTIONS)
    lines.extend(f"- {markdown_text(text)}" for text in result.notes)
    lines.append("")
    lines.append("</details>")
    return "\n".join(lines) + "\n"


def write_chart(result: ReplayResult, path: Path, title: str = "Replay") -> None:
    """Draw the timeline (admitted, refused per layer and challenged at the edge, stacked)
    to an SVG or PNG file.

    matplotlib is an optional extra (``edgegen[chart]``); UsageError says how to install
    it when it is missing, and when the file's suffix is neither .svg nor .png.
    """
    suffix = path.suffix.lower()
    if suffix not in (".svg", ".png"):
        raise UsageError(f"--chart {path}: the chart is written as .svg or .png; name one")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError(
            "--chart needs matplotlib: pip install 'edgegen[chart]' (or pip install matplotlib)"
        ) from exc
    figure = _chart(plt, result, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


# Stacked from the bottom: what got through, then where the rest stopped, in the order
# traffic meets the layers.
_CHART_SERIES = (
    ("admitted", "#4c9a2a"),
    ("challenged", "#e6ab02"),
    ("rules", "#d95f02"),
    ("worker", "#7570b3"),
    ("app", "#e7298a"),
)


def _chart(plt: Any, result: ReplayResult, title: str) -> Any:
    """The chart's figure. Each series is named as the text report names that outcome
    (:data:`OUTCOME_NAMES`); the legend sits above the plotting area, outside it, so it
    never covers a bar."""
    from matplotlib import dates

    width, points = timeline(result)
    times = [dt.datetime.fromtimestamp(at * 60, tz=dt.UTC) for at, _ in points]
    column = {name: index for index, name in enumerate(TIMELINE_COLUMNS)}
    figure, axes = plt.subplots(figsize=(9, 4), dpi=110, layout="constrained")
    bottom = [0] * len(points)
    for key, colour in _CHART_SERIES:
        values = [counts[column[key]] for _, counts in points]
        if not any(values):
            continue
        axes.bar(
            times,
            values,
            width=width / 1440 * 0.9,
            bottom=bottom,
            label=OUTCOME_NAMES[key],
            color=colour,
            align="edge",
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    # Short date labels that need no rotation (rotating them adjusts the layout by hand,
    # which the constrained layout that places the legend does not allow).
    locator = dates.AutoDateLocator()  # type: ignore[no-untyped-call]  # unannotated in matplotlib
    formatter = dates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]  # likewise
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(formatter)
    axes.set_ylabel(f"requests per {width} min")
    axes.set_title(title)
    handles, labels = axes.get_legend_handles_labels()
    if handles:
        figure.legend(
            handles,
            labels,
            loc="outside upper center",
            ncols=min(3, len(handles)),
            fontsize="small",
        )
    return figure


# -- impact of a policy change ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Impact:
    """One limit and tier of one layer, before and after a policy change."""

    layer: ReplayLayer
    limit: str
    tier: str | None
    # The user of an override's row (tier "override"): rows are paired by it too.
    who: str | None
    rate_before: str | None
    rate_after: str | None
    counted_before: int
    counted_after: int
    refused_before: int
    refused_after: int
    identities_before: int
    identities_after: int
    newly_refused: int
    freed: int

    @property
    def changed(self) -> bool:
        """Whether anything differs between the two replays."""
        return (
            self.rate_before != self.rate_after
            or self.refused_before != self.refused_after
            or self.newly_refused != 0
            or self.freed != 0
        )


def _refusals(row: Row) -> int:
    return row.refused + row.challenged + row.shadow


_Key = tuple[ReplayLayer, str, str | None, str | None, int]


def _keyed(result: ReplayResult) -> dict[_Key, Row]:
    """Rows by (layer, limit, tier, override's user, position among that limit and tier's
    rates): one user's override is never paired with another's."""
    out: dict[_Key, Row] = {}
    for row in result.rows:
        index = 0
        while (row.layer, row.name, row.tier, row.who, index) in out:
            index += 1
        out[(row.layer, row.name, row.tier, row.who, index)] = row
    return out


def impact(before: ReplayResult, after: ReplayResult) -> list[Impact]:
    """Per limit and tier of every layer, what the change does to the recorded traffic."""
    old = _keyed(before)
    new = _keyed(after)
    order = list(old) + [key for key in new if key not in old]
    out = []
    for key in order:
        layer, name, tier, who, _ = key
        a = old.get(key)
        b = new.get(key)
        refused_a: set[Hashable] = set(a.refused_by) if a else set()
        refused_b: set[Hashable] = set(b.refused_by) if b else set()
        out.append(
            Impact(
                layer=layer,
                limit=name,
                tier=tier,
                who=who,
                rate_before=str(a.rate) if a else None,
                rate_after=str(b.rate) if b else None,
                counted_before=a.counted if a else 0,
                counted_after=b.counted if b else 0,
                refused_before=_refusals(a) if a else 0,
                refused_after=_refusals(b) if b else 0,
                identities_before=len(refused_a),
                identities_after=len(refused_b),
                newly_refused=len(refused_b - refused_a),
                freed=len(refused_a - refused_b),
            )
        )
    return out


def _impact_sentence(item: Impact) -> str:
    where = {
        ReplayLayer.RULES: "rule",
        ReplayLayer.WORKER: "Worker limit",
        ReplayLayer.APP: "app limit",
    }[item.layer]
    if item.who is not None:
        tier = f"the override for {code(item.who)} of "
    else:
        tier = f"{code(item.tier)} tier of " if item.tier else ""
    if item.rate_before == item.rate_after:
        rates = f"{item.rate_before} (unchanged)"
    else:
        rates = f"{item.rate_before or 'none'} -> {item.rate_after or 'none'}"
    if item.counted_before == 0 and item.counted_after == 0:
        return f"{tier}{where} {code(item.limit)} {rates}: no recorded request reached it"
    whom = (
        "requests"
        if item.tier is None
        else f"{code(item.who)}'s requests"
        if item.who is not None
        else f"{item.tier} requests"
    )
    share_before = _share(item.refused_before, item.counted_before)
    share_after = _share(item.refused_after, item.counted_after)
    text = (
        f"{tier}{where} {code(item.limit)} {rates}: refused {share_before} -> {share_after} of "
        f"{whom} ({item.refused_before:,} -> {item.refused_after:,}); "
        f"{item.identities_before:,} -> {item.identities_after:,} identities affected"
    )
    changes = []
    if item.newly_refused:
        changes.append(f"{item.newly_refused:,} newly refused")
    if item.freed:
        changes.append(f"{item.freed:,} freed")
    if changes:
        text += f" ({', '.join(changes)})"
    return text


def impact_lines(impacts: Sequence[Impact]) -> list[str]:
    """One sentence per changed limit and tier; a line saying so when nothing changed."""
    changed = [item for item in impacts if item.changed]
    if not changed:
        return ["No limit refuses differently on the recorded traffic."]
    return [_impact_sentence(item) for item in changed]


def impact_markdown(
    impacts: Sequence[Impact], before: ReplayResult, after: ReplayResult, source: str
) -> str:
    """The "Impact on recorded traffic" section of a PR comment."""
    lines = ["### Impact on recorded traffic", ""]
    share_before = _share(before.requests - before.admitted, before.requests)
    share_after = _share(after.requests - after.admitted, after.requests)
    lines.append(
        f"Replayed {before.requests:,} requests ({source}, {_when(before.first_us)} to "
        f"{_when(before.last_us)}): refused {share_before} -> {share_after} of all requests."
    )
    for warning in _warnings(before, after):
        lines.extend(["", f"**Warning:** {markdown_text(warning)}."])
    lines.append("")
    # Each name in a sentence is a code span already; a line break would end the item.
    lines.extend(f"- {' '.join(line.splitlines())}" for line in impact_lines(impacts))
    lines.append("")
    return "\n".join(lines)


def _warnings(before: ReplayResult, after: ReplayResult) -> list[str]:
    """The warnings of either replay, each once."""
    return list(dict.fromkeys([*before.warnings, *after.warnings]))


def impact_text(
    impacts: Sequence[Impact], before: ReplayResult, after: ReplayResult, source: str
) -> str:
    """The same section for a terminal."""
    lines = ["Impact on recorded traffic:"]
    lines.append(
        f"  {before.requests:,} requests ({source}): refused "
        f"{_share(before.requests - before.admitted, before.requests)} -> "
        f"{_share(after.requests - after.admitted, after.requests)}"
    )
    lines.extend(f"  Warning: {warning}." for warning in _warnings(before, after))
    lines.extend(f"  {line}" for line in impact_lines(impacts))
    return "\n".join(lines) + "\n"


def impact_json(
    impacts: Sequence[Impact], before: ReplayResult, after: ReplayResult
) -> dict[str, Any]:
    """The section as JSON."""
    return {
        "requests": before.requests,
        "refused_before": before.requests - before.admitted,
        "refused_after": after.requests - after.admitted,
        "warnings": _warnings(before, after),
        "limits": [
            {
                "layer": item.layer.value,
                "limit": item.limit,
                "tier": item.tier,
                "user": item.who,
                "rate_before": item.rate_before,
                "rate_after": item.rate_after,
                "counted_before": item.counted_before,
                "counted_after": item.counted_after,
                "refused_before": item.refused_before,
                "refused_after": item.refused_after,
                "identities_before": item.identities_before,
                "identities_after": item.identities_after,
                "newly_refused": item.newly_refused,
                "freed": item.freed,
            }
            for item in impacts
            if item.changed
        ],
    }
