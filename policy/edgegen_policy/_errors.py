"""Errors and the one diagnostic type of the policy package.

A :class:`Diagnostic` is every finding about a policy: a load error (``P...``), a lint
finding (``L0xx``, ``L1xx``), a check contributed by a consumer of the policy (edgegen's
``L2xx``) and the compiler's own (``E3xx``). ``_report.py`` is the one place that prints it
(terminal line, JSON, Markdown).

Exception tree::

    PolicyError                 base of everything this package raises
    └── PolicyLoadError         the file could not be read, parsed or validated;
                                carries every Diagnostic found, not just the first
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Severity(StrEnum):
    """How serious a diagnostic is: errors fail validation, warnings only with --strict."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Layer(StrEnum):
    """A part of the system that enforces the policy, and that an error can stop.

    Every error makes the policy invalid (``edgegen validate`` fails, the CLI refuses it);
    some also make a layer impossible: the edge cannot be built, or the app cannot enforce
    the limits. ``Diagnostic.stops`` says which.
    """

    EDGE = "edge"  # edgegen build: the rules and the Worker
    APP = "app"  # applimit: the in-app limiter


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about a policy file, with where it is and how to fix it.

    ``file``, ``line``, ``column`` and ``path`` (the field, ``limits[1].app.tiers.pro``)
    locate it, each None or empty when unknown; ``message`` is a full sentence that names
    the fix; ``fix`` repeats the fix alone where it is a separate step (for programs);
    ``limit`` names the limit at fault; ``stops`` the layers an error makes impossible.
    """

    message: str
    code: str
    severity: Severity = Severity.ERROR
    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str = ""
    limit: str | None = field(default=None, compare=False)
    fix: str = field(default="", compare=False)
    stops: frozenset[Layer] = field(default=frozenset(), compare=False)

    def format(self) -> str:
        """``policy.yaml:14:9: limits[1].app.tiers.pro: message`` (parts omitted if unknown)."""
        from ._report import diagnostic_line

        return diagnostic_line(self)

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--format json``."""
        from ._report import diagnostic_json

        return diagnostic_json(self)


class PolicyError(Exception):
    """Base class of the errors raised by the policy package."""

    exit_code = 1


class PolicyLoadError(PolicyError):
    """The policy could not be loaded; ``diagnostics`` lists every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        lines = [d.format() for d in diagnostics]
        super().__init__("\n".join(lines) if lines else "the policy could not be loaded")
