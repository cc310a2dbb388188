"""The replay chart (``--chart``) says what the text report says: each series is named with
the report's words for that outcome (a managed challenge is "Challenged at the edge", not a
refusal by the rules), and its legend sits where it covers no bar."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest

matplotlib = pytest.importorskip("matplotlib")

from matplotlib.figure import Figure  # noqa: E402 (after the skip when matplotlib is missing)
from matplotlib.transforms import Bbox, BboxBase  # noqa: E402

from edgegen.replay._engine import ReplayLayer, ReplayResult, replay  # noqa: E402
from edgegen.replay._report import to_json, to_text, write_chart  # noqa: E402
from edgegen.replay._types import Record  # noqa: E402

T0 = 1_764_748_800_000_000  # 2025-12-03T08:00:00Z in µs
S = 1_000_000

# A login rule that challenges, a Worker limit that blocks, an app limit that refuses.
POLICY = """
version: 1
cloudflare:
  plan: business
  worker: { name: edge-limits, routes: ["hooks.example.com/*"] }
tiers: [free, pro]
limits:
  - name: login
    match: { paths: [/login], methods: [POST] }
    edge: { rate: 5/1m, action: managed_challenge, unauthenticated_only: false }
  - name: hooks
    match: { hosts: [hooks.example.com], path_prefix: /webhooks/ }
    edge: { rate: 10/10s, unauthenticated_only: false, target: worker }
  - name: api
    match: { path_prefix: /api/ }
    app: { per: user, algorithm: sliding_log, tiers: { free: 20/1m, pro: 200/1m } }
"""


def at(second: float) -> int:
    return T0 + round(second * S)


def records() -> list[Record]:
    """Forty minutes: steady API use all along, a user over the API quota in the first five
    minutes (the tallest bars, under the plot's top-left corner), a password guesser at
    minutes 20-24 and a webhook flood at minutes 30-32."""
    api, hooks = "api.example.com", "hooks.example.com"
    out = [
        Record(at(s), "GET", api, "/api/items", "192.0.2.1", f"u{s % 7}", "free", True)
        for s in range(0, 40 * 60, 2)
    ]
    out += [
        Record(at(s + 0.1), "GET", api, "/api/items", "192.0.2.9", "heavy", "free", True)
        for s in range(5 * 60)
    ]
    out += [
        Record(at(s + 0.2), "POST", "www.example.com", "/login", "198.51.100.7")
        for s in range(20 * 60, 24 * 60, 2)
    ]
    out += [
        Record(at(s + 0.3 + k / 10), "POST", hooks, "/webhooks/p1", "203.0.113.5")
        for s in range(30 * 60, 32 * 60)
        for k in range(3)
    ]
    return sorted(out, key=lambda r: r.at_us)


@pytest.fixture(scope="module")
def result() -> ReplayResult:
    outcome = replay(policy.loads(POLICY), records())
    # Every kind of outcome is there; the rules challenged and blocked nothing.
    assert outcome.challenged > 0
    assert outcome.refused[ReplayLayer.WORKER] > 0 and outcome.refused[ReplayLayer.APP] > 0
    rules = outcome.rows_of(ReplayLayer.RULES)
    assert sum(row.refused for row in rules) == 0
    return outcome


@dataclass
class Drawn:
    """What the saved chart shows, measured on the figure as it was saved (Agg)."""

    labels: list[str]
    legend: Bbox
    plot: Bbox
    bars: list[Bbox]
    figure: BboxBase


def _measure(figure: Figure) -> Drawn:
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    (axes,) = figure.axes
    legend = axes.get_legend() or (figure.legends[0] if figure.legends else None)
    assert legend is not None
    return Drawn(
        labels=[text.get_text() for text in legend.get_texts()],
        legend=legend.get_window_extent(renderer),
        plot=axes.get_window_extent(renderer),
        bars=[patch.get_window_extent(renderer) for patch in axes.patches],
        figure=figure.bbox,
    )


@pytest.fixture
def drawn(result: ReplayResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Drawn:
    """The chart write_chart saves, rendered with matplotlib's Agg backend."""
    seen: list[Drawn] = []
    original = Figure.savefig

    def save(self: Figure, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        seen.append(_measure(self))

    monkeypatch.setattr(Figure, "savefig", save)
    path = tmp_path / "chart.svg"
    write_chart(result, path, title="Replay of a test")
    assert path.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert matplotlib.get_backend().lower() == "agg"
    (chart,) = seen
    return chart


def test_the_chart_names_each_outcome_as_the_text_report_does(
    result: ReplayResult, drawn: Drawn
) -> None:
    """The legend's labels are the text report's words: a request a managed_challenge rule
    stopped is "Challenged at the edge" in both, and no series says the rules refused it."""
    labels = drawn.labels
    assert labels == [
        "Admitted",
        "Challenged at the edge",
        "Refused by the Worker",
        "Refused by the app",
    ]
    lines = to_text(result).splitlines()
    assert f" {labels[0].lower()} (" in lines[0]  # "N requests from ... to ...: N admitted (x%)."
    for label in labels[1:]:
        assert any(line.startswith(f"{label}: ") for line in lines), label


def test_the_legend_covers_no_bar(drawn: Drawn) -> None:
    """Rendered, the legend's box lies outside the plotting area, so it overlaps no bar
    (the tallest bars stand at the left, where a legend in the top-left corner covered
    them), and the figure holds it whole."""
    assert drawn.bars
    assert not drawn.legend.overlaps(drawn.plot)
    assert not any(drawn.legend.overlaps(bar) for bar in drawn.bars if bar.height > 0)
    box = drawn.legend
    assert drawn.figure.contains(box.x0, box.y0) and drawn.figure.contains(box.x1, box.y1)


def test_the_json_timeline_counts_challenges_with_the_rules(result: ReplayResult) -> None:
    """The JSON timeline keeps its columns: "rules" counts what the rules stopped,
    challenged or blocked, as the totals do, and every request is in one column."""
    data = json.loads(json.dumps(to_json(result)))
    columns = data["timeline"]["columns"]
    assert columns == ["start", "admitted", "rules", "worker", "app"]
    points = data["timeline"]["points"]
    assert sum(point[2] for point in points) == data["refused"]["rules"] == result.challenged
    assert sum(sum(point[1:]) for point in points) == data["requests"]
