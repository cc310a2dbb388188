"""Redis Cluster with three masters versus one server, many identities.

A three-master cluster (no replicas: they would only take CPU from the masters on a
small machine) and a standalone server are started side by side. One sync ``Limiter``
per backend is shared by a few threads (one thread waits on one master at a time and
would leave the other two idle; the cluster client opens connections per node as the
threads need them), and each thread hits its own share of many identities, so keys
spread over every slot. The two backends run interleaved; the result is cluster / one
server per algorithm.

On a two-core machine the client (Python, one GIL) is the bottleneck long before three
masters are, so this measures what the cluster client costs per decision rather than
how far the cluster scales; on real hardware the masters run on their own machines.
"""

from __future__ import annotations

import threading
import time

from applimit import Limiter

from ._common import (
    Identities,
    LimitSpec,
    RedisCluster,
    Result,
    Runner,
    Settings,
    Table,
    Variant,
    fmt_rate,
    fmt_ratio,
    interleave,
    make_policy,
    median,
    ratios,
    redis_server,
)

NAME = "cluster"
TITLE = "Redis Cluster (3 masters) versus one server"

ALGORITHMS = ("sliding_log", "gcra")
THREADS = 4
IDENTITIES = 100_000
RATE = "1000/1m"


def threaded(limiter: Limiter, name: str, prefix: str, threads: int, denied: list[int]) -> Runner:
    """A runner: ``threads`` threads calling ``limiter.hit`` until the slice is over."""
    shares = [Identities(f"{prefix}-t{t}", IDENTITIES // threads) for t in range(threads)]
    lock = threading.Lock()

    def run(seconds: float) -> int:
        counts = [0] * threads
        deadline = time.perf_counter() + seconds

        def work(index: int) -> None:
            ids = shares[index]
            done = refused = 0
            while time.perf_counter() < deadline:
                for _ in range(16):
                    if not limiter.hit(name, ids()).allowed:
                        refused += 1
                done += 16
            counts[index] = done
            with lock:
                denied[0] += refused

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return sum(counts)

    return run


def run(settings: Settings) -> Result:
    """Measure decisions per second on the cluster and on one server, interleaved."""
    started = time.perf_counter()
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            f"`Limiter.hit()` from {THREADS} threads sharing one limiter, over "
            f"{IDENTITIES:,} identities, on a Redis Cluster of three masters (no replicas) "
            "versus one standalone server, interleaved."
        ),
        params={"threads": THREADS, "identities": IDENTITIES, "rate": RATE, "masters": 3},
    )
    specs = [LimitSpec(alg, alg, RATE) for alg in ALGORITHMS]
    denied: dict[str, list[int]] = {}
    cluster = RedisCluster(masters=3, replicas_per_master=0)
    cluster.start()
    try:
        with redis_server() as server:
            on_cluster = Limiter(
                make_policy(cluster.url, specs), redis_url=cluster.url, cluster=True
            )
            single = Limiter(make_policy(server.url, specs), redis_url=server.url)
            try:
                variants: list[Variant] = []
                for alg in ALGORITHMS:
                    for label, limiter in (("cluster", on_cluster), ("single", single)):
                        key = f"{label}_{alg}"
                        denied[key] = [0]
                        variants.append(
                            Variant(key, key, threaded(limiter, alg, key, THREADS, denied[key]))
                        )
                # Every slice starts and joins threads: longer slices.
                result.rates = interleave(variants, settings.stretched(3))
            finally:
                on_cluster.close()
                single.close()
    finally:
        cluster.close()
    rows: list[list[str]] = []
    for alg in ALGORITHMS:
        on, one = result.rates[f"cluster_{alg}"], result.rates[f"single_{alg}"]
        ratio = result.ratios[f"cluster_{alg}/single_{alg}"] = ratios(on, one)
        rows.append([alg, fmt_rate(median(on)), fmt_rate(median(one)), fmt_ratio(median(ratio))])
    result.tables.append(
        Table(
            title="Decisions per second and ratio (medians)",
            columns=["algorithm", "cluster (3 masters)", "one server", "cluster / one"],
            rows=rows,
        )
    )
    lost = {k: v[0] for k, v in denied.items() if v[0]}
    if lost:
        result.notes.append(f"Some decisions were denials, which are cheaper: {lost}.")
    result.seconds = time.perf_counter() - started
    return result
