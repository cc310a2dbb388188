"""Redis key names: bounded, collision-free, and one hash slot per identity.

A key is ``<prefix>:<limit>:{<tag>}:<period>:<algorithm>``, for example
``rl:api:{u=user-123}:1m:sw``. The braces are Redis Cluster's hash tag: every key of one
identity hashes to the same slot, so one script can read and write all of them.

The tag is ``<kind>=<escaped identity>`` or, for identities longer than 32 characters
once escaped (a UUID is 36), ``<kind>#`` followed by the first 128 bits of the identity's
SHA-256 (22 characters of URL-safe base64): short keys are what keeps a GCRA or
sliding-window state within 128 bytes of Redis memory, and 128 bits of SHA-256 keep
collisions out of reach (about 2^64 identities before one is likely). The kind is ``u`` (user),
``i`` (client IP: an IPv4 address, or an IPv6 network, from ``policy.ip_bucket``) or
``k:<name>`` for a key of the app's own that a limit counts by (``per: org`` counts in
``k:org=acme``; the name escaped like an identity). Which kind an identity gets depends on
how it is passed (a user id, ``ip=`` for a client address, ``keys={"org": ...}`` for an app
key), never on what it says: a user id that looks like an address is still a user, and an
organisation called ``u=alice`` has a bucket of its own.

Kinds cannot be confused: ``u`` and ``i`` are single letters, every named kind starts with
``k:``, and no kind holds ``=`` or ``#`` (the escaping writes them ``%3D`` and ``%23``), so a
tag's kind is everything before its first ``=`` or ``#``, and two tags of different kinds
never coincide.

Escaping percent-encodes every byte outside a small safe set, which includes ``{``, ``}``,
``:``, ``%``, ``=``, ``#``, spaces, controls and all non-ASCII, so:

- no identity can end the tag early or open another one (the tag never contains braces);
- two different identities never share a tag: escaping is injective, hashed and escaped
  tags differ in their separator, and which form is used depends only on the identity;
- every key is short whatever the identity's length (at most 34 characters of tag).

Limit names get the same escaping (they are at most 64 characters by the policy's rules).
"""

from __future__ import annotations

import base64
import hashlib
import re

# Bytes kept as they are. Everything else, '%' first among them, is written %XX.
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~@+!*,;")
# Identities longer than this many bytes once escaped are stored as their digest.
MAX_ESCAPED = 32
# Bytes of the SHA-256 kept for a digest tag.
_DIGEST_BYTES = 16

USER = "u"
IP = "i"
# The start of every named kind: ``k:org``.
NAMED = "k:"


# Matches exactly the byte strings made only of safe bytes: most identities are, and need no
# escaping at all (one C call instead of a Python loop per byte on every decision).
_ALL_SAFE = re.compile(b"[" + re.escape(bytes(sorted(_SAFE))) + b"]*")


def escape(raw: bytes) -> str:
    """Percent-encode ``raw`` outside the safe set (an injective, brace-free encoding)."""
    if _ALL_SAFE.fullmatch(raw):
        return raw.decode("ascii")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def _utf8(text: str) -> bytes:
    # surrogatepass keeps the encoding total and injective: a str with a lone surrogate
    # (from a badly decoded header) still has exactly one byte string.
    return text.encode("utf-8", "surrogatepass")


def identity_tag(kind: str, identity: str) -> str:
    """The hash-tag content for ``identity`` of ``kind`` (``USER`` or ``IP``)."""
    raw = identity.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_ESCAPED:
        if _ALL_SAFE.fullmatch(raw):
            # Most identities: nothing to escape, and the bytes are the str's own (ASCII).
            return f"{kind}={identity}"
        escaped = escape(raw)
        if len(escaped) <= MAX_ESCAPED:
            return f"{kind}={escaped}"
    digest = (
        base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:_DIGEST_BYTES]).rstrip(b"=").decode()
    )
    return f"{kind}#{digest}"


def named_kind(name: str) -> str:
    """The kind of a key of the app's own called ``name`` (``per: org``): ``k:org``."""
    return NAMED + escape(_utf8(name))


def limit_component(name: str) -> str:
    """A limit name as it appears in keys."""
    return escape(_utf8(name))


def state_key(prefix: str, limit: str, tag: str, period: str, algorithm: str) -> str:
    """The key holding one limit's state for one identity and one rate period."""
    return f"{prefix}:{limit}:{{{tag}}}:{period}:{algorithm}"
