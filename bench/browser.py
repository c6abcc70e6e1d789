"""Browser client figures, in headless Chromium against a live server (``python -m bench browser``).

The `offline init` template is built (npm's cache in ~/.cache/offline-tests) and served; nothing the page
loads leaves loopback (the same guard as tests/browser). Figures:

- ``page_to_ready_cold_ms``: a first visit, nothing cached: from navigation start until the worker reports
  the app ready (Pyodide fetched and compiled, IndexedDB opened, the Python code unpacked and imported);
  ``cold_stages_ms`` splits it (when the page heard of each startup stage, since it started the worker:
  ``python-loaded``, ``storage-read`` (the stored database read from IndexedDB, while Python loads),
  ``code-loaded``, ``python-imported``, ``storage-opened``, ``app-opened``, ``ready``; a reload also has
  ``bytecode-loaded``: the app's modules compiled by an earlier start of the build, unpacked from the Cache
  Storage so importing skips compiling; a start without it reports ``bytecode-saved`` after ``ready``).
- ``page_to_ready_warm_ms``: a reload of the same page (the service worker answers from its cache).
- ``inserts_1000_sequential_s``: 1,000 ``insert`` calls from the page, each awaited before the next; each
  reply comes after the database was copied to IndexedDB. The page's list is subscribed, as in the app.
- ``inserts_1000_concurrent_s``: 1,000 calls sent at once (the copies to IndexedDB are shared).
- ``inserts_1000_one_batch_s``: one ``insertMany`` of 1,000 records (one transaction).
- ``synced_3000_s``: after the last insert returned, until the server had acknowledged all 3,000 operations
  (sync runs while the page writes, so this is only what is left).

At size (``at_size``, the table of issue 28; a fresh server and browser, the page's live list subscribed; in
a Chromium started on a fresh profile folder, as users run it, not a private context: ``browser_context``):

- ``insert_ms``: at 0, 10,000 and 50,000 local records, one awaited ``insert`` from the page (its reply
  comes once the write is in IndexedDB), median and p95 of 40; the records are added in between with
  ``insertMany`` (5,000 per call), and the timing starts once the server has acknowledged them.
- ``insert_cpu_ms``: the CPU time Chromium's processes used per timed insert, on average (the page, the
  worker, IndexedDB's storage process, the browser; the server is not counted).
- ``persist_unchanged_ms``: ``persist()`` with nothing to store, median of 20, at each size.
- ``ready_after_warm_reload_ms``: at each size, a reload until the worker reports the app ready (best of 2),
  and until the list shows every record (``list_shown_after_reload_ms``).
- ``renderer_rss_mb``: at 50,000 records, the resident memory of the app's renderer process (the page, its
  worker and the service worker run in it), as it is: what the target of issue 28 (<= 400 MB) reads.
  ``renderer_private_mb``: the part of it no other process shares (Chromium's code and fonts are mapped by
  every renderer). ``..._after_gc``: both again after a full garbage collection in the page and its
  workers. ``other_renderers_rss_mb``: Chromium's other renderers, not the app's (the spare renderer it
  keeps started for the next navigation, about 78 MB whatever the page does; its own user interface's
  renderer is left out). ``browser_process_rss_mb``: Chromium's browser process, not a renderer: a private
  context (as Playwright's are) keeps its IndexedDB and OPFS files there, in memory; a profile keeps them on
  disk.
- ``warm_reload_cpu_ms``: the CPU time Chromium's processes used from a reload until the list showed
  every record (the least of 2): on a shared machine, what a reload costs whatever the others do.
- ``warm_stages_ms``: what ``cold_stages_ms`` is for a first visit, for the fastest warm reload at each
  size (the stages run side by side: Python loading, the stored database read, then the app opening).
- ``first_sync``: a fresh browser opening the page of a server whose log holds 20,000 or 50,000 to-dos:
  from navigation until the list says it shows all of them (``shown_ms``, read on the page when it drew
  them), and from ready until then; the CPU time Chromium's processes used until then (``shown_cpu_ms``)
  and from ready (``shown_after_ready_cpu_ms``); ``downloaded_mb``: what the page's HTTP requests brought
  until then, as sent (the build's gzip copies where the browser accepts them). ``cold_path``: each stage,
  in order, with when it was reached from navigation and the CPU time Chromium had used by then
  (``cpu_ms``; of it ``worker_cpu_ms``:
  the worker's thread, Python; ``page_cpu_ms``: the renderers' main threads; ``v8_background_cpu_ms``: V8's
  threads compiling WebAssembly and JavaScript); the stages: ``created`` (the page's script ran),
  ``starting`` (the worker's), ``fetched <file>`` (Pyodide's files and the code archive arrived),
  ``python-loaded``, ``code-loaded``, ``python-imported``, ``snapshot-requested``, ``snapshot-answered`` and
  ``snapshot-written`` (the server's replica of the database, built by the server and written as the
  worker's database while Python loads: web/snapshot.js; ``snapshot-declined`` when the server sent none and
  the records come over the socket instead), ``storage-opened``, ``sync-socket-opened`` and
  ``sync-socket-handed-over`` (the sync connection the worker opens while the app opens, given to its sync
  engine: web/early-socket.js; ``-replaced`` or ``-closed`` when it was not), ``app-opened``, ``ready``,
  ``results-first-part`` (the page got the first part of its list's results), ``sync-connected`` (the first
  handshake accepted), ``first-states`` (the first records stored from the socket; none after a snapshot),
  ``first-records-shown``, ``shown``. ``cpu_by_thread_ms``: Chromium's CPU time until shown by process
  type and thread. On a shared machine the CPU times are the figures to compare; wall times say how busy
  the others were. The server sends a fresh device its records' states (the default for a log this long),
  as one snapshot file where it builds them (the default), here once the server has that file ready
  (``snapshot_prepared_s``: how long after it started; a server without sign-in builds it as it starts and
  whenever its log has moved and stayed still, so a device rarely waits for one);
  ``by_operations``: the same with a server that streams every operation instead (``state_sync_after``
  above the log's length), for comparison. ``python -m bench.browser first-sync N... [--states-only]`` runs
  these figures alone (``--states-only``: without ``by_operations``), with the load average.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

SEQUENTIAL = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    for (let i = 0; i < n; i++) await todos.insert({ title: `sequential ${i}` });
    return performance.now() - start;
}"""
CONCURRENT = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    await Promise.all(Array.from({ length: n }, (_, i) => todos.insert({ title: `concurrent ${i}` })));
    return performance.now() - start;
}"""
BATCH = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const start = performance.now();
    await todos.insertMany(Array.from({ length: n }, (_, i) => ({ title: `batch ${i}` })));
    return performance.now() - start;
}"""


