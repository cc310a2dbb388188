"""Smoke test of the soak, so ``make soak`` does not rot: a short run must pass, and the
reference models must catch an overshoot when one is fed to them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import soak

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_short_soak_passes() -> None:
    """``python -m bench.soak --seconds 8`` exits 0 and prints its summary."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--seconds", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "soak: OK" in completed.stdout
    assert "model violations per limit: {'log': 0, 'gcra': 0, 'sw': 0}" in completed.stdout


def test_models_catch_overshoot() -> None:
    """One admission too many in a window is a violation for sliding_log and gcra; twice
    the quota is still within sliding_window's bound, and spread-out traffic is fine."""
    burst = [(i * 0.001, i * 0.001 + 0.0005) for i in range(soak.QUOTA + 1)]
    assert soak._violations("sliding_log", burst) > 0
    assert soak._violations("gcra", burst) > 0
    assert soak._violations("sliding_window", burst) == 0
    spaced = [
        (i * soak.PERIOD / soak.QUOTA, i * soak.PERIOD / soak.QUOTA + 0.001) for i in range(200)
    ]
    for algorithm in ("sliding_log", "gcra", "sliding_window"):
        assert soak._violations(algorithm, spaced) == 0
