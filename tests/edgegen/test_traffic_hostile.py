"""The traffic readers under hostile input: whatever a file holds, reading it costs CPU time
and memory within a budget stated per byte of input (docs/replay.md, "Hostile input"),
and every value that is not a time, a number or printable text is a malformed line,
counted and reported like the others, never a traceback.

Each reader is fuzzed here with hypothesis (tests/fuzz/fuzz_traffic_inputs.py is the
atheris target for longer runs, with the same budget); the files that once broke a reader
are tests of their own.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edgegen import cli
from edgegen.replay._engine import TIMELINE_BUCKETS, Replay
from edgegen.replay._report import timeline, to_json, to_text
from edgegen.replay._types import Record
from edgegen.traffic import _read
from edgegen.traffic._fields import MAX_TIME_US
from edgegen.traffic._options import TrafficError, TrafficOptions
from edgegen.traffic._read import MAX_LINE_CHARS, TrafficStats, read_traffic

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "examples" / "policy.yaml"
POLICY = policy.load(POLICY_FILE)
T0 = 1_796_284_800  # 2026-12-03T08:00:00Z

# The budget of one read (as in tests/fuzz/fuzz_traffic_inputs.py and docs/replay.md): CPU
# seconds, a fixed part and parts per line and per byte of (uncompressed) input; traced
# bytes, a fixed part and a part per byte.
TIME_BASE_S = 0.25
TIME_PER_LINE_S = 50e-6
TIME_PER_BYTE_S = 1e-6
MEMORY_BASE = 4 << 20
MEMORY_PER_BYTE = 64

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def read_within_budget(
    path: Path, options: TrafficOptions | None = None, *, data: bytes | None = None
) -> tuple[list[Record], TrafficStats]:
    """Read every record of ``path`` twice: timed, failing as soon as the CPU time passes
    the budget for its content (``data``, when the file is compressed; a quadratic reader
    fails in seconds, not minutes), then traced, failing when the peak passes the budget."""
    options = options or TrafficOptions()
    data = path.read_bytes() if data is None else data
    size = len(data)
    budget = TIME_BASE_S + TIME_PER_LINE_S * (data.count(b"\n") + 1) + TIME_PER_BYTE_S * size
    records: list[Record] = []
    started = time.process_time()
    with read_traffic([path], options) as traffic:
        for record in traffic:
            records.append(record)
            spent = time.process_time() - started
            assert spent <= budget, f"{spent:.2f} s of CPU for {size:,} bytes"
    spent = time.process_time() - started
    assert spent <= budget, f"{spent:.2f} s of CPU for {size:,} bytes"
    assert peak_memory(path, options) <= MEMORY_BASE + MEMORY_PER_BYTE * size
    return records, traffic.stats


def peak_memory(path: Path, options: TrafficOptions) -> int:
    """The traced peak of reading every record of ``path`` (and dropping it)."""
    tracemalloc.start()
    try:
        with read_traffic([path], options) as traffic:
            for _ in traffic:
                pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def printable(records: list[Record], stats: TrafficStats) -> None:
    """Every record is in the time range and prints, and so does a replay's report."""
    engine = Replay(POLICY)
    for record in records:
        assert 0 <= record.at_us <= MAX_TIME_US
        engine.feed(record)
    lines = stats.describe()
    result = engine.result()
    json.dumps(to_json(result), ensure_ascii=False).encode("utf-8")
    to_text(result, lines).encode("utf-8")


def write(path: Path, text: str) -> Path:
    """``text`` as UTF-8; a lone surrogate a strategy made is written as its bytes."""
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


