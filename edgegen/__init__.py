"""edgegen: compile a rate-limit policy to Cloudflare rules and a Worker, plan and apply it.

Public surface::

    edgegen.build(policy) -> Artifacts        compile (pure; raises CompileError)
    edgegen.write(artifacts, out_dir)         write Artifacts.files() under a directory
    Artifacts, WorkerArtifact, Placement, Target   what build returns
    EdgegenError, UsageError, CompileError, BuildProblem   the errors
    CloudflareAPIError, SyncError, StalePlanError, ApplyError   errors of plan and apply

``Artifacts.ruleset`` is exactly the body of
``PUT /zones/{zone_id}/rulesets/phases/http_ratelimit/entrypoint``; ``Artifacts.worker`` is
None when no limit runs in the Worker.
"""

from __future__ import annotations

from ._artifacts import Artifacts, Placement, Target, WorkerArtifact
from ._compile import build
from ._output import write
from .errors import (
    ApplyError,
    BuildProblem,
    CloudflareAPIError,
    CompileError,
    EdgegenError,
    StalePlanError,
    SyncError,
    UsageError,
)

__all__ = [
    "ApplyError",
    "Artifacts",
    "BuildProblem",
    "CloudflareAPIError",
    "CompileError",
    "EdgegenError",
    "Placement",
    "StalePlanError",
    "SyncError",
    "Target",
    "UsageError",
    "WorkerArtifact",
    "build",
    "write",
]
