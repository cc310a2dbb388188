"""Recorded traffic for a replay: five log formats, read as a stream and merged by time.

``read_traffic(paths, options)`` opens every file at once (so a missing file or a format
that cannot be told fails before anything is replayed), then yields :class:`Request` records
lazily. Each file is read once, front to back (a named pipe or a process substitution
works), and memory holds per file one block, one line, the lines the format was told from
and a reorder buffer, each with a stated bound (the constants below; docs/replay.md,
"Hostile input"), whatever the file holds; time is linear in its size.

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
import csv
import gzip
import heapq
import io
import json
import os
import re
import stat
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import IO, Any, Final, cast

import yaml

from ..errors import EdgegenError
from ..replay._types import Request

FORMATS: Final = ("combined", "logpush", "events", "ndjson", "csv")

# Records of one file may be this much out of time order (Apache writes %t, the time a
# request arrived, when it finishes; a proxy's buffers flush out of order) and still be
# replayed in order; anything later is counted as malformed "out of order".
REORDER_WINDOW_US: Final = 5_000_000
# The reorder buffer holds at most this many records, and this many characters of their
# lines, whatever the window: past either, its oldest record is given out early (so one
# second holding a million records, or a file in reverse order, costs bounded memory), and
# a record older than one already given out is "out of order".
REORDER_MAX_RECORDS: Final = 1 << 15
REORDER_MAX_CHARS: Final = 1 << 24
# Examples kept per file, so a report can point at the lines without listing thousands.
MAX_EXAMPLES: Final = 5
_SHOWN_CHARS = 40
# No request's log line is this long; a longer one is malformed "line too long", skipped
# in pieces of this size and never held (a file without line ends cannot fill memory).
MAX_LINE_CHARS: Final = 1 << 18
# The format is told from the first non-empty line that shows one among this many, and
# from at most this many characters of them (blank lines are passed over, not kept).
DETECT_LINES: Final = 10
DETECT_CHARS: Final = 1 << 20
# Files are read in blocks of this many characters.
_BLOCK_CHARS = 1 << 14
# Record times must lie from the Unix epoch to the end of the year 9999 (what a datetime
# holds); any other time is malformed "timestamp", never an overflow later on.
MAX_TIME_US: Final = 253_402_300_799_999_999
# The cost of a decision event is at most applimit's MAX_COST.
MAX_COST: Final = 1_000_000_000
# A number read from text (unix seconds, a status code) has at most this many digits.
_MAX_DIGITS = 20

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MONTHS: Final = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}


class TrafficError(EdgegenError):
    """A traffic file cannot be read, its format cannot be told, an option does not fit it,
    or (under ``strict``) a line is malformed. ``file`` and ``line`` locate it when known."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.line = line


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    """How to read traffic files.

    ``format``: one of :data:`FORMATS`, or None to detect each file's. ``user_from``: where
    the user is: ``header:NAME`` or ``cookie:NAME`` (Logpush's ``RequestHeaders`` and
    ``Cookies``), or a field or column name (an appended field of a combined log). ``tiers``:
    user -> tier (:func:`load_tiers`); ``default_tier`` for records whose tier is unknown.
    ``authenticated_headers`` and ``authenticated_cookies``: the policy's
    ``authenticated_when``; ``authenticated`` forces every record's value. ``strict``: the
    first malformed line is an error.
    """

    format: str | None = None
    user_from: str | None = None
    tiers: Mapping[str, str] = field(default_factory=dict)
    default_tier: str | None = None
    authenticated_headers: Sequence[str] = ()
    authenticated_cookies: Sequence[str] = ()
    authenticated: bool | None = None
    strict: bool = False
    reorder_window_us: int = REORDER_WINDOW_US


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
        records: Iterator[Request],
        stats: TrafficStats,
        closers: list[Callable[[], None]],
        position: Callable[[], Position] | None = None,
    ) -> None:
        self._records: Iterator[Request] | None = records
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

    def __iter__(self) -> Iterator[Request]:
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

    def _at_least_one(self, records: Iterator[Request]) -> Iterator[Request]:
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
    records: Iterator[Request], every: int, callback: Callable[[int], None]
) -> Iterator[Request]:
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


