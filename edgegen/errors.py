"""Errors raised by edgegen.

Exception tree (each class carries the CLI exit code it maps to)::

    EdgegenError                 base; exit code 1
    ├── UsageError               a bad command line or missing setting (exit 2)
    └── CompileError             ``build`` cannot turn the policy into edge artifacts;
                                 carries one BuildProblem per limit at fault

Policy problems are ``policy.PolicyLoadError``; the CLI maps both in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class EdgegenError(Exception):
    """Base class of edgegen's errors; the message is a full sentence that says the fix."""

    exit_code = 1


class UsageError(EdgegenError):
    """The command line or the environment is missing something the command needs."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class BuildProblem:
    """One reason a build failed, for programs.

    ``message`` is the full sentence; ``limit`` the limit at fault (None for the policy as a
    whole); ``lacks`` what the plan or the Worker is missing; ``fix`` the nearest thing that
    would work; ``code`` the matching lint code (e.g. ``L201``), or ``E...`` for checks only
    the compiler makes.
    """

    message: str
    limit: str | None = None
    lacks: str = ""
    fix: str = ""
    code: str = ""


class CompileError(EdgegenError):
    """The policy's edge limits cannot all be compiled; ``problems`` lists every one."""

    def __init__(self, problems: Sequence[BuildProblem]) -> None:
        if not problems:
            raise ValueError("a CompileError needs at least one problem")
        self.problems = tuple(problems)
        super().__init__("\n".join(p.message for p in self.problems))

    @property
    def limit(self) -> str | None:
        """The limit of the first problem."""
        return self.problems[0].limit
