"""A request matching three limits versus one limit (sync, one thread, one connection).

``Limiter.check_request()`` hits every limit whose ``match`` applies, atomically, in one
script call. Here one path matches three limits of the same algorithm (100/1s, 1000/1m
and 10000/1h: a burst, a minute and an hour quota, as APIs commonly stack them) and
another path matches one limit (1000/1m). Both go through ``check_request``, so the
three-versus-one ratio compares like with like, and both are compared with a ``PING``
loop on the same connection. Hits are spread over a thousand identities so every
decision admits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from applimit import Limiter

from ._common import (
    Identities,
    LimitSpec,
    Result,
    Settings,
    Table,
    Target,
    Variant,
    fmt_rate,
    fmt_ratio,
    interleave,
    limiter_client,
    make_policy,
    median,
    quartiles,
    ratios,
    redis_server,
    sync_loop,
    wire_ping,
)

NAME = "multi"
TITLE = "Three limits per request versus one"

ALGORITHMS = ("sliding_log", "sliding_window", "gcra")
THREE = ("100/1s", "1000/1m", "10000/1h")
ONE = "1000/1m"
IDENTITIES = 1000
# Issue 17's target (the first issue set 0.70x).
TARGET = 0.75
TARGETED = ("sliding_log", "gcra")


def _specs() -> list[LimitSpec]:
    specs: list[LimitSpec] = []
    for alg in ALGORITHMS:
        specs.append(LimitSpec(f"one-{alg}", alg, ONE, path_prefix=f"/one/{alg}/"))
        specs.extend(
            LimitSpec(f"three-{alg}-{i}", alg, rate, path_prefix=f"/three/{alg}/")
            for i, rate in enumerate(THREE)
        )
    return specs


def _step(limiter: Limiter, path: str, ids: Identities, denied: list[int]) -> Callable[[], None]:
    def step() -> None:
        if not limiter.check_request("GET", path, ids()).allowed:
            denied[0] += 1

    return step


def run(settings: Settings) -> Result:
    """Measure one-limit and three-limit requests per algorithm, interleaved with PING."""
    started = time.perf_counter()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            "`check_request()` for a path matching three limits (100/1s, 1000/1m, "
            "10000/1h) versus a path matching one (1000/1m), same algorithm, one thread, "
            "one connection, against a `PING` loop on the limiter's client (the issue's "
            "reference) and `PING` sent on the limiter's own wire (the strictest floor)."
        ),
        params={"three": list(THREE), "one": ONE, "identities": IDENTITIES},
    )
    denied: dict[str, list[int]] = {}
    with redis_server() as server:
        limiter = Limiter(make_policy(server.url, _specs()), redis_url=server.url)
        try:
            variants = [
                Variant("ping", "PING loop", sync_loop(limiter_client(limiter).ping)),
                Variant("ping_wire", "PING on the limiter's wire", sync_loop(wire_ping(limiter))),
            ]
            for alg in ALGORITHMS:
                for shape in ("one", "three"):
                    key = f"{shape}_{alg}"
                    denied[key] = [0]
                    ids = Identities(f"user-{key}", IDENTITIES)
                    step = _step(limiter, f"/{shape}/{alg}/items", ids, denied[key])
                    variants.append(Variant(key, f"{shape} limit(s), {alg}", sync_loop(step)))
            result.rates = interleave(variants, settings)
        finally:
            limiter.close()
    rates = result.rates
    rows: list[list[str]] = []
    for alg in ALGORITHMS:
        one, three = rates[f"one_{alg}"], rates[f"three_{alg}"]
        one_ping = result.ratios[f"one_{alg}/ping"] = ratios(one, rates["ping"])
        three_ping = result.ratios[f"three_{alg}/ping"] = ratios(three, rates["ping"])
        three_wire = result.ratios[f"three_{alg}/ping_wire"] = ratios(three, rates["ping_wire"])
        three_one = result.ratios[f"three_{alg}/one_{alg}"] = ratios(three, one)
        rows.append(
            [
                alg,
                fmt_rate(median(one)),
                fmt_ratio(median(one_ping)),
                fmt_rate(median(three)),
                fmt_ratio(median(three_ping)),
                fmt_ratio(median(three_wire)),
                fmt_ratio(median(three_one)),
            ]
        )
        if alg in TARGETED:
            result.targets.append(
                Target(
                    key=f"multi.{alg}.ping",
                    text=f"`check_request()` {alg}, three limits, vs the PING loop",
                    measured=median(three_ping),
                    spread=quartiles(three_ping),
                    threshold=TARGET,
                    short=f"{alg}: three limits / PING",
                )
            )
    result.tables.append(
        Table(
            title="Requests per second and ratios (medians)",
            columns=[
                "algorithm",
                "one limit",
                "vs PING",
                "three limits",
                "vs PING",
                "vs PING on the wire",
                "three / one",
            ],
            rows=rows,
            note=(
                f"PING loop on the limiter's client: {fmt_rate(median(rates['ping']))}; "
                "PING on the limiter's wire (packed once, on a connection it holds): "
                f"{fmt_rate(median(rates['ping_wire']))}."
            ),
        )
    )
    lost = {k: v[0] for k, v in denied.items() if v[0]}
    if lost:
        result.notes.append(f"Some decisions were denials, which are cheaper: {lost}.")
    result.seconds = time.perf_counter() - started
    return result
