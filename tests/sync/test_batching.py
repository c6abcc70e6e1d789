"""How the client engine batches its writes, against a real server process (memory store) on loopback.

While ``max_in_flight`` batches await their acknowledgement, new local writes wait and then go out together;
what is sent is the stored wire text of each operation. The acknowledgements reach the engine through a
transport that holds them back until the test lets them through, so nothing depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offline import HybridLogicalClock, create_app, create_operation
from offline.core.uuid7 import generate_uuid_v7
from offline.merge.values import compact_json
from offline.store import App
from offline.store.database import WIRE
from offline.sync import protocol as p
from offline.sync.transport import WebSocketTransport
from tests.support.servers import ServerProcess, schema_from_source, write_entry

SCHEMA_SOURCE = """
from offline import define_schema, t

schema = define_schema({"version": 1, "collections": {"items": {"fields": {"title": t.string()}}}})
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    folder = tmp_path / "server"
    folder.mkdir()
    process = ServerProcess(write_entry(folder, SCHEMA_SOURCE), store="memory").start()
    try:
        yield process
    finally:
        process.terminate(timeout=10)


class GatedTransport:
    """The real WebSocket transport; acknowledgments from the server wait until `release()`."""

    def __init__(self) -> None:
        self.inner = WebSocketTransport()
        self.gate = asyncio.Event()
        self.gate.set()
        self.sent: list[dict[str, Any]] = []  # every operation-batch the client sent

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def connect(self, url: str) -> Any:
        return _GatedConnection(await self.inner.connect(url), self)


class _GatedConnection:
    def __init__(self, inner: Any, owner: GatedTransport) -> None:
        self.inner = inner
        self.owner = owner

    async def send(self, text: str) -> None:
        message = json.loads(text)
        if message["type"] == "operation-batch":
            self.owner.sent.append(message)
        await self.inner.send(text)

    async def recv(self) -> str:
        frame: str = await self.inner.recv()
        if json.loads(frame)["type"] == "acknowledgment":
            await self.owner.gate.wait()
        return frame

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.inner.close(code, reason)


async def _until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _app(tmp_path: Path, url: str, transport: GatedTransport, **options: Any) -> App:
    sync = {"url": url, "transport": transport, "backoff_initial": 0.05, "ack_timeout": 30.0, **options}
    return create_app(schema_from_source(SCHEMA_SOURCE), sync=sync, path=str(tmp_path / "client.db"))


def test_writes_made_while_the_window_is_full_go_out_together(tmp_path: Path, server: ServerProcess) -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        app = _app(tmp_path, server.sync_url, transport, max_in_flight=1)
        try:
            await app.sync.connect()
            await app.sync.wait_until_synced()
            transport.hold()
            first = app.items.insert({"title": "first"})
            await _until(lambda: len(transport.sent) == 1, "the first batch")
            later = []
            for i in range(5):
                later.append(app.items.insert({"title": f"later {i}"}))
                await asyncio.sleep(0.02)  # the engine runs between writes, and must not send
            assert len(transport.sent) == 1
            assert app.sync.pending == 6
            transport.release()
            await app.sync.wait_until_synced()
            assert [len(batch["operations"]) for batch in transport.sent] == [1, 5]
            assert [op["recordId"] for op in transport.sent[1]["operations"]] == [r["id"] for r in later]
            assert transport.sent[0]["operations"][0]["recordId"] == first["id"]
            assert app.sync.sent_operations == 6
            # The operations went out as stored.
            stored = dict(app.db.conn.execute(f"SELECT id, {WIRE} FROM _offline_ops"))
            for batch in transport.sent:
                for op in batch["operations"]:
                    assert json.loads(stored[op["id"]]) == op
        finally:
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()

    asyncio.run(scenario())


