"""Instructions per decision, counted by callgrind: a measure of cost that load cannot move.

Wall-clock rates on a small shared machine move with whatever else runs; the number of
instructions a decision executes does not (to within a fraction of a percent). This
driver runs a fixed loop of decisions under ``valgrind --tool=callgrind`` for each
scenario, against a ``redis-server`` it starts on a free port (the server runs natively,
outside valgrind: only the client's instructions are counted), and writes
``bench/results/profiles/<scenario>.txt``: instructions per decision and the top entries of
``callgrind_annotate``.

Only the measured loop is counted. Setup (imports, the policy, connecting, a warm-up, then
a full garbage collection) runs first, uncounted; the loop then runs inside a call of
``functools.reduce`` (over two items, so it calls back once), and callgrind collects only
while inside it (``--collect-atstart=no --toggle-collect=functools_reduce``). Nothing in a
decision calls ``reduce``, so the counts are the loop's alone, and per decision they are
the total over the number of decisions.

Usage (from the repository root; needs ``valgrind`` and ``redis-server`` on the PATH)::

    python -m bench.callgrind                      every scenario, into bench/results/profiles/
    python -m bench.callgrind --only sync_hit      a selection
    python -m bench.callgrind --out /tmp/p --label after   elsewhere, with a label

What a scenario counts is in :data:`SCENARIOS`. The child process (``--child``) is the
workload itself; it is what runs under valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio

from ._common import (
    ROOT,
    Identities,
    LimitSpec,
    limiter_client,
    make_policy,
    redis_server,
    wire_ping,
)

# Scenario -> what it decides (one line for the report).
SCENARIOS = {
    "sync_hit": "Limiter.hit(), sliding_log 1000/1m, one thread, 1000 identities",
    "sync_hit_gcra": "Limiter.hit(), gcra 1000/1m, one thread, 1000 identities",
    "sync_hit_quota": "sync_hit with a calendar quota in the tier (a month of a billion): "
    "the rate and the quota in one script call",
    "sync_request3": "Limiter.check_request(), three sliding_log limits on one path",
    "sync_ping": "the floor: client.ping() on the limiter's own redis-py client, one thread",
    "sync_ping_wire": "the strictest floor: PING sent on the limiter's wire (packed once, "
    "on a connection it holds), one thread",
    "async_ping": "the async floor: await redis.asyncio's client.ping(), 64 concurrent callers",
    "wsgi": "applimit.wsgi.RateLimitMiddleware (Limiter, sliding_log, headers on) around a "
    "bare WSGI app, called directly, one thread",
    "async_hit": "AsyncLimiter.hit(), sliding_log 1000/1m, 64 concurrent callers",
    "sync_hit_prometheus": "sync_hit with a PrometheusObserver attached (what the observer "
    "adds to a decision)",
    "async_hit_prometheus": "async_hit with a PrometheusObserver attached",
    "asgi": "RateLimitMiddleware (AsyncLimiter, sliding_log, headers on) around a bare "
    "ASGI app, called directly, 64 concurrent requests",
    # The split of an async decision: long-lived callers, as in bench/bench_async.py
    # (async_hit gathers new coroutines every round, which adds their tasks' cost).
    "split_async_hit": "AsyncLimiter.hit(), sliding_log, 64 long-lived callers each "
    "deciding in a loop (the whole decision)",
    "split_async_wire": "the same callers awaiting calls planned beforehand on the limiter's "
    "wire (the event loop, the batches and the I/O: what is left with no decision to make)",
    "split_plan": "Core.for_limit() alone: the arguments checked, the key, the packed call",
    "split_flow": "the decision flow driven with a reply of Redis, planned beforehand: "
    "Decider.begin(), Decider.advance() and Prepared.decide()",
    "split_decide": "Prepared.decide() alone on a reply of Redis: the reply read, the "
    "LimitResult and the Decision built",
}
# The C functions whose inclusive counts split a decision's cost, by what they do; the
# rest is the interpreter running Python (applimit's, redis-py's, asyncio's, the app's).
PARTS = {
    "packing the command (hiredis pack_command)": ("py_pack_command",),
    "socket writes": ("sock_sendall", "sock_send"),
    "socket reads": ("sock_recv_into", "sock_recv"),
    "reply parsing (hiredis Reader)": ("Reader_gets", "Reader_feed"),
    "event loop polling (epoll)": ("select_epoll_poll",),
    "garbage collection": ("gc_collect_main",),
}
DECISIONS = 2000
WARMUP = 300
CONCURRENCY = 64
TOP = 40
DEFAULT_OUT = ROOT / "bench" / "results" / "profiles"


# --- the workloads (run in the child) ----------------------------------------------------


def _counted(loop: Callable[[], None]) -> None:
    """Run ``loop`` inside ``functools.reduce``, the only place callgrind collects."""
    ran: list[bool] = []

    def once(total: int, _item: int) -> int:
        loop()
        ran.append(True)
        return total

    # The collector's counts start from nothing: the loop's collections are those its own
    # allocations cause, not wherever the setup (which differs between revisions) left the
    # counts, which decides whether an older generation is collected inside the loop.
    gc.collect()
    functools.reduce(once, (0, 1))
    if not ran:
        raise RuntimeError("reduce never called back: the loop did not run")


def _observers(scenario: str) -> list[Any]:
    """A PrometheusObserver on its own registry for the ``*_prometheus`` scenarios."""
    if not scenario.endswith("_prometheus"):
        return []
    from prometheus_client import CollectorRegistry

    from applimit.prometheus import PrometheusObserver

    return [PrometheusObserver(CollectorRegistry())]


def _sync(scenario: str, url: str, count: int) -> None:
    from applimit import Limiter

    if scenario == "sync_request3":
        specs = [
            LimitSpec("burst", "sliding_log", "100/1s"),
            LimitSpec("minute", "sliding_log", "1000/1m"),
            LimitSpec("hour", "sliding_log", "10000/1h"),
        ]
    elif scenario == "sync_hit_quota":
        quotas = {"quotas": {"free": {"month": 1_000_000_000}}}
        specs = [LimitSpec("api", "sliding_log", "1000/1m", options=quotas)]
    else:
        algorithm = "gcra" if scenario == "sync_hit_gcra" else "sliding_log"
        specs = [LimitSpec("api", algorithm, "1000/1m")]
    limiter = Limiter(make_policy(url, specs), observers=_observers(scenario))
    who = Identities("cg", 1000)
    client = limiter_client(limiter)
    ping_wire = wire_ping(limiter)

    def step() -> None:
        if scenario == "sync_ping":
            client.ping()
            return
        if scenario == "sync_ping_wire":
            ping_wire()
            return
        if scenario == "sync_request3":
            decision = limiter.check_request("GET", "/api/items", who(), ip="10.0.0.1")
        else:
            decision = limiter.hit("api", who())
        if not decision.allowed or decision.degraded:
            raise RuntimeError(f"a decision was not an admitted one from Redis: {decision}")

    for _ in range(WARMUP):
        step()

    def loop() -> None:
        for _ in range(count):
            step()

    _counted(loop)
    limiter.close()


def _async_counted(scenario: str, url: str, count: int) -> None:
    """The async scenarios: setup and warm-up, then the counted rounds, on one event loop
    driven by ``run_until_complete`` (inside reduce for the counted part)."""
    from applimit import AsyncLimiter
    from applimit.asgi import Caller, RateLimitMiddleware, RequestInfo

    loop = asyncio.new_event_loop()
    limiter = AsyncLimiter(
        make_policy(url, [LimitSpec("api", "sliding_log", "1000/1m")]),
        observers=_observers(scenario),
    )
    who = Identities("cg", 1000)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    def identify(request: RequestInfo) -> Caller:
        return Caller(request.header("x-user") or "anonymous")

    middleware = RateLimitMiddleware(app, limiter=limiter, identify=identify)

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"refused: {message}")

    def scope_of(user: str) -> dict[str, Any]:
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/api/items",
            "raw_path": b"/api/items",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"bench"), (b"x-user", user.encode())],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
        }

    pinged = redis.asyncio.Redis.from_url(url, max_connections=CONCURRENCY)

    async def one() -> None:
        if scenario == "async_ping":
            await pinged.ping()
            return
        if scenario == "asgi":
            await middleware(scope_of(who()), receive, send)
            return
        decision = await limiter.hit("api", who())
        if not decision.allowed or decision.degraded:
            raise RuntimeError(f"a decision was not an admitted one from Redis: {decision}")

    async def rounds(total: int) -> None:
        for _ in range(total // CONCURRENCY):
            await asyncio.gather(*[one() for _ in range(CONCURRENCY)])

    def run(coroutine: Awaitable[None]) -> None:
        loop.run_until_complete(coroutine)

    run(rounds(WARMUP))
    _counted(lambda: run(rounds(count)))
    run(limiter.aclose())
    run(pinged.aclose())
    loop.close()


def _wsgi(url: str, count: int) -> None:
    """The WSGI middleware around a bare app, called as a WSGI server would."""
    from applimit import Limiter
    from applimit.wsgi import Caller, RateLimitMiddleware, RequestInfo

    limiter = Limiter(make_policy(url, [LimitSpec("api", "sliding_log", "1000/1m")]))
    who = Identities("cg", 1000)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    def identify(request: RequestInfo) -> Caller:
        return Caller(request.header("x-user") or "anonymous")

    middleware = RateLimitMiddleware(app, limiter=limiter, identify=identify)

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if not status.startswith("200"):
            raise RuntimeError(f"refused: {status} {headers}")
        return None

    def step() -> None:
        environ = {
            "REQUEST_METHOD": "GET",
            "SCRIPT_NAME": "",
            "PATH_INFO": "/api/items",
            "QUERY_STRING": "",
            "SERVER_NAME": "bench",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "bench",
            "HTTP_X_USER": who(),
            "wsgi.url_scheme": "http",
        }
        for _ in middleware(environ, start_response):
            pass

    for _ in range(WARMUP):
        step()

    def loop() -> None:
        for _ in range(count):
            step()

    _counted(loop)
    limiter.close()


def _split(scenario: str, url: str, count: int) -> None:
    """The split scenarios: one async decision, whole and by part (see SCENARIOS)."""
    from applimit import AsyncLimiter, Decision
    from applimit._flow import Send

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    limiter = AsyncLimiter(make_policy(url, [LimitSpec("api", "sliding_log", "1000/1m")]))
    who = Identities("cg", 1000)
    core, decider, wire = limiter.core, limiter.decider, limiter._wire
    planned = [core.for_limit("hit", "api", who(), None, 1) for _ in range(1000)]

    async def caller(turns: int, offset: int) -> None:
        for turn in range(turns):
            if scenario == "split_async_hit":
                await limiter.hit("api", who())
            else:
                await wire.run(planned[(offset + turn) % len(planned)].calls)

    async def callers(total: int) -> None:
        await asyncio.gather(*[caller(total // CONCURRENCY, i) for i in range(CONCURRENCY)])

    async def one_reply() -> object:
        return (await wire.run(planned[0].calls))[0]

    reply = loop.run_until_complete(one_reply())

    def flow(index: int) -> None:
        step = decider.begin(planned[index % len(planned)])
        if not isinstance(step, Send) or not isinstance(decider.advance(step, [reply]), Decision):
            raise RuntimeError("the decision asked for other than one call")

    def step(index: int) -> None:
        if scenario == "split_plan":
            core.for_limit("hit", "api", who(), None, 1)
        elif scenario == "split_flow":
            flow(index)
        else:
            planned[index % len(planned)].decide([reply])

    def loop_over(total: int) -> None:
        if scenario in ("split_async_hit", "split_async_wire"):
            loop.run_until_complete(callers(total))
        else:
            for index in range(total):
                step(index)

    loop_over(WARMUP - WARMUP % CONCURRENCY)
    _counted(lambda: loop_over(count))
    loop.run_until_complete(limiter.aclose())
    loop.close()


def child(scenario: str, url: str, count: int) -> None:
    """The workload of ``scenario``: what runs under valgrind."""
    if scenario.startswith("split_"):
        _split(scenario, url, count)
    elif scenario == "wsgi":
        _wsgi(url, count)
    elif scenario.startswith("sync"):
        _sync(scenario, url, count)
    else:
        _async_counted(scenario, url, count)


# --- the driver ----------------------------------------------------------------------------

_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def child_command(scenario: str, url: str, count: int) -> list[str]:
    """The command that runs ``scenario``'s workload (``count`` decisions against ``url``)
    in a process of its own: what callgrind counts, and what bench.flame samples."""
    return [sys.executable, "-m", "bench.callgrind", "--child", scenario, url, str(count)]


def _valgrind(scenario: str, url: str, count: int, work: Path) -> tuple[int, str]:
    """Run one scenario under callgrind; its instruction total and annotated summary."""
    output = work / f"callgrind.{scenario}.out"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--quiet",
            "--collect-atstart=no",
            "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={output}",
            *child_command(scenario, url, count),
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )
    return summarise(output, count)


def instruction_total(output: Path) -> int:
    """The instruction total of a callgrind output file."""
    found = _TOTALS.search(output.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        raise RuntimeError(f"no instruction total in {output}")
    return int(found.group(1))


def annotate(output: Path, *, inclusive: bool) -> str:
    """``callgrind_annotate``'s report of ``output``, by inclusive or exclusive counts."""
    return subprocess.run(
        [
            "callgrind_annotate",
            f"--inclusive={'yes' if inclusive else 'no'}",
            f"--threshold={100 if inclusive else 99}",
            str(output),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def summarise(output: Path, count: int) -> tuple[int, str]:
    """The instruction total of a callgrind file and its summary (parts, top functions)."""
    total = instruction_total(output)
    parts = _parts(annotate(output, inclusive=True), total, count)
    return total, parts + "\n" + top_functions(annotate(output, inclusive=False), "exclusive")


def _parts(inclusive: str, total: int, count: int) -> str:
    """Per decision: the instructions of each of PARTS (inclusive), and the rest."""
    rows: list[tuple[str, float]] = []
    for label, names in PARTS.items():
        spent = 0
        for name in names:
            # The function's own line ("file:name [object]"); inlined copies carry no object.
            pattern = re.compile(r"^\s*([\d,]+) .*:" + re.escape(name) + r" \[", re.MULTILINE)
            spent += max(
                (int(m.group(1).replace(",", "")) for m in pattern.finditer(inclusive)), default=0
            )
        rows.append((label, spent / count))
    rest = total / count - sum(value for _, value in rows)
    rows.append(("the rest: the interpreter running Python", rest))
    width = max(len(label) for label, _ in rows)
    lines = [
        f"  {label:{width}}  {value:>9,.0f}  {value / (total / count):6.1%}"
        for label, value in rows
    ]
    return "Per decision, by part (inclusive instructions):\n" + "\n".join(lines) + "\n"


def top_functions(annotated: str, kind: str) -> str:
    """The first TOP function lines of a callgrind_annotate report, paths shortened."""
    lines = annotated.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.search(r"file:function", line)), len(lines)
    )
    body = [line for line in lines[start + 1 :] if line.strip() and not line.startswith("-")]
    shortened = [
        re.sub(r"/[^ :]*/(site-packages|lib/python3\.\d+)/", r".../\1/", line) for line in body
    ]
    return f"Top {TOP} functions by {kind} instructions:\n" + "\n".join(shortened[:TOP]) + "\n"


