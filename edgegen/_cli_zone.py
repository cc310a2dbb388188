"""``edgegen plan``, ``pull``, ``apply`` and ``diff``: the policy and a live zone.

A thin shell over the library (``edgegen.pull``, ``plan``, ``apply`` and the plan and state
files): it reads the command line and the environment, prints to the terminal and maps
outcomes to exit codes. Exit codes follow Terraform: 0 success (plan: no changes), 1 error,
2 with ``--detailed-exitcode`` when the plan has changes (and for usage errors, as
everywhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import edgegen_policy as policy
from edgegen_policy import Cloudflare, Policy

from . import _diff
from ._cli_replay import describe_source, open_args_traffic, replay_options, traffic_args
from ._pipeline import load_and_build
from ._text import markdown_text, terminal_text
from .cloudflare._state import RemoteState, Scope
from .compiler._artifacts import Artifacts
from .errors import EdgegenError, UsageError, ZoneError
from .replay import _report
from .replay._engine import replay_pair
from .zone import _apply, _file_formats, _format
from .zone._operations import ApplyEvent, apply, plan, pull
from .zone._plan import SavedPlan, ZonePlan

if TYPE_CHECKING:
    # The client (httpx) only as a type: importing this module needs no edge extra.
    from .cloudflare._client import Client, Write


def _token_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the API token from FILE instead of CLOUDFLARE_API_TOKEN",
    )


def register(sub: Any) -> None:
    """Add plan, pull, apply and diff to the CLI."""
    plan = sub.add_parser(
        "plan",
        help="show what apply would change in the zone (reads only)",
        description="Read the zone's rate limiting rules, Worker and routes (GET only) and "
        "print what apply would change, rule by rule and field by field.",
    )
    plan.add_argument("policy", metavar="POLICY", help="the policy file (YAML)")
    plan.add_argument(
        "--state",
        metavar="STATE",
        help="plan against a state file from edgegen pull instead of the live zone "
        "(no token needed)",
    )
    plan.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    plan.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 with no changes, 2 with changes, 1 on error",
    )
    plan.add_argument(
        "--out", metavar="PLANFILE", help="save the plan, to apply it later with edgegen apply"
    )
    _token_option(plan)
    plan.set_defaults(func=run_plan)

    pull = sub.add_parser(
        "pull",
        help="save the zone's live state for offline plans",
        description="Read the zone's rules, the Worker and its routes (GET only) and save "
        "them to a state file that edgegen plan --state reads.",
    )
    pull.add_argument(
        "policy",
        metavar="POLICY",
        nargs="?",
        help="the policy file: where the zone id, account id and Worker name come from",
    )
    pull.add_argument("--out", metavar="STATE", required=True, help="the state file to write")
    pull.add_argument("--zone-id", help="the zone (default: the policy's, or CLOUDFLARE_ZONE_ID)")
    pull.add_argument(
        "--account-id",
        help="the Worker's account (default: the policy's, or CLOUDFLARE_ACCOUNT_ID)",
    )
    pull.add_argument("--worker", metavar="NAME", help="the Worker (default: the policy's)")
    _token_option(pull)
    pull.set_defaults(func=run_pull)

    apply = sub.add_parser(
        "apply",
        help="make the zone match the policy (or a saved plan)",
        description="Plan, show the plan and ask, then write the rules, the Worker and its "
        "routes. Given a plan file, apply exactly that plan, and refuse if the zone changed "
        "since it was made.",
    )
    apply.add_argument("target", metavar="POLICY|PLANFILE", help="a policy, or a saved plan")
    apply.add_argument(
        "--auto-approve", action="store_true", help="apply without asking for confirmation"
    )
    apply.add_argument(
        "--dry-run",
        action="store_true",
        help="do everything up to the first write, print each request, write nothing",
    )
    apply.add_argument(
        "--policy",
        metavar="POLICY",
        help="with a saved plan: the reviewed policy it was made from; apply refuses unless "
        "the plan writes exactly what this policy builds for the zone",
    )
    apply.add_argument(
        "--validate-remote",
        action="store_true",
        help="send the rules to Cloudflare with ?dry_run=true before writing anything",
    )
    _token_option(apply)
    apply.set_defaults(func=run_apply)

    diff = sub.add_parser(
        "diff",
        help="explain what changes between two versions of a policy",
        description="A semantic diff of two policies (limits added or removed, rates "
        "tightened or loosened, tiers, targets) and of the artifacts they build. OLD and NEW "
        "are paths or git:REF:PATH.",
    )
    diff.add_argument("old", metavar="OLD", help="a policy file or git:REF:PATH")
    diff.add_argument("new", metavar="NEW", help="a policy file or git:REF:PATH")
    diff.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    diff.add_argument(
        "--detailed-exitcode",
        action="store_true",
        help="exit 0 with no changes, 2 with changes, 1 on error",
    )
    traffic_args(diff, required=False)
    diff.set_defaults(func=run_diff)


# --- shared steps --------------------------------------------------------------------


def cloudflare_of(loaded: Policy, path: str) -> Cloudflare:
    """The policy's ``cloudflare:`` section; UsageError says what to add when it has none."""
    if loaded.cloudflare is None:
        raise UsageError(
            f"{path} has no cloudflare section, so there is no zone to plan for; add "
            "cloudflare: { plan: ..., zone_id: ... } (the zone's plan and id)"
        )
    return loaded.cloudflare


