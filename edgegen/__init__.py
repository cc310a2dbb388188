"""edgegen: compile a rate-limit policy to Cloudflare rules and a Worker, plan and apply it.

Public surface::

    edgegen.build(policy) -> Artifacts        compile (pure; raises CompileError)
    edgegen.write(artifacts, out_dir)         write Artifacts.files() under a directory
    Artifacts, WorkerArtifact, Placement, Target   what build returns

    edgegen.pull(client, scope) -> RemoteState     read the zone (GET only)
    edgegen.plan(artifacts, state) -> ZonePlan     what apply would change (pure)
    edgegen.apply(client, plan, *, confirm=, output=, policy=, dry_run=, validate_remote=)
        -> ApplyResult                             verify, ask, re-verify, validate, write;
                                                   ApplyEvent as it goes
    edgegen.report(client, scope, *, since=) -> EdgeReport   what the edgegen rules and the
                                                   Worker did (GraphQL Analytics API)
    save_plan(plan, path), load_plan(path) -> SavedPlan    plan files (bound to their writes)
    save_state(state, path), load_state(path) -> RemoteState   state files (offline plans)
    Client, Token, Scope, RemoteState, ZonePlan, SavedPlan   the Cloudflare client and values

    EdgegenError, UsageError, CompileError, BuildProblem   the errors
    CloudflareAPIError, ZoneError, StalePlanError, TamperedPlanError, ApplyError
                                              errors of pull, plan and apply

``Artifacts.ruleset`` is exactly the body of
``PUT /zones/{zone_id}/rulesets/phases/http_ratelimit/entrypoint``; ``Artifacts.worker`` is
None when no limit runs in the Worker. A ZonePlan is a change plan for one zone, not the
zone's Cloudflare plan tier (``policy.CloudflarePlan``).

A Terraform-style run::

    with edgegen.Client.from_env(os.environ) as client:
        state = edgegen.pull(client, edgegen.Scope(zone_id, account_id, worker_name))
        changes = edgegen.plan(edgegen.build(policy), state)
        edgegen.save_plan(changes, "plan.json")
        ...  # review
        edgegen.apply(client, edgegen.load_plan("plan.json"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cloudflare._analytics import EdgeReport, report
from .cloudflare._state import RemoteState, Scope
from .cloudflare._token import Token
from .compiler._artifacts import Artifacts, Placement, Target, WorkerArtifact
from .compiler._compile import build
from .compiler._output import write
from .errors import (
    ApplyError,
    BuildProblem,
    CloudflareAPIError,
    CompileError,
    EdgegenError,
    StalePlanError,
    TamperedPlanError,
    UsageError,
    ZoneError,
)
from .zone._file_formats import load_plan, load_state, save_plan, save_state
from .zone._operations import ApplyEvent, ApplyResult, apply, plan, pull
from .zone._plan import SavedPlan, ZonePlan

__all__ = [
    "ApplyError",
    "ApplyEvent",
    "ApplyResult",
    "Artifacts",
    "BuildProblem",
    "Client",
    "CloudflareAPIError",
    "CompileError",
    "EdgeReport",
    "EdgegenError",
    "Placement",
    "RemoteState",
    "SavedPlan",
    "Scope",
    "StalePlanError",
    "TamperedPlanError",
    "Target",
    "Token",
    "UsageError",
    "WorkerArtifact",
    "ZoneError",
    "ZonePlan",
    "apply",
    "build",
    "load_plan",
    "load_state",
    "plan",
    "pull",
    "report",
    "save_plan",
    "save_state",
    "write",
]


if TYPE_CHECKING:
    from .cloudflare._client import Client


def __getattr__(name: str) -> Any:
    """``edgegen.Client``, imported on first use: it needs httpx (the ``edge`` extra), which
    the policy commands (``validate``, ``show``, ``schema``, ``diff``) and an app-only
    install do without."""
    if name == "Client":
        from .cloudflare._client import Client

        return Client
    raise AttributeError(f"module 'edgegen' has no attribute {name!r}")