class _Malformed(Exception):
    """One line is not a record: ``reason`` is the counted kind, ``detail`` the rest."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


# A parser turns one line (no newline) into a record, None for a line to skip, or raises
# _Malformed.
_Parser = Callable[[str], Request | None]


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
    streams: list[Iterator[Request]] = []
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
        merged: Iterator[Request] = streams[0]
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
        found = _detect_line(line.strip(), csv_header=i == 0)
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


def _detect_line(line: str, *, csv_header: bool) -> str | None:
    """The format one line is in, if it shows one."""
    if line.startswith("{"):
        return _detect_object(line)
    if _COMBINED.match(line):
        return "combined"
    if csv_header and "," in line:
        with contextlib.suppress(_Malformed):
            if "timestamp" in _csv_header(line):
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
) -> tuple[_Parser, Iterator[tuple[int, str | None]]]:
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
            return _csv_parser(label, [], user_from, options), lines
        header_at, header = content[0]
        try:
            names = _csv_header(header)
        except _Malformed as bad:
            raise TrafficError(
                f"{label}:{header_at}: the CSV header cannot be read ({bad.detail}); the first "
                "line must name the columns",
                file=label,
                line=header_at,
            ) from None
        after = [(n, line) for n, line in head if n > header_at]
        return _csv_parser(label, names, user_from, options), chain(after, lines)
    rest = chain(head, lines)
    factory = {
        "combined": _combined_parser,
        "logpush": _logpush_parser,
        "events": _events_parser,
        "ndjson": _ndjson_parser,
    }[fmt]
    return factory(user_from, options), rest


def _no_records(line: str) -> Request | None:
    raise _Malformed("not a log line", "the file was empty when its format was told")


def _closing(records: Iterator[Request], release: Callable[[], None]) -> Iterator[Request]:
    """``records``, closing the file once they are read, fail, or are dropped unread."""
    try:
        yield from records
    finally:
        release()


def _ordered(  # noqa: C901, PLR0912, PLR0915 (every record's hot loop: one body, no calls)
    lines: Iterable[tuple[int, str | None]],
    parse: _Parser,
    stats: FileStats,
    options: TrafficOptions,
    label: str,
) -> Iterator[Request]:
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
    pending: deque[tuple[int, int, Request]] = deque()
    append, popleft = pending.append, pending.popleft
    # The records that came behind a newer one: a heap of (time, line number, line length,
    # record), so that a file in reverse order costs log n a record, not n. The line number
    # keeps equal times in file order and spares the heap from comparing records; a record
    # here is given out after any in ``pending`` of the same time, which were read first.
    late: list[tuple[int, int, int, Request]] = []
    push, pop = heapq.heappush, heapq.heappop
    held = 0
    newest = released = -(1 << 62)
    for lineno, line in lines:
        if not line or line.isspace():
            if line is None:
                too_long = _Malformed("line too long", f"over {MAX_LINE_CHARS:,} characters")
                _count(stats, label, lineno, too_long, strict)
            continue
        try:
            record = parse(line)
            if record is None:
                stats.skipped += 1
                continue
            at = record.at_us
            if not 0 <= at <= MAX_TIME_US:
                raise _Malformed("timestamp", "the time is before 1970 or after the year 9999")
            if at < newest - window or at < released:
                raise _late(at, newest - window, released, window)
        except _Malformed as bad:
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


def _late(at: int, due: int, released: int, window: int) -> _Malformed:
    """Why a record cannot be put in order: later than the window, or older than a record
    the full reorder buffer already gave out."""
    if at < due:
        return _Malformed(
            "out of order",
            f"{(due + window - at) / 1e6:.3f} s before a record already read (the tolerance "
            f"is {window / 1e6:g} s; sort the file by time)",
        )
    return _Malformed(
        "out of order",
        f"{(released - at) / 1e6:.3f} s before a record already replayed (the reorder buffer "
        f"of {REORDER_MAX_RECORDS:,} records was full; sort the file by time)",
    )


def _count(stats: FileStats, label: str, lineno: int, bad: _Malformed, strict: bool) -> None:
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


# --- values shared by the formats ------------------------------------------------------------


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


def _shown(value: object) -> str:
    """A logged value as a report may quote it: before any query string (where tokens
    travel), with anything credential-like cut, and short. A JSON list or object is named,
    not printed (it may be nested deeper than repr() can go)."""
    if isinstance(value, dict | list):
        return "a JSON object" if isinstance(value, dict) else "a JSON list"
    text = str(value)[: 4 * _SHOWN_CHARS]
    text = text.split("?", 1)[0]
    text = _SECRETISH.sub(r"\1<redacted>", text)
    if len(text) > _SHOWN_CHARS:
        text = text[:_SHOWN_CHARS] + "..."
    return repr(text)


# A header or cookie that may carry a credential, with whatever follows it on the line.
_SECRETISH = re.compile(r"(?i)((?:authorization|cookie|bearer|basic|token|session)\W*).*")


def _host(raw: str) -> str:
    """Lower case, without a port (``[::1]:8443`` -> ``[::1]``)."""
    host = raw.lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    if host.count(":") == 1:
        return host.partition(":")[0]
    return host


def _tier(
    logged: str | None, user: str | None, tiers: Mapping[str, str], default: str | None
) -> str | None:
    if logged:
        return logged
    if user is not None and tiers:
        return tiers.get(user, default)
    return default


_TRUE = frozenset(("1", "true", "yes", "y", "t"))
_FALSE = frozenset(("0", "false", "no", "n", "f"))


def _flag(value: object) -> bool | None:
    """An ``authenticated`` column's value; empty is unknown."""
    if value is None or isinstance(value, bool):
        return value
    if type(value) is not str and not isinstance(value, int | float):
        raise _Malformed("authenticated", f"{_shown(value)} is not true or false")
    text = str(value).strip().lower()
    if not text or text == "-":
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _Malformed("authenticated", f"{_shown(value)} is not true or false")


