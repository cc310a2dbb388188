"""Replay throughput: recorded requests per second through ``edgegen replay``, and its
peak memory.

Generated traffic (``bench/traffic.py``: the example policy's API, a diurnal day with
abusive clients, seed 1) is replayed in fresh processes, each measured on its own:

- *engine, one algorithm*: a policy with one app limit over the whole API (``/api/``,
  100/1m in every tier) in each algorithm, app layer only, records already in memory (so
  only the engine and the model are timed): the issue's ">= 100,000 requests per second
  through the app layer with gcra and sliding_window";
- *engine, every layer*: the example policy (rules, Worker and six app limits), records in
  memory;
- *from a file*: the same, reading a gzip-compressed file as the CLI does (NDJSON with named
  columns, and Cloudflare Logpush), streaming, in one process and with the parsing in a
  second process (the CLI's default for large files): what a user waits for, and the peak
  memory (the replaying process's maximum resident set, which here holds no list of
  records);
- *a day*: one day of a 100 req/s API (8.6 million requests) from a Logpush file, end to
  end, against the issue's "under two minutes". It runs in a full run only; the generated
  files are cached under ``bench/results/cache/`` (generating a day takes minutes).

A replay has no reference to compare with side by side, so these are rates, not ratios:
read them with the load average the report states.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import edgegen_policy as policy

from edgegen.replay._engine import Replay, ReplayLayer, ReplayOptions
from edgegen.traffic._options import TrafficOptions
from edgegen.traffic._pipe import open_traffic

from ._common import ROOT, Result, Settings, Table, Target
from .traffic import generate

NAME = "replay"
TITLE = "Replay: recorded requests per second, and peak memory"

RECORDS = 1_000_000
DAY_SECONDS = 86_400
DAY_RATE = 100.0
CACHE = ROOT / "bench" / "results" / "cache"
APP_TARGET = 100_000.0
DAY_TARGET_SECONDS = 120.0

ONE_LIMIT = """
version: 1
tiers: [free, pro, enterprise]
limits:
  - name: api
    match: {{ path_prefix: /api/ }}
    app:
      algorithm: {algorithm}
      tiers: {{ free: 100/1m, pro: 100/1m, enterprise: 100/1m }}
"""


def _generated(seconds: int, rate: float, fmt: str, quick: bool) -> Path:
    """A generated traffic file, cached by its parameters."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"traffic-{seconds}s-{rate:g}-{fmt}{'-quick' if quick else ''}.gz"
    if not path.exists():
        partial = path.with_name(path.name + ".part.gz")  # .gz: the writer compresses
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.traffic",
                "--seconds",
                str(seconds),
                "--rate",
                str(rate),
                "--format",
                fmt,
                "--out",
                str(partial),
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        partial.rename(path)
    return path


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    if job["policy"] == "example":
        loaded = policy.load(ROOT / "examples" / "policy.yaml")
        options = ReplayOptions()
    else:
        loaded = policy.loads(ONE_LIMIT.format(algorithm=job["policy"]))
        options = ReplayOptions(layers=frozenset({ReplayLayer.APP}))
    engine = Replay(loaded, options)
    feed = engine.feed
    if job["source"] == "memory":
        seconds = job["seconds"]
        records = list(generate(seed=1, seconds=seconds, rate_per_s=job["rate"]))
        started = time.perf_counter()
        for record in records:
            feed(record)
        elapsed = time.perf_counter() - started
    else:
        when = loaded.authenticated_when
        reading = TrafficOptions(
            user_from=job.get("user_from"),
            authenticated_headers=tuple(when.headers),
            authenticated_cookies=tuple(when.cookies),
        )
        started = time.perf_counter()
        with open_traffic([job["source"]], reading, background=job["background"]) as traffic:
            for record in traffic:
                feed(record)
        elapsed = time.perf_counter() - started
    result = engine.result()
    return {
        "records": result.requests,
        "refused": result.requests - result.admitted,
        "seconds": elapsed,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def _measure(job: dict[str, Any]) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.bench_replay", json.dumps(job)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def _row(label: str, measured: dict[str, Any]) -> list[str]:
    rate = measured["records"] / measured["seconds"]
    return [
        label,
        f"{measured['records']:,}",
        f"{measured['seconds']:.1f} s",
        f"{rate:,.0f}",
        f"{measured['max_rss_kib'] / 1024:,.0f} MiB",
    ]


def run(settings: Settings) -> Result:
    """Every measurement once (each is long enough to be steady), in fresh processes."""
    quick = settings.quick
    # Records per measurement: a million in a full run (the minimum).
    seconds = 600 if quick else round(RECORDS / DAY_RATE * 2.0)
    jobs: list[tuple[str, dict[str, Any]]] = [
        (
            f"engine, app layer, {algorithm}",
            {"policy": algorithm, "source": "memory", "seconds": seconds, "rate": DAY_RATE},
        )
        for algorithm in ("gcra", "sliding_window", "sliding_log")
    ]
    jobs.append(
        (
            "engine, every layer, example policy",
            {"policy": "example", "source": "memory", "seconds": seconds, "rate": DAY_RATE},
        )
    )
    for fmt, user_from in (("ndjson", None), ("logpush", "header:x-user")):
        path = _generated(seconds, DAY_RATE, fmt, quick)
        for background in (False, True):
            how = "parsed in a second process" if background else "in one process"
            jobs.append(
                (
                    f"from a gzip {fmt} file, every layer, {how}",
                    {
                        "policy": "example",
                        "source": str(path),
                        "user_from": user_from,
                        "background": background,
                    },
                )
            )
    if not quick:
        day = _generated(DAY_SECONDS, DAY_RATE, "logpush", quick)
        jobs.append(
            (
                "a day (100 req/s) from a gzip Logpush file, every layer",
                {
                    "policy": "example",
                    "source": str(day),
                    "user_from": "header:x-user",
                    "background": True,
                },
            )
        )
    measured = {label: _measure(job) for label, job in jobs}
    rows = [_row(label, values) for label, values in measured.items()]
    app_rates = [
        measured[f"engine, app layer, {a}"]["records"]
        / measured[f"engine, app layer, {a}"]["seconds"]
        for a in ("gcra", "sliding_window")
    ]
    targets = [
        Target(
            key="replay_app",
            text="Replay through the app layer, gcra and sliding_window (the slower)",
            measured=min(app_rates),
            threshold=APP_TARGET,
            unit="req/s",
            short="replay app",
        )
    ]
    day_label = "a day (100 req/s) from a gzip Logpush file, every layer"
    targets.append(
        Target(
            key="replay_day",
            text="One day of a 100 req/s API from a file, every layer",
            measured=measured[day_label]["seconds"] if day_label in measured else None,
            threshold=DAY_TARGET_SECONDS,
            higher_is_better=False,
            unit="s",
            short="replay day",
            note="" if day_label in measured else "full runs only",
        )
    )
    return Result(
        name=NAME,
        title=TITLE,
        summary="Generated traffic replayed in fresh processes; rates in records per second.",
        params={"records_per_measurement": seconds * DAY_RATE, "day_seconds": DAY_SECONDS},
        data={"measured": measured},
        tables=[
            Table(
                title="Replay throughput",
                columns=["what", "records", "time", "records/s", "peak memory"],
                rows=rows,
                note="Peak memory is the process's maximum resident set; for the in-memory "
                "rows it includes the list of records.",
            )
        ],
        targets=targets,
    )


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
