"""Recorded-traffic readers (edgegen.traffic) and the generator's writers (bench/traffic.py).

Fixture files are in tests/edgegen/traffic/. Every time there is 2026-12-03T08:00:00Z
(1796284800) plus a few seconds, written in each format's own way.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import traffic as gen
from edgegen.errors import EdgegenError
from edgegen.replay._types import Record
from edgegen.traffic._options import TrafficError, TrafficOptions
from edgegen.traffic._read import FileStats, TrafficStats, read_traffic
from edgegen.traffic._tiers import load_tiers

HERE = Path(__file__).resolve().parent / "traffic"
T0 = 1_796_284_800 * 1_000_000  # 2026-12-03T08:00:00Z in µs
SEC = 1_000_000
POLICY_AUTH = TrafficOptions(
    authenticated_headers=("Authorization",), authenticated_cookies=("session",)
)


def read(
    paths: Sequence[str | Path], options: TrafficOptions | None = None
) -> tuple[list[Record], TrafficStats]:
    traffic = read_traffic(paths, options or TrafficOptions())
    with traffic:
        return list(traffic), traffic.stats


def only(stats: TrafficStats) -> FileStats:
    (file_stats,) = stats.files
    return file_stats


# --- each format -------------------------------------------------------------------------


def test_combined_fields_timezones_and_escapes() -> None:
    """A combined log: the offset of each time honoured, the request line split (query
    dropped, method upper-cased, absolute targets give the host), appended host/tier/msec/
    authenticated fields understood, nginx's \\xHH escapes undone."""
    records, stats = read([HERE / "combined.log"])
    assert only(stats).format == "combined"
    assert only(stats).records == 4
    assert [r.at_us for r in records] == [T0, T0 + SEC + 250_000, T0 + 2 * SEC, T0 + 3 * SEC]
    first, second, third, fourth = records
    assert first == Record(T0, "GET", "", "/api/v1/items", "192.0.2.10", user="alice", status=200)
    # %u is "-": the appended user= is only read when --user-from names it.
    assert second.user is None
    assert (second.host, second.tier, second.status) == ("www.example.com", "pro", 401)
    assert (third.method, third.host, third.path, third.ip) == (
        "GET",
        "api.example.com",
        "/api/search",
        "2001:db8::1",
    )
    assert fourth.path == '/api/café/"q"'
    assert fourth.status is None
    assert fourth.authenticated is True


def test_combined_user_from_an_appended_field() -> None:
    """--user-from NAME reads an appended field (quoted, with escapes), not %u."""
    records, _ = read([HERE / "combined.log"], TrafficOptions(user_from="user"))
    assert [r.user for r in records] == [None, "bob", None, 'carol "c"']


def test_logpush_fields_and_timestamp_formats() -> None:
    """Logpush: unixnano, unix and RFC 3339 (with an offset and a fraction) times; the path
    from ClientRequestPath or the URI without its query; OriginResponseStatus, else the
    edge's; host lower case without a port; colo."""
    records, stats = read([HERE / "logpush.ndjson"])
    assert only(stats).format == "logpush"
    assert [r.at_us for r in records] == [T0 + 123_456, T0 + SEC, T0 + 2 * SEC, T0 + 3_500_000]
    first, second, third, _ = records
    assert (first.method, first.host, first.path, first.ip, first.colo, first.status) == (
        "GET",
        "api.example.com",
        "/api/v1/items",
        "192.0.2.30",
        "FRA",
        200,
    )
    assert (second.method, second.host, second.path, second.status) == (
        "POST",
        "api.example.com",
        "/api/search",
        201,
    )
    assert (third.colo, third.status, third.user, third.authenticated) == (None, None, None, None)


@pytest.mark.parametrize(
    "stamp",
    [1796284800, 1796284800_000_000_000, "1796284800", "2026-12-03T08:00:00Z",
     "2026-12-03T08:00:00.000000000Z", "2026-12-03T09:00:00+01:00"],
)  # fmt: skip
def test_logpush_timestamp_formats_agree(tmp_path: Path, stamp: object) -> None:
    """Every timestamp_format Logpush writes (unix, unixnano, rfc3339 and its fractional
    forms) gives the same instant."""
    import json

    line = {"ClientIP": "192.0.2.1", "ClientRequestMethod": "GET", "ClientRequestURI": "/",
            "EdgeStartTimestamp": stamp}  # fmt: skip
    path = tmp_path / "one.ndjson"
    path.write_text(json.dumps(line) + "\n")
    records, _ = read([path])
    assert [r.at_us for r in records] == [T0]


