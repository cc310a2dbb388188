"""The decision-event log under real Redis: one NDJSON line of the documented shape per
``hit`` result (peeks left out), written out every N lines and on close, whole lines from
many threads, and a stream it was given left open."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from harness import RedisServer
from limiter_support import Driver

from applimit import AsyncLimiter, EventLogObserver, Limiter

POLICY = """
version: 1
tiers: [free, pro]
app: {key_prefix: evlog, timeout: 2s}
limits:
  - name: api
    app: {algorithm: sliding_log, tiers: {free: 2/1m, pro: 100/1m}}
  - name: trial
    app: {algorithm: gcra, enforce: false, tiers: {free: 1/1m, pro: 1/1m}}
"""

FIELDS = ["v", "ts", "limit", "tier", "identity", "cost", "outcome", "operation"]


def _lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_one_line_of_the_documented_shape_per_hit_result(
    tmp_path: Path, redis_server: RedisServer, flavour: str
) -> None:
    """Three hits of a free user (two admitted, one denied) and one peek: six lines (two
    limits each), keys in the documented order, the shadow limit's would-be denials as
    shadow_denied, the identity hashed and the same for one caller; the peek leaves none."""
    path = tmp_path / "events.ndjson"
    log = EventLogObserver(path)
    cls = Limiter if flavour == "sync" else AsyncLimiter
    limiter = Driver(cls(policy.loads(POLICY), redis_url=redis_server.url, observers=[log]))
    alice = f"alice-{uuid.uuid4()}"
    before = time.time()
    try:
        for _ in range(3):
            await limiter.hit("api", alice)
            await limiter.hit("trial", alice, cost=1)
        await limiter.peek("api", alice)
    finally:
        await limiter.close()
        log.close()
    lines = _lines(path)
    assert [list(line) for line in lines] == [FIELDS] * 6
    api = [line for line in lines if line["limit"] == "api"]
    trial = [line for line in lines if line["limit"] == "trial"]
    assert [line["outcome"] for line in api] == ["allowed", "allowed", "denied"]
    assert [line["outcome"] for line in trial] == ["allowed", "shadow_denied", "shadow_denied"]
    assert all(line["v"] == 1 and line["operation"] == "hit" for line in lines)
    assert all(line["tier"] == "free" and line["cost"] == 1 for line in lines)
    assert all(before <= line["ts"] <= time.time() for line in lines)
    assert len({line["identity"] for line in api}) == 1
    assert alice not in path.read_text(encoding="utf-8")


def test_lines_are_written_every_n_and_the_rest_on_close(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """With flush_every 4 (and an hour's interval) the file holds 4, then 8 lines, and
    the rest only once closed; a result after close is dropped."""
    bob = f"bob-{uuid.uuid4()}"
    path = tmp_path / "events.ndjson"
    log = EventLogObserver(path, flush_every=4, flush_interval=3600)
    with Limiter(policy.loads(POLICY), redis_url=redis_server.url, observers=[log]) as limiter:
        for _ in range(3):
            limiter.hit("api", bob, tier="pro")
        assert _lines(path) == []
        limiter.hit("api", bob, tier="pro")
        assert len(_lines(path)) == 4
        for _ in range(6):
            limiter.hit("api", bob, tier="pro")
        assert len(_lines(path)) == 8
        log.close()
        assert len(_lines(path)) == 10
        limiter.hit("api", bob, tier="pro")
    assert len(_lines(path)) == 10
    log.close()


def test_many_threads_write_whole_lines(tmp_path: Path, redis_server: RedisServer) -> None:
    """Eight threads on one limiter: every hit has its line, each line parses whole."""
    path = tmp_path / "events.ndjson"
    run_id = uuid.uuid4()
    with (
        EventLogObserver(path, flush_every=7) as log,
        Limiter(policy.loads(POLICY), redis_url=redis_server.url, observers=[log]) as limiter,
    ):
        barrier = threading.Barrier(8)

        def run(index: int) -> None:
            barrier.wait()
            for _ in range(50):
                limiter.hit("api", f"{run_id}-{index}", tier="pro")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = _lines(path)
    assert len(lines) == 8 * 50
    assert len({line["identity"] for line in lines}) == 8
    assert {line["outcome"] for line in lines} == {"allowed"}


def test_a_stream_is_flushed_not_closed_and_raw_identities_are_the_counter_key(
    redis_server: RedisServer,
) -> None:
    """Given a stream, close() writes out and leaves it open; with log_identities=True
    the identity is the raw counter key (which encodes the caller's identity)."""
    stream = io.StringIO()
    log = EventLogObserver(stream)
    with Limiter(
        policy.loads(POLICY), redis_url=redis_server.url, observers=[log], log_identities=True
    ) as limiter:
        limiter.hit("api", f'quote"d\\{uuid.uuid4()}')
    log.close()
    assert not stream.closed
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["identity"].startswith("evlog:api:{")


def test_bad_flush_settings_are_refused(tmp_path: Path) -> None:
    """flush_every below 1 is refused with a message naming both settings."""
    with pytest.raises(ValueError, match="flush_every >= 1"):
        EventLogObserver(tmp_path / "x.ndjson", flush_every=0)


def test_edgegen_replay_reads_the_log(tmp_path: Path, redis_server: RedisServer) -> None:
    """The log is what edgegen's traffic reader takes as decision events (issue 16's
    replay): every hit line becomes a record with its limit, tier, identity and cost, in
    time order, and nothing is malformed."""
    from edgegen.traffic._options import TrafficOptions
    from edgegen.traffic._read import read_traffic

    path = tmp_path / "events.ndjson"
    who = f"carol-{uuid.uuid4()}"
    with (
        EventLogObserver(path) as log,
        Limiter(policy.loads(POLICY), redis_url=redis_server.url, observers=[log]) as limiter,
    ):
        for _ in range(3):
            limiter.hit("api", who, tier="pro", cost=2)
        limiter.peek("api", who, tier="pro")
    with read_traffic([path], TrafficOptions(strict=True)) as traffic:
        records = list(traffic)
    assert [(r.limit, r.tier, r.cost) for r in records] == [("api", "pro", 2)] * 3
    assert len({r.user for r in records}) == 1