def test_a_batch_ends_at_its_byte_budget(tmp_path: Path, server: ServerProcess) -> None:
    async def scenario() -> None:
        transport = GatedTransport()
        app = _app(tmp_path, server.sync_url, transport, batch_bytes=2000)
        try:
            with app.batch():
                for i in range(10):
                    app.items.insert({"title": f"{i}" * 300})
            await app.sync.connect()
            await app.sync.wait_until_synced()
            sizes = [len(batch["operations"]) for batch in transport.sent]
            assert sum(sizes) == 10 and len(sizes) > 1
            for batch in transport.sent:
                text = sum(len(json.dumps(op, separators=(",", ":"))) for op in batch["operations"])
                assert text <= 2000 or len(batch["operations"]) == 1
        finally:
            with contextlib.suppress(Exception):
                await app.sync.disconnect()
            app.close()

    asyncio.run(scenario())


def _inserts(count: int, data: Callable[[int], dict[str, Any]]) -> list[Any]:
    """``count`` insert operations of one new node into "items", the i-th with ``data(i)``."""
    node = generate_uuid_v7()
    clock = HybridLogicalClock(node)
    return [
        create_operation(
            {
                "node_id": node,
                "type": "insert",
                "collection": "items",
                "record_id": generate_uuid_v7(),
                "data": data(i),
                "timestamp": clock.now(),
                "sequence_number": i + 1,
                "schema_version": 1,
            }
        )
        for i in range(count)
    ]


def test_a_frame_around_encoded_operations_is_the_batch_message() -> None:
    ops = _inserts(3, lambda i: {"title": f"\u00e9 {i}", "blob": b"\x00\x01"})
    wires = [compact_json(op.to_wire()) for op in ops]
    for base, top in ((None, None), (7, 10)):
        framed = p.encode_batch_frame(
            "m1", wires, is_final=False, batch_index=2, base_delivery_sequence=base, max_delivery_sequence=top
        )
        built = p.encode(p.OperationBatch("m1", tuple(op.to_wire() for op in ops), False, 2, base, top))
        assert p.decode(framed) == p.decode(built)
    decoded = p.decode(p.encode_batch_frame("m2", wires, is_final=True, batch_index=0))
    assert isinstance(decoded, p.OperationBatch)
    for op, raw, wire in zip(ops, decoded.operations, wires, strict=True):
        got, text = p.decode_operation_text(raw)
        assert got == op and text == wire
    assert p.decode(p.encode_batch_frame("m3", [], is_final=True, batch_index=0)) == p.OperationBatch(
        "m3", (), True, 0
    )


def test_relay_frames_are_bounded_by_count_and_utf8_bytes() -> None:
    """The relay's frame split (pure): at most ``count`` texts and ``budget`` UTF-8 bytes (a text and its comma)
    per frame, a larger text alone, order kept, nothing lost or duplicated."""
    from server_runtime.sync import _frames

    assert _frames([], 500, 1000) == []
    small = ['{"a":1}'] * 7
    assert _frames(small, 500, 1000) == [small]  # the common case: one frame, as it is
    assert _frames(small, 3, 1000) == [small[:3], small[3:6], small[6:]]
    ascii_texts = ["x" * 90] * 10  # 91 bytes each with its comma
    assert [len(f) for f in _frames(ascii_texts, 500, 300)] == [3, 3, 3, 1]
    wide = ["é" * 60] * 4  # 60 characters, 121 bytes each
    assert [len(f) for f in _frames(wide, 500, 250)] == [2, 2]  # by bytes: characters alone would fit 4
    mixed = ["y" * 10, "z" * 1000, "w" * 10]
    assert _frames(mixed, 500, 100) == [["y" * 10], ["z" * 1000], ["w" * 10]]  # too big: alone
    texts = [str(i) * (i % 50) for i in range(300)]
    frames = _frames(texts, 40, 700)
    assert [t for f in frames for t in f] == texts
    for frame in frames:
        assert len(frame) <= 40
        assert len(frame) == 1 or sum(len(t.encode()) + 1 for t in frame) <= 700


