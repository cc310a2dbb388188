"""Client addresses as rate limits count them: IPv4 per address, IPv6 per network.

An IPv6 client is rarely given one address: a home line or a cloud VM gets at least a /64
(18 quintillion addresses), and picking a fresh one per request costs the client nothing.
Counting every /128 on its own would give anyone with a normal allocation unlimited per-IP
quota, so IPv6 clients are counted by their network prefix (``clients.ipv6_prefix``,
default 64). IPv4 addresses are counted one by one, and an IPv4-mapped IPv6 address
(``::ffff:192.0.2.1``, how a dual-stack socket reports an IPv4 client) is the IPv4 address.

The Worker (workers/templates/limiter.js, ``ipBucket``) computes the same strings, so a
client is one key at every layer. This module is pure and imports nothing of ours.
"""

from __future__ import annotations

import ipaddress

DEFAULT_IPV6_PREFIX = 64
# A /32 is a whole provider's allocation; counting wider would lump unrelated customers.
MIN_IPV6_PREFIX = 32
MAX_IPV6_PREFIX = 128


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
    mapped = address.ipv4_mapped
    if mapped is not None:
        return str(mapped)
    # A zone id (fe80::1%eth0) names the interface, not the client: drop it.
    bare = ipaddress.IPv6Address(int(address))
    if ipv6_prefix >= MAX_IPV6_PREFIX:
        return str(bare)
    network = ipaddress.IPv6Network((int(bare), ipv6_prefix), strict=False)
    return str(network)
