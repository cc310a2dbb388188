"""Did a change make a decision slower? The benchmarks of two versions, run alternately.

Usage (from the repository root)::

    python -m bench.compare REV                       sync and multi, three runs each
    python -m bench.compare REV --only sync,async --runs 5 --out docs/x.md

REV (a commit, tag or branch) is checked out into a temporary git worktree; each run of
``bench.run`` for REV is followed by one for the working tree, so both see the same
machine, minute by minute. Each target's result per version is the median of its runs'
medians; the spread is the lowest and highest of them. A ratio target is a ratio against
a reference measured in the same run (see docs/benchmarks.md), so a busier minute moves
both sides of it; what is left is noise, which the spread shows.

Both versions run with this tree's Python environment (the benchmarks import the code of
the directory they run in). The report goes to standard output, or to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._common import ROOT, now_iso


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="Benchmarks of a git revision and of the working tree, run alternately.",
    )
    parser.add_argument("rev", metavar="REV", help="the revision to compare against")
    parser.add_argument("--only", default="sync,multi", help="benchmarks (default sync,multi)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each version (default 3)")
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _run(tree: Path, only: str, results: Path) -> dict[str, dict[str, object]]:
    """One ``bench.run`` in ``tree``: each target's JSON record, by key."""
    command = [sys.executable, "-m", "bench.run", "--only", only, "--results", str(results)]
    done = subprocess.run([*command, "--no-docs"], cwd=tree, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the benchmarks failed in {tree} (exit {done.returncode})")
    targets: dict[str, dict[str, object]] = {}
    for name in only.split(","):
        path = results / f"{name.strip()}.json"
        if path.exists():
            for target in json.loads(path.read_text())["targets"]:
                targets[str(target["key"])] = target
    return targets


def _cell(values: list[float], unit: str) -> str:
    # Sizes in bytes and counts read best whole; ratios with two decimals.
    digits = 0 if max(abs(v) for v in values) >= 100 else 2
    middle = f"{statistics.median(values):.{digits}f}{unit}"
    if len(values) == 1:
        return middle
    return f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(
    rev: str,
    commit: str,
    head: str,
    runs: dict[str, list[dict[str, dict[str, object]]]],
) -> str:
    """The Markdown report of ``runs`` (per side: one dict of targets per run)."""
    old, new = runs["old"], runs["new"]
    keys = [k for k in new[0] if k in old[0]]
    lines = [
        f"# Benchmarks: {rev} ({commit[:10]}) against the working tree ({head[:10]})",
        "",
        f"{len(new)} runs of each, alternating, finished {now_iso()}. Median of the runs' "
        "medians, with the lowest and highest in brackets; the change is the working "
        "tree's median against the revision's, where higher is better.",
        "",
        f"| target | goal | {rev} | working tree | change |",
        "|---|---|---|---|---|",
    ]
    for key in keys:
        target = new[0][key]
        unit = str(target.get("unit", ""))
        before = [float(str(run[key]["measured"])) for run in old if key in run]
        after = [float(str(run[key]["measured"])) for run in new if key in run]
        change = statistics.median(after) / statistics.median(before) - 1
        if not target.get("higher_is_better", True):
            change = -change
        lines.append(
            f"| {target['text']} | {target.get('goal', '')} | {_cell(before, unit)} | "
            f"{_cell(after, unit)} | {change:+.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run both versions alternately and print (or write) the comparison."""
    args = _parse(argv)
    commit = _git("rev-parse", "--verify", "--end-of-options", f"{args.rev}^{{commit}}")
    head = _git("rev-parse", "HEAD")
    runs: dict[str, list[dict[str, dict[str, object]]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as scratch:
        tree = Path(scratch) / "tree"
        _git("worktree", "add", "--detach", str(tree), commit)
        try:
            for index in range(args.runs):
                for side, where in (("old", tree), ("new", ROOT)):
                    print(f"== run {index + 1}/{args.runs}: {side}", file=sys.stderr)
                    results = Path(scratch) / f"{side}-{index}"
                    runs[side].append(_run(where, args.only, results))
        finally:
            _git("worktree", "remove", "--force", str(tree))
    text = report(args.rev, commit, head, runs)
    if args.out is not None:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
