"""The rate-limit policy: one declarative file that drives the edge and the app.

Public surface::

    policy.load(path) / policy.loads(text)   -> Policy   (raises PolicyLoadError)
    policy.lint(policy)                      -> list[Diagnostic]
    policy.json_schema()                     -> dict
    Rate, Duration, Algorithm, Action, Plan, ...   the shared vocabulary
    Matcher, request_paths, canonical_path   request matching, the same at edge and app
    ip_bucket                                the key a client address is counted under
"""

from __future__ import annotations

from typing import Any

from ._errors import Diagnostic, PolicyError, PolicyLoadError, Severity
from ._lint import allowance, lint, sliding_log_bytes
from ._loader import Position, SourceMap, format_path, load, loads
from ._match import (
    Matcher,
    canonical_path,
    decode_path,
    encode_policy_path,
    normalize_host,
    normalize_path,
    request_paths,
)
from ._model import (
    App,
    AppLimit,
    AuthenticatedWhen,
    Clients,
    Cloudflare,
    EdgeLimit,
    Limit,
    Match,
    Policy,
    Worker,
)
from ._net import DEFAULT_IPV6_PREFIX, ip_bucket
from ._vocab import (
    Action,
    Algorithm,
    AppKey,
    Duration,
    EdgeKey,
    EdgeTarget,
    Mode,
    OnRedisError,
    Plan,
    Rate,
)


def json_schema() -> dict[str, Any]:
    """The policy file's JSON Schema (draft 2020-12), for editors and CI validation."""
    schema = Policy.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Rate-limit policy"
    return schema


__all__ = [
    "DEFAULT_IPV6_PREFIX",
    "Action",
    "Algorithm",
    "App",
    "AppKey",
    "AppLimit",
    "AuthenticatedWhen",
    "Clients",
    "Cloudflare",
    "Diagnostic",
    "Duration",
    "EdgeKey",
    "EdgeLimit",
    "EdgeTarget",
    "Limit",
    "Match",
    "Matcher",
    "Mode",
    "OnRedisError",
    "Plan",
    "Policy",
    "PolicyError",
    "PolicyLoadError",
    "Position",
    "Rate",
    "Severity",
    "SourceMap",
    "Worker",
    "allowance",
    "canonical_path",
    "decode_path",
    "encode_policy_path",
    "format_path",
    "ip_bucket",
    "json_schema",
    "lint",
    "load",
    "loads",
    "normalize_host",
    "normalize_path",
    "request_paths",
    "sliding_log_bytes",
]
