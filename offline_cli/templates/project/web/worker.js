// The browser client's Web Worker: CPython compiled to WebAssembly (Pyodide, served from this site's
// pyodide/ folder, never a CDN) runs the `offline` library and this project's Python modules against a
// SQLite database kept in the browser's storage (storage.js). The page talks to it with JSON messages (see
// offline/worker.py for their shapes); this file only boots Python and owns the browser storage.
import config from "./config.js";
import { preconnect } from "./early-socket.js";
import { loadPyodide } from "./pyodide/pyodide.mjs";
import { loadSnapshot } from "./snapshot.js";
import { nothingStored, openStorage } from "./storage.js";
import { Tabs } from "./tabs.js";

const started = performance.now();
const folder = `/offline/${config.database}`;
const dbPath = `${folder}/${config.database}.db`;
let bridge = null;
let persist = null;
let stored = null; // the database's storage, once this tab holds the database (see main)
let tabRequests = null; // offline.worker_tabs.TabRequests: other tabs' writes, applied once

const post = (text) => self.postMessage(text);
const tell = (message) => post(JSON.stringify(message));
// `at`: when, on the clock both the page and this worker read (ms since the epoch): the page places each
// stage on its own timeline, from navigation, however long the message waited for the page's thread.
const progress = (stage) =>
  tell({ type: "progress", stage, ms: Math.round(performance.now() - started), at: performance.timeOrigin + performance.now() });

const failed = (error) => tell({ type: "log", level: "error", message: String(error) });

// Serves a request with `target` (this page's bridge, or another tab's: see tabs.js), posting the answer
// with `send`. `key` names a request another tab sent (or this one sent to a previous owner): a write
// already applied under it is answered from storage instead of applied again (offline/worker_tabs.py).
// A failure (an exception escaping Python) is thrown, or rejects the promise returned: tabs.js logs it on
// this page and answers the request with an error, so the page that asked (this one or another tab's) never
// waits for its time limit.
function serve(text, key = null, target = bridge, send = post) {
  // Most requests are served synchronously (no event-loop hops): [save first?, reply]. The others
  // (network, sync control) go through the Python coroutine `handle`, which posts its own reply.
  const served = key === null ? target.handle_now(text) : tabRequests.handle_now(target, key, text);
  if (served === undefined) return key === null ? target.handle(text) : tabRequests.handle(target, key, text);
  const [saveFirst, reply] = served.toJs();
  served.destroy();
  if (!saveFirst) return send(reply);
  // A write is acknowledged only once the database holds it in IndexedDB.
  return persist().then(
    () => send(reply),
    (error) => send(target.storage_failure(reply, String((error && error.message) || error))),
  );
}

// One tab at a time owns the database: two workers saving their own copy of the file to the same
// IndexedDB would overwrite each other's writes. Until this tab owns it (another tab does, or this one is
// still starting), the page's requests go to the owner (see tabs.js).
const tabs = new Tabs(config.database, post);
self.onmessage = (event) => tabs.fromPage(event.data);

// -- persistence ----------------------------------------------------------------------------------------
// The database file is kept in the browser's storage by storage.js: in the Origin Private File System
// where the browser offers it to workers, else in IndexedDB. Either way a commit's writes are durable once
// the storage's save() resolved, and only what the commit changed is written.
// Saves run one at a time; a request made while one runs is served by the next save (which must include
// the newer writes), and every request made meanwhile shares that save.
function makePersist(storage) {
  let running = null;
  let queued = null;
  const save = () => storage.save();
  const next = () => {
    if (queued) return queued;
    if (!running) {
      running = save().finally(() => {
        running = null;
      });
      return running;
    }
    queued = running
      .catch(() => {})
      .then(() => {
        queued = null;
        return next();
      });
    return queued;
  };
  return next;
}

