"""docs/dashboard.png: the panels of examples/grafana-dashboard.json, drawn from real
samples of the fleet demo's /metrics.

It starts what ``make demo``'s fleet runs (one redis-server, four instances of
examples/fastapi_app.py), sends a minute of mixed traffic to the instances in turn (as the
demo's round-robin front does, without the front's extra hop, which would slow the
traffic on a small machine) while it reads every instance's ``/metrics`` once a second,
pauses
Redis for a few seconds on the way (SIGSTOP, then SIGCONT: an outage), and draws each
panel of the Grafana dashboard with matplotlib from those samples, computing what the
panel's PromQL computes (rates over a few samples, ratios, ``histogram_quantile``)::

    .venv/bin/python examples/fleet_dashboard.py                   # about 90 s
    .venv/bin/python examples/fleet_dashboard.py --samples s.json  # also keep the samples
    .venv/bin/python examples/fleet_dashboard.py --from-samples s.json   # draw again only

The instances run examples/policy.yaml with one change: its ``events`` limit (approximate
mode) matches ``/events`` instead of ``/api/events`` and allows the free tier 10/1s with
``sync_interval: 1s``. Under ``/api/`` every events request also meets the exact ``api``
limit, and a request that meets an exact limit is decided exactly, so the approximate
panels would stay empty.

The traffic, per second, for ``DURATION`` seconds: alice (free) 4 requests to /api/items
(refused after her 100 a minute) and 16 to /events (over its 10/1s: approximate mode
syncs, answers locally and overshoots); bob (pro) 5 to /api/items and 2 exports (the
shadow limit refuses none, but counts); carol (enterprise) 3 searches; an anonymous
caller 1 to /api/items. Each instance first answers a few requests, so that the picture
starts warm (connections open, scripts loaded). Redis is paused from ``OUTAGE[0]`` to
``OUTAGE[1]`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import fleet_demo
import httpx
import yaml
from fleet_demo import HERE, INSTANCES, POLICY, DemoError, Samples, scrape

DASHBOARD = HERE / "grafana-dashboard.json"
OUT = HERE.parent / "docs" / "dashboard.png"
DURATION = 60.0
SCRAPE_EVERY = 1.0
OUTAGE = (32.0, 38.0)
# Samples a rate spans: Grafana's $__rate_interval is at least four scrape intervals.
RATE_SPAN = 4

# (who, path, requests per second); keys of examples/fastapi_app.py.
TRAFFIC: tuple[tuple[str | None, str, float], ...] = (
    ("key-alice", "/api/items", 4.0),
    ("key-alice", "/events", 16.0),
    ("key-bob", "/api/items", 5.0),
    ("key-bob", "/api/v1/exports/monthly", 2.0),
    ("key-carol", "/api/search", 3.0),
    (None, "/api/items", 1.0),
)

# One scrape: seconds since the start, and each instance's samples as
# [name, {label: value}, value] lists (JSON-friendly).
Scrape = dict[str, Any]


# --- collecting ---------------------------------------------------------------------------


def demo_policy(workdir: Path) -> Path:
    """examples/policy.yaml with the events limit moved off /api/ (see the docstring)."""
    document = yaml.safe_load(POLICY.read_text(encoding="utf-8"))
    for limit in document["limits"]:
        if limit["name"] == "events":
            limit["match"] = {"paths": ["/events"], "methods": ["GET"]}
            limit["app"]["sync_interval"] = "1s"
            limit["app"]["tiers"]["free"] = "10/1s"
    path = workdir / "dashboard-policy.yaml"
    # Environment references (${REDIS_URL:-...}) stay as text: the loader expands them.
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _as_json(samples: Samples) -> list[list[Any]]:
    return [[name, dict(labels), value] for (name, labels), value in samples.items()]


async def _traffic(backends: Sequence[str], started: float, stop_at: float) -> int:
    """Send TRAFFIC to the instances in turn at its rates until ``stop_at``; the count
    sent."""
    sent = 0
    tasks: set[asyncio.Task[None]] = set()
    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=64)) as client:

        async def one(base: str, key: str | None, path: str) -> None:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            try:
                await client.get(f"{base}{path}", headers=headers)
            except httpx.HTTPError:
                # A request lost under load changes no metric the picture draws.
                return

        async def stream(first: int, key: str | None, path: str, rate: float) -> None:
            nonlocal sent
            n = 0
            while True:
                # Requests go out on a schedule, not after the previous answer, so an
                # outage does not slow the traffic down.
                due = started + n / rate
                if due >= stop_at:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                base = backends[(first + n) % len(backends)]
                task = asyncio.create_task(one(base, key, path))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                n += 1

        await asyncio.gather(
            *(stream(i, key, path, rate) for i, (key, path, rate) in enumerate(TRAFFIC))
        )
        if tasks:
            await asyncio.gather(*tasks)
    return sent


async def _scraper(
    backends: Sequence[str], started: float, stop_at: float, redis_pid: int
) -> list[Scrape]:
    """Read every instance's /metrics each SCRAPE_EVERY seconds; pause Redis for OUTAGE."""
    scrapes: list[Scrape] = []
    paused = False
    n = 0
    try:
        while True:
            due = started + n * SCRAPE_EVERY
            if due > stop_at + SCRAPE_EVERY:
                return scrapes
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic() - started
            if not paused and OUTAGE[0] <= now < OUTAGE[1]:
                os.kill(redis_pid, signal.SIGSTOP)
                paused = True
            elif paused and now >= OUTAGE[1]:
                os.kill(redis_pid, signal.SIGCONT)
                paused = False
            instances = await asyncio.gather(
                *(asyncio.to_thread(scrape, base) for base in backends)
            )
            scrapes.append({"t": now, "instances": [_as_json(s) for s in instances]})
            n += 1
    finally:
        if paused:
            os.kill(redis_pid, signal.SIGCONT)


