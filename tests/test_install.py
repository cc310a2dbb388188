"""The wheel, installed with each extra into a clean virtual environment, as README says.

No checkout is on the path: each environment has only what ``pip install "WHEEL[extra]"``
put there (dependencies from the package index, through pip's cache), and every command runs
from a directory of its own that holds the app's own ``policy.py``, the module name most
likely to clash with a library's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "policy.yaml"
INSTALL_TIMEOUT = 600
# An app's own module called policy, as many apps have: it must not shadow the library.
APP_POLICY_MODULE = "RULES = {'admins': 'unlimited'}\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built as ``make dist`` builds it."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT,
    )
    [built] = out.glob("*.whl")
    return built


def _environment(wheel: Path, extra: str, where: Path) -> Path:
    """A clean virtual environment with ``wheel[extra]`` installed; its bin directory."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    bin_dir = where / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[{extra}]"],
        check=True,
        capture_output=True,
        timeout=INSTALL_TIMEOUT,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return bin_dir


def _app_directory(tmp_path: Path) -> Path:
    """A directory like an app's: its own policy.py, and the policy file."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "policy.py").write_text(APP_POLICY_MODULE, encoding="utf-8")
    shutil.copy(EXAMPLE, app / "policy.yaml")
    return app


def _run(bin_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
        env={**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"},
    )


@pytest.mark.slow
def test_an_app_install(wheel: Path, tmp_path: Path) -> None:
    """``pip install "edgegen[app]"``: applimit imports and decides from a directory with
    the app's own policy.py (memory://, from the environment, as the docs show); edgegen's
    policy commands work, and a command of the edge extra names it (exit 2)."""
    bin_dir = _environment(wheel, "app", tmp_path / "venv")
    app = _app_directory(tmp_path)
    code = (
        "import os, policy\n"
        "os.environ['REDIS_URL'] = 'memory://'\n"
        "from applimit import Caller, Limiter\n"
        "import edgegen_policy\n"
        "assert policy.RULES == {'admins': 'unlimited'}, policy\n"
        "assert 'site-packages' in edgegen_policy.__file__, edgegen_policy.__file__\n"
        "limiter = Limiter.from_policy('policy.yaml')\n"
        "print([limiter.hit('api', 'u', tier='free').allowed for _ in range(2)])\n"
    )
    done = _run(bin_dir, "python", "-c", code, cwd=app)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, True]"
    assert _run(bin_dir, "edgegen", "--help", cwd=app).returncode == 0
    validated = _run(bin_dir, "edgegen", "validate", "policy.yaml", cwd=app)
    assert validated.returncode == 0, validated.stderr
    assert "valid" in validated.stdout
    built = _run(bin_dir, "edgegen", "build", "policy.yaml", "--out", "out", cwd=app)
    assert built.returncode == 2
    assert "pip install 'edgegen[edge]'" in built.stderr
    assert "Traceback" not in built.stderr


@pytest.mark.slow
def test_an_edge_install(wheel: Path, tmp_path: Path) -> None:
    """``pip install "edgegen[edge]"``: edgegen validates and builds the example policy
    from a directory with the app's own policy.py; applimit is there, redis-py is not."""
    bin_dir = _environment(wheel, "edge", tmp_path / "venv")
    app = _app_directory(tmp_path)
    assert _run(bin_dir, "edgegen", "--help", cwd=app).returncode == 0
    assert _run(bin_dir, "edgegen", "validate", "policy.yaml", cwd=app).returncode == 0
    built = _run(bin_dir, "edgegen", "build", "policy.yaml", "--out", "out", cwd=app)
    assert built.returncode == 0, built.stderr
    assert (app / "out" / "cloudflare" / "http_ratelimit.json").is_file()
    missing = _run(bin_dir, "python", "-c", "import redis", cwd=app)
    assert missing.returncode != 0
