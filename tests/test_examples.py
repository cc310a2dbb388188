"""The examples that `make demo` runs keep working: offline plan and policy diff."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import RedisServer

from edgegen import cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_offline_plan_against_the_example_zone_state(capsys: pytest.CaptureFixture[str]) -> None:
    """The pulled example state plans with no token: changes, and the dashboard rule kept."""
    code = cli.main(
        [
            "plan",
            str(EXAMPLES / "policy.yaml"),
            "--state",
            str(EXAMPLES / "zone-state.json"),
            "--detailed-exitcode",
        ]
    )
    out = capsys.readouterr().out
    assert code == 2
    assert "ratelimit.requests_per_period: 10 -> 20" in out
    assert "1 rule not managed by edgegen kept in place" in out
    assert "Block WordPress probes" in out


def test_diff_of_the_example_versions(capsys: pytest.CaptureFixture[str]) -> None:
    """The previous and current example policies differ in the ways the demo describes."""
    code = cli.main(["diff", str(EXAMPLES / "policy-previous.yaml"), str(EXAMPLES / "policy.yaml")])
    out = capsys.readouterr().out
    assert code == 0
    assert "limit 'api': app rate for tier 'free' loosened from '60/1m' to '100/1m' (+67%)" in out
    assert "limit 'webhooks' is added" in out


def test_previous_example_policy_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """The previous version is itself a clean policy (--strict)."""
    assert cli.main(["validate", "--strict", str(EXAMPLES / "policy-previous.yaml")]) == 0


def _fleet_output() -> str:
    """The fleet demo's output, run as `make demo` runs it."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "fleet_demo.py")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _metrics_rows(out: str) -> dict[tuple[str, str], dict[str, int]]:
    """The metrics table the demo printed: (limit, tier) -> outcome -> count."""
    lines = out.split("/metrics (applimit_decisions_total", 1)[1].splitlines()[1:]
    header = lines[0].split()
    assert header[:4] == ["limit", "tier", "allowed", "denied"]
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for line in lines[1:]:
        if not line.strip() or line.strip().startswith("("):
            break
        limit, tier, *counts = line.split()
        rows[(limit, tier)] = dict(zip(header[2:], map(int, counts), strict=True))
    return rows


@pytest.mark.slow
def test_the_fleet_demo_prints_its_metrics_and_they_match_its_own_counts() -> None:
    """`make demo` ends the fleet part with applimit_decisions_total summed over the
    instances' /metrics: alice's admitted and refused requests are the api/free row
    (degraded decisions included, should Redis have been slow), bob's exports the
    exports/pro row (at most the shadow limit's 50 allowed, the rest shadow_denied), and
    the api/pro row counts each of them once per rate, as the note says."""
    out = _fleet_output()
    admitted, refused = map(
        int,
        re.search(r"applimit \(shared Redis\)\s+(\d+)\s+(\d+)", out).groups(),  # type: ignore[union-attr]
    )
    rows = _metrics_rows(out)
    assert set(rows) == {("api", "free"), ("api", "pro"), ("exports", "pro")}
    free = rows[("api", "free")]
    assert free["allowed"] + free.get("degraded_allowed", 0) == admitted
    assert free["denied"] + free.get("degraded_denied", 0) == refused
    assert admitted + refused == 600
    exports = rows[("exports", "pro")]
    assert exports["denied"] == 0
    assert exports["allowed"] <= 50
    # The per-instance counters admit exactly four times the limit, as README shows,
    # whatever second of the wall clock's minute the demo runs at.
    naive = re.search(r"per-instance in-memory counter\s+(\d+)\s+(\d+)\s+([\d.]+x)\s+([\d ]+)", out)
    assert naive is not None, out
    assert naive.group(1, 2, 3) == ("400", "200", "4.0x")
    assert naive.group(4).split() == ["100"] * 4
    assert sum(exports.values()) == 60
    assert exports["shadow_denied"] >= 60 - 50 - exports.get("degraded_allowed", 0)
    pro = rows[("api", "pro")]
    assert pro["allowed"] + pro.get("degraded_allowed", 0) == 2 * 60
    assert "(api pro has 2 rates, 1000/1m, 20000/1h: each request is counted once per rate)" in out


@pytest.fixture
def dashboard_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    """examples/fleet_dashboard.py, imported as the script imports its neighbours."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import fleet_dashboard

    return fleet_dashboard


def test_the_picture_draws_each_panel_of_the_dashboard(dashboard_module: Any) -> None:
    """Every panel of examples/grafana-dashboard.json has its drawing in the script that
    renders docs/dashboard.png, and nothing else is drawn."""
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text(encoding="utf-8"))
    assert set(dashboard_module.PANELS) == {p["title"] for p in dashboard["panels"]}


def test_the_picture_computes_histogram_quantile_as_prometheus(dashboard_module: Any) -> None:
    """Linear within the bucket the rank falls in; the highest finite bound for a rank in
    the +Inf bucket; NaN with no observations."""
    quantile = dashboard_module.quantile
    bounds = [0.1, 0.2, math.inf]
    assert quantile(0.5, bounds, [10, 20, 20]) == pytest.approx(0.1)
    assert quantile(0.75, bounds, [10, 20, 20]) == pytest.approx(0.15)
    assert quantile(0.99, bounds, [10, 20, 40]) == pytest.approx(0.2)
    assert math.isnan(quantile(0.5, bounds, [0, 0, 0]))


def test_the_picture_renders_from_scrapes_of_a_real_registry(
    dashboard_module: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Two scrapes of a limiter's registry (decisions on a real Redis between them) render
    to a PNG with every panel."""
    import edgegen_policy as policy
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from applimit import Limiter
    from applimit.prometheus import PrometheusObserver

    registry = CollectorRegistry()
    text = (EXAMPLES / "policy.yaml").read_text(encoding="utf-8")
    limiter = Limiter(
        policy.loads(text), redis_url=redis_server.url, observers=[PrometheusObserver(registry)]
    )

    def scrape(t: float) -> dict[str, Any]:
        samples = [
            [sample.name, dict(sample.labels), sample.value]
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples
        ]
        return {"t": t, "instances": [samples]}

    try:
        scrapes = [scrape(0.0)]
        for _ in range(120):
            limiter.hit("api", "mallory", tier="free")
            limiter.hit("exports", "mallory", tier="free")
        scrapes.append(scrape(1.0))
    finally:
        limiter.close()
    out = tmp_path / "dashboard.png"
    dashboard = json.loads((EXAMPLES / "grafana-dashboard.json").read_text(encoding="utf-8"))
    dashboard_module.render(scrapes, dashboard, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
