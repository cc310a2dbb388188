"""Recorded traffic for a replay: five log formats, read as a stream and merged by time.

``read_traffic(paths, options)`` opens every file at once (so a missing file or a format
that cannot be told fails before anything is replayed), then yields records
(:class:`~edgegen.replay._types.Record`) lazily. Each file is read once, front to back (a
named pipe or a process substitution works), and memory holds per file one block, one line,
the lines the format was told from and a reorder buffer, each with a stated bound (the
constants below; docs/replay.md, "Hostile input"), whatever the file holds; time is linear
in its size.

Formats (told from a file's first non-empty line, or the first of its first ten that shows
one, unless ``options.format`` names one):

``combined``
    nginx/Apache combined (or common) log lines, optionally followed by ``name=value`` or
    ``name="value"`` fields appended in nginx's ``log_format``. Appended ``host``, ``tier``,
    ``msec`` (nginx ``$msec``: sub-second time) and ``authenticated`` are understood; the
    user is ``%u`` unless ``user_from`` names an appended field.
``logpush``
    Cloudflare Logpush ``http_requests`` NDJSON, any ``timestamp_format`` (``unixnano``,
    ``unix``, ``rfc3339``), with the ``RequestHeaders`` and ``Cookies`` custom fields when
    the job logs them.
``events``
    applimit's decision-event log (one JSON object per decision result); only ``hit``
    operations are records, each bound to its app limit.
``ndjson`` / ``csv``
    named columns: ``timestamp``, ``method``, ``host``, ``path``, ``ip`` and optionally
    ``user``, ``tier``, ``authenticated``, ``colo``, ``status``.

Any of them may be gzip-compressed (told by the magic bytes, not the name); ``-`` is stdin.
This module reads the files, tells their formats and orders the records; each format's
parser is its own module (``_combined``, ``_logpush``, ``_events``, ``_ndjson``,
``_csv``), and ``_fields`` holds what they share.

A record's ``authenticated`` comes from ``options.authenticated`` when set, else from the
log's evidence (the headers and cookies of ``authenticated_when`` where the log carries
them, or an ``authenticated`` column), else it is None and the replay decides. Its tier is
the logged tier, else the tiers file's entry for its user, else ``options.default_tier``.

A malformed line is counted by reason with its first examples (``file:line: reason``) in
:class:`TrafficStats` and skipped (a value that is no time, no number or no printable text
is malformed, so nothing after the reader overflows or fails to print it); under
``options.strict`` the first one raises :class:`TrafficError`. Examples never quote a whole
line: only the value at fault, cut before any query string and truncated, so credentials in
a log do not reach a report.
"""

from __future__ import annotations

import contextlib
import gzip
import heapq
import io
import json
import os
import stat
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import IO, Any, Final, cast

from ..replay._types import Record
from ._combined import combined_parser, looks_combined
from ._csv import csv_header, csv_parser
from ._events import events_parser
from ._fields import EPOCH, MAX_TIME_US, Malformed, Parser
from ._logpush import logpush_parser
from ._ndjson import ndjson_parser
from ._options import FORMATS, TrafficError, TrafficOptions

# The reorder buffer holds at most this many records, and this many characters of their
# lines, whatever the window: past either, its oldest record is given out early (so one
# second holding a million records, or a file in reverse order, costs bounded memory), and
# a record older than one already given out is "out of order".
REORDER_MAX_RECORDS: Final = 1 << 15

REORDER_MAX_CHARS: Final = 1 << 24

# Examples kept per file, so a report can point at the lines without listing thousands.
MAX_EXAMPLES: Final = 5

# No request's log line is this long; a longer one is malformed "line too long", skipped
# in pieces of this size and never held (a file without line ends cannot fill memory).
MAX_LINE_CHARS: Final = 1 << 18

# The format is told from the first non-empty line that shows one among this many, and
# from at most this many characters of them (blank lines are passed over, not kept).
DETECT_LINES: Final = 10

DETECT_CHARS: Final = 1 << 20

# Files are read in blocks of this many characters.
_BLOCK_CHARS = 1 << 14


