"""Shared helpers for the edge compiler tests: the golden policy, golden files, the JS runner.

Golden files live under tests/golden/edge/<plan>/. Run the tests with UPDATE_GOLDEN=1 to
rewrite them from the current compiler, then review the diff; without it, the tests
compare and fail on any difference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import pytest
from edgegen_policy import CloudflarePlan, Policy

import edgegen

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "edge"
GOLDEN_POLICY = GOLDEN / "policy.yaml"
WORKERS = ROOT / "workers"
NODE_MODULES = WORKERS / "node_modules"
HARNESS = WORKERS / "harness"
PLANS = [plan.value for plan in CloudflarePlan]


def update_golden() -> bool:
    """True when the run should rewrite golden files instead of comparing."""
    return os.environ.get("UPDATE_GOLDEN", "") not in ("", "0")


def golden_policy(plan: str) -> Policy:
    """The golden policy, for one plan."""
    return policy.load(GOLDEN_POLICY, env={"PLAN": plan})


def explain_text(artifacts: edgegen.Artifacts) -> str:
    """Placements as text, one limit per block, for a golden file."""
    lines: list[str] = []
    for placement in artifacts.placements:
        lines.append(f"{placement.limit} -> {placement.target.value}")
        lines.extend(f"    {reason}" for reason in placement.reasons)
    return "\n".join(lines) + "\n"


def golden_files(artifacts: edgegen.Artifacts) -> dict[str, str]:
    """Everything compared for one plan: the built files and the explanation."""
    files = dict(artifacts.files())
    files["explain.txt"] = explain_text(artifacts)
    return files


def compare_with_golden(directory: Path, files: dict[str, str]) -> None:
    """Assert the directory holds exactly these files (or rewrite it with UPDATE_GOLDEN)."""
    if update_golden():
        if directory.exists():
            shutil.rmtree(directory)
        for relative, content in files.items():
            target = directory / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode("utf-8"))
        return
    assert directory.is_dir(), f"{directory} is missing; run with UPDATE_GOLDEN=1 to create it"
    on_disk = {
        str(path.relative_to(directory)): path.read_bytes().decode("utf-8")
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
    assert sorted(on_disk) == sorted(files), "the set of generated files changed"
    for relative, content in files.items():
        assert on_disk[relative] == content, (
            f"{directory / relative} differs from the build; if the change is intended, run "
            "the tests with UPDATE_GOLDEN=1 and review the diff"
        )


def require_node_modules() -> None:
    """Fail (never skip) when the npm packages the JS tests need are not installed."""
    if not (NODE_MODULES / "miniflare").is_dir() or not (NODE_MODULES / "wrangler").is_dir():
        pytest.fail(
            "workers/node_modules is missing miniflare or wrangler: run `make test`, or "
            "`npm ci --prefix workers`, to install the pinned packages"
        )
    if shutil.which("node") is None:
        pytest.fail("node is not on PATH: install Node.js 20 (see .ci/run)")


def run_node(script: Path, job: dict[str, Any], timeout: float = 120) -> Any:
    """Run a harness script with a JSON job on stdin; returns its JSON answer."""
    require_node_modules()
    result = subprocess.run(
        ["node", str(script)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=WORKERS,
        check=False,
    )
    assert result.returncode == 0, (
        f"{script.name} failed ({result.returncode}):\n{result.stderr}\n{result.stdout}"
    )
    return json.loads(result.stdout)
