"""edgegen: compile a rate-limit policy to Cloudflare rules and a Worker, plan and apply it."""

from __future__ import annotations

from .errors import EdgegenError, UsageError

__all__ = ["EdgegenError", "UsageError"]
