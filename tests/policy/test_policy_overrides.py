"""The policy's ``overrides:`` (contract rates reviewed with the policy): what loads, what
is refused with its place in the file, and lint's L006-L009, L113 and L114."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import edgegen_policy as policy
import pytest

HEAD = """version: 1
tiers: [free, pro]
limits:
  - name: api
    app:
      tiers: {free: [10/1m], pro: [100/1m, 2000/1h]}
  - name: search
    app:
      per: org
      tiers: {free: [5/1m], pro: [50/1m]}
  - name: login
    app:
      per: ip
      tiers: {free: [5/1m], pro: [5/1m]}
  - name: edge
    edge: {rate: 100/1m}
cloudflare: {plan: enterprise}
overrides:
"""


def load(tmp_path: Path, body: str) -> policy.Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + body, encoding="utf-8")
    return policy.load(path)


def findings(tmp_path: Path, body: str) -> list[tuple[str, int | None]]:
    """(code, line) of every override finding."""
    found = policy.lint(load(tmp_path, body))
    return [(d.code, d.line) for d in found if d.code in {"L006", "L007", "L008", "L113", "L114"}]


OK = """  - limit: api
    user: alice
    rates: [50/1m, 1000/1h]
    expires: "2999-12-31"
    reason: contract 12
"""


def test_an_override_within_the_tiers_loads_without_findings(tmp_path: Path) -> None:
    """A user's override no looser than the highest tier: loaded, nothing to say."""
    loaded = load(tmp_path, OK)
    [entry] = loaded.overrides
    assert (entry.kind, entry.value, [str(r) for r in entry.rates]) == (
        "user",
        "alice",
        ["50/1m", "1000/1h"],
    )
    # A date's override lasts through that day (UTC).
    assert entry.expires_at == dt.datetime(3000, 1, 1, tzinfo=dt.UTC).timestamp()
    assert findings(tmp_path, OK) == []
    assert policy.check(loaded).ok


@pytest.mark.parametrize(
    ("body", "code", "line"),
    [
        (OK.replace("limit: api", "limit: nope"), "L006", 19),
        (OK.replace("limit: api", "limit: edge"), "L006", 19),
        (OK.replace("limit: api", "limit: login"), "L007", 20),
        (OK.replace("limit: api", "limit: search"), "L007", 20),
        (OK + OK, "L008", 24),
        (OK.replace("50/1m", "101/1m"), "L113", 21),
        # Looser over an hour than the pro tier's 2000/1h, though not per minute: an
        # override replaces every rate of the tier, so a rate it leaves out is gone.
        (OK.replace("50/1m, 1000/1h", "100/1m"), "L113", 21),
        (OK.replace("2999-12-31", "2001-01-01"), "L114", 22),
    ],
)
def test_lint_findings_name_their_line(tmp_path: Path, body: str, code: str, line: int) -> None:
    """Each finding about an override points at the line at fault."""
    assert (code, line) in findings(tmp_path, body)


def test_an_error_stops_the_app(tmp_path: Path) -> None:
    """An override the app could not apply stops the app layer (the validity gate)."""
    loaded = load(tmp_path, OK.replace("limit: api", "limit: login"))
    assert [d.code for d in policy.check(loaded).stopping(policy.Layer.APP)] == ["L007"]


def test_a_per_key_override_names_its_key(tmp_path: Path) -> None:
    """``key: {org: acme}`` names an app key's value for a per: org limit."""
    body = OK.replace("limit: api", "limit: search").replace("user: alice", "key: {org: acme}")
    assert findings(tmp_path, body) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (OK.replace("    user: alice\n", ""), "exactly one identity"),
        (OK.replace("user: alice", "user: alice\n    key: {org: a}"), "exactly one identity"),
        (OK.replace("user: alice", "key: {org: a, team: b}"), "one app key"),
        (OK.replace("user: alice", 'key: {org: "a\\u001b[2J"}'), "control character"),
        (OK.replace('"2999-12-31"', "next week"), "not a date"),
        (OK.replace("    reason: contract 12\n", ""), "reason"),
        (OK.replace("reason: contract 12", 'reason: "a\\nb"'), "control character"),
        (OK.replace("rates: [50/1m, 1000/1h]", "rates: [fast]"), "rate"),
    ],
)
def test_bad_overrides_are_located_load_errors(tmp_path: Path, body: str, message: str) -> None:
    """What cannot be an override is a load error at its place, saying how to write it."""
    with pytest.raises(policy.PolicyLoadError) as raised:
        load(tmp_path, body)
    [diagnostic] = raised.value.diagnostics
    assert message in diagnostic.message
    assert diagnostic.line is not None and diagnostic.line >= 17


