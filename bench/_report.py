"""Results into ``docs/benchmarks.md`` and a chart; the machine they were measured on.

The Markdown is generated whole from the JSON results, so it never drifts from them:
edit this module, not the generated file. The chart is an SVG drawn by matplotlib with
the Agg backend (no display needed), with text kept as text and no timestamp inside, so
regenerating it from the same results gives the same file.
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from ._common import ROOT, Result, Target, fmt_rate, median, now_iso

COMMAND = "make bench"
PYTHON_COMMAND = "python -m bench.run"

_STATUS_COLOURS = {"PASS": "#2e7d32", "MISS": "#c62828", "N/A": "#9e9e9e"}


# --- machine -----------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _redis_server_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return out.strip()


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip()


def applimit_build() -> str:
    """Which build of applimit runs: "pure Python", or the modules mypyc compiled."""
    import importlib

    compiled = []
    # setup.py's COMPILED.
    modules = ("_arguments", "_calls", "_flow", "_keys", "_memo", "_plan", "_replies", "_rules")
    for name in modules:
        module = importlib.import_module(f"applimit.{name}")
        if not str(getattr(module, "__file__", "")).endswith(".py"):
            compiled.append(name)
    return f"compiled with mypyc ({', '.join(compiled)})" if compiled else "pure Python"


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, load, and the versions of everything timed."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {
        "date": now_iso(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in load],
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis_server": _redis_server_version(),
        "redis_py": _version("redis"),
        # redis-py parses replies in pure Python unless hiredis is installed.
        "hiredis": _version("hiredis"),
        "limits": _version("limits"),
        "applimit": applimit_build(),
        "commit": _git_commit(),
        "argv": sys.argv[1:],
    }


# --- Markdown ----------------------------------------------------------------------------


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(columns), "|" + "|".join("---" for _ in columns) + "|", *map(line, rows)]


def all_targets(results: Sequence[Result]) -> list[tuple[Result, Target]]:
    """Every target of every result, in benchmark order."""
    return [(r, t) for r in results for t in r.targets]


def _load_line(machine: dict[str, Any]) -> str:
    """A run's cores and load average, as the report states them."""
    return (
        f"{machine.get('cores')} cores, one-minute load average "
        f"{machine['load_average'][0]} at the start and "
        f"{machine['load_average_after'][0]} at the end"
    )


def _parts_line(machine: dict[str, Any]) -> str:
    """The invocations a run's results come from, when more than one (see
    bench.run.merged_machine); empty otherwise."""
    parts = [
        part
        for part in machine.get("parts", [])
        if part.get("load_average") and part.get("load_average_after")
    ]
    if len(parts) < 2:
        return ""
    described = [
        f"{', '.join(part['benchmarks'])}: started {part.get('date', '?')}, commit "
        f"{part.get('commit', '?')}, one-minute load average {part['load_average'][0]} at "
        f"its start and {part['load_average_after'][0]} at its end"
        for part in parts
    ]
    return f" Its results come from {len(parts)} invocations: " + "; ".join(described) + "."


