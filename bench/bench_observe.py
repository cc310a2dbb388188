"""Observers: ``hit()`` with the Prometheus observer on, against the same limiter without it.

Variants, interleaved in every round:

- ``sync_off`` / ``sync_on``: one thread, one connection, ``Limiter.hit()`` of a GCRA
  limit, by a limiter without observers and by one with a ``PrometheusObserver`` (its own
  registry), on the same Redis.
- ``async_off`` / ``async_on``: the same with ``AsyncLimiter``, 64 coroutines on one event
  loop (the event loop's CPU is the bottleneck there, so an observer's cost shows most).

Every decision admits (a thousand identities at 1000 per minute each), so every hit goes
to Redis and the observer counts one result per decision plus the latency histogram.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from applimit import AsyncLimiter, Decision, Limiter
from applimit.prometheus import PrometheusObserver

from ._common import (
    Identities,
    LimitSpec,
    Result,
    Runner,
    Settings,
    Table,
    Target,
    Variant,
    fmt_rate,
    fmt_ratio,
    interleave,
    make_policy,
    median,
    quartiles,
    ratios,
    redis_server,
    sync_loop,
)

NAME = "observe"
TITLE = "Observers: hit() with the Prometheus observer on and off"

ALGORITHM = "gcra"
RATE = "1000/1m"
IDENTITIES = 1000
CALLERS = 64
TARGET = 0.95


def _sync_step(limiter: Limiter, ids: Identities) -> Callable[[], None]:
    def step() -> None:
        decision = limiter.hit(ALGORITHM, ids())
        if not decision.allowed:
            raise RuntimeError("a denial: the comparison needs every decision to admit")

    return step


def _async_runner(
    loop: asyncio.Runner, hit: Callable[[str], Awaitable[Decision]], ids: Identities
) -> Runner:
    """CALLERS coroutines calling ``hit`` until the slice is over."""

    async def caller(deadline: float) -> int:
        done = 0
        while time.perf_counter() < deadline:
            decision = await hit(ids())
            if not decision.allowed:
                raise RuntimeError("a denial: the comparison needs every decision to admit")
            done += 1
        return done

    async def burst(seconds: float) -> int:
        deadline = time.perf_counter() + seconds
        return sum(await asyncio.gather(*(caller(deadline) for _ in range(CALLERS))))

    def run(seconds: float) -> int:
        return loop.run(burst(seconds))

    return run


def _async_hit(limiter: AsyncLimiter) -> Callable[[str], Awaitable[Decision]]:
    def hit(identity: str) -> Awaitable[Decision]:
        return limiter.hit(ALGORITHM, identity)

    return hit


def run(settings: Settings) -> Result:
    """Measure the four variants interleaved; the targets are on / off, sync and async."""
    started = time.perf_counter()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            "`hit()` per second with a `PrometheusObserver` attached and without one, side "
            f"by side in the same run: sync (one thread, one connection) and async "
            f"({CALLERS} coroutines on one event loop), a {ALGORITHM} limit of {RATE}."
        ),
        params={"rate": RATE, "identities": IDENTITIES, "callers": CALLERS},
    )
    with redis_server() as server, asyncio.Runner() as loop:
        pol = make_policy(server.url, [LimitSpec(ALGORITHM, ALGORITHM, RATE)])
        sync_off = Limiter(pol, redis_url=server.url)
        sync_on = Limiter(
            pol, redis_url=server.url, observers=[PrometheusObserver(CollectorRegistry())]
        )
        async_off = AsyncLimiter(pol, redis_url=server.url)
        async_on = AsyncLimiter(
            pol, redis_url=server.url, observers=[PrometheusObserver(CollectorRegistry())]
        )
        try:
            variants = [
                Variant(
                    "sync_off",
                    "sync, no observer",
                    sync_loop(_sync_step(sync_off, Identities("s-off", IDENTITIES))),
                ),
                Variant(
                    "sync_on",
                    "sync, Prometheus",
                    sync_loop(_sync_step(sync_on, Identities("s-on", IDENTITIES))),
                ),
                Variant(
                    "async_off",
                    "async, no observer",
                    _async_runner(loop, _async_hit(async_off), Identities("a-off", IDENTITIES)),
                ),
                Variant(
                    "async_on",
                    "async, Prometheus",
                    _async_runner(loop, _async_hit(async_on), Identities("a-on", IDENTITIES)),
                ),
            ]
            result.rates = interleave(variants, settings)
        finally:
            sync_off.close()
            sync_on.close()
            loop.run(async_off.aclose())
            loop.run(async_on.aclose())
    rows: list[list[str]] = []
    for shell in ("sync", "async"):
        on, off = result.rates[f"{shell}_on"], result.rates[f"{shell}_off"]
        share = result.ratios[f"{shell}_on/{shell}_off"] = ratios(on, off)
        rows.append([shell, fmt_rate(median(off)), fmt_rate(median(on)), fmt_ratio(median(share))])
        result.targets.append(
            Target(
                key=f"observe.{shell}",
                text=f"`hit()` {shell} with the Prometheus observer, vs without",
                measured=median(share),
                spread=quartiles(share),
                threshold=TARGET,
                short=f"{shell}: Prometheus on / off",
            )
        )
    result.tables.append(
        Table(
            title="Decisions per second (medians) and on / off (median of per-round ratios)",
            columns=["shell", "no observer", "Prometheus observer", "on / off"],
            rows=rows,
        )
    )
    result.seconds = time.perf_counter() - started
    return result
