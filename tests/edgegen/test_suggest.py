"""edgegen suggest on generated traffic: the tiers stay in order, every format says that a
suggestion is a floor and not advice to loosen, a floor looser than today is marked (and
not suggested where the refusals may be attacks or the sample is small), and a sample too
small to say anything is named, with the sample size of every row."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

import edgegen_policy as policy
import pytest

from bench.traffic import write
from edgegen import cli
from edgegen.replay._suggest import MIN_IDENTITIES, MIN_REQUESTS, Suggestion, suggest
from edgegen.replay._types import Record

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "policy.yaml")
T0 = 1_796_083_200  # 2026-12-01T00:00:00Z
API = "api.example.com"

# One limit per kind: a quota per user over a prefix, and a login form per address.
POLICY = """
version: 1
tiers: [free, pro, enterprise]
limits:
  - name: api
    match: {{ path_prefix: /api/ }}
    app:
      per: user
      algorithm: sliding_log
      tiers: {{ free: {free}, pro: [{pro_minute}, {pro_hour}], enterprise: {enterprise} }}
  - name: login
    match: {{ paths: [/login], methods: [POST] }}
    app:
      per: ip
      algorithm: sliding_log
      tiers: {{ free: 5/1m, pro: 10/1m, enterprise: 10/1m }}
"""
TODAY = {
    "free": "100/1m",
    "pro_minute": "1000/1m",
    "pro_hour": "20000/1h",
    "enterprise": "10000/1m",
}


def load(**rates: str) -> policy.Policy:
    return policy.loads(POLICY.format(**{**TODAY, **rates}))


def users(
    rng: random.Random,
    tier: str,
    count: int,
    per_minute: tuple[int, int],
    minutes: int,
    *,
    prefix: str | None = None,
) -> list[Record]:
    """``count`` users of ``tier`` who each send a steady number of requests a minute, drawn
    from ``per_minute``, for ``minutes``."""
    out = []
    for n in range(count):
        user = f"{prefix or tier}-{n}"
        rate = rng.randint(*per_minute)
        for minute in range(minutes):
            for _ in range(rate):
                at = (T0 + minute * 60) * 1_000_000 + rng.randrange(60_000_000)
                out.append(
                    Record(at, "GET", API, "/api/v1/items", f"10.{n % 250}.0.1", user, tier, True)
                )
    return out


def logins(rng: random.Random, ips: Iterable[str], per_minute: int, minutes: int) -> list[Record]:
    """POST /login from each of ``ips``, ``per_minute`` a minute, for ``minutes``."""
    out = []
    for ip in ips:
        for minute in range(minutes):
            for _ in range(per_minute):
                at = (T0 + minute * 60) * 1_000_000 + rng.randrange(60_000_000)
                out.append(Record(at, "POST", API, "/login", ip))
    return out


def in_order(records: list[Record]) -> list[Record]:
    return sorted(records, key=lambda r: r.at_us)


def by(items: list[Suggestion], limit: str, tier: str, rate: str | None = None) -> Suggestion:
    found = [i for i in items if i.limit == limit and i.tier == tier and rate in (None, i.rate)]
    assert len(found) == 1, found
    return found[0]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> list[dict[str, str]]:
    """The text report's table: one dict per row, by the header's column names."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("limit  "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows.append(dict(zip(header, cells + [""] * (len(header) - len(cells)), strict=True)))
    return rows


# --- tier order ---------------------------------------------------------------------------


def test_a_higher_tier_is_never_suggested_less_than_a_lower_one() -> None:
    """Free users outrun pro users (as on a quiet day for pro): the pro and enterprise
    floors are below free's, so they are raised to what free admits in a window of each of
    their periods; the suggested policy passes lint's tier-order check (L101), which the
    floors alone fail."""
    rng = random.Random(11)
    records = in_order(
        users(rng, "free", 150, (20, 40), 15)
        + users(rng, "pro", 150, (2, 6), 15)
        + users(rng, "enterprise", 120, (1, 3), 15)
    )
    items, _ = suggest(load(), records, 0.01)
    free = by(items, "api", "free")
    pro_minute = by(items, "api", "pro", "1000/1m")
    pro_hour = by(items, "api", "pro", "20000/1h")
    enterprise = by(items, "api", "enterprise")

    def l101(*rates: Suggestion, floors: bool = False) -> list[str]:
        """Lint's tier-order findings for the policy with these rates."""
        text = [str(item.floor_rate if floors else item.suggested_rate) for item in rates]
        loaded = load(free=text[0], pro_minute=text[1], pro_hour=text[2], enterprise=text[3])
        return [d.message for d in policy.lint(loaded) if d.code == "L101"]

    assert free.suggested is not None
    assert pro_minute.suggested == free.suggested
    assert pro_hour.suggested == 60 * free.suggested  # what free admits in an hour
    assert enterprise.suggested == pro_minute.suggested
    assert not l101(free, pro_minute, pro_hour, enterprise)
    # The floors alone invert the tiers.
    assert free.floor is not None and pro_minute.floor is not None
    assert pro_minute.floor < free.floor
    assert l101(free, pro_minute, pro_hour, enterprise, floors=True)
    assert pro_minute.raised_for == "free" and enterprise.raised_for == "pro"
    assert free.raised_for is None
    for item in (pro_minute, pro_hour, enterprise):
        assert item.suggested is not None and item.floor is not None
        assert item.suggested > item.floor
        assert item.refused_suggested <= item.refused_floor


