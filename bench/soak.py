"""Soak: mixed traffic through applimit for a bounded time, checked against reference models.

Usage (from the repository root; ``make soak`` runs it for ``SOAK_SECONDS``, default 120)::

    python -m bench.soak --seconds 120

It starts its own ``redis-server`` and several processes (sync ``Limiter``s with threads,
and an ``AsyncLimiter`` with concurrent tasks) that send a fixed mix over many identities
(a few hot ones far over their limits, a long tail under them) to one limit per algorithm,
each with a 2 s window so that expiry is observable within the run. Each process records,
for every admitted request, the monotonic time before and after the call (the server's
decision happened in between; ``CLOCK_MONOTONIC`` is one clock for every process).

Checked at the end (exit status 1 on any violation, with a summary either way):

- ``sliding_log``: no ``quota + 1`` admissions of one identity within one window;
- ``gcra``: no ``k`` admissions within less than ``(k - burst) * period / quota``;
- ``sliding_window``: at most twice the quota in one window (its documented bound);
- hot identities were admitted a window's quota at least (the limiter is not stuck);
- no exceptions; degraded decisions (Redis too slow on a busy machine) below 0.5 %;
- Redis memory and keys stay bounded while traffic runs, and every key expires after it
  stops (``DBSIZE`` back to 0 within a few windows);
- ``connected_clients`` never exceeds what the callers can hold at once, and on a long run
  does not keep growing (no connection leak).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import edgegen_policy as policy

from applimit import AsyncLimiter, Limiter
from bench._common import redis_server

QUOTA = 20
PERIOD = 2.0
LIMITS = {"log": "sliding_log", "gcra": "gcra", "sw": "sliding_window"}
POLICY = "\n".join(
    [
        "version: 1",
        "app: {key_prefix: soak, timeout: 250ms, on_redis_error: deny}",
        "limits:",
        *(
            f"  - name: {name}\n    app: {{algorithm: {algorithm}, tiers: {{default: {QUOTA}/2s}}}}"
            for name, algorithm in LIMITS.items()
        ),
    ]
)
HOT = 8
TAIL = 2000
HOT_SHARE = 0.4
SYNC_PROCESSES = 2
THREADS = 2
ASYNC_TASKS = 8
# One request every PACE seconds per thread or task: heavy, but leaves the two cores of a
# small CI machine room for Redis and the sampler.
PACE = 0.001


def _identity(rng: random.Random) -> str:
    if rng.random() < HOT_SHARE:
        return f"hot-{rng.randrange(HOT)}"
    return f"tail-{rng.randrange(TAIL)}"


class _Log:
    """What one worker saw: admissions with times, and counters."""

    def __init__(self) -> None:
        self.admitted: list[tuple[str, str, float, float]] = []
        self.decisions = 0
        self.degraded = 0
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def dump(self, path: Path) -> None:
        data = {
            "admitted": self.admitted,
            "decisions": self.decisions,
            "degraded": self.degraded,
            "errors": self.errors[:20],
        }
        path.write_text(json.dumps(data), encoding="utf-8")


def _sync_worker(url: str, seconds: float, seed: int, out: str) -> None:
    limiter = Limiter(policy.loads(POLICY), redis_url=url)
    log = _Log()
    deadline = time.monotonic() + seconds

    def run(rng: random.Random) -> None:
        while time.monotonic() < deadline:
            limit, identity = rng.choice(tuple(LIMITS)), _identity(rng)
            try:
                before = time.monotonic()
                decision = limiter.hit(limit, identity)
                after = time.monotonic()
            except Exception as error:
                with log.lock:
                    log.errors.append(repr(error))
                continue
            with log.lock:
                log.decisions += 1
                log.degraded += decision.degraded
                if decision.allowed and not decision.degraded:
                    log.admitted.append((limit, identity, before, after))
            time.sleep(PACE)  # pacing of the traffic loop

    threads = [
        threading.Thread(target=run, args=(random.Random(seed * 100 + i),)) for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    limiter.close()
    log.dump(Path(out))


def _async_worker(url: str, seconds: float, seed: int, out: str) -> None:
    log = _Log()

    async def main() -> None:
        limiter = AsyncLimiter(policy.loads(POLICY), redis_url=url)
        deadline = time.monotonic() + seconds

        async def run(rng: random.Random) -> None:
            while time.monotonic() < deadline:
                limit, identity = rng.choice(tuple(LIMITS)), _identity(rng)
                try:
                    before = time.monotonic()
                    decision = await limiter.hit(limit, identity)
                    after = time.monotonic()
                except Exception as error:
                    log.errors.append(repr(error))
                    continue
                log.decisions += 1
                log.degraded += decision.degraded
                if decision.allowed and not decision.degraded:
                    log.admitted.append((limit, identity, before, after))
                await asyncio.sleep(PACE)

        await asyncio.gather(*(run(random.Random(seed * 100 + i)) for i in range(ASYNC_TASKS)))
        await limiter.aclose()

    asyncio.run(main())
    log.dump(Path(out))


# --- the reference models ----------------------------------------------------------------


def _violations(algorithm: str, events: list[tuple[float, float]]) -> int:
    """Admissions of one identity that break the algorithm's guarantee.

    Each event is (before, after): the server decided at some time in between. ``k``
    admissions sorted by their ``after`` then spanned at least ``after_last -
    before_first`` on the server's clock at most, so a guarantee "``k`` admissions need a
    span of at least ``d``" is broken only when ``after_last - before_first < d`` for
    every ordering the times allow; checking consecutive runs by ``after`` with the
    smallest ``before`` of the run errs towards accepting, never towards a false alarm.
    """
    events = sorted(events, key=lambda e: e[1])
    bad = 0
    for i, (_, after) in enumerate(events):
        if algorithm == "sliding_log":
            runs = [(QUOTA + 1, PERIOD)]
        elif algorithm == "gcra":
            interval = PERIOD / QUOTA
            runs = [(QUOTA + n, n * interval) for n in (1, QUOTA // 2, QUOTA, 3 * QUOTA)]
        else:
            runs = [(2 * QUOTA + 1, PERIOD)]
        for count, span in runs:
            j = i - count + 1
            if j < 0:
                continue
            earliest = min(b for b, _ in events[j : i + 1])
            if after - earliest < span:
                bad += 1
                break
    return bad


def _check(admitted: list[list[Any]]) -> tuple[dict[str, int], list[str]]:
    per: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for limit, identity, before, after in admitted:
        per[(limit, identity)].append((before, after))
    problems: list[str] = []
    violations = dict.fromkeys(LIMITS, 0)
    for (limit, identity), events in per.items():
        n = _violations(LIMITS[limit], events)
        if n:
            violations[limit] += n
            problems.append(f"{limit}/{identity}: {n} admissions over the model's bound")
    for limit in LIMITS:
        for h in range(HOT):
            got = len(per.get((limit, f"hot-{h}"), []))
            if got < QUOTA:
                problems.append(f"{limit}/hot-{h}: only {got} admitted, expected >= {QUOTA}")
    return violations, problems[:20]


# --- the run -----------------------------------------------------------------------------


def soak(seconds: float) -> int:
    """Run the soak for ``seconds`` of traffic; print a summary; 0 if every check held."""
    problems: list[str] = []
    with redis_server() as server, server.client() as admin, tempfile.TemporaryDirectory() as tmp:
        ctx = multiprocessing.get_context("spawn")
        outs = [str(Path(tmp) / f"worker-{i}.json") for i in range(SYNC_PROCESSES + 1)]
        procs = [
            ctx.Process(target=_sync_worker, args=(server.url, seconds, i, outs[i]))
            for i in range(SYNC_PROCESSES)
        ]
        procs.append(
            ctx.Process(target=_async_worker, args=(server.url, seconds, SYNC_PROCESSES, outs[-1]))
        )
        started = time.monotonic()
        for proc in procs:
            proc.start()
        samples: list[tuple[float, int, int, int]] = []
        while any(proc.is_alive() for proc in procs):
            memory, clients = admin.info("memory"), admin.info("clients")
            samples.append(
                (
                    time.monotonic() - started,
                    int(admin.dbsize()),
                    int(memory["used_memory"]),
                    int(clients["connected_clients"]),
                )
            )
            time.sleep(0.5)  # sampling interval
        for proc in procs:
            proc.join()
            if proc.exitcode != 0:
                problems.append(f"a worker exited with status {proc.exitcode}")
        stopped = time.monotonic()
        # Every key has a TTL: a log until its newest entry leaves the window, a window
        # count until the end of the next window, a GCRA value until its arrival time.
        expiry_deadline = stopped + 3 * PERIOD + 5.0
        while admin.dbsize() and time.monotonic() < expiry_deadline:
            time.sleep(0.1)  # polling interval
        left = int(admin.dbsize())
        expired_after = time.monotonic() - stopped
        logs = [json.loads(Path(o).read_text(encoding="utf-8")) for o in outs if Path(o).exists()]

    decisions = sum(log["decisions"] for log in logs)
    degraded = sum(log["degraded"] for log in logs)
    errors = [e for log in logs for e in log["errors"]]
    admitted = [e for log in logs for e in log["admitted"]]
    violations, model_problems = _check(admitted)
    problems += model_problems
    if errors:
        problems.append(f"{len(errors)} exceptions reached a caller, e.g. {errors[0]}")
    if decisions == 0 or degraded > 0.005 * decisions:
        problems.append(f"{degraded} of {decisions} decisions were degraded")
    if left:
        problems.append(f"{left} keys still in Redis {expired_after:.1f} s after the traffic")

    warm = [s for s in samples if s[0] >= 2 * PERIOD + 1.0]
    if warm:
        half = len(warm) // 2
        first, second = warm[: max(half, 1)], warm[half:]
        mem_first, mem_second = max(s[2] for s in first), max(s[2] for s in second)
        if mem_second > 1.5 * mem_first + 1_000_000:
            problems.append(f"Redis memory grew from {mem_first} to {mem_second} bytes")
        keys_first, keys_second = max(s[1] for s in first), max(s[1] for s in second)
        if keys_second > 1.5 * keys_first + 100:
            problems.append(f"keys grew from {keys_first} to {keys_second}")
        conns = [s[3] for s in warm]
        # Pools open connections lazily as load peaks, so a short run may still see a few
        # more late; a leak shows as more than the callers could ever hold at once.
        ceiling = SYNC_PROCESSES * THREADS + ASYNC_TASKS + 2  # + this admin client, slack
        if max(conns) > ceiling:
            problems.append(f"connected_clients above {ceiling}: {conns}")
        elif len(warm) >= 40 and max(s[3] for s in second) > max(s[3] for s in first) + 2:
            problems.append(f"connected_clients kept growing: {conns}")
    else:
        problems.append("the run was too short to sample a steady state")

    peak_keys = max((s[1] for s in samples), default=0)
    peak_mem = max((s[2] for s in samples), default=0)
    conns_seen = sorted({s[3] for s in samples})
    print(
        f"soak: {seconds:.0f} s, {len(procs)} processes, {decisions} decisions "
        f"({decisions / max(seconds, 1e-9):.0f}/s), {len(admitted)} admitted, "
        f"{degraded} degraded, {len(errors)} exceptions\n"
        f"  model violations per limit: {violations}\n"
        f"  Redis: peak {peak_keys} keys, peak used_memory {peak_mem / 1e6:.1f} MB; "
        f"{left} keys left {expired_after:.1f} s after the traffic\n"
        f"  connected_clients seen: {conns_seen}"
    )
    for problem in problems:
        print(f"  VIOLATION: {problem}")
    print("soak: OK" if not problems else "soak: FAILED")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the soak."""
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--seconds", type=float, default=120.0, help="traffic duration")
    args = parser.parse_args(argv)
    return soak(args.seconds)


if __name__ == "__main__":
    sys.exit(main())