def scope_of(loaded: Policy, artifacts: Artifacts, path: str) -> Scope:
    """The zone, account and Worker a policy manages; UsageError says what to set."""
    cloudflare = cloudflare_of(loaded, path)
    if cloudflare.zone_id is None:
        raise UsageError(
            f"{path} sets no cloudflare.zone_id; set it in the policy, or set "
            "CLOUDFLARE_ZONE_ID when the policy reads it (zone_id: ${CLOUDFLARE_ZONE_ID})"
        )
    worker = cloudflare.worker
    if artifacts.worker is not None and cloudflare.account_id is None:
        raise UsageError(
            f"limits of {path} run in the Worker {artifacts.worker.name}, which needs the "
            "account: set cloudflare.account_id in the policy, or set CLOUDFLARE_ACCOUNT_ID "
            "when the policy reads it (account_id: ${CLOUDFLARE_ACCOUNT_ID})"
        )
    return Scope(cloudflare.zone_id, cloudflare.account_id, worker.name if worker else None)


def make_client(args: argparse.Namespace) -> Client:
    """The API client, with the token and base URL from the environment."""
    # Imported here: the client needs httpx (the edge extra); the other commands do not.
    from .cloudflare._client import Client

    return Client.from_env(os.environ, token_file=getattr(args, "token_file", None))


def _state_for_policy(loaded: Policy, state: RemoteState, path: str, state_path: str) -> None:
    """A state file must be of the zone and Worker the policy manages."""
    cloudflare = loaded.cloudflare
    if cloudflare is not None and cloudflare.zone_id and cloudflare.zone_id != state.scope.zone_id:
        raise ZoneError(
            f"{state_path} holds zone {state.scope.zone_id}, but {path} is for zone "
            f"{cloudflare.zone_id}; pull the state of that zone"
        )
    wanted = cloudflare.worker.name if cloudflare and cloudflare.worker else None
    if wanted != state.scope.worker_name:
        pulled = (
            f"the Worker {state.scope.worker_name!r}" if state.scope.worker_name else "no Worker"
        )
        names = f"names the Worker {wanted!r}" if wanted else "names no Worker (cloudflare.worker)"
        raise ZoneError(
            f"{state_path} was pulled for {pulled}, but {path} {names}; pull again with this policy"
        )


def _save(path: str, what: str, write: Callable[[], None]) -> None:
    """Run ``write``; a path that cannot be written is a usage error naming it."""
    try:
        write()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(
            f"cannot write the {what} file {path}: {reason}; choose a path you can write to "
            "with --out"
        ) from None


def _warn(lines: tuple[str, ...] | list[str]) -> None:
    """Warnings and notes about the zone, on stderr (the plan itself goes to stdout)."""
    for line in lines:
        sys.stderr.write(terminal_text(f"edgegen: {line}") + "\n")


def _print_plan(made: ZonePlan, output: str) -> None:
    if output == "json":
        shown = _file_formats.plan_to_json(made, include_writes=False)
        sys.stdout.write(json.dumps(shown, indent=2) + "\n")
    elif output == "markdown":
        sys.stdout.write(_format.to_markdown(made))
    else:
        sys.stdout.write(_format.to_text(made))


