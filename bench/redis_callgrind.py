"""Instructions Redis spends running the limiter's script, per call, counted by callgrind.

``bench.callgrind`` counts the client's side of a decision; this counts the server's. A
``redis-server`` runs under ``valgrind --tool=callgrind``, collecting only inside
``fcallCommand`` (``--collect-atstart=no --toggle-collect=fcallCommand``): the script's
Lua, the commands it runs (``redis.call``) and the reply it builds, but not reading the
request or writing the reply to the socket, which cost the same for any one command. A
``Limiter`` then makes ``--calls`` decisions through ``check_request()`` for a path that
matches one limit, or three (100/1s, 1000/1m, 10000/1h, as ``bench_multi`` stacks them),
spread over ``IDENTITIES`` identities, so that every decision admits and almost every one
finds its keys already there (the first call of each identity makes them: 3% of the
calls at the defaults). The count does not move with the load on the machine, so a
change to the Lua files can be measured while other work runs.

Writes ``bench/results/profiles/server/<scenario>.txt`` (or ``--out``): instructions per call and
the top functions (Redis' binary is usually stripped: its Lua interpreter's functions show
as addresses, the C library's by name).

Usage (from the repository root; needs ``valgrind`` and ``redis-server`` on the PATH)::

    python -m bench.redis_callgrind
    python -m bench.redis_callgrind --only sliding_log,gcra3 --out /tmp/server
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from applimit import Limiter

from ._common import ROOT, Identities, LimitSpec, RedisServer, make_policy
from .callgrind import annotate, instruction_total, selection, top_functions

DEFAULT_OUT = ROOT / "bench" / "results" / "profiles" / "server"
CALLS = 3000
IDENTITIES = 100
ONE = ("1000/1m",)
THREE = ("100/1s", "1000/1m", "10000/1h")
# Scenario -> (algorithm, rates): one limit per rate, all matching the scenario's path.
SCENARIOS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sliding_log": ("sliding_log", ONE),
    "sliding_log3": ("sliding_log", THREE),
    "gcra": ("gcra", ONE),
    "gcra3": ("gcra", THREE),
    "sliding_window": ("sliding_window", ONE),
    "sliding_window3": ("sliding_window", THREE),
}
# valgrind slows Redis' start-up tenfold or more.
STARTUP_TIMEOUT = 120.0


def _wrapper(work: Path, output: Path) -> Path:
    """An executable that runs redis-server under callgrind: the harness' server binary."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed")
    script = work / "redis-server-callgrind"
    script.write_text(
        "#!/bin/sh\n"
        "exec valgrind --tool=callgrind --quiet --collect-atstart=no "
        f'--toggle-collect=fcallCommand --callgrind-out-file={output} {server} "$@"\n',
        encoding="utf-8",
    )
    script.chmod(0o755)
    return script


def count(scenario: str, calls: int, work: Path) -> tuple[int, str]:
    """Run ``calls`` decisions of ``scenario`` against a server under callgrind; the
    instructions per call and the summary of the top functions."""
    algorithm, rates = SCENARIOS[scenario]
    output = work / f"callgrind.{scenario}.out"
    server = RedisServer(server_bin=_wrapper(work, output), startup_timeout=STARTUP_TIMEOUT)
    server.start()
    try:
        specs = [
            LimitSpec(f"{algorithm}-{i}", algorithm, rate, path_prefix="/api/")
            for i, rate in enumerate(rates)
        ]
        limiter = Limiter(make_policy(server.url, specs))
        ids = Identities("user", IDENTITIES)
        denied = degraded = 0
        try:
            for _ in range(calls):
                decision = limiter.check_request("GET", "/api/items", ids())
                denied += not decision.allowed
                degraded += decision.degraded
        finally:
            limiter.close()
        if denied:
            raise RuntimeError(f"{scenario}: {denied} of {calls} decisions were refused")
        if degraded:
            # Made without the script (it failed to load, or Redis errored): nothing counted.
            raise RuntimeError(f"{scenario}: {degraded} of {calls} decisions were degraded")
    finally:
        # SIGTERM: Redis shuts down, and callgrind writes its file as the process ends
        # (close() alone kills it, and callgrind would write nothing).
        server.stop(timeout=STARTUP_TIMEOUT)
        server.close()
    total = instruction_total(output)
    return total // calls, top_functions(annotate(output, inclusive=False), "exclusive")


def main(argv: Sequence[str] | None = None) -> int:
    """Count each scenario and write its summary; 2 without valgrind."""
    parser = argparse.ArgumentParser(prog="python -m bench.redis_callgrind", description=__doc__)
    parser.add_argument("--only", default="", help=f"comma-separated of {', '.join(SCENARIOS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for summaries")
    parser.add_argument("--calls", type=int, default=CALLS, help="decisions counted")
    parser.add_argument("--label", default="", help="the state of the code, for the header")
    args = parser.parse_args(argv)
    chosen = selection(args.only, SCENARIOS)
    if chosen is None:
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in chosen:
        with tempfile.TemporaryDirectory(prefix="redis-callgrind-") as tmp:
            per_call, top = count(scenario, args.calls, Path(tmp))
        algorithm, rates = SCENARIOS[scenario]
        header = (
            f"{scenario}: the script's call in Redis (fcallCommand), {algorithm}, "
            f"{len(rates)} limit(s) ({', '.join(rates)})\n"
            + (f"{args.label}\n" if args.label else "")
            + f"calls counted: {args.calls} over {IDENTITIES} identities\n"
            f"instructions per call: {per_call:,}\n\n"
        )
        (args.out / f"{scenario}.txt").write_text(header + top, encoding="utf-8")
        print(f"{scenario}: {per_call:,} instructions per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
