"""The client IP: the direct peer, or what the trusted proxies in front of it say.

:class:`TrustedProxies` turns the direct peer and the forwarding headers
(``X-Forwarded-For``, or Cloudflare's ``CF-Connecting-IP``) into the address the limits
count a client by. No I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from .._memo import Memo
from ._request import RequestInfo

# A trusted-proxies entry that trusts a peer without an address (a Unix domain socket).
UNIX_SOCKET = "unix"
# The client IP used when none can be determined (no peer address at all): such requests
# share one anonymous bucket rather than escaping the limit.
UNKNOWN_IP = "unknown"
# Direct peers whose client IP TrustedProxies remembers, at most (see client_ip).
MAX_KNOWN_PEERS = 4096

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_ip(text: str) -> Address | None:
    """Parse one address as written in a header or a peer field, or None.

    Accepts ``1.2.3.4``, ``1.2.3.4:5678``, ``::1``, ``[::1]:443`` and quoted values; an
    IPv4-mapped IPv6 address (``::ffff:1.2.3.4``) becomes the IPv4 address, so one client is
    one key whichever socket family the server used.
    """
    value = text.strip().strip('"')
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        value = value[1:end]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TrustedProxies:
    """Which peers may tell us the client IP, and how to read it from them.

    ``trusted`` lists addresses or CIDR networks (``10.0.0.0/8``, ``::1``) of your own proxies
    and load balancers, plus ``"unix"`` to trust a peer on a Unix domain socket. The client IP
    is the direct peer unless that peer is trusted; then ``X-Forwarded-For`` is read right to
    left, skipping trusted hops, and the first untrusted address is the client. Addresses a
    client put in the header itself lie to the left of that point and are never reached.

    ``behind_cloudflare=True`` reads ``CF-Connecting-IP`` instead, but only from a trusted peer:
    list Cloudflare's ranges (https://www.cloudflare.com/ips/) or the load balancer that only
    Cloudflare can reach. Anyone else can send that header too.
    """

    def __init__(self, trusted: Iterable[str] = (), *, behind_cloudflare: bool = False) -> None:
        """Parse the trusted entries; ValueError names an entry that is not an address."""
        networks: list[Network] = []
        unix = False
        for entry in trusted:
            text = entry.strip()
            if text.lower() == UNIX_SOCKET:
                unix = True
                continue
            try:
                network = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted proxy {entry!r} is not an IP address or CIDR network; write it "
                    "like 10.0.0.0/8, 192.0.2.7 or ::1 (or 'unix' for a Unix socket peer)"
                ) from None
            networks.append(network)
        self._networks = tuple(networks)
        self._unix = unix
        self.behind_cloudflare = behind_cloudflare
        # Peers that decide the client IP alone (not trusted, or not an IP), and the answer:
        # a client sends many requests, and parsing its address with ipaddress for each
        # cost more than the rest of reading the request. Bounded, so a flood of addresses
        # cannot grow memory.
        self._peers: Memo[str, str] = Memo(MAX_KNOWN_PEERS)
        self._direct = self._peers.entries  # read for every request

    @property
    def networks(self) -> tuple[Network, ...]:
        """The trusted networks, parsed."""
        return self._networks

    def _remember(self, peer: str, client: str) -> str:
        """Note that ``peer`` alone makes ``client`` the client IP; return it."""
        self._peers.keep(peer, client)
        return client

    def trusts(self, address: Address | None) -> bool:
        """True when ``address`` is one of ours (None: a Unix socket peer)."""
        if address is None:
            return self._unix
        return any(address.version == net.version and address in net for net in self._networks)

    def client_ip(self, request: RequestInfo) -> str:
        """The client's IP as a canonical string (``UNKNOWN_IP`` when there is no peer)."""
        text = request.peer
        if text:
            known = self._direct.get(text)
            if known is not None:
                return known
        return self._resolve(request, text)

    def _resolve(self, request: RequestInfo, text: str | None) -> str:
        """:meth:`client_ip` for a peer not remembered: the peer ``text``, or the
        forwarding headers a trusted peer sent."""
        peer = parse_ip(text) if text else None
        if text and peer is None:
            # A peer that is not an IP (some test clients say "testclient"): it is still the
            # connection we talk to, and nothing vouches for headers behind it.
            return self._remember(text, text)
        if not self.trusts(peer):
            return self._remember(text, str(peer)) if text and peer is not None else UNKNOWN_IP
        if self.behind_cloudflare:
            cf = request.header("cf-connecting-ip")
            cf_ip = parse_ip(cf) if cf else None
            if cf_ip is not None:
                return str(cf_ip)
        hops: list[str] = []
        for value in request.header_values("x-forwarded-for"):
            hops.extend(value.split(","))
        nearest = peer
        for hop in reversed(hops):
            address = parse_ip(hop)
            if address is None:
                # A trusted proxy never writes garbage; stop at the nearest hop we can vouch
                # for rather than let an unparsable value become a fresh key per request.
                break
            if not self.trusts(address):
                return str(address)
            nearest = address
        return str(nearest) if nearest is not None else UNKNOWN_IP
