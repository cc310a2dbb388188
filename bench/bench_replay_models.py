"""How fast the replay's counting models decide: ``python -m bench.bench_replay_models``.

Times N decisions (default one million) through each model of ``edgegen/replay/_models``,
as the replay makes them: for an app model ``peek`` then, when admitted, ``record`` with
its verdict (the two phases of one decision, the arithmetic ``edgegen_policy``'s); for an
edge counter ``hit``. The trace is made before the
clock starts, so only the model is timed: 10,000 identities, Zipf-like popularity (a few
busy identities near or over the limit, many idle ones), about 10,000 requests per second
of log time, and a ``sweep`` once per minute of log time, as the engine runs it.

Prints requests per second per model and the keys held at the end. No figures are kept:
timings on a shared machine say little unless nothing else runs.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Hashable, Sequence, Sized

from edgegen_policy import Algorithm, Rate

from edgegen.replay._models import app_model, rule_counter, worker_counter
from edgegen.replay._types import AppModel, EdgeCounter

START_US = 1_764_547_200 * 1_000_000
IDENTITIES = 10_000
MEAN_GAP_US = 100
SWEEP_EVERY_US = 60 * 1_000_000


def make_trace(count: int, seed: int = 16) -> tuple[list[Hashable], list[int]]:
    """``count`` requests: (identity, time µs), times increasing."""
    rng = random.Random(seed)
    weights = [1 / (rank + 1) for rank in range(IDENTITIES)]
    keys: list[Hashable] = list(rng.choices(range(IDENTITIES), weights=weights, k=count))
    times: list[int] = []
    now = START_US
    for _ in range(count):
        now += int(rng.expovariate(1 / MEAN_GAP_US))
        times.append(now)
    return keys, times


def time_app(model: AppModel, keys: Sequence[Hashable], times: Sequence[int]) -> tuple[float, int]:
    """Seconds for every decision through ``model``, and how many it admitted."""
    peek, record, sweep = model.peek, model.record, model.sweep
    admitted = 0
    next_sweep = times[0] + SWEEP_EVERY_US
    started = time.perf_counter()
    for key, now in zip(keys, times, strict=True):
        if now >= next_sweep:
            sweep(now)
            next_sweep = now + SWEEP_EVERY_US
        verdict = peek(key, now, 1)
        if verdict.allowed:
            record(key, verdict, now, 1)
            admitted += 1
    return time.perf_counter() - started, admitted


def time_edge(
    counter: EdgeCounter, keys: Sequence[Hashable], times: Sequence[int]
) -> tuple[float, int]:
    """Seconds for every request through ``counter``, and how many it let pass."""
    hit, sweep = counter.hit, counter.sweep
    passed = 0
    next_sweep = times[0] + SWEEP_EVERY_US
    started = time.perf_counter()
    for key, now in zip(keys, times, strict=True):
        if now >= next_sweep:
            sweep(now)
            next_sweep = now + SWEEP_EVERY_US
        if not hit(key, now):
            passed += 1
    return time.perf_counter() - started, passed


RATE = Rate.parse("100/1m")
APP_MODELS: list[tuple[str, Callable[[], AppModel]]] = [
    ("app gcra 100/1m", lambda: app_model(Algorithm.GCRA, RATE, None)),
    ("app sliding_window 100/1m", lambda: app_model(Algorithm.SLIDING_WINDOW, RATE, None)),
    ("app sliding_log 100/1m", lambda: app_model(Algorithm.SLIDING_LOG, RATE, None)),
]
EDGE_COUNTERS: list[tuple[str, Callable[[], EdgeCounter]]] = [
    ("rule 100/60s, block 600s", lambda: rule_counter(60, 100, 600, "block")),
    ("worker binding 100/60s", lambda: worker_counter(100, 60)),
]


def _row(label: str, requests: int, seconds: float, passed: int, model: object) -> str:
    held = f"{len(model):,}" if isinstance(model, Sized) else "?"
    return f"{label:<28} {requests / seconds:>12,.0f} {passed:>9,} {held:>10}"


def main(argv: Sequence[str] | None = None) -> int:
    """Time every model on one generated trace and print a table."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_replay_models")
    parser.add_argument("-n", "--requests", type=int, default=1_000_000, help="decisions per model")
    args = parser.parse_args(argv)
    keys, times = make_trace(args.requests)
    print(f"{args.requests:,} requests, {IDENTITIES:,} identities, one model at a time")
    print(f"{'model':<28} {'requests/s':>12} {'passed':>9} {'keys held':>10}")
    for label, make_app in APP_MODELS:
        app = make_app()
        seconds, passed = time_app(app, keys, times)
        print(_row(label, args.requests, seconds, passed, app))
    for label, make_edge in EDGE_COUNTERS:
        edge = make_edge()
        seconds, passed = time_edge(edge, keys, times)
        print(_row(label, args.requests, seconds, passed, edge))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
