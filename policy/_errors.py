"""Errors and diagnostics of the policy package.

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


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about a policy file, with where it is and how to fix it."""

    message: str
    code: str
    severity: Severity = Severity.ERROR
    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str = ""
    limit: str | None = field(default=None, compare=False)

    def format(self) -> str:
        """``policy.yaml:14:9: limits[1].app.tiers.pro: message`` (parts omitted if unknown)."""
        where = ""
        if self.file:
            where = self.file
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            where += ": "
        field_path = f"{self.path}: " if self.path else ""
        return f"{where}{field_path}{self.message}"

    def to_json(self) -> dict[str, object]:
        """A plain dict for ``--format json``."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "limit": self.limit,
            "message": self.message,
        }


class PolicyError(Exception):
    """Base class of the errors raised by the policy package."""

    exit_code = 1


class PolicyLoadError(PolicyError):
    """The policy could not be loaded; ``diagnostics`` lists every problem found."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = diagnostics
        lines = [d.format() for d in diagnostics]
        super().__init__("\n".join(lines) if lines else "the policy could not be loaded")
