"""The build's one optional step: applimit's hot modules compiled with mypyc, on request.

Everything about the project is in pyproject.toml; this file only adds extension modules,
and only when ``APPLIMIT_MYPYC=1`` is set (``APPLIMIT_MYPYC=1 pip install .``). Without it
the build is pure Python, as it always was, and needs no compiler. With it, mypyc (from
``mypy``, which the build then asks for) translates the modules in :data:`COMPILED` to C and
the C compiler builds one extension per module beside its ``.py``; Python imports the
extension first. When mypyc cannot be imported, or the C compiler fails or is missing, the
build says so and goes on pure Python: the ``.py`` files are always shipped.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The decision path's modules that are worth compiling (measured: docs/benchmarks-compare.md,
# "Why each speed trick stays"): planning and what it builds on (the compiled policy, the
# argument checks, the memo, the calls and their encoding, the replies), the flow, the keys.
# The others stay interpreted: _protocol (the interpreted wires subclass its classes),
# _decision and _frozen (they switch the class of plain slots objects, which a native class
# cannot), the wires, the shells and the web layer (thin over redis-py and the frameworks,
# or patched in tests).
COMPILED = [
    "applimit/_arguments.py",
    "applimit/_calls.py",
    "applimit/_flow.py",
    "applimit/_keys.py",
    "applimit/_memo.py",
    "applimit/_plan.py",
    "applimit/_replies.py",
    "applimit/_rules.py",
]
# What mypyc needs to build: mypy (mypyc ships inside it), and what `mypy --strict` needs to
# check the modules the way `make typecheck` does (the config in pyproject.toml loads the
# pydantic plugin, and the modules' imports must have their real types, not Any). The
# bounds are those of the dependencies and the dev extra in pyproject.toml.
BUILD_REQUIREMENTS = [
    "mypy[mypyc]>=1.11",
    "pydantic>=2.7,<3",
    "PyYAML>=6.0",
    "types-PyYAML",
    "redis>=5.0",
    "hiredis>=3.0",
]


def _wanted() -> bool:
    return os.environ.get("APPLIMIT_MYPYC", "") not in ("", "0")


def _say(message: str) -> None:
    # stderr: pip shows a build backend's stderr with -v, and always when the build fails.
    print(f"applimit: {message}", file=sys.stderr)


class _OptionalBuildExt(build_ext):
    """build_ext that leaves the pure-Python modules in charge when the C compiler fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # any compiler failure means: stay pure
            _say(f"compiling with mypyc failed ({error}); installing the pure-Python modules")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:  # as above, one extension at a time
            _say(f"{ext.name} not compiled ({error}); its pure-Python module is used")


def _options() -> dict[str, Any]:
    if not _wanted():
        return {}
    try:
        from mypyc.build import mypycify
    except ImportError:
        if "egg_info" in sys.argv[1:]:
            # pip's isolated build first runs this file to ask what the build needs
            # (setuptools runs egg_info for that); setup_requires is how a setup.py adds to
            # it, so mypy is there for the runs that build.
            _say("mypyc is not importable yet: asking the build for it")
            return {"setup_requires": BUILD_REQUIREMENTS}
        # A build without isolation (--no-build-isolation) in an environment without mypy.
        _say("mypyc is not installed: building pure Python (install mypy to compile)")
        return {}
    if {"egg_info", "dist_info"} & set(sys.argv[1:]):
        # Only the metadata is asked for (pip does so before it builds): it is the same
        # with or without extensions, and translating to C takes a while.
        return {}
    return {
        # group_name: the runtime the modules share is the top-level applimit__mypyc.
        "ext_modules": mypycify(COMPILED, opt_level="3", group_name="applimit"),
        "cmdclass": {"build_ext": _OptionalBuildExt},
    }


setup(**_options())
