"""The rate-limit policy: one declarative file that drives the edge and the app.

Public surface::

    policy.load(path) / policy.loads(text)   -> Policy   (raises PolicyLoadError)
    policy.check(policy, checks)             -> Checked  the validity gate: ok, errors,
                                                         stopping(Layer.EDGE / Layer.APP)
    policy.lint(policy, checks)              -> list[Diagnostic]
    Diagnostic, diagnostic_at(policy, path, ...)   the one finding type, located in the file
    diagnostic_line / _terminal / _json, diagnostics_markdown, write_diagnostics
                                             its one formatter
    policy.json_schema()                     -> dict
    Rate, Duration, Algorithm, Action, CloudflarePlan, ...   the shared vocabulary
    checked_rates                            a tier's rates as they are checked: the smaller
                                             limit of one period decides alone
    Matcher, request_paths, canonical_path   request matching, the same at edge and app
    has_control_character                    a path the middlewares and the Worker refuse
    CountWhen, status_counts                 the statuses a count_when limit counts, and the
                                             one test of a response's status against them
    ip_bucket                                the key a client address is counted under
    header_key, QUOTA_EXCEEDED               a limit's RateLimit header key, the 429's
                                             problem type: the same at edge and app
    credentialed_rate                        an edge limit's rate for credentialed requests
    Quotas, Period, period_bounds, time_zone  calendar quotas: the model, the periods of a
                                             time zone's calendar
    ALGORITHMS, Quota, decide, ...           the app's algorithms as integer arithmetic, as
                                             applimit's Lua computes them: its memory://
                                             store and edgegen's replay decide with them

``checks`` are checks a consumer contributes (edgegen passes its Cloudflare placement
checks); this package imports nothing of edgegen or applimit.
"""

from __future__ import annotations

from typing import Any

from ._algorithms import (
    AFTER,
    ALGORITHMS,
    CALENDAR,
    LEASE,
    QUOTA_GRACE_US,
    SHADOW,
    AlgorithmModel,
    Counter,
    Quota,
    Verdict,
    burst_for,
    decide,
    period_us,
)
from ._calendar import Period, UnknownTimeZoneError, period_at, period_bounds, time_zone
from ._check import Checked, check
from ._edge import CREDENTIALED_FACTOR, credentialed_rate
from ._errors import Diagnostic, Layer, PolicyError, PolicyLoadError, Severity
from ._http import QUOTA_EXCEEDED, header_key
from ._lint import Check, allowance, diagnostic_at, lint, sliding_log_bytes
from ._loader import Position, SourceMap, format_path, load, loads
from ._match import (
    Matcher,
    canonical_path,
    decode_path,
    encode_policy_path,
    has_control_character,
    normalize_host,
    normalize_path,
    request_paths,
)
from ._model import (
    OVERRIDE_MAX_RATES,
    OVERRIDE_MAX_UNITS,
    OVERRIDE_TIER,
    App,
    AppLimit,
    AuthenticatedWhen,
    Clients,
    Cloudflare,
    CookieKey,
    CountWhen,
    EdgeKeySpec,
    EdgeLimit,
    HeaderKey,
    JwtClaim,
    JwtKey,
    Limit,
    Match,
    Override,
    Policy,
    Quotas,
    Worker,
    is_keyed,
    override_expiry,
    status_counts,
)
from ._net import DEFAULT_IPV6_PREFIX, ip_bucket
from ._report import (
    diagnostic_json,
    diagnostic_line,
    diagnostic_terminal,
    diagnostics_markdown,
    write_diagnostics,
)
from ._vocab import (
    Action,
    Algorithm,
    AppKey,
    CloudflarePlan,
    Duration,
    EdgeKey,
    EdgeTarget,
    KeyName,
    Mode,
    OnRedisError,
    Rate,
    checked_rates,
)


def json_schema() -> dict[str, Any]:
    """The policy file's JSON Schema (draft 2020-12), for editors and CI validation."""
    schema = Policy.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Rate-limit policy"
    return schema


__all__ = [
    "AFTER",
    "ALGORITHMS",
    "CALENDAR",
    "CREDENTIALED_FACTOR",
    "DEFAULT_IPV6_PREFIX",
    "LEASE",
    "OVERRIDE_MAX_RATES",
    "OVERRIDE_MAX_UNITS",
    "OVERRIDE_TIER",
    "QUOTA_EXCEEDED",
    "QUOTA_GRACE_US",
    "SHADOW",
    "Action",
    "Algorithm",
    "AlgorithmModel",
    "App",
    "AppKey",
    "AppLimit",
    "AuthenticatedWhen",
    "Check",
    "Checked",
    "Clients",
    "Cloudflare",
    "CloudflarePlan",
    "CookieKey",
    "CountWhen",
    "Counter",
    "Diagnostic",
    "Duration",
    "EdgeKey",
    "EdgeKeySpec",
    "EdgeLimit",
    "EdgeTarget",
    "HeaderKey",
    "JwtClaim",
    "JwtKey",
    "KeyName",
    "Layer",
    "Limit",
    "Match",
    "Matcher",
    "Mode",
    "OnRedisError",
    "Override",
    "Period",
    "Policy",
    "PolicyError",
    "PolicyLoadError",
    "Position",
    "Quota",
    "Quotas",
    "Rate",
    "Severity",
    "SourceMap",
    "UnknownTimeZoneError",
    "Verdict",
    "Worker",
    "allowance",
    "burst_for",
    "canonical_path",
    "check",
    "checked_rates",
    "credentialed_rate",
    "decide",
    "decode_path",
    "diagnostic_at",
    "diagnostic_json",
    "diagnostic_line",
    "diagnostic_terminal",
    "diagnostics_markdown",
    "encode_policy_path",
    "format_path",
    "has_control_character",
    "header_key",
    "ip_bucket",
    "is_keyed",
    "json_schema",
    "lint",
    "load",
    "loads",
    "normalize_host",
    "normalize_path",
    "override_expiry",
    "period_at",
    "period_bounds",
    "period_us",
    "request_paths",
    "sliding_log_bytes",
    "status_counts",
    "time_zone",
    "write_diagnostics",
]
