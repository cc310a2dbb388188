"""Deterministic, realistic recorded traffic for the replay demo and benchmark.

:func:`generate` yields :class:`~edgegen.replay._types.Record` values in time order for
the example policy's API (``examples/policy.yaml``): a diurnal rate (peak mid-afternoon UTC,
trough at night), users spread Zipf-like over the tiers (the busiest user is on the free
tier and outruns ``api``'s 100/1m), anonymous visitors on IPv4 and IPv6, partner webhooks
on their own host, several Cloudflare data centres, and two abusive clients a replay must
refuse: a scraper hammering ``/api/`` anonymously (past the edge's 600/1m) and credential
stuffing on ``/login`` from a handful of addresses (past 20/1m at the edge, 5/1m in the
app). The same seed gives the same records.

The writers put records in each format ``edgegen.traffic`` reads (``write_ndjson``,
``write_csv``, ``write_combined``, ``write_logpush``, ``write_events``); :func:`write`
picks one by name and gzips when asked or when the name ends in ``.gz``::

    python -m bench.traffic --seconds 86400 --rate 100 --out day.ndjson.gz --format logpush

A combined log carries the user and tier as appended fields (``user="..." tier=...``), so
read it with ``--user-from user``; a Logpush log carries the user in the ``x-user``
request header (``--user-from header:x-user``) and no tier (``--tiers`` or a default).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

from edgegen.replay._types import Record

# 2026-12-01T00:00:00Z: a fixed day, so generated files are the same everywhere.
DEFAULT_START: Final = 1_796_083_200
FORMATS: Final = ("ndjson", "csv", "combined", "logpush", "events")

_COLOS: Final = ("FRA", "AMS", "LHR", "CDG", "IAD", "ORD", "SJC", "GRU", "SIN", "NRT")
_API: Final = "api.example.com"
_WWW: Final = "www.example.com"
_HOOKS: Final = "hooks.example.com"

# What a signed-in user's client asks for (method, path template, weight). ``{n}`` is an id.
_USER_REQUESTS: Final = (
    ("GET", "/api/v1/items", 30),
    ("GET", "/api/v1/items/{n}", 20),
    ("POST", "/api/v1/items", 4),
    ("GET", "/api/events", 18),
    ("GET", "/api/search", 10),
    ("POST", "/api/search", 2),
    ("GET", "/api/v1/exports/{n}", 1),
    ("GET", "/api/v1/account", 5),
    ("POST", "/api/v1/sessions", 1),
)
# What anonymous visitors ask for.
_ANON_REQUESTS: Final = (
    ("GET", "/", 30),
    ("GET", "/pricing", 10),
    ("GET", "/docs/quickstart", 10),
    ("GET", "/static/app.js", 20),
    ("GET", "/api/v1/items", 8),
    ("GET", "/login", 6),
    ("POST", "/login", 3),
)
_AGENTS: Final = (
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_7) AppleWebKit/605.1.15 Safari/605.1.15",
    "python-requests/2.32.3",
    "curl/8.5.0",
)


@dataclass(frozen=True, slots=True)
class _Client:
    user: str | None
    tier: str | None
    ip: str
    colo: str


def _ipv4(rng: random.Random) -> str:
    # Documentation and benchmarking ranges only (RFC 5737, RFC 2544), never a real host.
    base = rng.choice(((192, 0, 2), (198, 51, 100), (203, 0, 113), (198, 18), (198, 19)))
    rest = [rng.randrange(256) for _ in range(4 - len(base))]
    return ".".join(str(part) for part in (*base, *rest))


def _ipv6(rng: random.Random) -> str:
    # 2001:db8::/32, the documentation prefix (RFC 3849).
    groups = [rng.randrange(1 << 16) for _ in range(6)]
    return "2001:db8:" + ":".join(f"{g:x}" for g in groups)


def _cumulative(weights: Iterable[float]) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return out


def _picker(rng: random.Random, cumulative: list[float]) -> Callable[[], int]:
    total = cumulative[-1]
    rand, find = rng.random, bisect.bisect_right

    def pick() -> int:
        return min(find(cumulative, rand() * total), len(cumulative) - 1)

    return pick


def _users(rng: random.Random, count: int) -> list[_Client]:
    clients = []
    for rank in range(count):
        # The busiest user is on the free tier (an integration stuck in a loop), the next
        # on pro; the rest mostly free, as a SaaS's users are.
        roll = rng.random()
        tier = "free" if roll < 0.75 else "pro" if roll < 0.95 else "enterprise"
        if rank < 2:
            tier = ("free", "pro")[rank]
        ip = _ipv6(rng) if rng.random() < 0.3 else _ipv4(rng)
        clients.append(_Client(f"user-{rank:05d}", tier, ip, rng.choice(_COLOS)))
    return clients


def user_tiers(seed: int = 1, users: int = 2_000) -> dict[str, str]:
    """The tier of each user :func:`generate` makes with the same ``seed`` and ``users``:
    what ``--tiers`` needs for a log that carries no tier (Logpush)."""
    return {c.user: c.tier for c in _users(random.Random(seed), users) if c.user and c.tier}


def write_tiers(tiers: dict[str, str], path: str | Path) -> None:
    """A tiers file: CSV ``user,tier`` with a header."""
    with Path(path).open("w", encoding="utf-8", newline="\n") as out:
        out.write("user,tier\n")
        out.writelines(f"{user},{tier}\n" for user, tier in tiers.items())


def generate(
    seed: int = 1,
    start: int = DEFAULT_START,
    seconds: int = 86_400,
    rate_per_s: float = 100.0,
    users: int = 2_000,
    *,
    anonymous_share: float = 0.25,
    webhook_share: float = 0.03,
    abuse: bool = True,
) -> Iterator[Record]:
    """``seconds`` of traffic from ``start`` (unix seconds), ``rate_per_s`` on average.

    The rate follows the day (half again at 15:00 UTC, half as much at 03:00). Of ordinary
    requests, ``anonymous_share`` are anonymous visitors, ``webhook_share`` partner
    webhooks, the rest signed-in users picked Zipf-like (exponent 1.1) from ``users``.
    With ``abuse``, a scraper runs from 10% to 12% of the span (15 requests/s on /api/),
    and credential stuffing from 50% to 54% (four addresses, 1 POST /login a second each).
    """
    if seconds < 0 or rate_per_s < 0 or users < 1:
        raise ValueError("seconds and rate_per_s must not be negative, users at least 1")
    rng = random.Random(seed)
    clients = _users(rng, users)
    pick_user = _picker(rng, _cumulative(1 / (rank + 1) ** 1.1 for rank in range(users)))
    visitors = [
        _Client(None, None, _ipv6(rng) if rng.random() < 0.35 else _ipv4(rng), rng.choice(_COLOS))
        for _ in range(max(50, users * 2))
    ]
    pick_visitor = _picker(rng, _cumulative(1 / (i + 1) ** 0.6 for i in range(len(visitors))))
    partners = [_Client(None, None, _ipv4(rng), rng.choice(_COLOS)) for _ in range(3)]
    user_kinds = _picker(rng, _cumulative(w for _, _, w in _USER_REQUESTS))
    anon_kinds = _picker(rng, _cumulative(w for _, _, w in _ANON_REQUESTS))
    scraper = _Client(None, None, "203.0.113.66", "FRA")
    stuffers = [_Client(None, None, f"198.51.100.{200 + i}", "AMS") for i in range(4)]
    scrape = (int(seconds * 0.10), int(seconds * 0.12))
    stuff = (int(seconds * 0.50), int(seconds * 0.54))
    rand, randrange = rng.random, rng.randrange

    for second in range(seconds):
        now = start + second
        hour = (now % 86_400) / 3_600
        rate = rate_per_s * (1 + 0.5 * math.sin(2 * math.pi * (hour - 9) / 24))
        count = int(rate) + (1 if rand() < rate - int(rate) else 0)
        # (µs within the second, kind): 0 ordinary, 1 scraper, 2 stuffing.
        slots = [(randrange(1_000_000), 0) for _ in range(count)]
        if abuse and scrape[0] <= second < scrape[1]:
            slots.extend((randrange(1_000_000), 1) for _ in range(15))
        if abuse and stuff[0] <= second < stuff[1]:
            slots.extend((randrange(1_000_000), 2 + i) for i in range(len(stuffers)))
        slots.sort()
        base = now * 1_000_000
        for offset, kind in slots:
            at = base + offset
            if kind == 1:
                path = f"/api/v1/items/{randrange(100_000)}"
                yield Record(at, "GET", _API, path, scraper.ip, None, None, False, "FRA", 200)
                continue
            if kind >= 2:
                ip = stuffers[kind - 2].ip
                yield Record(at, "POST", _WWW, "/login", ip, None, None, False, "AMS", 401)
                continue
            roll = rand()
            if roll < webhook_share:
                which = randrange(len(partners))
                partner = partners[which]
                path = f"/webhooks/partner-{which + 1}"
                yield Record(at, "POST", _HOOKS, path, partner.ip, None, None, False,
                              partner.colo, 204)  # fmt: skip
            elif roll < webhook_share + anonymous_share:
                visitor = visitors[pick_visitor()]
                method, template, _ = _ANON_REQUESTS[anon_kinds()]
                host = _API if template.startswith("/api/") else _WWW
                status = 200 if rand() < 0.97 else 404
                yield Record(at, method, host, template, visitor.ip, None, None, False,
                              visitor.colo, status)  # fmt: skip
            else:
                client = clients[pick_user()]
                method, template, _ = _USER_REQUESTS[user_kinds()]
                path = template.replace("{n}", str(randrange(10_000)))
                status = 201 if method == "POST" else 200 if rand() < 0.98 else 404
                yield Record(at, method, _API, path, client.ip, client.user, client.tier,
                              True, client.colo, status)  # fmt: skip


# --- writers -------------------------------------------------------------------------------


_last_second: list[tuple[int, str]] = [(-1, "")]


def _rfc3339(at_us: int) -> str:
    seconds, micros = divmod(at_us, 1_000_000)
    # Records come a few hundred to a second: format each second's date and time once.
    last, text = _last_second[0]
    if seconds != last:
        text = f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%S}"
        _last_second[0] = (seconds, text)
    return f"{text}.{micros:06d}Z"


def _unix(at_us: int) -> str:
    seconds, micros = divmod(at_us, 1_000_000)
    return f"{seconds}.{micros:06d}"


def _named(record: Record) -> dict[str, object]:
    row: dict[str, object] = {
        "timestamp": _rfc3339(record.at_us),
        "method": record.method,
        "host": record.host,
        "path": record.path,
        "ip": record.ip,
    }
    for key in ("user", "tier", "authenticated", "colo", "status"):
        value = getattr(record, key)
        if value is not None:
            row[key] = value
    return row


def write_ndjson(records: Iterable[Record], out: IO[str]) -> int:
    """Named-column NDJSON (RFC 3339 times in µs); None fields are left out. Returns the
    number of records written."""
    count = 0
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for record in records:
        out.write(dumps(_named(record)) + "\n")
        count += 1
    return count


_CSV_COLUMNS: Final = (
    "timestamp", "method", "host", "path", "ip", "user", "tier", "authenticated", "colo", "status"
)  # fmt: skip


def _csv_cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def write_csv(records: Iterable[Record], out: IO[str]) -> int:
    """Named-column CSV with a header row (unix-second times with µs); None is empty."""
    out.write(",".join(_CSV_COLUMNS) + "\n")
    count = 0
    flags = {None: "", True: "true", False: "false"}
    for r in records:
        seconds, micros = divmod(r.at_us, 1_000_000)
        line = (
            f"{seconds}.{micros:06d},{r.method},{r.host},{r.path},{r.ip},{r.user or ''},"
            f"{r.tier or ''},{flags[r.authenticated]},{r.colo or ''},"
            f"{'' if r.status is None else r.status}"
        )
        if line.count(",") != 9 or '"' in line or "\n" in line or "\r" in line:
            # A value that needs quoting: the careful path, cell by cell.
            cells = (_unix(r.at_us), r.method, r.host, r.path, r.ip, r.user, r.tier,
                     r.authenticated, r.colo, r.status)  # fmt: skip
            line = ",".join(_csv_cell(c) for c in cells)
        out.write(line + "\n")
        count += 1
    return count


def _nginx_escape(text: str) -> str:
    """nginx's default log escaping: ``"``, ``\\`` and bytes outside printable ASCII as
    ``\\xHH``."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    out = []
    for byte in text.encode():
        if byte in (0x22, 0x5C) or byte < 0x20 or byte > 0x7E:
            out.append(f"\\x{byte:02X}")
        else:
            out.append(chr(byte))
    return "".join(out)


