"""The browser client's storage and live queries at size: what a write leaves in the browser's storage (it
survives a reload as soon as its promise resolves; the database is kept in the Origin Private File System, or
in IndexedDB where the worker cannot write OPFS files synchronously, and a database kept in IndexedDB by an
earlier version moves to OPFS), live query changes reaching the page row by row, and the first sync of a
fresh browser showing its progress.

Same setup as test_browser_client.py: the `offline init` template served by a live server, headless
Chromium, every request checked to stay on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .support import database_name, run_in_browser, run_node_script, wrapped_worker
from .test_browser_client import START_TIMEOUT_MS, open_app

#: Enough records for a database file of many storage chunks (kept small: the big sizes are in bench/).
MANY = 2000


async def reload(page: Any) -> None:
    from playwright.async_api import expect

    await page.reload()
    await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=START_TIMEOUT_MS)


#: The worker's startup stages a reload reports to the page (`offlineClient.timings`), each with a stage it
#: must come after: the stored database is read while Python loads, and opened once both are there.
STAGES_AFTER = {
    "python-loaded": "starting",
    "storage-read": "starting",
    "code-loaded": "python-loaded",
    "python-imported": "code-loaded",
    "storage-opened": ("python-imported", "storage-read"),
    "app-opened": "storage-opened",
    "ready": "app-opened",
}


def check_stages(timings: dict[str, float]) -> None:
    for stage, after in STAGES_AFTER.items():
        assert stage in timings, f"no {stage!r} in {timings}"
        for earlier in (after,) if isinstance(after, str) else after:
            assert timings[earlier] <= timings[stage], f"{stage!r} before {earlier!r}: {timings}"


async def call(page: Any, script: str, *args: Any) -> Any:
    """Run ``script`` (the body of an async function of ``todos``, the page's collection, and ``args``)."""
    return await page.evaluate(
        f"async (args) => {{ const todos = window.offlineClient.collection('todos'); {script} }}", list(args)
    )


async def fill_list(page: Any, many: int, every_other_done: str) -> tuple[list[str], Any, Any]:
    """Insert ``many`` to-dos ``row 0000``, ``row 0001``... (``every_other_done``: a JavaScript field list
    of record ``i`` making every other one done) and check the page's list: windowed (a screenful of rows,
    not one per record), the first on top, the counts. Their ids, the count's and the rows' locators."""
    from playwright.async_api import expect

    ids: list[str] = await call(
        page,
        "const rows = await todos.insertMany(Array.from({ length: args[0] },"
        f" (_, i) => ({{ title: `row ${{String(i).padStart(4, '0')}}`, {every_other_done} }})));"
        "return rows.map((row) => row.id);",
        many,
    )
    count = page.locator("#count")
    await expect(count).to_have_text(f"{many // 2} left · {many} in total")
    rows = page.locator("#todos li")
    await expect(rows.first.locator(".title")).to_have_text("row 0000")
    assert 0 < await rows.count() < 100  # windowed: only the rows in view exist
    return ids, count, rows


#: Where the database `args` is kept: {"opfs": its file is in OPFS, "indexeddb": IndexedDB has its database}.
WHERE_STORED = """async (name) => {
  const indexeddb = (await indexedDB.databases()).some((db) => db.name === `offline:${name}`);
  let opfs = false;
  try {
    const root = await navigator.storage.getDirectory();
    const folder = await (await root.getDirectoryHandle("offline")).getDirectoryHandle(name);
    opfs = (await folder.getFileHandle(`${name}.db`)) !== null;
  } catch (error) {
    if (error.name !== "NotFoundError") throw error;
  }
  return { opfs, indexeddb };
}"""

# The worker of a browser without OPFS sync access handles (older browsers): it first loses them, then runs
# the app's worker.js (which resolves the sync URL against its location: the app's, not the wrapper's).
WITHOUT_OPFS = wrapped_worker(
    "delete FileSystemFileHandle.prototype.createSyncAccessHandle;\n"
    'Object.defineProperty(self, "location", { value: new URL(workerScript) });'
)


def test_every_write_survives_a_reload_as_soon_as_it_resolves(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """The durability promise, write after write, on a database that grows to many chunks: each reload
    (which drops the worker and its in-memory file) finds exactly what the resolved writes left."""

    async def scenario(context: Any, base: str) -> None:
        page = await open_app(context, base)
        first = await call(page, "return await todos.insert({ title: 'first' });")
        await reload(page)
        assert (await call(page, "return await todos.findById(args[0]);", first["id"]))["title"] == "first"

        await call(page, "await todos.update(args[0], { title: 'renamed', done: true });", first["id"])
        await reload(page)
        kept = await call(page, "return await todos.findById(args[0]);", first["id"])
        assert (kept["title"], kept["done"]) == ("renamed", True)

        # Thousands of records: the file grows over many chunks, then single writes land in the middle.
        ids = await call(
            page,
            "const rows = await todos.insertMany(Array.from({ length: args[0] }, (_, i) => ({ title: `r${i}` })));"
            "return rows.map((row) => row.id);",
            MANY,
        )
        await reload(page)
        # A warm reload reports its startup stages, the database read while Python loads.
        check_stages(await page.evaluate("window.offlineClient.timings"))
        assert await call(page, "return await todos.count();") == MANY + 1
        middle = ids[MANY // 2]
        await call(page, "await todos.update(args[0], { title: 'middle' });", middle)
        await call(page, "await todos.delete(args[0]);", ids[0])
        last = await call(page, "return await todos.insert({ title: 'last' });")
        await reload(page)
        assert (await call(page, "return await todos.findById(args[0]);", middle))["title"] == "middle"
        assert await call(page, "return await todos.findById(args[0]);", ids[0]) is None
        assert (await call(page, "return await todos.findById(args[0]);", last["id"]))["title"] == "last"
        assert await call(page, "return await todos.count();") == MANY + 1

        # Writes sent at once, none awaited before the next: all of them are kept once all resolved.
        await call(
            page,
            "await Promise.all(Array.from({ length: 50 }, (_, i) => todos.insert({ title: `burst ${i}` })));",
        )
        await reload(page)
        assert await call(page, "return await todos.where({ title: 'burst 49' }).count();") == 1
        assert await call(page, "return await todos.count();") == MANY + 51
        # All of it in OPFS: nothing of the database is kept in IndexedDB.
        where = await page.evaluate(WHERE_STORED, database_name(web_project))
        assert where == {"opfs": True, "indexeddb": False}

    run_in_browser(chromium, web_project, tmp_path, scenario)


def test_a_database_kept_in_indexeddb_moves_to_opfs_with_every_write(
    chromium: str, web_project: Path, tmp_path: Path
) -> None:
    """A browser without OPFS sync access handles keeps the database in IndexedDB (its writes survive a
    reload too); once the worker has them (an updated browser, or a database an earlier version of the app
    kept in IndexedDB), the database moves to OPFS at the next start with every write, and IndexedDB's copy
    is deleted."""
    name = database_name(web_project)

    async def scenario(context: Any, base: str) -> None:
        from playwright.async_api import expect

        old = await context.new_page()
        await old.add_init_script(WITHOUT_OPFS)
        await old.goto(base + "/")
        await expect(old.locator("body")).to_have_attribute("data-ready", "true", timeout=START_TIMEOUT_MS)
        await call(
            old, "await todos.insertMany(Array.from({ length: 300 }, (_, i) => ({ title: `r${i}` })));"
        )
        first = await call(old, "return await todos.insert({ title: 'first' });")
        await reload(old)
        await call(old, "await todos.update(args[0], { title: 'renamed' });", first["id"])
        assert await old.evaluate(WHERE_STORED, name) == {"opfs": False, "indexeddb": True}
        await old.close()

        page = await open_app(context, base)
        assert await call(page, "return await todos.count();") == 301
        assert (await call(page, "return await todos.findById(args[0]);", first["id"]))["title"] == "renamed"
        for _ in range(100):  # (IndexedDB's copy is deleted once the app opened the moved one)
            where = await page.evaluate(WHERE_STORED, name)
            if not where["indexeddb"]:
                break
            await asyncio.sleep(0.1)
        assert where == {"opfs": True, "indexeddb": False}
        await call(page, "await todos.insert({ title: 'after' });")
        await reload(page)
        assert await call(page, "return await todos.count();") == 302

    run_in_browser(chromium, web_project, tmp_path, scenario)


def test_live_changes_reach_the_page_row_by_row(chromium: str, web_project: Path, tmp_path: Path) -> None:
    """A long list is windowed (a screenful of rows in the page, not one per record); an insert, an update
    and a removal each change their own row; an app's subscription gets the same changes."""

    async def scenario(context: Any, base: str) -> None:
        from playwright.async_api import expect

        page = await open_app(context, base)
        ids, count, rows = await fill_list(page, MANY, "done: i % 2 === 1")

        # An application's own subscription: the whole results once, then only what changed.
        await page.evaluate(
            """() => {
                window.seen = [];
                window.offlineClient.collection("todos").orderBy("createdAt").subscribe((records, changes) =>
                    window.seen.push({ size: records.length, reset: changes.reset,
                        inserted: changes.inserted.map((r) => r.title), updated: changes.updated.map((r) => r.title),
                        previous: changes.previous.map((r) => r.title), removed: changes.removed.map((r) => r.title) }));
            }"""
        )
        # The first row's element is marked: only the changed row may be redrawn, never the list.
        await rows.first.evaluate("(row) => { row.dataset.marker = 'kept'; }")
        await call(page, "await todos.update(args[0], { title: 'row one, renamed' });", ids[1])
        await expect(page.locator(f"#todos li[data-id='{ids[1]}'] .title")).to_have_text("row one, renamed")
        await expect(rows.first).to_have_attribute("data-marker", "kept")
        await call(page, "await todos.update(args[0], { done: false });", ids[3])
        await expect(count).to_have_text(f"{MANY // 2 + 1} left · {MANY} in total")

        await call(page, "await todos.delete(args[0]);", ids[0])
        await expect(rows.first.locator(".title")).to_have_text("row one, renamed")
        await expect(count).to_have_text(f"{MANY // 2} left · {MANY - 1} in total")  # row 0 was open

        added = await call(page, "return await todos.insert({ title: 'added last' });")
        await expect(count).to_have_text(f"{MANY // 2 + 1} left · {MANY} in total")
        await page.locator("#list").evaluate("(list) => { list.scrollTop = list.scrollHeight; }")
        await expect(rows.last.locator(".title")).to_have_text("added last")
        assert await rows.count() < 100

        seen = await page.evaluate("window.seen")
        assert seen[0]["reset"] is True and seen[0]["size"] == MANY
        assert seen[1:] == [
            {
                "size": MANY,
                "reset": False,
                "inserted": [],
                "updated": ["row one, renamed"],
                "previous": ["row 0001"],
                "removed": [],
            },
            {
                "size": MANY,
                "reset": False,
                "inserted": [],
                "updated": ["row 0003"],
                "previous": ["row 0003"],
                "removed": [],
            },
            {
                "size": MANY - 1,
                "reset": False,
                "inserted": [],
                "updated": [],
                "previous": [],
                "removed": ["row 0000"],
            },
            {
                "size": MANY,
                "reset": False,
                "inserted": ["added last"],
                "updated": [],
                "previous": [],
                "removed": [],
            },
        ], seen
        assert added["id"] == await page.locator("#todos li").last.get_attribute("data-id")

    run_in_browser(chromium, web_project, tmp_path, scenario)


#: Records in the server's log before a fresh browser first syncs (several 500-operation batches).
SEEDED = 3000

WATCH_PROGRESS = """
window.progressSeen = [];
new MutationObserver(() => {
    const element = document.getElementById("sync-progress");
    if (element && !element.hidden) window.progressSeen.push([+element.dataset.received, +element.dataset.total]);
}).observe(document, { subtree: true, attributes: true, attributeFilter: ["data-received", "hidden"] });
"""


def test_a_first_sync_shows_its_progress(chromium: str, web_project: Path, tmp_path: Path) -> None:
    """A fresh browser receiving the server's log over the socket says how far it is, then shows every
    record (a server without snapshots: one with them sends the records in one file before the app is
    ready, see test_first_sync_snapshot.py)."""

    async def scenario(context: Any, base: str) -> None:
        from playwright.async_api import expect

        await context.add_init_script(WATCH_PROGRESS)
        page = await open_app(context, base)
        await expect(page.locator("#count")).to_have_text(
            f"{SEEDED - len(range(0, SEEDED, 3))} left · {SEEDED} in total", timeout=START_TIMEOUT_MS
        )
        progress = page.locator("#sync-progress")
        await expect(progress).to_be_hidden()
        await expect(progress).to_have_attribute("data-received", str(SEEDED))
        await expect(progress).to_have_attribute("data-total", str(SEEDED))
        seen = await page.evaluate("window.progressSeen")
        assert seen and all(total == SEEDED for _, total in seen), seen
        assert any(0 < received < SEEDED for received, _ in seen), seen  # shown on the way
        assert [received for received, _ in seen] == sorted(received for received, _ in seen)
        # Everything received was stored as it came: a reload offline shows it all.
        await expect(page.locator("#cache-status")).to_have_attribute(
            "data-cached", "true", timeout=START_TIMEOUT_MS
        )  # (registered once the first sync is over, then it downloads the build)
        await context.set_offline(True)
        await reload(page)
        await expect(page.locator("#count")).to_contain_text(f"{SEEDED} in total")

    run_in_browser(
        chromium, web_project, tmp_path, scenario, seed_count=SEEDED, limits={"snapshot_builds": 0}
    )


def test_a_worker_ended_between_any_two_writes_leaves_a_whole_database(web_project: Path) -> None:
    """A closed tab ends its worker between any two of its calls into the browser's storage. Under Pyodide's
    SQLite (the worker's settings) and storage.js's OPFS files, over stand-in sync access handles, every
    state the database and its journal pass through during multi-page transactions opens (SQLite rolling a
    hot journal back) as a whole database holding every saved transaction and the one under way either
    whole or not at all (tests/js/storage_cut.mjs). Before, SQLite's fsyncs (fdatasync, which Emscripten
    answers without asking the file system) never ordered the two files: pages of a transaction reached the
    database while its journal's header was still gathered in memory, and most states were damaged."""
    pyodide = web_project / "node_modules" / "pyodide" / "pyodide.mjs"
    seen = run_node_script("storage_cut.mjs", str(pyodide), timeout=180)
    assert seen["rows"] == 480
    assert seen["states"] > 100  # (every transaction passed through several states)
    assert seen["failures"] == []
    # Each write to the database came after the journal's bytes were flushed (what a power cut needs).
    assert seen["unorderedWrites"] == 0
