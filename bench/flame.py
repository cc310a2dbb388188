"""Flame graphs of a decision: where its CPU time goes, by Python function, sampled by py-spy.

``bench.callgrind`` counts a decision's instructions by C function; this shows the same
workloads by Python function. Each scenario's workload (``bench.callgrind``'s
``--child``, against a ``redis-server`` started on a free port) runs under
``py-spy record``, which samples the process' stacks from outside it (no tracing inside
the process, so the code runs at its own speed), keeping only samples of a thread that
holds the GIL (``--gil``): Python running, not a thread waiting on a socket (which
releases the GIL), so the graph is the client's CPU time, as callgrind's counts are.
Only the stacks inside the counted loop are kept, from the loop down (imports, setup and
warm-up are dropped), and written two ways to ``bench/results/profiles/flame/``:

- ``<scenario>.txt``: the folded stacks, one ``frame;frame;... samples`` line each, most
  samples first, then each function's share of the samples, inclusive and exclusive:
  text to read and to diff between two states of the code;
- ``<scenario>.svg``: the flame graph drawn from them (the loop at the bottom, callees
  above, widths in proportion to samples; hover a frame for its name and share).

Usage (from the repository root; needs ``py-spy``, in the ``bench`` extra, and
``redis-server`` on the PATH)::

    python -m bench.flame                    # the default scenarios
    python -m bench.flame --only sync_hit,asgi --decisions 20000
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ._common import ROOT, redis_server
from .callgrind import SCENARIOS, child_command

DEFAULT_OUT = ROOT / "bench" / "results" / "profiles" / "flame"
DEFAULT_SCENARIOS = ("sync_hit", "sync_request3", "split_async_hit", "asgi", "wsgi")
DECISIONS = 20_000
# Samples per second: py-spy's default is 100; a decision takes tens of microseconds.
RATE = 1000
# The frame every counted loop runs under (bench/callgrind.py, _counted).
LOOP_FRAME = "_counted.<locals>.once (bench/callgrind.py)"
# What each file's summary lists.
TOP = 40
# Seconds one scenario's recording may take (a recording takes well under a minute), and
# how many times a recording that ran past it is made in all.
TIMEOUT = 300.0
ATTEMPTS = 2

Stacks = Counter[tuple[str, ...]]


def folded(raw: str) -> Stacks:
    """py-spy's raw output (``frame;frame;... count`` per line, outermost first), kept
    from the counted loop down: the stacks outside it (imports, setup) are dropped."""
    stacks: Stacks = Counter()
    for line in raw.splitlines():
        text, _, count = line.rpartition(" ")
        if not text or not count.isdigit():
            continue
        frames = text.split(";")
        if LOOP_FRAME not in frames:
            continue
        kept = tuple(frames[frames.index(LOOP_FRAME) + 1 :]) or ("(the loop itself)",)
        stacks[kept] += int(count)
    return stacks


def shares(stacks: Stacks) -> list[tuple[str, float, float]]:
    """Each function's share of all samples: (function, inclusive, exclusive), by
    inclusive share; a function on a stack twice (recursion) counts once there."""
    total = sum(stacks.values())
    inclusive: Counter[str] = Counter()
    exclusive: Counter[str] = Counter()
    for frames, count in stacks.items():
        for frame in set(frames):
            inclusive[frame] += count
        exclusive[frames[-1]] += count
    rows = [(f, inclusive[f] / total, exclusive[f] / total) for f in inclusive]
    return sorted(rows, key=lambda row: (-row[1], -row[2], row[0]))


def summary(scenario: str, stacks: Stacks, decisions: int) -> str:
    """The text file: what ran, the shares, then the folded stacks."""
    total = sum(stacks.values())
    lines = [
        f"{scenario}: {SCENARIOS[scenario]}",
        f"samples in the counted loop: {total:,} (py-spy, {RATE}/s, holding the GIL); "
        f"decisions: {decisions:,}",
        "",
        f"Top {TOP} functions by inclusive share of the samples (inclusive, exclusive):",
    ]
    for function, inc, exc in shares(stacks)[:TOP]:
        lines.append(f"  {inc:6.1%} {exc:6.1%}  {function}")
    lines += ["", "Folded stacks (from the counted loop down), most samples first:"]
    for frames, count in sorted(stacks.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{';'.join(frames)} {count}")
    return "\n".join(lines) + "\n"


# --- the SVG ----------------------------------------------------------------------------

_WIDTH = 1200.0
_ROW = 17
_COLOURS = {
    "applimit/": "#e8a33d",
    "redis/": "#d9534f",
    "asyncio/": "#5b9bd5",
    "bench/": "#9e9e9e",
}


def _colour(frame: str) -> str:
    for marker, colour in _COLOURS.items():
        if f"({marker}" in frame or f"/{marker}" in frame:
            return colour
    return "#8fbf6f"


def svg(title: str, stacks: Stacks) -> str:
    """A flame graph of ``stacks``: the loop at the bottom, callees above it."""
    total = sum(stacks.values())
    # Each path from the loop's first frame, with its samples and the frames called from it.
    weights: Counter[tuple[str, ...]] = Counter()
    callees: dict[tuple[str, ...], set[str]] = {}
    for frames, count in stacks.items():
        for depth in range(1, len(frames) + 1):
            weights[frames[:depth]] += count
            callees.setdefault(frames[: depth - 1], set()).add(frames[depth - 1])
    depth_max = max((len(frames) for frames in stacks), default=0)
    height = (depth_max + 2) * _ROW + 30
    rects: list[str] = []

    def draw(path: tuple[str, ...], x: float) -> None:
        for frame in sorted(callees.get(path, ())):
            here = (*path, frame)
            width = weights[here] / total * _WIDTH
            y = height - (len(here) + 1) * _ROW
            if width >= 0.3:
                label = html.escape(frame)
                share = weights[here] / total
                shown = html.escape(frame[: int(width / 7)])
                text = f'<text x="{x + 3:.1f}" y="{y + 12}">{shown}</text>' if width > 35 else ""
                rects.append(
                    f"<g><title>{label} ({share:.1%})</title>"
                    f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{_ROW - 1}" '
                    f'fill="{_colour(frame)}" rx="2"/>{text}</g>'
                )
            draw(here, x)
            x += width

    draw((), 0.0)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH:.0f}" height="{height}" '
        f'font-family="monospace" font-size="11">\n'
        f'<text x="4" y="16" font-size="13">{html.escape(title)}</text>\n'
        + "\n".join(rects)
        + "\n</svg>\n"
    )


# --- the driver -------------------------------------------------------------------------


def py_spy() -> str | None:
    """py-spy's executable: beside this interpreter (a virtualenv's, not on PATH when the
    interpreter is run by its path), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


