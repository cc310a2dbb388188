"""Exactness under concurrency: 4 processes x 8 threads on one identity admit exactly the
limit, because every decision is one atomic script on the server."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest
from harness import RedisServer
from limiter_support import US, hammer

PROCESSES = 4
THREADS = 8
PER_THREAD = 10  # 320 attempts on a limit of 100

POLICY = """
version: 1
app: {key_prefix: conc, timeout: 5s}
limits:
  - name: log
    app: {algorithm: sliding_log, tiers: {default: 100/1m}}
  - name: bucket
    app: {algorithm: gcra, tiers: {default: 100/1m}}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "frozen_us"),
    [
        # Real server time: the whole run takes far less than the 1-minute window.
        ("log", None),
        # GCRA refills one request every 0.6 s; a frozen test clock keeps the run inside
        # one instant, so exactly the burst (100) is admissible.
        ("bucket", 1_000_000 * US),
    ],
)
def test_processes_and_threads_admit_exactly_the_limit(
    redis_server: RedisServer, name: str, frozen_us: int | None
) -> None:
    """4 processes x 8 threads x 10 hits on one identity of a 100/1m limit: exactly 100
    are admitted, and no decision is degraded."""
    context = multiprocessing.get_context("spawn")
    identity = uuid.uuid4().hex
    with context.Manager() as manager:
        # Every process connects first, then all of them start together.
        start = manager.Barrier(PROCESSES + 1)
        with ProcessPoolExecutor(PROCESSES, mp_context=context) as pool:
            futures = [
                pool.submit(
                    hammer,
                    redis_server.url,
                    POLICY,
                    name,
                    identity,
                    THREADS,
                    PER_THREAD,
                    frozen_us,
                    start,
                )
                for _ in range(PROCESSES)
            ]
            start.wait(timeout=120)
            outcomes = [f.result(timeout=120) for f in futures]
    admitted = sum(a for a, _ in outcomes)
    degraded = sum(d for _, d in outcomes)
    assert degraded == 0
    assert admitted == 100


@pytest.mark.parametrize("name", ["log", "bucket"])
async def test_hundreds_of_coroutines_share_connections_and_stay_exact(
    redis_server: RedisServer, name: str
) -> None:
    """300 coroutines at once on 16 connections: their calls are pipelined together, none
    fails for want of a connection, and exactly 100 are admitted."""
    import edgegen_policy as policy

    from applimit import AsyncLimiter

    text = POLICY.replace("timeout: 5s", "timeout: 2s")
    frozen = (lambda: 1_000_000.0) if name == "bucket" else None
    limiter = AsyncLimiter(
        policy.loads(text), redis_url=redis_server.url, max_connections=16, test_clock=frozen
    )
    identity = uuid.uuid4().hex
    try:
        decisions = await asyncio.gather(*(limiter.hit(name, identity) for _ in range(300)))
    finally:
        await limiter.aclose()
    assert not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 100