@dataclass(slots=True)
class FileStats:
    """What was read from one file; filled in while its records are iterated.

    ``malformed`` counts malformed lines by reason; ``examples`` holds the first few as
    ``file:line: reason``. ``skipped`` counts well-formed lines that are not requests
    (decision events of a ``peek``). ``first_us`` and ``last_us`` bound the records' times.
    """

    file: str
    format: str
    gzip: bool
    records: int = 0
    skipped: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    first_us: int | None = None
    last_us: int | None = None

    @property
    def malformed_total(self) -> int:
        """Malformed lines of every reason."""
        return sum(self.malformed.values())


@dataclass(slots=True)
class TrafficStats:
    """What was read from every file, in the order the files were named."""

    files: list[FileStats]

    @property
    def records(self) -> int:
        """Records read from every file."""
        return sum(f.records for f in self.files)

    @property
    def malformed(self) -> int:
        """Malformed lines in every file."""
        return sum(f.malformed_total for f in self.files)

    @property
    def first_us(self) -> int | None:
        """The earliest record's time, None before any was read."""
        times = [f.first_us for f in self.files if f.first_us is not None]
        return min(times) if times else None

    @property
    def last_us(self) -> int | None:
        """The latest record's time, None before any was read."""
        times = [f.last_us for f in self.files if f.last_us is not None]
        return max(times) if times else None

    def describe(self) -> list[str]:
        """One line per file, then its malformed reasons and examples, for a report."""
        out: list[str] = []
        for f in self.files:
            packed = ", gzip" if f.gzip else ""
            span = ""
            if f.first_us is not None and f.last_us is not None:
                span = f", {_iso(f.first_us)} .. {_iso(f.last_us)}"
            line = f"{f.file} ({f.format}{packed}): {f.records} records{span}"
            if f.skipped:
                line += f", {f.skipped} skipped"
            if f.malformed:
                line += f", {f.malformed_total} malformed"
            out.append(line)
            out.extend(f"  {n} {reason}" for reason, n in sorted(f.malformed.items()))
            out.extend(f"  e.g. {example}" for example in f.examples)
        return out


# How far a reader has got: (bytes of the inputs read so far, their total size, None when
# an input is a pipe or standard input whose size cannot be known in advance).
Position = tuple[int, int | None]


class Traffic:
    """The records of :func:`read_traffic`, in time order (iterate once), and their stats.

    Closing (or leaving a ``with`` block) closes every file, also after a partial read.
    ``position`` says how far the reading has got, in bytes of the files as stored (gzip
    files by their compressed bytes), for a progress report.
    """

    def __init__(
        self,
        records: Iterator[Record],
        stats: TrafficStats,
        closers: list[Callable[[], None]],
        position: Callable[[], Position] | None = None,
    ) -> None:
        self._records: Iterator[Record] | None = records
        self.stats = stats
        self._closers = closers
        self._position = position

    def position(self) -> Position:
        """Bytes of the inputs read so far and their total size (None when an input is a
        pipe or standard input): an estimate, since readers read a little ahead."""
        return self._position() if self._position is not None else (0, None)

    def observe(
        self, every: int, callback: Callable[[int], None], done: Callable[[], None]
    ) -> Traffic:
        """Call ``callback`` with the number of records given out after every ``every``
        records, and ``done`` when the traffic is closed (however the reading ended)."""
        if every < 1:
            raise ValueError("observe every one record or more")
        if self._records is not None:
            self._records = _observed(self._records, every, callback)
        self._closers.insert(0, done)
        return self

    def __iter__(self) -> Iterator[Record]:
        if self._records is None:
            raise RuntimeError("recorded traffic is a stream: it can be iterated only once")
        records, self._records = self._records, None
        return records

    def require_records(self) -> Traffic:
        """Make a stream that ends without one record a :class:`TrafficError` (raised at its
        end, saying what the lines were instead), so that nothing is reported as if it had
        been replayed: every line malformed, a wrong ``--traffic-format``, empty files."""
        if self._records is not None:
            self._records = self._at_least_one(self._records)
        return self

    def _at_least_one(self, records: Iterator[Record]) -> Iterator[Record]:
        yield from records
        if not self.stats.records:
            raise TrafficError(_nothing_read(self.stats))

    def close(self) -> None:
        """Close every file (stdin is left open)."""
        for release in self._closers:
            release()
        self._closers = []

    def __enter__(self) -> Traffic:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _observed(
    records: Iterator[Record], every: int, callback: Callable[[int], None]
) -> Iterator[Record]:
    due = every
    for count, record in enumerate(records, 1):
        yield record
        if count == due:
            due += every
            callback(count)