class RecordingError(RuntimeError):
    """A recording that failed or ran past its time; ``output`` is what it printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


def run_bounded(command: Sequence[str], timeout: float) -> str:
    """Run ``command`` (py-spy and the workload it starts) in a process group of its own
    and return its output; past ``timeout`` seconds the whole group is killed (py-spy
    has been seen to stall, stopping its workload far more often than it samples, and
    killing py-spy alone would leave the workload behind) and RecordingError raised."""
    process = subprocess.Popen(
        list(command),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise RecordingError(
            f"not finished within {timeout:.0f} s, stopped (--timeout sets the limit)", output
        ) from None
    if process.returncode != 0:
        raise RecordingError(f"exited with status {process.returncode}", output)
    return output


def record(
    scenario: str,
    url: str,
    decisions: int,
    work: Path,
    *,
    timeout: float = TIMEOUT,
    attempts: int = ATTEMPTS,
    nonblocking: bool = False,
) -> Stacks:
    """Run ``scenario``'s workload under py-spy; its stacks inside the counted loop. A
    recording past ``timeout`` is made again, up to ``attempts`` in all (a stalled py-spy
    is seldom stalled twice running); ``nonblocking`` samples without pausing the
    workload (py-spy's ``--nonblocking``: no stall, stacks now and then torn)."""
    raw = work / f"{scenario}.raw"
    executable = py_spy()
    if executable is None:
        raise RuntimeError("py-spy is not installed")
    command = [
        executable,
        "record",
        "--rate",
        str(RATE),
        "--nolineno",
        "--gil",
        *(["--nonblocking"] if nonblocking else []),
        "--format",
        "raw",
        "--output",
        str(raw),
        "--",
        *child_command(scenario, url, decisions),
    ]
    for attempt in range(1, attempts + 1):
        try:
            run_bounded(command, timeout)
            break
        except RecordingError as error:
            if attempt == attempts or not str(error).startswith("not finished"):
                raise
            print(f"{scenario}: {error}; recording again", file=sys.stderr)
    stacks = folded(raw.read_text(encoding="utf-8"))
    if not stacks:
        raise RuntimeError(f"{scenario}: no samples inside the counted loop")
    return stacks


def main(argv: Sequence[str] | None = None) -> int:
    """Record each scenario and write its folded stacks and flame graph; 2 without py-spy."""
    parser = argparse.ArgumentParser(prog="python -m bench.flame", description=__doc__)
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the files")
    parser.add_argument("--decisions", type=int, default=DECISIONS, help="decisions sampled")
    parser.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds a recording may take"
    )
    parser.add_argument(
        "--attempts", type=int, default=ATTEMPTS, help="recordings past --timeout, in all"
    )
    parser.add_argument(
        "--nonblocking",
        action="store_true",
        help="sample without pausing the workload (py-spy --nonblocking: no stall)",
    )
    args = parser.parse_args(argv)
    if py_spy() is None:
        print("py-spy is not installed: pip install -e '.[bench]'", file=sys.stderr)
        return 2
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(DEFAULT_SCENARIOS)
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        print(
            f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    with redis_server() as server, tempfile.TemporaryDirectory() as temporary:
        for scenario in chosen:
            try:
                stacks = record(
                    scenario,
                    server.url,
                    args.decisions,
                    Path(temporary),
                    timeout=args.timeout,
                    attempts=max(1, args.attempts),
                    nonblocking=args.nonblocking,
                )
            except RecordingError as error:
                # The other scenarios are still recorded; nothing of this one is written.
                print(f"{scenario}: {error}\n{error.output.strip()}", file=sys.stderr)
                failed.append(scenario)
                continue
            (args.out / f"{scenario}.txt").write_text(
                summary(scenario, stacks, args.decisions), encoding="utf-8"
            )
            title = f"{scenario}: {SCENARIOS[scenario]} ({sum(stacks.values()):,} samples)"
            (args.out / f"{scenario}.svg").write_text(svg(title, stacks), encoding="utf-8")
            print(f"{scenario}: {sum(stacks.values()):,} samples -> {args.out / scenario}.svg")
    if failed:
        print(f"not recorded: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