# --- plan ----------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    """Plan against the live zone (or a state file) and print or save the plan."""
    loaded, artifacts = load_and_build(args.policy)
    cloudflare_of(loaded, args.policy)
    if args.state is not None:
        state = _file_formats.load_state(args.state)
        _state_for_policy(loaded, state, args.policy, args.state)
        if artifacts.worker is not None and state.scope.account_id is None:
            raise ZoneError(
                f"{args.state} holds no Worker account, but limits of {args.policy} run in the "
                "Worker; pull the state again with the account id set"
            )
    else:
        scope = scope_of(loaded, artifacts, args.policy)
        with make_client(args) as client:
            state = pull(client, scope)
    made = plan(artifacts, state)
    _print_plan(made, args.format)
    _warn(made.warnings)
    if args.out is not None:
        _save(args.out, "plan", lambda: _file_formats.save_plan(made, args.out))
        sys.stderr.write(f"Saved the plan to {args.out}; apply it with edgegen apply {args.out}\n")
    if args.detailed_exitcode and made.has_changes:
        return 2
    return 0


# --- pull ----------------------------------------------------------------------------


def run_pull(args: argparse.Namespace) -> int:
    """Read the zone (GET only) and save its state."""
    zone = args.zone_id
    account = args.account_id
    worker = args.worker
    if args.policy is not None:
        loaded = policy.load(args.policy)
        cloudflare = loaded.cloudflare
        if cloudflare is not None:
            zone = zone or cloudflare.zone_id
            account = account or cloudflare.account_id
            worker = worker or (cloudflare.worker.name if cloudflare.worker else None)
    zone = zone or os.environ.get("CLOUDFLARE_ZONE_ID") or None
    account = account or os.environ.get("CLOUDFLARE_ACCOUNT_ID") or None
    if not zone:
        raise UsageError(
            "pull needs a zone: give a policy that sets cloudflare.zone_id, pass --zone-id, or "
            "set CLOUDFLARE_ZONE_ID"
        )
    if worker and not account:
        raise UsageError(
            f"reading the Worker {worker} needs its account: set cloudflare.account_id in the "
            "policy, pass --account-id, or set CLOUDFLARE_ACCOUNT_ID"
        )
    with make_client(args) as client:
        state = pull(client, Scope(zone, account, worker))
    _warn(state.notices)
    _save(args.out, "state", lambda: _file_formats.save_state(state, args.out))
    ruleset = state.ruleset
    rules = (
        f"ruleset version {ruleset.version} with {len(ruleset.rules)} rule(s)"
        if ruleset
        else "no rate limiting rules"
    )
    worker_text = ""
    if worker:
        worker_text = f", Worker {worker} {'deployed' if state.worker else 'not deployed'}"
    sys.stdout.write(
        terminal_text(
            f"Saved the state of zone {zone} ({rules}{worker_text}, {len(state.routes)} "
            f"route(s)) to {args.out}\n"
        )
    )
    return 0


# --- apply ---------------------------------------------------------------------------


def _confirm(shown: ZonePlan) -> bool:
    """Ask on the terminal about the plan just shown; only y or yes applies."""
    if not sys.stdin.isatty():
        raise UsageError(
            "apply asks before writing, but there is no terminal to ask on; review the plan "
            "and pass --auto-approve, or save it with edgegen plan POLICY --out PLANFILE and "
            "run edgegen apply PLANFILE"
        )
    sys.stdout.write("\nApply these changes to the zone? Only 'yes' applies: ")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in {"y", "yes"}


def _echo(line: str) -> None:
    sys.stdout.write(terminal_text(line) + "\n")
    sys.stdout.flush()


def _show(event: ApplyEvent, dry_run: bool) -> None:
    """What apply reports, on the terminal as it happens."""
    if event.kind == "plan":
        sys.stdout.write(_format.to_text(event.plan))
        sys.stdout.flush()
        _warn(event.plan.warnings)
    elif event.kind == "validated":
        # A dry run goes on to list the requests: set the verdict apart from the plan.
        sys.stdout.write("\n" if dry_run else "")
        sys.stdout.write("Cloudflare's dry run accepted the rules.\n")
    else:
        _echo(f"done: {event.write}")