def _nothing_read(stats: TrafficStats) -> str:
    """Why no record was read, in one line: the malformed lines' reasons and first example,
    or lines that are not requests, or empty files."""
    names = ", ".join(f.file for f in stats.files)
    malformed = stats.malformed
    if malformed:
        reasons: dict[str, int] = {}
        for f in stats.files:
            for reason, n in f.malformed.items():
                reasons[reason] = reasons.get(reason, 0) + n
        said = ", ".join(f"{n:,} {reason}" for reason, n in sorted(reasons.items()))
        example = next((e for f in stats.files for e in f.examples), "")
        formats = ", ".join(sorted({f.format for f in stats.files}))
        return (
            f"no usable record in {names}: every line with content is malformed ({said}; "
            f"e.g. {example}); the lines were read as {formats}: if that is not their "
            f"format, name it with --traffic-format ({', '.join(FORMATS)})"
        )
    skipped = sum(f.skipped for f in stats.files)
    if skipped:
        return (
            f"no usable record in {names}: its {skipped:,} lines are decision events that are "
            "not hits (peek); replay a log that records requests"
        )
    return (
        f"no record to replay: {names} holds no lines with content; name a file of recorded "
        "requests"
    )


def read_traffic(paths: Sequence[str | Path], options: TrafficOptions) -> Traffic:
    """Open ``paths`` (``-`` is stdin), tell each one's format, and stream their records.

    Raises :class:`TrafficError` now for a file that cannot be opened, whose format cannot
    be told, or that an option does not fit; later, while iterating, for a file that ends
    in the middle of a gzip stream and (under ``strict``) for the first malformed line.
    """
    if not paths:
        raise TrafficError("no traffic files were given; name at least one (or - for stdin)")
    if options.format is not None and options.format not in FORMATS:
        raise TrafficError(
            f"unknown traffic format {options.format!r}; use one of {', '.join(FORMATS)}"
        )
    if options.reorder_window_us < 0:
        raise TrafficError("the reorder window must be zero or positive")
    if sum(1 for p in paths if str(p) == "-") > 1:
        raise TrafficError("stdin (-) can be read only once; name it once")
    user_from = _user_from(options.user_from)
    streams: list[Iterator[Record]] = []
    stats = TrafficStats([])
    closers: list[Callable[[], None]] = []
    positions: list[Callable[[], Position]] = []
    try:
        for path in paths:
            label, text, packed, release, position = _open(path)
            closers.append(release)
            positions.append(position)
            lines = _numbered(text, label)
            head = _head(lines, label)
            # An empty file has no records in any format: it is "empty", not a guess.
            fmt = options.format or (_detect(head, label) if _content(head) else "empty")
            file_stats = FileStats(label, fmt, packed)
            stats.files.append(file_stats)
            parse, rest = _parser(
                fmt, head=head, lines=lines, label=label, user_from=user_from, options=options
            )
            streams.append(_closing(_ordered(rest, parse, file_stats, options, label), release))
    except BaseException:
        for release in closers:
            release()
        raise
    if len(streams) == 1:
        merged: Iterator[Record] = streams[0]
    else:
        # Each file is in time order; ties keep the order the files were named in.
        merged = heapq.merge(*streams, key=attrgetter("at_us"))
    return Traffic(merged, stats, closers, lambda: _sum_positions(positions))


def _sum_positions(positions: Sequence[Callable[[], Position]]) -> Position:
    done = 0
    total: int | None = 0
    for position in positions:
        read, size = position()
        done += read
        total = None if total is None or size is None else total + size
    return done, total


# --- files ---------------------------------------------------------------------------------


