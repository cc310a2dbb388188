"""Differential: every layer counts what the app serves, on one corpus of >1,000 spellings.

One policy (tests/differential/spec.py) has limits that mirror the routes of two real apps;
one corpus (tests/differential/corpus.py), drawn by Hypothesis from the policy's matchers,
respells requests in every way a path, a method, a host and a client IP can be spelled. The
corpus goes through each layer:

- the app: a FastAPI app under uvicorn (with the h11 and the httptools parser), a Flask app
  under waitress and under gunicorn, and a Django project under gunicorn, each behind
  applimit's middleware over a real Redis, every request sent byte for byte over a raw
  socket (every other one under a ``SCRIPT_NAME`` header where gunicorn honours it). A request
  a handler serves must be counted by every limit that claims the handler's route
  (``spec.ROUTES``, written by hand), and the client must be counted per ``ip_bucket``; a
  path holding a control character is refused with 400 before any handler runs;
- the Worker that ``edgegen build`` generates, in workerd: a request whose URL (as the origin
  received it) an app serves with a limited route must have been counted by that limit (a
  path with a control character is answered 400 and never reaches the origin), and the
  Worker's ``ipBucket`` must equal Python's ``ip_bucket`` for every client IP;
- the Enterprise rule expressions, evaluated by tests/rules_eval.py on the path Cloudflare's
  URL normalisation produces: a request an app serves (as spelled: the origin gets the
  original URL; for a path the middleware refuses, what the bare app serves) must match the
  rule of every limit that claims it, except for the residual gaps docs/edge.md states
  (:func:`documented_rule_gap`).

Each test prints a table of the first mismatches when it fails. The apps run once per session
and are shared by the tests that need them.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
import rules_eval
from differential import apps, runners, spec
from differential.corpus import (
    CLAIMED,
    CONTROL_CODES,
    ENUMERATED_KINDS,
    KINDS,
    KNOWN,
    Spelling,
    build_corpus,
    corpus_digest,
)
from differential.rawhttp import RawClient
from differential.report import Mismatch, table
from edgegen_policy import decode_path, ip_bucket, normalize_path
from harness import RedisServer

import edgegen

MIN_CORPUS = 1_000
EDGE_MD = Path(__file__).resolve().parents[1] / "docs" / "edge.md"


# --- shared runs ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def corpus() -> tuple[Spelling, ...]:
    """The corpus, drawn once per session (deterministic: the same every run)."""
    return build_corpus(spec.policy_text(target="rule"))


@pytest.fixture(scope="session")
def app_runs(
    redis_server: RedisServer, corpus: tuple[Spelling, ...]
) -> Callable[[str], list[runners.AppRecord]]:
    """The corpus through one stack's app (run once per stack, on first use)."""
    runs: dict[str, list[runners.AppRecord]] = {}

    def run(stack: str) -> list[runners.AppRecord]:
        if stack not in runs:
            runs[stack] = runners.run_app(stack, corpus, redis_url=redis_server.url)
        return runs[stack]

    return run


@pytest.fixture(scope="session")
def worker_run(
    corpus: tuple[Spelling, ...], tmp_path_factory: pytest.TempPathFactory
) -> runners.WorkerRun:
    """The corpus through the generated Worker in workerd."""
    directory = tmp_path_factory.mktemp("differential-worker")
    return runners.run_worker(
        corpus, directory, probes={s.ip for s in corpus}, ipv6_prefix=spec.IPV6_PREFIX
    )


def expected_claims(handlers: dict[str, str | None], host: str) -> tuple[frozenset[str], str]:
    """The limits that claim what the stacks served, and who served it (for the table)."""
    claims: set[str] = set()
    served = []
    for stack, handler in handlers.items():
        if handler is not None:
            claims |= spec.claims(handler, host)
            served.append(f"{stack}:{handler}")
    return frozenset(claims), " ".join(served) or "-"