def render_markdown(
    results: Sequence[Result],
    machine: dict[str, Any],
    *,
    chart: str | None,
    others: Sequence[tuple[dict[str, Any], Sequence[Result]]] = (),
) -> str:
    """The whole of ``docs/benchmarks.md`` for ``results``; ``chart`` is its relative path.
    ``others``: other runs (their machine and results), whose targets are shown beside
    this run's, so that a reader sees how far one run's figures move in the next."""
    out: list[str] = [
        "# Benchmarks",
        "",
        "<!-- Generated by bench/run.py from bench/results/*.json; edit bench/_report.py, "
        "not this file. -->",
        "",
        "What a decision of `applimit` costs, measured against the physical floor (one "
        "round trip: a `PING` on the same connection) and the best alternative (the "
        "`limits` library), each on a `redis-server` the benchmark starts itself.",
        "",
        "The machine is small and shared, so absolute rates move from one minute to the "
        "next. Every benchmark therefore runs the project and its reference side by "
        "side: short slices of each, interleaved, for several rounds, with a ratio "
        "computed per round. **Ratios are the result** (medians of the per-round "
        "ratios); absolute numbers are medians too and are printed for scale only.",
        "",
        "Reproduce with:",
        "",
        "```sh",
        f"{COMMAND}                       # every benchmark but http, about eight minutes",
        f".venv/bin/{PYTHON_COMMAND} --only sync,async   # a selection",
        f".venv/bin/{PYTHON_COMMAND} --quick --results /tmp/b --docs /tmp/b/b.md   # smoke run",
        "```",
        "",
        "Raw numbers (every round) are written to `bench/results/<benchmark>.json`.",
        "",
        "Whether a change made a decision slower is answered by running both versions "
        "alternately on the same machine: `.venv/bin/python -m bench.compare REV` (the "
        "benchmarks of REV and of the working tree, each target side by side). The "
        "comparisons kept with the code are in [benchmarks-compare.md](benchmarks-compare.md).",
        "",
    ]
    if machine.get("load_average") and machine.get("load_average_after"):
        out += [
            f"This run: {_load_line(machine)} (other work shares the machine; see Machine "
            "at the end)"
            + (f"; applimit {machine['applimit']}." if machine.get("applimit") else ".")
            + _parts_line(machine),
            "",
        ]
    for number, (other, _) in enumerate(others, start=2):
        if other.get("load_average") and other.get("load_average_after"):
            out += [
                f"Run {number}, shown beside it in the targets: {_load_line(other)}, "
                f"started {other.get('date', '?')}, commit {other.get('commit', '?')}."
                + _parts_line(other),
                "",
            ]
    quick = [r.name for r in results if r.quick]
    if quick:
        out += [
            f"> **Quick (smoke) results for {', '.join(quick)}**: far too short to mean "
            "anything; run the full benchmark for numbers.",
            "",
        ]
    out += ["## Targets", ""]
    other_targets = [
        {t.key: t for _, t in all_targets(other_results)} for _, other_results in others
    ]
    rows = [
        [
            t.text,
            t.goal,
            t.shown,
            f"**{t.status}**",
            t.shown_spread,
            *(
                f"{found[t.key].shown} ({found[t.key].status})" if t.key in found else "-"
                for found in other_targets
            ),
            r.name,
            t.note,
        ]
        for r, t in all_targets(results)
    ]
    columns = [
        "target",
        "goal",
        "measured",
        "status",
        "middle half",
        *(f"run {number}" for number in range(2, len(others) + 2)),
        "benchmark",
        "note",
    ]
    out += _table(columns, rows)
    out += [
        "",
        "*Measured* is the median over the rounds; *middle half* the range of the middle "
        "half of the per-round values (first to third quartile): where it straddles the "
        "goal, the status could flip from one run to the next.",
        "",
    ]
    if chart is not None:
        out += [f"![Ratios and sizes against the targets]({chart})", ""]
    for result in results:
        out += [f"## {result.title}", "", result.summary, ""]
        for table in result.tables:
            out += [f"**{table.title}**", ""]
            out += _table(table.columns, table.rows)
            out.append("")
            if table.note:
                out += [table.note, ""]
        for note in result.notes:
            out += [f"- {note}"]
        if result.notes:
            out.append("")
        params = ", ".join(f"{k}={v}" for k, v in result.params.items())
        out += [
            f"<sub>{result.name}: started {result.started}, took {result.seconds:.0f} s; "
            f"{params}</sub>",
            "",
        ]
    out += ["## Machine", ""]
    out += _table(["", ""], [[k, str(v)] for k, v in machine.items() if k != "parts"])
    out.append("")
    return "\n".join(out)


# --- chart -------------------------------------------------------------------------------


def render_chart(results: Sequence[Result], path: Path) -> None:
    """Draw measured values against their targets (ratios, bytes) and the sync rates."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    mpl.rcParams["svg.fonttype"] = "none"
    mpl.rcParams["svg.hashsalt"] = "applimit-bench"
    targets = all_targets(results)
    ratio = [t for _, t in targets if t.unit == "x"]
    size = [t for _, t in targets if t.unit == "B"]
    sync = next((r for r in results if r.name == "sync"), None)
    panels = [p for p in (ratio, size) if p]
    count = len(panels) + (1 if sync is not None and sync.rates else 0)
    if count == 0:
        return
    heights = [max(1.5, 0.42 * len(p) + 0.8) for p in panels]
    if count > len(panels):
        heights.append(2.8)
    fig, axes = plt.subplots(
        count, 1, figsize=(10, sum(heights) + 0.4), gridspec_kw={"height_ratios": heights}
    )
    axes_list = list(axes) if count > 1 else [axes]
    for ax, group in zip(axes_list, panels, strict=False):
        _target_panel(ax, group)
    if sync is not None and sync.rates and len(axes_list) > len(panels):
        _rates_panel(axes_list[-1], sync)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lstrip(".") or "svg", metadata={"Date": None})
    plt.close(fig)


def _target_panel(ax: Any, group: Sequence[Target]) -> None:
    labels = [t.short or t.text.replace("`", "") for t in group]
    values = [0.0 if t.status == "N/A" else float(t.measured or 0.0) for t in group]
    colours = [_STATUS_COLOURS[t.status] for t in group]
    ys = list(range(len(group)))
    ax.barh(ys, values, color=colours, height=0.6)
    for y, target, value in zip(ys, group, values, strict=True):
        # A tick at the threshold: the bar must reach past it (or stay short of it).
        ax.plot([target.threshold] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.5)
        # Right of the bar and of the tick, so neither covers the text.
        ax.text(
            max(value, target.threshold),
            y,
            f"  {target.shown} ({target.status})",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    unit = group[0].unit
    ax.set_xlabel("ratio (black tick: target)" if unit == "x" else "bytes (black tick: limit)")
    top = max([*values, *(t.threshold for t in group)])
    ax.set_xlim(0, top * 1.45 if top > 0 else 1)


def _rates_panel(ax: Any, sync: Result) -> None:
    names = list(sync.rates)
    medians = [median(v) if v else 0.0 for v in sync.rates.values()]
    colours = [
        "#616161" if n.startswith("ping") else ("#1565c0" if n.startswith("hit_") else "#ef6c00")
        for n in names
    ]
    ax.bar(range(len(names)), medians, color=colours)
    for x, value in enumerate(medians):
        ax.text(x, value, fmt_rate(value), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, fontsize=7, rotation=15)
    ax.set_ylabel("per second")
    ax.set_title("sync, one connection (absolute, this run)", fontsize=9)