class Stream(io.RawIOBase):
    """Standard input that gives ``chunk`` again and again, ``limit`` bytes at most, and
    says how many were read: a reader that reads more than it needs is seen doing it."""

    def __init__(self, chunk: bytes, limit: int, *, then_fail: bool = False) -> None:
        self.chunk = chunk
        self.limit = limit
        self.given = 0
        self.then_fail = then_fail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.given >= self.limit:
            assert not self.then_fail, f"the reader went on past {self.limit:,} bytes"
            return 0
        size = min(len(buffer), self.limit - self.given)
        offset = self.given % len(self.chunk)
        data = (self.chunk[offset:] + self.chunk * (size // len(self.chunk) + 1))[:size]
        buffer[:size] = data
        self.given += size
        return size


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Install a :class:`Stream` as standard input: call with its arguments."""

    def install(chunk: bytes, limit: int, *, then_fail: bool = False) -> Stream:
        stream = Stream(chunk, limit, then_fail=then_fail)
        holder = io.TextIOWrapper(io.BufferedReader(stream))
        monkeypatch.setattr(sys, "stdin", holder)
        return stream

    yield install


# --- files that once broke a reader ----------------------------------------------------------


def test_a_small_gzip_of_blank_lines_costs_constant_memory(tmp_path: Path) -> None:
    """A million blank lines compress to about a kilobyte; telling the format passes over
    them without keeping them (it held every one: 582 MB for a 5 KB file)."""
    path = tmp_path / "blank.log.gz"
    data = b"\n" * 1_000_000 + b"\n \n" * 1000
    path.write_bytes(gzip.compress(data))
    assert path.stat().st_size < 5_000
    records, stats = read_within_budget(path, data=data)
    assert records == []
    assert stats.files[0].format == "empty"
    assert peak_memory(path, TrafficOptions()) < MEMORY_BASE


def test_blank_lines_before_the_first_record_do_not_hide_it(tmp_path: Path) -> None:
    """The format is still told past many blank lines, and line numbers still count them."""
    path = tmp_path / "late.ndjson"
    line = f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "192.0.2.1"}}\n'
    path.write_text("\n" * 100_000 + line + "{\n")
    records, stats = read_within_budget(path)
    assert len(records) == 1
    assert stats.files[0].format == "ndjson"
    assert stats.files[0].examples[0].startswith(f"{path}:100002: not JSON")


def test_one_timestamp_for_every_record_is_given_out_before_the_end(
    stdin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records that all share one time never leave the reorder window; the buffer gives
    out its oldest once it holds REORDER_MAX_RECORDS (it held them all: 494 MB for a
    million records), in file order."""
    monkeypatch.setattr(_read, "REORDER_MAX_RECORDS", 1000)
    line = f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "192.0.2.1"}}\n'.encode()
    stream = stdin(line, 20_000 * len(line))
    with read_traffic(["-"], TrafficOptions()) as traffic:
        records = iter(traffic)
        first = next(records)
        # The buffer's records and what the readers buffer (blocks of a few KiB), no more.
        assert stream.given <= 1001 * len(line) + 64 * 1024
        assert first.at_us == T0 * 1_000_000
        assert sum(1 for _ in records) == 20_000 - 1
    assert traffic.stats.malformed == 0


def test_one_timestamp_for_every_record_holds_bounded_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, measured: memory follows the buffer's bound, not the file."""
    monkeypatch.setattr(_read, "REORDER_MAX_RECORDS", 1000)
    path = tmp_path / "same.ndjson"
    line = f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "192.0.2.1"}}\n'
    path.write_text(line * 50_000)
    assert peak_memory(path, TrafficOptions()) < 2 << 20


def test_newest_first_is_read_in_n_log_n(tmp_path: Path) -> None:
    """A file in reverse time order, within the window: every record is put back in order,
    at a cost per record that does not grow with the buffer (40,000 records took 180 s)."""
    count = 20_000
    path = tmp_path / "reversed.ndjson"
    path.write_text(
        "".join(
            f'{{"timestamp": {T0 + 2 - i / 10_000:.4f}, "method": "GET", "path": "/{i}", '
            '"ip": "192.0.2.1"}\n'
            for i in range(count)
        )
    )
    records, stats = read_within_budget(path)
    assert stats.malformed == 0
    assert [r.path for r in records] == [f"/{i}" for i in reversed(range(count))]


def test_a_full_reorder_buffer_counts_what_it_cannot_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past REORDER_MAX_RECORDS, a record older than one given out early is "out of
    order"; what is given out is in order and every line is accounted for."""
    monkeypatch.setattr(_read, "REORDER_MAX_RECORDS", 100)
    path = tmp_path / "reversed.ndjson"
    path.write_text(
        "".join(
            f'{{"timestamp": {T0 + 1 - i / 1000:.3f}, "method": "GET", "path": "/", '
            '"ip": "192.0.2.1"}\n'
            for i in range(500)
        )
    )
    records, stats = read_within_budget(path)
    times = [r.at_us for r in records]
    assert times == sorted(times)
    assert len(records) == 101
    assert stats.files[0].malformed == {"out of order": 399}
    assert "before a record already replayed" in stats.files[0].examples[0]


