"""The failure this project fixes, shown with real processes (``make demo`` runs this).

1. A fleet: one redis-server, four instances of examples/fastapi_app.py (uvicorn, separate
   processes) behind a round-robin front. A free-tier user (100 requests a minute on the
   ``api`` limit) sends a burst through the front, once to a fleet whose instances each keep
   their own in-memory counter, and once to a fleet that uses applimit's shared Redis.
2. A window boundary: the same number of requests just before and just after the boundary of
   a fixed window (how the edge counts) against applimit's sliding window, log and GCRA.
3. What the applimit fleet's own metrics say: each instance serves ``/metrics``
   (``applimit.prometheus``); the demo reads all four and prints the decisions summed by
   limit, tier and outcome, the numbers an operator's dashboard would show
   (examples/grafana-dashboard.json).

Run it with ``make demo`` or ``.venv/bin/python examples/fleet_demo.py``. Needs
``redis-server`` on PATH; every process it starts is stopped before it exits, also on Ctrl-C.

The front and the naive instances are app factories in this module, started by uvicorn as
``fleet_demo:front_app`` and ``fleet_demo:naive_app``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

HERE = Path(__file__).resolve().parent
POLICY = HERE / "policy.yaml"
HOST = "127.0.0.1"
INSTANCES = 4
REQUESTS = 600
CONCURRENCY = 24
USER_KEY = "key-alice"  # a free-tier user in examples/fastapi_app.py
EXPORTER_KEY = "key-bob"  # a pro-tier user: downloads exports (a shadow limit, 50/1h for pro)
EXPORTS = 60
STARTUP_TIMEOUT = 30.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# --- processes ---------------------------------------------------------------------------


class DemoError(RuntimeError):
    """Something the demo needs is missing or did not start; the message says what."""


_CHILDREN: list[subprocess.Popen[bytes]] = []
# Where the children's output goes (a file, so that a chatty child can never block on a
# full pipe); set by main() to its temporary directory.
_LOG_DIR: list[Path] = []


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``procs`` (SIGKILL after 5 s) and forget them."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc in _CHILDREN:
            _CHILDREN.remove(proc)


@atexit.register
def _stop_children() -> None:
    """Stop every process this demo started (also after Ctrl-C or an error)."""
    stop(list(reversed(_CHILDREN)))


def _spawn(
    name: str, argv: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> tuple[subprocess.Popen[bytes], Path]:
    log = _LOG_DIR[0] / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=pass_fds,
        )
    _CHILDREN.append(proc)
    return proc, log


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _wait_for(
    what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path
) -> None:
    """Poll ``ready`` until it holds; fail with the process's own output if it died."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if proc.poll() is not None:
            output = log.read_text(errors="replace")[-4000:]
            raise DemoError(f"{what} exited with status {proc.returncode}:\n{output}")
        with contextlib.suppress(OSError, redis.RedisError, httpx.HTTPError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise DemoError(f"{what} did not become ready within {STARTUP_TIMEOUT:.0f}s")
        # Polling interval, not a race workaround: readiness is re-checked every round.
        time.sleep(0.05)


def find_redis_server() -> str:
    """The redis-server executable; DemoError says how to install it when it is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise DemoError(
            "The fleet demo needs redis-server on PATH, and it was not found.\n"
            "Install it with `apt-get install redis-server` (Debian/Ubuntu) or "
            "`brew install redis` (macOS), then run `make demo` again."
        )
    return binary


def start_redis(binary: str, workdir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Start a private redis-server on a free port; return its URL and process."""
    port = _free_port()
    argv = [binary, "--port", str(port), "--bind", HOST]
    # No persistence: the demo's data lives and dies with the process.
    argv += ["--save", "", "--appendonly", "no", "--dir", str(workdir)]
    proc, log = _spawn("redis-server", argv)
    url = f"redis://{HOST}:{port}/0"

    def ping() -> bool:
        with redis.Redis.from_url(url, socket_timeout=1) as client:
            return bool(client.ping())

    _wait_for(f"redis-server on port {port}", ping, proc, log)
    return url, proc


def start_uvicorn(target: str, env: dict[str, str]) -> Callable[[], str]:
    """Start ``uvicorn <target>`` from examples/ on a free port, without waiting.

    Returns a function that waits until the instance answers and gives its base URL, so a
    fleet starts in parallel. Targets named ``*_app`` without ``:app`` are app factories.
    """
    # The instance serves a socket bound here and handed over (--fd): a port picked free
    # and bound later by the child could be taken in between, by another instance even,
    # whose /healthz would then answer for both (and be counted twice).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen(128)
    port = int(listener.getsockname()[1])
    argv = [sys.executable, "-m", "uvicorn", target, "--app-dir", str(HERE)]
    argv += ["--fd", str(listener.fileno()), "--no-access-log", "--log-level", "warning"]
    # The middleware reads X-Forwarded-For itself, from the proxies it is told to trust.
    argv += ["--no-proxy-headers", "--lifespan", "on"]
    if not target.endswith(":app"):
        argv.append("--factory")
    try:
        proc, log = _spawn(f"uvicorn-{port}", argv, env, pass_fds=(listener.fileno(),))
    finally:
        # The child holds its own copy of the socket.
        listener.close()
    base = f"http://{HOST}:{port}"

    def healthy() -> bool:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200

    def wait() -> str:
        _wait_for(f"uvicorn {target} on port {port}", healthy, proc, log)
        return base

    return wait


# --- the naive limiter and the front -----------------------------------------------------


class NaiveFixedWindow:
    """The per-instance counter from the blog post: a dict in this process, fixed windows.

    Counts each caller's requests to the ``api`` limit's paths in the current window and
    refuses above the free tier's quota. Correct on one instance; on N instances behind a
    load balancer each sees 1/N of the traffic, so the fleet admits N times the limit.
    """

    def __init__(self, app: ASGIApp, *, limit: int, window_s: float, prefix: str) -> None:
        """Wrap ``app``; count requests under ``prefix`` per caller, ``limit`` per window."""
        self.app = app
        self.limit = limit
        self.window_s = window_s
        self.prefix = prefix
        self.counts: dict[tuple[str, int], int] = {}
        # Windows counted from the instance's start, not the wall clock's minute: the
        # demo's few seconds of traffic then fall in one window of every instance, and the
        # table shows the fleet's N x the limit, not N x the limit plus a window edge.
        self.started = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Count and maybe refuse one request."""
        from fastapi_app import identify

        from applimit.asgi import RequestInfo

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = RequestInfo.from_asgi(scope)
        if not request.path.startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        caller = identify(request)
        who = caller.user if caller else str(request.peer)
        key = (who, math.floor((time.monotonic() - self.started) / self.window_s))
        self.counts[key] = self.counts.get(key, 0) + 1
        if self.counts[key] > self.limit:
            await send({"type": "http.response.start", "status": 429, "headers": []})
            await send({"type": "http.response.body", "body": b"rate limited"})
            return
        await self.app(scope, receive, send)


def free_api_rate() -> tuple[int, float, str]:
    """The example policy's free-tier rate of the ``api`` limit: requests, seconds, text."""
    import edgegen_policy as policy

    api = policy.load(POLICY).limit("api")
    assert api.app is not None
    (rate,) = api.app.tiers["free"]
    return rate.limit, rate.period.seconds, str(rate)


def naive_app() -> ASGIApp:
    """The example app without applimit, behind a per-instance in-memory counter."""
    from fastapi_app import create_app

    limit, window_s, _ = free_api_rate()
    return NaiveFixedWindow(
        create_app(rate_limited=False), limit=limit, window_s=window_s, prefix="/api/"
    )


# Hop-by-hop headers stay on their hop; the body is passed on decoded and re-framed, so its
# encoding and length headers are the front's to set.
_HOP_BY_HOP = {
    "accept-encoding",
    "content-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "content-length",
}


def front_app() -> ASGIApp:
    """A round-robin HTTP proxy over ``FLEET_BACKENDS`` (comma-separated base URLs).

    Adds X-Forwarded-For like any load balancer and names the instance that answered in
    ``X-Served-By``, so the demo can show how the traffic was split.
    """
    backends = [b for b in os.environ["FLEET_BACKENDS"].split(",") if b]
    turn = itertools.cycle(range(len(backends)))
    clients: list[httpx.AsyncClient] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    clients.append(httpx.AsyncClient(timeout=10))
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    for client in clients:
                        await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        index = next(turn)
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in _HOP_BY_HOP | {"host"}
        ]
        peer = scope["client"][0] if scope.get("client") else HOST
        headers.append(("x-forwarded-for", peer))
        target = backends[index] + scope["raw_path"].decode("latin-1")
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode("latin-1")
        reply = await clients[0].request(scope["method"], target, headers=headers, content=body)
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in reply.headers.multi_items()
            if k.lower() not in _HOP_BY_HOP
        ]
        out.append((b"x-served-by", f"instance-{index + 1}".encode()))
        await send({"type": "http.response.start", "status": reply.status_code, "headers": out})
        await send({"type": "http.response.body", "body": reply.content})

    return app


