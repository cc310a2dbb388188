"""Errors raised by edgegen.

Exception tree (each class carries the CLI exit code it maps to)::

    EdgegenError                 base; exit code 1
    ├── UsageError               a bad command line or missing setting (exit 2)
    └── (added by the compiler and the Cloudflare sync modules)

Policy problems are ``policy.PolicyLoadError``; the CLI maps both in one place.
"""

from __future__ import annotations


class EdgegenError(Exception):
    """Base class of edgegen's errors; the message is a full sentence that says the fix."""

    exit_code = 1


class UsageError(EdgegenError):
    """The command line or the environment is missing something the command needs."""

    exit_code = 2