@pytest.mark.parametrize(
    ("user_from", "users"),
    [
        ("header:x-user", ["alice", "bob", None, "dave"]),
        ("header:X-User", ["alice", "bob", None, "dave"]),
        ("cookie:uid", [None, "bob-cookie", None, None]),
        ("AppUser", [None, "bob-field", None, None]),
        (None, [None, None, None, None]),
    ],
)
def test_logpush_user_from(user_from: str | None, users: list[str | None]) -> None:
    """--user-from header:NAME (any case), cookie:NAME, or a top-level field."""
    records, _ = read([HERE / "logpush.ndjson"], TrafficOptions(user_from=user_from))
    assert [r.user for r in records] == users


def test_logpush_authenticated_evidence() -> None:
    """A logged authenticated_when header or cookie makes a request authenticated; logged
    headers without one make it unauthenticated; a line that logs neither is unknown."""
    records, _ = read([HERE / "logpush.ndjson"], POLICY_AUTH)
    assert [r.authenticated for r in records] == [True, True, None, False]
    only_headers = dataclasses.replace(POLICY_AUTH, authenticated_cookies=())
    records, _ = read([HERE / "logpush.ndjson"], only_headers)
    assert [r.authenticated for r in records] == [True, False, None, False]


def test_authenticated_option_wins_over_evidence() -> None:
    """--authenticated true/false overrides whatever the log shows."""
    for forced in (True, False):
        options = dataclasses.replace(POLICY_AUTH, authenticated=forced)
        for name in ("logpush.ndjson", "combined.log", "named.ndjson", "named.csv"):
            records, _ = read([HERE / name], options)
            assert {r.authenticated for r in records} == {forced}, name


def test_decision_events() -> None:
    """Decision events: hits only (a peek is skipped, not malformed), bound to their limit,
    with the hashed identity as user, the tier and the cost; no request fields."""
    records, stats = read([HERE / "events.ndjson"])
    assert only(stats).format == "events"
    assert only(stats).skipped == 1
    assert records == [
        Record(T0 + 123_456, "", "", "", "", user="9f2c1a", tier="free", limit="api"),
        Record(T0 + SEC, "", "", "", "", user="77ab00", tier="pro", limit="search", cost=3),
    ]


def test_named_ndjson() -> None:
    """Named columns as NDJSON: RFC 3339 or unix seconds (number or text); optional
    columns; authenticated as true/false/yes/no."""
    records, stats = read([HERE / "named.ndjson"])
    assert only(stats).format == "ndjson"
    assert records == [
        Record(
            T0 + 1,
            "GET",
            "api.example.com",
            "/api/v1/items",
            "192.0.2.40",
            user="alice",
            tier="pro",
            authenticated=True,
            colo="FRA",
            status=200,
        ),
        Record(
            T0 + 1_500_000, "POST", "www.example.com", "/login", "192.0.2.41", authenticated=False
        ),
        Record(T0 + 2_250_000, "GET", "", "/", "192.0.2.42", user="erin"),
    ]


def test_named_csv() -> None:
    """Named columns as CSV with a header; quoted cells; empty cells are unknown."""
    records, stats = read([HERE / "named.csv"])
    assert only(stats).format == "csv"
    assert records == [
        Record(
            T0 + 1,
            "GET",
            "api.example.com",
            "/api/v1/items",
            "192.0.2.50",
            user="alice",
            tier="pro",
            authenticated=True,
            colo="FRA",
            status=200,
        ),
        Record(
            T0 + SEC,
            "POST",
            "www.example.com",
            "/login",
            "192.0.2.51",
            authenticated=False,
            status=401,
        ),
        Record(
            T0 + 2 * SEC,
            "GET",
            "api.example.com",
            "/api/a,b",
            "192.0.2.52",
            user='o"brien',
            tier="free",
            colo="AMS",
        ),
    ]


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("API.Example.COM:8443", "api.example.com"),
        ("[2001:DB8::1]:443", "[2001:db8::1]"),
        ("[2001:db8::1]", "[2001:db8::1]"),
        ("2001:db8::1", "2001:db8::1"),
        ("", ""),
    ],
)
def test_host_lower_case_without_port(host: str, expected: str, tmp_path: Path) -> None:
    """Hosts are lower-cased and lose their port; an IPv6 literal keeps its brackets and
    a bare IPv6 address is not cut at a colon."""
    path = tmp_path / "h.csv"
    path.write_text(f"timestamp,method,host,path,ip\n1796284800,GET,{host},/,192.0.2.1\n")
    records, _ = read([path])
    assert [r.host for r in records] == [expected]