# --- the runs ----------------------------------------------------------------------------


@dataclass
class FleetResult:
    """What one fleet admitted out of the burst, and where."""

    admitted: int
    refused: int
    per_instance: Counter[str]
    seconds: float


async def _burst(
    front: str, count: int, *, key: str = USER_KEY, path: str = "/api/items"
) -> FleetResult:
    statuses: list[tuple[int, str]] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)
    headers = {"Authorization": f"Bearer {key}"}

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            reply = await client.get(f"{front}{path}", headers=headers)
            statuses.append((reply.status_code, reply.headers.get("x-served-by", "?")))

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    elapsed = time.monotonic() - started
    unexpected = {code for code, _ in statuses} - {200, 429}
    if unexpected:
        raise DemoError(f"the fleet answered with unexpected status codes {sorted(unexpected)}")
    return FleetResult(
        admitted=sum(code == 200 for code, _ in statuses),
        refused=sum(code == 429 for code, _ in statuses),
        per_instance=Counter(where for code, where in statuses if code == 200),
        seconds=elapsed,
    )


# --- the fleet's metrics -----------------------------------------------------------------

# What the metrics table shows, in this order; the outcomes after the first two only when
# some instance counted one.
OUTCOMES = ("allowed", "denied", "shadow_denied", "degraded_allowed", "degraded_denied")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str) -> Samples:
    """One instance's ``/metrics``: each sample by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=5).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def decisions(scraped: list[Samples]) -> dict[tuple[str, str], Counter[str]]:
    """``applimit_decisions_total`` summed over the instances: (limit, tier) -> outcomes."""
    table: dict[tuple[str, str], Counter[str]] = {}
    for samples in scraped:
        for (name, labels), value in samples.items():
            if name != "applimit_decisions_total":
                continue
            label = dict(labels)
            counts = table.setdefault((label["limit"], label["tier"]), Counter())
            counts[label["outcome"]] += int(value)
    return table


def metrics_table(table: dict[tuple[str, str], Counter[str]]) -> list[str]:
    """The lines ``make demo`` prints for the fleet's decisions.

    The metric counts limit *results*: a tier with two rates (api's pro tier, 1000/1m and
    20000/1h) counts each request once per rate, which a note under the table says.
    """
    import edgegen_policy as policy

    loaded = policy.load(POLICY)
    shown = list(OUTCOMES[:2])
    shown += [o for o in OUTCOMES[2:] if any(counts[o] for counts in table.values())]
    widths = [max(len(o), 7) + 2 for o in shown]
    lines = [
        f"   {'limit':10}{'tier':12}"
        + "".join(f"{o:>{w}}" for o, w in zip(shown, widths, strict=True))
    ]
    notes = []
    for (limit, tier), counts in sorted(table.items()):
        cells = "".join(f"{counts[o]:>{w}}" for o, w in zip(shown, widths, strict=True))
        lines.append(f"   {limit:10}{tier:12}{cells}")
        app = loaded.limit(limit).app
        rates = app.tiers.get(tier, ()) if app is not None else ()
        if len(rates) > 1:
            listed = ", ".join(str(rate) for rate in rates)
            notes.append(
                f"   ({limit} {tier} has {len(rates)} rates, {listed}: each request is counted "
                "once per rate)"
            )
    return lines + notes


def start_fleet(target: str, redis_url: str) -> tuple[Callable[[], str], ...]:
    """Start the instances and return their waiters (see :func:`start_uvicorn`)."""
    env = {"REDIS_URL": redis_url, "TRUSTED_PROXIES": HOST}
    return tuple(start_uvicorn(target, env) for _ in range(INSTANCES))


def start_front(backends: list[str]) -> Callable[[], str]:
    """Start the round-robin front over the instances at ``backends``."""
    return start_uvicorn("fleet_demo:front_app", {"FLEET_BACKENDS": ",".join(backends)})


def main() -> int:
    """Run both demonstrations and print the results; exit 1 with a message on failure."""
    try:
        binary = find_redis_server()
        with tempfile.TemporaryDirectory(prefix="applimit-demo-") as workdir:
            _LOG_DIR[:] = [Path(workdir)]
            try:
                _run(binary, Path(workdir))
            finally:
                _stop_children()
    except DemoError as exc:
        print(f"fleet demo: {exc}", file=sys.stderr)
        return 1
    return 0


def _run(redis_binary: str, workdir: Path) -> None:
    limit, _, rate = free_api_rate()
    print(f"== fleet: {INSTANCES} app instances (uvicorn) behind a round-robin front, one Redis")
    redis_url, redis_proc = start_redis(redis_binary, workdir)
    # Both fleets start at once: the instances come up in parallel.
    naive_fleet = start_fleet("fleet_demo:naive_app", redis_url)
    shared_fleet = start_fleet("fastapi_app:app", redis_url)
    shared_backends = [wait() for wait in shared_fleet]
    naive_front = start_front([wait() for wait in naive_fleet])()
    shared_front = start_front(shared_backends)()
    print(
        f"   alice (free tier: api {rate}) sends {REQUESTS} requests to "
        "/api/items through the front"
    )
    naive = asyncio.run(_burst(naive_front, REQUESTS))
    shared = asyncio.run(_burst(shared_front, REQUESTS))
    # Bob's downloads meet the shadow limit "exports": never refused, but counted.
    exports = asyncio.run(
        _burst(shared_front, EXPORTS, key=EXPORTER_KEY, path="/api/v1/exports/monthly")
    )
    if exports.refused:
        raise DemoError(f"{exports.refused} of bob's exports were refused; none should be")
    print()
    print(f"   {'':34}{'admitted':>9}{'refused':>9}   x limit   per instance")
    for label, result in (
        ("per-instance in-memory counter", naive),
        ("applimit (shared Redis)", shared),
    ):
        split = " ".join(
            f"{result.per_instance.get(f'instance-{i + 1}', 0):>3}" for i in range(INSTANCES)
        )
        print(
            f"   {label:34}{result.admitted:>9}{result.refused:>9}"
            f"   {result.admitted / limit:>6.1f}x   {split}"
        )
    print()
    print(
        f"   bob (pro tier) downloads {EXPORTS} exports: the shadow limit exports (pro 50/1h) "
        "refuses none"
    )
    print()
    # Read before the fleet stops; shown last, as the numbers a dashboard would show.
    table = metrics_table(decisions([scrape(base) for base in shared_backends]))
    # The fleets are done; stopping them leaves the machine quiet for the timed part.
    stop([p for p in _CHILDREN if p is not redis_proc])
    boundary(redis_url, workdir)
    print(
        f"== the applimit fleet's /metrics (applimit_decisions_total, summed over the "
        f"{INSTANCES} instances)"
    )
    for line in table:
        print(line)


# --- the window boundary -----------------------------------------------------------------

FIXED_LABEL = "fixed window (as the edge counts)"
_FIXED_WINDOW = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""


def boundary(redis_url: str, workdir: Path) -> None:
    """N requests just before a fixed window's boundary and N just after it.

    A fixed-window counter (the Workers Rate Limiting binding counts this way, and so does
    the blog post's Map) starts from zero at the boundary, so it admits 2N; applimit's
    algorithms remember the first burst.
    """
    from applimit import Limiter

    limit, window_s = 20, 2
    algos = ("sliding_window", "sliding_log", "gcra")
    rate = f"{limit}/{window_s}s"
    policy_text = "version: 1\ntiers: [free]\nlimits:\n" + "".join(
        f"  - name: {a}\n    app: {{ algorithm: {a}, tiers: {{ free: {rate} }} }}\n" for a in algos
    )
    policy_path = workdir / "boundary-policy.yaml"
    policy_path.write_text(policy_text, encoding="utf-8")
    client = redis.Redis.from_url(redis_url)
    limiter = Limiter.from_policy(policy_path, redis=client)
    fixed = client.register_script(_FIXED_WINDOW)
    admitted: Counter[str] = Counter()
    try:
        print(f"== window boundary: limit {rate}; {limit} requests in the last 0.2 s of one")
        print(f"   {window_s} s window and {limit} more in the first 0.2 s of the next")
        # Line the burst up with the fixed window's boundary: this wait is the experiment's
        # timing, not a race workaround.
        now = time.time()
        boundary_at = (math.floor(now / window_s) + 1) * window_s
        if boundary_at - now < 0.4:
            boundary_at += window_s
        for start in (boundary_at - 0.2, boundary_at + 0.01):
            time.sleep(max(0.0, start - time.time()))
            for _ in range(limit):
                window = math.floor(time.time() / window_s)
                if int(fixed(keys=[f"demo:fixed:{window}"], args=[window_s * 2000])) <= limit:
                    admitted[FIXED_LABEL] += 1
                for algo in algos:
                    if limiter.hit(algo, "alice", tier="free").allowed:
                        admitted[f"applimit {algo}"] += 1
        print()
        print(f"   {'':36}{'admitted':>9}   x limit")
        for label in (FIXED_LABEL, *(f"applimit {a}" for a in algos)):
            print(f"   {label:36}{admitted[label]:>9}   {admitted[label] / limit:>6.1f}x")
        print()
    finally:
        limiter.close()
        client.close()


if __name__ == "__main__":
    # SIGTERM (make interrupted, CI cancelled) unwinds like Ctrl-C, so the children stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
