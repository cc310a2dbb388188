"""What every benchmark shares: settings, Redis servers, interleaved timing, results.

Timing. The machines these run on are small and noisy (two cores shared with other
work), so an absolute rate measured now and another measured a minute later are not
comparable. Every benchmark therefore runs the project and its reference *side by side*:
:func:`interleave` runs each variant for a short slice, one after the other, for several
rounds (the order rotated each round), and a ratio is computed per round from slices that
ran moments apart, so they saw the same machine. The reported ratio is the median of the
per-round ratios; absolute rates are medians too, printed for scale only.

Servers are real ``redis-server`` processes from the test harness (``tests/harness``),
started on free ports and closed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import edgegen_policy as policy
import redis
from edgegen_policy import Policy

ROOT = Path(__file__).resolve().parent.parent
_TESTS = ROOT / "tests"
if str(_TESTS) not in sys.path:
    # The harness lives with the tests (which import it as ``harness``); importing it the
    # same way here means one copy of the module under pytest too.
    sys.path.insert(0, str(_TESTS))

from harness import RedisCluster, RedisServer  # noqa: E402 - needs the path set up above

__all__ = [
    "ROOT",
    "Identities",
    "LimitSpec",
    "RedisCluster",
    "RedisServer",
    "Result",
    "Runner",
    "Settings",
    "Table",
    "Target",
    "Variant",
    "close_storage",
    "commandstats",
    "fmt_bytes",
    "fmt_rate",
    "fmt_ratio",
    "fmt_us",
    "interleave",
    "limiter_client",
    "make_policy",
    "median",
    "quartiles",
    "ratios",
    "redis_server",
    "server_cpu_seconds",
    "sync_loop",
]

Status = Literal["PASS", "MISS", "N/A"]


# --- settings ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """How long to measure: ``rounds`` interleaved rounds of ``seconds`` per variant.

    Many short rounds rather than a few long ones: the noise on a shared machine comes
    in bursts of a fraction of a second to seconds, and a ratio is only as good as the
    likeness of the moments its two slices ran in. ``scale`` shrinks the work of
    benchmarks that count operations instead of timing them (fills, probes): 1.0
    normally, small in quick mode. ``quick`` runs are smoke runs: their numbers are too
    short to mean anything, only their shape is checked.
    """

    rounds: int = 25
    seconds: float = 0.08
    warmup: float = 0.2
    scale: float = 1.0
    quick: bool = False

    @classmethod
    def for_mode(cls, *, quick: bool) -> Settings:
        """The defaults (a full ``make bench`` in about eight minutes) or the smoke ones."""
        if quick:
            return cls(rounds=2, seconds=0.03, warmup=0.02, scale=0.05, quick=True)
        return cls()

    def stretched(self, factor: int) -> Settings:
        """Slices ``factor`` times longer, ``factor`` times fewer rounds (same total time).

        For workloads with a fixed cost per slice (starting threads, gathering hundreds
        of coroutines and waiting for the last of them), which short slices would inflate.
        """
        return replace(
            self, seconds=self.seconds * factor, rounds=max(2, math.ceil(self.rounds / factor))
        )

    def count(self, full: int, minimum: int = 1) -> int:
        """``full`` operations scaled for this run, at least ``minimum``."""
        return max(minimum, round(full * self.scale))


# --- Redis -------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(*extra_args: str) -> Iterator[RedisServer]:
    """A fresh ``redis-server`` on a free port, closed (process and files) on exit."""
    server = RedisServer(extra_args=extra_args)
    server.start()
    try:
        yield server
    finally:
        server.close()


def commandstats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """``INFO commandstats`` as ``{"evalsha": {"calls": .., "usec": .., ...}, ...}``.

    Redis 7 also counts the commands a script runs (``redis.call``) under their own names,
    and includes their time in the script's ``usec``.
    """
    raw = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): dict(stats) for name, stats in raw.items()}


# The commands that run the limiter's script: FCALL of its library, and EVALSHA and EVAL
# where Redis Functions are refused (or for a reference that uses them).
SCRIPT_COMMANDS = ("fcall", "evalsha", "eval")


def script_stats(client: redis.Redis) -> dict[str, float]:
    """Calls and µs of the script commands together, from ``INFO commandstats``."""
    stats = commandstats(client)
    return {
        key: float(sum(stats.get(name, {}).get(key, 0) for name in SCRIPT_COMMANDS))
        for key in ("calls", "usec")
    }


def server_cpu_seconds(client: redis.Redis) -> float:
    """CPU time the server process has used (user + system), from ``INFO cpu``.

    Unlike ``commandstats`` this includes reading requests and writing replies, i.e. what
    every extra round trip costs the server.
    """
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def limiter_client(limiter: Any) -> redis.Redis:
    """The limiter's own sync client, so a reference loop can run on the same connection.

    This reaches into the limiter (its wire's client) on purpose: the floor of a decision
    is one round trip on *its* connection, with its pool and socket settings.
    """
    client: redis.Redis = limiter._wire.client()
    return client


def wire_ping(limiter: Any) -> Callable[[], object]:
    """A PING sent the way the limiter sends its script calls (its wire, see
    applimit/_wire.py): packed once, on a connection the limiter holds. The strictest
    floor: one round trip with none of redis-py's per-command work. Reaches into the
    limiter on purpose, like :func:`limiter_client`."""
    wire = limiter._wire
    packed = b"*1\r\n$4\r\nPING\r\n"

    def ping() -> object:
        return wire.send(packed)

    return ping


def close_storage(storage: Any) -> None:
    """Close the connections of a ``limits`` Redis storage (it has no close of its own)."""
    storage.get_connection().close()


# --- policies ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitSpec:
    """One app limit of a benchmark policy (by default matching paths under ``/api/``)."""

    name: str
    algorithm: str
    rate: str | list[str]
    options: Mapping[str, Any] = field(default_factory=dict)
    per: str = "user"
    path_prefix: str = "/api/"


def make_policy(url: str, specs: Sequence[LimitSpec], *, key_prefix: str = "rl") -> Policy:
    """A one-tier policy with ``specs`` as its app limits, talking to Redis at ``url``."""
    document = {
        "version": 1,
        "tiers": ["free"],
        "app": {
            "redis_url": url,
            "key_prefix": key_prefix,
            # Generous: a slow moment on a busy machine must not turn into a degraded
            # (fail-open) decision, which would skip Redis and inflate the rate.
            "timeout": "2s",
        },
        "limits": [
            {
                "name": spec.name,
                "match": {"path_prefix": spec.path_prefix},
                "app": {
                    "per": spec.per,
                    "algorithm": spec.algorithm,
                    "tiers": {"free": spec.rate},
                    **spec.options,
                },
            }
            for spec in specs
        ],
    }
    # JSON is YAML, and spares us building YAML text by hand.
    return policy.loads(json.dumps(document))


class Identities:
    """An endless round-robin of ``count`` distinct identities named ``<prefix>-<i>``.

    Benchmarks spread hits over many identities so that every decision is an admitted
    one (as most requests are) and per-identity state stays small and realistic.
    """

    def __init__(self, prefix: str, count: int) -> None:
        """Precompute the names: building strings must not be part of what is timed."""
        self.names = [f"{prefix}-{i:07d}" for i in range(count)]
        self._next = 0

    def __call__(self) -> str:
        """The next identity."""
        name = self.names[self._next]
        self._next = (self._next + 1) % len(self.names)
        return name


# --- timing ------------------------------------------------------------------------------

Runner = Callable[[float], int]
"""Runs a workload for about the given number of seconds; returns the operations done."""


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: a name, a label for reports, and its workload."""

    name: str
    label: str
    run: Runner


def sync_loop(step: Callable[[], object], *, chunk: int = 32) -> Runner:
    """A runner calling ``step`` in one thread, checking the clock every ``chunk`` calls."""

    def run(seconds: float) -> int:
        done = 0
        end = time.perf_counter() + seconds
        while True:
            for _ in range(chunk):
                step()
            done += chunk
            if time.perf_counter() >= end:
                return done

    return run


def interleave(variants: Sequence[Variant], settings: Settings) -> dict[str, list[float]]:
    """Per-round rates (operations per second) of each variant, measured interleaved.

    Every variant first runs once for ``settings.warmup`` (connections, script cache,
    lazily built state), then each round runs every variant for ``settings.seconds``.
    The order rotates each round so that no variant always follows the same neighbour.
    """
    for variant in variants:
        variant.run(settings.warmup)
    rates: dict[str, list[float]] = {v.name: [] for v in variants}
    for round_index in range(settings.rounds):
        shift = round_index % len(variants)
        for variant in [*variants[shift:], *variants[:shift]]:
            started = time.perf_counter()
            done = variant.run(settings.seconds)
            elapsed = time.perf_counter() - started
            rates[variant.name].append(done / elapsed)
    return rates


def ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-round ratios of two series measured in the same rounds."""
    return [a / b for a, b in zip(numerator, denominator, strict=True)]


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values (reported as missing, never as a pass)."""
    return statistics.median(values) if values else math.nan


def quartiles(values: Sequence[float]) -> list[float]:
    """First and third quartile (the middle half of the rounds); empty for < 2 values."""
    if len(values) < 2:
        return []
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [q1, q3]


# --- results -----------------------------------------------------------------------------


@dataclass
class Target:
    """One target of the issue and what was measured against it.

    ``measured`` is None when the thing cannot be measured yet (the status is then N/A,
    never PASS). ``higher_is_better`` says which side of ``threshold`` passes; ``short``
    labels the target in the chart. ``spread`` is the middle half of the per-round
    values (first and third quartile) when the measurement has rounds: how much to
    trust the median on a noisy machine.
    """

    key: str
    text: str
    measured: float | None
    threshold: float
    higher_is_better: bool = True
    unit: str = "x"
    note: str = ""
    short: str = ""
    spread: list[float] = field(default_factory=list)

    @property
    def status(self) -> Status:
        """PASS, MISS, or N/A when nothing was measured."""
        if self.measured is None or math.isnan(self.measured):
            return "N/A"
        if self.higher_is_better:
            return "PASS" if self.measured >= self.threshold else "MISS"
        return "PASS" if self.measured <= self.threshold else "MISS"

    @property
    def goal(self) -> str:
        """The target as text, e.g. ``>= 0.80x`` or ``<= 128 B``."""
        op = ">=" if self.higher_is_better else "<="
        return f"{op} {_fmt_unit(self.threshold, self.unit)}"

    @property
    def shown(self) -> str:
        """The measured value as text."""
        if self.measured is None or math.isnan(self.measured):
            return "-"
        return _fmt_unit(self.measured, self.unit)

    @property
    def shown_spread(self) -> str:
        """The middle half of the rounds as text, e.g. ``0.29x-0.51x``; ``-`` without rounds."""
        if len(self.spread) != 2:
            return "-"
        low, high = self.spread
        return f"{_fmt_unit(low, self.unit)}-{_fmt_unit(high, self.unit)}"


@dataclass
class Table:
    """A table for the report: cells are already formatted text."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Result:
    """Everything one benchmark run produced, as written to ``bench/results/<name>.json``.

    ``rates`` and ``ratios`` keep every round's value (the tables show medians), ``data``
    other raw numbers (bytes, microseconds), so results can be re-analysed later.
    """

    name: str
    title: str
    summary: str
    params: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0
    quick: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; targets carry their status and goal as text too."""
        out = asdict(self)
        for target, raw in zip(self.targets, out["targets"], strict=True):
            raw["status"] = target.status
            raw["goal"] = target.goal
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Result:
        """Rebuild a result written by :meth:`to_json`."""
        fields = dict(raw)
        fields["tables"] = [Table(**t) for t in raw.get("tables", [])]
        fields["targets"] = [
            Target(**{k: v for k, v in t.items() if k not in {"status", "goal"}})
            for t in raw.get("targets", [])
        ]
        return cls(**fields)


# --- formatting --------------------------------------------------------------------------


def fmt_rate(value: float) -> str:
    """Operations per second, e.g. ``9,431/s``."""
    return "-" if math.isnan(value) else f"{value:,.0f}/s"


def fmt_ratio(value: float) -> str:
    """A ratio, e.g. ``0.42x``."""
    return "-" if math.isnan(value) else f"{value:.2f}x"


def fmt_us(value: float) -> str:
    """Microseconds, e.g. ``24.8 µs``."""
    return "-" if math.isnan(value) else f"{value:.1f} µs"


def fmt_bytes(value: float) -> str:
    """Bytes, e.g. ``96 B``."""
    return "-" if math.isnan(value) else f"{value:,.0f} B"


def _fmt_unit(value: float, unit: str) -> str:
    if unit == "x":
        return fmt_ratio(value)
    if unit == "B":
        return fmt_bytes(value)
    return f"{value:g} {unit}"


def now_iso() -> str:
    """The current UTC time, ISO 8601, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