def _digits(text: str) -> bool:
    """Whether ``text`` is a whole number int() takes at once: ASCII digits (``isdigit``
    also says yes to "²", which int() refuses), not too many of them."""
    return text.isdigit() and text.isascii() and len(text) <= _MAX_DIGITS


def _rfc3339_us(text: str) -> int:
    """``2026-12-03T08:00:00.5Z`` -> µs; an offset is required (a local time is a guess)."""
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            raise _Malformed("timestamp", f"{_shown(text)} has no UTC offset (add Z or +00:00)")
        # The offset may carry the year 1 before the epoch's calendar begins.
        return (when - _EPOCH) // _MICROSECOND
    except (ValueError, OverflowError):
        raise _Malformed("timestamp", f"{_shown(text)} is not an RFC 3339 time") from None


def _unix_us(text: str) -> int:
    """``1764748800.123456`` (unix seconds, any fraction) -> µs, exactly."""
    whole, _, frac = text.partition(".")
    if not (whole.isdigit() and whole.isascii() and len(whole) <= _MAX_DIGITS) or (
        frac and not (frac.isdigit() and frac.isascii())
    ):
        raise _Malformed("timestamp", f"{_shown(text)} is not unix seconds or RFC 3339")
    return int(whole) * 1_000_000 + (int((frac + "000000")[:6]) if frac else 0)


def _seconds_us(value: float) -> int:
    """Unix seconds as a JSON number with a fraction -> µs; never an overflow (infinity,
    ``1e400``) or NaN, which are malformed."""
    if not 0 <= value <= MAX_TIME_US / 1_000_000:
        raise _Malformed("timestamp", f"{_shown(value)} is not a time from 1970 to 9999")
    return round(value * 1_000_000)