OWN_HEAD = """version: 1
tiers: [free, pro]
limits:
  - name: exports
    app:
      tiers: {free: [1/1m], pro: [10/1m]}
      quotas: {free: {day: 10}, pro: {day: 100, month: 1000}}
      concurrency: {free: 1, pro: 3}
  - name: api
    app:
      mode: approximate
      tiers: {free: [10/1m], pro: [100/1m]}
overrides:
  - limit: exports
    user: alice
"""
# The exports limit with concurrency alone: no rates, no quotas.
SLOTS_ONLY = OWN_HEAD.replace(
    "      tiers: {free: [1/1m], pro: [10/1m]}\n"
    "      quotas: {free: {day: 10}, pro: {day: 100, month: 1000}}\n",
    "",
)
OWN = """    quotas: {month: 500}
    concurrency: 2
    expires: "2999-12-31"
    reason: contract 12
"""


def load_own(tmp_path: Path, body: str, head: str = OWN_HEAD) -> policy.Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(head + body, encoding="utf-8")
    return policy.load(path)


def test_an_override_of_quotas_and_concurrency_loads_without_findings(tmp_path: Path) -> None:
    """An override may give quotas and concurrency without rates (the tier's stay)."""
    loaded = load_own(tmp_path, OWN)
    [entry] = loaded.overrides
    assert entry.rates is None and entry.concurrency == 2
    assert entry.quotas is not None and entry.quotas.text() == "500/month"
    assert entry.gives() == "quotas 500/month; concurrency 2"
    assert [d.code for d in policy.lint(loaded) if d.code.startswith(("L0", "L11"))] == []


@pytest.mark.parametrize(
    ("body", "head", "code", "line", "message"),
    [
        # More than the highest tier's quota of that period, or its concurrency.
        (OWN.replace("500", "5000"), OWN_HEAD, "L113", 16, "5,000 vs 1,000 per month"),
        (OWN.replace("month: 500", "day: 101"), OWN_HEAD, "L113", 16, "101 vs 100 per day"),
        (OWN.replace("concurrency: 2", "concurrency: 4"), OWN_HEAD, "L113", 17, "4 vs 3 at once"),
        # What the limit cannot count.
        (OWN, OWN_HEAD.replace("limit: exports", "limit: api").replace(
            "      concurrency: {free: 1, pro: 3}\n", ""), "L009", 15, "has none"),
        (OWN.replace("    quotas: {month: 500}\n", ""),
         OWN_HEAD.replace("limit: exports", "limit: api"), "L009", 16, "approximate"),
        (OWN.replace("month: 500", "billing: 500"), OWN_HEAD, "L009", 16, "billing_day_from"),
        (OWN.replace("    quotas: {month: 500}\n", "    rates: [5/1m]\n"), SLOTS_ONLY, "L009",
         14, "concurrency alone"),
        # Concurrency on a limit of rates alone (a mistyped limit would cap a whole API).
        (OWN.replace("    quotas: {month: 500}\n", ""),
         OWN_HEAD.replace("      concurrency: {free: 1, pro: 3}\n", ""), "L009", 15,
         "gives a concurrency limit, but limit 'exports' has none"),
    ],
)  # fmt: skip
def test_lint_of_an_overrides_quotas_and_concurrency(
    tmp_path: Path, body: str, head: str, code: str, line: int, message: str
) -> None:
    """L113 compares each of an override's quotas with the highest tier's of that period
    and its concurrency with the highest tier's; L009 refuses what the limit cannot count,
    stopping the app, at the field's line."""
    loaded = load_own(tmp_path, body, head)
    [found] = [d for d in policy.lint(loaded) if d.code == code]
    assert found.line == line and message in found.message, found
    if code == "L009":
        assert [d.code for d in policy.check(loaded).stopping(policy.Layer.APP)] == ["L009"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (OWN.replace("quotas: {month: 500}", "rates: [" + ", ".join(["1/1m"] * 9) + "]"),
         "at most 8 rates"),
        (OWN.replace("month: 500", "month: 2000000000000000"), "at most 1,000,000,000,000,000"),
    ],
)  # fmt: skip
def test_an_override_beyond_what_the_app_applies_is_a_load_error(
    tmp_path: Path, body: str, message: str
) -> None:
    """The file's override is held to what applimit applies at run time (as many rates and
    units as a set may give): refused at load, with its line, not ignored by the app."""
    with pytest.raises(policy.PolicyLoadError) as raised:
        load_own(tmp_path, body)
    [diagnostic] = raised.value.diagnostics
    assert message in diagnostic.message and diagnostic.line is not None


def test_an_override_that_gives_nothing_is_a_load_error(tmp_path: Path) -> None:
    """An override with neither rates, quotas nor concurrency says what it may give."""
    body = OWN.replace("    quotas: {month: 500}\n    concurrency: 2\n", "")
    with pytest.raises(policy.PolicyLoadError) as raised:
        load_own(tmp_path, body)
    [diagnostic] = raised.value.diagnostics
    assert "rates, quotas or concurrency" in diagnostic.message
