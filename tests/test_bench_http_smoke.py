"""Smoke test of the HTTP benchmark (bench/bench_http.py), so it does not rot between runs.

Six of its server processes (FastAPI bare and with applimit's middleware, exact and
approximate; the same app on uvicorn[standard]'s loop and parser with the middleware; Flask
with applimit's middleware, exact and approximate) under one second of wrk each: every
request answered 200, a rate for every one. Each FastAPI server runs on the event loop its
stack names, whatever else is installed. The numbers' size is not asserted: timings on a
shared machine are not something a test can assert. Skipped where wrk is not installed.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bench.bench_http
from bench._common import Result, Settings
from bench.bench_http import INSTALL_WRK, Cpu, bare_path, chart, cpu_table, measure, servers

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
@pytest.mark.timeout(120)
def test_each_variant_answers_every_request_and_has_a_rate(tmp_path: Path) -> None:
    """A quick run of six variants: one round each, a finite rate above zero, and no
    response other than 200 (a refusal or an error would spoil any comparison); the
    chart draws the rates (a variant not run is drawn as zero)."""
    stacks = {
        "fastapi": ("bare", "applimit", "applimit_approx"),
        "fastapi_std": ("applimit",),
        "flask": ("applimit", "applimit_approx"),
    }
    rates, failed, params, cpu = measure(Settings.for_mode(quick=True), stacks)
    assert set(rates) == {
        "fastapi.bare",
        "fastapi.applimit",
        "fastapi.applimit_approx",
        "fastapi_std.applimit",
        "flask.applimit",
        "flask.applimit_approx",
    }
    for name, series in rates.items():
        assert len(series) == params["rounds"] == 1, name
        assert all(math.isfinite(rate) and rate > 0 for rate in series), name
    assert failed == dict.fromkeys(rates, 0)
    # Every variant's CPU per request, by process: the app server and wrk always used
    # some; Redis did for every variant that calls it (the bare app does not).
    assert set(cpu) == set(rates)
    for name, used in cpu.items():
        per = used.per_request_us()
        assert used.requests > 0 and per["app"] > 0 and per["wrk"] > 0, name
        assert per["all"] == pytest.approx(per["app"] + per["redis"] + per["wrk"]), name
    assert cpu["fastapi.applimit"].redis > 0
    rows = {tuple(row[:2]) for row in cpu_table(cpu).rows}
    assert ("FastAPI under uvicorn (asyncio, h11)", "bare") in rows
    assert ("FastAPI under uvicorn[standard] (uvloop, httptools)", "applimit") in rows
    result = Result(name="http", title="smoke", summary="", rates=rates)
    chart(result, tmp_path / "http.svg")
    assert "<svg" in (tmp_path / "http.svg").read_text(encoding="utf-8")


def test_without_wrk_it_says_how_to_install_it_and_exits_2(tmp_path: Path) -> None:
    """With no wrk on the PATH the benchmark prints how to install it and exits 2."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.bench_http", "--quick"],
        cwd=ROOT,
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert INSTALL_WRK in completed.stderr


@pytest.mark.timeout(120)
def test_a_fastapi_server_on_another_loop_than_its_stack_names_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver checks the loop each FastAPI server says it runs on: the plain stack's
    server (asyncio's loop) is refused when the stack is taken to name uvloop, so a stack
    cannot quietly change with what is installed (uvicorn's default takes uvloop and
    httptools whenever they are importable)."""
    with servers({"fastapi": ("bare",), "fastapi_std": ("bare",)}, "redis://unused", tmp_path):
        pass
    monkeypatch.setitem(bench.bench_http.UVICORN, "fastapi", ("uvloop", "h11"))
    with (
        pytest.raises(RuntimeError, match="runs on the asyncio event loop, not uvloop"),
        servers({"fastapi": ("bare",)}, "redis://unused", tmp_path),
    ):
        pass


def test_the_path_to_the_bare_app_weighs_what_the_middleware_adds_against_the_budget() -> None:
    """The report's breakdown per stack: the bare app's CPU per request in its process
    and the share of a core that was, what 0.85x its rate leaves a request (bare / 0.85 -
    bare), and what the middleware adds exact and approximate, the round trip being the
    difference; unknown CPU (a process that could not be read) gives no breakdown."""
    cpu = {
        # Seconds over 1,000 requests: 85 µs, 135 µs and 138 µs a request in the app.
        "fastapi_std.bare": Cpu(app=0.085, requests=1000),
        "fastapi_std.applimit": Cpu(app=0.135, redis=0.020, requests=1000),
        "fastapi_std.applimit_approx": Cpu(app=0.138, redis=0.002, requests=1000),
    }
    text = bare_path("fastapi_std", cpu, 11_500.0)
    assert text is not None
    assert "spends 85 µs of CPU a request and used 98% of a core" in text
    assert "may take 15 µs more there" in text
    assert "adds 50 µs exact (and 20 µs of Redis', on the other core)" in text
    assert "and 53 µs approximate: 53 µs is the middleware's own work" in text
    assert text.endswith("round trip adds nothing to it (it is batched).")
    cpu["fastapi_std.applimit"] = Cpu(app=0.160, redis=0.020, requests=1000)
    assert str(bare_path("fastapi_std", cpu, 11_500.0)).endswith("round trip adds 22 µs to it.")
    cpu["fastapi_std.applimit_approx"] = Cpu(app=0.095, requests=1000)
    assert str(bare_path("fastapi_std", cpu, 11_500.0)).endswith("within that budget.")
    cpu["fastapi_std.bare"] = Cpu(app=0.085, requests=1000, known=False)
    assert bare_path("fastapi_std", cpu, 11_500.0) is None