def test_csv_header_without_required_columns(tmp_path: Path) -> None:
    """A CSV whose header lacks a required column is refused when opened, naming it."""
    path = tmp_path / "t.csv"
    path.write_text("timestamp,method,path\n1796284800,GET,/\n")
    with pytest.raises(TrafficError, match="'ip' column"):
        read_traffic([path], TrafficOptions())


# --- tiers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiers.yaml", "tiers.json", "tiers.csv"])
def test_tiers_file_forms(name: str) -> None:
    """YAML, JSON and CSV tiers files give the same mapping (numeric users as text)."""
    assert load_tiers(HERE / name) == {"alice": "pro", "bob": "enterprise", "12345": "free"}


def test_tiers_apply_after_the_logged_tier_and_before_the_default() -> None:
    """The logged tier wins; then the tiers file's entry for the user; then the default."""
    options = TrafficOptions(tiers={"alice": "enterprise", "erin": "pro"}, default_tier="free")
    records, _ = read([HERE / "named.ndjson"], options)
    assert [r.tier for r in records] == ["pro", "free", "pro"]


@pytest.mark.parametrize(
    ("name", "text", "where", "says"),
    [
        ("t.yaml", "alice: pro\nbob: [free]\n", ":2:", "list or mapping"),
        ("t.yaml", "- alice\n- bob\n", ":1:", "must be a mapping"),
        ("t.yaml", "alice: pro\nalice: free\n", ":2:", "listed again"),
        ("t.yaml", "alice: pro\n  bob: : :\n", ":2:", "not valid YAML"),
        ("t.yaml", "alice:\n", ":1:", "empty user or tier"),
        ("t.csv", "user,tier\nalice,pro\nbob,free,extra\n", ":3:", "has 3 values"),
        ("t.csv", "alice,pro\n,free\n", ":2:", "both set"),
    ],
)
def test_tiers_file_errors_are_located(
    name: str, text: str, where: str, says: str, tmp_path: Path
) -> None:
    """Each mistake in a tiers file is a TrafficError naming the file and line."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TrafficError, match=says) as caught:
        load_tiers(path)
    assert f"{path}{where}" in str(caught.value)


def test_tiers_file_missing(tmp_path: Path) -> None:
    """A tiers file that is not there says so, with the path."""
    with pytest.raises(TrafficError, match=r"cannot read tiers file .*nope\.yaml"):
        load_tiers(tmp_path / "nope.yaml")


# --- detection, gzip, stdin ----------------------------------------------------------------

FIXTURES = ["combined.log", "logpush.ndjson", "events.ndjson", "named.ndjson", "named.csv"]
DETECTED = {"combined.log": "combined", "logpush.ndjson": "logpush",
            "events.ndjson": "events", "named.ndjson": "ndjson", "named.csv": "csv"}  # fmt: skip


@pytest.mark.parametrize("name", FIXTURES)
def test_gzip_is_told_by_its_magic_bytes(name: str, tmp_path: Path) -> None:
    """Each format gzip-compressed (under a name that does not say so) reads the same."""
    plain, _ = read([HERE / name])
    packed_path = tmp_path / "traffic.log"
    packed_path.write_bytes(gzip.compress((HERE / name).read_bytes()))
    packed, stats = read([packed_path])
    assert packed == plain
    assert (only(stats).format, only(stats).gzip) == (DETECTED[name], True)


@pytest.mark.parametrize("compress", [False, True])
def test_stdin(monkeypatch: pytest.MonkeyPatch, compress: bool) -> None:
    """`-` reads stdin, plain or gzip."""
    data = (HERE / "named.csv").read_bytes()
    stdin = io.TextIOWrapper(io.BytesIO(gzip.compress(data) if compress else data))
    monkeypatch.setattr(sys, "stdin", stdin)
    records, stats = read(["-"])
    assert len(records) == 3
    assert only(stats).file == "<stdin>"
    assert only(stats).format == "csv"
    assert not stdin.buffer.closed, "stdin is left open"


def test_stdin_only_once() -> None:
    """Naming stdin twice is refused before anything is read."""
    with pytest.raises(TrafficError, match="only once"):
        read_traffic(["-", "-"], TrafficOptions())


def test_format_told_past_a_damaged_first_line(tmp_path: Path) -> None:
    """A damaged first line (a log rotated mid-write) does not hide the format: the next
    lines tell it, and the damaged one is malformed."""
    path = tmp_path / "rotated.log"
    path.write_text('ET /half-a-line HTTP/1.1" 200 5\n' + (HERE / "combined.log").read_text())
    records, stats = read([path])
    assert only(stats).format == "combined"
    assert len(records) == 4
    assert only(stats).malformed == {"not a log line": 1}


def test_undetectable_format_names_the_fix(tmp_path: Path) -> None:
    """A first line of no known format is a TrafficError with file:line and --format."""
    path = tmp_path / "mystery.txt"
    path.write_text("\n\nhello world\n")
    with pytest.raises(TrafficError, match="--traffic-format") as caught:
        read_traffic([path], TrafficOptions())
    assert caught.value.file == str(path)
    assert caught.value.line == 3
    assert f"{path}:3:" in str(caught.value)
    assert "hello" not in str(caught.value)


def test_format_option_overrides_detection(tmp_path: Path) -> None:
    """--format reads a file as named even when detection would say otherwise (Logpush
    lines that also carry the named columns, read as named NDJSON)."""
    path = tmp_path / "both.ndjson"
    path.write_text(
        '{"ClientIP": "192.0.2.1", "timestamp": 1796284800, "method": "GET", "path": "/n",'
        ' "ip": "192.0.2.9", "EdgeStartTimestamp": 1796284801, "ClientRequestMethod": "GET",'
        ' "ClientRequestURI": "/l"}\n'
    )
    detected, _ = read([path])
    named, stats = read([path], TrafficOptions(format="ndjson"))
    assert [r.path for r in detected] == ["/l"]
    assert [(r.path, r.ip, r.at_us) for r in named] == [("/n", "192.0.2.9", T0)]
    assert only(stats).format == "ndjson"


def test_unknown_format_option() -> None:
    """An unknown --format lists the known ones."""
    with pytest.raises(TrafficError, match="combined, logpush, events, ndjson, csv"):
        read_traffic([HERE / "named.csv"], TrafficOptions(format="apache"))


def test_empty_file(tmp_path: Path) -> None:
    """An empty file has no records and no malformed lines; it is not an error."""
    path = tmp_path / "empty.log"
    path.write_text("\n\n")
    records, stats = read([path])
    assert records == []
    assert (only(stats).format, only(stats).records, only(stats).malformed_total) == ("empty", 0, 0)


def test_missing_file_is_an_edgegen_error(tmp_path: Path) -> None:
    """A file that cannot be opened is a TrafficError (an EdgegenError), with the path."""
    with pytest.raises(EdgegenError, match=r"cannot read traffic file .*absent\.log"):
        read_traffic([HERE / "named.csv", tmp_path / "absent.log"], TrafficOptions())


def test_truncated_gzip_is_located(tmp_path: Path) -> None:
    """A gzip file cut short fails while reading, naming the file and the line it reached."""
    rows = "".join(f"{1796284800 + i},GET,/{i},192.0.2.1\n" for i in range(20_000))
    data = gzip.compress(("timestamp,method,path,ip\n" + rows).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[: len(data) // 2])
    traffic = read_traffic([path], TrafficOptions())
    with pytest.raises(TrafficError, match="cut off") as caught:
        list(traffic)
    assert caught.value.file == str(path)
    assert caught.value.line is not None and 1000 < caught.value.line < 20_000
    assert f"{path}:{caught.value.line}:" in str(caught.value)


@pytest.mark.parametrize(
    ("user_from", "name"), [("header:x-user", "combined.log"), ("cookie:uid", "named.csv")]
)
def test_header_user_from_needs_logpush(user_from: str, name: str) -> None:
    """header:/cookie: sources are refused for formats that log no headers, with the fix."""
    with pytest.raises(TrafficError, match="only Logpush logs carry"):
        read_traffic([HERE / name], TrafficOptions(user_from=user_from))


def test_csv_user_from_names_a_column() -> None:
    """--user-from naming a column the CSV lacks is refused, listing the columns."""
    with pytest.raises(TrafficError, match="not a column"):
        read_traffic([HERE / "named.csv"], TrafficOptions(user_from="account"))
    records, _ = read([HERE / "named.csv"], TrafficOptions(user_from="colo"))
    assert [r.user for r in records] == ["FRA", None, "AMS"]


# --- malformed lines -----------------------------------------------------------------------


def test_malformed_lines_are_counted_and_located() -> None:
    """Malformed lines are skipped and counted by reason, with file:line examples."""
    records, stats = read([HERE / "combined_malformed.log"])
    assert [r.path for r in records] == ["/", "/ok"]
    file_stats = only(stats)
    assert file_stats.malformed == {"request line": 3, "timestamp": 1, "not a log line": 1}
    label = str(HERE / "combined_malformed.log")
    assert [e.split(": ", 1)[0] for e in file_stats.examples] == [
        f"{label}:{n}" for n in (2, 3, 4, 5, 6)
    ]
    assert stats.malformed == 5
    assert f"{label} (combined): 2 records" in stats.describe()[0]
    assert stats.describe()[0].endswith(", 5 malformed")


def test_malformed_lines_never_echo_secrets(tmp_path: Path) -> None:
    """Examples and strict errors quote no credential: not from a combined line's request
    (cut before the query), nor from a Logpush line's headers."""
    logpush = tmp_path / "secret.ndjson"
    logpush.write_text(
        '{"ClientIP":"192.0.2.1","ClientRequestMethod":"GET","ClientRequestURI":"/",'
        '"EdgeStartTimestamp":"2026-12-03T08:00:00Z"}\n'
        '{"ClientIP":"192.0.2.1","ClientRequestMethod":"GET","ClientRequestURI":"/",'
        '"EdgeStartTimestamp":"soon","RequestHeaders":{"authorization":"Bearer s3cr3t"}}\n'
        '{"ClientIP":"192.0.2.1","RequestHeaders":{"authorization":"Bearer s3cr3t"\n'
        '{"ClientIP":"192.0.2.1","ClientRequestMethod":"GET","ClientRequestURI":"/",'
        '"EdgeStartTimestamp":"Bearer s3cr3t"}\n'
    )
    _, stats = read([HERE / "combined_malformed.log", logpush])
    text = "\n".join(stats.describe())
    assert stats.malformed == 8
    for secret in ("s3cr3t", "hunter2"):
        assert secret not in text
    # Under --strict the error quotes the first malformed line's value: one with a secret.
    combined = tmp_path / "secret.log"
    combined.write_text("".join(
        line for line in (HERE / "combined_malformed.log").read_text().splitlines(keepends=True)
        if "s3cr3t" in line or "GET / " in line
    ))  # fmt: skip
    for path in (combined, logpush):
        with pytest.raises(TrafficError) as caught:
            list(read_traffic([path], TrafficOptions(strict=True)))
        assert caught.value.line == 2
        for secret in ("s3cr3t", "hunter2"):
            assert secret not in str(caught.value)


