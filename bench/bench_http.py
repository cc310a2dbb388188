"""Through HTTP: a FastAPI app under uvicorn and a Flask app under waitress, driven by wrk.

What a rate limit costs a real app, measured end to end over loopback. Three stacks:

- ``fastapi``: FastAPI under uvicorn on asyncio's own event loop and the h11 parser
  (``pip install uvicorn``);
- ``fastapi_std``: the same app under uvicorn on uvloop and the httptools parser, what
  ``pip install "uvicorn[standard]"`` (and ``fastapi[standard]``) runs;
- ``flask``: a Flask app under waitress with ``THREADS`` threads.

uvicorn picks uvloop and httptools by itself whenever they are installed, so each FastAPI
stack names its loop and parser: a stack never changes with what else is installed.

Each stack is served five ways, each by its own server process, all started at once and
measured side by side (one ``wrk`` slice each, in an order rotated every round):

- ``bare``: the app alone, no Redis;
- ``ping``: the app awaiting one Redis ``PING`` per request before the handler (FastAPI:
  a pure ASGI middleware on ``redis.asyncio``; Flask: a ``before_request`` on a shared
  ``redis.Redis``): what one round trip per request costs, the issue's reference;
- ``applimit``: applimit's middleware (``applimit.asgi.RateLimitMiddleware`` with an
  ``AsyncLimiter``; ``applimit.wsgi.RateLimitMiddleware`` with a ``Limiter``), one
  sliding_log limit on ``/api/``, per user, headers on;
- ``applimit_approx``: the same with the limit in ``mode: approximate`` (``APPROXIMATE``):
  most decisions local, one script call per ``sync_every`` of a user's; what is left of
  a limit's cost once the round trip per request is gone (the path towards the bare app);
- ``slowapi`` (FastAPI) and ``flask_limiter`` (Flask), at equivalent settings: the same
  limit as a default limit, moving window (their sliding log), headers on, the same Redis.

Every request is ``GET /api/items`` as one of 1000 users (an ``X-User`` header, set by a
wrk Lua script), and the limit (100000/1m per user) never refuses, so every variant does
the same work for every request; a refusal or an error fails the run. The server
processes are single: one uvicorn worker, one waitress process with ``THREADS`` threads.
Each FastAPI server answers ``/health`` with the event loop it runs on, which the driver
checks before measuring.

The issue's targets: applimit >= 1.0x the one-PING app, >= 2x slowapi and flask-limiter,
and a path towards 0.85x the bare app.

Needs ``wrk`` (Debian: ``apt-get install wrk``; macOS: ``brew install wrk``), the
``bench`` extra (``pip install -e '.[dev,bench]'``: slowapi, flask-limiter, uvloop,
httptools) and
``redis-server``. It is not in the default set of ``make bench`` (it takes about two
and a half minutes); run it with::

    .venv/bin/python -m bench.run --only http
    .venv/bin/python -m bench.bench_http --rounds 3 --seconds 2     # alone, printed only

Without wrk it says how to install it and exits 2. The chart goes to
``bench/results/http.svg`` (quick runs: ``bench/results/quick/http.svg``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import (
    ROOT,
    LimitSpec,
    Result,
    Settings,
    Table,
    Target,
    fmt_rate,
    fmt_ratio,
    make_policy,
    median,
    quartiles,
    ratios,
    redis_server,
    server_cpu_seconds,
)

NAME = "http"
TITLE = "Through HTTP: FastAPI under uvicorn and Flask under waitress, driven by wrk"

INSTALL_WRK = (
    "the HTTP benchmark needs wrk, the HTTP load generator: install it with "
    "`apt-get install wrk` (Debian, Ubuntu) or `brew install wrk` (macOS), then run it again."
)
INSTALL_EXTRA = (
    "the HTTP benchmark needs the bench extra (slowapi, flask-limiter, uvloop, httptools): "
    "`.venv/bin/pip install -e '.[dev,bench]'` (make bench installs it)."
)
RATE = "100000/1m"
# The same rate in the notation of limits, which slowapi and flask-limiter use.
LIMITS_RATE = "100000/minute"
USERS = 1000
CONNECTIONS = 16
THREADS = 8
STACKS: dict[str, tuple[str, ...]] = {
    "fastapi": ("bare", "ping", "applimit", "applimit_approx", "slowapi"),
    "fastapi_std": ("bare", "ping", "applimit", "applimit_approx", "slowapi"),
    "flask": ("bare", "ping", "applimit", "applimit_approx", "flask_limiter"),
}
# Each FastAPI stack's uvicorn event loop and HTTP parser, given to uvicorn.run: its
# default ("auto") takes uvloop and httptools whenever they are importable.
UVICORN: dict[str, tuple[str, str]] = {
    "fastapi": ("asyncio", "h11"),
    "fastapi_std": ("uvloop", "httptools"),
}
# What a stack needs importable beyond the app frameworks (the bench extra).
STACK_MODULES: dict[str, tuple[str, ...]] = {"fastapi_std": ("uvloop", "httptools")}
# The approximate variant's limit: counted locally, one script call per SYNC_EVERY
# decisions of a user (or per SYNC_INTERVAL), as bench_approx measures it.
APPROXIMATE = {"mode": "approximate", "sync_every": 20, "sync_interval": "10s"}
LABELS = {
    "fastapi": "FastAPI under uvicorn (asyncio, h11)",
    "fastapi_std": "FastAPI under uvicorn[standard] (uvloop, httptools)",
    "flask": f"Flask under waitress ({THREADS} threads)",
    "slowapi": "slowapi",
    "flask_limiter": "flask-limiter",
    "applimit_approx": "applimit, approximate",
}
PING_TARGET = 1.0
RIVAL_TARGET = 2.0
BARE_TARGET = 0.85
# Every request is one of USERS users; wrk's Lua runs per request, in every variant alike.
WRK_SCRIPT = f"""
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/api/items", {{["X-User"] = "user-" .. (n % {USERS})}})
end
"""


class MissingTool(SystemExit):
    """wrk or the bench extra is missing: the message says how to install it; exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


