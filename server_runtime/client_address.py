"""Who a request comes from: the one place that decides a client's address, for every per-address limit.

The immediate peer (the TCP connection's source) is the client, unless that peer is a trusted proxy
(``OFFLINE_TRUSTED_PROXIES``: comma-separated addresses or CIDRs; empty by default, so forwarding headers are
ignored; ``*`` trusts every peer, for platforms where all traffic arrives through the platform's proxy). Then
the address comes from the client-address header (``OFFLINE_CLIENT_IP_HEADER``, default ``X-Forwarded-For``;
on Fly.io ``Fly-Client-IP``, which holds a single address). Each proxy appends the address it saw to
``X-Forwarded-For``, so only the right end of the list is trustworthy: the client is the right-most address
that is not itself a trusted proxy. A header missing or not an address leaves the last trusted hop as the
client, never a value the client chose. An IPv6 client is named by its /64 network (``2001:db8:1:2::/64``):
an attacker rotating addresses inside its prefix stays one client for every limit.

`client_address` takes a request, a WebSocket or an ASGI scope; the server's middleware (see
``server_runtime.http_limits``) puts its `ProxyPolicy` in the scope, so every route asks the same function.
"""

from __future__ import annotations

import functools
import ipaddress
import os
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, TypeVar

from offline.core.errors import OfflineError

__all__ = [
    "CLIENT_IP_HEADER_ENV",
    "DEFAULT_CLIENT_IP_HEADER",
    "POLICY_KEY",
    "TRUSTED_PROXIES_ENV",
    "ProxyPolicy",
    "client_address",
    "is_loopback_host",
    "limit_key",
    "most_crowded",
    "network_of",
]

TRUSTED_PROXIES_ENV = "OFFLINE_TRUSTED_PROXIES"
CLIENT_IP_HEADER_ENV = "OFFLINE_CLIENT_IP_HEADER"
DEFAULT_CLIENT_IP_HEADER = "X-Forwarded-For"
#: ASGI scope keys: the server's policy, and the address once decided (asked for by several limits).
POLICY_KEY = "offline.proxy_policy"
ADDRESS_KEY = "offline.client_address"
UNKNOWN = "unknown"
CONFIG_ERROR = "SERVER_CONFIG"

