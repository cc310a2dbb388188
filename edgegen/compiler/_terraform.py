"""Terraform: the same rules as ``cloudflare/http_ratelimit.json``, and the Worker with its
bindings and routes, as a module of Cloudflare provider v5 resources.

The HCL is rendered from the very values that go to the API (the ruleset body, the Worker's
upload metadata), by a generic writer of objects, lists, strings, numbers and booleans, so
the two can never disagree. The file is a self-contained module: it declares its inputs
(``var.zone_id``, ``var.account_id`` when there is a Worker, ``var.extra_rules``) and the
provider requirement, embeds the Worker's module text, and can be used as
``module "ratelimit" { source = "./out/edge/terraform"; zone_id = ... }``. A policy with
nothing at the edge writes no module at all.
"""

from __future__ import annotations

import re
from typing import Any

from ._artifacts import WorkerArtifact

RESOURCE_NAME = "edgegen_http_ratelimit"
WORKER_RESOURCE_NAME = "edgegen_worker"
ROUTE_RESOURCE_NAME = "edgegen_worker_routes"
RULESET_NAME = "edgegen rate limiting rules"
PROVIDER_VERSION = "~> 5.0"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_INDENT = "  "


def hcl_string(value: str) -> str:
    """A quoted HCL string: ``"`` and ``\\`` escaped, ``${`` and ``%{`` doubled so
    Terraform never interpolates, controls as ``\\uNNNN``."""
    out: list[str] = []
    index = 0
    while index < len(value):
        char = value[index]
        code = ord(char)
        following = value[index + 1] if index + 1 < len(value) else ""
        if char in "$%" and following == "{":
            # "$${" and "%%{" are HCL's escapes for a literal "${" and "%{".
            out.append(char * 2 + "{")
            index += 2
            continue
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{value!r} contains a lone surrogate, which HCL cannot hold")
        elif code < 0x20 or code == 0x7F or not char.isprintable():
            out.append(f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}")
        else:
            out.append(char)
        index += 1
    return '"' + "".join(out) + '"'


def _is_scalar(value: object) -> bool:
    return isinstance(value, (str, int, float, bool))


def hcl_value(value: Any, depth: int = 0) -> str:
    """HCL for a JSON-like value; objects and lists of objects span lines."""
    pad = _INDENT * depth
    inner = _INDENT * (depth + 1)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        width = max(len(key) for key in value)
        lines = ["{"]
        for key, item in value.items():
            if not _IDENTIFIER.match(key):
                raise ValueError(f"{key!r} is not an HCL attribute name")
            lines.append(f"{inner}{key.ljust(width)} = {hcl_value(item, depth + 1)}")
        lines.append(f"{pad}}}")
        return "\n".join(lines)
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        if all(_is_scalar(item) for item in value):
            return "[" + ", ".join(hcl_value(item) for item in value) + "]"
        lines = ["["]
        lines.extend(f"{inner}{hcl_value(item, depth + 1)}," for item in value)
        lines.append(f"{pad}]")
        return "\n".join(lines)
    raise TypeError(f"cannot write {type(value).__name__} as HCL")


_OWNERSHIP = [
    "# The cloudflare_ruleset below owns the zone's whole http_ratelimit phase entrypoint:",
    "# terraform apply makes the zone's rate limiting rules exactly its rules list and deletes",
    "# every other rule of the phase (made in the dashboard, by the API or by another tool).",
    "# Put rules of your own in var.extra_rules: they come first, edgegen's rules last, so",
    "# your rules are evaluated before these. Never run edgegen apply on the same zone.",
]


def _variable(name: str, kind: str, description: str, default: str | None = None) -> list[str]:
    lines = [f'variable "{name}" {{', f"  type        = {kind}"]
    if default is not None:
        lines.append(f"  default     = {default}")
    lines += [f"  description = {hcl_string(description)}", "}", ""]
    return lines


def secret_variable(name: str) -> str:
    """The module input that holds a Worker secret: ``secret_`` and its name in lower case."""
    return "secret_" + name.lower()


