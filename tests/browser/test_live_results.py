"""The page's copy of a live query (LiveResults in offline-client.js) kept from the worker's changes alone
ends up exactly as the query's own results, in SQLite's order: random writes on CPython's SQLite through
`WorkerBridge`, the messages replayed in Node.js, compared with `fetch()` after every refresh."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from offline import create_app, define_schema, t
from offline.worker import WorkerBridge

SCRIPT = Path(__file__).resolve().parents[1] / "js" / "live_results.mjs"

SCHEMA = define_schema(
    {
        "version": 1,
        "collections": {
            "items": {
                "fields": {
                    "name": t.string().optional(),
                    "rank": t.number().optional(),
                    "flag": t.boolean().default(False),
                    "tags": t.array(t.string()).default([]),
                }
            }
        },
    }
)
# Text where UTF-16 and SQLite (UTF-8) order differ: an astral character and one above U+E000.
NAMES = [None, "", "a", "B", "b", "ab", "é", "\U0001f600", "\ufb01", "z\U0001f600", "z\ufb01", "10", "9"]
RANKS = [None, -1, 0, 0.5, 1, 2, 10, 1e9]


def _random_changes(app: Any, rng: random.Random, ids: list[str]) -> None:
    for _ in range(rng.randint(1, 60)):  # a burst above the page's one-by-one limit now and then
        roll = rng.random()
        if roll < 0.5 or not ids:
            ids.append(
                app.items.insert(
                    {"name": rng.choice(NAMES), "rank": rng.choice(RANKS), "flag": rng.random() < 0.5}
                )["id"]
            )
        elif roll < 0.85:
            change = rng.choice([{"name": rng.choice(NAMES)}, {"rank": rng.choice(RANKS)}, {"flag": True}])
            app.items.update(rng.choice(ids), change)
        else:
            record_id = ids.pop(rng.randrange(len(ids)))
            app.items.delete(record_id)


@pytest.mark.parametrize(
    "query",
    [
        {"orderBy": [["name", False]]},
        {"where": {"flag": False}, "orderBy": [["rank", True], ["name", False]]},
        {"orderBy": [["rank", False]], "limit": 7},
        {},
    ],
)
def test_the_page_keeps_a_live_querys_results_in_sqlites_order(query: dict[str, Any], tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    app = create_app(SCHEMA, path=str(tmp_path / "live.db"))
    sent: list[str] = []
    expected: list[list[str]] = []
    bridge = WorkerBridge(app, post=sent.append)
    rng = random.Random(28)

    async def scenario() -> None:
        spec = json.dumps({"id": 1, "method": "subscribe", "collection": "items", "query": query, "sub": 1})
        await bridge.handle(spec)
        expected.append([r["id"] for r in bridge._query({"collection": "items", "query": query}).fetch()])
        ids: list[str] = []
        for _ in range(40):
            before = len(sent)
            _random_changes(app, rng, ids)
            await asyncio.sleep(0)  # the bridge refreshes once per loop turn
            if any(json.loads(text)["type"] == "changes" for text in sent[before:]):
                expected.append(
                    [r["id"] for r in bridge._query({"collection": "items", "query": query}).fetch()]
                )

    try:
        asyncio.run(scenario())
    finally:
        app.close()
    messages = [m for m in map(json.loads, sent) if m["type"] in ("snapshot", "changes")]
    feed = "\n".join([json.dumps({"orderBy": query.get("orderBy", [])}), *map(json.dumps, messages)])
    done = subprocess.run(
        [node, str(SCRIPT)], input=feed, capture_output=True, text=True, timeout=60, check=True
    )
    assert len(expected) > 10  # many refreshes were compared (fewer with a limit: most writes miss it)
    assert json.loads(done.stdout) == expected