def mismatch(
    spelling: Spelling, served: str, saw: str, expected: frozenset[str], got: frozenset[str]
) -> Mismatch:
    """A table row for a spelling whose layer missed some claimed limit."""
    return Mismatch(
        kind=spelling.kind,
        request=spelling.line,
        host=spelling.host,
        ip=spelling.ip,
        served=served,
        saw=saw,
        expected=Mismatch.names(expected),
        got=Mismatch.names(got),
    )


# --- the corpus ----------------------------------------------------------------------------


def test_corpus_is_large_and_spells_everything(corpus: tuple[Spelling, ...]) -> None:
    """Over 1,000 distinct spellings, every kind of respelling, the known bypasses, and the
    methods, hosts and client IPs the layers must agree on."""
    assert len(corpus) >= MIN_CORPUS, (len(corpus), corpus_digest(corpus))
    assert len({(s.method, s.target, s.host, s.ip) for s in corpus}) == len(corpus)
    assert set(KNOWN) <= set(corpus)
    kinds = Counter(s.kind.split(":", 1)[0] for s in corpus)
    assert set(KINDS) | set(ENUMERATED_KINDS) <= set(kinds), kinds
    # Every byte at the end of every claimed route; every control character, in both cases
    # of hex, at the end of each and inside each.
    for path, _method, _host in CLAIMED:
        wire = quote(path, safe="/")
        targets_of = {s.target for s in corpus if s.target.startswith(wire)}
        for byte in range(0x100):
            assert f"{wire}%{byte:02X}" in targets_of, (path, byte)
        for code in CONTROL_CODES:
            for escape in (f"%{code:02X}", f"%{code:02x}"):
                assert f"{wire}{escape}" in targets_of, (path, escape)
                assert f"{wire}{escape}?x=1" in targets_of, (path, escape)
                assert any(escape in t[len(wire) // 2 : -1] for t in targets_of), (path, escape)
    targets = " ".join(s.target for s in corpus)
    for needle in ("%2F", "%2f", "%2e", "%2E", "/./", "/../", "//", "\\", "%5C", "?", "%FF"):
        assert needle in targets, needle
    escapes = {
        "letters": r"%(4[1-9A-Fa-f]|5[0-9Aa]|6[1-9A-Fa-f]|7[0-9Aa])",
        "digits": r"%3[0-9]",
        "-_~": r"%(2[Dd]|5[Ff]|7[Ee])",
        "reserved": r"%(2[1-9A-Ca-c]|3[ABDabd]|40)",
        "non-ASCII UTF-8": r"%[Cc]3%[Aa]9|%[Ee]2%82%[Aa][Cc]",
        "invalid UTF-8": r"%[Ff][Ff]|%[Cc]0%",
        "lower-case hex": r"%[0-9A-F][a-f]|%[a-f][0-9A-F]|%[a-f]{2}",
    }
    for what, pattern in escapes.items():
        assert re.search(pattern, targets), f"no escaped {what}"
    assert any(not s.target.isascii() for s in corpus), "no raw UTF-8 target"
    assert {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"} <= {
        s.method for s in corpus
    }
    hosts = [s.host for s in corpus]
    assert any(h.endswith(".") for h in hosts) and any(":" in h for h in hosts)
    assert any(h != h.lower() for h in hosts)
    ips = {s.ip for s in corpus}
    assert any("." in ip and ":" in ip for ip in ips), "no IPv4-mapped address"
    # Several addresses in one /64, and several spellings of one address.
    networks: defaultdict[str, set[int]] = defaultdict(set)
    spellings: defaultdict[int, set[str]] = defaultdict(set)
    for ip in ips:
        address = ipaddress.ip_address(ip)
        if address.version == 6 and address.ipv4_mapped is None:
            networks[ip_bucket(ip, 64)].add(int(address))
            spellings[int(address)].add(ip)
    assert any(len(addresses) >= 3 for addresses in networks.values()), networks
    assert any(len(texts) >= 3 for texts in spellings.values()), spellings


# --- the app -------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", apps.STACKS)
def test_app_counts_every_request_its_handlers_serve(
    stack: str, app_runs: Callable[[str], list[runners.AppRecord]]
) -> None:
    """A request served by the handler of a route a limit claims is counted by that limit."""
    records = app_runs(stack)
    served = Counter(r.handler for r in records if r.handler is not None)
    # The corpus reaches every handler, so the invariant below is tested on each of them.
    assert set(served) == set(spec.HANDLERS), served
    mismatches = []
    for record in records:
        if record.handler is None:
            continue
        expected = spec.claims(record.handler, record.spelling.host)
        if not expected <= record.counted:
            got = record.counted - {spec.CLIENTS}
            saw = f"route path {record.route_path}"
            if record.mount is not None:
                saw += f" (SCRIPT_NAME {record.mount})"
            mismatches.append(mismatch(record.spelling, record.handler, saw, expected, got))
    assert not mismatches, table(f"{stack}: served but not counted", mismatches, len(records))


# C0 controls and DEL, written here rather than taken from the library under test.
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def controlled(target: str) -> bool:
    """Whether a request target's path, decoded as a router decodes it, holds a control
    character (what every middleware and the Worker refuse with 400)."""
    return _CONTROL.search(decode_path(target)) is not None


@pytest.mark.parametrize("stack", apps.STACKS)
def test_app_refuses_control_characters_before_any_handler(
    stack: str, app_runs: Callable[[str], list[runners.AppRecord]]
) -> None:
    """Every spelling whose decoded path holds a control character is answered 400 by the
    middleware (no handler runs, nothing is counted), under every server and under
    SCRIPT_NAME; no other spelling is refused with 400 by the middleware."""
    records = app_runs(stack)
    wrong = []
    for record in records:
        if not controlled(record.spelling.target):
            continue
        if record.status == 0:
            # The server refused the request line itself: the middleware never saw it.
            continue
        if record.status != 400 or record.handler is not None or record.counted:
            wrong.append((record.spelling.line, record.mount, record.status, record.handler))
    reached = [r for r in records if controlled(r.spelling.target) and r.status == 400]
    assert len(reached) > len(CONTROL_CODES) * len(CLAIMED), len(reached)
    assert not wrong, wrong[:20]


@pytest.mark.parametrize("stack", apps.STACKS)
def test_app_counts_each_client_once_per_network(
    stack: str, app_runs: Callable[[str], list[runners.AppRecord]]
) -> None:
    """The app counts a client per ``ip_bucket``: IPv4 per address (IPv4-mapped included),
    IPv6 per /64, whatever the spelling. The ``clients`` limit counts every request the
    middleware sees, exactly, so its remaining quota tells how many requests the app has
    counted for that client so far; that must be how many the corpus sent in the bucket."""
    records = app_runs(stack)
    counted: Counter[str] = Counter()
    mismatches = []
    reached = 0
    reported: set[str] = set()
    for record in records:
        if record.clients_remaining is None:
            # The server refused the request line itself: the middleware never saw it. (A
            # decision without Redis would carry the policy but not the remaining count.)
            assert spec.CLIENTS not in record.counted, f"degraded decision: {record}"
            continue
        reached += 1
        bucket = ip_bucket(record.spelling.ip, spec.IPV6_PREFIX)
        counted[bucket] += 1
        observed = spec.APP_QUOTA - record.clients_remaining
        if observed != counted[bucket] and record.spelling.ip not in reported:
            # Once one spelling is counted apart, every later request of its bucket is off
            # too: report the first request of each spelling.
            reported.add(record.spelling.ip)
            mismatches.append(
                Mismatch(
                    kind=record.spelling.kind,
                    request=record.spelling.line,
                    host=record.spelling.host,
                    ip=record.spelling.ip,
                    served=record.handler or f"status {record.status}",
                    saw=f"Python bucket {bucket}",
                    expected=f"{counted[bucket]} in bucket",
                    got=f"{observed} in bucket",
                )
            )
    assert reached > len(records) // 2
    assert not mismatches, table(
        f"{stack}: client spellings counted apart from their bucket", mismatches, reached
    )


# --- the Worker ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def origin_served(
    worker_run: runners.WorkerRun,
) -> dict[str, dict[tuple[str, str, str], runners.Served]]:
    """Which handler each app (bare, no middleware) runs for each request the origin got."""
    wanted = {r.origin_request for r in worker_run.records if r.origin_request is not None}
    ordered = sorted(x for x in wanted if x is not None)
    return {stack: runners.oracle(stack, ordered) for stack in apps.STACKS}


def worker_controlled(target: str) -> bool:
    """:func:`controlled` for the path the Worker gets: WHATWG's parser has deleted raw tabs
    and newlines and encoded other raw controls first."""
    return _CONTROL.search(decode_path(normalize_path(target))) is not None


@pytest.mark.workerd
def test_worker_counts_what_the_origin_serves(
    worker_run: runners.WorkerRun,
    origin_served: dict[str, dict[tuple[str, str, str], runners.Served]],
) -> None:
    """If an app serves the URL the origin received with a route a limit claims, the Worker
    consulted that limit's binding."""
    records = worker_run.records
    # A path with a control character is answered 400 by the Worker itself (as the app's
    # middlewares answer it): it never reaches the origin, so nothing is served uncounted.
    refused = [r for r in records if worker_controlled(r.spelling.target)]
    assert len(refused) > len(CONTROL_CODES) * len(CLAIMED)
    wrong = [
        r
        for r in refused
        if r.status != 400
        or r.origin_request is not None
        or "control character" not in (r.detail or "")
    ]
    assert not wrong, [(r.spelling.line, r.status, r.origin_url, r.detail) for r in wrong[:10]]
    records = [r for r in records if not worker_controlled(r.spelling.target)]
    failed = [r for r in records if r.status != 200 or r.origin_request is None]
    assert not failed, [(r.spelling.line, r.status, r.error) for r in failed[:10]]
    mismatches = []
    for record in records:
        origin = record.origin_request
        assert origin is not None
        handlers = {stack: origin_served[stack][origin].handler for stack in apps.STACKS}
        expected, served = expected_claims(handlers, origin[2])
        if not expected <= record.counted:
            saw = f"origin got {origin[0]} {origin[1]}"
            mismatches.append(mismatch(record.spelling, served, saw, expected, record.counted))
    assert not mismatches, table("Worker: origin served but not counted", mismatches, len(records))


@pytest.mark.workerd
def test_worker_buckets_clients_like_python(
    worker_run: runners.WorkerRun, corpus: tuple[Spelling, ...]
) -> None:
    """The Worker's ``ipBucket`` equals ``policy.ip_bucket`` for every client IP of the corpus,
    and every binding is keyed by that bucket: two addresses of one /64 are one client."""
    assert worker_run.buckets is not None, "workers/templates/limiter.js defines no ipBucket"
    wrong = {
        ip: (bucket, ip_bucket(ip, spec.IPV6_PREFIX))
        for ip, bucket in worker_run.buckets.items()
        if bucket != ip_bucket(ip, spec.IPV6_PREFIX)
    }
    assert not wrong, "ipBucket(ip) -> (Worker, Python):\n" + "\n".join(
        f"  {ip}: {pair}" for ip, pair in sorted(wrong.items())
    )
    mismatches = []
    for record in worker_run.records:
        expected = ip_bucket(record.spelling.ip, spec.IPV6_PREFIX)
        keys = {key for _, key in record.consulted}
        if keys - {expected}:
            got = frozenset(str(k) for k in keys)
            saw = "the keys of " + Mismatch.names(record.counted)
            mismatches.append(mismatch(record.spelling, "-", saw, frozenset({expected}), got))
    assert any(r.consulted for r in worker_run.records)
    assert not mismatches, table("Worker: binding keyed apart", mismatches, len(worker_run.records))


# --- the rules -----------------------------------------------------------------------------


# The residual gaps of the rules, in the words of docs/edge.md ("Gaps that remain"; compared
# without Markdown backticks and whitespace runs). A gap is allowed only while the docs say it.
RULE_GAPS_IN_DOCS = (
    "%2F at a position that is not one of the policy path's own slashes",
    "at the fourth and later slash of a deep path or prefix",
    "%5C in place of a slash",
    "%2F around dot segments",
    "One gap is shared by rules and the Worker: both resolve dot segments before matching",
)
_SLASH_ESCAPE = re.compile("%2F|%5C", re.IGNORECASE)
_DOT_SEGMENT = re.compile(r"(?:^|/)\.\.?(?:/|$)")


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def undocumented_rule_gaps() -> list[str]:
    """The gaps of :data:`RULE_GAPS_IN_DOCS` that docs/edge.md does not state (any more)."""
    docs = _plain(EDGE_MD.read_text(encoding="utf-8"))
    return [gap for gap in RULE_GAPS_IN_DOCS if _plain(gap) not in docs]


def documented_rule_gap(
    spelling: Spelling, missing: frozenset[str], rule_limits: Callable[[str], frozenset[str]]
) -> bool:
    """Whether the limits a rule missed for a served request fall in a gap docs/edge.md states.

    Two kinds of gap are documented. Escaped separators the zone's normalisation leaves
    encoded while the app decodes them: ``%2F`` where the expression lists no ``%2F``
    spelling (not one of the policy path's own first three slashes), ``%2F`` around dot
    segments and ``%5C`` in place of a slash; a miss is in that gap when the path holds such
    an escape and the rules match once every ``%2F`` and ``%5C`` is written ``/`` (the
    spellings the expressions do list are pinned by tests/edgegen/test_expr.py). And dot segments
    the zone resolves while a catch-all route serves the path as sent (:func:`dot_segment_gap`).
    Only while the docs state all of them; any other miss is a mismatch.
    """
    path = re.split("[?#]", spelling.target, maxsplit=1)[0]
    if undocumented_rule_gaps():
        return False
    if dot_segment_gap(path, missing):
        return True
    if not _SLASH_ESCAPE.search(path):
        return False
    return missing <= rule_limits(_SLASH_ESCAPE.sub("/", path))


def dot_segment_gap(path: str, missing: frozenset[str]) -> bool:
    """The zone resolves dot segments before the rule sees the path, while the origin gets
    the path as sent and a catch-all route (``/api/{rest:path}``) serves it unresolved: a
    miss is in this gap when the decoded path has a dot segment and every missed limit
    matches the path with its dot segments left in place (slashes merged)."""
    decoded = decode_path(path).replace("\\", "/")
    if not _DOT_SEGMENT.search(decoded):
        return False
    unresolved = re.sub("/{2,}", "/", decoded)
    limits = spec.load_policy(target="rule")
    return all(limits.limit(name).match.matcher().matches_path(unresolved) for name in missing)


@pytest.fixture(scope="session")
def bare_served(
    corpus: tuple[Spelling, ...],
) -> dict[str, dict[tuple[str, str, str], runners.Served]]:
    """Which handler each bare app (no middleware) runs for the spellings the middleware
    refuses with 400: an origin without applimit serves them as its router reads them."""
    wanted = sorted({(s.method, s.target, s.host) for s in corpus if controlled(s.target)})
    return {stack: runners.oracle(stack, wanted) for stack in apps.STACKS}


def test_rules_count_what_the_origin_serves(
    corpus: tuple[Spelling, ...],
    app_runs: Callable[[str], list[runners.AppRecord]],
    bare_served: dict[str, dict[tuple[str, str, str], runners.Served]],
) -> None:
    """A request an app serves (as spelled: under the default normalisation scope the origin
    gets the original URL) matches the rule of every limit that claims it, on the path
    Cloudflare's normalisation gives the rule; only documented gaps are allowed."""
    artifacts = edgegen.build(spec.load_policy(target="rule"))
    rules = []
    for rule in artifacts.ruleset["rules"]:
        name = rule["description"].split(":", 1)[0]
        rules.append((name, rules_eval.parse(rule["expression"])[0]))
    assert {n for n, _ in rules} == set(spec.EDGE_LIMITS)
    by_stack = {stack: app_runs(stack) for stack in apps.STACKS}
    mismatches = []
    allowed = []
    for index, spelling in enumerate(corpus):
        records = {stack: by_stack[stack][index] for stack in apps.STACKS}
        assert all(r.spelling == spelling for r in records.values())
        handlers = {stack: r.handler for stack, r in records.items()}
        if controlled(spelling.target):
            # Refused by the middleware; a rule must still count what a bare origin serves.
            request = (spelling.method, spelling.target, spelling.host)
            handlers = {stack: bare_served[stack][request].handler for stack in apps.STACKS}
        expected, served = expected_claims(handlers, spelling.host)
        if not expected:
            continue

        def rule_limits(raw_path: str, spelling: Spelling = spelling) -> frozenset[str]:
            fields = rules_eval.Request(
                path=rules_eval.cloudflare_normalize(raw_path),
                method=spelling.method,
                host=spec.host_name(spelling.host),
            )
            return frozenset(name for name, tree in rules if rules_eval.evaluate(tree, fields))

        got = rule_limits(spelling.target)
        if expected <= got:
            continue
        if documented_rule_gap(spelling, expected - got, rule_limits):
            allowed.append(spelling.line)
            continue
        path = rules_eval.cloudflare_normalize(spelling.target)
        mismatches.append(mismatch(spelling, served, f"rule path {path}", expected, got))
    missing_docs = undocumented_rule_gaps()
    note = f"; docs/edge.md no longer states {missing_docs}" if missing_docs else ""
    title = f"rules: origin served but no rule matched ({len(allowed)} in documented gaps{note})"
    assert not mismatches, table(title, mismatches, len(corpus))


# --- the reported bypasses, with a limit that refuses ---------------------------------------

LOGIN_LIMIT = 5
LOGIN_POLICY = f"""\
version: 1
tiers: [free]
app: {{ key_prefix: bypass, timeout: 5s }}
limits:
  - name: login
    match: {{ paths: [/login], methods: [POST] }}
    app: {{ per: ip, algorithm: sliding_log, tiers: {{ free: {LOGIN_LIMIT}/1h }} }}
"""


def _login_runs(
    stack: str, redis_url: str, targets: list[bytes], headers: list[tuple[str, str]]
) -> Counter[int]:
    """Send each target as a POST from one client to the stack under LOGIN_POLICY; the
    statuses, and how many times the login handler ran."""
    statuses: Counter[int] = Counter()
    text = LOGIN_POLICY.replace("bypass", f"bypass-{stack}-{len(targets)}-{len(headers)}")
    with (
        apps.serve(stack, policy_text=text, redis_url=redis_url) as port,
        RawClient(apps.HOST, port) as http,
    ):
        for target in targets:
            sent = [("Host", "api.example.com"), ("CF-Connecting-IP", "203.0.113.9"), *headers]
            response = http.request("POST", target, sent)
            statuses[response.status] += 1
            if response.header("x-handler") == "login":
                statuses[-1] += 1
    return statuses


@pytest.mark.parametrize("stack", apps.STACKS)
def test_a_final_newline_never_reaches_the_login_handler(
    stack: str, redis_server: RedisServer
) -> None:
    """Twelve POSTs of /login%0A (and its other spellings) against a limit of five: the
    middleware answers 400 and the handler never runs (on main, FastAPI ran it twelve
    times)."""
    targets = [b"/login%0A", b"/%6c%6f%67%69%6e%0a", b"/login%0A?x=1", b"/login%0D%0A"] * 3
    statuses = _login_runs(stack, redis_server.url, targets, [])
    assert statuses[-1] == 0, statuses
    assert statuses[400] == len(targets), statuses


@pytest.mark.parametrize("stack", sorted(apps.MOUNTED))
def test_script_name_from_a_header_is_counted_under_gunicorn(
    stack: str, redis_server: RedisServer
) -> None:
    """gunicorn takes SCRIPT_NAME from a loopback peer's header and routes PATH_INFO
    without it: twelve POSTs of /x/login with ``SCRIPT_NAME: /x`` run the login handler
    five times, then get 429 (on main, twelve times)."""
    statuses = _login_runs(stack, redis_server.url, [b"/x/login"] * 12, [("SCRIPT_NAME", "/x")])
    assert statuses[-1] == LOGIN_LIMIT, statuses
    assert statuses[429] == 12 - LOGIN_LIMIT, statuses
