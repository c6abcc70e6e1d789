"""Atheris target, run as a subprocess by ``test_fuzz``: each input is one text frame sent on a live, signed-in
sync session; the answer must be the one `Oracle` predicts (see ``test_fuzz`` for what "answered" means).

The protocol decoder is instrumented, so libFuzzer's coverage feedback steers mutations toward frames that get
deeper into decoding (valid envelopes with bad operations) rather than bytes rejected at the first character.
Findings are written to the report file after every input (libFuzzer ends the process without Python's
shutdown), and a mismatch never stops the run: the test reads the report and fails on any.

Configuration comes from the JSON file named by ``OFFLINE_ATHERIS_CONFIG``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import atheris

with atheris.instrument_imports():
    from offline.sync import protocol as p

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from offline.core.operations import Operation
from tests.hardening.support import SCHEMA, Oracle

CONFIG: dict[str, Any] = json.loads(Path(os.environ["OFFLINE_ATHERIS_CONFIG"]).read_text())
ORACLE = Oracle(set(CONFIG["stored"]), CONFIG["max_message"], CONFIG["max_batch"], CONFIG["max_operation"])
REPORT = Path(CONFIG["report"])
TIMEOUT = 15.0


class State:
    ws: ClientConnection | None = None
    errors = 0
    sent = 0
    counts: Counter[str] = Counter()
    violations: list[str] = []
    accepted: list[str] = []  # ids of legitimate operations atheris made and the server stored


def session() -> ClientConnection:
    if State.ws is None:
        ws = connect(CONFIG["url"], max_size=None, open_timeout=TIMEOUT)
        hello = p.Handshake(
            p.new_message_id(), CONFIG["node"], {}, SCHEMA.version, 0, auth_token=CONFIG["token"]
        )
        ws.send(p.encode(hello))
        State.ws = ws
        reply = next_reply()
        assert isinstance(reply, p.HandshakeResponse) and reply.accepted, reply
        State.errors = 0
    return State.ws


def next_reply() -> p.Message:
    ws = State.ws
    assert ws is not None
    while True:
        message = p.decode(ws.recv(timeout=TIMEOUT))
        if not isinstance(message, p.OperationBatch):
            return message
        ack = p.Acknowledgment(p.new_message_id(), message.message_id, 0, message.max_delivery_sequence)
        ws.send(p.encode(ack))


def expect_close(code: int) -> None:
    ws = State.ws
    assert ws is not None
    try:
        while True:
            next_reply()
    except ConnectionClosed:
        pass
    if ws.close_code != code:
        raise AssertionError(f"expected close {code}, got {ws.close_code}")
    State.ws = None


def check(frame: str) -> str:
    kind, detail = ORACLE.expect(frame)
    session().send(frame)
    if kind == "silent":
        return "silent"
    if kind == "close":
        expect_close(detail)
        return "closed"
    reply = next_reply()
    if kind == "error":
        if (
            not isinstance(reply, p.ErrorMessage)
            or reply.retriable
            or reply.code not in p.CONNECTION_ERROR_CODES
        ):
            raise AssertionError(f"expected a non-retriable error, got {reply}")
        State.errors += 1
        if State.errors >= 20:
            expect_close(1008)
        return "error"
    message_id, refused = detail
    rejected = set()
    while isinstance(reply, p.OperationRejected):
        rejected.add(reply.operation_id)
        reply = next_reply()
    if not isinstance(reply, p.Acknowledgment) or reply.acknowledged_message_id != message_id:
        raise AssertionError(f"expected the acknowledgment of {message_id}, got {reply}")
    if reply.delivery_sequence is not None:
        # Coverage-guided mutation learns the server's hash comparison, so atheris can make a *valid* new
        # operation (a mutated title with its id fixed up). The server may store such a one only when a
        # legitimate client of this user could have written it; anything else stored is a violation.
        accepted = refused - rejected
        if not accepted:
            raise AssertionError("a hostile batch was stored")
        for op in operations_of(frame, accepted):
            problem = illegitimate(op)
            if problem is not None:
                raise AssertionError(f"a hostile operation was stored ({problem}): {op.id}")
        ORACLE.stored.update(accepted)
        State.accepted.extend(sorted(accepted))
        refused -= accepted
        if rejected != refused:
            raise AssertionError(f"rejected {sorted(rejected)}, expected {sorted(refused)}")
        return "legitimate operation stored"
    if rejected != refused:
        raise AssertionError(f"rejected {sorted(rejected)}, expected {sorted(refused)}")
    return "batch refused" if refused else "replay acknowledged"


def operations_of(frame: str, ids: set[str]) -> list[Operation]:
    message = p.decode(frame, max_bytes=ORACLE.max_message, max_batch=ORACLE.max_batch)
    items = message.operations if isinstance(message, p.OperationBatch) else (message.operation,)  # type: ignore[attr-defined]
    found = []
    for item in items:
        try:
            op = p.decode_operation(item, max_bytes=ORACLE.max_operation)
        except p.ProtocolError:
            continue
        if op.id in ids:
            found.append(op)
    if {op.id for op in found} != ids:
        raise AssertionError(f"stored operations not found in the frame: {sorted(ids)}")
    return found


def illegitimate(op: Operation) -> str | None:
    """Why this user's client could not have written ``op`` (None: it could have)."""
    if op.schema_version != SCHEMA.version:
        return f"schema version {op.schema_version}"
    if op.timestamp.wall_time > time.time() * 1000 + 5 * 60 * 1000:
        return "stamped more than 5 minutes ahead"
    if op.collection == "boards":
        return None  # shared by everyone
    if op.collection != "todos":
        return f"collection {op.collection!r}"
    owner = (op.data or {}).get("ownerId")
    if op.type == "insert":
        return None if owner == CONFIG["user"] else f"insert for owner {owner!r}"
    if op.record_id not in CONFIG["todos"]:
        return "a todo of someone else"
    return None if owner in (None, CONFIG["user"]) else f"moves a todo to {owner!r}"


def test_one_input(data: bytes) -> None:
    frame = data.decode("utf-8", "replace")
    try:
        outcome = check(frame)
    except Exception as exc:  # keep fuzzing; the test fails on the report
        State.violations.append(f"{type(exc).__name__}: {exc} <- {frame[:1500]!r}")
        if State.ws is not None:
            State.ws.close()
        State.ws = None
        outcome = "violation"
    State.sent += outcome != "silent"
    State.counts[outcome] += 1
    REPORT.write_text(
        json.dumps(
            {
                "sent": State.sent,
                "counts": State.counts,
                "violations": State.violations[:50],
                "accepted": State.accepted,
            }
        )
    )


def main() -> None:
    REPORT.write_text(json.dumps({"sent": 0, "counts": {}, "violations": []}))
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