def test_strict_stops_at_the_first_malformed_line() -> None:
    """--strict: the first malformed line is a TrafficError with its file and line."""
    traffic = read_traffic([HERE / "combined_malformed.log"], TrafficOptions(strict=True))
    seen = []
    with pytest.raises(TrafficError, match="--strict") as caught:
        seen.extend(traffic)
    assert caught.value.file == str(HERE / "combined_malformed.log")
    assert caught.value.line == 2
    assert f"{HERE / 'combined_malformed.log'}:2: malformed line (request line" in str(caught.value)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"v": 2, "ts": 1, "limit": "a", "identity": "x"}', "event version"),
        ('{"v": 1, "ts": 1, "limit": "a", "identity": "x", "cost": 0}', "cost"),
        ('{"v": 1, "ts": "later", "limit": "a", "identity": "x"}', "timestamp"),
        ('{"v": 1, "ts": 1, "identity": "x"}', "missing field"),
        ("[1, 2]", "not JSON"),
        ('{"v": 1, "ts": 1, "limit": "a", "identity": "x"} trailing', "not JSON"),
    ],
)
def test_malformed_decision_events(line: str, reason: str, tmp_path: Path) -> None:
    """Each kind of bad decision event is counted under its reason."""
    path = tmp_path / "events.ndjson"
    path.write_text((HERE / "events.ndjson").read_text() + line + "\n")
    records, stats = read([path], TrafficOptions(format="events"))
    assert len(records) == 2
    assert only(stats).malformed == {reason: 1}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ('{"timestamp": "2026-12-03 08:00:00", "method": "GET", "path": "/", "ip": "a"}',
         "timestamp"),
        ('{"timestamp": 1796284800, "method": "GET", "path": "/"}', "missing field"),
        ('{"timestamp": 1796284800, "method": 7, "path": "/", "ip": "a"}', "field type"),
        ('{"timestamp": 1796284800, "method": "GET", "path": "/", "ip": "a", '
         '"authenticated": "maybe"}', "authenticated"),
        ('{"timestamp": 1796284800, "method": "GET", "path": "/", "ip": "a", "status": "ok"}',
         "status"),
    ],
)  # fmt: skip
def test_malformed_named_rows(row: str, reason: str, tmp_path: Path) -> None:
    """A local time without an offset, a missing or mistyped column, an unreadable flag or
    status: each a malformed row under its reason."""
    path = tmp_path / "rows.ndjson"
    path.write_text(row + "\n")
    _, stats = read([path], TrafficOptions(format="ndjson"))
    assert only(stats).malformed == {reason: 1}