def selection(only: str, scenarios: Collection[str]) -> list[str] | None:
    """The scenarios ``--only`` names (every one when empty); None, once the reason is on
    stderr, when valgrind is missing or a name is not a scenario."""
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install valgrind", file=sys.stderr)
        return None
    chosen = [s.strip() for s in only.split(",") if s.strip()] or list(scenarios)
    unknown = [s for s in chosen if s not in scenarios]
    if unknown:
        print(
            f"unknown scenario {unknown[0]!r}; choose from {', '.join(scenarios)}", file=sys.stderr
        )
        return None
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    """Run the scenarios under callgrind and write their summaries; 2 without valgrind."""
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind", description=__doc__)
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for summaries")
    parser.add_argument("--label", default="", help="appended to each file name (-LABEL)")
    parser.add_argument("--decisions", type=int, default=DECISIONS, help="decisions counted")
    parser.add_argument("--keep", type=Path, help="keep the raw callgrind files here")
    parser.add_argument("--child", nargs=3, metavar=("SCENARIO", "URL", "COUNT"), help="internal")
    args = parser.parse_args(argv)
    if args.child:
        scenario, url, count = args.child
        child(scenario, url, int(count))
        return 0
    chosen = selection(args.only, SCENARIOS)
    if chosen is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    count = args.decisions - args.decisions % CONCURRENCY
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    with redis_server() as server, tempfile.TemporaryDirectory() as temporary:
        url = f"redis://127.0.0.1:{server.port}/0"
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        for scenario in chosen:
            began = time.perf_counter()
            total, top = _valgrind(scenario, url, count, work)
            per = total / count
            suffix = f"-{args.label}" if args.label else ""
            path = args.out / f"{scenario}{suffix}.txt"
            path.write_text(
                f"{scenario}: {SCENARIOS[scenario]}\n"
                f"commit {commit} (working tree may differ){suffix and ', ' + args.label}\n"
                f"decisions counted: {count}\n"
                f"instructions: {total:,} in all, {per:,.0f} per decision\n\n{top}",
                encoding="utf-8",
            )
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            print(
                f"{scenario:15} {per:>10,.0f} instructions per decision "
                f"({time.perf_counter() - began:.0f} s) -> {shown}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