TIMED_INSERTS = """async (n) => {
    const todos = window.offlineClient.collection("todos");
    const times = [];
    for (let i = 0; i < n; i++) {
        const start = performance.now();
        await todos.insert({ title: `timed ${i}` });
        times.push(performance.now() - start);
    }
    return times;
}"""
TIMED_PERSISTS = """async (n) => {
    const times = [];
    for (let i = 0; i < n; i++) {
        const start = performance.now();
        await window.offlineClient.persist();
        times.push(performance.now() - start);
    }
    return times;
}"""
GROW = """async ([from, to]) => {
    const todos = window.offlineClient.collection("todos");
    for (let at = from; at < to; at += 5000) {
        const n = Math.min(5000, to - at);
        await todos.insertMany(Array.from({ length: n }, (_, i) => ({ title: `bulk ${at + i}` })));
    }
}"""
SIZES = (0, 10_000, 50_000)
FIRST_SYNC = (20_000, 50_000)


def _note(what: str, figures: Any) -> None:
    """Progress on stderr: the figures of one step, as soon as they are measured (the run is long)."""
    print(f"[bench browser] {what}: {figures}", file=sys.stderr, flush=True)


def _median_p95(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median": round(statistics.median(ordered), 1),
        "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1),
    }


def _renderers() -> list[dict[str, Any]]:
    """The Chromium renderers this process started (descendants only: other programs on the machine may run
    Chromium too), largest first: ``rss_mb`` (resident), ``private_mb`` (resident and not shared with
    another process: what Chromium's task manager calls the memory footprint, without the browser's code
    and fonts every renderer maps) and ``app``: whether it runs the app (the page's process, which also runs
    its dedicated worker and the service worker: it has their threads). The others are the spare renderer
    Chromium keeps started for the next navigation (about 78 MB whatever the page does) and Chromium's own
    user interface (``--top-chrome-webui``, about 160 MB in headless Chromium 156), left out."""
    parents: dict[int, int] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    me = os.getpid()

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = parents.get(pid, 0)
        return False

    found = []
    for pid, command in commands.items():
        # (Chromium rewrites its processes' titles: the arguments are one space-separated string there.)
        browser = b"chrom" in command.split(b"\0")[0] and b"--type=" not in command
        if (
            not mine(pid)
            or not (browser or b"--type=renderer" in command)
            or b"--top-chrome-webui" in command
        ):
            continue
        with contextlib.suppress(OSError, ValueError):
            memory = {}
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("Rss", "Private_Clean", "Private_Dirty"):
                    memory[key] = int(value.split()[0]) * 1024
            threads = {(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()}
            found.append(
                {
                    "rss_mb": round(memory["Rss"] / 1e6, 1),
                    "private_mb": round((memory["Private_Clean"] + memory["Private_Dirty"]) / 1e6, 1),
                    "app": not browser
                    and any(name.startswith(("DedicatedWorker", "ServiceWorker")) for name in threads),
                    "browser": browser,
                }
            )
    return sorted(found, key=lambda renderer: -float(renderer["rss_mb"]))


def _app_memory(renderers: list[dict[str, Any]]) -> dict[str, float]:
    app = [renderer for renderer in renderers if renderer["app"]]
    return {
        "rss_mb": round(sum(renderer["rss_mb"] for renderer in app), 1),
        "private_mb": round(sum(renderer["private_mb"] for renderer in app), 1),
    }


def _descendants() -> dict[int, list[str]]:
    """The fields of /proc/PID/stat after the command name, for every process this process started (directly
    or not): Chromium's processes and Playwright's driver."""
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
    parents = {pid: int(fields[1]) for pid, fields in stats.items()}
    me = os.getpid()

    def mine(pid: int) -> bool:
        pid = parents.get(pid, 0)
        while pid > 1:
            if pid == me:
                return True
            pid = parents.get(pid, 0)
        return False

    return {pid: fields for pid, fields in stats.items() if mine(pid)}


def _chromium_cpu_ms() -> float:
    """CPU time (user and system, ms) used so far by the processes this process started (Chromium's and
    the live server's threads live in this process and are not counted): on a shared machine wall time
    says how busy the others were, CPU time what a reload cost."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = sum(int(fields[11]) + int(fields[12]) for fields in _descendants().values())  # utime, stime
    return used * 1000 / ticks


async def _collect_garbage(browser: Any) -> None:
    """A full garbage collection in the page, its worker and the service worker (what the resident memory
    holds beyond their live objects depends on when V8 last collected: tens of MB either way)."""
    import json

    session = await browser.new_browser_cdp_session()
    for target in (await session.send("Target.getTargets"))["targetInfos"]:
        if target["type"] not in ("page", "worker", "service_worker"):
            continue
        attached = await session.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": False}
        )
        message = json.dumps({"id": 1, "method": "HeapProfiler.collectGarbage"})
        await session.send(
            "Target.sendMessageToTarget", {"sessionId": attached["sessionId"], "message": message}
        )
    await asyncio.sleep(3)  # (the messages are not answered here: give the collections time to run)
    await session.detach()


async def _shown(page: Any, count: int, timeout_ms: int = 600_000) -> None:
    from playwright.async_api import expect

    await expect(page.locator("#count")).to_contain_text(f" {count} in total", timeout=timeout_ms)


async def _synced(page: Any) -> None:
    from playwright.async_api import expect

    badge = page.locator("#sync-status")
    await expect(badge).to_have_attribute("data-pending", "0", timeout=900_000)
    await expect(badge).to_have_attribute("data-status", "connected", timeout=900_000)


async def _ready(page: Any) -> None:
    from playwright.async_api import expect

    await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=120_000)


@contextlib.asynccontextmanager
async def _new_page(
    executable: str, timeout_ms: int, *, profile: bool = False
) -> AsyncIterator[tuple[Any, Any]]:
    """(browser, page): a fresh guarded Chromium and a page in a new context, closed at the end; with
    ``profile``, a page in the default context of a Chromium on its own profile folder instead."""
    from tests.browser.support import guarded_browser, new_context

    if profile:
        async with _profile_page(executable, timeout_ms) as (browser, page):
            yield browser, page
        return
    async with guarded_browser(executable) as (browser, guard):
        context = await new_context(browser, guard)
        page = await context.new_page()
        page.set_default_timeout(timeout_ms)
        yield browser, page
        await context.close()


@contextlib.asynccontextmanager
async def _profile_page(executable: str, timeout_ms: int) -> AsyncIterator[tuple[Any, Any]]:
    """(browser, page) in a Chromium started on a fresh profile folder, reached over the DevTools protocol.

    Playwright's contexts are private windows: there every OPFS call is a round trip to the browser process
    (0.3-0.9 ms, against microseconds in a profile) and the files sit in its memory, so a private context
    measures a browser no user runs. Playwright's own persistent context gives no browser-level DevTools
    session (the garbage collection below needs one), so Chromium is started here and connected to."""
    import re
    import subprocess
    import threading

    from playwright.async_api import async_playwright

    from tests.browser.support import CHROMIUM_ARGS

    folder = tempfile.mkdtemp(prefix="offline-bench-profile-")
    try:
        chromium = subprocess.Popen(
            [
                executable,
                *CHROMIUM_ARGS,
                "--headless",
                # What Playwright passes when it launches Chromium itself: a headless page is never a
                # background one (timers and IPC would be throttled, and wall times measure that).
                "--disable-background-timer-throttling",
                "--disable-backgrounding-occluded-windows",
                "--disable-renderer-backgrounding",
                "--disable-ipc-flooding-protection",
                "--disable-hang-monitor",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--mute-audio",
                "--remote-debugging-port=0",
                f"--user-data-dir={folder}",
                # Nothing off loopback (which Chromium never proxies) may load: a proxy that refuses.
                "--proxy-server=http://127.0.0.1:9",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert chromium.stderr is not None
            endpoint = ""
            for line in chromium.stderr:  # (Chromium prints its DevTools address once it listens)
                found = re.search(r"DevTools listening on (ws://\S+)", line)
                if found:
                    endpoint = found.group(1)
                    break
            if not endpoint:
                raise RuntimeError(f"Chromium exited ({chromium.wait()}) before its DevTools endpoint was up")
            # Keep reading what Chromium logs: a full pipe would stop it mid-measurement.
            threading.Thread(target=chromium.stderr.read, name="bench-chromium-stderr", daemon=True).start()
            async with async_playwright() as playwright:
                browser = await playwright.chromium.connect_over_cdp(endpoint)
                page = await browser.contexts[0].new_page()
                await page.set_viewport_size({"width": 900, "height": 800})
                page.set_default_timeout(timeout_ms)
                yield browser, page
                await browser.close()
        finally:
            chromium.terminate()
            try:
                chromium.wait(10)
            except subprocess.TimeoutExpired:
                chromium.kill()
                chromium.wait()
    finally:
        # Chromium's helper processes may still write into the profile for a moment after the browser
        # process exited ("Directory not empty" on the first try): retry, then leave what is left.
        for _ in range(40):
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.exists(folder):
                break
            time.sleep(0.25)


async def _at_size(
    executable: str, base: str, sizes: tuple[int, ...] = SIZES, *, profile: bool = True
) -> dict[str, Any]:
    """Inserts, persist and reload at 0 / 10,000 / 50,000 local records; memory at the largest. In a
    Chromium profile (what users run) unless ``profile`` is false (a private context, as the tests use)."""
    figures: dict[str, Any] = {"insert_ms": {}, "insert_cpu_ms": {}, "persist_unchanged_ms": {}}
    figures["ready_after_warm_reload_ms"] = {}
    figures["warm_stages_ms"] = {}
    figures["warm_reload_cpu_ms"] = {}
    figures["list_shown_after_reload_ms"] = {}
    async with _new_page(executable, 600_000, profile=profile) as (browser, page):
        await page.goto(base + "/")
        await _ready(page)
        # The page registers its service worker once the first sync settles, and its install downloads and
        # stores the whole build: let that finish before timing, or it is counted in the figures at 0.
        await page.evaluate(SERVICE_WORKER_READY)
        size = 0
        for target in sizes:
            await page.evaluate(GROW, [size, target])
            size = target
            await _shown(page, size)
            await _synced(page)  # (else the timed inserts share the worker with uploading the new records)
            cpu_before = _chromium_cpu_ms()
            times = await page.evaluate(TIMED_INSERTS, 40)
            insert_cpu = (_chromium_cpu_ms() - cpu_before) / 40
            size += 40
            figures["insert_ms"][str(target)] = _median_p95(times)
            figures["insert_cpu_ms"][str(target)] = round(insert_cpu, 1)
            persists = await page.evaluate(TIMED_PERSISTS, 20)
            figures["persist_unchanged_ms"][str(target)] = round(statistics.median(persists), 1)
            ready, shown, stages, cpu = [], [], [], []
            for _ in range(2):
                started = time.perf_counter()
                cpu_before = _chromium_cpu_ms()
                await page.reload()
                await _ready(page)
                timings = await page.evaluate("window.offlineClient.timings")
                ready.append(timings["ready"])
                stages.append(_stages(timings))
                await _shown(page, size)
                shown.append((time.perf_counter() - started) * 1000)
                cpu.append(_chromium_cpu_ms() - cpu_before)
            figures["ready_after_warm_reload_ms"][str(target)] = round(min(ready))
            figures["warm_stages_ms"][str(target)] = stages[ready.index(min(ready))]
            # Chromium's CPU time from the reload until the list showed every record (least of the two).
            figures["warm_reload_cpu_ms"][str(target)] = round(min(cpu))
            figures["list_shown_after_reload_ms"][str(target)] = round(min(shown))
            _note(f"at {target} records", {name: value[str(target)] for name, value in figures.items()})
        # The app's renderer as it is (what the target of issue 28 reads: a user's browser collects when V8
        # decides, not when asked), then after a full garbage collection.
        renderers = _renderers()
        memory = _app_memory(renderers)
        figures[f"renderer_rss_mb_at_{size - 40}"] = memory["rss_mb"]
        figures[f"renderer_private_mb_at_{size - 40}"] = memory["private_mb"]
        figures[f"other_renderers_rss_mb_at_{size - 40}"] = [
            r["rss_mb"] for r in renderers if not r["app"] and not r["browser"]
        ]
        figures[f"browser_process_rss_mb_at_{size - 40}"] = [r["rss_mb"] for r in renderers if r["browser"]]
        await _collect_garbage(browser)
        memory = _app_memory(_renderers())
        figures[f"renderer_rss_mb_after_gc_at_{size - 40}"] = memory["rss_mb"]
        figures[f"renderer_private_mb_after_gc_at_{size - 40}"] = memory["private_mb"]
    figures["browser_context"] = "profile" if profile else "private"
    return figures


#: Resolves once the page's service worker is active (or after 120 s, or at once without service workers).
SERVICE_WORKER_READY = """Promise.race([
    navigator.serviceWorker ? navigator.serviceWorker.ready.then(() => true) : Promise.resolve(false),
    new Promise((resolve) => setTimeout(() => resolve(false), 120000)),
])"""


#: Records, on the page, when the list first showed records and when it showed each count (performance.now(),
#: ms from navigation): the moment the page drew them, not when the bench next polled.
SHOWN_WATCH = """(() => {
    const shown = (window.__benchShown = {});
    const watch = () => {
        const count = document.querySelector("#count");
        if (!count) return; // (not the app's page: the blank one a new tab starts with)
        const note = () => {
            const match = / (\\d+) in total/.exec(count.textContent);
            if (!match || Number(match[1]) === 0) return;
            shown.first = shown.first || performance.now();
            shown[match[1]] = shown[match[1]] || performance.now();
        };
        new MutationObserver(note).observe(count, { childList: true, characterData: true, subtree: true });
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
    else watch();
})()"""
#: The files of a cold start whose arrival is a stage of its own (the first response for each, by the worker).
FETCHED = ("pyodide/pyodide.asm.mjs", "pyodide/pyodide.asm.wasm", "pyodide/python_stdlib.zip", "py/app.")


class _CpuSampler:
    """Samples the CPU time of Chromium's threads every 20 ms while a page loads, so each stage of a cold start
    can be given the CPU time spent until it: on a shared machine, what a start costs whatever the others do
    (wall time says how busy they were). Kept per thread kind: the page's worker (Python), the renderers'
    main threads (the page), and everything Chromium ran (V8's compiler threads, the network, storage)."""

    def __init__(self) -> None:
        import threading

        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cpu-sampler", daemon=True)

    def __enter__(self) -> _CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _read(self, pids: list[int]) -> dict[str, float]:
        ms_per_tick = 1000 / os.sysconf("SC_CLK_TCK")
        used = {"worker": 0.0, "page": 0.0, "v8": 0.0, "chromium": 0.0}
        for pid in pids:
            try:
                tasks = list(Path(f"/proc/{pid}/task").iterdir())
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"chrom" not in command:
                continue  # (Playwright's driver, also started by this process: the bench's, not the app's)
            kind = "browser"
            if b"--type=" in command:
                kind = command.split(b"--type=", 1)[1].split(b" ")[0].split(b"\0")[0].decode()
            for task in tasks:
                try:
                    text = (task / "stat").read_text()
                except OSError:
                    continue
                name = text[text.index("(") + 1 : text.rindex(")")]
                fields = text.rsplit(")", 1)[1].split()
                ms = (int(fields[11]) + int(fields[12])) * ms_per_tick
                used["chromium"] += ms
                key = f"{kind}/{name}"  # (every thread by process type and name: to see where CPU went)
                used[key] = used.get(key, 0.0) + ms
                if name == "DedicatedWorker":
                    used["worker"] += ms
                elif kind == "renderer" and task.name == str(pid):
                    used["page"] += ms  # (a renderer's main thread: the page's, or its service worker's)
                elif kind == "renderer" and name.startswith("ThreadPool"):
                    used["v8"] += ms  # (V8's background work: compiling JavaScript and WebAssembly, GC)
        return used

    def _run(self) -> None:
        pids: list[int] = []
        found_at = 0.0
        while not self._stop.is_set():
            now = time.time()
            if now - found_at > 0.5:
                pids, found_at = list(_descendants()), now
            self.samples.append((now * 1000, self._read(pids)))
            self._stop.wait(0.02)

    def at(self, epoch_ms: float) -> dict[str, float]:
        """The CPU time used by then (the last sample before it)."""
        before = [used for at, used in self.samples if at <= epoch_ms]
        return before[-1] if before else self.samples[0][1]


async def _first_sync(executable: str, base: str, count: int, *, profile: bool = True) -> dict[str, Any]:
    """A fresh browser opening the page until it shows ``count`` records, split into the stages of its cold
    path (`cold_path`: when each was reached, from navigation, and the CPU time Chromium had used by then:
    all of it, the worker's thread, the page's). In a fresh Chromium profile unless ``profile`` is false."""
    async with _new_page(executable, 600_000, profile=profile) as (_, page):
        context = page.context
        await context.add_init_script(SHOWN_WATCH)
        arrived: dict[str, float] = {}

        requests: list[Any] = []

        def finished(request: Any) -> None:
            requests.append(request)
            for name in FETCHED:
                path = request.url.removeprefix(base + "/")
                if path.startswith(name) and path not in arrived and request.timing["responseEnd"] >= 0:
                    arrived[path] = request.timing["startTime"] + request.timing["responseEnd"]

        context.on("requestfinished", finished)
        with _CpuSampler() as sampler:
            cpu_before = _chromium_cpu_ms()
            await page.goto(base + "/")
            await _ready(page)
            await page.wait_for_function(
                f"() => window.__benchShown && window.__benchShown[{count}]", polling=50, timeout=600_000
            )
            cpu_all = _chromium_cpu_ms() - cpu_before
            origin = await page.evaluate("performance.timeOrigin")
            timings = await page.evaluate("window.offlineClient.timings")
            shown = await page.evaluate("window.__benchShown")
        # What came over the network until then, as sent (gzip-encoded where the server sent the build's
        # gzip copy): the page's, its worker's and (if it started) the service worker's requests, those
        # that ended before the list was shown (the service worker's install may begin just after).
        until = origin + shown[str(count)]
        done = [r for r in list(requests) if r.timing["startTime"] + r.timing["responseEnd"] <= until]
        sizes = [await request.sizes() for request in done]
        downloaded = sum(size["responseBodySize"] + size["responseHeadersSize"] for size in sizes)
        stages = {name: at for name, at in timings.items() if name != "bytecode-saved"}
        stages["first-records-shown"] = shown["first"]
        stages["shown"] = shown[str(count)]
        for path, at in arrived.items():
            stages[f"fetched {path}"] = at - origin
        start = sampler.at(origin)
        cold_path = []
        for name, at in sorted(stages.items(), key=lambda item: item[1]):
            used = sampler.at(origin + at)
            cold_path.append(
                {
                    "stage": name,
                    "ms": round(at),
                    "cpu_ms": round(used["chromium"] - start["chromium"]),
                    "worker_cpu_ms": round(used["worker"] - start["worker"]),
                    "page_cpu_ms": round(used["page"] - start["page"]),
                    "v8_background_cpu_ms": round(used["v8"] - start["v8"]),
                }
            )
        after_ready = (
            sampler.at(origin + stages["shown"])["chromium"]
            - sampler.at(origin + stages["ready"])["chromium"]
        )
        figures = {
            "shown_ms": round(stages["shown"]),
            "shown_after_ready_ms": round(stages["shown"] - stages["ready"]),
            "shown_cpu_ms": round(cpu_all),
            "shown_after_ready_cpu_ms": round(after_ready),
            "downloaded_mb": round(downloaded / 1e6, 2),
            "cold_path": cold_path,
        }
        # Where Chromium's CPU time went until the list showed every record, by process type and thread
        # (renderer/DedicatedWorker: Python; renderer/ThreadPoolForeg: V8 compiling; the others: pages,
        # network, storage), the largest first.
        end = sampler.at(origin + stages["shown"])
        spent = {key: end[key] - start.get(key, 0.0) for key in end if "/" in key}
        figures["cpu_by_thread_ms"] = {
            key: round(ms) for key, ms in sorted(spent.items(), key=lambda item: -item[1])[:10] if ms > 0
        }
    return figures


def _stages(timings: dict[str, float]) -> dict[str, int]:
    created = timings.get("created", 0.0)
    return {name: round(value - created) for name, value in timings.items() if name != "created"}


async def _measure(executable: str, base: str, count: int) -> dict[str, Any]:
    from playwright.async_api import expect

    figures: dict[str, Any] = {}
    async with _new_page(executable, 120_000) as (_, page):
        await page.goto(base + "/")
        await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=120_000)
        timings = await page.evaluate("window.offlineClient.timings")
        figures["page_to_ready_cold_ms"] = round(timings["ready"])
        figures["cold_stages_ms"] = _stages(timings)
        await expect(page.locator("#cache-status")).to_have_attribute("data-cached", "true", timeout=120_000)
        await expect(page.locator("#sync-status")).to_have_attribute("data-status", "connected")

        warm = []
        for _ in range(2):
            await page.reload()
            await expect(page.locator("body")).to_have_attribute("data-ready", "true", timeout=120_000)
            warm.append((await page.evaluate("window.offlineClient.timings"))["ready"])
        figures["page_to_ready_warm_ms"] = round(min(warm))
        await expect(page.locator("#sync-status")).to_have_attribute("data-status", "connected")

        figures["inserts_1000_sequential_s"] = round(await page.evaluate(SEQUENTIAL, count) / 1000, 3)
        figures["inserts_1000_concurrent_s"] = round(await page.evaluate(CONCURRENT, count) / 1000, 3)
        figures["inserts_1000_one_batch_s"] = round(await page.evaluate(BATCH, count) / 1000, 3)
        start = time.perf_counter()
        badge = page.locator("#sync-status")
        await expect(badge).to_have_attribute("data-pending", "0", timeout=300_000)
        await expect(badge).to_have_attribute("data-status", "connected")
        figures["synced_3000_s"] = round(time.perf_counter() - start, 3)
        assert await page.evaluate("window.offlineClient.collection('todos').count()") == 3 * count
    return figures


class _Project(NamedTuple):
    """Chromium and a project made by ``offline init`` and built, in a temporary folder."""

    executable: str
    schema: Any
    dist: Path
    folder: Path
    build_s: float


def _missing() -> dict[str, Any] | None:
    """The figures of a run that cannot measure (what is missing), or None."""
    from tests.browser.support import missing_tools

    problems = missing_tools()
    return {"skipped": "; ".join(problems)} if problems else None


@contextlib.contextmanager
def _project() -> Iterator[_Project]:
    """A `_Project`, removed at the end (call `_missing` first)."""
    from tests.browser.support import chromium_path, init_project, load_module

    executable = chromium_path()
    assert executable is not None
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        project = init_project(Path(folder))
        build_s = time.perf_counter() - started
        schema = load_module(project / "schema.py", "bench_browser_schema").schema
        yield _Project(executable, schema, project / "dist", Path(folder), build_s)


def run(count: int = 1000, *, at_size: bool = True) -> dict[str, Any]:
    from tests.browser.support import live_server

    skipped = _missing()
    if skipped:
        return skipped
    with _project() as (executable, schema, dist, folder, build_s):
        size = sum(p.stat().st_size for p in dist.rglob("*") if p.is_file() and p.suffix != ".gz")
        with live_server(schema, dist, folder / "server.db") as live:
            figures = asyncio.run(_measure(executable, live.url, count))
        if at_size:
            with live_server(schema, dist, folder / "size-server.db") as live:
                figures["at_size"] = asyncio.run(_at_size(executable, live.url))
            _note("at size", figures["at_size"])
            figures["first_sync"] = _first_syncs(executable, schema, dist, folder, FIRST_SYNC)
    figures["init_and_build_s"] = round(build_s, 2)
    figures["dist_mb"] = round(size / 1e6, 1)
    return figures


def _first_syncs(
    executable: str,
    schema: Any,
    dist: Path,
    folder: Path,
    sizes: tuple[int, ...],
    *,
    by_operations: bool = True,
    profile: bool = True,
) -> dict[str, Any]:
    """`_first_sync` at each size, by record states (the default) and by operations."""
    from tests.browser.support import live_server

    out: dict[str, Any] = {}
    for n in sizes:
        figures: dict[str, Any] = {}
        modes = [("states", None), ("by_operations", {"state_sync_after": 10 * n})]
        for mode, limits in modes if by_operations else modes[:1]:
            db = folder / f"seeded-{n}-{mode}.db"
            with live_server(schema, dist, db, seed_count=n, limits=limits) as live:
                prepared_s = _snapshot_prepared(live) if limits is None else None
                measured = asyncio.run(_first_sync(executable, live.url, n, profile=profile))
                if prepared_s is not None:
                    measured["snapshot_prepared_s"] = prepared_s
            if limits is None:
                figures.update(measured)
            else:
                figures[mode] = measured
        figures["browser_context"] = "profile" if profile else "private"
        out[str(n)] = figures
        _note(f"first sync of {n}", figures)
    return out


def _snapshot_prepared(live: Any, timeout: float = 300.0) -> float:
    """Wait until the server has its open scope's snapshot ready (built in the background as it starts:
    `server_runtime.snapshot`), as a server that has been up a while has; the seconds it took."""
    start = time.perf_counter()
    while live.server.sync.counters["snapshots_prepared"] < 1:
        if time.perf_counter() - start > timeout:
            raise RuntimeError("the server did not prepare its snapshot")
        time.sleep(0.05)
    return round(time.perf_counter() - start, 2)


def run_first_sync(
    sizes: tuple[int, ...] = FIRST_SYNC, *, by_operations: bool = True, profile: bool = True
) -> dict[str, Any]:
    """Only the first-sync figures, at ``sizes`` (``python -m bench.browser first-sync 20000``; with
    ``--states-only``, without the by-operations comparison; with ``--private``, in a private context)."""
    skipped = _missing()
    if skipped:
        return skipped
    with _project() as project:
        figures = _first_syncs(
            project.executable,
            project.schema,
            project.dist,
            project.folder,
            sizes,
            by_operations=by_operations,
            profile=profile,
        )
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return figures


def run_at_size(sizes: tuple[int, ...] = SIZES, *, profile: bool = True) -> dict[str, Any]:
    """Only the at-size figures, at ``sizes`` (``python -m bench.browser at-size 50000``; with
    ``--private``, in a private context as the tests use instead of a Chromium profile)."""
    from tests.browser.support import live_server

    skipped = _missing()
    if skipped:
        return skipped
    with (
        _project() as project,
        live_server(project.schema, project.dist, project.folder / "size-server.db") as live,
    ):
        return asyncio.run(_at_size(project.executable, live.url, sizes, profile=profile))


if __name__ == "__main__":
    import json

    if {"-h", "--help"} & set(sys.argv[1:]):
        # (Without this, any argument not naming a section ran the whole bench, minutes of Chromium.)
        sys.stdout.write(
            "usage: python -m bench.browser [at-size [N ...] [--private] | first-sync [N ...] "
            "[--states-only] [--private]]\n\n"
            "Browser client figures as JSON on stdout (progress on stderr). Without a section: all of them.\n"
            "  at-size N ...      awaited inserts, ready after reload and memory at N local records\n"
            "  first-sync N ...   a fresh browser's first sync of N records from a live server\n"
            "  --states-only      first sync by record states only (not also by operations)\n"
            "  --private          in a Playwright private context instead of a Chromium profile folder\n\n"
            "examples:\n  python -m bench.browser at-size 0 50000\n"
            "  python -m bench.browser first-sync 20000 50000 --states-only\n"
        )
        sys.exit(0)
    if sys.argv[1:2] == ["at-size"]:
        args = sys.argv[2:]
        sizes = tuple(int(n) for n in args if n != "--private") or SIZES
        figures = run_at_size(sizes, profile="--private" not in args)
    elif sys.argv[1:2] == ["first-sync"]:
        args = sys.argv[2:]
        sizes = tuple(int(n) for n in args if not n.startswith("--")) or FIRST_SYNC
        figures = run_first_sync(
            sizes, by_operations="--states-only" not in args, profile="--private" not in args
        )
    else:
        figures = run()
    json.dump(figures, sys.stdout, indent=2)
    sys.stdout.write("\n")