def test_csv_row_with_wrong_width(tmp_path: Path) -> None:
    """A CSV row with more or fewer cells than the header is malformed."""
    path = tmp_path / "t.csv"
    path.write_text("timestamp,method,path,ip\n1796284800,GET,/,a\n1796284801,GET,/\n")
    records, stats = read([path])
    assert len(records) == 1
    assert only(stats).malformed == {"columns": 1}


# --- time order ----------------------------------------------------------------------------


def ndjson_at(path: Path, seconds: Iterable[float], ip: str = "192.0.2.1") -> Path:
    path.write_text(
        "".join(
            f'{{"timestamp": {1796284800 + s}, "method": "GET", "path": "/{s}", "ip": "{ip}"}}\n'
            for s in seconds
        )
    )
    return path


def test_two_files_merged_by_time(tmp_path: Path) -> None:
    """Two files (of different formats) are merged by time; ties keep the files' order."""
    a = ndjson_at(tmp_path / "a.ndjson", [0, 2, 4], ip="a")
    b = tmp_path / "b.csv"
    b.write_text("timestamp,method,path,ip\n1796284801,GET,/1,b\n1796284802,GET,/2,b\n"
                 "1796284805,GET,/5,b\n")  # fmt: skip
    records, stats = read([a, b])
    assert [(r.at_us - T0) // SEC for r in records] == [0, 1, 2, 2, 4, 5]
    assert [r.ip for r in records] == ["a", "b", "a", "b", "a", "b"]
    assert [f.records for f in stats.files] == [3, 3]
    assert (stats.first_us, stats.last_us) == (T0, T0 + 5 * SEC)


def test_out_of_order_within_the_window_is_reordered(tmp_path: Path) -> None:
    """Records up to the window (5 s) late are put in order; later ones are malformed
    "out of order"; equal times keep the file's order."""
    path = ndjson_at(tmp_path / "o.ndjson", [10, 8, 12, 12.5, 2, 7.5, 13, 12.5])
    records, stats = read([path])
    assert [(r.at_us - T0) / SEC for r in records] == [7.5, 8, 10, 12, 12.5, 12.5, 13]
    assert [r.path for r in records][4:6] == ["/12.5", "/12.5"]
    assert only(stats).malformed == {"out of order": 1}
    assert only(stats).examples[0].startswith(f"{path}:5: out of order: 10.500 s before")


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(times=st.lists(st.integers(0, 40), max_size=40), window=st.integers(0, 6))
def test_reorder_property(times: list[int], window: int, tmp_path: Path) -> None:
    """For any order of times, the reader gives, sorted (stable), exactly the records no
    more than the window older than the newest before them, and counts the others."""
    path = ndjson_at(tmp_path / "p.ndjson", times)
    records, stats = read([path], TrafficOptions(reorder_window_us=window * SEC))
    kept, newest = [], -1
    for i, t in enumerate(times):
        if t >= newest - window:
            kept.append((t, i))
        newest = max(newest, t)
    assert [((r.at_us - T0) // SEC) for r in records] == [t for t, _ in sorted(kept)]
    assert only(stats).malformed_total == len(times) - len(kept)


def test_out_of_order_under_strict(tmp_path: Path) -> None:
    """Under --strict, a record later than the window stops the read at its line."""
    path = ndjson_at(tmp_path / "o.ndjson", [10, 8, 2])
    with pytest.raises(TrafficError) as caught:
        list(read_traffic([path], TrafficOptions(strict=True)))
    assert caught.value.line == 3


def test_reorder_window_zero(tmp_path: Path) -> None:
    """With no window, any step back in time is out of order."""
    path = ndjson_at(tmp_path / "o.ndjson", [1, 0.5, 2])
    records, stats = read([path], TrafficOptions(reorder_window_us=0))
    assert [(r.at_us - T0) / SEC for r in records] == [1, 2]
    assert only(stats).malformed == {"out of order": 1}


def test_stream_is_lazy_and_single_use(tmp_path: Path) -> None:
    """Records are read as they are iterated (stats grow with them), once."""
    path = ndjson_at(tmp_path / "many.ndjson", range(0, 100, 10))
    traffic = read_traffic([path], TrafficOptions())
    it = iter(traffic)
    next(it)
    assert only(traffic.stats).records == 1
    with pytest.raises(RuntimeError, match="only once"):
        iter(traffic)
    traffic.close()


# --- round trips through bench/traffic.py's writers ----------------------------------------


def projected(record: Record, fmt: str) -> Record:
    """What a format carries of a record (and what reading it back must give)."""
    r = record._replace(limit=None, cost=1)
    if fmt == "combined":
        return r._replace(at_us=r.at_us // 1000 * 1000, authenticated=None, colo=None)
    if fmt == "logpush":
        auth = r.authenticated
        if auth is None and r.user is not None:
            auth = False  # the x-user header is logged, without a credential
        return r._replace(tier=None, authenticated=auth)
    if fmt == "events":
        return Record(record.at_us, "", "", "", "", user=record.user or record.ip,
                       tier=record.tier or "free", limit=record.limit or "api",
                       cost=record.cost)  # fmt: skip
    return r


READ_OPTIONS = {
    "ndjson": TrafficOptions(),
    "csv": TrafficOptions(),
    "combined": TrafficOptions(user_from="user"),
    "logpush": TrafficOptions(user_from="header:x-user", authenticated_headers=("authorization",)),
    "events": TrafficOptions(),
}


def round_trip(records: list[Record], fmt: str, path: Path) -> list[Record]:
    out = io.StringIO()
    writer: Callable[[Iterable[Record], Any], int] = gen.WRITERS[fmt]
    assert writer(records, out) == len(records)
    path.write_text(out.getvalue(), encoding="utf-8")
    back, stats = read([path], READ_OPTIONS[fmt])
    assert only(stats).malformed == {}, only(stats).examples
    if records:
        assert only(stats).format == fmt
    return back


_text = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=12
).filter(lambda s: s != "-")
_path_chars = st.characters(
    blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), blacklist_characters="?#"
)
_requests = st.builds(
    Record,
    at_us=st.integers(1_000_000_000_000_000, 4_000_000_000_000_000),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
    host=st.one_of(
        st.just(""),
        st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\.[a-z]{2,5}){0,2}", fullmatch=True),
    ),
    path=st.text(_path_chars, max_size=20).map(lambda p: "/" + p),
    ip=st.ip_addresses().map(str),
    user=st.none() | _text,
    tier=st.none() | st.from_regex(r"[a-z][a-z0-9_]{0,9}", fullmatch=True),
    authenticated=st.none() | st.booleans(),
    colo=st.none() | st.from_regex(r"[A-Z]{3}", fullmatch=True),
    status=st.none() | st.integers(100, 599),
    limit=st.none() | st.sampled_from(["api", "search", "login"]),
    cost=st.integers(1, 5),
)


@pytest.mark.parametrize("fmt", sorted(gen.WRITERS))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=st.lists(_requests, max_size=25))
def test_writers_round_trip(fmt: str, records: list[Record], tmp_path: Path) -> None:
    """Any records written by a bench/traffic.py writer read back as the same records, in
    every field the format carries (escapes, quotes, unicode, IPv6, missing values)."""
    records = sorted(records, key=lambda r: r.at_us)
    back = round_trip(records, fmt, tmp_path / f"rt.{fmt}")
    assert back == [projected(r, fmt) for r in records]


