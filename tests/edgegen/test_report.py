"""``edgegen report`` and ``edgegen.report``: edge analytics from Cloudflare's GraphQL API.

The zone's rules come from ``FakeCloudflare`` (REST); the analytics from ``FakeGraphQL``
(``cloudflare_fake``), at the HTTP layer (respx), answering ``POST /graphql`` in the
documented shape of Cloudflare's GraphQL Analytics API. Hostile answers (``errors`` that is
not a list of objects, a token in ``extensions.code``, negative or huge counts, dimensions
that are lists or objects, no data, no JSON) are sent by hand, each refused with one clear
error that never shows the token.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import edgegen_policy as policy
import httpx
import pytest
import respx
from cloudflare_fake import (
    ACCOUNT_ID,
    BASE_URL,
    TOKEN,
    ZONE_ID,
    FakeCloudflare,
    FakeGraphQL,
    gql_error,
)
from zone_support import EXAMPLE, HAND_MADE, Sleeps

import edgegen
from edgegen import _cli_report, cli
from edgegen.cloudflare import _analytics
from edgegen.cloudflare._retry import RetryPolicy

WORKER = "api-edge-limits"
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@contextmanager
def mocked(zone: FakeCloudflare, analytics: FakeGraphQL) -> Iterator[respx.MockRouter]:
    """GraphQL to ``analytics``, every other request to the fake zone."""
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/graphql").mock(side_effect=analytics.handle)
        router.route().mock(side_effect=zone.handle)
        yield router


def example_rules() -> list[dict[str, Any]]:
    """The rules the example policy builds for the edge."""
    env = {"CLOUDFLARE_ZONE_ID": ZONE_ID, "CLOUDFLARE_ACCOUNT_ID": ACCOUNT_ID}
    rules: list[dict[str, Any]] = edgegen.build(policy.load(EXAMPLE, env=env)).ruleset["rules"]
    return rules


def zone_with_rules(count: int | None = None) -> FakeCloudflare:
    """A fake zone holding the hand-made rules and edgegen rules (``count`` of them, made by
    copying the example's first rule with new refs, or the example's own)."""
    rules = example_rules()
    if count is not None:
        template = rules[0]
        rules = [{**template, "ref": f"edgegen:copy-{i:02d}"} for i in range(count)]
    fake = FakeCloudflare(plan="enterprise")
    fake.seed_rules([*HAND_MADE[:1], *rules])
    return fake


def owned(zone: FakeCloudflare) -> list[dict[str, Any]]:
    """The zone's edgegen rules as stored (with Cloudflare's ids)."""
    return [r for r in zone.rules if r["ref"].startswith("edgegen:")]


def event(
    rule_id: str, action: str, country: str, colo: str, ago: timedelta, n: int = 1
) -> dict[str, Any]:
    """A firewall event ``ago`` before NOW."""
    return {
        "ruleId": rule_id,
        "action": action,
        "clientCountryName": country,
        "coloCode": colo,
        "datetime": NOW - ago,
        "count": n,
    }


def client(sleep: Sleeps | None = None, token: str = TOKEN) -> edgegen.Client:
    """A client of the fakes that never really sleeps."""
    return edgegen.Client(edgegen.Token(token), sleep=sleep if sleep is not None else Sleeps())


SCOPE = edgegen.Scope(ZONE_ID, ACCOUNT_ID, WORKER)
HOUR = timedelta(hours=1)


def test_report_counts_each_owned_rule_and_the_worker() -> None:
    """Only rules whose ref starts with ``edgegen:`` are reported, each with its events by
    action (block counts as mitigated, log as logged), its top countries and colos in
    order of count, and nothing from outside the window; the Worker's sums add up over
    its statuses."""
    zone = zone_with_rules(count=3)
    rules = owned(zone)
    first, second = rules[0]["id"], rules[1]["id"]
    hand_made = zone.rules[0]["id"]
    analytics = FakeGraphQL(
        events=[
            event(first, "block", "DE", "FRA", HOUR, 5),
            event(first, "block", "US", "IAD", HOUR, 4),
            event(first, "managed_challenge", "US", "EWR", 2 * HOUR, 2),
            event(first, "log", "FR", "CDG", HOUR, 1),
            event(first, "block", "CN", "HKG", 30 * HOUR, 100),  # before the window
            event(second, "log", "BR", "GRU", HOUR, 4),
            event(hand_made, "block", "DE", "FRA", HOUR, 50),  # not edgegen's
        ],
        invocations=[
            {
                "scriptName": WORKER,
                "status": "success",
                "datetime": NOW - HOUR,
                "requests": 90,
                "subrequests": 30,
            },
            {
                "scriptName": WORKER,
                "status": "scriptThrewException",
                "datetime": NOW - HOUR,
                "requests": 2,
                "errors": 2,
            },
            {"scriptName": "other", "status": "success", "datetime": NOW - HOUR, "requests": 1000},
        ],
    )
    with mocked(zone, analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, since=timedelta(hours=24), now=lambda: NOW)

    assert [r.ref for r in made.rules] == [r["ref"] for r in rules]
    top = made.rules[0]
    assert (top.events, top.mitigated, top.logged) == (12, 11, 1)
    assert top.actions[0] == _analytics.Count("block", 9)
    assert [c.name for c in top.countries] == ["US", "DE", "FR"]
    assert top.countries[0].count == 6
    assert [c.name for c in top.colos][:2] == ["FRA", "IAD"]  # 5 and 4
    assert (made.rules[1].events, made.rules[1].mitigated, made.rules[1].logged) == (4, 0, 4)
    assert all(r.events == 0 for r in made.rules[2:])
    assert made.worker == _analytics.WorkerReport(
        WORKER,
        requests=92,
        errors=2,
        subrequests=30,
        statuses=(
            _analytics.Count("success", 90),
            _analytics.Count("scriptThrewException", 2),
        ),
    )
    assert (made.since, made.until) == (NOW - timedelta(hours=24), NOW)
    assert analytics.bodies[0]["variables"]["since"] == "2026-12-02T12:00:00Z"
    assert hand_made not in json.dumps(analytics.bodies)


def test_top_limits_the_lists_and_says_they_were_cut() -> None:
    """``top`` is the limit each country and colo list asks for; a full list is marked
    truncated, so the report never passes a cut list off as complete."""
    zone = zone_with_rules(count=2)
    rule_id = owned(zone)[0]["id"]
    countries = ["DE", "US", "FR", "BR"]
    analytics = FakeGraphQL(
        events=[event(rule_id, "block", c, "FRA", HOUR, 10 - i) for i, c in enumerate(countries)]
    )
    with mocked(zone, analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, top=2, now=lambda: NOW)
    assert [c.name for c in made.rules[0].countries] == ["DE", "US"]
    assert made.rules[0].truncated
    assert not made.rules[1].truncated
    assert "limit: 3, orderBy" in analytics.bodies[0]["query"]

    # Exactly as many countries as shown: the list is complete, and not marked as cut.
    with mocked(zone, analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, top=4, now=lambda: NOW)
    assert len(made.rules[0].countries) == 4
    assert not made.rules[0].truncated


def test_many_rules_are_asked_about_in_batches_within_the_field_limit() -> None:
    """Each rule costs three fields; with more rules than one query may ask about, the
    report sends several queries, each under Cloudflare's field limit, and reports every
    rule in the zone's order."""
    zone = zone_with_rules(count=23)
    rules = owned(zone)
    analytics = FakeGraphQL(
        events=[event(r["id"], "block", "DE", "FRA", HOUR, i + 1) for i, r in enumerate(rules)]
    )
    with mocked(zone, analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert len(analytics.bodies) == 3 + 1  # three batches of rules, then the Worker
    assert [r.ref for r in made.rules] == [r["ref"] for r in rules]
    assert [r.events for r in made.rules] == list(range(1, 24))
    assert set(analytics.statuses) == {200}

    # Asked for in one query, the same rules pass the limit and Cloudflare says so.
    with mocked(zone, analytics), client() as made_client:
        with pytest.raises(edgegen.CloudflareAPIError, match="more than the 30 allowed"):
            edgegen.report(made_client, SCOPE, now=lambda: NOW, rules_per_query=23)


def test_a_plan_without_the_dataset_is_an_error_that_names_the_fix() -> None:
    """GraphQL refuses with HTTP 200 and ``errors``: the report fails with Cloudflare's
    words, the permission to give and the pointer to what each plan can query."""
    analytics = FakeGraphQL(datasets={"workersInvocationsAdaptive"})
    with mocked(zone_with_rules(), analytics), client() as made_client:
        with pytest.raises(edgegen.CloudflareAPIError) as caught:
            edgegen.report(made_client, SCOPE, now=lambda: NOW)
    message = str(caught.value)
    assert "not available on this plan" in message
    assert "Zone > Analytics > Read" in message
    assert "docs/zone.md" in message
    assert caught.value.status == 200
    assert not caught.value.ambiguous


def test_a_window_older_than_the_plan_keeps_says_to_shorten_since() -> None:
    """Asking further back than the plan keeps data is Cloudflare's error, with the fix."""
    analytics = FakeGraphQL(max_age=timedelta(days=1))
    with mocked(zone_with_rules(), analytics), client() as made_client:
        with pytest.raises(edgegen.CloudflareAPIError, match="shorter window with --since"):
            edgegen.report(made_client, SCOPE, since=timedelta(days=7), now=lambda: NOW)


def test_a_worker_dataset_the_token_may_not_read_leaves_the_rules_reported() -> None:
    """Without account analytics, the rules are still reported and the Worker's entry says
    why it has no numbers and which permission would give them."""
    analytics = FakeGraphQL(grants={TOKEN: {"zone"}})
    with mocked(zone_with_rules(), analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert made.rules
    assert made.worker is not None
    assert made.worker.unavailable is not None
    assert "Account > Account Analytics > Read" in made.worker.unavailable


def test_an_unknown_token_is_refused_with_the_permission_and_never_shown() -> None:
    """A 403 from the GraphQL endpoint names the token's variable and the permission; the
    token itself appears nowhere in the error."""
    secret = "another-token-0123456789"
    zone = zone_with_rules()
    zone.tokens[secret] = frozenset({"waf"})
    analytics = FakeGraphQL()
    with mocked(zone, analytics), client(token=secret) as made_client:
        with pytest.raises(edgegen.CloudflareAPIError) as caught:
            edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert caught.value.status == 403
    assert "CLOUDFLARE_API_TOKEN" in str(caught.value)
    assert "Zone > Analytics > Read" in str(caught.value)
    assert secret not in repr(caught.value.__dict__) + str(caught.value)


def test_a_429_is_retried_after_retry_after() -> None:
    """Cloudflare's GraphQL rate limit: the transport waits exactly Retry-After and asks
    again, and the report is complete."""
    zone = zone_with_rules()
    rule_id = owned(zone)[0]["id"]
    analytics = FakeGraphQL(events=[event(rule_id, "block", "DE", "FRA", HOUR, 7)], budget=0)
    sleeps = Sleeps()
    with mocked(zone, analytics), client(sleeps) as made_client:
        made = edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert analytics.statuses[0] == 429
    assert sleeps == [3.0]
    assert made.rules[0].mitigated == 7


def test_a_5xx_is_cloudflares_fault_and_changed_nothing() -> None:
    """A 5xx from the GraphQL endpoint is asked again with the client's backoff, as a read
    is; once the attempts run out, the error says the fault is Cloudflare's and, a query
    changing nothing, never that a change may have been made."""
    zone = zone_with_rules()
    sleeps = Sleeps()
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        graphql = router.post("/graphql").mock(return_value=httpx.Response(502, text="Bad gateway"))
        router.route().mock(side_effect=zone.handle)
        with (
            edgegen.Client(
                edgegen.Token(TOKEN), sleep=sleeps, jitter=lambda low, high: high
            ) as made_client,
            pytest.raises(edgegen.CloudflareAPIError) as caught,
        ):
            edgegen.report(made_client, SCOPE, now=lambda: NOW)
    policy_ = RetryPolicy()
    assert graphql.call_count == policy_.attempts
    assert sleeps == [policy_.backoff(n, lambda low, high: high) for n in range(4)]
    assert sleeps == [0.5, 1.0, 2.0, 4.0]
    assert caught.value.status == 502
    assert "Cloudflare's side" in str(caught.value)
    assert "may or may not" not in str(caught.value)
    assert not caught.value.ambiguous


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_a_passing_5xx_is_asked_again_and_the_report_is_complete(status: int) -> None:
    """One 5xx, then the fake's answer: the query is sent again after one backoff wait
    (no Retry-After) and the report is whole."""
    zone = zone_with_rules()
    rule_id = owned(zone)[0]["id"]
    analytics = FakeGraphQL(events=[event(rule_id, "block", "DE", "FRA", HOUR, 7)])
    failures = [httpx.Response(status, text="upstream trouble")]

    def flaky(request: httpx.Request) -> httpx.Response:
        return failures.pop() if failures else analytics.handle(request)

    sleeps = Sleeps()
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/graphql").mock(side_effect=flaky)
        router.route().mock(side_effect=zone.handle)
        with edgegen.Client(
            edgegen.Token(TOKEN), sleep=sleeps, jitter=lambda low, high: high
        ) as made_client:
            made = edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert sleeps == [0.5]
    assert made.rules[0].mitigated == 7


def test_an_unanswered_query_never_claims_a_change() -> None:
    """A query whose answer never came: the transport's error, without "may have made
    this change" (a read changes nothing)."""
    zone = zone_with_rules()
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/graphql").mock(side_effect=httpx.ReadError("connection reset"))
        router.route().mock(side_effect=zone.handle)
        with client() as made_client, pytest.raises(edgegen.CloudflareAPIError) as caught:
            edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert caught.value.status is None
    assert "may or may not" not in str(caught.value)
    assert not caught.value.ambiguous


def test_a_zone_without_edgegen_rules_says_so() -> None:
    """No owned rules: no rules query is sent, and a note says how to get them."""
    zone = FakeCloudflare()
    zone.seed_rules(HAND_MADE[:1])
    analytics = FakeGraphQL()
    with mocked(zone, analytics), client() as made_client:
        made = edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert made.rules == ()
    assert "edgegen apply" in made.notes[0]
    assert all("zones(" not in body["query"] for body in analytics.bodies)


def test_query_ids_travel_as_variables() -> None:
    """Rule ids are GraphQL variables, never query text (a quote in one could not change
    the query)."""
    request = _analytics.rules_query(ZONE_ID, ['x" }) evil'], NOW - HOUR, NOW, 5)
    assert "evil" not in request["query"]
    assert request["variables"]["rule0"] == 'x" }) evil'


# --- the command -----------------------------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token, zone and account the example policy reads."""
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", TOKEN)
    monkeypatch.setenv("CLOUDFLARE_ZONE_ID", ZONE_ID)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", ACCOUNT_ID)
    monkeypatch.delenv("CLOUDFLARE_API_BASE_URL", raising=False)


def _run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.usefixtures("env")
def test_the_command_prints_text_markdown_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """``edgegen report POLICY`` in each format: the rule's numbers, countries and colos,
    and the Worker's; what Cloudflare sent is shown escaped (a terminal control in a
    country name is written out, Markdown punctuation is escaped)."""
    zone = zone_with_rules()
    rule_id = owned(zone)[0]["id"]
    now = datetime.now(UTC)
    analytics = FakeGraphQL(
        events=[
            {**event(rule_id, "block", "DE", "FRA", HOUR, 4), "datetime": now - HOUR},
            {**event(rule_id, "block", "X\x1b[2J|*", "IAD", HOUR, 1), "datetime": now - HOUR},
        ],
        invocations=[
            {"scriptName": WORKER, "status": "success", "datetime": now - HOUR, "requests": 12}
        ],
    )
    with mocked(zone, analytics):
        code, out, err = _run(capsys, "report", EXAMPLE, "--since", "2h")
        assert code == 0, err
        assert "5 events: 5 mitigated, 0 logged" in out
        assert "top countries: DE 4, X\\x1b[2J|* 1" in out
        assert "\x1b" not in out
        assert f"Worker {WORKER}\n  12 requests, 0 errors, 0 subrequests" in out

        code, out, _ = _run(capsys, "report", EXAMPLE, "--format", "markdown")
        assert code == 0
        assert "| rule | action | events | mitigated |" in out
        assert "X\\x1b\\[2J\\|\\* 1" in out

        code, out, _ = _run(capsys, "report", EXAMPLE, "--format", "json")
        assert code == 0
        shown = json.loads(out)
        assert shown["rules"][0]["mitigated"] == 5
        assert shown["worker"]["requests"] == 12
    assert TOKEN not in out


@pytest.mark.usefixtures("env")
def test_the_command_reports_refusals_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A refused query ends with exit 1 and one ``edgegen: error:`` line, no traceback; a
    bad --since is a usage error that says how to write it."""
    analytics = FakeGraphQL(datasets=set())
    with mocked(zone_with_rules(), analytics):
        code, out, err = _run(capsys, "report", EXAMPLE)
    assert code == 1
    assert out == ""
    assert err.startswith("edgegen: error: Cloudflare's GraphQL API refused")
    assert "Traceback" not in err

    code, _, err = _run(capsys, "report", EXAMPLE, "--since", "yesterday")
    assert code == 2
    assert "--since" in err


def test_since_reads_the_policy_duration_syntax() -> None:
    """``--since`` takes the policy's durations (``90m``, ``7d``)."""
    assert _cli_report.parse_since("90m") == timedelta(minutes=90)
    assert _cli_report.parse_since("7d") == timedelta(days=7)
    with pytest.raises(edgegen.UsageError, match="--since"):
        _cli_report.parse_since("-1h")


# --- hostile answers -------------------------------------------------------------------


def leaks(text: str, token: str = TOKEN) -> list[str]:
    """The forms of ``token`` found in ``text``: itself, base64, hex, percent-encoded, a
    half of it."""
    raw = token.encode()
    found = {
        "the token": token,
        "its base64": base64.b64encode(raw).decode().rstrip("="),
        "its hex": raw.hex(),
        "its percent-encoding": quote(token, safe=""),
        "its first half": token[: len(token) // 2],
        "its second half": token[len(token) // 2 :],
    }
    return [name for name, form in found.items() if form.lower() in text.lower()]


def _zone_node(answer: dict[str, Any]) -> dict[str, Any]:
    node: dict[str, Any] = answer["data"]["viewer"]["zones"][0]
    return node


def _worker_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = answer["data"]["viewer"]["accounts"][0][
        "workersInvocationsAdaptive"
    ]
    return rows


def _set(path: str, value: Any) -> Any:
    """A change to a valid answer: ``value`` at ``path`` (dots; numbers index lists)."""

    def change(answer: dict[str, Any]) -> dict[str, Any]:
        *parents, last = path.split(".")
        item: Any = answer
        for part in parents:
            item = item[int(part)] if part.isdigit() else item[part]
        item[int(last) if last.isdigit() else last] = value
        return answer

    return change


B64_TOKEN = base64.b64encode(TOKEN.encode()).decode()
ROW = "data.viewer.zones.0.r0_countries.0"
WORKER_ROW = "data.viewer.accounts.0.workersInvocationsAdaptive.0"
# (query answered with it, change to a valid answer (or the body itself), what the error
# says). Every case but the last three crashed, printed the token, or printed the numbers
# as they came before answers were read through models.
HOSTILE: dict[str, tuple[str, Any, str]] = {
    "errors is a number": (
        "rules",
        _set("errors", 5),
        "(errors is 5: input should be a valid list)",
    ),
    "errors is true": (
        "rules",
        _set("errors", True),
        "(errors is true: input should be a valid list)",
    ),
    "errors is a string beside good data": (
        "rules",
        _set("errors", "boom"),
        '(errors is "boom": input should be a valid list)',
    ),
    "errors lists numbers and strings beside good data": (
        "rules",
        _set("errors", [1, "x", None]),
        "(errors[0] is 1: input should be an object)",
    ),
    "errors is an object quoting the token": (
        "worker",
        _set("errors", {"message": TOKEN}),
        "(errors is {",
    ),
    "an error message that is not a string": (
        "rules",
        _set("errors", [{"message": ["denied", TOKEN]}]),
        "(errors[0].message is [",
    ),
    "the token as extensions.code": (
        "rules",
        _set("errors", [gql_error("not authorized", TOKEN)]),
        "not authorized (code ***)",
    ),
    "the token in base64 as extensions.code": (
        "worker",
        _set("errors", [gql_error("no such dataset", B64_TOKEN)]),
        "no such dataset (code ***",
    ),
    "a negative count": (
        "rules",
        _set(f"{ROW}.count", -5),
        f"({ROW.replace('.0', '[0]')}.count is -5: input should be greater than or equal to 0)",
    ),
    "a count beyond any real one": (
        "rules",
        _set(f"{ROW}.count", 10**30),
        "count is 1000000000000000000000000000000: input should be less than or equal to "
        "9007199254740991)",
    ),
    "a count that is a string": (
        "rules",
        _set(f"{ROW}.count", "7"),
        'count is "7": input should be a valid integer)',
    ),
    "a country that is a list holding the token": (
        "rules",
        _set(f"{ROW}.dimensions.clientCountryName", ["DE", TOKEN]),
        "dimensions.clientCountryName is [",
    ),
    "a colo that is an object": (
        "rules",
        _set("data.viewer.zones.0.r0_colos.0.dimensions.coloCode", {"code": "FRA"}),
        "(data.viewer.zones[0].r0_colos[0].dimensions.coloCode is {",
    ),
    "a negative Worker sum": (
        "worker",
        _set(f"{WORKER_ROW}.sum.requests", -1),
        "sum.requests is -1: input should be greater than or equal to 0)",
    ),
    "a Worker status that is a list holding the token": (
        "worker",
        _set(f"{WORKER_ROW}.dimensions.status", [TOKEN]),
        "dimensions.status is [",
    ),
    "a list where the Worker's rows should be": (
        "worker",
        _set("data.viewer.accounts.0", [{"sum": {}}]),
        "(data.viewer.accounts[0] is [",
    ),
    "a rule's groups left out": (
        "rules",
        lambda answer: {**answer, "data": {"viewer": {"zones": [{}]}}},
        "(data.viewer.zones[0].r0_actions is missing)",
    ),
    "data without the viewer": (
        "rules",
        _set("data", {"zones": []}),
        "(data.viewer is missing)",
    ),
    "no data and no errors": (
        "worker",
        lambda answer: {"errors": None},
        "(data is null, and there are no errors to say why)",
    ),
    "an infinite count": (
        "rules",
        b'{"data": {"viewer": {"zones": [{"r0_actions": [{"count": 1e400, '
        b'"dimensions": {"action": "block"}}]}]}}}',
        "r0_actions[0].count is Infinity: input should be a valid integer)",
    ),
    "a page that is not JSON, quoting the token": (
        "rules",
        f"<html>502 Bad Gateway: Authorization: Bearer {TOKEN}</html>".encode(),
        "(its body is not JSON)",
    ),
}


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_answer_is_one_clear_error_without_the_token(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each answer that is not shaped as Cloudflare's (``errors`` that is no list of
    objects, a token in ``extensions.code``, negative, huge or string counts, list and
    object dimensions, no data, no JSON) ends ``edgegen report`` with exit 1 and one
    ``edgegen: error:`` line that names the field at fault: no traceback, no report, and no
    form of the token anywhere in the output."""
    query, hostile, says = HOSTILE[case]
    zone = zone_with_rules()
    rule_id = owned(zone)[0]["id"]
    now = datetime.now(UTC)
    analytics = FakeGraphQL(
        events=[{**event(rule_id, "block", "DE", "FRA", HOUR, 4), "datetime": now - HOUR}],
        invocations=[
            {"scriptName": WORKER, "status": "success", "datetime": now - HOUR, "requests": 3}
        ],
    )

    def answer(request: httpx.Request) -> httpx.Response:
        valid = analytics.handle(request)
        asked = "rules" if b"zones(" in request.content else "worker"
        if asked != query:
            return valid
        if isinstance(hostile, bytes):
            return httpx.Response(200, content=hostile)
        return httpx.Response(200, json=hostile(json.loads(valid.content)))

    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/graphql").mock(side_effect=answer)
        router.route().mock(side_effect=zone.handle)
        code, out, err = _run(capsys, "report", EXAMPLE, "--format", "json")
    assert code == 1, out
    assert out == ""
    assert err.startswith("edgegen: error: Cloudflare's GraphQL API "), err
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert says in err
    assert leaks(out + err) == []


@pytest.mark.usefixtures("env")
def test_every_string_an_answer_holds_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    """The token, or its base64, as a country, a colo, an action, a Worker status or in a
    rule's description is shown as ``***`` in every format; the numbers are still read."""
    zone = zone_with_rules()
    rule = owned(zone)[0]
    rule["description"] = f"login limit {TOKEN}"
    now = datetime.now(UTC)
    analytics = FakeGraphQL(
        events=[
            {**event(rule["id"], "block", TOKEN, B64_TOKEN, HOUR, 4), "datetime": now - HOUR},
            {**event(rule["id"], TOKEN.upper(), "DE", "FRA", HOUR, 1), "datetime": now - HOUR},
        ],
        invocations=[
            {"scriptName": WORKER, "status": TOKEN, "datetime": now - HOUR, "requests": 12}
        ],
    )
    with mocked(zone, analytics):
        for form in ("text", "markdown", "json"):
            code, out, err = _run(capsys, "report", EXAMPLE, "--format", form)
            assert code == 0, err
            assert leaks(out + err) == [], form
            assert "***" in out.replace("\\*", "*")  # Markdown escapes each *
    shown = json.loads(out)
    assert shown["rules"][0]["events"] == 5
    assert shown["rules"][0]["description"] == "login limit ***"
    assert shown["rules"][0]["countries"][0] == {"name": "***", "count": 4}
    assert shown["worker"]["statuses"] == [{"name": "***", "count": 12}]


def test_answers_are_read_by_models_in_the_library_too() -> None:
    """``edgegen.report`` raises CloudflareAPIError (status 200, nothing ambiguous) for a
    malformed answer, where it raised TypeError before."""
    zone = zone_with_rules()
    with respx.mock(base_url=BASE_URL, assert_all_called=False) as router:
        router.post("/graphql").mock(
            return_value=httpx.Response(200, json={"data": None, "errors": True})
        )
        router.route().mock(side_effect=zone.handle)
        with client() as made_client, pytest.raises(edgegen.CloudflareAPIError) as caught:
            edgegen.report(made_client, SCOPE, now=lambda: NOW)
    assert caught.value.status == 200
    assert not caught.value.ambiguous
    assert "errors is true" in str(caught.value)