_MONTH_NAMES: Final = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                       "Nov", "Dec")  # fmt: skip


def write_combined(records: Iterable[Record], out: IO[str]) -> int:
    """nginx combined lines in UTC, with ``host``, ``user``, ``tier`` and ``msec`` appended
    as this ``log_format`` writes them::

        log_format replay '$remote_addr - $remote_user [$time_local] "$request" $status '
                          '$body_bytes_sent "$http_referer" "$http_user_agent" host=$host '
                          'user="$upstream_http_x_user" tier="$upstream_http_x_tier" msec=$msec';

    The time has milliseconds (``msec``); colo and authentication are not carried.
    """
    count = 0
    last_second, stamp = -1, ""
    for r in records:
        second, micros = divmod(r.at_us, 1_000_000)
        if second != last_second:
            t = datetime.fromtimestamp(second, UTC)
            stamp = f"{t.day:02d}/{_MONTH_NAMES[t.month - 1]}/{t.year}:{t:%H:%M:%S} +0000"
            last_second = second
        status = "-" if r.status is None else str(r.status)
        agent = _AGENTS[r.at_us % len(_AGENTS)]
        user = "-" if r.user is None else _nginx_escape(r.user)
        tier = "-" if r.tier is None else _nginx_escape(r.tier)
        out.write(
            f'{r.ip} - - [{stamp}] "{r.method} {_nginx_escape(r.path)} HTTP/1.1" {status} '
            f'{len(r.path) * 7 % 5000} "-" "{agent}" host={r.host or "-"} user="{user}" '
            f'tier="{tier}" msec={second}.{micros // 1000:03d}\n'
        )
        count += 1
    return count


