"""``edgegen replay`` and ``edgegen suggest``: recorded traffic through the policy's layers.

A thin shell: it reads the command line, the policy and the traffic files (``traffic``),
runs the replay (``replay._engine``, ``replay._suggest``) and prints the report
(``replay._report``).
``edgegen diff --traffic`` uses :func:`traffic_args` and :func:`open_args_traffic` from
here. While the records are read, :class:`Progress` says how far the reading has got on
standard error, when that is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from edgegen_policy import Policy

from ._pipeline import load_and_build
from ._text import markdown_text, terminal_text
from .errors import UsageError
from .replay._engine import Replay, ReplayLayer, ReplayOptions, ReplayResult
from .replay._report import to_json, to_markdown, to_text, write_chart
from .replay._suggest import suggest, suggestions_json, suggestions_markdown, suggestions_text
from .traffic._options import FORMATS, TrafficOptions
from .traffic._pipe import open_traffic
from .traffic._read import Position, Traffic, TrafficStats
from .traffic._tiers import load_tiers


def traffic_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The options that say where recorded traffic is and how to read it."""
    parser.add_argument(
        "--traffic",
        nargs="+",
        required=required,
        metavar="FILE",
        help="recorded requests: combined access logs, Cloudflare Logpush http_requests "
        "NDJSON, applimit decision-event logs, CSV or NDJSON with named columns; gzip or "
        "not; - for standard input",
    )
    parser.add_argument(
        "--traffic-format",
        choices=FORMATS,
        help="the files' format (default: detected per file from its first line)",
    )
    parser.add_argument(
        "--user-from",
        metavar="FIELD",
        help="where the caller's identity is: a field or column name, header:NAME or "
        "cookie:NAME (see docs/replay.md)",
    )
    parser.add_argument("--tiers", metavar="FILE", help="a YAML, JSON or CSV map of user to tier")
    parser.add_argument(
        "--default-tier", metavar="TIER", help="the tier of a user the log and --tiers omit"
    )
    parser.add_argument(
        "--authenticated",
        choices=("yes", "no"),
        help="count every request as carrying a credential (yes) or none (no), for logs "
        "that cannot tell (default: the headers or cookies the log has, else whether it "
        "names a user)",
    )
    parser.add_argument(
        "--challenges",
        choices=("stop", "pass"),
        default="stop",
        help="whether a client that gets a challenge at the edge goes on (default stop)",
    )
    parser.add_argument(
        "--show-identities",
        action="store_true",
        help="print identities as they are (default: hashed with a key of this run)",
    )
    parser.add_argument(
        "--no-background-read",
        dest="background_read",
        action="store_false",
        help="parse the files in this process (by default a second process parses large "
        "files while this one replays)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first malformed record (default: count and report them)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line on standard error while the traffic is read (it is shown "
        "only when standard error is a terminal)",
    )


def register(sub: Any) -> None:
    """Add ``replay`` and ``suggest`` to the CLI."""
    replay = sub.add_parser(
        "replay",
        help="replay recorded requests through the policy's layers and report refusals",
        description="Run recorded requests through the policy as Cloudflare's rules, the "
        "Worker and the app would decide them, in that order, and report per limit and tier "
        "what each layer refused. See docs/replay.md.",
    )
    replay.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    traffic_args(replay, required=True)
    replay.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    replay.add_argument(
        "--layers",
        default="rules,worker,app",
        metavar="LIST",
        help="which layers to replay, comma separated (default rules,worker,app)",
    )
    replay.add_argument("--chart", metavar="FILE", help="draw the timeline to FILE (.svg or .png)")
    replay.set_defaults(func=run_replay)

    suggested = sub.add_parser(
        "suggest",
        help="suggest app limits from recorded traffic",
        description="For each app limit, tier and rate, the count per period at which at most "
        "the target share of identities would ever be refused, from a replay of recorded "
        "traffic. See docs/replay.md for the method.",
    )
    suggested.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    traffic_args(suggested, required=True)
    suggested.add_argument(
        "--target",
        default="1%",
        metavar="SHARE",
        help="the share of identities that may be refused, e.g. 1%% or 0.5%% (default 1%%)",
    )
    suggested.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    suggested.set_defaults(func=run_suggest)