# --- the apps (run in the server processes) ----------------------------------------------


def fastapi_app(variant: str, url: str) -> Any:
    """The FastAPI app of ``variant`` (see the module's docstring)."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/api/items")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/health")
    async def health() -> dict[str, object]:
        # The loop this server runs on, which the driver checks (see UVICORN).
        return {"ok": True, "loop": type(asyncio.get_running_loop()).__module__.split(".")[0]}

    if variant == "ping":
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url)

        class Ping:
            """One awaited PING per request, then the app: one round trip's cost."""

            def __init__(self, app: Any) -> None:
                self.app = app

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http":
                    await client.ping()
                await self.app(scope, receive, send)

        app.add_middleware(Ping)
    elif variant in ("applimit", "applimit_approx"):
        from applimit import AsyncLimiter
        from applimit.asgi import Caller, RateLimitMiddleware, RequestInfo

        limiter = AsyncLimiter(_policy(url, approximate=variant == "applimit_approx"))

        def identify(request: RequestInfo) -> Caller | None:
            user = request.header("x-user")
            return Caller(user) if user else None

        app.add_middleware(RateLimitMiddleware, limiter=limiter, identify=identify)
    elif variant == "slowapi":
        from slowapi import Limiter as SlowLimiter
        from slowapi.middleware import SlowAPIASGIMiddleware
        from starlette.requests import Request as StarletteRequest

        def key(request: StarletteRequest) -> str:
            return request.headers.get("x-user", "anonymous")

        slow = SlowLimiter(
            key_func=key,
            default_limits=[LIMITS_RATE],
            storage_uri=url,
            strategy="moving-window",
            headers_enabled=True,
        )
        app.state.limiter = slow
        app.add_middleware(SlowAPIASGIMiddleware)
    elif variant != "bare":
        raise ValueError(f"unknown FastAPI variant {variant!r}")
    return app