def _time_us(value: object) -> int:
    """A named column's or JSON field's time: unix seconds (number or text) or RFC 3339."""
    if type(value) is str and len(value) > 10 and value[10] in "Tt ":
        return _rfc3339_us(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 1_000_000
    if isinstance(value, float):
        return _seconds_us(value)
    if isinstance(value, str) and value:
        if value[0].isdigit() and "-" not in value and ":" not in value:
            return _unix_us(value)
        return _rfc3339_us(value)
    raise _Malformed("timestamp", f"{_shown(value)} is not a time")


def _epoch_number_us(value: int) -> int:
    """An integer epoch time in seconds, ms, µs or ns (told by its size) -> µs.

    Logpush writes seconds (``unix``) or nanoseconds (``unixnano``, the default); the sizes
    do not overlap for any time between 1973 and 5138.
    """
    if value < 100_000_000_000:
        return value * 1_000_000
    if value < 100_000_000_000_000:
        return value * 1_000
    if value < 100_000_000_000_000_000:
        return value
    return value // 1_000


def _logpush_time_us(value: object) -> int:
    """``EdgeStartTimestamp`` in any of Logpush's timestamp formats -> µs."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return _epoch_number_us(value)
    if isinstance(value, str) and _digits(value):
        return _epoch_number_us(int(value))
    if isinstance(value, float):
        return _seconds_us(value)
    if isinstance(value, str) and value:
        return _rfc3339_us(value)
    raise _Malformed("timestamp", f"EdgeStartTimestamp {_shown(value)} is not a time")


def _path(target: str) -> str:
    """The path part of a logged target: no query, no fragment."""
    cut = target.find("?")
    if cut >= 0:
        target = target[:cut]
    cut = target.find("#")
    return target[:cut] if cut >= 0 else target


def _text_field(obj: Mapping[str, Any], key: str, *, required: bool = True) -> str:
    value = obj.get(key)
    if isinstance(value, str) and value:
        return value
    if value is None or value == "":
        if required:
            raise _Malformed("missing field", f"no {key!r}")
        return ""
    raise _Malformed("field type", f"{key!r} is not text")


_decode = json.JSONDecoder().raw_decode


def _load_object(line: str) -> dict[str, Any]:
    try:
        obj, end = _decode(line)
        if end != len(line) and line[end:].strip():
            raise json.JSONDecodeError("extra data after the object", line, end)
    except (ValueError, RecursionError) as exc:
        # The position, not the text: the line may hold headers and cookies. Nesting deeper
        # than the decoder recurses is as malformed as a missing brace.
        pos = getattr(exc, "colno", None)
        at = f" (column {pos})" if pos else ""
        raise _Malformed("not JSON", f"the line is not a JSON object{at}") from None
    if not isinstance(obj, dict):
        raise _Malformed("not JSON", "the line is JSON but not an object")
    if "\\u" in line and _lone_surrogate(obj):
        # Only a \u escape of half a surrogate pair can make one (the text was decoded
        # with replacement); it cannot be written as UTF-8, so no report could print it.
        raise _Malformed("encoding", "a \\uD800-\\uDFFF escape that is half of a pair")
    return obj


def _lone_surrogate(obj: object) -> bool:
    """Whether any text of a decoded JSON value (keys included) holds a lone surrogate.
    A loop, not recursion: the value may be nested as deep as the decoder went."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _optional_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool | dict | list):
        raise _Malformed("field type", f"{_shown(value)} is not text")
    text = str(value)
    return text if text and text != "-" else None


def _status(value: object) -> int | None:
    if value is None or value in ("", "-"):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value or None
    if isinstance(value, str) and value.isdigit() and value.isascii() and len(value) < 10:
        return int(value) or None
    raise _Malformed("status", f"{_shown(value)} is not a status code")


# --- combined ------------------------------------------------------------------------------

# %h %l %u [%t] "%r" %>s %b, then "%{Referer}i" "%{User-agent}i" (combined) and appended
# fields. Quoted parts may hold backslash escapes (Apache \", nginx \x22). Every pattern
# runs in time linear in the line: the repeats are possessive, and an appended field's
# name must begin a run of name characters (after a space or a quote), so a long run with
# no "=" after it is scanned once, not again from each of its characters.
_QUOTED = r'"([^"\\]*+(?:\\.[^"\\]*+)*+)"'
_COMBINED = re.compile(
    rf"(\S+) (\S+) (\S+) \[([^\]]*)\] {_QUOTED} (\S+) (\S+)(?: {_QUOTED} {_QUOTED})?(.*)"
)
_APPENDED = re.compile(rf"(?<![\w.-])([A-Za-z_][\w.-]*+)=(?:{_QUOTED}|(\S*))")
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|.)")