def write_logpush(
    records: Iterable[Record], out: IO[str], *, timestamp_format: str = "unixnano"
) -> int:
    """Cloudflare Logpush ``http_requests`` NDJSON, ``EdgeStartTimestamp`` in
    ``timestamp_format`` (``unixnano``, ``unix`` or ``rfc3339``, whole seconds for the last
    two, as Logpush writes them). A user is the ``x-user`` request header; a request that
    was authenticated carries an ``authorization`` header (a placeholder, not a
    credential); ``RequestHeaders`` is left out when there is nothing to put in it.
    """
    if timestamp_format not in ("unixnano", "unix", "rfc3339"):
        raise ValueError(f"unknown Logpush timestamp_format {timestamp_format!r}")
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    count = 0
    for r in records:
        if timestamp_format == "unixnano":
            stamp: object = r.at_us * 1_000
        elif timestamp_format == "unix":
            stamp = r.at_us // 1_000_000
        else:
            stamp = _rfc3339(r.at_us // 1_000_000 * 1_000_000).replace(".000000Z", "Z")
        row: dict[str, object] = {
            "ClientIP": r.ip,
            "ClientRequestHost": r.host,
            "ClientRequestMethod": r.method,
            "ClientRequestURI": r.path,
            "EdgeStartTimestamp": stamp,
            "RayID": f"{r.at_us:016x}"[-16:],
        }
        if r.colo is not None:
            row["EdgeColoCode"] = r.colo
        if r.status is not None:
            row["EdgeResponseStatus"] = r.status
        headers: dict[str, str] = {}
        if r.user is not None:
            headers["x-user"] = r.user
        if r.authenticated:
            headers["authorization"] = "Bearer placeholder"
        if headers or r.authenticated is not None:
            row["RequestHeaders"] = headers
        out.write(dumps(row) + "\n")
        count += 1
    return count


def write_events(records: Iterable[Record], out: IO[str]) -> int:
    """applimit decision events: one ``hit`` per record, of ``record.limit`` (``api`` when
    unset), by ``record.user`` (else its IP), in ``record.tier`` (``free`` when unset)."""
    count = 0
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    for r in records:
        head = f'{{"v":1,"ts":{_unix(r.at_us)},'
        body = {
            "limit": r.limit or "api",
            "tier": r.tier or "free",
            "identity": r.user if r.user is not None else r.ip,
            "cost": r.cost,
            "outcome": "allowed",
            "operation": "hit",
        }
        out.write(head + dumps(body)[1:] + "\n")
        count += 1
    return count


WRITERS: Final[dict[str, Callable[[Iterable[Record], IO[str]], int]]] = {
    "ndjson": write_ndjson,
    "csv": write_csv,
    "combined": write_combined,
    "logpush": write_logpush,
    "events": write_events,
}


def write(
    records: Iterable[Record], path: str | Path, fmt: str, *, compress: bool | None = None
) -> int:
    """Write ``records`` to ``path`` (``-``: stdout) in ``fmt``; gzip when ``compress`` or,
    when it is None, when the name ends in ``.gz``. Returns the number written."""
    writer = WRITERS[fmt]
    if str(path) == "-":
        return writer(records, sys.stdout)
    if compress is None:
        compress = str(path).endswith(".gz")
    # Level 6: nearly level 9's size at a fraction of its time, so a day writes quickly.
    if compress:
        with gzip.open(path, "wt", compresslevel=6, encoding="utf-8", newline="\n") as packed:
            return writer(records, packed)
    with Path(path).open("w", encoding="utf-8", newline="\n") as text:
        return writer(records, text)


def _start(text: str) -> int:
    if text.isdigit():
        return int(text)
    return int(datetime.fromisoformat(text).timestamp())


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.traffic``: write generated traffic to a file."""
    parser = argparse.ArgumentParser(prog="python -m bench.traffic", description=__doc__)
    parser.add_argument("--seconds", type=int, default=86_400)
    parser.add_argument("--rate", type=float, default=100.0, help="mean requests per second")
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", default=str(DEFAULT_START), help="unix seconds or RFC 3339")
    parser.add_argument("--no-abuse", action="store_true", help="leave out the abusive clients")
    parser.add_argument("--format", choices=FORMATS, default="ndjson")
    parser.add_argument("--out", required=True, help="file to write (.gz: gzip), - for stdout")
    parser.add_argument("--tiers-out", help="also write each user's tier to this CSV file")
    args = parser.parse_args(argv)
    if args.tiers_out:
        write_tiers(user_tiers(args.seed, args.users), args.tiers_out)
    began = time.perf_counter()
    records = generate(
        args.seed, _start(args.start), args.seconds, args.rate, args.users, abuse=not args.no_abuse
    )
    count = write(records, args.out, args.format)
    took = time.perf_counter() - began
    print(f"{count} requests written to {args.out} in {took:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