def flask_app(variant: str, url: str) -> Any:
    """The Flask app of ``variant`` (see the module's docstring)."""
    from flask import Flask, request

    app = Flask("bench_http")

    @app.get("/api/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"ok": True}

    if variant == "ping":
        import redis

        client = redis.Redis.from_url(url, max_connections=THREADS * 2)

        @app.before_request
        def ping() -> None:
            client.ping()

    elif variant in ("applimit", "applimit_approx"):
        from applimit import Limiter
        from applimit.wsgi import Caller, RateLimitMiddleware, RequestInfo

        limiter = Limiter(_policy(url, approximate=variant == "applimit_approx"))

        def identify(info: RequestInfo) -> Caller | None:
            user = info.header("x-user")
            return Caller(user) if user else None

        app.wsgi_app = RateLimitMiddleware(  # type: ignore[method-assign]
            app.wsgi_app, limiter=limiter, identify=identify
        )
    elif variant == "flask_limiter":
        from flask_limiter import Limiter as FlaskLimiter

        FlaskLimiter(
            lambda: request.headers.get("X-User", "anonymous"),
            app=app,
            default_limits=[LIMITS_RATE],
            storage_uri=url,
            strategy="moving-window",
            headers_enabled=True,
        )
    elif variant != "bare":
        raise ValueError(f"unknown Flask variant {variant!r}")
    return app


def _policy(url: str, *, approximate: bool = False) -> Any:
    options = APPROXIMATE if approximate else {}
    return make_policy(url, [LimitSpec("api", "sliding_log", RATE, options=options)])


def serve(stack: str, variant: str, port: int, url: str) -> None:
    """Serve one variant on 127.0.0.1:``port`` until terminated (the server process)."""
    if stack in UVICORN:
        import uvicorn

        loop, http = UVICORN[stack]
        uvicorn.run(
            fastapi_app(variant, url),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            loop=loop,
            http=http,
        )
    else:
        import logging

        import waitress

        # waitress warns "Task queue depth is N" whenever every thread is busy, which a
        # server driven at its limit is all the time: a log line per queued request, the
        # more the slower the app. Every variant alike logs errors only.
        logging.getLogger("waitress.queue").setLevel(logging.ERROR)
        waitress.serve(
            flask_app(variant, url),
            host="127.0.0.1",
            port=port,
            threads=THREADS,
            # wrk keeps CONNECTIONS connections open; waitress' default backlog is enough,
            # but its default connection limit (100) must not be what is measured.
            connection_limit=max(100, CONNECTIONS * 4),
            _quiet=True,
        )


# --- the driver --------------------------------------------------------------------------


@dataclass
class Server:
    """One variant's server process and where it listens."""

    stack: str
    variant: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        """``<stack>.<variant>``, the key of its rates."""
        return f"{self.stack}.{self.variant}"

    @property
    def url(self) -> str:
        """The URL wrk requests (its Lua script sets the path and the user)."""
        return f"http://127.0.0.1:{self.port}/api/items"


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that are free, below the kernel's ephemeral range:
    a port the kernel hands out for binding to 0 may also become the source port of an
    outgoing connection (to Redis, from wrk) before the server binds it, which made a
    server fail with "address already in use"."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    upper = max(low, 20_000)
    found: list[int] = []
    for port in random.sample(range(10_000, upper), k=min(2000, upper - 10_000)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise RuntimeError(f"no {count} free ports found below {upper}")


def _wait_ready(server: Server, log: Path, timeout: float = 60.0) -> None:
    """Until ``/health`` answers 200; the server's log in the error if it died or hung. A
    FastAPI server must say it runs on its stack's event loop (see UVICORN)."""
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"the {server.name} server exited with {server.process.returncode}:\n"
                + log.read_text(encoding="utf-8", errors="replace")[-2000:]
            )
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{server.port}/health", timeout=1
            ) as response:
                if response.status == 200:
                    body = response.read()
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the {server.name} server did not answer within {timeout:.0f} s")
        # Polling interval while the process imports and binds; the condition is re-checked.
        time.sleep(0.1)
    if server.stack in UVICORN:
        wanted = UVICORN[server.stack][0]
        running = json.loads(body).get("loop")
        if running != wanted:
            raise RuntimeError(
                f"the {server.name} server runs on the {running} event loop, not {wanted}"
            )


@contextlib.contextmanager
def servers(stacks: dict[str, tuple[str, ...]], url: str, logs: Path) -> Iterator[list[Server]]:
    """Every variant's server process, started together, ready, and stopped on exit."""
    started: list[Server] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ports = iter(_free_ports(sum(len(variants) for variants in stacks.values())))
    try:
        for stack, variants in stacks.items():
            for variant in variants:
                port = next(ports)
                with (logs / f"{stack}.{variant}.log").open("wb") as log:
                    process = subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bench.bench_http",
                            "--serve",
                            stack,
                            variant,
                            "--port",
                            str(port),
                            "--redis",
                            url,
                        ],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                started.append(Server(stack, variant, port, process))
        for server in started:
            _wait_ready(server, logs / f"{server.name}.log")
        yield started
    finally:
        for server in started:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGINT)
        for server in started:
            try:
                server.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