def parse_layers(text: str) -> frozenset[ReplayLayer]:
    """``--layers`` as a set; a UsageError naming the layers when one is unknown."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = {layer.value: layer for layer in ReplayLayer}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise UsageError(f"--layers {text!r}: name one or more of {', '.join(known)}")
    return frozenset(known[name] for name in names)


def parse_target(text: str) -> float:
    """``--target`` (``1%``, ``0.5%`` or ``0.01``) as a share."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"--target {text!r}: write a share such as 1% or 0.01") from None
    if not 0 <= value < 1:
        raise UsageError(f"--target {text!r}: the share must be at least 0% and below 100%")
    return value


def traffic_options(args: argparse.Namespace, loaded: Policy) -> TrafficOptions:
    """What the readers need from the command line and the policy."""
    tiers = load_tiers(args.tiers) if args.tiers else {}
    if args.default_tier is not None and args.default_tier not in loaded.tiers:
        raise UsageError(
            f"--default-tier {args.default_tier!r} is not a tier of the policy "
            f"({', '.join(loaded.tiers)})"
        )
    when = loaded.authenticated_when
    return TrafficOptions(
        format=args.traffic_format,
        user_from=args.user_from,
        tiers=tiers,
        default_tier=args.default_tier,
        authenticated_headers=tuple(when.headers),
        authenticated_cookies=tuple(when.cookies),
        authenticated=None if args.authenticated is None else args.authenticated == "yes",
        strict=args.strict,
    )


# Progress: counted every this many records, redrawn at most every this many seconds (the
# first time at the first count, so a long replay shows life at once).
PROGRESS_EVERY = 1024
PROGRESS_INTERVAL_S = 0.25