T = TypeVar("T")
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=4096)  # the same few peers (a proxy, a busy client) ask again and again
def _parse_address(text: str) -> _Address | None:
    """An address from a header entry or a peer: bare, ``[v6]``, ``[v6]:port`` or ``v4:port``."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # v4 with a port (a v6 address has at least two colons)
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # the same client whether it came in over v4 or a dual-stack socket
    return address


def _identity(address: _Address) -> str:
    """How limits tell clients apart: an IPv4 address, or an IPv6 address's /64 (one subscriber's prefix,
    whose 2**64 addresses are one client's to rotate through)."""
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@functools.lru_cache(maxsize=4096)
def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` (a name or an address) is this machine: ``localhost`` or a loopback address."""
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def limit_key(host: str) -> str:
    """`_identity` of a peer address as the transport gives it (unparsable: unchanged)."""
    address = _parse_address(host)
    return _identity(address) if address is not None else host


@functools.lru_cache(maxsize=4096)
def network_of(identity: str) -> str:
    """The network a client (`client_address`'s answer) belongs to, where limits share slots out fairly
    rather than per client: an IPv4 address's /24, an IPv6 /64's /48. One party gets a whole /48 as easily
    as one address (a tunnel broker hands them out free) and often a few addresses of one /24 (a cloud
    account); anything else (unknown, a Unix socket) is its own network."""
    if identity.endswith("/64"):
        try:
            return str(ipaddress.IPv6Network(identity).supernet(new_prefix=48))
        except ValueError:
            return identity
    address = _parse_address(identity)
    if isinstance(address, ipaddress.IPv4Address):
        return str(ipaddress.IPv4Network((address, 24), strict=False))
    return identity


def most_crowded(crowds: Mapping[str, Mapping[T, object]], network: str) -> Mapping[T, object] | None:
    """Where a full allowance makes room for a newcomer from ``network``: the group (oldest first) of the
    network holding the most, when it holds more than ``network``'s would with the newcomer; None when every
    network holds no more than that. Addresses that fill every slot with young connections then keep no
    other network out, while each network still holds at least as many as any other."""
    crowd = max(crowds.values(), key=len, default=None)
    if crowd is None or len(crowd) <= len(crowds.get(network, ())) + 1:
        return None
    return crowd


class ProxyPolicy:
    """Which peers are trusted proxies, and the header they put the client's address in."""

    __slots__ = ("any", "header", "networks")

    def __init__(self, trusted: Iterable[str] = (), header: str = DEFAULT_CLIENT_IP_HEADER) -> None:
        entries = [entry.strip() for entry in trusted if entry.strip()]
        self.any = "*" in entries
        networks: list[_Network] = []
        for entry in entries:
            if entry == "*":
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                raise OfflineError(
                    f"trusted proxy {entry!r} is not an address or CIDR (such as 10.0.0.1 or 10.0.0.0/8); "
                    f"fix {TRUSTED_PROXIES_ENV} or the trusted_proxies option",
                    CONFIG_ERROR,
                    {"field": "trusted_proxies"},
                ) from None
        self.networks = tuple(networks)
        header = header.strip()
        if not header or any(ch.isspace() or ch in ':()<>@,;\\"/[]?={}' for ch in header):
            raise OfflineError(
                f"client IP header {header!r} is not an HTTP header name (such as X-Forwarded-For); fix "
                f"{CLIENT_IP_HEADER_ENV} or the client_ip_header option",
                CONFIG_ERROR,
                {"field": "client_ip_header"},
            )
        self.header = header.lower().encode("latin-1")

    @property
    def enabled(self) -> bool:
        return self.any or bool(self.networks)

    def _listed(self, address: _Address) -> bool:
        return any(address in network for network in self.networks)

    def trusts_peer(self, peer: str) -> bool:
        if self.any:
            return True
        address = _parse_address(peer)
        return address is not None and self._listed(address)

    def address(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str:
        """The client's address for a connection from ``peer`` carrying these (raw ASGI) headers."""
        peer_address = _parse_address(peer) if peer else None
        client = _identity(peer_address) if peer_address is not None else (peer or UNKNOWN)
        if not self.enabled or peer is None or not self.trusts_peer(peer):
            return client
        # Repeated headers read as one list, in order (RFC 9110 5.3).
        values = [value.decode("latin-1") for name, value in headers if name.lower() == self.header]
        hops = [hop for value in values for hop in value.split(",")]
        for hop in reversed(hops):
            address = _parse_address(hop)
            if address is None:
                break  # not written by a proxy we trust: stop at the last hop we can vouch for
            client = _identity(address)
            # "*" trusts the peer only: hops named in the header are trusted when listed explicitly.
            if not self._listed(address):
                break
        return client

    @classmethod
    def resolve(
        cls,
        trusted: str | Iterable[str] | None = None,
        header: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProxyPolicy:
        """From the options when given, else ``OFFLINE_TRUSTED_PROXIES`` / ``OFFLINE_CLIENT_IP_HEADER``."""
        env = os.environ if env is None else env
        if trusted is None:
            trusted = env.get(TRUSTED_PROXIES_ENV, "")
        if isinstance(trusted, str):
            trusted = trusted.split(",")
        trusted = list(trusted)
        if not all(isinstance(entry, str) for entry in trusted):
            raise OfflineError(
                "trusted_proxies must be a list of addresses or CIDRs (or a comma-separated string)",
                CONFIG_ERROR,
                {"field": "trusted_proxies"},
            )
        if header is None:
            header = env.get(CLIENT_IP_HEADER_ENV, "").strip() or DEFAULT_CLIENT_IP_HEADER
        return cls(trusted, header)


_DIRECT = ProxyPolicy()


def client_address(connection: Any) -> str:
    """The client's address for a Starlette ``Request`` / ``WebSocket`` or an ASGI scope (decided once per
    connection, by the server's `ProxyPolicy`; without one, the peer's address)."""
    scope: MutableMapping[str, Any] = getattr(connection, "scope", connection)
    known = scope.get(ADDRESS_KEY)
    if isinstance(known, str):
        return known
    policy = scope.get(POLICY_KEY)
    if not isinstance(policy, ProxyPolicy):
        policy = _DIRECT
    peer = scope.get("client")
    address = policy.address(str(peer[0]) if peer else None, scope.get("headers") or ())
    scope[ADDRESS_KEY] = address
    return address
