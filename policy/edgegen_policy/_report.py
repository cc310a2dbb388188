"""The one formatter of diagnostics: a terminal line, JSON, Markdown. Pure, except
:func:`write_diagnostics`, which writes the terminal lines to the streams it is given.

Every program that shows a :class:`~policy.Diagnostic` goes through here, so a finding reads
the same in ``edgegen validate``, ``build``, ``plan``, a load error and a PR comment::

    policy.yaml:14:9: limits[1].app.tiers.pro: '1000/1min' is not a rate; ... [error P100]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TextIO

from ._errors import Diagnostic, Severity

# Markdown's line endings (CommonMark has only these three).
_LINE_END = re.compile(r"\r\n|\r|\n")
# ASCII punctuation: CommonMark lets a backslash make any of it literal.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def diagnostic_where(diagnostic: Diagnostic) -> str:
    """``policy.yaml:14:9`` (file, line and column as far as known), or ``""``."""
    if not diagnostic.file:
        return ""
    where = diagnostic.file
    if diagnostic.line is not None:
        where += f":{diagnostic.line}"
        if diagnostic.column is not None:
            where += f":{diagnostic.column}"
    return where


def diagnostic_line(diagnostic: Diagnostic) -> str:
    """``policy.yaml:14:9: limits[1].app.tiers.pro: message`` (parts omitted if unknown)."""
    where = diagnostic_where(diagnostic)
    prefix = f"{where}: " if where else ""
    field_path = f"{diagnostic.path}: " if diagnostic.path else ""
    return f"{prefix}{field_path}{diagnostic.message}"


def diagnostic_terminal(diagnostic: Diagnostic) -> str:
    """The line a terminal shows: :func:`diagnostic_line` and ``[severity code]``."""
    return f"{diagnostic_line(diagnostic)} [{diagnostic.severity.value} {diagnostic.code}]"


def diagnostic_json(diagnostic: Diagnostic) -> dict[str, object]:
    """A plain dict for ``--format json`` (key order is part of the output)."""
    return {
        "code": diagnostic.code,
        "severity": diagnostic.severity.value,
        "file": diagnostic.file,
        "line": diagnostic.line,
        "column": diagnostic.column,
        "path": diagnostic.path,
        "limit": diagnostic.limit,
        "message": diagnostic.message,
    }


def _markdown_text(text: str) -> str:
    """Plain text: every ASCII punctuation character escaped (no markup, no HTML)."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_END.sub(" ", text))


def diagnostics_markdown(diagnostics: Iterable[Diagnostic]) -> str:
    """A Markdown list for a pull request comment, one item per diagnostic.

    ``- **error** L201 at policy.yaml:14:9, limits[0].edge.rate: message`` (then the fix,
    when it is a separate step); every text from the policy is escaped, so a limit name
    never becomes markup or HTML. An empty list gives ``""``.
    """
    items: list[str] = []
    for diagnostic in diagnostics:
        where = ", ".join(
            _markdown_text(part) for part in (diagnostic_where(diagnostic), diagnostic.path) if part
        )
        at = f" at {where}" if where else ""
        item = (
            f"- **{diagnostic.severity.value}** {_markdown_text(diagnostic.code)}{at}: "
            f"{_markdown_text(diagnostic.message)}"
        )
        if diagnostic.fix and diagnostic.fix not in diagnostic.message:
            item += f" Fix: {_markdown_text(diagnostic.fix)}"
        items.append(item)
    return "".join(f"{item}\n" for item in items)


def write_diagnostics(
    diagnostics: Iterable[Diagnostic],
    stream: TextIO,
    *,
    info: TextIO | None = None,
    errors_only: bool = False,
) -> None:
    """Write each diagnostic as a terminal line, in order.

    Errors and warnings go to ``stream`` (stderr, as a rule); info to ``info`` when given,
    else nowhere. ``errors_only`` leaves out warnings and info (``validate --quiet``).
    """
    for diagnostic in diagnostics:
        if errors_only and diagnostic.severity is not Severity.ERROR:
            continue
        target = info if diagnostic.severity is Severity.INFO else stream
        if target is not None:
            target.write(diagnostic_terminal(diagnostic) + "\n")
