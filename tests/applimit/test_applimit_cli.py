"""The ``applimit`` command line (applimit/_cli.py): ``usage`` and ``reset`` on a real
redis-server, run in-process through ``main()`` and as a subprocess (``python -m applimit``).

Usage is written with the library (``Limiter.hit``) and read back by the command, so the
tests hold the command to what the limiter itself counts.
"""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import RedisCluster, RedisServer

from applimit import Limiter
from applimit._cli import main

ROOT = Path(__file__).resolve().parents[2]

# Every way a limit counts (user, ip, an app key), a tier with two rates, a tier some limits
# give no rate, GCRA with a burst, a shadow limit and one that counts failures only.
# timeout: 2s keeps a slow CI machine from being taken for an outage.
POLICY = """
version: 1
tiers: [free, pro, gold]
app: {{redis_url: "{url}", key_prefix: cli, timeout: 2s}}
limits:
  - name: api
    match: {{path_prefix: /api/}}
    app:
      algorithm: sliding_log
      tiers: {{free: 5/1m, pro: [10/1m, 100/1h]}}
  - name: login
    match: {{paths: [/login]}}
    app: {{per: ip, algorithm: sliding_log, tiers: {{free: 3/1m, pro: 3/1m, gold: 3/1m}}}}
  - name: signin
    match: {{paths: [/signin]}}
    count_when: {{status: [401, 500-599]}}
    app: {{per: ip, algorithm: sliding_log, tiers: {{free: 3/1m, pro: 3/1m, gold: 3/1m}}}}
  - name: org-api
    match: {{path_prefix: /api/}}
    app: {{per: org, algorithm: sliding_log, tiers: {{free: 4/1m, pro: 4/1m, gold: 4/1m}}}}
  - name: search
    match: {{paths: [/api/search]}}
    app: {{algorithm: gcra, burst: 7, tiers: {{free: 2/1s, pro: 2/1s, gold: 2/1s}}}}
  - name: exports
    match: {{path_prefix: /api/exports/}}
    app: {{algorithm: sliding_log, enforce: false, tiers: {{free: 2/1h}}}}
"""


def write_policy(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(url=url))
    return path


@pytest.fixture
def policy_file(tmp_path: Path, redis_client: redis.Redis, redis_server: RedisServer) -> Path:
    """A policy whose app.redis_url is the shared server (flushed by redis_client)."""
    return write_policy(tmp_path, redis_server.url)


@pytest.fixture
def limiter(policy_file: Path) -> Any:
    with Limiter.from_policy(policy_file) as built:
        yield built


class _Tty(io.StringIO):
    """Standard input that says it is a terminal, with the answer already typed."""

    def isatty(self) -> bool:
        return True


