"""Approximate mode: Redis calls per decision at steady load, and the overshoot it costs.

A limit with ``mode: approximate`` (``sync_every`` / ``sync_interval``) may count locally
and sync with Redis now and then. Two measurements, each run once with the limit in
``approximate`` mode and once, identical otherwise, in ``exact`` mode:

- *Calls*: several limiter instances (as on several app servers), each with its own
  connection, decide for a few busy identities well within the limit. The Redis commands
  the limiters send are counted on the wire (a counting ``redis.Connection`` subclass,
  which the limiter keeps when it copies the client's settings), and cross-checked with
  the server's count of script calls. Result: exact calls per decision / approximate ones.
- *Overshoot*: the same instances hammer one identity far above its limit; the requests
  admitted in approximate mode beyond those admitted in exact mode, per window of the
  limit, are the overshoot. It is checked against ``overshoot_bound()``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, ClassVar

import hiredis
import redis

from applimit import Limiter

from ._common import (
    LimitSpec,
    Result,
    Settings,
    Table,
    Target,
    fmt_ratio,
    make_policy,
    redis_server,
    script_stats,
)

NAME = "approx"
TITLE = "Approximate mode: Redis calls and overshoot"

INSTANCES = 4
SYNC_EVERY = 20
SYNC_INTERVAL = "100ms"
STEADY_RATE = "100000/1m"
STEADY_IDENTITIES = 8
OVER_RATE = "200/1s"
WINDOW_SECONDS = 1.0
ALGORITHM = "gcra"
CALLS_TARGET = 10.0


def overshoot_bound(instances: int, sync_every: int) -> int:
    """Requests an approximate limit may admit beyond an exact one, per window.

    Each instance holds at most ``sync_every - 1`` admitted requests that Redis has not
    counted yet (the ``sync_every``-th is sent with them), and every one is counted later,
    so per window at most ``instances * (sync_every - 1)`` requests are admitted beyond
    what Redis allows. docs/applimit.md documents the same bound; keep the two the same.
    """
    return instances * (sync_every - 1)


class CountingConnection(redis.Connection):
    """A connection that counts what it sends: commands, and writes (round trips).

    Everything a connection sends goes through ``send_packed_command``, whether from
    redis-py's command path or the limiter's own wire, one command or a pipeline: the
    commands are counted by parsing the bytes sent as RESP.
    """

    counts: ClassVar[Counter[str]] = Counter()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """Count the commands in ``command`` (then send it as usual)."""
        reader = hiredis.Reader()
        for chunk in [command] if isinstance(command, bytes | str) else command:
            reader.feed(chunk.encode() if isinstance(chunk, str) else bytes(chunk))
        while reader.gets() is not False:
            CountingConnection.counts["commands"] += 1
        CountingConnection.counts["writes"] += 1
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]


def _limiters(url: str, port: int, mode: str, rate: str) -> list[Limiter]:
    options: dict[str, Any] = {"mode": mode}
    if mode == "approximate":
        options |= {"sync_every": SYNC_EVERY, "sync_interval": SYNC_INTERVAL}
    pol = make_policy(url, [LimitSpec("events", ALGORITHM, rate, options=options)])
    made: list[Limiter] = []
    for _ in range(INSTANCES):
        pool = redis.ConnectionPool(
            host="127.0.0.1", port=port, connection_class=CountingConnection
        )
        client = redis.Redis(connection_pool=pool)
        # The limiter copies the client's settings, connection class included, into a
        # pool of its own; the client itself is not used and can go.
        made.append(Limiter(pol, redis=client))
        client.close()
    return made


def _steady(url: str, port: int, admin: redis.Redis, mode: str, decisions: int) -> dict[str, Any]:
    limiters = _limiters(url, port, mode, STEADY_RATE)
    ids = [f"busy-{i}" for i in range(STEADY_IDENTITIES)]
    try:
        for limiter in limiters:
            limiter.hit("events", "warm-up")
        admin.config_resetstat()
        CountingConnection.counts.clear()
        denied = 0
        for i in range(decisions):
            limiter = limiters[i % INSTANCES]
            if not limiter.hit("events", ids[(i // INSTANCES) % STEADY_IDENTITIES]).allowed:
                denied += 1
        commands = CountingConnection.counts["commands"]
        scripts = script_stats(admin)["calls"]
    finally:
        for limiter in limiters:
            limiter.close()
    return {
        "decisions": decisions,
        "denied": denied,
        "commands": commands,
        "script_calls": scripts,
        "commands_per_decision": commands / decisions,
    }


def _overshoot(
    url: str, port: int, admin: redis.Redis, mode: str, seconds: float
) -> dict[str, Any]:
    admin.flushall()
    limiters = _limiters(url, port, mode, OVER_RATE)
    try:
        for limiter in limiters:
            limiter.peek("events", "warm-up")
        admitted = made = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for limiter in limiters:
                made += 1
                if limiter.hit("events", "hot").allowed:
                    admitted += 1
    finally:
        for limiter in limiters:
            limiter.close()
    return {"decisions": made, "admitted": admitted, "seconds": seconds}


def run(settings: Settings) -> Result:
    """Measure calls per decision and overshoot, approximate mode against exact."""
    started = time.perf_counter()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            f"{INSTANCES} limiter instances (as on {INSTANCES} app servers) deciding a "
            f"`{ALGORITHM}` limit with `mode: approximate` (`sync_every: {SYNC_EVERY}`, "
            f"`sync_interval: {SYNC_INTERVAL}`) against the same limit in exact mode: Redis "
            "commands sent per decision at steady load (counted on the wire), and the "
            f"requests admitted beyond the exact limit when one identity sends far more "
            f"than {OVER_RATE}."
        ),
        params={
            "instances": INSTANCES,
            "sync_every": SYNC_EVERY,
            "sync_interval": SYNC_INTERVAL,
            "steady_rate": STEADY_RATE,
            "overshoot_rate": OVER_RATE,
        },
    )
    decisions = settings.count(8000, minimum=200)
    # Several windows of the limit, so the burst allowed at the start does not dominate.
    seconds = 2 * WINDOW_SECONDS if not settings.quick else 0.2
    with redis_server() as server, server.client() as admin:
        steady = {
            m: _steady(server.url, server.port, admin, m, decisions)
            for m in ("exact", "approximate")
        }
        over = {
            m: _overshoot(server.url, server.port, admin, m, seconds)
            for m in ("exact", "approximate")
        }
    result.data.update({"steady": steady, "overshoot": over})
    exact, approx = steady["exact"], steady["approximate"]
    counted = exact["commands"] > 0 and approx["commands"] > 0
    fewer = exact["commands_per_decision"] / approx["commands_per_decision"] if counted else None
    # Per window of the limit; a run shorter than one window counts as one.
    windows = max(1.0, over["approximate"]["seconds"] / WINDOW_SECONDS)
    extra = (over["approximate"]["admitted"] - over["exact"]["admitted"]) / windows
    # Until approximate mode cuts calls it is not in effect, and "no overshoot" is exact
    # mode's, not a result about approximate mode.
    in_effect = fewer is not None and fewer >= 1.5
    bound = overshoot_bound(INSTANCES, SYNC_EVERY)
    result.tables.append(
        Table(
            title="Redis commands per decision at steady load",
            columns=["mode", "decisions", "commands sent", "script calls in Redis", "per decision"],
            rows=[
                [
                    mode,
                    f"{row['decisions']:,}",
                    f"{row['commands']:,}",
                    f"{row['script_calls']:,.0f}",
                    f"{row['commands_per_decision']:.3f}",
                ]
                for mode, row in steady.items()
            ],
            note=f"Exact / approximate: {fmt_ratio(fewer) if fewer else '-'} fewer calls.",
        )
    )
    result.tables.append(
        Table(
            title=f"Overshoot: one identity far above {OVER_RATE}",
            columns=["mode", "seconds", "decisions", "admitted"],
            rows=[
                [mode, f"{row['seconds']:.1f}", f"{row['decisions']:,}", f"{row['admitted']:,}"]
                for mode, row in over.items()
            ],
            note=(
                f"Overshoot: {extra:,.1f} requests per window beyond exact mode; bound "
                f"{INSTANCES} instances x (sync_every {SYNC_EVERY} - 1) = {bound}."
            ),
        )
    )
    result.targets.append(
        Target(
            key="approx.calls",
            text="approximate mode: fewer Redis calls than exact at steady load",
            measured=fewer,
            threshold=CALLS_TARGET,
            short="approximate: calls saved",
            note="" if counted else "no commands were counted; the measurement failed",
        )
    )
    result.targets.append(
        Target(
            key="approx.overshoot",
            text="approximate mode: overshoot per window (requests beyond exact)",
            measured=extra if in_effect else None,
            threshold=float(bound),
            higher_is_better=False,
            unit="requests",
            note=f"bound: {INSTANCES} instances x (sync_every - 1)"
            if in_effect
            else "approximate mode not in effect: nothing to bound",
        )
    )
    if counted and not in_effect:
        result.notes.append(
            "Approximate mode makes about as many Redis calls as exact mode: the limiter "
            "still decides every request in Redis (approximate mode is not implemented "
            "yet), so the overshoot is that of exact mode."
        )
    if approx["script_calls"] > approx["commands"]:
        result.notes.append(
            "Redis counted more script calls than the limiters sent: the wire count missed "
            "some connections, so the calls ratio is not reliable."
        )
    result.seconds = time.perf_counter() - started
    return result
