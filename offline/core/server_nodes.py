"""Server node ids: how every replica tells a server's operations from a client's.

'server-authoritative' fields let a server's writes win over clients' (DESIGN.md section 3). Which writes
are a server's must follow from the operations themselves, or replicas holding the same operations would
fold them differently (one that exchanged operations peer to peer without ever connecting would read the
server's writes as a client's). So a server's node id carries a marker, ``server~`` at its start: the node
id is part of the operation's content hash and of its timestamp, so the marker cannot be added or removed
without changing the operation's id. Clients never generate such ids, and the server refuses any client
operation whose node id carries the marker (`NODE_ID_MISMATCH`), so a client cannot forge one.

Servers created before the marker existed wrote under a plain id; their operations stay authoritative for
the replicas that learnt that id from a handshake (`App.set_authoritative_nodes`), as before.
"""

from __future__ import annotations

from typing import TypeGuard

from .uuid7 import generate_uuid_v7

SERVER_NODE_PREFIX = "server~"


def is_server_node_id(node_id: object) -> TypeGuard[str]:
    """Does ``node_id`` carry the server marker?"""
    return isinstance(node_id, str) and node_id.startswith(SERVER_NODE_PREFIX)


def new_server_node_id() -> str:
    """A fresh server node id (marked)."""
    return SERVER_NODE_PREFIX + generate_uuid_v7()


__all__ = ["SERVER_NODE_PREFIX", "is_server_node_id", "new_server_node_id"]
