"""What a decision costs Redis: CPU per decision and bytes per identity.

CPU. For each algorithm and limit (10, 100, 1000 per minute) a set of identities is
filled round-robin from empty to its limit with ``Limiter.hit()`` (every hit admitted,
so a sliding log grows to the limit as it would under real traffic), then hit a few more
times (denied). Two numbers per decision:

- *script*: ``usec_per_call`` of the script's command (FCALL of the limiter's library)
  from ``INFO commandstats``: the time the script runs inside Redis, including the
  commands it calls;
- *server CPU*: the server's user + system CPU time (``INFO cpu``) over the fill,
  divided by the decisions: the script plus reading the request and writing the reply.

The ``limits`` library's counterpart strategies fill the same way (``hit`` +
``get_window_stats``) for server CPU per decision; an FCALL of a function that only
returns, with a decision's keys and arguments, is the floor of any Lua decision. Each
measurement is repeated (every algorithm and limit once per repeat, so the machine's
bursts of noise spread over all of them) and the median shown. These are not ratios:
Redis' own time also stretches when the machine is busy.

Memory. One identity (a 36-character UUID, a common user id; and an 8-digit one) is
filled to each limit, then ``MEMORY USAGE <key> SAMPLES 0`` (exact, every element
counted) is read for each of its keys: bytes per identity per limit, and for the sliding
log bytes per entry (the key's total over its entries) and the marginal bytes of one
more entry. Redis keeps a sorted set of up to 128 entries as a compact listpack
(``zset-max-listpack-entries``), hence the extra point at 128.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from limits import parse, strategies
from limits.storage import RedisStorage

from applimit import Limiter, _script

from ._common import (
    LimitSpec,
    Result,
    Settings,
    Table,
    Target,
    close_storage,
    commandstats,
    fmt_bytes,
    fmt_us,
    make_policy,
    median,
    redis_server,
    script_stats,
    server_cpu_seconds,
)

NAME = "redis_cost"
TITLE = "Redis CPU per decision and bytes per identity"

ALGORITHMS = ("sliding_log", "sliding_window", "gcra")
LIMITS = (10, 100, 1000)
LOG_SIZES = (10, 100, 128, 1000)
CPU_IDENTITIES = 4
# Fills per algorithm and limit; the tables show the median.
REPEATS = 3
DENIED_PER_IDENTITY = 10
COUNTERPARTS: dict[str, tuple[str, type[strategies.RateLimiter]]] = {
    "sliding_log": ("moving window", strategies.MovingWindowRateLimiter),
    "sliding_window": ("sliding window counter", strategies.SlidingWindowCounterRateLimiter),
    "gcra": ("fixed window", strategies.FixedWindowRateLimiter),
}
STATE_TARGET = 128.0
ENTRY_TARGET = 40.0
LISTPACK_ENTRIES = 128
EMPTY_FUNCTION = "bench_empty"
EMPTY_LIBRARY = (
    f"#!lua name={EMPTY_FUNCTION}\n"
    f"redis.register_function('{EMPTY_FUNCTION}', function(keys, args) return 1 end)\n"
)
# A numeric user id, the other common shape: the key name is part of every key's size.
SHORT_IDENTITY = "48151623"


def _limiter(url: str, alg: str, limit: int) -> Limiter:
    spec = LimitSpec(name="api", algorithm=alg, rate=f"{limit}/1m")
    return Limiter(make_policy(url, [spec]), redis_url=url)


def _measured(admin: redis.Redis, work: Callable[[], int]) -> dict[str, float]:
    """Run ``work`` (returns decisions made) from fresh stats; per-decision costs."""
    admin.config_resetstat()
    cpu_before = server_cpu_seconds(admin)
    decisions = work()
    cpu_after = server_cpu_seconds(admin)
    stats = script_stats(admin)
    calls = stats["calls"]
    return {
        "decisions": decisions,
        "script_us": stats["usec"] / calls if calls else float("nan"),
        "server_cpu_us": (cpu_after - cpu_before) * 1e6 / decisions,
    }


def _fill_ours(
    url: str, admin: redis.Redis, alg: str, limit: int, ids: list[str], fill: int
) -> dict[str, Any]:
    """Fill ``ids`` round-robin to ``fill`` hits each, then hit beyond: per-decision costs."""
    limiter = _limiter(url, alg, limit)
    try:
        limiter.hit("api", "warm-up")  # connect and load the script outside the count

        def admitted() -> int:
            for _ in range(fill):
                for identity in ids:
                    limiter.hit("api", identity)
            return fill * len(ids)

        def denied() -> int:
            for _ in range(DENIED_PER_IDENTITY):
                for identity in ids:
                    limiter.hit("api", identity)
            return DENIED_PER_IDENTITY * len(ids)

        return {"admitted": _measured(admin, admitted), "denied": _measured(admin, denied)}
    finally:
        limiter.close()


def _fill_limits(
    storage: RedisStorage, admin: redis.Redis, alg: str, limit: int, ids: list[str], fill: int
) -> dict[str, float]:
    """The same fill with the limits counterpart, hit + get_window_stats per decision."""
    strategy = COUNTERPARTS[alg][1](storage)
    item = parse(f"{limit}/minute")
    strategy.hit(item, "warm-up")

    def work() -> int:
        for _ in range(fill):
            for identity in ids:
                strategy.hit(item, identity)
                strategy.get_window_stats(item, identity)
        return fill * len(ids)

    return _measured(admin, work)


def _cpu(url: str, admin: redis.Redis, settings: Settings) -> dict[str, Any]:
    """Script and server CPU per decision, for applimit and limits, medians of repeats.

    Each repeat runs every algorithm and limit once, applimit then limits on fresh
    identities, so the repeats spread the machine's bursts of noise over all of them.
    """
    runs: dict[str, list[dict[str, float]]] = {}
    identities = settings.count(CPU_IDENTITIES, minimum=2)
    storage = RedisStorage(url)
    try:
        for repeat in range(REPEATS if not settings.quick else 1):
            for alg in ALGORITHMS:
                for limit in LIMITS:
                    fill = settings.count(limit, minimum=2)
                    ids = [f"user-{alg}-{limit}-{repeat}-{i}" for i in range(identities)]
                    admin.flushall()
                    ours = _fill_ours(url, admin, alg, limit, ids, fill)
                    admin.flushall()
                    ref = _fill_limits(storage, admin, alg, limit, ids, fill)
                    runs.setdefault(f"{alg}.{limit}.admitted", []).append(ours["admitted"])
                    runs.setdefault(f"{alg}.{limit}.denied", []).append(ours["denied"])
                    runs.setdefault(f"limits.{alg}.{limit}", []).append(ref)
    finally:
        close_storage(storage)
    return {
        key: {
            "script_us": median([r["script_us"] for r in values]),
            "server_cpu_us": median([r["server_cpu_us"] for r in values]),
            "runs": values,
        }
        for key, values in runs.items()
    }


def _library_until(name: str, marker: str) -> str:
    """The limiter's own library, its function returning a reply of the real shape just
    before ``marker`` (a line of decide.lua): what the script costs up to there."""
    library = _script.assemble_library(name)
    if marker not in library:
        raise RuntimeError(f"decide.lua has no line {marker!r}: update the ladder")
    return library.replace(marker, "do return {now, n, 1, 1, 0, 0, -1} end\n" + marker, 1)


# The script's time in Redis, one step at a time, for one gcra check: each function adds one
# part of a decision to the one before (see LADDER_STEPS).
LADDER = {
    "bench_empty": EMPTY_LIBRARY,
    "bench_reply": (
        "#!lua name=bench_reply\nredis.register_function('bench_reply', "
        "function(keys, args) return {1, 1, 1, 1, 0, 0, -1} end)\n"
    ),
    "bench_time": (
        "#!lua name=bench_time\nredis.register_function('bench_time', function(keys, args)\n"
        "  local t = redis.call('TIME')\n"
        "  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
        "  return {now, 1, 1, 1, 0, 0, -1}\nend)\n"
    ),
    "bench_parsed": _library_until("bench_parsed", "if mode == 'refund' then"),
    "bench_checked": _library_until("bench_checked", "if mode == 'hit' and pass then"),
}
LADDER_STEPS = {
    "bench_empty": "FCALL of a function that returns 1, with a decision's keys and arguments",
    "bench_reply": "... returning the 7 integers of a decision's reply instead",
    "bench_time": "... after reading the server's clock (TIME), as a decision does",
    "bench_parsed": "the limiter's script up to its checks parsed from the arguments",
    "bench_checked": "... and the check evaluated (gcra: GET the state, the arithmetic)",
    "full": "the whole decision (and the state written: SET)",
}


def _ladder(admin: redis.Redis, url: str, settings: Settings) -> dict[str, float]:
    """usec per call of each step of LADDER, and of the whole decision, all sent with one
    gcra decision's keys and arguments (a limit too high to deny: every call writes)."""
    limiter = _limiter(url, "gcra", 10**9)
    try:
        call = limiter.core.for_limit("hit", "api", "user-ladder", None, 1).calls[0]
        limiter.hit("api", "user-ladder")  # loads the library
    finally:
        limiter.close()
    for library in LADDER.values():
        admin.function_load(library, replace=True)
    functions = [*LADDER, _script.FUNCTION]
    runs: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(REPEATS):
        # Every step once per repeat, so the machine's bursts of noise spread over all.
        for name in functions:
            admin.config_resetstat()
            for _ in range(settings.count(2000, minimum=20)):
                admin.fcall(name, len(call.keys), *call.keys, *call.args)
            stats = commandstats(admin)["fcall"]
            runs[name].append(float(stats["usec"]) / float(stats["calls"]))
    out = {name: median(runs[name]) for name in LADDER}
    out["full"] = median(runs[_script.FUNCTION])
    return out


