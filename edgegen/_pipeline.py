"""Load, check and build a policy: the sequence every command that builds runs, once.

::

    policy.load(path)            PolicyLoadError: the CLI prints every diagnostic, exit 1
    -> _placement.check(policy)  the validity gate, with edgegen's placement checks
    -> print the diagnostics     policy's one formatter (errors and warnings on stderr)
    -> build                     only when the gate passes; CompileError for E301/E302

:func:`prepare` runs it and returns every outcome as a value, for a command that reports
them its own way (``build --format json``). :func:`load_and_build` is the form ``plan`` and
``apply`` use: it prints, refuses a policy with errors, and returns what was built.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

import edgegen_policy as policy
from edgegen_policy import Checked, Policy

from ._placement import check
from .compiler._artifacts import Artifacts
from .compiler._compile import build_checked
from .errors import CompileError, EdgegenError


@dataclass(frozen=True, slots=True)
class Prepared:
    """A loaded policy, the gate's answer, and the build: ``artifacts`` when it succeeded,
    ``error`` when the compiler refused; both None when the gate stopped it (not ``ok``)."""

    policy: Policy
    checked: Checked
    artifacts: Artifacts | None = None
    error: CompileError | None = None


def prepare(path: str, *, echo: TextIO | None = None) -> Prepared:
    """Load and check the policy at ``path``, and build it when the check passes.

    With ``echo``, its errors and warnings are printed there right after the check (info is
    not). PolicyLoadError propagates; a CompileError is returned, not raised.
    """
    loaded = policy.load(path)
    checked = check(loaded)
    if echo is not None:
        policy.write_diagnostics(checked.diagnostics, echo)
    if not checked.ok:
        return Prepared(loaded, checked)
    try:
        return Prepared(loaded, checked, build_checked(loaded, checked))
    except CompileError as exc:
        return Prepared(loaded, checked, error=exc)


def load_and_build(path: str) -> tuple[Policy, Artifacts]:
    """Load, check and build; errors and warnings are printed on stderr.

    Raises EdgegenError (naming ``edgegen validate``) when the policy has errors, and the
    CompileError of a build that fails.
    """
    prepared = prepare(path, echo=sys.stderr)
    if not prepared.checked.ok:
        raise EdgegenError(
            f"{path} has {len(prepared.checked.errors)} error(s), so there is nothing to "
            f"plan; fix them (edgegen validate {path} lists them) and run again"
        )
    if prepared.error is not None:
        raise prepared.error
    assert prepared.artifacts is not None
    return prepared.policy, prepared.artifacts