def _secret_variables(worker: WorkerArtifact) -> list[str]:
    """Sensitive inputs for the secrets the Worker reads (never given a default)."""
    lines: list[str] = []
    for name in worker.secrets:
        lines += [
            f'variable "{secret_variable(name)}" {{',
            "  type        = string",
            "  sensitive   = true",
            f"  description = {hcl_string(f'The Worker secret {name} (see docs/edge.md).')}",
            "}",
            "",
        ]
    return lines


def _bindings(worker: WorkerArtifact) -> str:
    """The Worker's bindings: the ratelimit ones, then one secret_text per secret input."""
    listed = hcl_value(list(worker.bindings), 1)
    if not worker.secrets:
        return listed
    secrets: list[str] = []
    for name in worker.secrets:
        secrets += [
            "    {",
            '      type = "secret_text"',
            f"      name = {hcl_string(name)}",
            f"      text = var.{secret_variable(name)}",
            "    },",
        ]
    return "\n".join([f"concat({listed}, [", *secrets, "  ])"])


def render(ruleset: dict[str, Any], worker: WorkerArtifact | None = None) -> str | None:
    """``ratelimit.tf`` for a ruleset body (``{"description", "rules"}``) and the Worker, or
    None when there is neither a rule nor a Worker (an app-only policy has no module)."""
    if not ruleset["rules"] and worker is None:
        return None
    lines = [
        "# Generated by edgegen build from the rate-limit policy; do not edit.",
        "# The same rules as cloudflare/http_ratelimit.json and the same Worker as worker/,",
        "# for the Cloudflare provider v5.",
        *_OWNERSHIP,
        "",
        "terraform {",
        "  required_providers {",
        "    cloudflare = {",
        '      source  = "cloudflare/cloudflare"',
        f"      version = {hcl_string(PROVIDER_VERSION)}",
        "    }",
        "  }",
        "}",
        "",
        *_variable("zone_id", "string", "The id of the zone the rate limiting rules apply to."),
        *_variable(
            "extra_rules",
            "any",
            "Rate limiting rules of your own for the zone's http_ratelimit phase, in the "
            "provider's rules form; they come before edgegen's. Never give one a ref that "
            "starts with edgegen:.",
            default="[]",
        ),
    ]
    if worker is not None:
        lines += _variable("account_id", "string", "The id of the account the Worker runs in.")
        lines += _secret_variables(worker)
    lines += [
        "locals {",
        f"  edgegen_rules = {hcl_value(ruleset['rules'], 1)}",
        "}",
        "",
        f'resource "cloudflare_ruleset" "{RESOURCE_NAME}" {{',
        "  zone_id     = var.zone_id",
        f"  name        = {hcl_string(RULESET_NAME)}",
        f"  description = {hcl_string(ruleset['description'])}",
        '  kind        = "zone"',
        '  phase       = "http_ratelimit"',
        "  rules       = concat(var.extra_rules, local.edgegen_rules)",
        "}",
    ]
    if worker is not None:
        lines += [
            "",
            f'resource "cloudflare_workers_script" "{WORKER_RESOURCE_NAME}" {{',
            "  account_id         = var.account_id",
            f"  script_name        = {hcl_string(worker.name)}",
            f"  main_module        = {hcl_string(worker.main_module)}",
            f"  compatibility_date = {hcl_string(worker.compatibility_date)}",
            f"  bindings           = {_bindings(worker)}",
            # The module's text is embedded so the module needs no file beside it.
            f"  content            = {hcl_string(worker.module_source)}",
            "}",
        ]
        if worker.routes:
            lines += [
                "",
                f'resource "cloudflare_workers_route" "{ROUTE_RESOURCE_NAME}" {{',
                # Keyed by pattern, so adding or removing a route touches no other.
                f"  for_each = toset({hcl_value(list(worker.routes))})",
                "  zone_id  = var.zone_id",
                "  pattern  = each.value",
                f"  script   = cloudflare_workers_script.{WORKER_RESOURCE_NAME}.script_name",
                "}",
            ]
    return "\n".join(lines) + "\n"