def _usage(admin: redis.Redis) -> dict[str, int]:
    """MEMORY USAGE (exact) of every key in the database."""
    return {
        key.decode(): int(admin.memory_usage(key, samples=0) or 0)
        for key in admin.scan_iter(count=1000)
    }


def _fill(url: str, admin: redis.Redis, alg: str, limit: int, identity: str) -> dict[str, Any]:
    """Fill one identity to ``limit`` from empty; its keys' sizes after one hit and at the end."""
    admin.flushall()
    limiter = _limiter(url, alg, limit)
    try:
        limiter.hit("api", identity)
        first = sum(_usage(admin).values())
        for _ in range(limit - 1):
            limiter.hit("api", identity)
        usage = _usage(admin)
    finally:
        limiter.close()
    total = sum(usage.values())
    return {
        "keys": usage,
        "total": total,
        "after_one": first,
        "per_entry": total / limit,
        "marginal": (total - first) / (limit - 1),
    }


def _memory(url: str, admin: redis.Redis) -> dict[str, Any]:
    """Bytes per identity per limit, and per sliding-log entry, after filling one identity."""
    identity = str(uuid.UUID(bytes=hashlib.sha256(b"bench").digest()[:16]))
    out: dict[str, Any] = {"identity": identity, "short_identity": SHORT_IDENTITY}
    for alg in ALGORITHMS:
        for limit in LOG_SIZES if alg == "sliding_log" else LIMITS:
            out[f"{alg}.{limit}"] = _fill(url, admin, alg, limit, identity)
            out[f"short.{alg}.{limit}"] = _fill(url, admin, alg, limit, SHORT_IDENTITY)
    storage = RedisStorage(url)
    try:
        for alg, (_, cls) in COUNTERPARTS.items():
            for limit in LOG_SIZES if alg == "sliding_log" else LIMITS:
                admin.flushall()
                strategy = cls(storage)
                item = parse(f"{limit}/minute")
                for _ in range(limit):
                    strategy.hit(item, identity)
                out[f"limits.{alg}.{limit}"] = {"total": sum(_usage(admin).values())}
    finally:
        close_storage(storage)
    return out