@pytest.mark.parametrize("fmt", sorted(gen.WRITERS))
@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32))
def test_generated_traffic_round_trips(fmt: str, seed: int, tmp_path: Path) -> None:
    """A generated stretch of traffic (abusive clients included) reads back the same."""
    records = list(gen.generate(seed, seconds=6, rate_per_s=40, users=50))
    back = round_trip(records, fmt, tmp_path / f"gen.{fmt}")
    assert back == [projected(r, fmt) for r in records]


# --- the generator -------------------------------------------------------------------------


def test_generator_is_deterministic_and_ordered() -> None:
    """The same seed gives the same records, in time order, within the span."""
    one = list(gen.generate(7, seconds=30, rate_per_s=20, users=30))
    assert one == list(gen.generate(7, seconds=30, rate_per_s=20, users=30))
    assert one != list(gen.generate(8, seconds=30, rate_per_s=20, users=30))
    times = [r.at_us for r in one]
    assert times == sorted(times)
    start = gen.DEFAULT_START * SEC
    assert start <= times[0] and times[-1] < start + 30 * SEC


def test_generator_shape() -> None:
    """A generated hour has the policy's paths and tiers, IPv4 and IPv6, several colos,
    anonymous and signed-in traffic, a scraper past the edge's 600/1m and credential
    stuffing past 20/1m, and a free user past api's 100/1m."""
    records = list(gen.generate(3, seconds=3600, rate_per_s=30, users=200))
    assert {r.tier for r in records if r.user} == {"free", "pro", "enterprise"}
    assert any(":" in r.ip for r in records) and any("." in r.ip for r in records)
    assert len({r.colo for r in records}) >= 5
    assert {r.authenticated for r in records} == {True, False}
    per_minute: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r.ip if r.user is None else r.user, r.at_us // (60 * SEC))
        if r.path.startswith("/api/") or r.path == "/login":
            per_minute[key] = per_minute.get(key, 0) + 1
    scraper = max(n for (who, _), n in per_minute.items() if who == "203.0.113.66")
    stuffing = max(n for (who, _), n in per_minute.items() if who == "198.51.100.200")
    busiest_free = max(n for (who, _), n in per_minute.items() if who == "user-00000")
    assert scraper > 600
    assert stuffing > 20
    assert busiest_free > 100
    assert any(r.host == "hooks.example.com" and r.path.startswith("/webhooks/") for r in records)


