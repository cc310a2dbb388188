"""The build compiled with mypyc (``APPLIMIT_MYPYC=1``, setup.py) decides as the pure one.

The rest of the suite runs the pure-Python modules of the working tree. Here the wheel is
built with the hot modules compiled, in a copy of the tree (never beside the sources, where
every other test would import the extensions), its extensions are put beside the copy's
``.py`` files, and the contract, property and key suites run again in a child pytest
against them. A second build with a C compiler that fails shows that the pure-Python
modules are what a machine without one installs.

Building takes about a minute (mypy checks the modules, then the C compiler runs), the
whole file about a minute and a half: the tests are marked ``slow``, and skipped where no
C compiler or Python headers exist.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What the child pytest runs against the compiled modules: the behaviour of both limiters
# on one server, on a Redis Cluster and on memory:// (the contract), the algorithms against
# reference models (the properties), and the identities and app keys that become keys.
SUITES = [
    "tests/applimit/test_applimit_contract.py",
    "tests/applimit/test_applimit_properties.py",
    "tests/applimit/test_applimit_keys.py",
    "tests/applimit/test_applimit_quotas.py",
]


def _compiler() -> str | None:
    """Why the extensions cannot be built here, or None when they can."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler}) on the PATH"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        return f"no Python headers ({headers})"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_compiler() is not None, reason=str(_compiler())),
]


def _compiled_modules() -> list[str]:
    """The modules setup.py compiles (its ``COMPILED``), as dotted names."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "COMPILED" for target in node.targets
        ):
            paths: list[str] = ast.literal_eval(node.value)
            return [p.removesuffix(".py").replace("/", ".") for p in paths]
    raise AssertionError("setup.py has no COMPILED list")


def _copy_tree(destination: Path) -> Path:
    """The sources a build and the tests need, without what the working tree has built."""
    ignored = shutil.ignore_patterns(
        ".git",
        ".venv",
        "node_modules",
        "build",
        "*.egg-info",
        "__pycache__",
        ".*_cache",
        ".hypothesis",
        "out",
        "results",
        "*.so",
    )
    shutil.copytree(ROOT, destination, ignore=ignored)
    return destination


def _build(source: Path, out: Path, **env: str) -> tuple[Path, str]:
    """``pip wheel`` of ``source`` with ``APPLIMIT_MYPYC=1``: the wheel and the output."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "APPLIMIT_MYPYC": "1", **env},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    [wheel] = out.glob("*.whl")
    return wheel, output


@pytest.fixture(scope="module")
def compiled_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree whose compiled modules are the wheel's extensions."""
    tree = _copy_tree(tmp_path_factory.mktemp("compiled") / "tree")
    wheel, _ = _build(tree, tmp_path_factory.mktemp("wheel"))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".so"):
                archive.extract(name, tree)
    return tree


def _run(tree: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # cwd first on sys.path (python -c, python -m): the copy's applimit, not the editable
    # install's, and pytest's rootdir (hence conftest and pythonpath) is the copy too.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_the_hot_modules_are_compiled(compiled_tree: Path) -> None:
    """Every module setup.py names is imported from its extension, not from its .py."""
    modules = _compiled_modules()
    assert "applimit._plan" in modules
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n"
    code += "    print(importlib.import_module(name).__file__)"
    result = _run(compiled_tree, "-c", code, *modules, timeout=60)
    assert result.returncode == 0, result.stderr
    files = result.stdout.split()
    assert len(files) == len(modules)
    for module, file in zip(modules, files, strict=True):
        assert file.endswith(".so"), f"{module} was imported from {file}"
        assert Path(file).is_relative_to(compiled_tree), file


def test_the_compiled_modules_pass_the_contract(compiled_tree: Path) -> None:
    """The contract, property and key suites pass against the compiled modules."""
    result = _run(
        compiled_tree,
        *("-m", "pytest", *SUITES, "-q", "-p", "no:cacheprovider"),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # The suites ran, not merely collected nothing: hundreds of tests pass.
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed is not None, result.stdout[-2000:]
    assert int(passed.group(1)) >= 200, result.stdout[-2000:]
    assert " failed" not in result.stdout


# Arguments of the wrong type or value, each as an app might pass them. A compiled function
# checks its typed arguments on entry, so Core takes them as ``object`` until its own
# checks (applimit/_arguments.py); this prints, per call, the error raised.
_WRONG_ARGUMENTS = """
import applimit._plan
from applimit import Limiter
from edgegen_policy import loads

policy = loads('''
version: 1
tiers: [free, pro]
limits:
  - name: api
    match: {paths: ["/"]}
    app: {per: user, algorithm: sliding_log, tiers: {free: 10/1m, pro: 20/1m}}
  - name: org
    match: {paths: ["/"]}
    app: {per: org, algorithm: gcra, tiers: {free: 10/1m, pro: 20/1m}}
''', "policy.yaml")
limiter = Limiter(policy, redis_url="memory://")
print(applimit._plan.__file__.rsplit(".", 1)[-1])
calls = [
    lambda: limiter.hit(5, "u"),
    lambda: limiter.hit("nope", "u"),
    lambda: limiter.hit("api", "u", tier=5),
    lambda: limiter.hit("api", "u", tier="gold"),
    lambda: limiter.hit("api", 5),
    lambda: limiter.hit("api", ""),
    lambda: limiter.hit("api", None, ip=5),
    lambda: limiter.hit("api", "u", cost="3"),
    lambda: limiter.hit("api", "u", cost=True),
    lambda: limiter.hit("org", "u", keys={"org": 5}),
    lambda: limiter.hit("org", "u", keys=["org"]),
    lambda: limiter.check_request("GET", "/", "u", keys={"org": 5}),
    lambda: limiter.check_request("GET", "/", 5),
    lambda: limiter.check_request("GET", "/", "u", tier=5, cost=2),
    lambda: limiter.reset("api", 5),
]
for call in calls:
    try:
        call()
        print("no error")
    except Exception as error:
        print(type(error).__name__, error)
"""


def test_wrong_arguments_raise_the_same_errors_compiled_and_pure(compiled_tree: Path) -> None:
    """Each argument of the wrong type or value raises the same typed error, with the same
    message, from the compiled modules as from the pure ones (never a bare TypeError)."""
    compiled = _run(compiled_tree, "-c", _WRONG_ARGUMENTS, timeout=60)
    pure = _run(ROOT, "-c", _WRONG_ARGUMENTS, timeout=60)
    assert compiled.returncode == 0, compiled.stderr
    assert pure.returncode == 0, pure.stderr
    compiled_lines, pure_lines = compiled.stdout.splitlines(), pure.stdout.splitlines()
    assert (compiled_lines[0], pure_lines[0]) == ("so", "py")
    assert len(pure_lines) == 16
    assert compiled_lines[1:] == pure_lines[1:]
    assert [line for line in pure_lines if line.startswith("TypeError")] == []


def test_without_a_working_compiler_the_build_is_pure_python(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """APPLIMIT_MYPYC=1 with a C compiler that fails still builds a wheel: it holds every
    .py file and no extension, and the build says why."""
    tree = _copy_tree(tmp_path_factory.mktemp("nocc") / "tree")
    false = shutil.which("false")
    assert false is not None
    wheel, output = _build(tree, tmp_path_factory.mktemp("wheel"), CC=false)
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if n.endswith(".so")] == []
    for module in _compiled_modules():
        assert module.replace(".", "/") + ".py" in names
    assert "not compiled" in output or "compiling with mypyc failed" in output