def run(settings: Settings) -> Result:
    """Measure Redis CPU per decision and memory per identity for each algorithm."""
    started = time.perf_counter()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            "Redis CPU per decision for each algorithm at limits of 10, 100 and 1000 per "
            "minute (script time from `INFO commandstats`, whole-server CPU from `INFO "
            "cpu`), and bytes per identity (`MEMORY USAGE ... SAMPLES 0`) after filling "
            "one identity to the limit."
        ),
        params={
            "limits": list(LIMITS),
            "cpu_identities": settings.count(CPU_IDENTITIES, minimum=2),
            "log_sizes": list(LOG_SIZES),
        },
    )
    with redis_server() as server, server.client() as admin:
        cpu = _cpu(server.url, admin, settings)
        ladder = _ladder(admin, server.url, settings)
        memory = _memory(server.url, admin)
    empty = ladder["bench_empty"]
    result.data.update(
        {"cpu": cpu, "empty_script_us": empty, "script_ladder_us": ladder, "memory": memory}
    )
    rows: list[list[str]] = []
    for alg in ALGORITHMS:
        label = COUNTERPARTS[alg][0]
        for limit in LIMITS:
            admitted = cpu[f"{alg}.{limit}.admitted"]
            denied = cpu[f"{alg}.{limit}.denied"]
            ref = cpu[f"limits.{alg}.{limit}"]
            rows.append(
                [
                    alg,
                    f"{limit}/1m",
                    fmt_us(admitted["script_us"]),
                    fmt_us(admitted["server_cpu_us"]),
                    fmt_us(denied["script_us"]),
                    f"{label}: {fmt_us(ref['server_cpu_us'])}",
                ]
            )
    result.tables.append(
        Table(
            title="Redis time per decision",
            columns=[
                "algorithm",
                "limit",
                "script (admitted)",
                "server CPU (admitted)",
                "script (denied)",
                "limits: server CPU per hit + stats",
            ],
            rows=rows,
            note=(
                "Floor: an FCALL of a function that returns 1, with a decision's keys and "
                f"arguments takes {fmt_us(empty)} in Redis. Admitted: identities filled "
                "from empty to the limit; denied: hits beyond it."
            ),
        )
    )
    ladder_rows: list[list[str]] = []
    before = 0.0
    for name, step in LADDER_STEPS.items():
        took = ladder[name]
        ladder_rows.append([step, fmt_us(took), fmt_us(took - before) if before else "-"])
        before = took
    result.tables.append(
        Table(
            title="Where the script's time goes (one gcra check, admitted)",
            columns=["step", "script time in Redis", "added by the step"],
            rows=ladder_rows,
            note=(
                "Each step a function of its own, called with the same keys and arguments "
                "(usec per call from INFO commandstats, medians): the floor any Lua decision "
                "pays, then what each part of the limiter's script adds. The steps of the "
                "limiter's script are its own library cut short (a reply of the real shape "
                "returned early), so they follow the code."
            ),
        )
    )
    mem_rows: list[list[str]] = []
    for alg in ALGORITHMS:
        label = COUNTERPARTS[alg][0]
        for limit in LOG_SIZES if alg == "sliding_log" else LIMITS:
            probe = memory[f"{alg}.{limit}"]
            short = memory[f"short.{alg}.{limit}"]
            ref = memory[f"limits.{alg}.{limit}"]
            log = alg == "sliding_log"
            mem_rows.append(
                [
                    alg,
                    f"{limit}/1m",
                    fmt_bytes(probe["total"]),
                    fmt_bytes(probe["per_entry"]) if log else "-",
                    fmt_bytes(probe["marginal"]) if log else "-",
                    fmt_bytes(short["total"]),
                    f"{label}: {fmt_bytes(ref['total'])}",
                ]
            )
    result.tables.append(
        Table(
            title="Bytes in Redis per identity and limit, filled to the limit",
            columns=[
                "algorithm",
                "limit",
                "bytes (UUID id)",
                "per entry",
                "one more entry",
                f"bytes ({len(SHORT_IDENTITY)}-digit id)",
                "limits (UUID id)",
            ],
            rows=mem_rows,
            note=(
                f"UUID identity `{memory['identity']}`, numeric identity "
                f"`{SHORT_IDENTITY}`; key names like "
                f"`{next(iter(memory['gcra.10']['keys']))}`. MEMORY USAGE counts the key "
                "name, the value and Redis' bookkeeping for them, so the identity's length "
                "shows in every key. Per entry: the key's total over its entries; one more "
                "entry: what the log grows by per admitted request."
            ),
        )
    )
    for alg in ("gcra", "sliding_window"):
        worst = max(memory[f"{alg}.{limit}"]["total"] for limit in LIMITS)
        short = max(memory[f"short.{alg}.{limit}"]["total"] for limit in LIMITS)
        result.targets.append(
            Target(
                key=f"memory.{alg}",
                text=f"{alg}: bytes per identity and limit (UUID identity)",
                measured=float(worst),
                threshold=STATE_TARGET,
                short=f"{alg}: bytes per identity",
                higher_is_better=False,
                unit="B",
                note=f"{fmt_bytes(short)} with a {len(SHORT_IDENTITY)}-digit identity",
            )
        )
    compact = [n for n in LOG_SIZES if n <= LISTPACK_ENTRIES]
    worst_entry = max(memory[f"sliding_log.{n}"]["marginal"] for n in compact)
    amortised = ", ".join(
        f"{fmt_bytes(memory[f'sliding_log.{n}']['per_entry'])} at {n}" for n in compact
    )
    result.targets.append(
        Target(
            key="memory.sliding_log.entry",
            text=f"sliding_log: bytes per entry up to {LISTPACK_ENTRIES} entries (UUID identity)",
            measured=worst_entry,
            threshold=ENTRY_TARGET,
            short="sliding_log: bytes per entry",
            higher_is_better=False,
            unit="B",
            note=f"growth per entry, worst size; with the key's share: {amortised}",
        )
    )
    big = memory[f"sliding_log.{max(LOG_SIZES)}"]
    result.notes.append(
        f"Past {LISTPACK_ENTRIES} entries a sorted set becomes a skiplist: at "
        f"{max(LOG_SIZES)} entries the log takes {fmt_bytes(big['per_entry'])} per entry."
    )
    result.data["median_script_us"] = median(
        [v["script_us"] for k, v in cpu.items() if k.endswith(".admitted")]
    )
    result.seconds = time.perf_counter() - started
    return result