async def _warm_up(backends: Sequence[str]) -> None:
    """A few decisions per instance before the clock starts: connections opened and
    scripts loaded, so the first seconds show the fleet as it runs, not as it starts."""
    headers = {"Authorization": "Bearer key-carol"}
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(5):
            await asyncio.gather(
                *(client.get(f"{base}/api/search", headers=headers) for base in backends)
            )


async def _run_traffic(backends: Sequence[str], redis_pid: int) -> list[Scrape]:
    await _warm_up(backends)
    started = time.monotonic()
    stop_at = started + DURATION
    scrapes, sent = await asyncio.gather(
        _scraper(backends, started, stop_at, redis_pid), _traffic(backends, started, stop_at)
    )
    print(f"   {sent} requests sent, {len(scrapes)} scrapes of {len(backends)} instances")
    return scrapes


def collect() -> list[Scrape]:
    """Run the fleet and its traffic; the scrapes (every process is stopped after)."""
    binary = fleet_demo.find_redis_server()
    with tempfile.TemporaryDirectory(prefix="applimit-dashboard-") as workdir:
        fleet_demo._LOG_DIR[:] = [Path(workdir)]
        try:
            redis_url, redis_proc = fleet_demo.start_redis(binary, Path(workdir))
            env = {"REDIS_URL": redis_url, "RATE_LIMIT_POLICY": str(demo_policy(Path(workdir)))}
            waiters = [
                fleet_demo.start_uvicorn("fastapi_app:create_app", env) for _ in range(INSTANCES)
            ]
            backends = [wait() for wait in waiters]
            print(
                f"== {INSTANCES} instances; {DURATION:.0f} s of traffic, Redis paused from "
                f"{OUTAGE[0]:.0f} s to {OUTAGE[1]:.0f} s"
            )
            return asyncio.run(_run_traffic(backends, redis_proc.pid))
        finally:
            fleet_demo._stop_children()


# --- what the panels compute ---------------------------------------------------------------

Labels = dict[str, str]


class Series:
    """The scrapes as time series: a metric's samples summed by some labels."""

    def __init__(self, scrapes: Sequence[Scrape]) -> None:
        """Index the scrapes."""
        self.times = [float(s["t"]) for s in scrapes]
        self.scrapes = scrapes

    def summed(
        self,
        name: str,
        by: Sequence[str],
        where: Callable[[Labels], bool] = lambda labels: True,
    ) -> dict[tuple[str, ...], list[float]]:
        """``sum by (by) (name{where})`` at each scrape; ``instance`` (as Prometheus adds
        it on scrape) may be in ``by``."""
        out: dict[tuple[str, ...], list[float]] = {}
        for index, scrape_ in enumerate(self.scrapes):
            for number, samples in enumerate(scrape_["instances"]):
                for sample_name, labels, value in samples:
                    if sample_name != name or not where(labels):
                        continue
                    scraped = {**labels, "instance": f"instance-{number + 1}"}
                    key = tuple(scraped.get(b, "") for b in by)
                    values = out.setdefault(key, [0.0] * len(self.scrapes))
                    values[index] += float(value)
        return out

    def rate(self, values: Sequence[float]) -> list[float]:
        """Per-second increase over the last RATE_SPAN samples (NaN before there are any)."""
        rates = []
        for i, value in enumerate(values):
            j = max(0, i - RATE_SPAN)
            span = self.times[i] - self.times[j]
            rates.append((value - values[j]) / span if span > 0 else math.nan)
        return rates

    def rates(
        self, name: str, by: Sequence[str], where: Callable[[Labels], bool] = lambda _: True
    ) -> dict[tuple[str, ...], list[float]]:
        """``sum by (by) (rate(name{where}[...]))``, series that never move left out."""
        out = {}
        for key, values in self.summed(name, by, where).items():
            rates = self.rate(values)
            if any(r > 0 for r in rates if not math.isnan(r)):
                out[key] = rates
        return out


def quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus' ``histogram_quantile``: cumulative ``counts`` per upper bound (the last
    +Inf), linear within the bucket the rank falls in."""
    total = counts[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    index = bisect.bisect_left(counts, rank)
    if index >= len(bounds) - 1:
        # In the +Inf bucket: the highest finite bound, as Prometheus answers.
        return bounds[-2]
    lower = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    inside = counts[index] - below
    if inside <= 0:
        return bounds[index]
    return lower + (bounds[index] - lower) * (rank - below) / inside


# --- drawing ---------------------------------------------------------------------------------

Axes = Any


def _is(name: str, *values: str) -> Callable[[Labels], bool]:
    return lambda labels: labels.get(name) in values


def _lines(axes: Axes, times: Sequence[float], series: dict[tuple[str, ...], list[float]]) -> None:
    for key, values in sorted(series.items()):
        axes.plot(times, values, label=" ".join(key), linewidth=1.4)


def decisions_by_outcome(axes: Axes, data: Series) -> None:
    """Panel 1: results per second by limit, tier and outcome, stacked."""
    series = data.rates("applimit_decisions_total", ("limit", "tier", "outcome"))
    keys = sorted(series)
    values = [[0.0 if math.isnan(v) else v for v in series[k]] for k in keys]
    if values:
        # Twenty colours: one per series, where the default ten would repeat.
        import matplotlib

        palette = matplotlib.colormaps["tab20"]
        axes.stackplot(
            data.times,
            values,
            labels=[" ".join(k) for k in keys],
            colors=[palette(i % 20) for i in range(len(keys))],
            alpha=0.9,
        )
    axes.set_ylabel("results/s")


def refusal_rate(axes: Axes, data: Series) -> None:
    """Panel 2: refused results over all results, per tier."""
    refused = data.rates(
        "applimit_decisions_total", ("tier",), _is("outcome", "denied", "degraded_denied")
    )
    every = data.rates("applimit_decisions_total", ("tier",))
    ratios = {
        key: [
            r / a if a and not math.isnan(a) else math.nan
            for r, a in zip(values, every[key], strict=True)
        ]
        for key, values in refused.items()
    }
    _lines(axes, data.times, ratios)
    axes.set_ylim(0, 1)
    axes.yaxis.set_major_formatter(_percent())


def _percent() -> Any:
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(1.0)


def shadow(axes: Axes, data: Series) -> None:
    """Panel 3: would-be refusals of shadow limits."""
    _lines(
        axes,
        data.times,
        data.rates("applimit_decisions_total", ("limit", "tier"), _is("outcome", "shadow_denied")),
    )
    axes.set_ylabel("results/s")


def degraded(axes: Axes, data: Series) -> None:
    """Panel 4: results decided by on_redis_error."""
    where = _is("outcome", "degraded_allowed", "degraded_denied")
    _lines(axes, data.times, data.rates("applimit_decisions_total", ("limit", "outcome"), where))
    axes.set_ylabel("results/s")


def breaker(axes: Axes, data: Series) -> None:
    """Panel 5: 0 closed, 1 half open, 2 open, per instance and node."""
    by = ("instance", "node")
    opened = data.summed("applimit_breaker_state", by, _is("state", "open"))
    half = data.summed("applimit_breaker_state", by, _is("state", "half_open"))
    for index, key in enumerate(sorted(opened)):
        values = [2 * o + h for o, h in zip(opened[key], half[key], strict=True)]
        # A small offset per instance keeps overlapping steps apart.
        shifted = [v + 0.04 * index for v in values]
        axes.step(data.times, shifted, where="post", label=" ".join(key), linewidth=1.4)
    axes.set_yticks([0, 1, 2], ["closed", "half open", "open"])
    axes.set_ylim(-0.2, 2.4)


def latency(axes: Axes, data: Series) -> None:
    """Panel 6: histogram_quantile of the Redis call durations, over every instance."""
    buckets = data.summed("applimit_redis_duration_seconds_bucket", ("le",))
    bounds = sorted(buckets, key=lambda key: float(key[0]))
    finite = [float(key[0]) for key in bounds]
    rates = [data.rate(buckets[key]) for key in bounds]
    for q in (0.5, 0.9, 0.99):
        values = []
        for i in range(len(data.times)):
            counts = [r[i] for r in rates]
            values.append(
                math.nan if any(math.isnan(c) for c in counts) else quantile(q, finite, counts)
            )
        axes.plot(data.times, [v * 1000 for v in values], label=f"p{round(q * 100)}", linewidth=1.4)
    axes.set_ylabel("ms")


def local_answers(axes: Axes, data: Series) -> None:
    """Panel 7: results answered without Redis."""
    _lines(axes, data.times, data.rates("applimit_local_answers_total", ("limit", "tier")))
    axes.set_ylabel("results/s")


def approximate(axes: Axes, data: Series) -> None:
    """Panel 8: approximate-mode syncs and overshoot."""
    syncs = data.rates("applimit_approx_syncs_total", ("limit", "tier"))
    over = data.rates("applimit_approx_overshoot_total", ("limit", "tier"))
    _lines(axes, data.times, {("syncs", *k): v for k, v in syncs.items()})
    _lines(axes, data.times, {("overshoot", *k): v for k, v in over.items()})
    axes.set_ylabel("per second")


# Each panel of the dashboard, by title, and what draws it here.
PANELS: dict[str, Callable[[Axes, Series], None]] = {
    "Decisions by outcome": decisions_by_outcome,
    "Refusal rate per tier": refusal_rate,
    "Shadow limits: would-be refusals": shadow,
    "Degraded decisions": degraded,
    "Circuit breaker state per node": breaker,
    "Redis call latency": latency,
    "Local answers": local_answers,
    "Approximate mode: syncs and overshoot": approximate,
}


def render(scrapes: Sequence[Scrape], dashboard: dict[str, Any], out: Path) -> None:
    """Draw every panel of ``dashboard`` in its grid order into the PNG ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    missing = [p["title"] for p in panels if p["title"] not in PANELS]
    if missing:
        raise DemoError(f"no drawing for the dashboard panels {missing}; add them to PANELS")
    data = Series(scrapes)
    rows = math.ceil(len(panels) / 2)
    figure, grid = plt.subplots(rows, 2, figsize=(16, 3.4 * rows), sharex=True)
    for axes, panel in zip(grid.flat, panels, strict=False):
        PANELS[panel["title"]](axes, data)
        axes.set_title(panel["title"], loc="left", fontsize=11, fontweight="bold")
        axes.axvspan(*OUTAGE, color="#d62728", alpha=0.08, linewidth=0)
        axes.grid(True, alpha=0.3)
        axes.margins(x=0)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        else:
            axes.text(0.5, 0.5, "no data", transform=axes.transAxes, ha="center", color="grey")
    for axes in grid[-1]:
        axes.set_xlabel("seconds (Redis paused in the shaded span)")
    figure.suptitle(
        f"{dashboard['title']}: {INSTANCES} instances of examples/fastapi_app.py, one minute of "
        "traffic, real /metrics samples",
        fontsize=13,
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=90)
    plt.close(figure)


def main(argv: Iterable[str] | None = None) -> int:
    """Collect (or read) the samples and draw the PNG; 1 with a message on failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
    parser.add_argument("--samples", type=Path, help="also write the scrapes to this JSON file")
    parser.add_argument("--from-samples", type=Path, help="draw from scrapes written before")
    args = parser.parse_args(list(argv) if argv is not None else None)
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    try:
        if args.from_samples is not None:
            scrapes = json.loads(args.from_samples.read_text(encoding="utf-8"))
        else:
            scrapes = collect()
        if args.samples is not None:
            args.samples.write_text(json.dumps(scrapes), encoding="utf-8")
        render(scrapes, dashboard, args.out)
    except DemoError as exc:
        print(f"fleet dashboard: {exc}", file=sys.stderr)
        return 1
    print(f"   wrote {args.out}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
