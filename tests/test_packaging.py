"""`pip install .` (not only editable) ships every package and its data files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# A Python warning class in the build's output (SetuptoolsDeprecationWarning,
# BuildBackendWarning, ...): what setuptools prints, boxed over dozens of lines, when the
# configuration is ambiguous. pip's own "WARNING:" lines (an index it cannot read) are not.
_BUILD_WARNING = re.compile(r"\b[A-Z][A-Za-z]*Warning\b")


@dataclass(frozen=True)
class Build:
    """A wheel built from the source tree, and everything the build printed."""

    wheel: Path
    output: str


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """Build the project's wheel the way `pip install .` does, keeping the backend's output
    (``-v``: without it pip hides what setuptools prints)."""
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    [built] = out.glob("*.whl")
    return Build(wheel=built, output=result.stdout + result.stderr)


@pytest.fixture(scope="module")
def wheel(build: Build) -> Path:
    """The built wheel."""
    return build.wheel


def test_the_build_prints_no_setuptools_warning(build: Build) -> None:
    """pyproject.toml's package configuration is complete: building (as `pip install .`
    does) prints no setuptools warning, such as the one about the Lua scripts' directory
    being importable but not listed in ``packages``."""
    warnings = [line for line in build.output.splitlines() if _BUILD_WARNING.search(line)]
    assert warnings == [], "\n".join(warnings)
    assert "absent from the `packages` configuration" not in build.output


def _data_files() -> list[str]:
    """Every data file in the source tree that the installed packages need at run time."""
    wanted = [f"applimit/lua/{p.name}" for p in (ROOT / "applimit" / "lua").glob("*.lua")]
    templates = ROOT / "workers" / "templates"
    wanted += [
        f"edgegen/_worker_templates/{p.name}"
        for p in templates.iterdir()
        if p.suffix in (".js", ".j2", ".json")
    ]
    return [*wanted, "edgegen_policy/py.typed", "edgegen/py.typed", "applimit/py.typed"]


def test_wheel_contains_packages_and_data(wheel: Path) -> None:
    """The wheel holds the three packages, their py.typed markers, Lua and templates."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("edgegen_policy", "edgegen", "applimit"):
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
        "import edgegen_policy, edgegen.cli, sys; "
        "assert edgegen_policy.__file__.startswith(sys.argv[1]), edgegen_policy.__file__; "
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


# Packages each install leaves out: an app-only install has no httpx or jinja2, an edge-only
# install no redis or hiredis. A None in sys.modules makes any import of them fail.
_BLOCK = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"


