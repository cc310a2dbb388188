"""Errors raised by edgegen.

Exception tree (each class carries the CLI exit code it maps to)::

    EdgegenError                 base; exit code 1
    ├── UsageError               a bad command line or missing setting (exit 2)
    ├── CompileError             ``build`` cannot turn the policy into edge artifacts;
    │                            carries one BuildProblem per limit at fault
    ├── CloudflareAPIError       the Cloudflare API refused or failed a request: HTTP status,
    │                            Cloudflare's codes, messages, JSON pointers, Retry-After
    ├── ZoneError                plan or apply cannot go ahead safely (a route owned by
    │   │                        another Worker, a bad state or plan file, a rejected rule)
    │   ├── StalePlanError       the zone changed since the plan was made
    │   └── TamperedPlanError    a saved plan's writes are not what it shows
    └── ApplyError               apply stopped part-way; says what was and was not written

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


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    """One entry of a Cloudflare envelope's ``errors``: code, message, JSON pointer."""

    code: int | None
    message: str
    pointer: str | None = None


class CloudflareAPIError(EdgegenError):
    """A Cloudflare API request was refused or got no usable answer.

    ``status`` is the HTTP status (None when no answer came); ``errors`` Cloudflare's error
    entries (``codes``, ``messages`` and ``pointers`` list their parts); ``retry_after`` the
    seconds Cloudflare asked to wait; ``ambiguous`` is true when a write was sent but its
    outcome is unknown; ``enveloped`` is false when the answer was not a Cloudflare envelope.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str,
        path: str,
        status: int | None,
        errors: Sequence[ErrorDetail] = (),
        retry_after: float | None = None,
        ambiguous: bool = False,
        enveloped: bool = True,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.status = status
        self.errors = tuple(errors)
        self.retry_after = retry_after
        self.ambiguous = ambiguous
        self.enveloped = enveloped

    @property
    def codes(self) -> tuple[int, ...]:
        """Cloudflare's error codes, in order."""
        return tuple(e.code for e in self.errors if e.code is not None)

    @property
    def messages(self) -> tuple[str, ...]:
        """Cloudflare's error messages, in order."""
        return tuple(e.message for e in self.errors)

    @property
    def pointers(self) -> tuple[str, ...]:
        """The JSON pointers (``/rules/0/ratelimit/period``) of the errors that have one."""
        return tuple(e.pointer for e in self.errors if e.pointer)


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rule Cloudflare rejected, traced back to the policy.

    ``index`` is the rule's place in the ruleset sent; ``ref`` its ref; ``limit`` the policy
    limit it was generated from (None for a rule edgegen does not manage); ``field`` the
    part of the rule at fault (``ratelimit.period``); ``code`` and ``message`` Cloudflare's.
    ``where`` is ``file:line:column`` of the policy field that part was compiled from, when
    the policy file is at hand (not for a saved plan).
    """

    index: int | None
    ref: str | None
    limit: str | None
    field: str
    code: int | None
    message: str
    where: str | None = None

    def describe(self) -> str:
        """One sentence naming the limit (or rule) at fault and the fix."""
        said = f"code {self.code}: {self.message}" if self.code is not None else self.message
        at = f" (field {self.field})" if self.field else ""
        if self.limit is not None:
            where = f"{self.where}: " if self.where else ""
            return (
                f"{where}limit {self.limit!r}: Cloudflare rejected its rule{at}: {said}; change "
                "the limit in the policy (edgegen build --explain shows how it was compiled)"
            )
        if self.index is not None:
            ref = f" (ref {self.ref})" if self.ref else ""
            return (
                f"rule {self.index}{ref}, which edgegen does not manage, was rejected{at}: "
                f"{said}; fix or remove that rule in the Cloudflare dashboard"
            )
        return f"Cloudflare rejected the ruleset: {said}; check the plan's rule quota"


class ZoneError(EdgegenError):
    """Plan or apply cannot go ahead without risking the zone; the message says why."""

    def __init__(self, message: str, rejections: Sequence[Rejection] = ()) -> None:
        super().__init__(message)
        self.rejections = tuple(rejections)


# The name of 0.1, kept so that code catching it keeps working; ZoneError is the name.
SyncError = ZoneError


class StalePlanError(ZoneError):
    """The zone changed since the plan was made; ``changed`` names what differs."""

    def __init__(self, message: str, changed: Sequence[str]) -> None:
        super().__init__(message)
        self.changed = tuple(changed)


class TamperedPlanError(ZoneError):
    """A saved plan would write something other than what it shows (its writes do not match
    their recorded hashes, or the changes its writes and the zone give are not the changes
    it lists); ``problems`` names each difference."""

    def __init__(self, message: str, problems: Sequence[str]) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class ApplyError(EdgegenError):
    """Apply stopped part-way.

    ``written`` and ``not_written`` describe the writes that were and were not made;
    ``failed`` the one that failed (``ambiguous``: it may or may not have been made);
    ``cause`` the underlying error; ``rejections`` the rules Cloudflare rejected, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        written: Sequence[str],
        failed: str,
        not_written: Sequence[str],
        cause: EdgegenError,
        ambiguous: bool = False,
        rejections: Sequence[Rejection] = (),
    ) -> None:
        super().__init__(message)
        self.written = tuple(written)
        self.failed = failed
        self.not_written = tuple(not_written)
        self.cause = cause
        self.ambiguous = ambiguous
        self.rejections = tuple(rejections)
