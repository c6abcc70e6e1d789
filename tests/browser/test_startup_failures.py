"""When the browser client cannot open its database: the page says what happened, with an error code and what
to do next, instead of a Python traceback, and nothing stored is deleted.

Two failures: the browser refuses storage (a private window, blocked site data: `indexedDB.open` and OPFS are
made to fail in the worker), and the stored copy of the database is damaged (garbage written to the OPFS file,
or garbage chunks to IndexedDB, where an earlier version kept it, before the app starts). The same reporting is
checked on CPython through `offline.worker.start`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from offline import OfflineError, create_app, define_schema, t
from offline.worker import start

from .support import OPEN_PAGE_DATABASE, database_name, run_in_browser, wrapped_worker
from .test_browser_client import START_TIMEOUT_MS

GARBAGE = b"these bytes are no SQLite database " * 500


# -- on CPython ---------------------------------------------------------------------------------------------


def test_a_damaged_database_file_is_refused_with_a_code_and_left_as_it_is(tmp_path: Path) -> None:
    schema = define_schema({"version": 1, "collections": {"items": {"fields": {"name": t.string()}}}})
    path = tmp_path / "app.db"
    path.write_bytes(GARBAGE)
    for _ in range(2):  # the second attempt fails the same way: the first one let go of the file
        with pytest.raises(OfflineError) as info:
            create_app(schema, path=str(path))
        assert info.value.code == "STORAGE_ERROR"
        assert info.value.context is not None
        assert info.value.context["reason"] == "corrupt" and info.value.context["path"] == str(path)
        assert "not a readable SQLite database" in info.value.message
    assert path.read_bytes() == GARBAGE


def test_the_worker_reports_a_damaged_database_to_the_page_as_a_fatal_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "startup_case_schema.py").write_text(
        "from offline import define_schema, t\n"
        "schema = define_schema({'version': 1, 'collections': {'items': {'fields': {'name': t.string()}}}})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "app.db"
    path.write_bytes(GARBAGE)
    posted: list[str] = []
    bridge = asyncio.run(start({"schemaModule": "startup_case_schema", "dbPath": str(path)}, posted.append))
    assert bridge is None  # the page was told why; the worker serves nothing
    (fatal,) = [json.loads(text) for text in posted]
    assert fatal["type"] == "fatal" and fatal["code"] == "STORAGE_ERROR"
    assert fatal["context"]["reason"] == "corrupt"
    assert "Traceback" not in fatal["message"]
    assert "damaged" in fatal["message"] and "site's data" in fatal["message"]  # and what to do about it
    assert path.read_bytes() == GARBAGE


def test_a_snapshot_that_does_not_open_is_replaced_by_a_new_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's snapshot written as the database (web/snapshot.js) but not opening here: deleted, and the
    app starts on a new database (synced over the socket), where a database of the device's own is kept."""
    (tmp_path / "snapshot_case_schema.py").write_text(
        "from offline import define_schema, t\n"
        "schema = define_schema({'version': 1, 'collections': {'items': {'fields': {'name': t.string()}}}})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "app.db"
    path.write_bytes(GARBAGE)
    (tmp_path / "app.db-journal").write_bytes(b"")
    posted: list[str] = []
    stages: list[str] = []
    config = {"schemaModule": "snapshot_case_schema", "dbPath": str(path), "snapshot": True}
    bridge = asyncio.run(start(config, posted.append, None, stages.append))
    assert bridge is not None
    try:
        assert not [text for text in posted if json.loads(text)["type"] == "fatal"]
        assert stages[:2] == ["snapshot-discarded", "app-opened"]
        assert bridge.app.collection("items").count() == 0
        assert path.read_bytes()[:16] == b"SQLite format 3\x00"
    finally:
        bridge.app.close()


# -- in Chromium --------------------------------------------------------------------------------------------

# The worker first loses the browser's storage (IndexedDB and OPFS, as blocked site data does), then runs the
# app's worker.js.
REFUSE_INDEXEDDB = wrapped_worker(
    "self.indexedDB.open = () => { throw new DOMException("
    "'The user denied permission to access the database.', 'UnknownError'); };\n"
    "navigator.storage.getDirectory = () => Promise.reject("
    "new DOMException('Storage directory access is denied.', 'SecurityError'));"
)


async def _failed_start(page: Any) -> dict[str, Any]:
    """Wait for the page to report that the app could not start; what it shows and the client's error."""
    from playwright.async_api import expect

    error = page.locator("#error")
    await expect(error).to_be_visible(timeout=START_TIMEOUT_MS)
    return {
        "error": await error.text_content(),
        "notices": await page.locator("#notices").text_content(),
        "status": await page.evaluate("window.offlineClient.status"),
    }


def _assert_clear(shown: dict[str, Any], *words: str) -> None:
    for text in (shown["error"], shown["notices"]):
        assert "Traceback" not in text and 'File "' not in text, text
    assert "(STORAGE_ERROR)" in shown["error"]
    assert shown["status"]["error"]["code"] == "STORAGE_ERROR"
    for word in words:
        assert word in shown["error"], shown["error"]


def test_a_browser_that_refuses_indexeddb_gets_a_clear_message(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:

    async def scenario(context: Any, base: str) -> None:
        await context.add_init_script(REFUSE_INDEXEDDB)
        page = await context.new_page()
        await page.goto(base + "/")
        shown = await _failed_start(page)
        _assert_clear(shown, "IndexedDB", "allow this site to store data", "reload")
        assert shown["status"]["error"]["context"]["reason"] == "unavailable"

    run_in_browser(chromium, web_project, tmp_path, scenario)


WRITE_GARBAGE = f"""
async ([name, bytes]) => {{
  const db = await {OPEN_PAGE_DATABASE};
  const data = new Uint8Array(bytes);
  const tx = db.transaction(["chunks", "meta"], "readwrite");
  tx.objectStore("chunks").put(data.buffer, 0);
  tx.objectStore("meta").put(data.length, "size");
  await new Promise((resolve, reject) => {{ tx.oncomplete = resolve; tx.onerror = () => reject(tx.error); }});
  db.close();
}}
"""

READ_CHUNK = """
async (name) => {
  const db = await new Promise((resolve, reject) => {
    const request = indexedDB.open(`offline:${name}`);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  const chunk = await new Promise((resolve, reject) => {
    const request = db.transaction("chunks").objectStore("chunks").get(0);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  db.close();
  return Array.from(new Uint8Array(chunk));
}
"""


def test_a_damaged_stored_database_gets_a_clear_message_and_is_kept(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    _damaged_copy_is_reported_and_kept(chromium, web_project, tmp_path, WRITE_GARBAGE, READ_CHUNK)


def _damaged_copy_is_reported_and_kept(
    chromium: str, web_project: Path, tmp_path: Path, write: str, read: str
) -> None:
    """The page's database stored damaged (``write``, a script run with [name, bytes]) before the app starts:
    the app says so, and ``read`` (run with the name) finds the damaged bytes as they were."""
    name = database_name(web_project)
    garbage = list(GARBAGE[:16384])

    async def scenario(context: Any, base: str) -> None:
        # A page of the same site that does not start the app: the damaged copy is stored from there.
        setup = await context.new_page()
        await setup.goto(base + "/config.js")
        await setup.evaluate(write, [name, garbage])
        page = await context.new_page()
        await page.goto(base + "/")
        shown = await _failed_start(page)
        _assert_clear(shown, "damaged", "site's data")
        assert shown["status"]["error"]["context"]["reason"] == "corrupt"
        await page.close()  # (its worker lets go of the file)
        # Nothing stored was deleted or overwritten.
        assert await setup.evaluate(read, name) == garbage

    run_in_browser(chromium, web_project, tmp_path, scenario)


WRITE_OPFS_GARBAGE = """
async ([name, bytes]) => {
  const root = await navigator.storage.getDirectory();
  const folder = await (await root.getDirectoryHandle("offline", { create: true })).getDirectoryHandle(name, { create: true });
  const writable = await (await folder.getFileHandle(`${name}.db`, { create: true })).createWritable();
  await writable.write(new Uint8Array(bytes));
  await writable.close();
}
"""

READ_OPFS = """
async (name) => {
  const root = await navigator.storage.getDirectory();
  const folder = await (await root.getDirectoryHandle("offline")).getDirectoryHandle(name);
  const handle = await folder.getFileHandle(`${name}.db`);
  for (let attempt = 0; ; attempt++) {
    try {
      return Array.from(new Uint8Array(await (await handle.getFile()).arrayBuffer()));
    } catch (error) {  // (the closed page's worker may still hold the file a moment)
      if (attempt > 100) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
"""


def test_a_damaged_database_in_opfs_gets_a_clear_message_and_is_kept(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    _damaged_copy_is_reported_and_kept(chromium, web_project, tmp_path, WRITE_OPFS_GARBAGE, READ_OPFS)
