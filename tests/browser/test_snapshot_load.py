"""A fresh browser downloads the server's replica of its database while Pyodide loads (web/snapshot.js, issue
28) and writes it as its database file before Python opens it (web/storage.js): driven in Node.js against
the OPFS storage over stand-in sync access handles and a stand-in fetch (tests/js/snapshot_load.mjs).

Only a whole SQLite file of the snapshot format is kept; anything else (another answer, a broken or stalled
download, no answer) leaves the database new, for the socket's first sync, without an error. The file's
first 64 KB (its header page) are written last, so a tab closed at any point leaves either the whole file
or one the next start empties."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from offline.sync import snapshot

from .support import run_node_script

DECLINED = ["snapshot-requested", "snapshot-declined"]


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # A database of ~300 KB (many 4 KB pages past the 64 KB head), in rollback-journal mode as the server
    # sends it.
    path = tmp_path_factory.mktemp("snapshot") / "replica.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("CREATE TABLE records (id TEXT PRIMARY KEY, data TEXT)")
    conn.executemany("INSERT INTO records VALUES (?, ?)", ((f"r{i}", "x" * 200) for i in range(1200)))
    conn.commit()
    conn.close()
    seen: dict[str, Any] = run_node_script("snapshot_load.mjs", str(path))
    assert seen["databaseSize"] > 4 * seen["headSize"]
    return seen


def test_a_new_database_is_the_servers_snapshot_written_head_last(seen: dict[str, Any]) -> None:
    accepted = seen["accepted"]
    assert accepted["result"] is True
    assert accepted["whole"] and accepted["flushedWhole"] and not accepted["empty"]
    assert accepted["reports"] == ["snapshot-requested", "snapshot-answered", "snapshot-written"]
    (request,) = accepted["requests"]
    assert request == {
        "url": "http://127.0.0.1:8000/offline-sync/snapshot",
        "method": "POST",
        "headers": {"Content-Type": "application/json"},
        "body": {"format": snapshot.FORMAT, "offline": "0.1.0", "schemaVersion": 3, "syncScope": None},
    }
    log = accepted["log"]
    # Everything past the head first, flushed; then the head, flushed: the file is whole on the disk.
    head = log.index(["write", 0, seen["headSize"]])
    assert head == len(log) - 2 and log[-1] == ["flush"] and ["flush"] in log[:head]
    assert all(entry[1] >= seen["headSize"] for entry in log[:head] if entry[0] == "write")


def test_a_tab_closed_during_the_download_leaves_a_new_database_or_the_whole_one(
    seen: dict[str, Any],
) -> None:
    closed = seen["closedTab"]
    assert closed["writes"] > 10
    assert closed["reopened"] == ["empty"] * (closed["writes"] - 1) + ["whole"]


@pytest.mark.parametrize("case", ["noContent", "unauthorized", "otherFormat", "network", "neverAnswered"])
def test_any_other_answer_leaves_the_database_new_without_an_error(seen: dict[str, Any], case: str) -> None:
    outcome = seen[case]
    assert outcome["result"] is False
    assert outcome["reports"] == DECLINED
    assert outcome["size"] == 0 and outcome["empty"]
    assert not [entry for entry in outcome["log"] if entry[0] == "write"]  # nothing of it was stored
    (line,) = outcome["infos"]  # a console.info line, nothing the page shows
    assert "over the sync connection" in line


@pytest.mark.parametrize("case", ["notSqlite", "truncated", "stalled"])
def test_a_download_that_is_no_whole_database_is_removed_again(seen: dict[str, Any], case: str) -> None:
    outcome = seen[case]
    assert outcome["result"] is False
    assert outcome["reports"] == ["snapshot-requested", "snapshot-answered", "snapshot-declined"]
    assert outcome["size"] == 0 and outcome["empty"]
    if case == "notSqlite":  # (dropped at its first bytes)
        assert not [entry for entry in outcome["log"] if entry[0] == "write"]


@pytest.mark.parametrize("case", ["notNew", "otherServer", "olderBuild", "scoped"])
def test_no_snapshot_is_asked_for_when_it_could_not_be_used(seen: dict[str, Any], case: str) -> None:
    """A stored database (a reload), a sync server other than the page's, a config.js without the versions
    (an older build), a sync scope of the config (only Python can turn it into the handshake's filters)."""
    outcome = seen[case]
    assert outcome["result"] is False
    assert outcome["requests"] == [] and outcome["reports"] == []


def test_a_database_found_once_the_storage_is_open_is_kept(seen: dict[str, Any]) -> None:
    """The request goes out on a first look at the storage (storage.js's nothingStored), before it is open;
    a database the opened storage holds after all is kept, and the answer dropped."""
    outcome = seen["storedAfterAll"]
    assert outcome["result"] is False and outcome["whole"]
    assert outcome["reports"] == ["snapshot-requested", "snapshot-answered", "snapshot-declined"]
    assert not [entry for entry in outcome["log"] if entry[0] in ("write", "truncate")]
    assert seen["notNew"]["whole"]
