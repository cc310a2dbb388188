"""`pip install .` (not only editable) ships every package and its data files."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the project's wheel the way `pip install .` does."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("*.whl")
    return built


def _data_files() -> list[str]:
    """Every data file in the source tree that the installed packages need at run time."""
    wanted = [f"applimit/lua/{p.name}" for p in (ROOT / "applimit" / "lua").glob("*.lua")]
    templates = ROOT / "workers" / "templates"
    wanted += [
        f"edgegen/_worker_templates/{p.name}"
        for p in templates.iterdir()
        if p.suffix in (".js", ".j2", ".json")
    ]
    return [*wanted, "policy/py.typed", "edgegen/py.typed", "applimit/py.typed"]


def test_wheel_contains_packages_and_data(wheel: Path) -> None:
    """The wheel holds the three packages, their py.typed markers, Lua and templates."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("policy", "edgegen", "applimit"):
        assert f"{package}/__init__.py" in names
    missing = [f for f in _data_files() if f not in names]
    assert missing == []
    assert any(n.endswith("entry_points.txt") for n in names)


def test_installed_wheel_runs_outside_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    """Installed from the wheel, `edgegen validate` works from another directory."""
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = (
        "import policy, edgegen.cli, sys; "
        "assert policy.__file__.startswith(sys.argv[1]), policy.__file__; "
        "raise SystemExit(edgegen.cli.main(['validate', sys.argv[2]]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(site), str(ROOT / "examples" / "policy.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
