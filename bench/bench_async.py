"""Async: 256 concurrent callers on one event loop.

Variants, interleaved in every round, each with 256 coroutines calling in a loop:

- ``limiter``: ``AsyncLimiter.hit()``, as an app would call it (on a standalone server it
  sends the calls of concurrent decisions together, one pipeline per event-loop turn).
- ``baseline``: the same code awaiting one script call per decision (the issue's "one
  EVALSHA"; the limiter's script call is now an FCALL of its library), no pipelining: the
  limiter's own core plans the call (same script, same keys and arguments), one
  ``execute_command`` on a ``redis.asyncio`` client sends it, and the core turns the reply
  into a Decision. If ``AsyncLimiter`` grows an option that switches its batching off
  (see ``BASELINE_OPTIONS``), the baseline is the limiter with that option instead.
- ``batched``: the baseline's calls sent through a minimal batcher (one pipeline per
  event-loop turn, no deadline, no breaker; a few lines below). Not the project: it shows
  what batching alone reaches here, so a gap between it and ``limiter`` is the limiter's
  own overhead, and a gap between it and 3x is the cost of a decision in Python.

The target is ``limiter`` / ``baseline`` >= ``TARGET`` (the first async issue asked for 3x).

Connections: ``redis.asyncio``'s default ``ConnectionPool`` raises ``MaxConnectionsError``
when more coroutines than ``max_connections`` want a connection at once, so the baseline
and the batched variant use ``BlockingConnectionPool`` (callers wait for a free
connection), with the limiter's default ``max_connections`` of 128, as the limiter does.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from applimit import AsyncLimiter, Decision, _script
from applimit._calls import ScriptCall
from applimit._replies import Prepared

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
    server_cpu_seconds,
)

NAME = "async"
TITLE = "Async: 256 concurrent callers on one event loop"

CALLERS = 256
MAX_CONNECTIONS = 128
ALGORITHMS = ("sliding_log", "gcra")
RATE = "1000/1m"
IDENTITIES = 10_000
# Issue 17's target (the first issue set 3x).
TARGET = 8.0
# CPU over wall time above which the event loop, not Redis, sets the pace.
BUSY = 0.8
# Constructor options that, set to False, would make AsyncLimiter await one script call per
# decision: the fairest baseline once auto-pipelining exists.
BASELINE_OPTIONS = ("auto_pipeline", "auto_pipelining", "pipelining", "batching")

Decide = Callable[[str], Awaitable[Decision]]


@dataclass
class Tally:
    """What one variant did over all its slices: decisions, denials, wall and CPU time."""

    decisions: int = 0
    denied: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    # The Redis server's CPU time (user + system) over the same slices.
    server: float = 0.0

    @property
    def cpu_per_decision_us(self) -> float:
        """The process's CPU time per decision, in µs (the event loop's cost of one)."""
        return self.cpu * 1e6 / self.decisions if self.decisions else float("nan")

    @property
    def server_per_decision_us(self) -> float:
        """The Redis server's CPU time per decision, in µs (the script and the I/O)."""
        return self.server * 1e6 / self.decisions if self.decisions else float("nan")

    @property
    def server_busy(self) -> float:
        """The Redis server's CPU time over wall time: near 1, Redis sets the pace."""
        return self.server / self.wall if self.wall else float("nan")

    @property
    def busy(self) -> float:
        """CPU time over wall time: near 1, the event loop is the bottleneck."""
        return self.cpu / self.wall if self.wall else float("nan")


def _runner(
    loop: asyncio.Runner,
    decide: Decide,
    ids: Identities,
    tally: Tally,
    server_cpu: Callable[[], float],
) -> Runner:
    """A runner: CALLERS coroutines calling ``decide`` until the slice is over;
    ``server_cpu`` reads the Redis server's CPU time, before and after each slice."""

    async def caller(deadline: float) -> int:
        done = 0
        while time.perf_counter() < deadline:
            decision = await decide(ids())
            done += 1
            if not decision.allowed:
                tally.denied += 1
        return done

    async def burst(seconds: float) -> int:
        deadline = time.perf_counter() + seconds
        counts = await asyncio.gather(*(caller(deadline) for _ in range(CALLERS)))
        return sum(counts)

    def run(seconds: float) -> int:
        server = server_cpu()
        wall, cpu = time.perf_counter(), time.process_time()
        done = loop.run(burst(seconds))
        tally.wall += time.perf_counter() - wall
        tally.cpu += time.process_time() - cpu
        tally.server += server_cpu() - server
        tally.decisions += done
        return done

    return run


