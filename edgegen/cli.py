"""The ``edgegen`` command line: a thin shell over the library.

Each command module registers its subcommands; this module parses arguments, runs the
command, and maps every library error to a message and an exit code in one place, so that
a user mistake never ends in a traceback.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import TextIO

from edgegen_policy import PolicyLoadError, write_diagnostics

from . import _cli_build, _cli_policy, _cli_replay, _cli_report, _cli_zone
from ._text import terminal_text
from .errors import EdgegenError

Handler = Callable[[argparse.Namespace], int]

# The distribution that installs the edgegen command (pyproject.toml's project name).
DISTRIBUTION = "edgegen"
# The extra that installs each optional package a command may need (pyproject.toml).
EXTRA_OF = {"httpx": "edge", "httpcore": "edge", "jinja2": "edge", "matplotlib": "chart"}
# Exit code of a command that needs an extra that is not installed (a usage error).
MISSING_EXTRA = 2
# With --detailed-exitcode, 2 means "there are changes", so every error exits 1 instead
# (Terraform's convention, which CI scripts already read).
DETAILED_ERROR = 1

# Modules that add subcommands; each has ``register(subparsers) -> None`` and sets
# ``func`` on its parsers. Order here is the order of ``edgegen --help``.
COMMAND_MODULES = (_cli_policy, _cli_build, _cli_zone, _cli_report, _cli_replay)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one clear line (no traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"edgegen: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for docs and tests)."""
    parser = _Parser(
        prog="edgegen",
        description="Compile a rate-limit policy to Cloudflare rules and a Worker; "
        "validate, plan, apply and diff it.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def version() -> str:
    """The installed package's version: its metadata is the one source (pyproject.toml)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        # Run from a source tree that was never installed: say so rather than guess.
        return "(not installed)"


def print_load_error(error: PolicyLoadError, stream: TextIO) -> None:
    """Print every diagnostic of a failed load, one per line, and a count."""
    write_diagnostics(error.diagnostics, stream)
    count = len(error.diagnostics)
    stream.write(f"{count} error{'s' if count != 1 else ''}: the policy was not loaded\n")


def _printable_streams() -> None:
    """Let stdout show any text, as stderr already does.

    Paths that are not UTF-8 arrive as lone surrogates (``\udcff`` for the byte 0xff); a
    terminal whose stdout is strict UTF-8 would fail to print them in a message. With
    ``backslashreplace`` they are shown escaped instead.
    """
    stream = sys.stdout
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 (one exit code per kind of error, mapped here only)
    """Run edgegen; returns the exit code (0 ok, 1 error, 2 usage or 'changes' for plan).

    With ``--detailed-exitcode`` (plan, diff) 2 means "changes" only: errors, usage errors
    included, exit 1.
    """
    _printable_streams()
    arguments = list(sys.argv[1:] if argv is None else argv)
    detailed = "--detailed-exitcode" in arguments
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:
        if detailed and exc.code == 2:
            return DETAILED_ERROR
        raise
    handler: Handler = args.func
    try:
        return handler(args)
    except PolicyLoadError as exc:
        print_load_error(exc, sys.stderr)
        return DETAILED_ERROR if detailed else exc.exit_code
    except EdgegenError as exc:
        # Messages quote what Cloudflare and the zone said: never as terminal controls.
        sys.stderr.write(f"edgegen: error: {terminal_text(str(exc))}\n")
        return DETAILED_ERROR if detailed else exc.exit_code
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        sys.stderr.write(
            f"edgegen: error: edgegen {args.command} needs {exc.name}, which the {extra!r} "
            f"extra installs: pip install 'edgegen[{extra}]'\n"
        )
        return DETAILED_ERROR if detailed else MISSING_EXTRA
    except KeyboardInterrupt:
        sys.stderr.write("edgegen: interrupted\n")
        return 130
    except BrokenPipeError:
        # `edgegen schema | head` closes the pipe early; that is not an error.
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
