"""Who a request comes from: forwarding headers count only from trusted proxies (OFFLINE_TRUSTED_PROXIES), and
every per-address limit asks the same function (server_runtime.client_address)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline import OfflineError
from offline.sync import protocol as p
from server_runtime.client_address import ProxyPolicy, client_address, network_of
from server_runtime.environment import server_from_environment
from tests.support.servers import ServerProcess

from .support import SCHEMA, BareSocketPeer, start_server


def scope(peer: str, *headers: tuple[str, str], policy: ProxyPolicy | None = None) -> dict[str, object]:
    raw = [(name.lower().encode(), value.encode()) for name, value in headers]
    found: dict[str, object] = {"type": "http", "client": (peer, 50000), "headers": raw}
    if policy is not None:
        found["offline.proxy_policy"] = policy
    return found


def test_without_trusted_proxies_forwarding_headers_are_ignored() -> None:
    policy = ProxyPolicy.resolve(None, None, env={})
    assert not policy.enabled
    assert (
        client_address(scope("127.0.0.1", ("X-Forwarded-For", "203.0.113.9"), policy=policy)) == "127.0.0.1"
    )
    assert client_address(scope("10.1.2.3", ("X-Forwarded-For", "203.0.113.9"))) == "10.1.2.3"  # no policy


def test_from_a_trusted_proxy_the_right_most_untrusted_hop_is_the_client() -> None:
    policy = ProxyPolicy.resolve("10.0.0.0/8, 192.0.2.7", None, env={})
    chain = ("X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.0.0.5")
    # The client wrote 198.51.100.1 itself; 203.0.113.9 is what the first trusted proxy (10.0.0.5) saw.
    assert client_address(scope("192.0.2.7", chain, policy=policy)) == "203.0.113.9"
    # Repeated headers are one list; ports and brackets are tolerated.
    split = (("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", "[2001:db8::1]:443"))
    assert client_address(scope("10.9.9.9", *split, policy=policy)) == "2001:db8::/64"
    # An untrusted peer's header is ignored, whatever it says.
    assert client_address(scope("203.0.113.50", chain, policy=policy)) == "203.0.113.50"
    # Garbage where an address should be: the last hop vouched for (the proxy) is the client.
    assert client_address(scope("10.0.0.1", ("X-Forwarded-For", "1.2.3.4, not-an-ip"), policy=policy)) == (
        "10.0.0.1"
    )
    # No header from a trusted proxy: the proxy is all we know.
    assert client_address(scope("10.0.0.1", policy=policy)) == "10.0.0.1"
    # Every hop a trusted proxy: the left-most is the client.
    assert client_address(scope("10.0.0.1", ("X-Forwarded-For", "10.0.0.3, 10.0.0.2"), policy=policy)) == (
        "10.0.0.3"
    )


def test_an_ipv6_client_is_its_64_prefix() -> None:
    # Rotating through one's own /64 (2**64 addresses) does not make a new client.
    for peer in ("2001:db8:1:2::1", "2001:db8:1:2:ffff:1:2:3", "[2001:db8:1:2::9]"):
        assert client_address(scope(peer)) == "2001:db8:1:2::/64"
    assert client_address(scope("2001:db8:1:3::1")) == "2001:db8:1:3::/64"
    assert client_address(scope("::ffff:192.0.2.1")) == "192.0.2.1"  # a v4 client on a dual-stack socket


def test_the_network_a_client_shares_slots_with() -> None:
    """An IPv4 address's /24 and an IPv6 /64's /48 (what the fair share of pre-sign-in slots counts by); an
    address arriving over a dual-stack socket is its IPv4 one; anything else is its own network."""
    v4 = client_address(scope("::ffff:198.51.100.7"))
    assert network_of(v4) == network_of("198.51.100.200") == "198.51.100.0/24"
    v6 = client_address(scope("2001:db8:1:2:aaaa::1"))
    assert network_of(v6) == network_of("2001:db8:1:ffff::/64") == "2001:db8:1::/48"
    assert network_of("2001:db8:2::/64") != network_of(v6)
    for other in ("unknown", "", "not an address/64"):
        assert network_of(other) == other


def test_star_trusts_every_peer_but_only_the_address_it_appended() -> None:
    policy = ProxyPolicy.resolve("*", "Fly-Client-IP", env={})
    assert (
        client_address(scope("172.16.0.2", ("Fly-Client-IP", "203.0.113.9"), policy=policy)) == "203.0.113.9"
    )
    # X-Forwarded-For is not the configured header: ignored.
    assert client_address(scope("172.16.0.2", ("X-Forwarded-For", "1.1.1.1"), policy=policy)) == "172.16.0.2"
    xff = ProxyPolicy.resolve("*", None, env={})
    assert client_address(scope("172.16.0.2", ("X-Forwarded-For", "6.6.6.6, 203.0.113.9"), policy=xff)) == (
        "203.0.113.9"
    )


def test_policy_from_environment_and_bad_values() -> None:
    env = {"OFFLINE_TRUSTED_PROXIES": "10.0.0.0/8", "OFFLINE_CLIENT_IP_HEADER": "Fly-Client-IP"}
    policy = ProxyPolicy.resolve(None, None, env=env)
    assert policy.trusts_peer("10.2.3.4") and not policy.trusts_peer("11.0.0.1")
    assert client_address(scope("10.2.3.4", ("fly-client-ip", "203.0.113.9"), policy=policy)) == "203.0.113.9"
    # Options win over the environment.
    assert not ProxyPolicy.resolve([], None, env=env).enabled
    with pytest.raises(OfflineError) as bad:
        ProxyPolicy.resolve("10.0.0.0/8, proxy.internal", None, env={})
    assert bad.value.code == "SERVER_CONFIG" and "proxy.internal" in bad.value.message
    with pytest.raises(OfflineError) as header:
        ProxyPolicy.resolve(None, "X Forwarded For", env={})
    assert header.value.code == "SERVER_CONFIG" and header.value.context == {"field": "client_ip_header"}


def test_server_from_environment_reads_both_settings(tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> None:
        env = {
            "OFFLINE_SERVER_STORE": "memory",
            "OFFLINE_TRUSTED_PROXIES": "*",
            "OFFLINE_CLIENT_IP_HEADER": "Fly-Client-IP",
        }
        server = await server_from_environment(SCHEMA, env)
        try:
            assert server.proxies.any and server.proxies.header == b"fly-client-ip"
        finally:
            await server.store.close()

    asyncio.run(scenario())


# -- live: the sync endpoint's per-address limit on connections still handshaking ------------------------------------


@contextlib.contextmanager
def pending_limited(folder: Path, **env: str) -> Iterator[ServerProcess]:
    # Two silent connections per address, held for a minute (and never evicted for a newer one): long enough
    # for any busy machine.
    base = {
        "OFFLINE_MAX_PENDING_PER_ADDRESS": "2",
        "OFFLINE_HANDSHAKE_TIMEOUT": "60",
        "OFFLINE_SILENT_GRACE": "60",
    }
    server = start_server(folder, store="memory", env={**base, **env})
    try:
        yield server
    finally:
        server.terminate()


def silent(server: ServerProcess, forwarded: str, source: str | None = None) -> BareSocketPeer:
    return BareSocketPeer("127.0.0.1", server.port, source=source, headers={"X-Forwarded-For": forwarded})


def refused_as_overloaded(peer: BareSocketPeer) -> bool:
    message = peer.next_message()
    return isinstance(message, p.ErrorMessage) and message.code == p.OVERLOADED and message.retriable


def test_rotating_x_forwarded_for_from_an_untrusted_peer_changes_nothing(tmp_path: Path) -> None:
    with pending_limited(tmp_path) as server:
        held = [silent(server, "198.51.100.1"), silent(server, "198.51.100.2")]
        third = silent(server, "198.51.100.3")
        try:
            assert refused_as_overloaded(third)
            # Another real address is another client: it connects and completes its handshake.
            other = silent(server, "198.51.100.1", source="127.0.0.2")
            assert other.handshake().accepted
            other.close()
        finally:
            for peer in (*held, third):
                peer.close()


def test_x_forwarded_for_from_a_trusted_proxy_is_honoured(tmp_path: Path) -> None:
    with pending_limited(tmp_path, OFFLINE_TRUSTED_PROXIES="127.0.0.1") as server:
        held = [silent(server, "198.51.100.1"), silent(server, "198.51.100.1")]
        same = silent(server, "198.51.100.1")
        other = silent(server, "198.51.100.2")
        try:
            assert refused_as_overloaded(same)  # the forwarded client's own limit
            assert other.handshake().accepted  # another forwarded client is not held back
        finally:
            for peer in (*held, same, other):
                peer.close()
