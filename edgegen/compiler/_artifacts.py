"""What ``edgegen build`` produces: plain values shared by the compiler and zone plan and apply.

The compiler (``edgegen.build``) fills these in from a policy; ``edgegen plan`` and
``apply`` compare them with the live zone; ``write`` turns them into files. Keeping them as
plain frozen values means planning and diffing stay pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Target(StrEnum):
    """Where an edge limit ended up."""

    RULE = "rule"
    WORKER = "worker"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one edge limit went, and why (for ``build --explain`` and the PR diff)."""

    limit: str
    target: Target
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerArtifact:
    """The Worker script and how it is deployed.

    ``bindings`` are in the Cloudflare API's upload-metadata form, e.g.
    ``{"type": "ratelimit", "name": "RL_LOGIN", "namespace_id": "1001",
    "simple": {"limit": 5, "period": 60}}``.
    """

    name: str
    main_module: str
    module_source: str
    compatibility_date: str
    bindings: tuple[dict[str, Any], ...]
    routes: tuple[str, ...]
    wrangler_toml: str
    # The Worker secrets it reads (set by the user, never generated): the hash key of keyed
    # limits, HS256 keys. Terraform takes them as sensitive variables.
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Artifacts:
    """Everything built from one policy.

    ``ruleset`` is exactly the body of
    ``PUT /zones/{zone_id}/rulesets/phases/http_ratelimit/entrypoint``:
    ``{"description": ..., "rules": [...]}``; every rule's ``ref`` starts with ``edgegen:``.
    """

    ruleset: dict[str, Any]
    worker: WorkerArtifact | None
    # None when the policy has nothing at the edge: no empty module is written.
    terraform: str | None
    placements: tuple[Placement, ...] = field(default=())

    def files(self) -> dict[str, str]:
        """Relative path -> content of every file ``build --out DIR`` writes."""
        import json

        out = {"cloudflare/http_ratelimit.json": json.dumps(self.ruleset, indent=2) + "\n"}
        if self.worker is not None:
            out["worker/wrangler.toml"] = self.worker.wrangler_toml
            out[f"worker/{self.worker.main_module}"] = self.worker.module_source
        if self.terraform is not None:
            out["terraform/ratelimit.tf"] = self.terraform
        return out