def test_generator_tiers_file_matches_the_traffic(tmp_path: Path) -> None:
    """--tiers-out writes the tier of every generated user, so a Logpush replay (which logs
    no tier) gets the same tiers as the records carry."""
    out, tiers = tmp_path / "t.logpush", tmp_path / "tiers.csv"
    assert gen.main(["--seconds", "30", "--rate", "20", "--users", "40", "--format", "logpush",
                     "--out", str(out), "--tiers-out", str(tiers)]) == 0  # fmt: skip
    options = dataclasses.replace(READ_OPTIONS["logpush"], tiers=load_tiers(tiers))
    records, _ = read([out], options)
    expected = gen.generate(1, seconds=30, rate_per_s=20, users=40)
    assert [r.tier for r in records] == [r.tier for r in expected]


def test_generator_cli_writes_gzip(tmp_path: Path) -> None:
    """python -m bench.traffic writes a gzip file the reader detects."""
    out = tmp_path / "day.logpush.gz"
    assert gen.main(["--seconds", "20", "--rate", "10", "--users", "20", "--format",
                     "logpush", "--out", str(out)]) == 0  # fmt: skip
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    records, stats = read([out], READ_OPTIONS["logpush"])
    assert only(stats).format == "logpush"
    assert records == [
        projected(r, "logpush") for r in gen.generate(1, seconds=20, rate_per_s=10, users=20)
    ]


