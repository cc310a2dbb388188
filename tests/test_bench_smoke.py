"""Smoke test of the benchmark runner, so ``make bench`` does not rot between runs.

It runs one benchmark in quick mode into a temporary directory and checks that the
results, the report and the chart are well formed. It never looks at the numbers'
size: timings on a shared machine are not something a test can assert.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATUSES = {"PASS", "MISS", "N/A"}


def test_quick_run_writes_results_report_and_chart(tmp_path: Path) -> None:
    """``python -m bench.run --quick --only sync,redis_cost`` exits 0 and writes a JSON
    result with every variant's rates, targets with a status, a Markdown report listing
    them (and the build of applimit measured), and an SVG chart beside it; redis_cost's
    ladder of the script's time in Redis has every step, each costing something."""
    docs = tmp_path / "docs" / "benchmarks.md"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--quick",
            "--only",
            "sync,redis_cost",
            "--results",
            str(tmp_path / "results"),
            "--docs",
            str(docs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr

    result = json.loads((tmp_path / "results" / "sync.json").read_text(encoding="utf-8"))
    assert result["name"] == "sync"
    assert result["quick"] is True
    assert {"ping", "hit_sliding_log", "hit_gcra", "limits_sliding_log"} <= set(result["rates"])
    rounds = {len(series) for series in result["rates"].values()}
    assert len(rounds) == 1 and rounds.pop() >= 1
    for series in [*result["rates"].values(), *result["ratios"].values()]:
        assert all(math.isfinite(x) and x > 0 for x in series)
    assert result["targets"]
    for target in result["targets"]:
        assert target["status"] in STATUSES
        assert target["goal"].startswith((">=", "<="))
    machine = json.loads((tmp_path / "results" / "machine.json").read_text(encoding="utf-8"))
    assert machine["cores"] >= 1

    report = docs.read_text(encoding="utf-8")
    assert "## Targets" in report
    assert "make bench" in report
    for target in result["targets"]:
        assert target["text"] in report
    chart = docs.parent / "benchmarks.svg"
    assert "<svg" in chart.read_text(encoding="utf-8")
    assert "(benchmarks.svg)" in report
    assert "applimit pure Python" in report
    assert result["params"]["applimit"] == "pure Python"

    cost = json.loads((tmp_path / "results" / "redis_cost.json").read_text(encoding="utf-8"))
    ladder = cost["data"]["script_ladder_us"]
    assert list(ladder) == [
        "bench_empty",
        "bench_reply",
        "bench_time",
        "bench_parsed",
        "bench_checked",
        "full",
    ]
    assert all(math.isfinite(us) and us > 0 for us in ladder.values())
    assert "Where the script's time goes" in report

    # A second run's targets beside the first's: the report alone, from the two runs'
    # results (here the second is the first, with one target's figure changed).
    other = tmp_path / "other"
    other.mkdir()
    for name in ("sync.json", "redis_cost.json", "machine.json"):
        (other / name).write_text((tmp_path / "results" / name).read_text(encoding="utf-8"))
    changed = json.loads((other / "sync.json").read_text(encoding="utf-8"))
    changed["targets"][0]["measured"] = 0.123
    (other / "sync.json").write_text(json.dumps(changed), encoding="utf-8")
    both = tmp_path / "both.md"
    arguments = ["--results", str(tmp_path / "results"), "--also", str(other)]
    completed = subprocess.run(
        [sys.executable, "-m", "bench.run", "--report", *arguments, "--docs", str(both)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    rows = [line for line in both.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert "| run 2 |" in rows[0]
    first = next(row for row in rows if row.startswith(f"| {result['targets'][0]['text']} |"))
    assert "| 0.12x (MISS) |" in first
    assert "Run 2, shown beside it in the targets" in both.read_text(encoding="utf-8")
    # A directory that holds no run is refused, and nothing is written.
    refused = ["--also", str(tmp_path), "--docs", str(tmp_path / "none.md")]
    missing = subprocess.run(
        [sys.executable, "-m", "bench.run", "--report", *arguments[:2], *refused],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode != 0 and "no machine.json" in missing.stderr
    assert not (tmp_path / "none.md").exists()


def test_compare_reports_each_target_of_both_versions() -> None:
    """bench.compare's report: one row per target both versions measured, the median of
    each side's runs with their range, and the change signed so that + is better (a
    size target, where lower is better, improves when it shrinks)."""
    from bench.compare import report

    def run(ratio: float, size: float) -> dict[str, dict[str, object]]:
        return {
            "x.ratio": {
                "key": "x.ratio",
                "text": "ratio",
                "measured": ratio,
                "unit": "x",
                "goal": ">= 0.80x",
                "higher_is_better": True,
            },
            "x.size": {
                "key": "x.size",
                "text": "size",
                "measured": size,
                "unit": " B",
                "goal": "<= 128 B",
                "higher_is_better": False,
            },
        }

    runs = {
        "old": [run(0.80, 128), run(0.70, 120), run(0.90, 124)],
        "new": [run(0.88, 100), run(0.80, 90), run(0.84, 110), {}],
    }
    text = report("v1", "a" * 40, "b" * 40, runs)
    rows = [line for line in text.splitlines() if line.startswith(("| ratio", "| size"))]
    assert rows == [
        "| ratio | >= 0.80x | 0.80x (0.70-0.90) | 0.84x (0.80-0.88) | +5.0% |",
        "| size | <= 128 B | 124 B (120-128) | 100 B (90-110) | +19.4% |",
    ]
    assert text.startswith("# Benchmarks: v1 (aaaaaaaaaa) against the working tree (bbbbbbbbbb)")


def test_a_selection_run_after_a_full_run_is_reported_as_a_part_of_its_own() -> None:
    """``bench.run --only http`` after a full run writes its own results beside the full
    run's: machine.json keeps each invocation's benchmarks, date, commit and load, and the
    report names both, instead of stating the last invocation's load for every figure."""
    from bench._report import render_markdown
    from bench.run import BENCHMARKS, merged_machine

    def machine(date: str, commit: str, start: float, end: float) -> dict[str, Any]:
        return {
            "date": date,
            "commit": commit,
            "cores": 2,
            "applimit": "pure Python",
            "load_average": [start, 0.0, 0.0],
            "load_average_after": [end, 0.0, 0.0],
        }

    # machine.json as written before parts were kept: the full run's.
    full = machine("2026-12-04T00:23:13Z", "aaaaaaa", 0.51, 1.72)
    everything = [name for name in BENCHMARKS if name != "http"]
    after_http = merged_machine(
        full, machine("2026-12-04T00:30:29Z", "aaaaaaa", 1.72, 1.07), ["http"]
    )
    assert [part["benchmarks"] for part in after_http["parts"]] == [
        [*everything],
        ["http"],
    ]
    # Only benchmarks with results in the directory belong to the earlier part.
    held = merged_machine(full, full, ["http"], held=["sync", "http"])
    assert [part["benchmarks"] for part in held["parts"]] == [["sync"], ["http"]]
    assert after_http["parts"][0]["load_average"][0] == 0.51
    assert after_http["parts"][1]["date"] == "2026-12-04T00:30:29Z"
    # multi run again later, at another commit: it leaves the first part, the rest stay.
    after_multi = merged_machine(
        after_http, machine("2026-12-04T01:22:55Z", "bbbbbbb", 0.15, 0.34), ["multi"]
    )
    assert [part["benchmarks"] for part in after_multi["parts"]] == [
        [name for name in everything if name != "multi"],
        ["http"],
        ["multi"],
    ]
    assert after_multi["commit"] == "bbbbbbb"
    # Everything run again: one part.
    again = merged_machine(
        after_multi, machine("2026-12-05T00:00:00Z", "ccccccc", 0.2, 0.3), list(BENCHMARKS)
    )
    assert [part["benchmarks"] for part in again["parts"]] == [list(BENCHMARKS)]

    report = render_markdown([], after_multi, chart=None)
    assert "Its results come from 3 invocations:" in report
    assert (
        "multi: started 2026-12-04T01:22:55Z, commit bbbbbbb, one-minute load average 0.15"
        in report
    )
    assert (
        "http: started 2026-12-04T00:30:29Z, commit aaaaaaa, one-minute load average 1.72" in report
    )
    assert "'parts'" not in report and "| parts |" not in report
    single = render_markdown([], again, chart=None)
    assert "invocations" not in single
