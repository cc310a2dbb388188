"""``applimit usage`` shows a tier's calendar quotas beside its rates, read from the
shared test server."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
from harness import RedisServer

from applimit import Limiter
from applimit._cli import main

POLICY = """
version: 1
tiers: [free, pro]
app: {{redis_url: "{url}"}}
limits:
  - name: api
    app:
      tiers: {{free: 10/1m, pro: [100/1m, 1000/1h]}}
      quotas: {{pro: {{day: 500, billing: 20000}}}}
      billing_day_from: billing_day
"""


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def policy_file(tmp_path: Path, redis_client: redis.Redis, redis_server: RedisServer) -> Path:
    """The policy on the shared server (flushed by redis_client)."""
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(url=redis_server.url))
    return path


def test_usage_lists_each_quota_with_its_period(policy_file: Path) -> None:
    """Three hits of cost 2: the rates and both quotas show 6 used; the quotas' periods
    end within a day and within a month; the text names them; nothing is consumed."""
    path = policy_file
    keys = {"billing_day": "15"}
    with Limiter.from_policy(path) as limiter:
        for _ in range(3):
            assert limiter.hit("api", "alice", tier="pro", cost=2, keys=keys).allowed
    argv = (str(path), "--user", "alice", "--tier", "pro", "--keys", "billing_day=15")
    code, out, err = run("usage", *argv, "--format", "json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    [pro] = document["limits"][0]["tiers"]
    assert [(r["rate"], r["used"]) for r in pro["rates"]] == [("100/1m", 6), ("1000/1h", 6)]
    quotas = [(q["period"], q["quota"], q["used"], q["remaining"]) for q in pro["quotas"]]
    assert quotas == [("day", 500, 6, 494), ("billing", 20000, 6, 19994)]
    day, billing = pro["quotas"]
    assert 0 < day["reset_after"] <= 86_400 <= day["window"] + 3600
    assert 0 < billing["reset_after"] <= 31 * 86_400
    code, text, _ = run("usage", *argv)
    assert code == 0
    assert "500/day  used      6 of 500" in text
    assert "20000/billing" in text
    # usage only peeks: the counts are what they were.
    code, again, _ = run("usage", *argv, "--format", "json")
    assert [q["used"] for q in json.loads(again)["limits"][0]["tiers"][0]["quotas"]] == [6, 6]


def test_usage_of_a_billing_quota_without_the_billing_day_says_how_to_pass_it(
    policy_file: Path,
) -> None:
    """Without --keys billing_day=DAY the billing quota cannot be placed: exit 2, and the
    message names the flag that gives it (not the Python call an app makes)."""
    code, _, err = run("usage", str(policy_file), "--user", "alice", "--tier", "pro")
    assert code == 2
    assert "--keys billing_day=15" in err and "hit()" not in err
    # A day that is no day of the month: the key's own check, which names the range.
    code, _, err = run(
        "usage", str(policy_file), "--user", "alice", "--tier", "pro", "--keys", "billing_day=32"
    )
    assert code == 2 and "1 to 31" in err