class Progress:
    """One line on a terminal that says how the reading is getting on: records read, their
    rate, and, when every input's size is known, how much of it is read and an estimate of
    the time left (from the bytes read so far against the files' sizes).

    :meth:`update` redraws it at most every ``interval`` seconds; :meth:`finish` clears it,
    so what follows (warnings, a report) starts on a clean line.
    """

    def __init__(
        self,
        stream: TextIO,
        position: Callable[[], Position],
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.stream = stream
        self.position = position
        self.clock = clock
        self.interval = interval
        self.started = clock()
        self.drawn_at: float | None = None
        self.shown = False

    def update(self, records: int) -> None:
        """``records`` have been read: redraw the line unless it was drawn very lately."""
        now = self.clock()
        if self.drawn_at is not None and now - self.drawn_at < self.interval:
            return
        self.drawn_at = now
        read, total = self.position()
        line = progress_line(records, now - self.started, read, total)
        # One character short of the width: a full line would wrap, and \r would then
        # return to the start of the second half.
        self.stream.write("\r" + line[: _columns(self.stream) - 1] + "\x1b[K")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        """Clear the line, if one was drawn."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def _columns(stream: TextIO) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 80
    # A terminal that has not been given a size (a fresh pseudo-terminal) says 0.
    return columns if columns > 0 else 80


def _size(count: int) -> str:
    if count < 1024:
        return f"{count:,} bytes"
    value = count / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


def _left(seconds: float) -> str:
    whole = max(1, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def progress_line(records: int, elapsed: float, read: int, total: int | None) -> str:
    """The progress line: ``records`` read in ``elapsed`` seconds, ``read`` bytes of the
    inputs' ``total`` (None when a pipe or standard input has no size to compare with)."""
    parts = [f"{records:,} records read"]
    if elapsed > 0:
        parts.append(f"{records / elapsed:,.0f} records/s")
    if total:
        parts.append(f"{min(read, total) / total:.0%} of {_size(total)}")
        if 0 < read < total and elapsed > 0:
            parts.append(f"about {_left(elapsed * (total - read) / read)} left")
    elif read:
        parts.append(f"{_size(read)} read")
    return "edgegen: " + ", ".join(parts)


def show_progress(args: argparse.Namespace, stream: TextIO) -> bool:
    """Whether to show progress: on a terminal, unless --quiet."""
    if getattr(args, "quiet", False):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def open_args_traffic(args: argparse.Namespace, loaded: Policy) -> Traffic:
    """The records of ``--traffic``, read as the options say; traffic that gives no record
    at all (every line malformed, the wrong --traffic-format) is an error at its end, not
    an empty report. On a terminal, progress is shown on standard error while they are
    read, and cleared when the traffic is closed."""
    traffic = open_traffic(
        args.traffic, traffic_options(args, loaded), background=args.background_read
    )
    stream = sys.stderr
    if show_progress(args, stream):
        progress = Progress(stream, traffic.position)
        traffic.observe(PROGRESS_EVERY, progress.update, progress.finish)
    return traffic.require_records()


def warn(result: ReplayResult) -> None:
    """The replay's warnings on standard error too (a report may go to a file or a PR)."""
    for warning in result.warnings:
        sys.stderr.write(f"edgegen: warning: {terminal_text(warning)}\n")


def stats_lines(stats: TrafficStats) -> list[str]:
    """What was read: per file its format, records and malformed records."""
    return stats.describe()


def stats_json(stats: TrafficStats) -> dict[str, Any]:
    """What was read, as JSON."""
    return {
        "records": stats.records,
        "malformed": stats.malformed,
        "files": [
            {
                "file": f.file,
                "format": f.format,
                "gzip": f.gzip,
                "records": f.records,
                "skipped": f.skipped,
                "malformed": dict(sorted(f.malformed.items())),
                "examples": list(f.examples),
            }
            for f in stats.files
        ],
    }


def describe_source(stats: TrafficStats) -> str:
    """The traffic in a few words, for the impact section: the files and how many records."""
    names = ", ".join(f.file for f in stats.files)
    return f"{names}; {stats.records:,} records"


def replay_options(
    args: argparse.Namespace, layers: frozenset[ReplayLayer] | None = None
) -> ReplayOptions:
    """The replay's options from the command line."""
    return ReplayOptions(
        challenges=args.challenges,
        show_identities=args.show_identities,
        layers=layers if layers is not None else frozenset(ReplayLayer),
    )


def run_replay(args: argparse.Namespace) -> int:
    """Replay the traffic through the policy and print the report."""
    layers = parse_layers(args.layers)
    chart = Path(args.chart) if args.chart else None
    if chart is not None and chart.suffix.lower() not in (".svg", ".png"):
        raise UsageError(f"--chart {chart}: the chart is written as .svg or .png; name one")
    loaded, _ = load_and_build(args.policy)
    engine = Replay(loaded, replay_options(args, layers))
    feed = engine.feed
    with open_args_traffic(args, loaded) as traffic:
        for record in traffic:
            feed(record)
    stats = traffic.stats
    result = engine.result()
    warn(result)
    if chart is not None:
        write_chart(result, chart, title=f"Replay of {args.policy}")
    if args.format == "json":
        data = to_json(result, stats_json(stats), policy=args.policy)
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(to_markdown(result, [markdown_text(line) for line in stats_lines(stats)]))
    else:
        sys.stdout.write(terminal_text(to_text(result, stats_lines(stats))))
    return 0


def run_suggest(args: argparse.Namespace) -> int:
    """Print suggested app rates for the target share."""
    target = parse_target(args.target)
    loaded, _ = load_and_build(args.policy)
    if not any(limit.app is not None for limit in loaded.limits):
        raise UsageError(f"{args.policy} has no app limits to suggest rates for")
    with open_args_traffic(args, loaded) as traffic:
        items, engine = suggest(loaded, traffic, target, replay_options(args))
    warn(engine.result())
    stats = traffic.stats
    if args.format == "json":
        data = suggestions_json(items, target)
        data["traffic"] = stats_json(stats)
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(suggestions_markdown(items, target))
    else:
        sys.stdout.write(terminal_text(suggestions_text(items, target, stats_lines(stats))))
    return 0
