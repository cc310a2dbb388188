"""The validity gate: one decision about a loaded policy, made from its diagnostics.

:func:`check` runs the lint pass (with the checks a consumer contributes) once and answers
every question asked of a policy before it is used:

- ``Checked.ok``: no errors; ``edgegen validate`` passes and the CLI commands go ahead;
- ``Checked.stopping(Layer.EDGE)``: the errors that make the edge impossible to build
  (``edgegen.build`` raises CompileError with exactly these);
- ``Checked.stopping(Layer.APP)``: the errors that make the app unable to enforce the
  limits (applimit refuses the policy with these).

Which layers an error stops is decided where the error is found (``Diagnostic.stops``), so
the gate itself holds no list of codes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ._errors import Diagnostic, Layer, Severity
from ._lint import Check, lint
from ._model import Policy


@dataclass(frozen=True, slots=True)
class Checked:
    """Every diagnostic of a policy, sorted by place in the file, and the gate's answers."""

    diagnostics: tuple[Diagnostic, ...]

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """Every error: the policy is invalid while there is one."""
        return self.of(Severity.ERROR)

    @property
    def ok(self) -> bool:
        """True when the policy has no errors (warnings and info are allowed)."""
        return not self.errors

    def of(self, severity: Severity) -> tuple[Diagnostic, ...]:
        """The diagnostics of one severity, in order."""
        return tuple(d for d in self.diagnostics if d.severity is severity)

    def count(self, severity: Severity) -> int:
        """How many diagnostics have this severity."""
        return len(self.of(severity))

    def failing(self, *, strict: bool = False) -> int:
        """How many diagnostics fail validation: errors, and warnings too when ``strict``."""
        return self.count(Severity.ERROR) + (self.count(Severity.WARNING) if strict else 0)

    def stopping(self, layer: Layer) -> tuple[Diagnostic, ...]:
        """The errors that make ``layer`` impossible (empty: it can go ahead)."""
        return tuple(d for d in self.errors if layer in d.stops)


def check(policy: Policy, checks: Iterable[Check] = ()) -> Checked:
    """Lint the policy (with the contributed ``checks``) and return the gate's answers.

    edgegen passes its placement checks (``edgegen._placement.EDGE_CHECKS``); applimit
    passes none and asks ``stopping(Layer.APP)``.
    """
    return Checked(tuple(lint(policy, checks)))