@dataclass
class Slice:
    """What one wrk run measured."""

    rate: float
    requests: int
    failed: int


_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.MULTILINE)
_REQUESTS = re.compile(r"^\s*(\d+) requests in", re.MULTILINE)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")


def run_wrk(wrk: str, script: Path, target: str, seconds: int, connections: int) -> Slice:
    """One wrk run against ``target``: requests per second and the failed responses."""
    completed = subprocess.run(
        [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script), target],
        capture_output=True,
        text=True,
        check=True,
    )
    out = completed.stdout
    found = _RATE.search(out)
    count = _REQUESTS.search(out)
    if found is None or count is None:
        raise RuntimeError(f"wrk printed no rate:\n{out}\n{completed.stderr}")
    failed = 0
    non_2xx = _NON_2XX.search(out)
    if non_2xx is not None:
        failed += int(non_2xx.group(1))
    errors = _ERRORS.search(out)
    if errors is not None:
        # Timeouts are slow answers, not failures; connect, read and write errors are.
        failed += sum(int(errors.group(i)) for i in (1, 2, 3))
    return Slice(float(found.group(1)), int(count.group(1)), failed)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu(pid: int) -> float | None:
    """The CPU time (user + system, in seconds) process ``pid`` has used, from
    ``/proc/<pid>/stat``; None where there is no such file (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    # The fields after the command (in parentheses, which may hold spaces): utime and
    # stime are the 14th and 15th of the line, the 12th and 13th after it.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _children_cpu() -> float:
    """CPU time of this process' waited-for children (each wrk run), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cpu:
    """CPU time spent while one variant was measured: its server process, the Redis
    server, and wrk; and the requests served meanwhile."""

    app: float = 0.0
    redis: float = 0.0
    wrk: float = 0.0
    requests: int = 0
    known: bool = True

    def per_request_us(self) -> dict[str, float]:
        """Each part's CPU per request, in µs (NaN when it could not be read)."""
        if not self.requests or not self.known:
            return dict.fromkeys(("app", "redis", "wrk", "all"), math.nan)
        parts = {"app": self.app, "redis": self.redis, "wrk": self.wrk}
        parts["all"] = sum(parts.values())
        return {name: seconds * 1e6 / self.requests for name, seconds in parts.items()}


def _plan(settings: Settings) -> tuple[int, int]:
    """Rounds and whole seconds per slice (wrk takes whole seconds)."""
    if settings.quick:
        return 1, 1
    # The defaults of make bench: 25 rounds of 0.08 s; here 5 rounds of 2 s per variant.
    seconds = max(1, round(settings.seconds * 25))
    rounds = max(2, round(settings.rounds / 5))
    return rounds, seconds