def test_a_long_appended_field_is_read_in_linear_time(tmp_path: Path) -> None:
    """A combined line with a long run of name characters after it (an appended field
    without "="): the field pattern tried again from every character took 0.29 s for
    8,000 of them, and minutes for a few hundred thousand."""
    base = '203.0.113.9 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 12 "-" "curl"'
    path = tmp_path / "long.log"
    path.write_text(f"{base} x{'a' * 30_000}\n{base} host=a.example {'b' * 30_000} tier=pro\n")
    records, stats = read_within_budget(path)
    assert stats.malformed == 0
    assert [(r.host, r.tier) for r in records] == [("", None), ("a.example", "pro")]


@pytest.mark.parametrize(
    ("fields", "host", "tier"),
    [
        ('host=a.example tier="pro"', "a.example", "pro"),
        ('user="x"host=a.example', "a.example", None),
        ("9host=a.example -tier=pro", "", None),
        ("x-host=a.example host=b.example", "b.example", None),
        ('tier="a \\"quoted\\" b" host=', "", 'a "quoted" b'),
        ('tier="unterminated host=a.example', "a.example", '"unterminated'),
    ],
)
def test_appended_fields_begin_a_run_of_name_characters(
    fields: str, host: str, tier: str | None, tmp_path: Path
) -> None:
    """An appended field's name starts after a space or a quote; values may be quoted."""
    base = '203.0.113.9 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 12 "-" "curl"'
    records, _ = read_within_budget(write(tmp_path / "f.log", f"{base} {fields}\n"))
    assert [(r.host, r.tier) for r in records] == [(host, tier)]


def test_a_file_without_line_ends_is_refused_at_once(stdin: Any) -> None:
    """/dev/zero, or a binary file: no line end within MAX_LINE_CHARS is a malformed first
    line, refused when the file is opened, after reading no more than that (the reader
    went on reading to the end of the line, which /dev/zero never reaches)."""
    stream = stdin(b"\0" * 4096, 16 * MAX_LINE_CHARS, then_fail=True)
    with pytest.raises(TrafficError, match="longer than"):
        read_traffic(["-"], TrafficOptions())
    assert stream.given <= MAX_LINE_CHARS + 64 * 1024


