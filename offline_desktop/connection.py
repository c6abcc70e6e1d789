"""Checking a sync URL before the app saves it: a real WebSocket connection and a real handshake."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from offline import OfflineError
from offline.core import generate_uuid_v7
from offline.core.schema import SchemaDefinition
from offline.sync import protocol as p
from offline.sync.transport import ConnectionLost, TransportRefused, WebSocketTransport

log = logging.getLogger("offline_desktop")

DEFAULT_SYNC_PATH: Final = "/offline-sync"

# Reasons a check fails (ConnectionCheck.code).
BAD_URL: Final = "BAD_URL"
UNREACHABLE: Final = "UNREACHABLE"
NOT_OFFLINE_SERVER: Final = "NOT_OFFLINE_SERVER"
REFUSED: Final = "REFUSED"  # an offline server that refused this client (authentication, schema)

_SCHEMES: Final = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def normalize_sync_url(url: str) -> str:
    """The WebSocket URL for what a user typed: http(s) becomes ws(s), a bare host gets ``/offline-sync``.

    Raises ``OfflineError`` (code ``BAD_URL``) naming what is wrong with the URL.
    """
    text = url.strip()
    parts = urlsplit(text)
    scheme = _SCHEMES.get(parts.scheme.lower())
    if scheme is None:
        raise OfflineError(
            f"{text!r} is not a sync URL: use ws:// or wss:// (http:// and https:// are accepted too), "
            "e.g. wss://example.com/offline-sync",
            BAD_URL,
            {"field": "url"},
        )
    if not parts.hostname:
        raise OfflineError(f"{text!r} has no host name", BAD_URL, {"field": "url"})
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        raise OfflineError(f"{text!r} has an invalid port", BAD_URL, {"field": "url"}) from exc
    path = parts.path if parts.path not in ("", "/") else DEFAULT_SYNC_PATH
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


@dataclass(frozen=True)
class ConnectionCheck:
    """The outcome of ``test_connection``: ``ok``, else ``code`` and a ``reason`` to show the user."""

    ok: bool
    url: str
    code: str | None = None
    reason: str | None = None
    server_node_id: str | None = None


async def test_connection(
    url: str,
    schema: SchemaDefinition,
    *,
    timeout: float = 10.0,
    auth_token: str | None = None,
) -> ConnectionCheck:
    """Connect to ``url`` and perform the sync handshake as this app would; never raises for a bad server."""
    try:
        target = normalize_sync_url(url)
    except OfflineError as exc:
        return ConnectionCheck(False, url, exc.code, exc.message)
    try:
        return await asyncio.wait_for(_handshake(target, schema, timeout, auth_token), timeout)
    except TimeoutError:
        return ConnectionCheck(False, target, UNREACHABLE, f"no answer from {target} within {timeout:g} s")


async def _handshake(
    target: str, schema: SchemaDefinition, timeout: float, auth_token: str | None
) -> ConnectionCheck:
    transport = WebSocketTransport(open_timeout=timeout, compression=None)
    try:
        conn = await transport.connect(target)
    except TransportRefused as exc:
        if exc.status is not None:
            reason = f"{target} answered HTTP {exc.status}: not an offline sync endpoint (check the path)"
            return ConnectionCheck(False, target, NOT_OFFLINE_SERVER, reason)
        return ConnectionCheck(False, target, BAD_URL, str(exc))
    except ConnectionLost as exc:
        if not isinstance(exc.__cause__, (OSError, TimeoutError)):
            # Something answered, but not with a WebSocket upgrade (an HTTP/1.0 server, another protocol).
            reason = f"{target} answered, but not as an offline sync server ({exc.__cause__ or exc})"
            return ConnectionCheck(False, target, NOT_OFFLINE_SERVER, reason)
        return ConnectionCheck(False, target, UNREACHABLE, f"cannot reach {target} ({exc.__cause__})")
    try:
        # A throwaway node id: the probe must not look like this device (it sends and stores nothing).
        hello = p.Handshake(
            message_id=p.new_message_id(),
            node_id=generate_uuid_v7(),
            version_vector={},
            schema_version=schema.version,
            last_delivery_sequence=0,
            auth_token=auth_token,
        )
        await conn.send(p.encode(hello))
        try:
            reply = p.decode(await conn.recv())
        except ConnectionLost as exc:
            return ConnectionCheck(
                False, target, NOT_OFFLINE_SERVER, f"{target} closed the connection at the handshake ({exc})"
            )
        except p.ProtocolError as exc:
            return ConnectionCheck(
                False, target, NOT_OFFLINE_SERVER, f"{target} does not speak the offline protocol ({exc})"
            )
        if isinstance(reply, p.ErrorMessage):
            return ConnectionCheck(
                False, target, REFUSED, f"the server refused: {reply.code}: {reply.message}"
            )
        if not isinstance(reply, p.HandshakeResponse):
            return ConnectionCheck(
                False,
                target,
                NOT_OFFLINE_SERVER,
                f"{target} answered the handshake with {type(reply).__name__}",
            )
        if not reply.accepted:
            return ConnectionCheck(
                False, target, REFUSED, f"the server refused: {reply.reject_reason or 'SCHEMA_MISMATCH'}"
            )
        return ConnectionCheck(True, target, server_node_id=reply.node_id)
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


# Named like a test, but it is not one: keep pytest from collecting it wherever it is imported.
test_connection.__test__ = False  # type: ignore[attr-defined]