def _unescape(text: str) -> str:
    """nginx's and Apache's escapes (``\\x22``, ``\\"``, ``\\\\``) -> the logged text."""
    if "\\" not in text:
        return text
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos : m.start()].encode()
        code = m.group(1)
        out += bytes((int(code[1:], 16),)) if len(code) == 3 else code.encode()
        pos = m.end()
    out += text[pos:].encode()
    return out.decode("utf-8", "replace")


def _clf_time_us(text: str) -> int:
    """``10/Oct/2000:13:55:36 -0700`` -> µs (the offset honoured)."""
    try:
        if len(text) != 26 or text[2] != "/" or text[6] != "/" or text[20] != " ":
            raise ValueError(text)
        sign = {"+": 1, "-": -1}[text[21]]
        offset = timedelta(hours=int(text[22:24]), minutes=int(text[24:26]))
        when = datetime(
            int(text[7:11]),
            _MONTHS[text[3:6]],
            int(text[0:2]),
            int(text[12:14]),
            int(text[15:17]),
            int(text[18:20]),
            tzinfo=timezone(sign * offset),
        )
        # The offset may carry the year 1 before the epoch's calendar begins.
        return (when - _EPOCH) // _MICROSECOND
    except (ValueError, KeyError, OverflowError):
        raise _Malformed("timestamp", f"[{_shown(text)}] is not a log time") from None


def _request_line(line: str) -> tuple[str, str, str]:
    """``GET /a?b HTTP/1.1`` -> method, path (and the host of an absolute target)."""
    parts = line.split(" ")
    if len(parts) == 3:
        method, target, protocol = parts
        if not protocol.startswith("HTTP/"):
            raise _Malformed("request line", f"{_shown(line)} is not a request")
    elif len(parts) == 2:  # HTTP/0.9: no protocol
        method, target = parts
    else:
        raise _Malformed("request line", f"{_shown(line)} is not a request")
    if not (method.isalpha() and method.isascii()):
        raise _Malformed("request line", f"{_shown(line)} is not a request")
    if target.startswith("/"):
        return method.upper(), _path(target), ""
    if target == "*":
        return method.upper(), "*", ""
    lowered = target[:8].lower()
    if lowered.startswith(("http://", "https://")):
        # An absolute-form target (a request to a proxy): its host, then the path.
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        host = rest if slash < 0 else rest[:slash]
        path = "/" if slash < 0 else _path(rest[slash:])
        return method.upper(), path, _host(host)
    raise _Malformed("request line", f"{_shown(line)} has no path")


def _appended(rest: str) -> dict[str, str]:
    """The ``name=value`` and ``name="value"`` fields after the combined part."""
    if not rest:
        return {}
    # findall gives "" for the alternative that did not match: a quoted value, or a bare one.
    return {k: _unescape(q or v) for k, q, v in _APPENDED.findall(rest)}


def _combined_parts(line: str) -> tuple[str, str, str, str, str, str]:
    """ip, %u, time, request line, status and what follows (appended fields).

    Most lines hold no backslash escape, so splitting on quotes takes them apart; any other
    line goes through the regular expression, which also says what is malformed.
    """
    if "\\" not in line:
        parts = line.split('"')
        if len(parts) >= 3:
            head = parts[0].split(" ", 3)
            middle = parts[2].split()
            if (
                len(head) == 4
                and len(middle) == 2
                and head[3].startswith("[")
                and head[3].endswith("] ")
                and "]" not in head[3][1:-2]
            ):
                if len(parts) == 3:
                    return head[0], head[2], head[3][1:-2], parts[1], middle[0], ""
                if len(parts) >= 6 and parts[4] == " " and parts[2].endswith(" "):
                    rest = '"'.join(parts[6:])
                    return head[0], head[2], head[3][1:-2], parts[1], middle[0], rest
    m = _COMBINED.match(line)
    if m is None:
        raise _Malformed("not a log line", "it does not have the combined log layout")
    ip, _, remote_user, when, request, status, _, _, _, rest = m.groups()
    return ip, remote_user, when, request, status, rest


