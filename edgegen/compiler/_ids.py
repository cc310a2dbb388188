"""Stable identifiers derived from the policy: rule refs, binding names, namespace ids.

All are pure functions of names in the policy, so rebuilding gives the same ids and zone
plan and apply can recognise their own rules and counters. Each pairs a readable slug with a
short SHA-256 of the exact name: hostile names (quotes, ``${}``, unicode) map to safe ASCII, and
two different names never share an id even when their slugs agree.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

RULE_REF_PREFIX = "edgegen:"
_SLUG_MAX = 40
_HASH_CHARS = 8
# Cloudflare asks only for "a positive integer" unique in the account; staying below 2**31
# keeps the id valid for any consumer that parses it as a signed 32-bit integer.
_NAMESPACE_SPACE = 2**31 - 1


def _digest(*parts: str) -> str:
    data = "\0".join(parts).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


def slug(name: str) -> str:
    """Lower-case ASCII letters, digits and dashes; ``limit`` when nothing is left."""
    ascii_text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")
    return text[:_SLUG_MAX].rstrip("-") or "limit"


def short_hash(name: str) -> str:
    """The first 8 hex digits of SHA-256 of the exact name."""
    return _digest(name)[:_HASH_CHARS]


def rule_ref(name: str) -> str:
    """``edgegen:<slug>-<hash>``: the ``ref`` of the rule generated for a limit."""
    return f"{RULE_REF_PREFIX}{slug(name)}-{short_hash(name)}"


def binding_name(name: str) -> str:
    """``RL_<SLUG>_<HASH>``: the Worker's binding (a JavaScript identifier) for a limit."""
    return f"RL_{slug(name).upper().replace('-', '_')}_{short_hash(name).upper()}"


def namespace_id(worker: str, name: str) -> str:
    """A positive integer, as a string, naming the binding's counters in the account.

    Derived from the Worker's name and the limit's name: the same policy keeps its counters
    across deploys; a rate change keeps them too; another Worker never shares them.
    """
    value = int(_digest("edgegen-namespace", worker, name)[:16], 16)
    return str(1 + value % _NAMESPACE_SPACE)