# --- bounded memory ------------------------------------------------------------------------


def test_overlong_line_is_skipped_unread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A line longer than MAX_LINE_CHARS is malformed "line too long", read in pieces and
    never held whole; the lines after it are read as usual."""
    from edgegen.traffic import _read

    monkeypatch.setattr(_read, "MAX_LINE_CHARS", 100)
    path = ndjson_at(tmp_path / "long.ndjson", [0, 1, 2])
    lines = path.read_text().splitlines(keepends=True)
    lines.insert(2, '{"timestamp": 1796284801, "junk": "' + "x" * 1000 + '"}\n')
    path.write_text("".join(lines))
    records, stats = read([path])
    assert len(records) == 3
    assert only(stats).malformed == {"line too long": 1}
    assert only(stats).examples[0].startswith(f"{path}:3: line too long")


def test_overlong_first_line_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A first line longer than MAX_LINE_CHARS (a binary file, one-line JSON) is refused
    when the file is opened, with its file and line."""
    from edgegen.traffic import _read

    monkeypatch.setattr(_read, "MAX_LINE_CHARS", 100)
    path = tmp_path / "blob.json"
    path.write_text("[" + "1," * 500 + "1]")
    with pytest.raises(TrafficError, match="longer than 100 characters") as caught:
        read_traffic([path], TrafficOptions())
    assert (caught.value.file, caught.value.line) == (str(path), 1)