def _combined_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> _Parser:
    user_field = user_from[1] if user_from is not None else None
    tiers, default_tier, forced = options.tiers, options.default_tier, options.authenticated
    # Log times repeat for every request of a second: parse each distinct text once.
    last_time, last_us = "", 0

    def parse(line: str) -> Request:
        nonlocal last_time, last_us
        ip, remote_user, when, request, status, rest = _combined_parts(line)
        if when != last_time:
            last_us = _clf_time_us(when)
            last_time = when
        at = last_us
        method, path, host = _request_line(_unescape(request) if "\\" in request else request)
        user = None if remote_user == "-" else _unescape(remote_user)
        tier = authenticated = None
        if rest or user_field is not None:
            fields = _appended(rest)
            given = fields.get("host")
            if given and given != "-" and not host:
                host = _host(given)
            given = fields.get("tier")
            tier = given if given and given != "-" else None
            if "msec" in fields:
                at = _unix_us(fields["msec"])
            if "authenticated" in fields:
                authenticated = _flag(fields["authenticated"])
            if user_field is not None:
                given = fields.get(user_field)
                user = given if given and given != "-" else None
        if forced is not None:
            authenticated = forced
        return Request(
            at,
            method,
            host,
            path,
            ip,
            user,
            _tier(tier, user, tiers, default_tier),
            authenticated,
            None,
            _status(status),
        )

    return parse


# --- Logpush -------------------------------------------------------------------------------


def _logpush_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> _Parser:
    auth_headers = tuple(h.lower() for h in options.authenticated_headers)
    auth_cookies = tuple(options.authenticated_cookies)
    tiers, default_tier, forced = options.tiers, options.default_tier, options.authenticated
    kind, name = user_from if user_from is not None else ("", "")

    def parse(line: str) -> Request:
        obj = _load_object(line)
        if "EdgeStartTimestamp" not in obj:
            raise _Malformed("missing field", "no 'EdgeStartTimestamp'")
        at = _logpush_time_us(obj["EdgeStartTimestamp"])
        path = obj.get("ClientRequestPath")
        if not (isinstance(path, str) and path):
            path = _path(_text_field(obj, "ClientRequestURI"))
        headers = obj.get("RequestHeaders")
        cookies = obj.get("Cookies")
        if not isinstance(headers, dict):
            headers = None
        if not isinstance(cookies, dict):
            cookies = None
        source = headers if kind == "header" else cookies if kind == "cookie" else obj
        user = _optional_text(source.get(name)) if kind and source else None
        authenticated = forced
        if forced is None and (headers is not None or cookies is not None):
            # The job logs these fields: a credential absent from them was not sent.
            authenticated = bool(headers and any(headers.get(h) for h in auth_headers)) or bool(
                cookies and any(cookies.get(c) for c in auth_cookies)
            )
        status = _status(obj.get("EdgeResponseStatus")) or _status(obj.get("OriginResponseStatus"))
        colo = obj.get("EdgeColoCode")
        return Request(
            at,
            _text_field(obj, "ClientRequestMethod").upper(),
            _host(_text_field(obj, "ClientRequestHost", required=False)),
            path,
            _text_field(obj, "ClientIP"),
            user,
            _tier(None, user, tiers, default_tier),
            authenticated,
            colo if isinstance(colo, str) and colo else None,
            status,
        )

    return parse


# --- decision events -----------------------------------------------------------------------