def test_the_tier_order_holds_against_a_lower_tier_without_traffic() -> None:
    """A lower tier with no traffic keeps today's rate, so a higher tier is raised to that:
    pro's floor is not suggested below free's 100/1m."""
    rng = random.Random(12)
    records = in_order(users(rng, "pro", 120, (2, 4), 12))
    items, _ = suggest(load(), records, 0.01)
    assert by(items, "api", "free").suggested is None
    pro = by(items, "api", "pro", "1000/1m")
    assert pro.suggested == 100
    assert pro.floor is not None and pro.floor < 100
    assert pro.raised_for == "free"


# --- looser than today ----------------------------------------------------------------------


def test_a_looser_floor_on_ordinary_traffic_is_marked_looser_than_today(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Twelve of 200 free users (6 %) send 120 a minute against 100/1m, each refused about
    as often as the others: at 1 % the floor is looser than today, suggested and marked so
    in every format."""
    rng = random.Random(13)
    records = in_order(
        users(rng, "free", 200, (5, 10), 12) + users(rng, "free", 12, (120, 120), 12, prefix="big")
    )
    (policy_file := tmp_path / "policy.yaml").write_text(POLICY.format(**TODAY), encoding="utf-8")
    traffic = tmp_path / "traffic.ndjson"
    write(records, traffic, "ndjson")
    items, _ = suggest(load(), records, 0.01)
    free = by(items, "api", "free")
    assert not free.small_sample
    assert free.attack is None and not free.kept
    assert free.suggested is not None and free.suggested > 100
    assert free.looser
    code, out, _ = run(["suggest", str(policy_file), "--traffic", str(traffic)], capsys)
    assert code == 0
    (row,) = [r for r in table(out) if (r["limit"], r["tier"]) == ("api", "free")]
    assert "looser than today" in row["note"]
    code, out, _ = run(
        ["suggest", str(policy_file), "--traffic", str(traffic), "--format", "json"], capsys
    )
    item = next(
        r for r in json.loads(out)["suggestions"] if (r["limit"], r["tier"]) == ("api", "free")
    )
    assert item["looser_than_today"] is True and item["kept_at_current"] is False
    assert any("looser than today" in text for text in item["warnings"])


def test_a_looser_floor_on_a_login_form_is_not_suggested() -> None:
    """Four addresses try 30 passwords a minute against a login limit of 5/1m among 200
    ordinary ones: on an ample sample the floor admits them, so it is not suggested; the
    report keeps 5/1m and says the refusals may be attacks, naming why."""
    rng = random.Random(14)
    ordinary = [f"192.0.2.{n}" for n in range(200)]
    stuffers = [f"198.51.100.{n}" for n in range(4)]
    records = in_order(logins(rng, ordinary, 1, 12) + logins(rng, stuffers, 30, 12))
    items, _ = suggest(load(), records, 0.01)
    login = by(items, "login", "free")
    assert login.suggested == 5
    assert not login.small_sample
    assert login.floor is not None and login.floor > 5
    assert login.kept and not login.looser
    assert login.attack is not None
    assert "POST" in login.attack
    assert "4 identities" in login.attack  # the refusals are concentrated too


def test_a_looser_floor_from_a_few_identities_is_not_suggested() -> None:
    """Not a login: three scrapers send 300 a minute under a 100/1m quota. The refusals all
    come from three identities, so the floor that would admit them is not suggested."""
    rng = random.Random(15)
    records = in_order(
        users(rng, "free", 200, (5, 10), 12) + users(rng, "free", 3, (300, 300), 12, prefix="bot")
    )
    items, _ = suggest(load(), records, 0.01)
    free = by(items, "api", "free")
    assert free.suggested == 100
    assert not free.small_sample
    assert free.floor is not None and free.floor > 100
    assert free.kept
    assert free.attack is not None
    assert "3 identities" in free.attack and "POST" not in free.attack


# --- what a suggestion is, and samples too small to say anything ----------------------------


@pytest.fixture(scope="module")
def brute_force_160(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """160 log lines, two minutes: a brute force on /login from one address (40 lines),
    four busy free users and eight quieter pro users on the API."""
    rng = random.Random(16)
    records = in_order(
        logins(rng, ["198.51.100.9"], 20, 2)
        + users(rng, "free", 4, (10, 10), 2)
        + users(rng, "pro", 8, (2, 3), 2)
    )[:160]
    assert len(records) == 160
    path = tmp_path_factory.mktemp("suggest") / "sample.ndjson"
    write(records, path, "ndjson")
    return path


def test_160_lines_are_too_small_a_sample_and_loosen_nothing(
    brute_force_160: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new user's case: from 160 lines the old report loosened the login limit to
    admit the brute force and put pro below free. Now every row with traffic says the
    sample is too small, with its size; login keeps 5/1m with a warning that its refusals
    may be attacks; pro is not below free."""
    code, out, _ = run(["suggest", EXAMPLE, "--traffic", str(brute_force_160)], capsys)
    assert code == 0
    assert "Small sample: too little traffic to say anything" in out
    assert f"fewer than {MIN_IDENTITIES} identities" in out
    assert f"fewer than {MIN_REQUESTS:,} requests" in out
    shown = next(r for r in table(out) if (r["limit"], r["tier"]) == ("login", "free"))
    assert (shown["identities"], shown["suggested"]) == ("1", "5/1m")
    assert int(shown["requests"]) > 0
    assert "small sample" in shown["note"] and "kept" in shown["note"]
    assert "may be attacks" in out
    code, out, _ = run(
        ["suggest", EXAMPLE, "--traffic", str(brute_force_160), "--format", "json"], capsys
    )
    data = json.loads(out)
    rows = {(r["limit"], r["tier"], r["rate"]): r for r in data["suggestions"]}
    busy = [r for r in data["suggestions"] if r["identities"]]
    assert busy and all(r["small_sample"] for r in busy)
    assert all(r["requests"] >= r["identities"] for r in busy)
    login = rows["login", "free", "5/1m"]
    assert login["floor"] == "20/1m" and login["suggested"] == "5/1m"
    assert login["kept_at_current"] is True and login["refusals_may_be_attacks"]
    free = rows["api", "free", "100/1m"]
    pro = rows["api", "pro", "1000/1m"]
    count = int(str(free["suggested"]).split("/")[0])
    assert int(str(pro["suggested"]).split("/")[0]) >= count
    assert pro["raised_for_tier"] == "free"
    assert data["thresholds"]["min_identities"] == MIN_IDENTITIES


@pytest.fixture(scope="module")
def ample(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A policy with per-minute rates and traffic ample for all of them: 150 users per
    tier, over a thousand requests per tier, fifteen minutes (more than ten periods)."""
    folder = tmp_path_factory.mktemp("ample")
    text = POLICY.format(**TODAY).replace("[1000/1m, 20000/1h]", "1000/1m")
    (policy_file := folder / "policy.yaml").write_text(text, encoding="utf-8")
    rng = random.Random(17)
    records = in_order(
        users(rng, "free", 150, (1, 4), 15)
        + users(rng, "pro", 150, (1, 4), 15)
        + users(rng, "enterprise", 150, (1, 4), 15)
        + logins(rng, [f"192.0.2.{n}" for n in range(150)], 1, 15)
    )
    traffic = folder / "traffic.ndjson.gz"
    write(records, traffic, "ndjson")
    return policy_file, traffic


def test_an_ample_sample_gets_no_small_sample_warning(
    ample: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Past every threshold, no row is called a small sample, in any format; the sample
    size of each row is still shown."""
    policy_file, traffic = ample
    code, out, _ = run(["suggest", str(policy_file), "--traffic", str(traffic)], capsys)
    assert code == 0
    assert "small sample" not in out.lower()
    (row,) = [r for r in table(out) if (r["limit"], r["tier"]) == ("api", "pro")]
    assert row["identities"] == "150"
    assert int(row["requests"].replace(",", "")) >= MIN_REQUESTS
    assert row["note"] == ""
    code, out, _ = run(
        ["suggest", str(policy_file), "--traffic", str(traffic), "--format", "json"], capsys
    )
    data = json.loads(out)
    busy = [r for r in data["suggestions"] if r["identities"]]
    assert len(busy) == 4  # api in three tiers, login for anonymous callers (free)
    for row in busy:
        assert row["identities"] >= MIN_IDENTITIES and row["requests"] >= MIN_REQUESTS
        assert row["small_sample"] == []
    assert not any("small sample" in text for text in data["warnings"])


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_every_format_says_a_suggestion_is_a_floor_not_advice_to_loosen(
    fmt: str, ample: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Text, Markdown and JSON say what a suggestion is: the least rate that admits the
    observed traffic at the target, not a recommendation to loosen a limit."""
    policy_file, traffic = ample
    code, out, _ = run(
        ["suggest", str(policy_file), "--traffic", str(traffic), "--format", fmt], capsys
    )
    assert code == 0
    text = json.loads(out)["meaning"] if fmt == "json" else out
    assert "Each suggestion is a floor" in text
    assert "the least rate that admits the observed traffic" in text
    assert "not a recommendation to loosen a limit" in text
