"""``edgegen build``: compile the policy's edge limits and write the artifacts."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import edgegen_policy as policy
from edgegen_policy import Diagnostic, Policy

from ._pipeline import prepare
from .compiler._artifacts import Artifacts, Target
from .compiler._output import write
from .errors import CompileError, UsageError


def register(sub: Any) -> None:
    """Add ``build`` to the CLI."""
    parser = sub.add_parser(
        "build",
        help="compile edge limits to Cloudflare rules, a Worker and Terraform",
        description="Compile the policy's edge limits for the zone's plan: rules where the "
        "plan can express them, the Worker otherwise. Writes cloudflare/http_ratelimit.json, "
        "worker/ (when a limit needs it) and terraform/ratelimit.tf under --out.",
    )
    parser.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write into")
    parser.add_argument(
        "--explain", action="store_true", help="print where each limit went and why"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(func=run_build)


def _summary(loaded: Policy, artifacts: Artifacts) -> str:
    plan = (
        f"the {loaded.cloudflare.plan.value} plan"
        if loaded.cloudflare
        else "no zone (the policy has no cloudflare section)"
    )
    rules = len(artifacts.ruleset["rules"])
    in_worker = sum(1 for p in artifacts.placements if p.target is Target.WORKER)
    worker = (
        f", {in_worker} limit{'s' if in_worker != 1 else ''} in the Worker {artifacts.worker.name}"
        if artifacts.worker
        else ", no Worker"
    )
    return f"{rules} rule{'s' if rules != 1 else ''} for {plan}{worker}"


def _explain_lines(artifacts: Artifacts) -> list[str]:
    if not artifacts.placements:
        return ["  no edge limits"]
    lines: list[str] = []
    for placement in artifacts.placements:
        lines.append(f"  {placement.limit} -> {placement.target.value}")
        lines.extend(f"      {reason}" for reason in placement.reasons)
    return lines


def _json_report(
    args: argparse.Namespace,
    found: list[Diagnostic],
    artifacts: Artifacts | None,
    error: CompileError | None,
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "file": args.policy,
        "out": args.out,
        "built": artifacts is not None,
        "diagnostics": [policy.diagnostic_json(d) for d in found],
    }
    if error is not None:
        report["problems"] = [
            {"code": p.code, "limit": p.limit, "message": p.message, "lacks": p.lacks, "fix": p.fix}
            for p in error.problems
        ]
    if artifacts is not None:
        report["placements"] = [
            {"limit": p.limit, "target": p.target.value, "reasons": list(p.reasons)}
            for p in artifacts.placements
        ]
        report["files"] = sorted(artifacts.files())
    return report


def run_build(args: argparse.Namespace) -> int:
    """Check, compile and write; exit 1 when the policy has errors or cannot be compiled."""
    as_json = args.format == "json"
    prepared = prepare(args.policy)
    found = list(prepared.checked.diagnostics)
    if not prepared.checked.ok:
        if as_json:
            _print_json(_json_report(args, found, None, None))
            return 1
        policy.write_diagnostics(found, sys.stderr)
        sys.stderr.write(f"{args.policy}: not built: {len(prepared.checked.errors)} error(s)\n")
        return 1
    if prepared.error is not None:
        if as_json:
            _print_json(_json_report(args, found, None, prepared.error))
            return prepared.error.exit_code
        raise prepared.error
    artifacts = prepared.artifacts
    assert artifacts is not None
    try:
        write(artifacts, args.out)
    except OSError as exc:
        raise UsageError(
            f"cannot write the artifacts under {args.out}: {exc.strerror or exc}; choose a "
            "directory you can write to with --out"
        ) from exc
    if as_json:
        _print_json(_json_report(args, found, artifacts, None))
        return 0
    # Warnings only: the gate passed, so there are no errors, and info is not printed.
    policy.write_diagnostics(found, sys.stderr)
    out = [f"{args.policy}: built {_summary(prepared.policy, artifacts)}"]
    if args.explain:
        out.extend(_explain_lines(artifacts))
    out.append(f"wrote {', '.join(str(Path(args.out) / f) for f in artifacts.files())}")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")