def _events_parser(_: tuple[str, str] | None, options: TrafficOptions) -> _Parser:
    """Decision events name their identity: ``user_from`` does not apply to them."""
    default_tier = options.default_tier

    def parse(line: str) -> Request | None:
        obj = _load_object(line)
        if obj.get("v") != 1:
            raise _Malformed("event version", f"version {_shown(obj.get('v'))} is not 1")
        if obj.get("operation", "hit") != "hit":
            return None
        cost = obj.get("cost", 1)
        if not isinstance(cost, int) or isinstance(cost, bool) or not 1 <= cost <= MAX_COST:
            raise _Malformed("cost", f"{_shown(cost)} is not a whole number from 1 to {MAX_COST:,}")
        tier = obj.get("tier")
        return Request(
            _time_us(obj.get("ts")),
            "",
            "",
            "",
            "",
            user=_text_field(obj, "identity"),
            tier=tier if isinstance(tier, str) and tier else default_tier,
            limit=_text_field(obj, "limit"),
            cost=cost,
        )

    return parse


# --- named columns (NDJSON, CSV) -----------------------------------------------------------

_REQUIRED_COLUMNS: Final = ("timestamp", "method", "path", "ip")


def _required(row: Mapping[str, Any]) -> tuple[object, str, str, str]:
    """The timestamp, method, path and ip every named row must have."""
    try:
        when, method, path, ip = row["timestamp"], row["method"], row["path"], row["ip"]
    except KeyError as exc:
        raise _Malformed("missing field", f"no {exc.args[0]!r}") from None
    if type(method) is not str or type(path) is not str or type(ip) is not str:
        raise _Malformed("field type", "'method', 'path' and 'ip' must be text")
    if not (method and path and ip):
        raise _Malformed("missing field", "'method', 'path' and 'ip' must not be empty")
    return when, method, path, ip


def _named(row: Mapping[str, Any], user_key: str, options: TrafficOptions) -> Request:
    """A record from named values (a JSON object, or a CSV row as text)."""
    when, method, path, ip = _required(row)
    host = row.get("host") or ""
    if type(host) is not str:
        raise _Malformed("field type", "'host' is not text")
    user = row.get(user_key)
    if user is not None and (type(user) is not str or not user or user == "-"):
        user = _optional_text(user)
    tier = row.get("tier")
    if tier is not None and (type(tier) is not str or not tier or tier == "-"):
        tier = _optional_text(tier)
    colo = row.get("colo")
    if colo is not None and (type(colo) is not str or not colo or colo == "-"):
        colo = _optional_text(colo)
    authenticated = options.authenticated
    if authenticated is None:
        authenticated = row.get("authenticated")
        if authenticated is not None and type(authenticated) is not bool:
            authenticated = _flag(authenticated)
    status = row.get("status")
    if status is not None and type(status) is not int:
        status = _status(status)
    return Request(
        _time_us(when),
        method.upper(),
        # The calls only for the values that need them: most hold no port and no query.
        _host(host) if ":" in host else host.lower(),
        _path(path) if "?" in path or "#" in path else path,
        ip,
        user,
        tier or _tier(None, user, options.tiers, options.default_tier),
        authenticated,
        colo,
        status or None,
    )


def _ndjson_parser(user_from: tuple[str, str] | None, options: TrafficOptions) -> _Parser:
    user_key = user_from[1] if user_from is not None else "user"

    def parse(line: str) -> Request:
        return _named(_load_object(line), user_key, options)

    return parse


def _csv_values(line: str) -> list[str]:
    """One CSV row's values; a row the csv module refuses (a field over its size limit) is
    malformed."""
    try:
        return next(csv.reader((line,)), [])
    except csv.Error as exc:
        raise _Malformed("columns", f"not a CSV row ({exc})") from None


def _csv_header(line: str) -> list[str]:
    return [name.strip().lower() for name in _csv_values(line)]


