"""Node identity is bound to a principal: a signed-in client speaks only for its own devices, never for the
server nor another user's device, cannot disturb anyone's sequence numbering, and cannot take over another
user's deleted record (DESIGN.md sections 4 and 7). Each attack runs through real sockets against a real
server process with ``AUTH_SECRET`` set; the PostgreSQL one against two processes sharing a database."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offline.core.uuid7 import generate_uuid_v7
from offline.sync import protocol as p
from tests.support.servers import ServerProcess, write_entry

from .support import TIMEOUT, RawClient, Writer, handshake_reply, sign_up, start_server, wait_for

AUTH_SECRET = "node-identity-secret-0123456789abcdef-0123456789"

# todos: each user's own; boards: shared, with a field only the server decides and a unique name (a clash
# makes the server write its own operation: the loser's delete).
SCHEMA_SOURCE = """
from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {"fields": {"ownerId": t.string(), "title": t.string()}},
            "boards": {
                "fields": {
                    "name": t.string(),
                    "badge": t.string().merge("server-authoritative").optional(),
                },
                "constraints": {
                    "uniqueName": {"type": "unique", "fields": ["name"], "onConflict": "last-write-wins"}
                },
            },
        },
        "sync": {"todos": {"where": {"ownerId": "userId"}}, "boards": {"where": {}}},
    }
)
"""


def serve(folder: Path, **options: Any) -> ServerProcess:
    folder.mkdir(parents=True, exist_ok=True)
    write_entry(folder, SCHEMA_SOURCE)
    env = {"AUTH_SECRET": AUTH_SECRET}
    return start_server(folder, env=env, **options)


async def users(http_url: str, *emails: str) -> list[tuple[str, str]]:
    """(user id, access token) of each new user."""
    async with httpx.AsyncClient(base_url=http_url, timeout=TIMEOUT) as http:
        return [(uid, token) for uid, token, _ in [await sign_up(http, email) for email in emails]]


@asynccontextmanager
async def session(
    url: str, token: str | None, writer: Writer | None = None, after: int = 0
) -> AsyncIterator[RawClient]:
    client = RawClient(url, token=token, writer=writer or Writer())
    await client.open(after)
    try:
        yield client
    finally:
        await client.close()


async def push(client: RawClient, *ops: dict[str, Any]) -> p.Acknowledgment:
    """Send ``ops`` as one batch, which the server must accept whole."""
    ack = await asyncio.wait_for(await client.send_batch(list(ops)), TIMEOUT)
    refused = [r for r in client.rejections if r.operation_id in {op["id"] for op in ops}]
    assert not refused, refused
    return ack


def record_of(received: list[dict[str, Any]], record_id: str) -> list[dict[str, Any]]:
    return [op for op in received if op["recordId"] == record_id]


def assert_names(rejection: p.OperationRejected, op: dict[str, Any], code: str) -> None:
    assert rejection.code == code, rejection
    assert (rejection.collection, rejection.record_id) == (op["collection"], op["recordId"])
    assert rejection.to_dict()["collection"] == op["collection"]  # on the wire, as Kora.js clients read it


def test_no_client_speaks_as_the_server(tmp_path: Path) -> None:
    server = serve(tmp_path / "server")
    try:
        asyncio.run(_server_impersonation(server))
    finally:
        server.terminate()


async def _server_impersonation(server: ServerProcess) -> None:
    [(_, ada_token), (_, bob_token)] = await users(server.http_url, "ada@example.com", "bob@example.com")
    async with session(server.sync_url, ada_token) as ada:
        assert ada.reply is not None
        server_node = ada.reply.node_id
        board = ada.writer.op("boards", {"name": "roadmap"})
        await push(ada, board)

        # An operation stamped with the server's node id (it is in every handshake-response) is refused.
        forger = Writer(server_node)
        forged = forger.op("boards", {"badge": "pwned"}, record_id=board["recordId"], kind="update")
        assert_names(await ada.refused(forged), forged, p.NODE_ID_MISMATCH)

        # So an honest write after it decides the field.
        honest = ada.writer.op("boards", {"badge": "gold"}, record_id=board["recordId"], kind="update")
        await push(ada, honest)

    # Nor can a client take the server's node id as its own.
    reply = await handshake_reply(server.sync_url, server_node, bob_token)
    assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply

    async with session(server.sync_url, bob_token) as bob:
        await wait_for(
            lambda: len(record_of(bob.received, board["recordId"])) == 2, "bob's copy of the board"
        )
        assert forged["id"] not in {op["id"] for op in bob.received}


def test_no_client_speaks_for_another_users_device(tmp_path: Path) -> None:
    server = serve(tmp_path / "server")
    try:
        asyncio.run(_device_impersonation(server))
    finally:
        server.terminate()


async def _device_impersonation(server: ServerProcess) -> None:
    [(_, ada_token), (_, bob_token)] = await users(server.http_url, "ada@example.com", "bob@example.com")
    phone = Writer()
    async with session(server.sync_url, ada_token, phone) as ada:
        board = phone.op("boards", {"name": "groceries"})
        await push(ada, board)

    # Bob learnt the phone's node id from the relayed board: he can neither connect as that device...
    reply = await handshake_reply(server.sync_url, phone.node, bob_token)
    assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply
    assert reply.retriable is False

    # ... nor slip its operations into his own session.
    async with session(server.sync_url, bob_token) as bob:
        forged = phone.op("boards", {"name": "bob was here"}, record_id=board["recordId"], kind="update")
        assert_names(await bob.refused(forged), forged, p.NODE_ID_MISMATCH)
        legit = bob.writer.op("boards", {"name": "bob's board"})
        await push(bob, legit)

    # Ada's laptop (another device of hers) relays an operation of her phone that the server lacks: allowed.
    laptop = Writer()
    relayed = phone.op(
        "boards", {"name": "groceries (edited on the phone)"}, record_id=board["recordId"], kind="update"
    )
    async with session(server.sync_url, ada_token, laptop) as ada_laptop:
        await push(ada_laptop, relayed)

    # The phone, after a full resync from 0, holds what every other replica holds.
    async with (
        session(server.sync_url, ada_token, phone) as ada_phone,
        session(server.sync_url, bob_token) as bob,
    ):
        expected = {board["id"], legit["id"], relayed["id"]}
        await wait_for(lambda: {op["id"] for op in bob.received} == expected, lambda: f"bob: {bob.received}")
        # The phone is not sent its own operations back; everything else it is, and nothing forged.
        await wait_for(lambda: {op["id"] for op in ada_phone.received} == {legit["id"]}, "the phone's resync")
        assert forged["id"] not in {op["id"] for op in bob.received + ada_phone.received}


def test_sequence_numbers_cannot_be_poisoned(tmp_path: Path) -> None:
    db = tmp_path / "server.db"
    server = serve(tmp_path / "server", db=str(db))
    try:
        asyncio.run(_poison(server))
        assert server.terminate() == 0
        # After a restart, a write that makes the server write its own operation (a unique-name clash) is
        # stored and acknowledged (it closed every connection with 1011, for good, once poisoned).
        server = serve(tmp_path / "server", db=str(db))
        asyncio.run(_clash_after_restart(server))
    finally:
        server.terminate()


async def _poison(server: ServerProcess) -> None:
    [(_, token)] = await users(server.http_url, "ada@example.com")
    async with session(server.sync_url, token) as ada:
        assert ada.reply is not None
        forger = Writer(ada.reply.node_id)
        forger.sequence = 2**53 - 2  # the next one is the largest a peer may send
        forged = forger.op("boards", {"name": "poison"})
        assert_names(await ada.refused(forged), forged, p.NODE_ID_MISMATCH)
        # A client's own numbering starts at 1.
        zero = ada.writer.op("boards", {"name": "zero"}, sequence_number=0)
        assert_names(await ada.refused(zero), zero, p.INVALID_OPERATION)
        await push(ada, ada.writer.op("boards", {"name": "taken"}))


async def _clash_after_restart(server: ServerProcess) -> None:
    [(_, token)] = await users(server.http_url, "bob@example.com")
    async with session(server.sync_url, token) as bob:
        assert bob.reply is not None
        vector = bob.reply.version_vector
        assert vector.get(bob.reply.node_id, 0) < 2**53 - 1, vector
        clash = bob.writer.op("boards", {"name": "taken"})
        ack = await push(bob, clash)
        assert ack.delivery_sequence is not None
        # The server's resolution (the earlier board's delete) comes back on the relay, numbered by the server.
        await wait_for(
            lambda: any(op["nodeId"] == bob.reply.node_id for op in bob.received),  # type: ignore[union-attr]
            "the server's own resolution operation",
        )
        assert bob.closed is None


def test_a_node_never_numbers_two_operations_alike(tmp_path: Path) -> None:
    """Every client refuses a relay batch holding two operations of one node under one sequence number (a
    forgery): stored, such a pair would stop every client it is relayed to from syncing, for good."""
    server = serve(tmp_path / "server")
    try:
        asyncio.run(_reused_numbers(server))
    finally:
        server.terminate()


async def _reused_numbers(server: ServerProcess) -> None:
    [(_, token), (_, bob_token)] = await users(server.http_url, "ada@example.com", "bob@example.com")
    phone, laptop = Writer(), Writer()
    async with session(server.sync_url, token, phone) as ada:
        first = phone.op("boards", {"name": "one"})
        await push(ada, first)
        # The same number again, with other content: in its own batch, and twice in one batch.
        phone.sequence -= 1
        again = phone.op("boards", {"name": "two"})
        assert again["sequenceNumber"] == first["sequenceNumber"]
        assert_names(await ada.refused(again), again, p.INVALID_OPERATION)
        twins = [
            phone.op("boards", {"name": "three"}),
            phone.op("boards", {"name": "four"}, sequence_number=phone.sequence),
        ]
        await asyncio.wait_for(await ada.send_batch(twins), TIMEOUT)
        assert [r.operation_id for r in ada.rejections if r.operation_id in {t["id"] for t in twins}] == [
            twins[1]["id"]
        ]
        # A resent operation is a duplicate, not a clash.
        await push(ada, first)
    # Nor may another device of the same user reuse the phone's numbers.
    async with session(server.sync_url, token, laptop) as ada_laptop:
        phone.sequence = 0
        clash = phone.op("boards", {"name": "from the laptop"})
        assert_names(await ada_laptop.refused(clash), clash, p.INVALID_OPERATION)
    async with session(server.sync_url, bob_token) as bob:
        await wait_for(lambda: len(bob.received) == 2, lambda: f"bob's resync: {bob.received}")
        assert [op["id"] for op in bob.received] == [first["id"], twins[0]["id"]]


def test_a_deleted_record_stays_in_its_owners_scope(tmp_path: Path) -> None:
    server = serve(tmp_path / "server")
    try:
        asyncio.run(_deleted_takeover(server))
    finally:
        server.terminate()


async def _deleted_takeover(server: ServerProcess) -> None:
    [(ada_id, ada_token), (bob_id, bob_token)] = await users(
        server.http_url, "ada@example.com", "bob@example.com"
    )
    async with session(server.sync_url, ada_token) as ada:
        todo = ada.writer.op("todos", {"ownerId": ada_id, "title": "ada's secret"})
        record_id = todo["recordId"]
        delete = ada.writer.op("todos", None, record_id=record_id, kind="delete")
        await push(ada, todo, delete)

    async with session(server.sync_url, bob_token) as bob:
        # An update newer than the delete would revive the record, now in Bob's scope, with Ada's title.
        takeover = bob.writer.op("todos", {"ownerId": bob_id}, record_id=record_id, kind="update")
        assert_names(await bob.refused(takeover), takeover, p.SCOPE_VIOLATION)
        reinsert = bob.writer.op("todos", {"ownerId": bob_id, "title": "mine now"}, record_id=record_id)
        assert_names(await bob.refused(reinsert), reinsert, p.SCOPE_VIOLATION)
        # His own records are his to delete and write again.
        own = bob.writer.op("todos", {"ownerId": bob_id, "title": "bob's"})
        gone = bob.writer.op("todos", None, record_id=own["recordId"], kind="delete")
        back = bob.writer.op(
            "todos", {"ownerId": bob_id, "title": "bob's again"}, record_id=own["recordId"], kind="update"
        )
        await push(bob, own, gone)
        await push(bob, back)

    async with session(server.sync_url, bob_token) as bob_again:
        await wait_for(lambda: len(bob_again.received) == 3, lambda: f"bob's resync: {bob_again.received}")
        assert not record_of(bob_again.received, record_id)
    async with session(server.sync_url, ada_token) as ada_again:
        await wait_for(lambda: len(ada_again.received) == 2, lambda: f"ada's resync: {ada_again.received}")
        assert [op["id"] for op in ada_again.received] == [todo["id"], delete["id"]]


def test_turning_sign_in_on_keeps_every_device(tmp_path: Path) -> None:
    """A server that ran without sign-in registered its devices to the one anonymous principal; once
    ``AUTH_SECRET`` is set, the first user to sign in on a device takes its node id over, and keeps it."""
    folder, db = tmp_path / "server", tmp_path / "server.db"
    folder.mkdir()
    write_entry(folder, SCHEMA_SOURCE)
    phone = Writer()
    server = start_server(folder, db=str(db))
    try:

        async def without_sign_in() -> None:
            async with session(server.sync_url, None, phone) as device:
                await push(device, phone.op("boards", {"name": "before sign-in"}))

        asyncio.run(without_sign_in())
    finally:
        assert server.terminate() == 0
    server = serve(folder, db=str(db))
    try:

        async def with_sign_in() -> None:
            [(_, ada_token), (_, bob_token)] = await users(
                server.http_url, "ada@example.com", "bob@example.com"
            )
            async with session(server.sync_url, ada_token, phone) as device:
                await push(device, phone.op("boards", {"name": "after sign-in"}))
            reply = await handshake_reply(server.sync_url, phone.node, bob_token)
            assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply

        asyncio.run(with_sign_in())
    finally:
        server.terminate()


def test_a_device_from_before_the_registry_goes_to_its_own_user(tmp_path: Path) -> None:
    """A database from before node ids were registered holds operations of devices nobody registered: a user
    may take such a device's id only when everything it wrote lies within that user's scope."""
    folder, db = tmp_path / "server", tmp_path / "server.db"
    server = serve(folder, db=str(db))
    phone, kiosk = Writer(), Writer()
    try:

        async def before() -> list[tuple[str, str]]:
            accounts = await users(server.http_url, "ada@example.com", "bob@example.com")
            (ada_id, ada_token), _ = accounts
            async with session(server.sync_url, ada_token, phone) as device:
                await push(device, phone.op("todos", {"ownerId": ada_id, "title": "ada's"}))
            async with session(server.sync_url, ada_token, kiosk) as device:
                await push(device, kiosk.op("boards", {"name": "shared"}))
            return accounts

        accounts = asyncio.run(before())
    finally:
        assert server.terminate() == 0
    with sqlite3.connect(db) as conn:  # as a database written before the registry
        conn.execute("DELETE FROM offline_nodes")
    server = serve(folder, db=str(db))
    try:

        async def after() -> None:
            (_, ada_token), (_, bob_token) = accounts
            # Bob cannot take Ada's phone: it wrote in Ada's scope only.
            reply = await handshake_reply(server.sync_url, phone.node, bob_token)
            assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply
            async with session(server.sync_url, ada_token, phone) as device:
                await push(device, phone.op("boards", {"name": "back"}))
            # A device that wrote only what everyone sees goes to whoever signs in on it first.
            async with session(server.sync_url, bob_token, kiosk):
                pass

        asyncio.run(after())
    finally:
        server.terminate()


def test_node_ids_are_bound_across_processes_sharing_postgres(postgres_url: str, tmp_path: Path) -> None:
    first = serve(tmp_path / "first", store="postgres", db=postgres_url)
    try:
        second = serve(tmp_path / "second", store="postgres", db=postgres_url)
        try:
            asyncio.run(_across_processes(first, second))
        finally:
            second.terminate()
    finally:
        first.terminate()


async def _across_processes(first: ServerProcess, second: ServerProcess) -> None:
    [(_, ada_token), (_, bob_token)] = await users(first.http_url, "ada@example.com", "bob@example.com")
    phone = Writer()
    async with session(first.sync_url, ada_token, phone) as ada:
        assert ada.reply is not None
        server_node = ada.reply.node_id
        await push(ada, phone.op("boards", {"name": "shared"}))

    # Registered through the first process, refused by the second.
    reply = await handshake_reply(second.sync_url, phone.node, bob_token)
    assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply
    reply = await handshake_reply(second.sync_url, server_node, bob_token)
    assert isinstance(reply, p.ErrorMessage) and reply.code == p.AUTH_FAILED, reply
    async with session(second.sync_url, bob_token) as bob:
        forged = phone.op("boards", {"name": "forged"})
        assert_names(await bob.refused(forged), forged, p.NODE_ID_MISMATCH)
    async with session(second.sync_url, ada_token) as ada_laptop:
        await push(ada_laptop, phone.op("boards", {"name": "relayed by the laptop"}))

    # Two users claiming one new node id at once, one on each process: exactly one gets it.
    for _ in range(5):
        node = generate_uuid_v7()
        replies = await asyncio.gather(
            handshake_reply(first.sync_url, node, ada_token),
            handshake_reply(second.sync_url, node, bob_token),
        )
        accepted = [isinstance(r, p.HandshakeResponse) and r.accepted for r in replies]
        assert sorted(accepted) == [False, True], replies


# -- property: every legitimate operation converges, every forged one is refused ------------------------------

# Two users with two devices each (indices 0, 1: Ada's; 2, 3: Bob's). A step: a device writes an operation
# of an author (itself, a sibling whose write it relays, another user's device, or the server's node), an
# insert or an update of a board written before, or an insert of a todo of the author's user.
STEPS = st.lists(
    st.tuples(
        st.integers(0, 3),  # sender
        st.sampled_from(["own", "sibling", "stranger", "server"]),
        st.sampled_from(["board", "update", "todo"]),
    ),
    min_size=1,
    max_size=10,
)


def test_legitimate_operations_converge_and_forged_ones_are_refused(tmp_path: Path) -> None:
    server = serve(tmp_path / "server")
    try:
        accounts = asyncio.run(users(server.http_url, "ada@example.com", "bob@example.com"))

        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(STEPS)
        def scenario(steps: list[tuple[int, str, str]]) -> None:
            asyncio.run(_converge(server, accounts, steps))

        scenario()
    finally:
        server.terminate()


async def _converge(
    server: ServerProcess, accounts: list[tuple[str, str]], steps: list[tuple[int, str, str]]
) -> None:
    devices = [Writer() for _ in range(4)]
    user_of = [0, 0, 1, 1]
    expected: dict[str, dict[str, Any]] = {}  # id -> operation, of the accepted ones
    forged: set[str] = set()
    boards: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(session(server.sync_url, accounts[user_of[i]][1], devices[i]))
            for i in range(4)
        ]
        assert sessions[0].reply is not None
        server_writer = Writer(sessions[0].reply.node_id)
        for sender, author_kind, what in steps:
            author = {
                "own": sender,
                "sibling": sender ^ 1,
                "stranger": (sender + 2) % 4,
            }.get(author_kind)
            writer = server_writer if author is None else devices[author]
            owner = accounts[user_of[author if author is not None else sender]][0]
            if what == "update" and boards:
                op = writer.op(
                    "boards", {"name": f"renamed {len(expected)}"}, record_id=boards[-1], kind="update"
                )
            elif what == "todo":
                op = writer.op("todos", {"ownerId": owner, "title": "t"})
            else:
                op = writer.op("boards", {"name": f"board {generate_uuid_v7()}"})
            legit = author is not None and user_of[author] == user_of[sender]
            if legit:
                await push(sessions[sender], op)
                expected[op["id"]] = op
                if op["collection"] == "boards" and op["type"] == "insert":
                    boards.append(op["recordId"])
            else:
                assert_names(await sessions[sender].refused(op), op, p.NODE_ID_MISMATCH)
                forged.add(op["id"])
    # Every device, resynced from 0, holds exactly the accepted operations it may see that it did not write.
    nodes = {w.node for w in devices}
    async with contextlib.AsyncExitStack() as stack:
        for i, device in enumerate(devices):
            user = user_of[i]
            mine = {
                op_id
                for op_id, op in expected.items()
                if op["nodeId"] != device.node
                and (op["collection"] == "boards" or op["data"]["ownerId"] == accounts[user][0])
            }
            replica = await stack.enter_async_context(session(server.sync_url, accounts[user][1], device))

            def held(replica: RawClient = replica) -> set[str]:
                return {op["id"] for op in replica.received if op["nodeId"] in nodes}

            await wait_for(lambda: held() == mine, f"device {i} holds {sorted(mine)}")  # noqa: B023
            assert not held() & forged
