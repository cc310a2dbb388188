"""Client addresses as rate limits count them: IPv4 per address, IPv6 per network.

An IPv6 client is rarely given one address: a home line or a cloud VM gets at least a /64
(18 quintillion addresses), and picking a fresh one per request costs the client nothing.
Counting every /128 on its own would give anyone with a normal allocation unlimited per-IP
quota, so IPv6 clients are counted by their network prefix (``clients.ipv6_prefix``,
default 64). IPv4 addresses are counted one by one, and an IPv4-mapped IPv6 address
(``::ffff:192.0.2.1``, how a dual-stack socket reports an IPv4 client) is the IPv4 address,
as are the other IPv6 forms that carry an IPv4 client (:func:`embedded_ipv4`).

The Worker (workers/templates/limiter.js, ``ipBucket``) computes the same strings, so a
client is one key at every layer. This module is pure and imports nothing of ours.
"""

from __future__ import annotations

import ipaddress

DEFAULT_IPV6_PREFIX = 64
# A /32 is a whole provider's allocation; counting wider would lump unrelated customers.
MIN_IPV6_PREFIX = 32
MAX_IPV6_PREFIX = 128


# RFC 6052's well-known NAT64 prefix 64:ff9b::/96 and RFC 2765's IPv4-translated ::ffff:0:0/96,
# each as the value of the address's upper 96 bits.
_NAT64_HIGH = 0x0064_FF9B_0000_0000_0000_0000
_TRANSLATED_HIGH = 0x0000_0000_0000_0000_FFFF_0000


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 client an IPv6 address stands for, or None for a native IPv6 address.

    A translator or tunnel writes an IPv4 client into an IPv6 address: IPv4-mapped
    (``::ffff:a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``), NAT64 (``64:ff9b::a.b.c.d``),
    IPv4-compatible (``::a.b.c.d``), 6to4 (``2002:AABB:CCDD::/48``) and Teredo
    (``2001:0::/32``, the client's address inverted in the last 32 bits). Counted as IPv6,
    one IPv4 host would hold 65,536 /64s of 6to4 space, and every client behind one NAT64
    front would share one /64; counted as the IPv4 address, each is the one client it is.
    """
    value = int(address)
    high = value >> 32
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if high in (_TRANSLATED_HIGH, _NAT64_HIGH) or (high == 0 and value > 0xFFFF):
        return ipaddress.IPv4Address(value & 0xFFFF_FFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def ip_bucket(ip: str, ipv6_prefix: int = DEFAULT_IPV6_PREFIX) -> str:
    """The key a client address is counted under.

    ``203.0.113.9`` -> ``203.0.113.9``; ``::ffff:203.0.113.9`` -> ``203.0.113.9``;
    ``2001:DB8:0:1::5`` -> ``2001:db8:0:1::/64`` (with the default prefix); a /128 prefix
    keeps the address (``2001:db8:0:1::5``). Text that is not an address (a test client's
    ``"testclient"``) is returned as it is: it is still one caller's key.
    """
    text = ip.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv4Address):
        return str(address)
    embedded = embedded_ipv4(address)
    if embedded is not None:
        return str(embedded)
    # A zone id (fe80::1%eth0) names the interface, not the client: drop it.
    bare = ipaddress.IPv6Address(int(address))
    if ipv6_prefix >= MAX_IPV6_PREFIX:
        return str(bare)
    network = ipaddress.IPv6Network((int(bare), ipv6_prefix), strict=False)
    return str(network)