def _run_without(names: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK.format(names=names) + code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_an_app_install_needs_none_of_the_edge_packages() -> None:
    """applimit (limiter, ASGI/WSGI middleware) imports and decides a limit's plan without
    httpx and jinja2, the dependencies of the `edge` extra."""
    code = (
        "import applimit, applimit.asgi, applimit.wsgi, edgegen_policy as policy\n"
        "from applimit._plan import Core\n"
        "p = policy.load('examples/policy.yaml')\n"
        "assert not any(m in sys.modules and sys.modules[m] for m in ('httpx', 'jinja2'))\n"
    )
    result = _run_without(("httpx", "jinja2"), code)
    assert result.returncode == 0, result.stderr


def test_an_app_install_runs_the_policy_commands(tmp_path: Path) -> None:
    """Without httpx and jinja2 (an ``[app]``-only install), ``edgegen --help``,
    ``validate``, ``show``, ``schema`` and ``diff`` work (diff compares the policies; the
    Worker's artifacts need Jinja, and it says so); ``build``, ``plan`` and ``report`` exit
    2 naming the extra to install, without a traceback."""
    policy_file = "examples/policy.yaml"
    works = [
        ["validate", policy_file],
        ["show", policy_file],
        ["schema"],
        ["diff", "examples/policy-previous.yaml", policy_file],
    ]
    needs = [
        ["build", policy_file, "--out", str(tmp_path / "out")],
        ["plan", policy_file, "--state", "examples/zone-state.json"],
        ["report", policy_file, "--since", "1h"],
    ]
    code = (
        "import edgegen.cli, json\n"
        "codes = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        codes.append(edgegen.cli.main(argv))\n"
        "    except SystemExit as exc:\n"
        "        codes.append(exc.code)\n"
        "print(json.dumps(codes))\n"
    )
    block = _BLOCK.format(names=("httpx", "jinja2"))
    result = subprocess.run(
        [sys.executable, "-c", block + code, json.dumps([["--help"], *works, *needs])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
        env={**os.environ, "CLOUDFLARE_API_TOKEN": "t" * 40},
    )
    assert result.returncode == 0, result.stderr
    codes = json.loads(result.stdout.strip().splitlines()[-1])
    assert codes == [0] * (1 + len(works)) + [2] * len(needs), (codes, result.stderr)
    assert "Traceback" not in result.stderr
    for argv in needs:
        assert f"edgegen {argv[0]} needs" in result.stderr
    assert result.stderr.count("pip install 'edgegen[edge]'") >= len(needs)


def test_an_edge_install_needs_none_of_the_app_packages(tmp_path: Path) -> None:
    """edgegen validates and builds the example policy without redis and hiredis, the
    dependencies of the `app` extra."""
    argv = ["build", "examples/policy.yaml", "--out", str(tmp_path)]
    code = f"import edgegen.cli\nraise SystemExit(edgegen.cli.main({argv!r}))\n"
    result = _run_without(("redis", "hiredis"), code)
    assert result.returncode == 0, result.stderr
    assert any(tmp_path.iterdir())


def test_extras_split_the_dependencies() -> None:
    """The distribution's metadata: core needs only pydantic and PyYAML; `app`, `edge` and
    `all` add the rest; `flask` and `django` add the framework to the app's limiter,
    `prometheus` and `otel` the metrics library its exporter writes to."""
    import importlib.metadata

    requires = importlib.metadata.requires("edgegen") or []
    core = sorted(r.split(";")[0].split("<")[0].split(">")[0] for r in requires if ";" not in r)
    assert core == ["PyYAML", "pydantic"]

    def extra(name: str) -> set[str]:
        # The project name of each requirement, without its version range.
        return {
            re.split(r"[<>=!~;\s]", r, maxsplit=1)[0] for r in requires if f'extra == "{name}"' in r
        }

    assert extra("app") == {"redis", "hiredis"}
    assert extra("edge") == {"httpx", "jinja2"}
    assert extra("all") == {"edgegen[app,edge]"}
    assert extra("flask") == {"edgegen[app]", "flask"}
    assert extra("django") == {"edgegen[app]", "django"}
    assert extra("prometheus") == {"edgegen[app]", "prometheus-client"}
    assert extra("otel") == {"edgegen[app]", "opentelemetry-api"}


def test_the_limiter_imports_without_the_metrics_libraries() -> None:
    """applimit (and its observer interface) needs neither prometheus_client nor
    OpenTelemetry: only the exporter modules do, through their extras."""
    done = _run_without(
        ("prometheus_client", "opentelemetry"),
        "import applimit\nassert applimit.Observer and applimit.DecisionEvent\n",
    )
    assert done.returncode == 0, done.stderr


def test_each_framework_helper_needs_only_its_own_framework() -> None:
    """applimit.flask imports without Django, applimit.django without Flask (and neither
    needs httpx, the edge's; jinja2 is Flask's own dependency too): the `flask` and `django`
    extras install one framework each."""
    flask_only = _run_without(
        ("django", "httpx"),
        "import applimit.flask\nassert 'django' not in sys.modules or not sys.modules['django']\n",
    )
    assert flask_only.returncode == 0, flask_only.stderr
    django_only = _run_without(
        ("flask", "werkzeug", "httpx", "jinja2"),
        "import applimit.django\nassert not sys.modules.get('flask')\n",
    )
    assert django_only.returncode == 0, django_only.stderr