@pytest.mark.timeout(60)
def test_dev_zero_fails_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`edgegen replay --traffic /dev/zero` ends, with one clear line and exit 1."""
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    code = cli.main(["replay", str(POLICY_FILE), "--traffic", "/dev/zero"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert "longer than" in err


def test_the_timeline_is_bounded_whatever_the_span() -> None:
    """Two records a thousand years apart: at most 48 report buckets (there were 376,000;
    for the years 1 and 9999, 2.9 GB), each a whole number of days."""
    engine = Replay(POLICY)
    for at in (0, (1000 * 365 * 86400) * 1_000_000):
        engine.feed(Record(at, "GET", "api.example.com", "/", "192.0.2.1"))
    width, points = timeline(engine.result())
    assert len(points) <= 48
    assert sum(sum(counts) for _, counts in points) == 2
    assert width % 1440 == 0
    assert len(json.dumps(to_json(engine.result()))) < 100_000


def test_the_last_moment_of_9999_prints() -> None:
    """A record at MAX_TIME_US reports as 9999-12-31 (seconds as a float rounded it into
    the year 10000, a ValueError)."""
    engine = Replay(POLICY)
    engine.feed(Record(MAX_TIME_US, "GET", "api.example.com", "/", "192.0.2.1"))
    assert to_json(engine.result())["span"]["last"] == "9999-12-31 23:59:59Z"
    assert "9999-12-31 23:59" in to_text(engine.result())


def test_the_timeline_keeps_a_bounded_number_of_buckets() -> None:
    """A record in each of many minutes: the timeline widens its buckets past
    TIMELINE_BUCKETS, keeps every count, and the report still fits 48 lines."""
    engine = Replay(POLICY, None)
    count = 3 * TIMELINE_BUCKETS
    for minute in range(count):
        engine.feed(Record((T0 + 60 * minute) * 1_000_000, "GET", "x.example", "/", "192.0.2.1"))
    line = engine.result().timeline
    assert len(line.minutes) <= TIMELINE_BUCKETS
    assert sum(sum(counts) for counts in line.minutes.values()) == count
    width, points = timeline(engine.result())
    assert len(points) <= 48
    assert width % line.width == 0
    assert sum(sum(counts) for _, counts in points) == count


# --- values that overflowed or could not print -------------------------------------------

_GOOD = f'{{"timestamp": {T0}, "method": "GET", "path": "/api/x", "ip": "192.0.2.1"}}'
HOSTILE_VALUES = [
    ("ndjson", '{"timestamp": Infinity, "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    ("ndjson", '{"timestamp": -Infinity, "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    ("ndjson", '{"timestamp": NaN, "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    ("ndjson", '{"timestamp": 1e400, "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    ("ndjson", '{"timestamp": 1e23, "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    (
        "ndjson",
        '{"timestamp": 100000000000000000000000, "method": "GET", "path": "/", "ip": "a"}',
        "timestamp",
    ),
    ("ndjson", '{"timestamp": "10^23", "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    (
        "ndjson",
        '{"timestamp": "0001-01-01T00:00:00+01:00", "method": "GET", "path": "/", "ip": "a"}',
        "timestamp",
    ),
    (
        "ndjson",
        '{"timestamp": "0001-01-01T00:00:00Z", "method": "GET", "path": "/", "ip": "a"}',
        "timestamp",
    ),
    (
        "ndjson",
        '{"timestamp": "9999-12-31T23:59:59-01:00", "method": "GET", "path": "/", "ip": "a"}',
        "timestamp",
    ),
    (
        "ndjson",
        '{"timestamp": "' + "9" * 5000 + '", "method": "GET", "path": "/", "ip": "a"}',
        "timestamp",
    ),
    ("ndjson", '{"timestamp": "²", "method": "GET", "path": "/", "ip": "a"}', "timestamp"),
    (
        "ndjson",
        f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "a", "status": "²"}}',
        "status",
    ),
    (
        "ndjson",
        f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "a", "user": "\\ud800"}}',
        "encoding",
    ),
    (
        "ndjson",
        f'{{"timestamp": {T0}, "method": "GET", "path": "/", "ip": "a", '
        '"user": ' + "[" * 500 + "]" * 500 + "}",
        "field type",
    ),
    ("ndjson", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "not JSON"),
    (
        "logpush",
        '{"EdgeStartTimestamp": 100000000000000000000000, "ClientIP": "a", '
        '"ClientRequestMethod": "GET", "ClientRequestURI": "/"}',
        "timestamp",
    ),
    (
        "logpush",
        '{"EdgeStartTimestamp": Infinity, "ClientIP": "a", '
        '"ClientRequestMethod": "GET", "ClientRequestURI": "/"}',
        "timestamp",
    ),
    (
        "logpush",
        f'{{"EdgeStartTimestamp": {T0}, "ClientIP": "a", "ClientRequestMethod": "GET", '
        '"ClientRequestURI": "/", "RequestHeaders": {"x-user": "\\udc00"}}',
        "encoding",
    ),
    ("events", '{"v": 1, "ts": 1e400, "limit": "api", "identity": "u"}', "timestamp"),
    ("events", f'{{"v": 1, "ts": {T0}, "limit": "api", "identity": "\\ud83d"}}', "encoding"),
    (
        "events",
        f'{{"v": 1, "ts": {T0}, "limit": "api", "identity": "u", "cost": 1e30}}',
        "cost",
    ),
    (
        "events",
        f'{{"v": 1, "ts": {T0}, "limit": "api", "identity": "u", "cost": {10**30}}}',
        "cost",
    ),
    (
        "combined",
        '192.0.2.1 - - [01/Jan/0001:00:00:00 +0100] "GET / HTTP/1.1" 200 1',
        "timestamp",
    ),
    (
        "combined",
        '192.0.2.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "-" '
        "msec=" + "9" * 5000,
        "timestamp",
    ),
    (
        "combined",
        '192.0.2.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 1 "-" "-" msec=1e23',
        "timestamp",
    ),
    (
        "combined",
        '192.0.2.1 - - [01/Dec/2026:10:00:00 +0000] "GET / HTTP/1.1" ²²² 1',
        "status",
    ),
    ("csv", f"{T0}.5,GET,/,a,{'9' * 5000}", "status"),
    ("csv", f'{T0},GET,/,a,"{"x" * 200_000}"', "columns"),
]


def _file(fmt: str, bad: str) -> str:
    if fmt == "csv":
        return f"timestamp,method,path,ip,status\n{T0},GET,/api/x,192.0.2.1,200\n{bad}\n"
    if fmt == "combined":
        return (
            '192.0.2.1 - - [03/Dec/2026:08:00:00 +0000] "GET /api/x HTTP/1.1" 200 1 host=x\n'
            + bad
            + "\n"
        )
    if fmt == "events":
        return f'{{"v": 1, "ts": {T0}, "limit": "api", "identity": "u"}}\n{bad}\n'
    if fmt == "logpush":
        return (
            f'{{"EdgeStartTimestamp": {T0}, "ClientIP": "192.0.2.1", '
            '"ClientRequestMethod": "GET", "ClientRequestURI": "/api/x"}\n' + bad + "\n"
        )
    return f"{_GOOD}\n{bad}\n"


@pytest.mark.parametrize(
    ("fmt", "bad", "reason"), HOSTILE_VALUES, ids=[str(i) for i in range(len(HOSTILE_VALUES))]
)
def test_a_value_out_of_range_is_a_malformed_line(
    fmt: str, bad: str, reason: str, tmp_path: Path
) -> None:
    """Infinity, 1e400, 10^23, the year 1, a lone surrogate, digits int() refuses, nesting
    deeper than repr() goes: one malformed line, counted by its reason (they raised
    OverflowError, ValueError, RecursionError or UnicodeEncodeError, one of them after the
    whole replay)."""
    path = write(tmp_path / "f.txt", _file(fmt, bad))
    records, stats = read_within_budget(path, TrafficOptions(format=fmt))
    assert len(records) == 1
    assert stats.files[0].malformed == {reason: 1}
    printable(records, stats)


@pytest.mark.parametrize("output", ["text", "json", "markdown"])
@pytest.mark.parametrize(
    ("fmt", "bad", "reason"),
    HOSTILE_VALUES[::4],
    ids=[str(i) for i in range(0, len(HOSTILE_VALUES), 4)],
)
def test_the_cli_reports_a_hostile_value_as_malformed(
    output: str,
    fmt: str,
    bad: str,
    reason: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`edgegen replay` prints its report (exit 0) and counts the line as malformed."""
    path = write(tmp_path / "f.txt", _file(fmt, bad))
    argv = ["replay", str(POLICY_FILE), "--traffic", str(path), "--format", output]
    code = cli.main([*argv, "--traffic-format", fmt, "--show-identities"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    if output == "json":
        assert json.loads(out)["traffic"]["malformed"] == 1
    else:
        assert f"1 {reason}" in out


# --- every reader, fuzzed -----------------------------------------------------------------

# Values a log line may hold: ordinary, out of range, not what the field is, not printable.
_SCALAR_TEXTS = [
    "1796284800",
    "1796284800.5",
    '"1796284800"',
    '"2026-12-03T08:00:00Z"',
    '"2026-12-03T08:00:00.123456+05:30"',
    "Infinity",
    "-Infinity",
    "NaN",
    "1e400",
    "-1",
    "1e23",
    "100000000000000000000000",
    "1796284800000000000",
    '"0001-01-01T00:00:00+01:00"',
    '"9999-12-31T23:59:59-01:00"',
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"\\ud83d\\ude00"',
    '"²"',
    '"-"',
    '""',
    "true",
    "null",
    "[]",
    "{}",
    "[" * 200 + "]" * 200,
    '"' + "9" * 30 + '"',
    '"GET"',
    '"/api/x?token=secret"',
    '"192.0.2.1"',
    '"2001:db8::1"',
    '"api.example.com:443"',
]
# A well-formed line of each JSON format, as its fields' JSON texts: the fuzzing replaces,
# drops and adds fields, so that most lines get as far as the value at fault.
_FIELDS = {
    "logpush": {
        "EdgeStartTimestamp": "1796284800000000000",
        "ClientIP": '"192.0.2.1"',
        "ClientRequestMethod": '"GET"',
        "ClientRequestHost": '"api.example.com"',
        "ClientRequestURI": '"/api/x?token=secret"',
        "EdgeColoCode": '"AMS"',
        "EdgeResponseStatus": "200",
        "RequestHeaders": '{"x-user": "u1", "authorization": "Bearer x"}',
        "Cookies": '{"session": "s"}',
    },
    "events": {
        "v": "1",
        "ts": "1796284800.5",
        "limit": '"api"',
        "identity": '"u1"',
        "tier": '"free"',
        "operation": '"hit"',
        "cost": "1",
    },
    "ndjson": {
        "timestamp": '"2026-12-03T08:00:00Z"',
        "method": '"GET"',
        "host": '"api.example.com"',
        "path": '"/api/x"',
        "ip": '"192.0.2.1"',
        "user": '"u1"',
        "tier": '"pro"',
        "authenticated": '"yes"',
        "colo": '"AMS"',
        "status": "200",
    },
}
_OBJECTS = ['{"x-user": "\\ud800"}', '{"x-user": 5, "authorization": null}', '{"\\udc00": "x"}']
_VALUE = st.sampled_from(_SCALAR_TEXTS + _OBJECTS) | st.text(max_size=20).map(json.dumps)
# The field each format takes its time from: the one most often at fault.
_TIME_FIELD = {"logpush": "EdgeStartTimestamp", "events": "ts", "ndjson": "timestamp"}


@st.composite
def json_lines(draw: st.DrawFn, fmt: str) -> str:
    """A line of a JSON format: a well-formed one with some fields replaced by any value,
    some dropped, some repeated, or cut short."""
    fields = dict(_FIELDS[fmt])
    names = st.sampled_from(sorted(fields)) | st.just(_TIME_FIELD[fmt])
    for name in draw(st.lists(names, max_size=3)):
        fields[name] = draw(_VALUE)
    for name in draw(st.lists(names, max_size=1)):
        fields.pop(name, None)
    parts = [f'"{name}": {value}' for name, value in fields.items()]
    parts += [f'"{name}": {draw(_VALUE)}' for name in draw(st.lists(names, max_size=1))]
    line = "{" + ", ".join(parts) + "}"
    if draw(st.integers(0, 9)) == 0:
        line = line[: draw(st.integers(0, len(line)))]
    return line


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=30)
_CLF_TIMES = st.sampled_from(
    [
        "03/Dec/2026:08:00:00 +0000",
        "03/Dec/2026:08:00:00 -0700",
        "01/Jan/0001:00:00:00 +0100",
        "31/Dec/9999:23:59:59 -0100",
        "99/Zzz/2026:99:99:99 +9999",
        "",
    ]
) | _TEXT.filter(lambda t: "]" not in t)


@st.composite
def combined_lines(draw: st.DrawFn) -> str:
    """A combined line: its parts ordinary or any text, quotes and escapes, appended
    fields with long values and runs of name characters."""
    ip = draw(st.sampled_from(["192.0.2.1", "2001:db8::1", "-"]) | _TEXT.filter(str.strip))
    request = draw(
        st.sampled_from(["GET /api/x HTTP/1.1", "POST http://a.example/b?c HTTP/1.0", "GET /"])
        | _TEXT
    ).replace('"', '\\"')
    status = draw(st.sampled_from(["200", "-", "²²²", "9" * 30]) | _TEXT.filter(str.strip))
    line = f'{ip.split()[0]} - - [{draw(_CLF_TIMES)}] "{request}" {status.split()[0]} 1'
    if draw(st.booleans()):
        line += ' "-" "curl \\"x\\" \\x22"'
    fields = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["host", "tier", "msec", "authenticated", "user", "x", "9x"]),
                st.sampled_from(["1796284800.5", "api.example.com", "true", "²", "1e23", ""])
                | _TEXT,
                st.booleans(),
            ),
            max_size=4,
        )
    )
    for name, value, quoted in fields:
        line += f' {name}="{value}"' if quoted else f" {name}={value.replace(' ', '')}"
    if draw(st.booleans()):
        line += " " + "a" * draw(st.integers(0, 3000))
    return line


