"""Sync, many threads: one call per thread on a pool, against the threads' calls batched.

A threaded app (gunicorn's threads, waitress) decides in many threads at once. Today's
``Limiter`` gives each thread a connection of its pool and one round trip per decision;
``Limiter(..., batch=True)`` queues the calls of threads that decide while another
thread's call is in flight and sends them in one write on one connection
(applimit/_batch.py). Variants, interleaved in every round, for 1, 8 and 32 threads each
calling ``Limiter.hit()`` in a loop (one thread has nothing to batch: it shows what the
queue's bookkeeping costs):

- ``pool_<n>``: one limiter as built today (a connection per concurrent thread);
- ``batch_<n>``: one limiter with ``batch=True``.

Both limiters talk to the same server with the same policy; each thread spreads its
hits over identities of its own at 1000 per minute each, so every decision admits.
Degraded decisions (a timeout on a loaded machine) are counted and reported: they skip
Redis and would flatter whichever side has them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from applimit import Limiter

from ._common import (
    Identities,
    LimitSpec,
    Result,
    Runner,
    Settings,
    Table,
    Variant,
    fmt_rate,
    fmt_ratio,
    fmt_us,
    interleave,
    make_policy,
    median,
    quartiles,
    ratios,
    redis_server,
)

NAME = "threads"
TITLE = "Sync, many threads: one call per thread against batched calls"

THREADS = (1, 8, 32)
ALGORITHM = "sliding_log"
RATE = "1000/1m"
IDENTITIES = 1000
# Threads are started for every slice: longer slices keep their start a small part.
STRETCH = 4


@dataclass
class Tally:
    """Decisions made, and those denied or degraded (both must stay 0)."""

    made: int = 0
    denied: int = 0
    degraded: int = 0
    # This process's CPU time (all threads) over the timed slices: a machine shared with
    # other work slows the rates, much less the CPU a decision takes.
    cpu: float = 0.0
    timed: int = 0

    @property
    def cpu_us(self) -> float:
        """Microseconds of this process's CPU per decision, NaN before any."""
        return self.cpu / self.timed * 1e6 if self.timed else float("nan")


def threaded_loop(limiter: Limiter, threads: int, prefix: str, tally: Tally) -> Runner:
    """A runner: ``threads`` threads calling ``limiter.hit()`` until the time is up.

    The threads start together (a barrier) and the clock of the slice starts with them,
    so starting threads is not timed; each checks the clock every few decisions.
    """
    ids = [Identities(f"{prefix}-t{index}", IDENTITIES) for index in range(threads)]

    def run(seconds: float) -> int:
        counts = [0] * threads
        denied = [0] * threads
        degraded = [0] * threads
        barrier = threading.Barrier(threads + 1)
        end = [0.0]

        def work(index: int) -> None:
            names = ids[index]
            barrier.wait()
            stop = end[0]
            done = 0
            while True:
                for _ in range(8):
                    decision = limiter.hit(ALGORITHM, names())
                    if not decision.allowed:
                        denied[index] += 1
                    if decision.degraded:
                        degraded[index] += 1
                done += 8
                if time.perf_counter() >= stop:
                    break
            counts[index] = done

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        end[0] = time.perf_counter() + seconds
        cpu = time.process_time()
        barrier.wait()
        for worker in workers:
            worker.join()
        tally.cpu += time.process_time() - cpu
        tally.timed += sum(counts)
        tally.made += sum(counts)
        tally.denied += sum(denied)
        tally.degraded += sum(degraded)
        return sum(counts)

    return run


def run(settings: Settings) -> Result:
    """Measure the pooled and the batched limiter, interleaved, at each thread count."""
    started = time.perf_counter()
    stretched = settings.stretched(STRETCH)
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            "`Limiter.hit()` per second from 1, 8 and 32 threads, each calling in a loop: "
            "the limiter as built by default (a pool, one call per thread on a connection "
            "of its own) against `Limiter(..., batch=True)` (the calls of concurrent "
            "threads sent together, one write at a time on one connection), interleaved "
            "in the same run on the same server."
        ),
        params={
            "algorithm": ALGORITHM,
            "rate": RATE,
            "identities_per_thread": IDENTITIES,
            "threads": list(THREADS),
            "rounds": stretched.rounds,
            "seconds": stretched.seconds,
        },
    )
    with redis_server() as server:
        loaded = make_policy(server.url, [LimitSpec(ALGORITHM, ALGORITHM, RATE)])
        pooled = Limiter(loaded, redis_url=server.url, max_connections=64)
        batched = Limiter(loaded, redis_url=server.url, max_connections=64, batch=True)
        tallies: dict[str, Tally] = {}
        variants: list[Variant] = []
        try:
            for threads in THREADS:
                for kind, limiter in (("pool", pooled), ("batch", batched)):
                    key = f"{kind}_{threads}"
                    tallies[key] = Tally()
                    variants.append(
                        Variant(
                            key,
                            f"{kind}, {threads} threads",
                            threaded_loop(limiter, threads, key, tallies[key]),
                        )
                    )
            rates = interleave(variants, stretched)
        finally:
            pooled.close()
            batched.close()
    result.rates = rates
    rows: list[list[str]] = []
    for threads in THREADS:
        pool, batch = rates[f"pool_{threads}"], rates[f"batch_{threads}"]
        ratio = result.ratios[f"batch_{threads}/pool_{threads}"] = ratios(batch, pool)
        spread = quartiles(ratio)
        rows.append(
            [
                str(threads),
                fmt_rate(median(pool)),
                fmt_rate(median(batch)),
                fmt_ratio(median(ratio)),
                " - ".join(fmt_ratio(value) for value in spread) if spread else "",
                fmt_us(tallies[f"pool_{threads}"].cpu_us),
                fmt_us(tallies[f"batch_{threads}"].cpu_us),
            ]
        )
    result.tables.append(
        Table(
            title="Decisions per second (medians) and batched / pooled (median of per-round "
            "ratios, middle half)",
            columns=[
                "threads",
                "pool",
                "batch",
                "batch / pool",
                "middle half",
                "CPU per decision, pool",
                "CPU per decision, batch",
            ],
            rows=rows,
            note=(
                f"{ALGORITHM} at {RATE}, {IDENTITIES} identities per thread; "
                f"{stretched.rounds} rounds of {stretched.seconds:.2f} s per variant. CPU "
                "per decision: this process's CPU time (every thread, user and system) "
                "over all rounds and the warm-up, divided by the decisions made."
            ),
        )
    )
    result.data["tallies"] = {k: vars(v) for k, v in tallies.items()}
    for key, tally in tallies.items():
        result.data[f"cpu_us_per_decision.{key}"] = tally.cpu_us
    off = {k: (v.denied, v.degraded) for k, v in tallies.items() if v.denied or v.degraded}
    if off:
        result.notes.append(
            f"Some decisions were denied or degraded (denied, degraded), which skews the "
            f"rates: {off}."
        )
    result.seconds = time.perf_counter() - started
    return result