def _pool_client(url: str) -> redis.asyncio.Redis:
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=10
    )
    return redis.asyncio.Redis.from_pool(pool)


def _call_args(call: ScriptCall) -> tuple[Any, ...]:
    """The limiter's own command for ``call``: FCALL of its library's function."""
    return ("FCALL", _script.FUNCTION, len(call.keys), *call.keys, *call.args)


class Batcher:
    """Batching in miniature: the calls made in one event-loop turn share one pipeline."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        """Send through ``client`` (whose pool hands each pipeline a connection)."""
        self._client = client
        self._pending: list[tuple[ScriptCall, asyncio.Future[object]]] = []
        self._flushing: set[asyncio.Task[None]] = set()

    async def call(self, call: ScriptCall) -> object:
        """Queue ``call``; its reply arrives with the rest of its batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        if not self._pending:
            # Flush once every caller that is ready this iteration has queued its call.
            loop.call_soon(self._flush)
        self._pending.append((call, future))
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        # Keep a reference: the loop holds tasks only weakly.
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send(self, batch: list[tuple[ScriptCall, asyncio.Future[object]]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for call, _ in batch:
            pipe.execute_command(*_call_args(call))
        try:
            replies = await pipe.execute(raise_on_error=False)
        except Exception as error:
            for _, future in batch:
                future.set_exception(error)
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)


def _baseline_option() -> str | None:
    """The AsyncLimiter option that switches batching off, if it has one."""
    parameters = inspect.signature(AsyncLimiter.__init__).parameters
    return next((name for name in BASELINE_OPTIONS if name in parameters), None)


def _hits(limiter: AsyncLimiter, name: str) -> Decide:
    """Decide with ``limiter.hit`` on limit ``name``."""

    async def decide(identity: str) -> Decision:
        return await limiter.hit(name, identity)

    return decide


def _via(
    send: Callable[[ScriptCall], Awaitable[object]], limiter: AsyncLimiter, name: str
) -> Decide:
    """Decide like the limiter, sending the planned call with ``send``."""

    async def decide(identity: str) -> Decision:
        prepared: Prepared = limiter.core.for_limit("hit", name, identity, None, 1)
        replies = [await send(call) for call in prepared.calls]
        decision, _ = prepared.decide(replies)
        return decision

    return decide


def run(settings: Settings) -> Result:
    """Measure the limiter, the one-call baseline and hand batching, interleaved."""
    started = time.perf_counter()
    option = _baseline_option()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            f"{CALLERS} coroutines on one event loop calling `AsyncLimiter.hit()` "
            "(`limiter`), against the same code awaiting one script call (FCALL) per decision "
            "(`baseline`: "
            + (
                f"the limiter with `{option}=False`"
                if option
                else "the limiter's core planning the call, one `execute_command` on "
                "redis.asyncio sending it"
            )
            + ") and against the same calls sent through a minimal batcher, one pipeline "
            "per event-loop turn (`batched`, not the project: what batching alone "
            "reaches here). Baseline and batched use a `BlockingConnectionPool` of "
            f"{MAX_CONNECTIONS} (the default pool raises MaxConnectionsError with "
            f"{CALLERS} callers), as the limiter does."
        ),
        params={
            "callers": CALLERS,
            "max_connections": MAX_CONNECTIONS,
            "rate": RATE,
            "identities": IDENTITIES,
            "baseline": f"AsyncLimiter({option}=False)" if option else "FCALL per decision",
        },
    )
    tallies: dict[str, Tally] = {}
    with redis_server() as server, server.client() as admin, asyncio.Runner() as loop:
        admin.function_load(_script.LIBRARY, replace=True)
        specs = [LimitSpec(alg, alg, RATE) for alg in ALGORITHMS]
        pol = make_policy(server.url, specs)
        limiter = AsyncLimiter(pol, redis_url=server.url, max_connections=MAX_CONNECTIONS)
        unbatched: dict[str, Any] = {option: False} if option else {}
        plain = AsyncLimiter(pol, redis_url=server.url, **unbatched) if option else None
        client = _pool_client(server.url)
        batcher = Batcher(client)

        async def one_call(call: ScriptCall) -> object:
            return await client.execute_command(*_call_args(call))  # type: ignore[no-untyped-call]

        try:
            variants: list[Variant] = []
            for alg in ALGORITHMS:
                shapes: dict[str, Decide] = {
                    "limiter": _hits(limiter, alg),
                    "baseline": (
                        _hits(plain, alg) if plain is not None else _via(one_call, limiter, alg)
                    ),
                    "batched": _via(batcher.call, limiter, alg),
                }
                for shape, decide in shapes.items():
                    key = f"{shape}_{alg}"
                    tallies[key] = Tally()
                    ids = Identities(f"user-{key}", IDENTITIES)
                    runner = _runner(
                        loop, decide, ids, tallies[key], lambda: server_cpu_seconds(admin)
                    )
                    variants.append(Variant(key, key, runner))
            # Every slice gathers 256 coroutines and waits for the slowest: longer slices.
            result.rates = interleave(variants, settings.stretched(4))
        finally:
            loop.run(limiter.aclose())
            if plain is not None:
                loop.run(plain.aclose())
            loop.run(client.aclose())
    rows: list[list[str]] = []
    for alg in ALGORITHMS:
        mine = result.rates[f"limiter_{alg}"]
        base = result.rates[f"baseline_{alg}"]
        batched = result.rates[f"batched_{alg}"]
        vs_base = result.ratios[f"limiter_{alg}/baseline_{alg}"] = ratios(mine, base)
        ceiling = result.ratios[f"batched_{alg}/baseline_{alg}"] = ratios(batched, base)
        rows.append(
            [
                alg,
                fmt_rate(median(mine)),
                fmt_rate(median(base)),
                fmt_ratio(median(vs_base)),
                fmt_rate(median(batched)),
                fmt_ratio(median(ceiling)),
            ]
        )
        result.targets.append(
            Target(
                key=f"async.{alg}.baseline",
                text=(
                    f"`AsyncLimiter.hit()` {alg}, {CALLERS} callers, vs one script call "
                    "(FCALL) per decision"
                ),
                measured=median(vs_base),
                spread=quartiles(vs_base),
                threshold=TARGET,
                short=f"{alg}: async / one FCALL each",
                note=f"minimal batcher: {fmt_ratio(median(ceiling))}",
            )
        )
    result.tables.append(
        Table(
            title="Decisions per second and ratios (medians)",
            columns=[
                "algorithm",
                "limiter",
                "baseline",
                "limiter / baseline",
                "batched",
                "batched / baseline",
            ],
            rows=rows,
        )
    )
    result.notes.append(
        "batched is a minimal batcher (one pipeline per event-loop turn, no deadline, no "
        "circuit breaker) sending the baseline's calls: what batching alone reaches on "
        "this machine, for comparison with the limiter."
    )
    for alg in ALGORITHMS:
        share = median(ratios(result.rates[f"limiter_{alg}"], result.rates[f"batched_{alg}"]))
        tally = tallies[f"limiter_{alg}"]
        # What one Redis can serve at its CPU per decision, against the baseline's rate.
        server_cap = 1e6 / tally.server_per_decision_us
        cap_ratio = server_cap / median(result.rates[f"baseline_{alg}"])
        if tally.busy >= BUSY and tally.server_busy >= BUSY:
            verdict = (
                "both are near a core each (this machine has "
                f"{os.cpu_count()}), so a higher rate needs a cheaper decision in Python "
                f"and in Redis: at its CPU per decision one Redis serves at most about "
                f"{server_cap:,.0f} decisions/s, {cap_ratio:.1f}x the baseline"
            )
        elif tally.busy >= BUSY:
            verdict = (
                "the event loop is the bottleneck, so a higher rate has to come from a "
                "cheaper decision in Python"
            )
        elif tally.server_busy >= BUSY:
            verdict = (
                f"Redis is the bottleneck: at its CPU per decision it serves at most about "
                f"{server_cap:,.0f} decisions/s, {cap_ratio:.1f}x the baseline"
            )
        else:
            verdict = "the loop also waited (for Redis, or for a CPU on this shared machine)"
        result.notes.append(
            f"{alg}: the limiter reaches {share:.0%} of the minimal batcher's rate (median "
            f"of per-round ratios); its process used {tally.busy:.0%} of a core, "
            f"{tally.cpu_per_decision_us:.0f} µs of CPU per decision, and the Redis server "
            f"{tally.server_busy:.0%} of a core, {tally.server_per_decision_us:.0f} µs per "
            f"decision: {verdict}."
        )
    result.data["tallies"] = {
        k: {
            **vars(v),
            "cpu_per_decision_us": v.cpu_per_decision_us,
            "busy": v.busy,
            "server_per_decision_us": v.server_per_decision_us,
            "server_busy": v.server_busy,
        }
        for k, v in tallies.items()
    }
    lost = {k: v.denied for k, v in tallies.items() if v.denied}
    if lost:
        result.notes.append(f"Some decisions were denials, which are cheaper: {lost}.")
    result.seconds = time.perf_counter() - started
    return result
