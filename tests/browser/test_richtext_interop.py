"""Rich text made by the browser's Yjs (the npm package yjs, in Pyodide) and by pycrdt (CPython) merges to the
same text and the same stored bytes: both run `offline.merge.richtext`, the browser's through
`offline.merge.yjs.BrowserBackend`.

The browser side runs in Pyodide under Node.js (richtext_in_pyodide.mjs) with the offline library from the
template project's build and yjs from its node_modules: the same code and package the page's worker uses.
"""

from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from offline.merge import richtext, yjs

SCRIPT = Path(__file__).with_name("richtext_in_pyodide.mjs")
INITIAL = "shared text: é, 🙂, done"


def encode(update: bytes) -> str:
    return base64.b64encode(update).decode("ascii")


def pycrdt_edits(state: str, edits: list[tuple[str, int, Any]], client_id: int) -> tuple[str, list[bytes]]:
    """``edits`` made with pycrdt as Yjs client ``client_id`` on top of ``state`` (positions wrap around)."""
    updates = []
    for kind, index, value in edits:
        size = len(richtext.text_of(state))
        if kind == "insert":
            at = index % (size + 1)
            update, _ = richtext.edit_update(
                state, lambda t, i=at, v=value: t.insert(i, v), client_id=client_id
            )
        else:
            start = index % max(size, 1)
            stop = min(size, start + value)
            update, _ = richtext.edit_update(
                state, lambda t, a=start, b=stop: t.__delitem__(slice(a, b)), client_id=client_id
            )
        state = richtext.fold_update(state, update)
        updates.append(update)
    return state, updates


def writers(state: str) -> set[int]:
    """The Yjs clients whose edits a rich text state holds: the clients of its document's state vector
    (a varint count, then varint client and clock pairs)."""
    doc = yjs.backend().new_doc()
    doc.apply_update(richtext.state_bytes(state))
    vector, position, numbers = doc.get_state(), 0, []
    while position < len(vector):
        value, shift = 0, 0
        while True:
            byte = vector[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        numbers.append(value)
    return set(numbers[1::2])


def random_edits(rng: random.Random, count: int) -> list[tuple[str, int, Any]]:
    pieces = ["x", "é", "🙂", "yjs ", "Ω", " ", "ab\n"]
    return [
        ("insert", rng.randrange(100), rng.choice(pieces))
        if rng.random() < 0.65
        else ("delete", rng.randrange(100), rng.randint(1, 4))
        for _ in range(count)
    ]


def in_pyodide(project: Path, request: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    node = shutil.which("node")
    assert node is not None
    done = subprocess.run(
        [node, str(SCRIPT), str(project), str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]  # (the head is minified Pyodide when it fails)
    assert done.stdout.count("\n") == 0, done.stdout  # nothing but the answer (no yjs warning either)
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("seed", [1, 2])
def test_yjs_in_pyodide_and_pycrdt_edits_merge_to_one_text(
    web_project: Path, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    initial = richtext.initial_update(INITIAL, client_id=richtext.client_id_for("desktop"))
    start = richtext.fold_update(None, initial)
    browser_id, desktop_id = richtext.client_id_for("browser"), richtext.client_id_for("desktop")
    # Fixed first edits at either end (so the expected text is known), then random ones on both sides.
    browser_edits = [("insert", 0, "B> "), *random_edits(rng, 25)]
    desktop_edits = [("insert", -1 % (len(INITIAL) + 1), " <D"), *random_edits(rng, 25)]
    desktop_state, desktop_updates = pycrdt_edits(start, desktop_edits, desktop_id)
    total = 1 + len(desktop_updates) + len(browser_edits)
    orders = [rng.sample(range(total), total) for _ in range(3)]

    answer = in_pyodide(
        web_project,
        {
            "initial": encode(initial),
            "clientId": browser_id,
            "edits": browser_edits,
            "remote": [encode(u) for u in rng.sample(desktop_updates, len(desktop_updates))],
            "orders": orders,
        },
        tmp_path,
    )
    assert answer["backend"] == "yjs" and yjs.backend().name == "pycrdt"
    browser_updates = [base64.b64decode(u) for u in answer["updates"]]
    assert len(browser_updates) == len(browser_edits)

    # pycrdt takes the browser's updates (any order) and ends with the browser's text.
    merged = desktop_state
    for update in rng.sample(browser_updates, len(browser_updates)):
        merged = richtext.fold_update(merged, update)
    text = richtext.text_of(merged)
    # One Yjs client per node in the browser too (yjs would pick a new one whenever its own edits came back).
    assert writers(merged) == {browser_id, desktop_id}
    assert text == answer["merged"]
    assert answer["orders"] == [text] * len(orders)  # folded afresh in the browser, in any order
    every = [initial, *desktop_updates, *browser_updates]
    for order, browser_state in zip(orders, answer["states"], strict=True):
        fresh = None
        for i in order:
            fresh = richtext.fold_update(fresh, every[i])
        assert richtext.text_of(fresh) == text  # and the same afresh with pycrdt
        # The same bytes too: a state is the canonical encoding of its document, whichever Yjs made it.
        assert fresh == browser_state == merged
    assert answer["state"] == merged  # the browser's incremental fold, in its own order
    # Both sides' edits are in it: the browser's text alone started with its prefix, the desktop's ended
    # with its suffix (unless a later random edit of the same side removed them).
    assert answer["alone"] != richtext.text_of(desktop_state)
    assert answer["garbage"] is True


def test_concurrent_edits_at_either_end_keep_both(web_project: Path, tmp_path: Path) -> None:
    initial = richtext.initial_update(INITIAL, client_id=richtext.client_id_for("desktop"))
    start = richtext.fold_update(None, initial)
    desktop_state, desktop_updates = pycrdt_edits(
        start, [("insert", len(INITIAL), " + python 🙂")], richtext.client_id_for("desktop")
    )
    answer = in_pyodide(
        web_project,
        {
            "initial": encode(initial),
            "clientId": richtext.client_id_for("browser"),
            "edits": [("insert", 0, "été, browser: "), ("delete", 0, 1)],
            "remote": [encode(u) for u in desktop_updates],
            "orders": [],
        },
        tmp_path,
    )
    expected = "té, browser: " + INITIAL + " + python 🙂"
    assert answer["alone"] == "té, browser: " + INITIAL
    assert answer["merged"] == expected
    merged = desktop_state
    for update in answer["updates"]:
        merged = richtext.fold_update(merged, base64.b64decode(update))
    assert richtext.text_of(merged) == expected
    assert answer["state"] == merged  # byte for byte, yjs in the browser and pycrdt here