def run(*argv: str, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=stdin or io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def run_process(
    *argv: str, env: dict[str, str] | None = None, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "APPLIMIT_REDIS_URL"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "applimit", *argv],
        capture_output=True,
        text=True,
        stdin=stdin,
        env=full_env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def usage_json(*argv: str) -> dict[str, Any]:
    code, out, err = run("usage", *argv, "--format", "json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {limit["name"]: limit for limit in document["limits"]}


# --- usage -------------------------------------------------------------------------------


def test_usage_shows_what_the_limiter_counted_for_each_rate_of_the_tier(
    policy_file: Path, limiter: Limiter
) -> None:
    """Three hits of alice show as used 3 against both rates of pro; her org's and her
    address's counts come from their own buckets."""
    for _ in range(3):
        limiter.hit("api", "alice", tier="pro")
    limiter.hit("org-api", "alice", keys={"org": "acme"})
    limiter.hit("login", None, ip="203.0.113.9")
    limiter.hit("login", None, ip="203.0.113.9")
    # A count_when limit: the check counts nothing, the recorded 401 counts.
    limiter.hit("signin", None, ip="203.0.113.9")
    limiter.record("signin", None, 401, ip="203.0.113.9")
    limiter.record("signin", None, 200, ip="203.0.113.9")

    document = usage_json(
        str(policy_file), "--user", "alice", "--tier", "pro", "--ip", "203.0.113.9",
        "--keys", "org=acme",
    )  # fmt: skip

    assert document["version"] == 1
    assert document["tier"] == "pro"
    assert document["subject"] == {
        "user": "alice",
        "ip": "203.0.113.9",
        "keys": {"org": "acme"},
        "description": "user 'alice', ip 203.0.113.9, org 'acme'",
    }
    limits = by_name(document)
    api = limits["api"]
    assert api["counted_by"] == {"kind": "user", "value": "alice"}
    assert api["skipped"] is None
    [pro] = api["tiers"]
    assert pro["tier"] == "pro"
    assert [(r["rate"], r["quota"], r["used"], r["remaining"]) for r in pro["rates"]] == [
        ("10/1m", 10, 3, 7),
        ("100/1h", 100, 3, 97),
    ]
    assert 0 < pro["rates"][0]["reset_after"] <= 60
    assert pro["rates"][0]["window"] == 60.0
    assert [r["used"] for r in limits["org-api"]["tiers"][0]["rates"]] == [1]
    assert limits["org-api"]["counted_by"] == {"kind": "org", "value": "acme"}
    assert [r["used"] for r in limits["login"]["tiers"][0]["rates"]] == [2]
    assert limits["login"]["counted_by"] == {"kind": "ip", "value": "203.0.113.9"}
    assert limits["login"]["count_when"] is None
    assert [r["used"] for r in limits["signin"]["tiers"][0]["rates"]] == [1]
    assert limits["signin"]["count_when"] == "401, 5xx"
    # exports gives pro no rate: shown, but not limited.
    assert limits["exports"]["tiers"] == [{"tier": "pro", "rates": [], "concurrency": None}]
    assert limits["exports"]["shadow"] is True


def test_usage_without_a_tier_says_why_every_tier_is_shown(
    policy_file: Path, limiter: Limiter
) -> None:
    """Without --tier the text says that the same counts stand against each tier's quota
    (the app's identify knows the caller's tier); with --tier it shows that tier alone."""
    limiter.hit("api", "alice", tier="pro")
    code, out, err = run("usage", str(policy_file), "--user", "alice")
    assert code == 0, err
    assert "the same counts are shown against each tier's quota; --tier TIER shows one" in out
    code, out, err = run("usage", str(policy_file), "--user", "alice", "--tier", "pro")
    assert code == 0, err
    assert "against each tier's quota" not in out


def test_usage_names_the_statuses_a_limit_counts(policy_file: Path, limiter: Limiter) -> None:
    """A count_when limit says which responses it counts."""
    code, out, err = run("usage", str(policy_file), "--ip", "203.0.113.9", "--tier", "free")
    assert code == 0, err
    assert "signin (sliding_log, per ip, counts responses 401, 5xx): counted by ip" in out
    assert "login (sliding_log, per ip): counted by ip" in out


def test_usage_consumes_nothing(policy_file: Path, limiter: Limiter) -> None:
    """Reading usage many times leaves the counts as they were: it only peeks."""
    limiter.hit("api", "bob")
    for _ in range(6):
        usage_json(str(policy_file), "--user", "bob", "--tier", "free")
    assert limiter.peek("api", "bob").remaining == 4
    [rate] = by_name(usage_json(str(policy_file), "--user", "bob", "--tier", "free"))["api"][
        "tiers"
    ][0]["rates"]
    assert (rate["used"], rate["remaining"], rate["allowed"]) == (1, 4, True)


def test_without_tier_every_tier_the_limit_defines_is_shown(
    policy_file: Path, limiter: Limiter
) -> None:
    """The CLI cannot know the user's tier: each tier with a rate is shown. Counts are kept
    per period, not per tier: pro's 10/1m sees what free's 5/1m counted, while its 100/1h,
    a period free does not have, counted nothing."""
    limiter.hit("api", "carol", tier="free")
    limiter.hit("api", "carol", tier="free")
    document = usage_json(str(policy_file), "--user", "carol")
    assert document["tier"] is None
    api = by_name(document)["api"]
    assert [t["tier"] for t in api["tiers"]] == ["free", "pro"]  # gold has no rate in api
    assert [[(r["rate"], r["used"]) for r in t["rates"]] for t in api["tiers"]] == [
        [("5/1m", 2)],
        [("10/1m", 2), ("100/1h", 0)],
    ]
    assert [t["tier"] for t in by_name(document)["exports"]["tiers"]] == ["free"]


def test_gcra_shows_used_against_the_burst(policy_file: Path, limiter: Limiter) -> None:
    """For GCRA the capacity is the burst, and used is capacity minus remaining."""
    for _ in range(3):
        limiter.hit("search", "dave")
    [rate] = by_name(usage_json(str(policy_file), "--user", "dave", "--tier", "free"))["search"][
        "tiers"
    ][0]["rates"]
    assert rate["capacity"] == 7
    assert rate["quota"] == 2
    # 2/1s drips back while the command starts: at most 3 used, never more.
    assert rate["used"] + rate["remaining"] == 7
    assert 0 <= rate["used"] <= 3


def test_limits_the_subject_gives_nothing_to_count_by_are_skipped_with_the_reason(
    policy_file: Path,
) -> None:
    """A user alone: per-IP and per-org limits say which option would show them."""
    limits = by_name(usage_json(str(policy_file), "--user", "erin"))
    assert limits["login"]["skipped"] == "counts per client IP; pass --ip"
    assert limits["login"]["tiers"] == []
    assert limits["org-api"]["skipped"] == "counts per org; pass --keys org=VALUE"
    assert limits["api"]["skipped"] is None


def test_an_anonymous_caller_is_shown_by_address(policy_file: Path, limiter: Limiter) -> None:
    """--ip alone is the anonymous caller: per-user and per-org limits count the address,
    as check_request does, and an IPv6 client by its /64 network."""
    limiter.hit("api", None, ip="2001:db8::1")
    limits = by_name(usage_json(str(policy_file), "--ip", "2001:db8::2", "--tier", "free"))
    assert limits["api"]["counted_by"] == {"kind": "ip", "value": "2001:db8::/64"}
    assert limits["api"]["tiers"][0]["rates"][0]["used"] == 1
    assert limits["org-api"]["counted_by"]["kind"] == "ip"


def test_text_output_lists_every_limit(policy_file: Path, limiter: Limiter) -> None:
    """The text form: a heading, one line per limit, one per rate, skipped limits said."""
    limiter.hit("api", "frank", tier="pro")
    code, out, err = run("usage", str(policy_file), "--user", "frank", "--tier", "pro")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("usage of user 'frank' in redis://127.0.0.1:")
    assert "api (sliding_log, per user): counted by user 'frank'" in lines
    assert any("10/1m" in line and "used      1 of 10" in line for line in lines)
    assert "login (sliding_log, per ip): skipped, counts per client IP; pass --ip" in lines
    assert "exports (sliding_log, per user, shadow): counted by user 'frank'" in lines
    assert any("no rate in this tier: not limited" in line for line in lines)


def test_control_characters_in_an_identity_are_never_printed(policy_file: Path) -> None:
    """A user id with an escape sequence is shown escaped, not sent to the terminal."""
    code, out, _ = run("usage", str(policy_file), "--user", "evil\x1b[2J", "--tier", "free")
    assert code == 0
    assert "\x1b" not in out
    assert "evil\\x1b[2J" in out


# --- reset -------------------------------------------------------------------------------


def test_reset_with_yes_forgets_every_limit_that_counts_the_subject(
    policy_file: Path, limiter: Limiter
) -> None:
    """--yes resets api and org-api for alice; the per-IP bucket she was not named by stays."""
    limiter.hit("api", "alice", tier="pro")
    limiter.hit("org-api", "alice", keys={"org": "acme"})
    limiter.hit("login", None, ip="203.0.113.9")
    code, out, err = run(
        "reset", str(policy_file), "--user", "alice", "--keys", "org=acme", "--yes"
    )
    assert code == 0, err
    assert out.startswith("reset api, org-api, search, exports for user 'alice', org 'acme'")
    assert limiter.peek("api", "alice", tier="pro").remaining == 10
    assert limiter.peek("org-api", "alice", keys={"org": "acme"}).remaining == 4
    assert limiter.peek("login", None, ip="203.0.113.9").remaining == 2


def test_reset_of_one_limit_leaves_the_others(policy_file: Path, limiter: Limiter) -> None:
    """--limit NAME resets that limit only."""
    limiter.hit("api", "gina")
    limiter.hit("search", "gina")
    code, _, err = run("reset", str(policy_file), "--user", "gina", "--limit", "api", "--yes")
    assert code == 0, err
    assert limiter.peek("api", "gina").remaining == 5
    assert limiter.peek("search", "gina").remaining < 7


def test_reset_of_one_tier_forgets_only_its_periods(policy_file: Path, limiter: Limiter) -> None:
    """--tier free resets the 1m counts free has and leaves pro's 1h; exports, which gives
    pro no rate, is left out of a reset of pro."""
    limiter.hit("api", "una", tier="pro")
    limiter.hit("exports", "una", tier="free")
    code, out, err = run("reset", str(policy_file), "--user", "una", "--tier", "free", "--yes")
    assert code == 0, err
    assert out.startswith("reset api, search, exports for user 'una' (tier free)")
    pro = limiter.peek("api", "una", tier="pro")
    assert [r.remaining for r in pro.results] == [10, 99]
    assert limiter.peek("exports", "una", tier="free").remaining == 2
    limiter.hit("exports", "una", tier="free")
    code, out, err = run("reset", str(policy_file), "--user", "una", "--tier", "pro", "--yes")
    assert code == 0, err
    assert out.startswith("reset api, search for user 'una' (tier pro)")
    assert [r.remaining for r in limiter.peek("api", "una", tier="pro").results] == [10, 100]
    assert limiter.peek("exports", "una", tier="free").remaining == 1


def test_reset_without_a_terminal_or_yes_refuses_and_changes_nothing(
    policy_file: Path, limiter: Limiter
) -> None:
    """A script that forgot --yes gets exit 1 and a message saying so; the counts stay."""
    limiter.hit("api", "hank")
    done = run_process("reset", str(policy_file), "--user", "hank")
    assert done.returncode == 1
    assert "without confirmation: stdin is not a terminal. Pass --yes" in done.stderr
    assert "Traceback" not in done.stderr
    assert limiter.peek("api", "hank").remaining == 4


@pytest.mark.parametrize(("answer", "code", "remaining"), [("y\n", 0, 5), ("n\n", 1, 4)])
def test_reset_on_a_terminal_asks_first(
    policy_file: Path, limiter: Limiter, answer: str, code: int, remaining: int
) -> None:
    """On a terminal the command asks; only yes resets."""
    limiter.hit("api", "ivan")
    got, _, err = run("reset", str(policy_file), "--user", "ivan", stdin=_Tty(answer))
    assert got == code
    assert "Reset api, search, exports for user 'ivan'" in err
    assert "[y/N]" in err
    assert limiter.peek("api", "ivan").remaining == remaining


def test_reset_prompt_on_a_real_terminal(policy_file: Path, limiter: Limiter) -> None:
    """Run as a process whose stdin is a pseudo-terminal: it prompts and reads the answer."""
    limiter.hit("api", "judy")
    primary, secondary = pty.openpty()
    try:
        os.write(primary, b"yes\n")
        done = run_process("reset", str(policy_file), "--user", "judy", stdin=secondary)
    finally:
        os.close(secondary)
        os.close(primary)
    assert done.returncode == 0, done.stderr
    assert "[y/N]" in done.stderr
    assert limiter.peek("api", "judy").remaining == 5


# --- Redis URL, passwords, outages ---------------------------------------------------------


def test_the_environment_variable_and_the_option_choose_the_redis(
    tmp_path: Path, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """The policy names a Redis that is not there; $APPLIMIT_REDIS_URL, then --redis-url,
    take precedence over it."""
    policy_file = write_policy(tmp_path, "redis://127.0.0.1:1/0")
    with Limiter.from_policy(policy_file, redis_url=redis_server.url) as limiter:
        limiter.hit("api", "kim")
    by_env = run_process(
        "usage", str(policy_file), "--user", "kim", "--tier", "free", "--format", "json",
        env={"APPLIMIT_REDIS_URL": redis_server.url},
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    assert by_name(json.loads(by_env.stdout))["api"]["tiers"][0]["rates"][0]["used"] == 1
    by_option = run_process(
        "usage", str(policy_file), "--user", "kim", "--redis-url", redis_server.url,
        env={"APPLIMIT_REDIS_URL": "redis://127.0.0.1:1/0"},
    )  # fmt: skip
    assert by_option.returncode == 0, by_option.stderr


def test_a_password_is_never_printed(tmp_path: Path, fresh_redis_server: RedisServer) -> None:
    """With a password in the URL, output and errors show it as ***."""
    with fresh_redis_server.client() as admin:
        admin.config_set("requirepass", "s3cret-pw")
    url = f"redis://:s3cret-pw@127.0.0.1:{fresh_redis_server.port}/0"
    policy_file = write_policy(tmp_path, url)
    ok = run_process("usage", str(policy_file), "--user", "lee", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["redis"] == f"redis://:***@127.0.0.1:{fresh_redis_server.port}/0"
    wrong = run_process(
        "usage", str(policy_file), "--user", "lee", "--redis-url",
        f"redis://:another-pw@127.0.0.1:{fresh_redis_server.port}/0",
    )  # fmt: skip
    assert wrong.returncode == 1
    for done in (ok, wrong):
        assert "s3cret-pw" not in done.stdout + done.stderr
        assert "another-pw" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", ["usage", "reset"])
def test_redis_unreachable_says_so(tmp_path: Path, command: str) -> None:
    """Nothing listens: exit 1, one message naming the URL (no password), no traceback."""
    policy_file = write_policy(tmp_path, "redis://:pw-here@127.0.0.1:1/0")
    extra = ["--yes"] if command == "reset" else []
    done = run_process(command, str(policy_file), "--user", "mo", *extra)
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Redis at redis://:***@127.0.0.1:1/0 did not answer" in done.stderr
    assert "pw-here" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_redis_too_slow_for_the_timeout_says_so(
    tmp_path: Path, fresh_redis_server: RedisServer
) -> None:
    """A paused server answers nothing: --timeout bounds the wait, and the command says
    Redis did not answer (exit 1) instead of hanging."""
    policy_file = write_policy(tmp_path, fresh_redis_server.url)
    fresh_redis_server.pause()
    try:
        done = run_process("usage", str(policy_file), "--user", "pia", "--timeout", "200ms")
    finally:
        fresh_redis_server.resume()
    assert done.returncode == 1
    assert "did not answer" in done.stderr
    ok = run_process("usage", str(policy_file), "--user", "pia", "--timeout", "5s")
    assert ok.returncode == 0, ok.stderr


# --- user mistakes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["usage", "{p}", "--user", "a", "--tier", "platinum"], 2, "tier 'platinum' is not in"),
        (["reset", "{p}", "--user", "a", "--limit", "nope", "--yes"], 2, "no limit named 'nope'"),
        (["reset", "{p}", "--user", "a", "--limit", "login", "--yes"], 2, "pass --ip"),
        (
            ["reset", "{p}", "--user", "a", "--limit", "exports", "--tier", "pro", "--yes"],
            2,
            "limit 'exports' gives tier 'pro' no rate",
        ),
        (["usage", "{p}"], 2, "say whose usage: pass --user, --ip or --keys"),
        (["usage", "{p}", "--user", ""], 2, "--user is empty"),
        (["usage", "{p}", "--ip", "300.1.1.1"], 2, "is not an IPv4 or IPv6 address"),
        (["usage", "{p}", "--keys", "org"], 2, "is not NAME=VALUE"),
        (["usage", "{p}", "--user", "a", "--redis-url", "memory://"], 2, "a store inside one"),
        (["usage", "{p}", "--user", "a", "--redis-url", "http://x"], 1, "redis_url"),
        (["usage", "{missing}", "--user", "a"], 1, "the policy was not loaded"),
        (["usage", "{p}", "--user", "a", "--timeout", "soon"], 2, "is not a duration"),
        (["usage", "{p}", "--user", "a", "--timeout", "20s"], 2, "from 1ms to 10s"),
    ],
)
def test_user_mistakes_exit_non_zero_with_a_clear_message(
    policy_file: Path, tmp_path: Path, argv: list[str], code: int, message: str
) -> None:
    """Each mistake: its exit code, one message, no traceback."""
    filled = [a.format(p=policy_file, missing=tmp_path / "nowhere.yaml") for a in argv]
    got, out, err = run(*filled)
    assert got == code, err
    assert message in err
    assert "Traceback" not in err
    assert out == ""


def test_a_usage_error_of_the_parser_exits_2_as_a_process() -> None:
    """An unknown option: argparse's usage line and exit code 2."""
    done = run_process("usage", "policy.yaml", "--frobnicate")
    assert done.returncode == 2
    assert "applimit: error: unrecognized arguments: --frobnicate" in done.stderr


def test_usage_and_reset_on_a_redis_cluster(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_client: Any
) -> None:
    """--cluster with one node's URL: usage reads, and reset clears, the identity's slot."""
    policy_file = write_policy(tmp_path, redis_cluster.url)
    with Limiter.from_policy(policy_file, cluster=True) as limiter:
        limiter.hit("api", "nia")
        limiter.hit("login", None, ip="198.51.100.7")
        argv = ["--user", "nia", "--ip", "198.51.100.7", "--tier", "free", "--cluster"]
        code, out, err = run("usage", str(policy_file), *argv, "--format", "json")
        assert code == 0, err
        limits = by_name(json.loads(out))
        assert limits["api"]["tiers"][0]["rates"][0]["used"] == 1
        assert limits["login"]["tiers"][0]["rates"][0]["used"] == 1
        code, _, err = run("reset", str(policy_file), *argv, "--yes")
        assert code == 0, err
        assert limiter.peek("api", "nia").remaining == 5
        assert limiter.peek("login", None, ip="198.51.100.7").remaining == 3


def test_the_applimit_command_is_declared() -> None:
    """pyproject.toml installs `applimit` as a console script of this module's main."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["applimit"] == "applimit._cli:main"


def test_the_installed_applimit_command_runs(policy_file: Path, limiter: Limiter) -> None:
    """The console script that `pip install` made beside this Python reads usage too."""
    limiter.hit("api", "olga")
    script = Path(sys.executable).parent / "applimit"
    done = subprocess.run(
        [str(script), "usage", str(policy_file), "--user", "olga", "--tier", "free"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "used      1 of 5" in done.stdout
