"""examples/grafana-dashboard.json: a valid Grafana dashboard whose every PromQL expression
reads metrics (and labels) that applimit.prometheus really exports, taken from the
exposition of a registry after real decisions on a real redis-server: allowed, denied,
shadow, degraded, answered locally, approximate syncs and overshoot."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from harness import RedisServer
from limiter_support import TestClock
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from applimit import Limiter, Outcome
from applimit.prometheus import PrometheusObserver

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana-dashboard.json"

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: dash, timeout: 2s, on_redis_error: allow}
limits:
  - name: api
    app: {algorithm: sliding_log, tiers: {free: 2/1h, pro: 100/1h}}
  - name: trial
    app: {algorithm: gcra, enforce: false, tiers: {free: 1/1h, pro: 1/1h}}
  - name: events
    app:
      algorithm: sliding_log
      mode: approximate
      sync_every: 10
      tiers: {free: 20/1h, pro: 20/1h}
"""

# Labels Prometheus adds to every scraped series, and the histogram's bucket bound.
ADDED_LABELS = {"instance", "job"}


def load_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana would import it."""
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    found = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    found += [v["definition"] for v in dashboard["templating"]["list"]]
    return found


@pytest.fixture(scope="module")
def exported(redis_server: RedisServer) -> dict[str, set[str]]:
    """Sample names -> their label names, from the exposition of a registry after real
    decisions of every kind."""
    return _exposition(redis_server.url)


def _exposition(url: str) -> dict[str, set[str]]:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    loaded = policy.loads(POLICY)
    clock = TestClock()
    who = f"user-{uuid.uuid4()}"
    limiters = [
        Limiter(loaded, redis_url=url, observers=[observer], test_clock=clock) for _ in range(3)
    ]
    down = Limiter(loaded, redis_url="redis://127.0.0.1:1/0", observers=[observer])
    try:
        for _ in range(4):
            limiters[0].hit("api", who)  # allowed, then denied, then from the denial cache
            limiters[0].hit("trial", who)  # shadow_denied after the first
        for i in range(90):
            limiters[i % 3].hit("events", who)  # syncs, local answers, overshoot
        down.hit("api", who)  # degraded_allowed; the breaker counts the failure
    finally:
        for limiter in (*limiters, down):
            limiter.close()
    text = generate_latest(registry).decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_the_decisions_behind_the_names_covered_every_series(
    exported: dict[str, set[str]],
) -> None:
    """The exposition the other tests check against has a sample of every metric."""
    assert {
        "applimit_decisions_total",
        "applimit_local_answers_total",
        "applimit_approx_syncs_total",
        "applimit_approx_overshoot_total",
        "applimit_redis_duration_seconds_bucket",
        "applimit_breaker_state",
    } <= set(exported)


def test_every_expression_reads_exported_metrics_and_labels(
    exported: dict[str, set[str]],
) -> None:
    """Each metric an expression names is exported, and each label it selects, groups by
    or reads is one the metric has (or one Prometheus adds on scrape)."""
    used: set[str] = set()
    for expr in expressions(load_dashboard()):
        assert expr.count("(") == expr.count(")"), expr
        assert expr.count("{") == expr.count("}"), expr
        metrics = re.findall(r"\b(applimit_[a-z_]+)\b", expr)
        assert metrics, expr
        used.update(metrics)
        labels: set[str] = set()
        for metric in metrics:
            assert metric in exported, f"{metric} (in {expr!r}) is not exported"
            labels |= exported[metric]
        for matchers in re.findall(r"applimit_[a-z_]+\{([^}]*)\}", expr):
            for name in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers):
                assert name in labels | ADDED_LABELS, f"label {name!r} in {expr!r}"
        for grouped in re.findall(r"\bby \(([^)]*)\)", expr):
            for name in (n.strip() for n in grouped.split(",")):
                assert name in labels | ADDED_LABELS, f"label {name!r} in {expr!r}"
        for values in re.findall(r'outcome(?:=~|=)"([^"]*)"', expr):
            for value in values.split("|"):
                assert value in {o.value for o in Outcome}, f"outcome {value!r} in {expr!r}"
    # Every metric the exporter documents has a panel.
    assert {
        "applimit_decisions_total",
        "applimit_local_answers_total",
        "applimit_approx_syncs_total",
        "applimit_approx_overshoot_total",
        "applimit_redis_duration_seconds_bucket",
        "applimit_breaker_state",
    } <= used


def test_the_file_is_a_grafana_dashboard_with_a_datasource_input() -> None:
    """The JSON model Grafana imports: a ${DS_PROMETHEUS} input used by every panel,
    target and variable; unique panel ids and refIds; panels on the 24-column grid; the
    variables the expressions use are defined."""
    dashboard = load_dashboard()
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"]
    (source,) = dashboard["__inputs"]
    assert source["name"] == "DS_PROMETHEUS"
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    datasource = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({p["title"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == datasource
    for panel in panels:
        assert panel["type"] in {"timeseries", "state-timeline", "stat"}
        assert panel["datasource"] == datasource
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h"))
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and refs
        for target in panel["targets"]:
            assert target["datasource"] == datasource
            for name in re.findall(r"\$(?!__)([a-z_]+)", target["expr"]):
                assert name in variables, f"${name} in panel {panel['title']!r}"