function syncUrl(value) {
  if (!value) return null;
  if (value.startsWith("/")) {
    // A path: the sync endpoint of the server that served this page.
    const url = new URL(value, self.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    return url.href;
  }
  return value;
}

// Rich text merges with Yjs: pycrdt has no WebAssembly build, so Python uses the npm package yjs (bundled
// into vendor/ by the build), registered as the module `offline_yjs` (see offline/merge/yjs.py). Loaded
// while Pyodide starts; a build without yjs leaves rich text fields unavailable, and the page says so.
const loadYjs = () => (config.richtext ? import(new URL(config.richtext, import.meta.url).href) : Promise.resolve(null));

// The app's modules compiled to bytecode by an earlier start of this build (see offline/worker_bytecode.py),
// kept in the Cache Storage: without it, CPython compiles every module from source on every load. Only for a
// build that ships the code as source (config.bytecode false: it was built without Node.js); otherwise the
// build compiled it (offline_cli/web_precompile.mjs) and the code archive holds the bytecode. The key
// is the code archive's name, which carries its hash, plus the Pyodide version: a new build never finds
// another build's bytecode (and its .pyc files are hash-checked against the sources anyway).
const BYTECODE_CACHE = "offline-bytecode";
const bytecodeKey = new URL(`${config.python}.pyodide-${config.pyodideVersion}.pyc.zip`, import.meta.url).href;

async function loadBytecode() {
  if (config.bytecode || typeof caches === "undefined") return null; // (no Cache Storage: not a secure context)
  try {
    const response = await (await caches.open(BYTECODE_CACHE)).match(bytecodeKey);
    return response ? await response.arrayBuffer() : null;
  } catch (error) {
    console.warn(`the cached bytecode could not be read, compiling from source: ${error}`);
    return null;
  }
}

// Once the app is ready (so the first start is not slowed): compile what it imported and keep it, in
// place of any other build's bytecode.
async function saveBytecode(pyodide) {
  if (typeof caches === "undefined") return;
  const archive = "/tmp/offline-bytecode.zip";
  pyodide.pyimport("offline.worker_bytecode").compile_imported("/app", archive);
  const bytes = pyodide.FS.readFile(archive);
  pyodide.FS.unlink(archive);
  const cache = await caches.open(BYTECODE_CACHE);
  for (const request of await cache.keys()) if (request.url !== bytecodeKey) await cache.delete(request);
  await cache.put(bytecodeKey, new Response(bytes, { headers: { "content-type": "application/zip" } }));
  progress("bytecode-saved");
}

// Startup runs three things side by side: Pyodide loads and compiles (CPU in this process), the stored
// database is opened (in OPFS; from IndexedDB it is read, in the browser's storage process), and the app's
// Python code is fetched. Opening the database after Pyodide (as one step after another) made a reload wait
// for both in turn. It starts once this tab holds the database (tabs.lock), so it never sees another tab's
// half-saved state. A first start (nothing stored) also downloads the server's replica of the database
// meanwhile (snapshot.js): the network is idle while Pyodide compiles, and the file is written before
// Python opens it, instead of Python adopting every record from the sync connection after it is ready.
async function main() {
  progress("starting");
  const yjs = loadYjs();
  const python = loadPyodide({
    indexURL: new URL("./pyodide/", import.meta.url).href,
    stdout: (line) => console.log(line),
    stderr: (line) => console.warn(line),
  }).then((pyodide) => {
    progress("python-loaded");
    return pyodide;
  });
  const owned = tabs.lock();
  stored = owned.then(async () => {
    progress("database-owned");
    const storage = await openStorage(config.database);
    progress("storage-read");
    return storage;
  });
  // Only the tab that owns the database asks, and only for a new one (a reload never does); as soon as a
  // first look says nothing is stored, not once the storage is open (see nothingStored).
  const fresh = owned.then(() => nothingStored(config.database));
  const snapshot = loadSnapshot(config, fresh, stored, { report: progress });
  const code = fetch(new URL(config.python, import.meta.url)).then((response) => {
    if (!response.ok) throw new Error(`cannot load the Python code ${config.python}: HTTP ${response.status}`);
    return response.arrayBuffer();
  });
  const bytecode = loadBytecode();
  // (A failure in one is reported by main's catch; the others are left to settle unobserved.)
  for (const step of [stored, code, snapshot]) step.catch(() => {});

  const pyodide = await python;
  // The code (fetched while Pyodide loaded) is unpacked before waiting for yjs: yjs's many small modules
  // are evaluated between Pyodide's long tasks on this thread, and often finish only after it.
  pyodide.unpackArchive(await code, "zip", { extractDir: "/app" });
  const compiled = await bytecode;
  if (compiled) {
    pyodide.unpackArchive(compiled, "zip", { extractDir: "/app" });
    progress("bytecode-loaded");
  }
  const yjsModule = await yjs;
  if (yjsModule) pyodide.registerJsModule("offline_yjs", yjsModule);
  pyodide.runPython("import sys\nif '/app' not in sys.path: sys.path.insert(0, '/app')");
  progress("code-loaded");
  const worker = pyodide.pyimport("offline.worker");
  progress("python-imported");

  const FS = pyodide.FS;
  FS.mkdirTree(folder);
  const storage = await stored;
  // A snapshot still arriving is waited for: it is the first sync, which the socket would do slower (and
  // one that fails or stops arriving gives up on its own, leaving the database new: see snapshot.js).
  const fromSnapshot = await snapshot;
  storage.mount(FS, folder, dbPath);
  progress("storage-opened");
  // The sync connection opens while the app opens its database (see early-socket.js): only in the tab that
  // owns it (the one that syncs), and only now, when what is left of the start is short (a server waits a
  // few seconds at most for the handshake).
  const url = syncUrl(config.syncUrl);
  const early = preconnect(url, { report: (what) => progress(`sync-socket-${what}`) });

  const options = pyodide.toPy({
    schemaModule: config.schemaModule,
    actionsModule: config.actionsModule || null,
    dbPath,
    // (Python opens a new database instead where the server's file does not open: see offline/worker.py.)
    snapshot: fromSnapshot,
    syncUrl: url,
    syncOptions: config.syncOptions || {},
  });
  // Sync sends an operation only once it is stored (see offline.worker_tabs.DurableSync): a save notes this
  // node's last sequence number as it starts (it copies what is there then), and passes it on once stored.
  const tabsModule = pyodide.pyimport("offline.worker_tabs");
  const save = makePersist(storage);
  let durable = null;
  persist = () => {
    const sequence = durable ? durable.saving() : null;
    return save().then(() => {
      if (sequence !== null) durable.saved(sequence);
    });
  };
  bridge = await worker.start(options, post, persist, progress);
  options.destroy();
  if (!bridge) {
    if (early) early.discard();
    storage.close(); // (before the lock goes: the next owner opens the files)
    tabs.resign(); // another tab may open it (else every tab waits for this one to close)
    return; // the app could not open: Python told the page why (a "fatal" message)
  }
  storage.opened();
  durable = tabsModule.DurableSync(bridge.app);
  tabRequests = tabsModule.open_requests(bridge);
  progress("ready");
  if (!compiled && !config.bytecode) {
    setTimeout(() => saveBytecode(pyodide).catch((error) => console.warn(`bytecode not cached: ${error}`)), 0);
  }
  tabs.becomeOwner({
    serve: (text, key) => serve(text, key),
    attach: async (tabId, send) => ({ bridge: await tabsModule.attach(bridge, send), send }),
    serveFor: (handle, text, key) => serve(text, key, handle.bridge, handle.send),
    detach: (handle) => {
      handle.bridge.detach();
      handle.bridge.destroy();
    },
    failed,
  });
}

main().catch((error) => {
  // This worker holds (or waits for) the database's lock and will never serve it: hand it on, and the
  // files it opened (the next owner waits for them a while).
  tabs.resign();
  if (stored) stored.then((storage) => storage.close()).catch(() => {});
  tell({ type: "fatal", message: String((error && error.message) || error), code: error && error.code, context: error && error.context });
});