def _csv_parser(
    label: str, header: list[str], user_from: tuple[str, str] | None, options: TrafficOptions
) -> _Parser:
    missing = [c for c in _REQUIRED_COLUMNS if c not in header]
    if header and missing:
        raise TrafficError(
            f"{label}: the CSV header has no {', '.join(repr(c) for c in missing)} column; "
            f"traffic CSV needs {', '.join(_REQUIRED_COLUMNS)} (and may have host, user, "
            "tier, authenticated, colo, status)",
            file=label,
        )
    user_key = user_from[1] if user_from is not None else "user"
    if user_from is not None and header and user_key not in header:
        raise TrafficError(
            f"{label}: --user-from {user_key!r} is not a column of this CSV file (its columns "
            f"are {', '.join(header)}); name one of them",
            file=label,
        )
    width = len(header)

    def parse(line: str) -> Request:
        # Most rows hold no quotes: split them directly, and let csv handle the rest.
        values = line.split(",") if '"' not in line else _csv_values(line)
        if len(values) != width:
            raise _Malformed("columns", f"{len(values)} values for {width} columns")
        return _named(dict(zip(header, values, strict=True)), user_key, options)

    return parse


# --- tiers files ---------------------------------------------------------------------------


def load_tiers(path: str | Path) -> dict[str, str]:
    """A tiers file: a YAML or JSON mapping user -> tier, or CSV rows ``user,tier`` (with
    or without a ``user,tier`` header). Errors name the file and line."""
    label = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TrafficError(
            f"cannot read tiers file {label}: {reason}; check the path", file=label
        ) from exc
    suffix = Path(path).suffix.lower()
    if suffix == ".csv" or (suffix not in (".yaml", ".yml", ".json") and _looks_csv(text)):
        return _tiers_csv(label, text)
    return _tiers_yaml(label, text)


def _looks_csv(text: str) -> bool:
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return "," in line and ":" not in line and not line.lstrip().startswith("{")
    return False


def _tiers_csv(label: str, text: str) -> dict[str, str]:
    tiers: dict[str, str] = {}
    rows = csv.reader(io.StringIO(text))
    for row in rows:
        lineno = rows.line_num
        cells = [cell.strip() for cell in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        if not tiers and [c.lower() for c in cells] == ["user", "tier"]:
            continue
        if len(cells) != 2 or not cells[0] or not cells[1]:
            raise TrafficError(
                f"{label}:{lineno}: a tiers CSV row is 'user,tier', with both set; this row "
                f"has {len(cells)} values",
                file=label,
                line=lineno,
            )
        _add_tier(tiers, cells[0], cells[1], label, lineno)
    return tiers


def _tiers_yaml(label: str, text: str) -> dict[str, str]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        where = f"{label}:{line}" if line else label
        problem = getattr(exc, "problem", None) or "not valid YAML or JSON"
        raise TrafficError(
            f"{where}: the tiers file is not valid YAML or JSON ({problem}); write a mapping "
            "of user to tier, e.g. 'alice: pro'",
            file=label,
            line=line,
        ) from exc
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise TrafficError(
            f"{label}:{root.start_mark.line + 1}: the tiers file must be a mapping of user to "
            "tier (e.g. 'alice: pro'), or CSV rows 'user,tier'",
            file=label,
            line=root.start_mark.line + 1,
        )
    tiers: dict[str, str] = {}
    for key, value in root.value:
        lineno = key.start_mark.line + 1
        if not isinstance(key, yaml.ScalarNode) or not isinstance(value, yaml.ScalarNode):
            raise TrafficError(
                f"{label}:{lineno}: each entry maps one user to one tier name; this one is a "
                "list or mapping",
                file=label,
                line=lineno,
            )
        if not key.value or not value.value:
            raise TrafficError(
                f"{label}:{lineno}: an entry has an empty user or tier; write 'user: tier'",
                file=label,
                line=lineno,
            )
        _add_tier(tiers, str(key.value), str(value.value), label, lineno)
    return tiers


def _add_tier(tiers: dict[str, str], user: str, tier: str, label: str, lineno: int) -> None:
    if user in tiers and tiers[user] != tier:
        raise TrafficError(
            f"{label}:{lineno}: user {user!r} is listed again, with tier {tier!r} after "
            f"{tiers[user]!r}; keep one entry per user",
            file=label,
            line=lineno,
        )
    tiers[user] = tier


def _iso(at_us: int) -> str:
    return (_EPOCH + timedelta(microseconds=at_us)).isoformat().replace("+00:00", "Z")