def test_large_batches_are_decoded_and_applied_with_the_collector_held_off(tmp_path: Path) -> None:
    """A big batch's operations live until it is stored: the cyclic collector is held off while it is
    decoded and applied (its full collections would walk the whole process again and again), and runs
    again before the acknowledgement is sent; small batches, and an application that turned the collector
    off itself, are left alone."""
    import gc

    app = create_app(
        schema_from_source(SCHEMA_SOURCE),
        path=str(tmp_path / "client.db"),
        sync={"url": "ws://127.0.0.1:9/offline-sync"},
    )
    engine: Any = app.sync
    wires = [op.to_wire() for op in _inserts(300, lambda i: {"title": f"item {i}"})]
    during: list[bool] = []
    real_apply = app.apply_verified

    def spying(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        return real_apply(*args, **kwargs)

    app.apply_verified = spying  # type: ignore[method-assign]

    class Connection:
        def __init__(self) -> None:
            self.sent: list[bool] = []  # the collector's state as each acknowledgement goes out

        async def send(self, text: str) -> None:
            assert isinstance(p.decode(text), p.Acknowledgment)
            self.sent.append(gc.isenabled())

    conn = Connection()
    try:
        asyncio.run(engine._receive(conn, "m1", wires[:250], 250))
        asyncio.run(engine._receive(conn, "m2", wires[250:260], 260))  # small: left alone
        gc.disable()
        try:
            asyncio.run(engine._receive(conn, "m3", wires[260:], 300))
            assert not gc.isenabled()  # the application's choice stands
        finally:
            gc.enable()
        assert during == [False, True, False]
        assert conn.sent == [True, True, False]
        assert app.collection("items").count() == 300
    finally:
        app.close()


def test_a_large_batch_frame_is_parsed_and_applied_with_the_collector_held_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held off from the frame's parse (its parsed operations are alive from there) to the end of the apply,
    and on again before the acknowledgement; a small frame is parsed with the collector on."""
    import gc

    from offline.sync.client import ConnectionLost

    app = create_app(
        schema_from_source(SCHEMA_SOURCE),
        path=str(tmp_path / "client.db"),
        sync={"url": "ws://127.0.0.1:9/offline-sync"},
    )
    engine: Any = app.sync
    wires = [op.to_wire() for op in _inserts(310, lambda i: {"title": f"item {i}"})]

    def batch(message_id: str, ops: list[Any], base: int, top: int) -> str:
        return p.encode(
            p.OperationBatch(
                message_id=message_id,
                operations=tuple(ops),
                is_final=True,
                batch_index=0,
                base_delivery_sequence=base,
                max_delivery_sequence=top,
            )
        )

    frames = [batch("m1", wires[:300], 0, 300), batch("m2", wires[300:], 300, 310)]
    parsed: list[bool] = []
    applied: list[bool] = []
    real_decode, real_apply = p.decode, app.apply_verified

    def decode(text: Any, **kwargs: Any) -> Any:
        parsed.append(gc.isenabled())
        return real_decode(text, **kwargs)

    def apply(*args: Any, **kwargs: Any) -> Any:
        applied.append(gc.isenabled())
        return real_apply(*args, **kwargs)

    monkeypatch.setattr(p, "decode", decode)
    app.apply_verified = apply  # type: ignore[method-assign]

    class Connection:
        def __init__(self) -> None:
            self.sent: list[bool] = []

        async def recv(self) -> str:
            if not frames:
                raise ConnectionLost("the test's frames are all read")
            return frames.pop(0)

        async def send(self, text: str) -> None:
            assert isinstance(real_decode(text), p.Acknowledgment)
            self.sent.append(gc.isenabled())

    conn = Connection()
    try:
        with pytest.raises(ConnectionLost):
            asyncio.run(engine._reader(conn))
        assert parsed == [False, True]
        assert applied == [False, True]
        assert conn.sent == [True, True]
        assert gc.isenabled()
        assert app.collection("items").count() == 310
    finally:
        app.close()