def _open(
    path: str | Path,
) -> tuple[str, IO[str], bool, Callable[[], None], Callable[[], Position]]:
    """The file's label, its text, whether it is gzip, what releases it (closes a file;
    leaves stdin open; releasing twice is harmless), and how far it has been read."""
    label = str(path)
    raw: IO[bytes]
    if label == "-":
        label = "<stdin>"
        raw = sys.stdin.buffer
        owned = False
    else:
        try:
            raw = Path(path).open("rb")  # noqa: SIM115 (closed by release() below)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise TrafficError(
                f"cannot read traffic file {label}: {reason}; check the path", file=label
            ) from exc
        owned = True
    # peek needs a buffered reader (a test's stdin may be a plain BytesIO).
    reader = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(Any, raw))
    packed = reader.peek(2)[:2] == b"\x1f\x8b"
    body = cast(IO[bytes], gzip.GzipFile(fileobj=reader, mode="rb") if packed else reader)
    # utf-8-sig drops the byte order mark spreadsheets write; bytes that are not UTF-8 (a
    # binary probe logged raw) become U+FFFD and make that line malformed, not the file.
    text = io.TextIOWrapper(body, encoding="utf-8-sig", errors="replace")

    def release() -> None:
        if owned:
            text.close()
            # A GzipFile given a file object leaves it open: close the file itself too.
            raw.close()
        else:
            # Detached, the wrapper no longer closes stdin when it is collected; a second
            # release finds it detached already.
            with contextlib.suppress(ValueError):
                text.detach()
                if reader is not raw:
                    reader.detach()

    return label, text, packed, release, _position_of(raw)