def _target(
    text: str, path: str, client: Client, bound: str | None
) -> tuple[ZonePlan | SavedPlan, Policy | None]:
    """What ``apply`` was given: a saved plan (with the policy of ``--policy``, which it must
    match), or a policy to plan from (and the policy, so that rejected rules are reported at
    its lines)."""
    if _file_formats.is_plan_file(text):
        return _file_formats.read_plan(text, path), load_and_build(bound)[0] if bound else None
    if bound is not None:
        raise UsageError(
            f"--policy goes with a saved plan, and {path} is a policy; run edgegen apply "
            f"{path}, or edgegen apply PLANFILE --policy {path}"
        )
    source, artifacts = load_and_build(path)
    scope = scope_of(source, artifacts, path)
    return plan(artifacts, pull(client, scope)), source


def run_apply(args: argparse.Namespace) -> int:
    """Apply a policy (plan, show, ask) or a saved plan (verify, then write)."""
    target = Path(args.target)
    try:
        data = _file_formats.read_bounded(target)
    except (OSError, ValueError):
        # Not readable: the policy loader says why, as for any policy.
        data = b""
    if len(data) > _file_formats.MAX_FILE_BYTES:
        raise _file_formats.too_large(args.target, "plan or policy")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    with make_client(args) as client:
        # Every failure up to the first write says that nothing was written.
        with _apply.nothing_written():
            made, source = _target(text, args.target, client, args.policy)
        # A saved plan was reviewed when it was made: it is applied without asking.
        ask = not isinstance(made, SavedPlan) and not args.auto_approve
        result = apply(
            client,
            made,
            confirm=_confirm if ask else None,
            output=lambda event: _show(event, args.dry_run),
            policy=source,
            dry_run=args.dry_run,
            validate_remote=args.validate_remote,
        )
    if result.outcome == "dry_run":
        _print_writes(client, result.requests)
    elif result.outcome == "cancelled":
        sys.stdout.write("Apply cancelled; nothing was written.\n")
        return 1
    elif result.outcome == "applied":
        sys.stdout.write(f"Apply complete: {len(result.written)} write(s) made.\n")
    return 0


def _print_writes(client: Client, requests: tuple[Write, ...]) -> None:
    sys.stdout.write(f"\nDry run: apply would send {len(requests)} request(s), in this order:\n")
    for number, write in enumerate(requests, 1):
        text = f"\n{number}. {write.what}\n{write.describe(client.shown_base_url)}\n"
        sys.stdout.write(terminal_text(text))
    sys.stdout.write("\nDry run: nothing was written.\n")


# --- diff ----------------------------------------------------------------------------


def run_diff(args: argparse.Namespace) -> int:
    """Print the semantic and artifact diff of two policy versions."""
    old = _diff.load_version(args.old)
    new = _diff.load_version(args.new)
    stopped = [version for version in (old, new) if version.errors]
    if stopped:
        # The validity gate, on both sides: a diff of a policy that cannot run says nothing.
        for version in stopped:
            policy.write_diagnostics(version.errors, sys.stderr)
        names = " and ".join(f"{v.label} has {v.build_error}" for v in stopped)
        raise EdgegenError(f"{names}; fix them (edgegen validate lists them) and diff again")
    result = _diff.diff(old, new)
    impact = _traffic_impact(args, old.policy, new.policy) if args.traffic else None
    if args.format == "markdown":
        sys.stdout.write(_diff.to_markdown(result))
        if impact is not None:
            sys.stdout.write("\n" + impact.markdown)
    elif args.format == "json":
        data = _diff.to_json(result)
        if impact is not None:
            data["impact"] = impact.json
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        sys.stdout.write(_diff.to_text(result))
        if impact is not None:
            sys.stdout.write("\n" + terminal_text(impact.text))
    if args.detailed_exitcode and _diff.has_changes(result):
        return 2
    return 0


@dataclass(frozen=True, slots=True)
class _Impact:
    text: str
    markdown: str
    json: dict[str, Any]


def _traffic_impact(args: argparse.Namespace, old: Policy, new: Policy) -> _Impact:
    """Replay ``--traffic`` through both policies in one pass, and say what changes."""
    with open_args_traffic(args, new) as traffic:
        before, after = replay_pair(old, new, traffic, replay_options(args))
    impacts = _report.impact(before, after)
    source = describe_source(traffic.stats)
    return _Impact(
        text=_report.impact_text(impacts, before, after, source),
        markdown=_report.impact_markdown(impacts, before, after, markdown_text(source)),
        json=_report.impact_json(impacts, before, after),
    )
