"""Fuzzing the policy loader and the CLI: every input gives a result or a clear error."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import edgegen_policy as policy
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgegen.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy.yaml"
EXAMPLE_DATA: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())

# Scalars that look like what users write, plus hostile ones.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        ["100/1m", "5/10s", "0/1m", "1/0s", "10m", "50ms", "${X}", "${X:-1/1s}", "$${", "{}"]
    ),
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)


def _assert_loads_or_explains(text: str) -> None:
    try:
        loaded = policy.loads(text, "fuzz.yaml", env={})
    except policy.PolicyLoadError as exc:
        assert exc.diagnostics, "a load error must carry at least one diagnostic"
        for diagnostic in exc.diagnostics:
            assert diagnostic.message and diagnostic.code
            assert diagnostic.format().startswith("fuzz.yaml")
    else:
        # A policy that loads must lint without raising.
        policy.lint(loaded)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text(text: str) -> None:
    """Any text is either a policy or a list of located errors."""
    _assert_loads_or_explains(text)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(values)
def test_arbitrary_structures(data: object) -> None:
    """Any YAML structure is either a policy or a list of located errors."""
    _assert_loads_or_explains(yaml.safe_dump(data))


def _mutate(data: Any, path: list[Any], value: object) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict):
        key = list(data)[head % len(data)] if data else "x"
        return {**data, key: _mutate(data.get(key), rest, value)}
    if isinstance(data, list) and data:
        index = head % len(data)
        return [*data[:index], _mutate(data[index], rest, value), *data[index + 1 :]]
    return value


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=5), values)
def test_mutated_example(path: list[int], value: object) -> None:
    """The example policy with any one value replaced loads or explains itself."""
    _assert_loads_or_explains(yaml.safe_dump(_mutate(EXAMPLE_DATA, path, value)))


args = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "validate",
                "show",
                "schema",
                "build",
                "--strict",
                "--format",
                "json",
                "text",
                "--explain",
                "--out",
                "-q",
                "--help",
                str(EXAMPLE),
                "/nonexistent.yaml",
                "/",
            ]
        ),
        st.text(max_size=20),
    ),
    max_size=5,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(args)
def test_cli_arguments(argv: list[str]) -> None:
    """Any command line exits with 0, 1 or 2 and never shows a traceback."""
    if "--out" in argv:
        # Never write into the source tree while fuzzing.
        argv = [a for a in argv if a != "--out"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 2
    assert code in (0, 1, 2), (argv, err.getvalue())
    assert "Traceback" not in err.getvalue() + out.getvalue()