def _position_of(raw: IO[bytes]) -> Callable[[], Position]:
    """How far ``raw`` has been read, and its size when it is a regular file (a pipe, a
    terminal or a stream without a descriptor has none). A closed file was read to its end
    or abandoned: either way it counts as read."""
    try:
        status = os.fstat(raw.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        return lambda: (0, None)
    if not stat.S_ISREG(status.st_mode):
        return lambda: (0, None)
    size = status.st_size

    def position() -> Position:
        try:
            return min(raw.tell(), size), size
        except (OSError, ValueError):
            return size, size

    return position


def _numbered(text: IO[str], label: str) -> Iterator[tuple[int, str | None]]:
    """``(line number, line without its end)`` for every non-empty line, None for a line
    longer than :data:`MAX_LINE_CHARS`; a damaged gzip stream is a TrafficError.

    The text is read in blocks of :data:`_BLOCK_CHARS` and split (blank lines cost a count,
    not a step each, so a file of blank lines passes quickly). A line is told too long as
    soon as that many characters are read without its end, and the rest of it is dropped
    block by block, never held: a file without line ends (``/dev/zero``) is one malformed
    line at once, not an unbounded read.
    """
    lineno = 0
    read = text.read
    rest = ""
    # Inside a line already told too long: drop what comes up to its end.
    skipping = False
    try:
        while block := read(_BLOCK_CHARS):
            lines = (rest + block).split("\n") if rest else block.split("\n")
            rest = lines.pop()
            if skipping and lines:
                skipping = False
                del lines[0]
            for line in lines:
                lineno += 1
                if line:
                    yield lineno, line if len(line) <= MAX_LINE_CHARS else None
            if skipping:
                rest = ""
            elif len(rest) > MAX_LINE_CHARS:
                lineno += 1
                yield lineno, None
                rest = ""
                skipping = True
        if rest and not skipping:
            yield lineno + 1, rest
    except (EOFError, OSError, zlib.error) as exc:
        raise TrafficError(
            f"{label}:{lineno + 1}: the file cannot be read past this line ({exc}); a gzip "
            "file that ends early was cut off: copy it again, or gunzip what is there",
            file=label,
            line=lineno + 1,
        ) from exc


def _head(lines: Iterator[tuple[int, str | None]], label: str) -> list[tuple[int, str | None]]:
    """The non-empty lines up to the :data:`DETECT_LINES`-th, or until they hold
    :data:`DETECT_CHARS` characters, read to tell the format. Blank lines are passed over
    and not kept: the parsers skip them anyway, and a file of blank lines must not fill
    memory."""
    head: list[tuple[int, str | None]] = []
    chars = 0
    for lineno, line in lines:
        if line is None and not head:
            raise TrafficError(
                f"{label}:{lineno}: the line is longer than {MAX_LINE_CHARS:,} characters, "
                "so this is no log of requests (a binary file, or JSON without line ends?); "
                "name a log file with one request per line",
                file=label,
                line=lineno,
            )
        if line is not None and (not line or line.isspace()):
            continue
        head.append((lineno, line))
        chars += len(line) if line is not None else MAX_LINE_CHARS
        if len(head) == DETECT_LINES or chars >= DETECT_CHARS:
            break
    return head


def _content(head: Sequence[tuple[int, str | None]]) -> list[tuple[int, str]]:
    """The non-empty lines of ``head``."""
    return [(lineno, line) for lineno, line in head if line is not None and line.strip()]


def _detect(head: Sequence[tuple[int, str | None]], label: str) -> str:
    """The format of the first of the file's first lines that shows one.

    Usually that is the first line; the next few are tried so that one damaged line at the
    start (a log rotated while a line was being written) does not hide the format. A CSV
    header must be the first line.
    """
    content = _content(head)
    for i, (_, line) in enumerate(content):
        found = _detect_line(line.strip(), first=i == 0)
        if found is not None:
            return found
    raise TrafficError(
        f"{label}:{content[0][0]}: cannot tell the format of this traffic file from its first "
        f"{'line' if len(content) == 1 else f'{len(content)} lines'}: none is a combined log "
        "line, a Logpush or decision-event JSON object, NDJSON with a 'timestamp' key, or a "
        f"CSV header with a 'timestamp' column; name the format with --traffic-format "
        f"({', '.join(FORMATS)})",
        file=label,
        line=content[0][0],
    )


def _detect_line(line: str, *, first: bool) -> str | None:
    """The format one line is in, if it shows one (a CSV header only on the ``first``)."""
    if line.startswith("{"):
        return _detect_object(line)
    if looks_combined(line):
        return "combined"
    if first and "," in line:
        with contextlib.suppress(Malformed):
            if "timestamp" in csv_header(line):
                return "csv"
    return None


def _detect_object(line: str) -> str | None:
    """The JSON format a line is in, told by its keys."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    if "v" in obj and "limit" in obj and "identity" in obj:
        return "events"
    if any(k in obj for k in ("EdgeStartTimestamp", "ClientRequestURI", "ClientIP")):
        return "logpush"
    return "ndjson" if "timestamp" in obj else None


def _parser(
    fmt: str,
    *,
    head: list[tuple[int, str | None]],
    lines: Iterator[tuple[int, str | None]],
    label: str,
    user_from: tuple[str, str] | None,
    options: TrafficOptions,
) -> tuple[Parser, Iterator[tuple[int, str | None]]]:
    """The line parser of ``fmt`` and the lines it reads (``head`` included, but for a CSV
    header)."""
    if user_from is not None and user_from[0] != "field" and fmt not in ("logpush", "empty"):
        raise TrafficError(
            f"{label}: --user-from {options.user_from} reads a request {user_from[0]}, which "
            f"only Logpush logs carry, but this file is {fmt}; log the value as a field or "
            "column and name that field instead",
            file=label,
        )
    if fmt == "empty":
        return _no_records, lines
    content = _content(head)
    if fmt == "csv":
        if not content:
            return csv_parser(label, [], user_from, options), lines
        header_at, header = content[0]
        try:
            names = csv_header(header)
        except Malformed as bad:
            raise TrafficError(
                f"{label}:{header_at}: the CSV header cannot be read ({bad.detail}); the first "
                "line must name the columns",
                file=label,
                line=header_at,
            ) from None
        after = [(n, line) for n, line in head if n > header_at]
        return csv_parser(label, names, user_from, options), chain(after, lines)
    rest = chain(head, lines)
    factory = {
        "combined": combined_parser,
        "logpush": logpush_parser,
        "events": events_parser,
        "ndjson": ndjson_parser,
    }[fmt]
    return factory(user_from, options), rest


def _no_records(line: str) -> Record | None:
    raise Malformed("not a log line", "the file was empty when its format was told")


def _closing(records: Iterator[Record], release: Callable[[], None]) -> Iterator[Record]:
    """``records``, closing the file once they are read, fail, or are dropped unread."""
    try:
        yield from records
    finally:
        release()


def _ordered(  # noqa: C901, PLR0912, PLR0915 (every record's hot loop: one body, no calls)
    lines: Iterable[tuple[int, str | None]],
    parse: Parser,
    stats: FileStats,
    options: TrafficOptions,
    label: str,
) -> Iterator[Record]:
    """One file's records in time order, through a reorder buffer of ``reorder_window_us``.

    A record is held until one ``window`` later has been read, so records up to a window
    late are put back in order; a record later than that (its time is before the newest
    seen minus the window) cannot be, since records after it may already have been given
    out, and is malformed "out of order". The buffer holds at most
    :data:`REORDER_MAX_RECORDS` records and :data:`REORDER_MAX_CHARS` characters of their
    lines: past either, the oldest is given out before its window has passed, and a record
    older than one given out is "out of order" too.
    """
    window = options.reorder_window_us
    strict = options.strict
    # (time, line length, record) in time order: nearly every record is the newest yet and
    # is appended here.
    pending: deque[tuple[int, int, Record]] = deque()
    append, popleft = pending.append, pending.popleft
    # The records that came behind a newer one: a heap of (time, line number, line length,
    # record), so that a file in reverse order costs log n a record, not n. The line number
    # keeps equal times in file order and spares the heap from comparing records; a record
    # here is given out after any in ``pending`` of the same time, which were read first.
    late: list[tuple[int, int, int, Record]] = []
    push, pop = heapq.heappush, heapq.heappop
    held = 0
    newest = released = -(1 << 62)
    for lineno, line in lines:
        if not line or line.isspace():
            if line is None:
                too_long = Malformed("line too long", f"over {MAX_LINE_CHARS:,} characters")
                _count(stats, label, lineno, too_long, strict)
            continue
        try:
            record = parse(line)
            if record is None:
                stats.skipped += 1
                continue
            at = record.at_us
            if not 0 <= at <= MAX_TIME_US:
                raise Malformed("timestamp", "the time is before 1970 or after the year 9999")
            if at < newest - window or at < released:
                raise _late(at, newest - window, released, window)
        except Malformed as bad:
            _count(stats, label, lineno, bad, strict)
            continue
        size = len(line)
        held += size
        if at >= newest:
            newest = at
            append((at, size, record))
        else:
            push(late, (at, lineno, size, record))
        due = newest - window
        while True:
            if late and (not pending or late[0][0] < pending[0][0]):
                if not (
                    late[0][0] < due
                    or len(pending) + len(late) > REORDER_MAX_RECORDS
                    or held > REORDER_MAX_CHARS
                ):
                    break
                at, _, size, record = pop(late)
            elif pending and (
                pending[0][0] < due
                or len(pending) + len(late) > REORDER_MAX_RECORDS
                or held > REORDER_MAX_CHARS
            ):
                at, size, record = popleft()
            else:
                break
            held -= size
            released = at
            if stats.first_us is None:
                stats.first_us = at
            stats.records += 1
            stats.last_us = at
            yield record
    while pending or late:
        if late and (not pending or late[0][0] < pending[0][0]):
            at, _, _, record = pop(late)
        else:
            at, _, record = popleft()
        if stats.first_us is None:
            stats.first_us = at
        stats.records += 1
        stats.last_us = at
        yield record


def _late(at: int, due: int, released: int, window: int) -> Malformed:
    """Why a record cannot be put in order: later than the window, or older than a record
    the full reorder buffer already gave out."""
    if at < due:
        return Malformed(
            "out of order",
            f"{(due + window - at) / 1e6:.3f} s before a record already read (the tolerance "
            f"is {window / 1e6:g} s; sort the file by time)",
        )
    return Malformed(
        "out of order",
        f"{(released - at) / 1e6:.3f} s before a record already replayed (the reorder buffer "
        f"of {REORDER_MAX_RECORDS:,} records was full; sort the file by time)",
    )


def _count(stats: FileStats, label: str, lineno: int, bad: Malformed, strict: bool) -> None:
    """Count a malformed line (or, under strict, raise for it)."""
    said = f"{bad.reason}: {bad.detail}" if bad.detail else bad.reason
    where = f"{label}:{lineno}"
    if strict:
        raise TrafficError(
            f"{where}: malformed line ({said}); fix or remove the line, or leave out --strict "
            "to count malformed lines and go on",
            file=label,
            line=lineno,
        )
    stats.malformed[bad.reason] = stats.malformed.get(bad.reason, 0) + 1
    if len(stats.examples) < MAX_EXAMPLES:
        stats.examples.append(f"{where}: {said}")


def _user_from(value: str | None) -> tuple[str, str] | None:
    """``header:x-user`` -> ("header", "x-user"); ``cookie:NAME``; anything else a field."""
    if value is None:
        return None
    kind, sep, name = value.partition(":")
    if sep and kind in ("header", "cookie"):
        if not name:
            raise TrafficError(
                f"--user-from {value!r} names no {kind}; write {kind}:NAME, e.g. header:x-user"
            )
        return kind, name.lower() if kind == "header" else name
    if not value.strip():
        raise TrafficError("--user-from is empty; name a field, header:NAME or cookie:NAME")
    return "field", value


def _iso(at_us: int) -> str:
    return (EPOCH + timedelta(microseconds=at_us)).isoformat().replace("+00:00", "Z")
