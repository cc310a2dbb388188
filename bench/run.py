"""Run the benchmarks, write their results as JSON, and regenerate docs/benchmarks.md.

Usage (from the repository root; ``make bench`` runs the first form)::

    python -m bench.run                         every benchmark, full length
    python -m bench.run --only sync,async       a selection (the docs keep the others'
                                                last results from the results directory)
    python -m bench.run --quick                 a smoke run: seconds, numbers meaningless
    python -m bench.run --list                  the benchmarks and what they measure
    python -m bench.run --only http             the HTTP benchmark (needs wrk; not in
                                                the default set: about two minutes)

Results go to ``bench/results/<name>.json`` (``bench/results/quick/`` for quick runs, so a
smoke run never replaces real numbers). The docs and the chart are regenerated from every
result in the results directory, in the order below; a quick run writes docs only when
``--docs`` is given. The exit status is 1 when a benchmark failed to run (2 when one
lacked a tool, e.g. wrk, and said how to install it); a missed target is a result, not a
failure.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ._common import ROOT, Result, Settings, now_iso
from ._report import machine_info, render_chart, render_markdown

# Every benchmark, in report order: NAME -> module (each has NAME, TITLE and run()).
BENCHMARKS = {
    "sync": "bench.bench_sync",
    "threads": "bench.bench_threads",
    "multi": "bench.bench_multi",
    "async": "bench.bench_async",
    "redis_cost": "bench.bench_redis_cost",
    "cluster": "bench.bench_cluster",
    "approx": "bench.bench_approx",
    "observe": "bench.bench_observe",
    "replay": "bench.bench_replay",
    "http": "bench.bench_http",
}
# Run only when asked for by --only: they need tools beyond the bench extra (wrk) and
# minutes of their own.
OPTIONAL = ("http",)
DEFAULT_RESULTS = ROOT / "bench" / "results"
DEFAULT_DOCS = ROOT / "docs" / "benchmarks.md"


def _module(name: str) -> ModuleType:
    return importlib.import_module(BENCHMARKS[name])


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description="Benchmarks of applimit (see docs/benchmarks.md)."
    )
    parser.add_argument(
        "--only",
        default="",
        help=(
            f"comma-separated benchmarks to run (default: all but {', '.join(OPTIONAL)}, of "
            f"{', '.join(BENCHMARKS)})"
        ),
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny and fast")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5)")
    parser.add_argument("--seconds", type=float, help="seconds per variant and round")
    parser.add_argument("--results", type=Path, help="directory for the JSON results")
    parser.add_argument("--docs", type=Path, help=f"Markdown report (default {DEFAULT_DOCS})")
    parser.add_argument("--no-docs", action="store_true", help="write results only")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--also",
        type=Path,
        action="append",
        default=[],
        metavar="RESULTS",
        help="another run's results directory: its targets shown beside this run's",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run nothing: write the report from --results (and --also) as they are",
    )
    return parser.parse_args(argv)


def _selection(only: str) -> list[str]:
    if not only:
        return [name for name in BENCHMARKS if name not in OPTIONAL]
    chosen = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}.")
    return chosen


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.for_mode(quick=args.quick)
    changes = {}
    if args.rounds is not None:
        changes["rounds"] = max(1, args.rounds)
    if args.seconds is not None:
        changes["seconds"] = max(0.01, args.seconds)
    if not changes:
        return settings
    return Settings(**{**vars(settings), **changes})


def load_results(directory: Path) -> list[Result]:
    """Every result in ``directory``, in report order (unknown files are ignored)."""
    found: list[Result] = []
    for name in BENCHMARKS:
        path = directory / f"{name}.json"
        if path.is_file():
            found.append(Result.from_json(json.loads(path.read_text(encoding="utf-8"))))
    return found


def _print_result(result: Result) -> None:
    print(f"\n== {result.title}  ({result.seconds:.1f} s)")
    for table in result.tables:
        print(f"  {table.title}")
        print("    " + " | ".join(table.columns))
        for row in table.rows:
            print("    " + " | ".join(row))
    for target in result.targets:
        print(f"  [{target.status:4}] {target.text}: {target.shown} (goal {target.goal})")
    for note in result.notes:
        print(f"  note: {note}")


def _machine(results_dir: Path) -> dict[str, Any]:
    path = results_dir / "machine.json"
    found: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return found


# What a part of a run (one invocation's benchmarks) records of its own invocation.
PART_KEYS = ("date", "commit", "applimit", "load_average", "load_average_after")


def merged_machine(
    previous: dict[str, Any],
    current: dict[str, Any],
    ran: Sequence[str],
    held: Sequence[str] = tuple(BENCHMARKS),
) -> dict[str, Any]:
    """``machine.json`` after an invocation that ran ``ran`` into a results directory whose
    ``machine.json`` was ``previous``: this invocation's machine, and in ``parts`` the
    invocations whose results the directory now holds (``held``: the benchmarks with a
    result there), each with its benchmarks, date, commit, build and load (the results of
    a benchmark run again are this invocation's).

    A report gathers every result in the directory, so when a selection (``--only``) runs
    after a full run, the report's figures come from two invocations, at two loads and
    perhaps two commits: the report names each part (bench/_report.py)."""
    if previous.get("parts"):
        earlier = [dict(part) for part in previous["parts"]]
    elif previous.get("load_average"):
        # Written before parts were kept: one part, of every benchmark not run now.
        earlier = [{key: previous.get(key) for key in PART_KEYS}]
        earlier[0]["benchmarks"] = [name for name in held if name not in ran]
    else:
        earlier = []
    parts = []
    for part in earlier:
        part["benchmarks"] = [name for name in part.get("benchmarks", []) if name not in ran]
        if part["benchmarks"]:
            parts.append(part)
    if ran:
        parts.append({"benchmarks": list(ran), **{key: current.get(key) for key in PART_KEYS}})
    return {**current, "parts": parts}


def write_docs(results_dir: Path, docs: Path, also: Sequence[Path] = ()) -> None:
    """Regenerate the Markdown report and its chart beside it from ``results_dir``;
    the targets of the runs in ``also`` are shown beside its own."""
    results = load_results(results_dir)
    machine = _machine(results_dir)
    others = [(_machine(other), load_results(other)) for other in also]
    # Named after the report: docs/benchmarks.md's is docs/benchmarks.svg.
    chart = docs.with_suffix(".svg")
    render_chart(results, chart)
    relative = os.path.relpath(chart, docs.parent) if chart.exists() else None
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(
        render_markdown(results, machine, chart=relative, others=others), encoding="utf-8"
    )
    print(f"\nwrote {docs} and {chart}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benchmarks; 1 if any of them failed to run, else 0."""
    args = _parse(argv)
    if args.list:
        for name in BENCHMARKS:
            module = _module(name)
            print(f"{name:11} {module.TITLE}")
        return 0
    chosen = _selection(args.only)
    settings = _settings(args)
    results_dir = args.results or (DEFAULT_RESULTS / "quick" if args.quick else DEFAULT_RESULTS)
    for directory in [results_dir, *args.also] if args.report else args.also:
        if not (directory / "machine.json").is_file():
            raise SystemExit(f"{directory} holds no results of a run (no machine.json).")
    if args.report:
        write_docs(results_dir, args.docs or DEFAULT_DOCS, args.also)
        return 0
    results_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    failed: list[str] = []
    missing = False
    began = time.perf_counter()
    for name in chosen:
        module = _module(name)
        print(f"-- {name}: {module.TITLE}", flush=True)
        stamp = now_iso()
        try:
            result: Result = module.run(settings)
        except SystemExit as stop:
            # A benchmark that cannot run on this machine (bench_http without wrk) says
            # what to install; the others still run, and the exit status is 2.
            print(f"{name}: {stop}", file=sys.stderr)
            failed.append(name)
            missing = True
            continue
        except Exception:
            # One broken benchmark must not cost the results of the others.
            traceback.print_exc()
            failed.append(name)
            continue
        result.started = stamp
        result.quick = settings.quick
        # Which build was measured, in each result: a report may gather several runs.
        result.params["applimit"] = machine["applimit"]
        (results_dir / f"{name}.json").write_text(
            json.dumps(result.to_json(), indent=1, allow_nan=True), encoding="utf-8"
        )
        _print_result(result)
        if hasattr(module, "chart"):
            # A benchmark with a chart of its own (bench_http) draws it beside its JSON.
            module.chart(result, results_dir / f"{name}.svg")
    machine["load_average_after"] = machine_info()["load_average"]
    machine["total_seconds"] = round(time.perf_counter() - began, 1)
    ran = [name for name in chosen if name not in failed]
    held = [name for name in BENCHMARKS if (results_dir / f"{name}.json").is_file()]
    machine = merged_machine(_machine(results_dir), machine, ran, held)
    (results_dir / "machine.json").write_text(json.dumps(machine, indent=1), encoding="utf-8")
    docs = args.docs
    if docs is None and not args.quick:
        docs = DEFAULT_DOCS
    if docs is not None and not args.no_docs:
        write_docs(results_dir, docs, args.also)
    if failed:
        print(f"\nfailed to run: {', '.join(failed)}", file=sys.stderr)
        return 2 if missing else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