_CELLS = {
    "timestamp": "1796284800",
    "method": "GET",
    "host": "api.example.com",
    "path": "/api/x",
    "ip": "192.0.2.1",
    "user": "u1",
    "tier": "pro",
    "authenticated": "yes",
    "colo": "AMS",
    "status": "200",
}


@st.composite
def csv_files(draw: st.DrawFn) -> str:
    """A named-column CSV file: a header with the columns (one may be missing), rows of
    well-formed cells with some replaced by any text."""
    header = sorted(_CELLS)
    for name in draw(st.lists(st.sampled_from(header), max_size=1)):
        header.remove(name)
    cell = st.sampled_from(["2026-12-03T08:00:00Z", "1e400", "²", '"', "-", "0001-01-01T00:00Z"])
    cell = cell | _TEXT.map(lambda t: t.replace("\x00", ""))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        row = [_CELLS[name] for name in header]
        for index in draw(st.lists(st.integers(0, len(row)), max_size=3)):
            if index < len(row):
                row[index] = draw(cell)
            else:
                row.append(draw(cell))
        rows.append(row)
    return "\n".join([",".join(header), *(",".join(row) for row in rows)]) + "\n"


def lines_file(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _read_fuzzed(tmp_path: Path, text: str, options: TrafficOptions, *, packed: bool) -> None:
    data = text.encode("utf-8", "surrogatepass")
    path = tmp_path / ("fuzz.gz" if packed else "fuzz.txt")
    path.write_bytes(gzip.compress(data, mtime=0) if packed else data)
    try:
        records, stats = read_within_budget(path, options, data=data)
    except TrafficError:
        return
    printable(records, stats)


@FUZZ
@given(
    lines=st.lists(combined_lines(), min_size=1, max_size=8),
    detect=st.booleans(),
    packed=st.booleans(),
)
@example(
    lines=[f'192.0.2.1 - - [03/Dec/2026:08:00:00 +0000] "GET / HTTP/1.1" 200 1 x{"a" * 9000}'],
    detect=False,
    packed=False,
)
def test_fuzz_combined(lines: list[str], detect: bool, packed: bool, tmp_path: Path) -> None:
    """Any combined log: records or one TrafficError, within the budget, printable."""
    options = TrafficOptions(format=None if detect else "combined", user_from="user")
    _read_fuzzed(tmp_path, lines_file(lines), options, packed=packed)


@pytest.mark.parametrize("fmt", ["logpush", "events", "ndjson"])
@FUZZ
@given(data=st.data(), detect=st.booleans(), packed=st.booleans())
def test_fuzz_json_formats(
    fmt: str, data: st.DataObject, detect: bool, packed: bool, tmp_path: Path
) -> None:
    """Any Logpush, decision-event or named NDJSON file: records or one TrafficError,
    within the budget, printable."""
    lines = data.draw(st.lists(json_lines(fmt), min_size=1, max_size=8), label="lines")
    user_from = {"logpush": "header:x-user", "events": None, "ndjson": "user"}[fmt]
    options = TrafficOptions(format=None if detect else fmt, user_from=user_from)
    _read_fuzzed(tmp_path, lines_file(lines), options, packed=packed)


@FUZZ
@given(text=csv_files(), detect=st.booleans())
def test_fuzz_csv(text: str, detect: bool, tmp_path: Path) -> None:
    """Any named-column CSV: records or one TrafficError, within the budget, printable."""
    options = TrafficOptions(format=None if detect else "csv")
    _read_fuzzed(tmp_path, text, options, packed=False)


@FUZZ
@given(data=st.binary(max_size=2000), fmt=st.sampled_from([None, *_read.FORMATS]))
@example(data=b"\x1f\x8b" + b"\0" * 50, fmt=None)
@example(data=b"\n" * 1500 + b"{", fmt=None)
def test_fuzz_bytes(data: bytes, fmt: str | None, tmp_path: Path) -> None:
    """Any bytes, read as any format or detected: records or one TrafficError."""
    path = tmp_path / "bytes"
    path.write_bytes(data)
    try:
        records, stats = read_within_budget(path, TrafficOptions(format=fmt))
    except TrafficError:
        return
    printable(records, stats)
