"""Smoke test of ``bench.callgrind``'s scenarios, so that they do not rot between counts.

The driver runs each scenario's workload in a child process under valgrind; the workload
itself is plain Python (``--child SCENARIO URL COUNT``), so each one is run here without
valgrind, briefly, against a real server: it must finish its warm-up and its counted loop
and exit 0. The instruction counts are not asserted (valgrind gives them, not a test).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from harness import RedisServer

from bench.callgrind import CONCURRENCY, SCENARIOS, child_command

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_each_scenario_runs_its_workload(redis_server: RedisServer, scenario: str) -> None:
    """The child of ``scenario`` decides (or pings) its warm-up and CONCURRENCY more, then
    exits 0 with nothing on stderr."""
    completed = subprocess.run(
        child_command(scenario, redis_server.url, CONCURRENCY),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stderr == "", completed.stderr


def test_redis_callgrind_counts_the_script_in_the_server(tmp_path: Path) -> None:
    """``bench.redis_callgrind`` runs redis-server under callgrind, collecting only inside
    FCALL: a count of one scenario is written, and it is a script call's size (a tally that
    missed ``fcallCommand``, the toggle, would read 0; one that counted the whole server,
    start-up included, millions)."""
    from bench import redis_callgrind

    if shutil.which("valgrind") is None:
        pytest.fail("valgrind is not installed (.ci/run installs it): apt-get install valgrind")
    assert redis_callgrind.main(["--only", "gcra", "--calls", "300", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "gcra.txt").read_text(encoding="utf-8")
    found = re.search(r"instructions per call: ([\d,]+)", text)
    assert found is not None, text
    per_call = int(found.group(1).replace(",", ""))
    assert 10_000 < per_call < 1_000_000, text