def measure(
    settings: Settings, stacks: dict[str, tuple[str, ...]] = STACKS
) -> tuple[dict[str, list[float]], dict[str, int], dict[str, Any], dict[str, Cpu]]:
    """Per-round rates of every variant, the failed responses of each, parameters, and
    the CPU each part used while each variant was measured."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise MissingTool(INSTALL_WRK)
    wanted = {variant for variants in stacks.values() for variant in variants}
    needed = [module for module in ("slowapi", "flask_limiter") if module in wanted]
    needed += [module for stack in stacks for module in STACK_MODULES.get(stack, ())]
    for module in needed:
        try:
            __import__(module)
        except ImportError:
            raise MissingTool(INSTALL_EXTRA) from None
    rounds, seconds = _plan(settings)
    rates: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    cpu: dict[str, Cpu] = {}
    with (
        redis_server() as redis,
        redis.client() as admin,
        tempfile.TemporaryDirectory() as temporary,
    ):
        work = Path(temporary)
        script = work / "users.lua"
        script.write_text(WRK_SCRIPT, encoding="utf-8")
        url = f"redis://127.0.0.1:{redis.port}/0"
        with servers(stacks, url, work) as started:
            for server in started:
                rates[server.name] = []
                failed[server.name] = 0
                cpu[server.name] = Cpu()
                if not settings.quick:
                    # Warm-up: connections, the script cache, lazily built state.
                    run_wrk(wrk, script, server.url, 1, CONNECTIONS)
            for index in range(rounds):
                shift = index % len(started)
                for server in [*started[shift:], *started[:shift]]:
                    app, store, load = (
                        process_cpu(server.process.pid),
                        server_cpu_seconds(admin),
                        _children_cpu(),
                    )
                    measured = run_wrk(wrk, script, server.url, seconds, CONNECTIONS)
                    rates[server.name].append(measured.rate)
                    failed[server.name] += measured.failed
                    used = cpu[server.name]
                    after = process_cpu(server.process.pid)
                    if app is None or after is None:
                        used.known = False
                    else:
                        used.app += after - app
                    used.redis += server_cpu_seconds(admin) - store
                    used.wrk += _children_cpu() - load
                    used.requests += measured.requests
    params = {
        "rounds": rounds,
        "seconds": seconds,
        "connections": CONNECTIONS,
        "wrk_threads": 1,
        "waitress_threads": THREADS,
        "users": USERS,
        "rate": RATE,
        "algorithm": "sliding_log / moving window",
    }
    return rates, failed, params, cpu


def run(settings: Settings) -> Result:
    """The benchmark (see the module's docstring)."""
    began = time.perf_counter()
    rates, failed, params, cpu = measure(settings)
    bad = {name: count for name, count in failed.items() if count}
    if bad:
        raise RuntimeError(
            f"responses other than 200 (or socket errors) spoil the comparison: {bad}; "
            "every variant must answer every request with 200"
        )
    result = Result(
        name=NAME,
        title=TITLE,
        summary=(
            "Requests per second of a FastAPI app under uvicorn (twice: on asyncio's loop "
            "with the h11 parser, and on uvloop with httptools, what `uvicorn[standard]` "
            f"runs) and a Flask app under waitress ({THREADS} threads), each served bare, "
            "with one Redis `PING` per request, with applimit's middleware and with slowapi "
            "or flask-limiter (moving window, headers on, the same Redis), driven by wrk "
            f"({CONNECTIONS} connections, one thread) over loopback, {USERS} users, "
            "alternated in every round."
        ),
        params=params,
        rates=rates,
    )
    rows: list[list[str]] = []
    for stack, variants in STACKS.items():
        rival = variants[-1]
        app = rates[f"{stack}.applimit"]
        bare = rates[f"{stack}.bare"]
        ping = rates[f"{stack}.ping"]
        other = rates[f"{stack}.{rival}"]
        approx = rates[f"{stack}.applimit_approx"]
        pairs = {
            "applimit/ping": ratios(app, ping),
            "applimit/bare": ratios(app, bare),
            f"applimit/{rival}": ratios(app, other),
            "ping/bare": ratios(ping, bare),
            f"{rival}/bare": ratios(other, bare),
            "applimit_approx/bare": ratios(approx, bare),
        }
        for key, values in pairs.items():
            result.ratios[f"{stack}.{key}"] = values
        rows.append(
            [
                LABELS[stack],
                fmt_rate(median(bare)),
                fmt_rate(median(ping)),
                fmt_rate(median(app)),
                f"{LABELS[rival]}: {fmt_rate(median(other))}",
                fmt_ratio(median(pairs["applimit/ping"])),
                fmt_ratio(median(pairs["applimit/bare"])),
                fmt_ratio(median(pairs[f"applimit/{rival}"])),
                fmt_ratio(median(pairs["ping/bare"])),
                fmt_rate(median(approx)),
                fmt_ratio(median(pairs["applimit_approx/bare"])),
            ]
        )
        for key, threshold, text, short in (
            ("applimit/ping", PING_TARGET, "vs the same app awaiting one Redis PING", "/ PING"),
            (f"applimit/{rival}", RIVAL_TARGET, f"vs {LABELS[rival]}", f"/ {LABELS[rival]}"),
            ("applimit/bare", BARE_TARGET, "vs the bare app (the issue's path towards)", "/ bare"),
        ):
            values = pairs[key]
            result.targets.append(
                Target(
                    key=f"http.{stack}.{key.replace('/', '.')}",
                    text=f"{LABELS[stack]}: applimit's middleware {text}",
                    measured=median(values),
                    spread=quartiles(values),
                    threshold=threshold,
                    short=f"http {stack}: applimit {short}",
                )
            )
    result.tables.append(
        Table(
            title="Requests per second (medians) and ratios (medians of per-round ratios)",
            columns=[
                "stack",
                "bare",
                "one PING",
                "applimit",
                "alternative",
                "applimit / PING",
                "applimit / bare",
                "applimit / alternative",
                "PING / bare",
                "applimit, approximate",
                "approximate / bare",
            ],
            rows=rows,
        )
    )
    result.tables.append(cpu_table(cpu))
    result.data["cpu_per_request_us"] = {name: used.per_request_us() for name, used in cpu.items()}
    result.notes.append(
        "Where the rest of the bare app's rate goes: *PING / bare* is what one Redis round "
        "trip per request, made the way an app makes it, costs the bare app, and applimit's "
        "exact decision is one such round trip, so *applimit / bare* stays near *PING / "
        "bare*. *applimit, approximate* is the same limit with `mode: approximate` "
        f"(`sync_every: {APPROXIMATE['sync_every']}`, `sync_interval: "
        f"{APPROXIMATE['sync_interval']}`): one script call per "
        f"{APPROXIMATE['sync_every']} decisions of a user, the others answered in the "
        "process (its overshoot bound is in docs/applimit.md). What it still leaves below "
        "the bare app is the middleware's own work per request, Redis or not: reading the "
        "request, matching the limits, identify(), the decision's bookkeeping and the "
        "headers (docs/profiles.md counts it: some 220k instructions per ASGI request and "
        "151k per WSGI one, of which about 83k and 68k are the middleware around the "
        "limiter's decision). On a machine of two cores, the Redis server's time per "
        "decision (the script's: see the Redis CPU section) is taken from the same cores "
        "as the app's and wrk's, where one PING takes next to none."
    )
    for stack in STACKS:
        path = bare_path(stack, cpu, median(rates[f"{stack}.bare"]))
        if path is not None:
            result.notes.append(path)
    result.notes.append(
        "Each variant is its own server process, started together and measured in turn "
        f"({params['rounds']} rounds of {params['seconds']} s each, the order rotated every "
        "round); the server, Redis and wrk share the machine's cores, as on a small app "
        "server."
    )
    result.seconds = time.perf_counter() - began
    return result


def bare_path(stack: str, cpu: dict[str, Cpu], bare_rate: float) -> str | None:
    """Where the middleware stands against the bare app's rate, from the CPU each spent
    per request in the app's server process (None when a part could not be read).

    Every stack is one server process: uvicorn runs the app on one event loop and waitress'
    threads share one GIL, so the bare app's process, near a core at its rate, is what
    bounds it, and a request's CPU there is what the rate pays for. At BARE_TARGET of the
    bare rate a request may take the bare app's CPU over BARE_TARGET; whatever the
    middleware adds beyond that budget is what stands between it and the goal. Redis' and
    wrk's time is on the machine's other core, as long as they fit there.
    """
    bare = cpu[f"{stack}.bare"].per_request_us()
    exact = cpu[f"{stack}.applimit"].per_request_us()
    approx = cpu[f"{stack}.applimit_approx"].per_request_us()
    if any(math.isnan(part["app"]) for part in (bare, exact, approx)):
        return None
    busy = bare["app"] * bare_rate / 1e6
    allowed = bare["app"] / BARE_TARGET - bare["app"]
    added, own = exact["app"] - bare["app"], approx["app"] - bare["app"]
    trip = added - own
    return (
        f"{LABELS[stack]}: the bare app's process spends {bare['app']:,.0f} µs of CPU a "
        f"request and used {busy:.0%} of a core at its rate (one process: about its "
        f"bound); at {BARE_TARGET:.2f}x that rate a request may take {allowed:,.0f} µs more "
        f"there. applimit's middleware adds {added:,.0f} µs exact (and {exact['redis']:,.0f}"
        f" µs of Redis', on the other core) and {own:,.0f} µs approximate: "
        + (
            "within that budget."
            if min(added, own) <= allowed
            else f"{own:,.0f} µs is the middleware's own work per request (reading the "
            "request, matching the limits, identify(), the decision's bookkeeping, the "
            "headers), and the exact decision's round trip adds "
            + (f"{trip:,.0f} µs to it." if trip >= 1 else "nothing to it (it is batched).")
        )
    )


def cpu_table(cpu: dict[str, Cpu]) -> Table:
    """Where each variant's requests spend the machine's CPU: the app's server process,
    the Redis server and wrk, per request, over every round."""
    rows = []
    for name, used in cpu.items():
        stack, variant = name.split(".", 1)
        per = used.per_request_us()
        rows.append(
            [
                LABELS[stack],
                LABELS.get(variant, variant.replace("_", " ")),
                *(
                    "-" if math.isnan(per[part]) else f"{per[part]:,.0f} µs"
                    for part in ("app", "redis", "wrk", "all")
                ),
            ]
        )
    return Table(
        title="CPU per request, by process (all rounds)",
        columns=["stack", "variant", "app server", "Redis", "wrk", "all three"],
        rows=rows,
        note=(
            "CPU time (user + system) each process used while the variant was measured, "
            "over the requests it served: the app's server process (from /proc), the Redis "
            "server (INFO cpu) and wrk (its rusage). When they share the machine's cores, "
            "a variant's rate is at most the cores over *all three*: what the middleware "
            "adds to the bare app is its own row's difference, app and Redis."
        ),
    )


def chart(result: Result, path: Path) -> None:
    """The targets of ``result`` (as docs/benchmarks.svg draws them) above the
    variants' rates, side by side for each stack."""
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from ._report import _target_panel

    mpl.rcParams["svg.fonttype"] = "none"
    mpl.rcParams["svg.hashsalt"] = "applimit-bench"
    heights = [0.42 * len(result.targets) + 0.8, 3.0] if result.targets else [3.0]
    fig, axes = plt.subplots(
        len(heights),
        1,
        figsize=(10, sum(heights) + 0.4),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    if result.targets:
        _target_panel(axes[0][0], result.targets)
    bottom = axes[-1][0]
    width = 0.16
    for index, (stack, variants) in enumerate(STACKS.items()):
        for offset, variant in enumerate(variants):
            rate = median(result.rates.get(f"{stack}.{variant}", []))
            x = index + (offset - (len(variants) - 1) / 2) * width
            bar_colour = "#1f77b4" if variant.startswith("applimit") else "#9e9e9e"
            bottom.bar(x, 0.0 if math.isnan(rate) else rate, width * 0.9, color=bar_colour)
            label = LABELS.get(variant, variant)
            bottom.text(x, 0, f" {label}", rotation=90, va="bottom", ha="center", fontsize=7)
    bottom.set_xticks(range(len(STACKS)), [LABELS[stack] for stack in STACKS], fontsize=8)
    bottom.set_ylabel("requests per second (median)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=path.suffix.lstrip(".") or "svg", metadata={"Date": None})
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one variant (``--serve``), or run the benchmark and print it (2: no wrk)."""
    parser = argparse.ArgumentParser(prog="python -m bench.bench_http", description=TITLE)
    parser.add_argument("--serve", nargs=2, metavar=("STACK", "VARIANT"), help="internal")
    parser.add_argument("--port", type=int, default=0, help="internal: the server's port")
    parser.add_argument("--redis", default="", help="internal: the Redis URL")
    parser.add_argument("--rounds", type=int, help="rounds (default 5)")
    parser.add_argument("--seconds", type=int, help="seconds per variant and round (default 2)")
    parser.add_argument("--quick", action="store_true", help="one round of one second")
    parser.add_argument("--chart", type=Path, help="write the chart (SVG) here")
    args = parser.parse_args(argv)
    if args.serve:
        stack, variant = args.serve
        serve(stack, variant, args.port, args.redis)
        return 0
    settings = Settings.for_mode(quick=args.quick)
    if args.rounds is not None or args.seconds is not None:
        rounds = args.rounds if args.rounds is not None else 5
        seconds = args.seconds if args.seconds is not None else 2
        # _plan turns these back into the given rounds and seconds.
        settings = Settings(rounds=rounds * 5, seconds=seconds / 25)
    try:
        result = run(settings)
    except MissingTool as missing:
        print(missing.message, file=sys.stderr)
        return 2
    from .run import _print_result

    _print_result(result)
    if args.chart is not None:
        chart(result, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
