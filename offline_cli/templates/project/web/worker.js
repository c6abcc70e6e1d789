// The browser client's Web Worker: CPython compiled to WebAssembly (Pyodide, served from this site's
// pyodide/ folder, never a CDN) runs the `offline` library and this project's Python modules against a
// SQLite database kept in the browser's IndexedDB. The page talks to it with JSON messages (see
// offline/worker.py for their shapes); this file only boots Python and owns the browser storage.
import config from "./config.js";
import { loadPyodide } from "./pyodide/pyodide.mjs";

const started = performance.now();
const folder = `/offline/${config.database}`;
const dbPath = `${folder}/${config.database}.db`;
let bridge = null;
let persist = null;
const early = []; // requests that arrive while Python is still starting

const post = (text) => self.postMessage(text);
const tell = (message) => post(JSON.stringify(message));
const progress = (stage) => tell({ type: "progress", stage, ms: Math.round(performance.now() - started) });

const failed = (error) => tell({ type: "log", level: "error", message: String(error) });

function serve(text) {
  // Most requests are served synchronously (no event-loop hops): [save first?, reply]. The others
  // (network, sync control) go through the Python coroutine `handle`, which posts its own reply.
  let served;
  try {
    served = bridge.handle_now(text);
  } catch (error) {
    return failed(error);
  }
  if (served === undefined) return bridge.handle(text).catch(failed);
  const [saveFirst, reply] = served.toJs();
  served.destroy();
  if (!saveFirst) return post(reply);
  // A write is acknowledged only once the database holds it in IndexedDB.
  persist().then(
    () => post(reply),
    (error) => post(bridge.storage_failure(reply, String((error && error.message) || error))),
  );
}

// While another tab owns the database, a request waits at most this long, then fails with a message
// (it is dropped: it will not run later, behind the caller's back).
const LOCKED_WAIT_MS = 10000;
let waitingForTab = false;

function hold(text) {
  early.push(text);
  if (waitingForTab) expireLater(text);
}

function expireLater(text) {
  setTimeout(() => {
    const index = early.indexOf(text);
    if (index < 0 || !waitingForTab) return; // served, or about to be (this tab owns the database now)
    early.splice(index, 1);
    let id = null;
    try {
      id = JSON.parse(text).id;
    } catch (error) {}
    const message =
      "this app is open in another tab of this browser, which holds its database: close that tab (or use it), then try again";
    tell({ type: "reply", id, ok: false, error: { code: "STORAGE_ERROR", message, context: { reason: "locked" } } });
  }, LOCKED_WAIT_MS);
}

self.onmessage = (event) => (bridge ? serve(event.data) : hold(event.data));

// One tab at a time owns the database: two workers saving their own copy of the file to the same
// IndexedDB would overwrite each other's writes. A second tab waits here until the first one closes.
function lockDatabase() {
  if (!self.navigator.locks) return Promise.resolve();
  const waiting = setTimeout(() => {
    waitingForTab = true;
    early.forEach(expireLater);
    progress("waiting-for-other-tab");
  }, 300);
  return new Promise((resolve, reject) => {
    self.navigator.locks
      .request(`offline-db:${config.database}`, () => {
        clearTimeout(waiting);
        if (waitingForTab) progress("lock-acquired");
        waitingForTab = false;
        resolve();
        return new Promise(() => {}); // held for the life of this worker
      })
      .catch(reject);
  });
}

// -- persistence ----------------------------------------------------------------------------------------
// SQLite works on a file in Pyodide's in-memory file system (MEMFS). The file is kept in IndexedDB in
// fixed-size chunks. Every write SQLite makes to the file passes through the file system's write function,
// which this worker wraps for the database file: it notes which chunks the write touched. After a commit,
// only those chunks are copied out and stored, in one IndexedDB transaction together with the file's size,
// so a write costs the pages it touched whatever the size of the database, and the stored copy is always
// one whole committed state (SQLite runs without a WAL here, and no transaction stays open between two JS
// turns). Nothing keeps a second copy of the file: the chunks are read from the file system's own buffer.
const CHUNK = 16384;
const LOAD_BATCH = 256; // chunks read per IndexedDB request at startup (bounds the memory held twice)

const done = (request) =>
  new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });

const committed = (tx) =>
  new Promise((resolve, reject) => {
    tx.oncomplete = resolve;
    tx.onerror = tx.onabort = () => reject(tx.error || new Error("the IndexedDB transaction was aborted"));
  });

// A failure of the browser's storage, as the page shows it: a code, what happened and what to do next.
function storageFailure(reason, message, error) {
  const failure = new Error(message);
  failure.code = "STORAGE_ERROR";
  failure.context = { reason, cause: String((error && (error.message || error.name)) || error) };
  return failure;
}

class StoredFile {
  static async open(name) {
    try {
      const request = indexedDB.open(`offline:${name}`, 1);
      request.onupgradeneeded = () => {
        request.result.createObjectStore("chunks");
        request.result.createObjectStore("meta");
      };
      return new StoredFile(await done(request));
    } catch (error) {
      const cause = (error && (error.message || error.name)) || error;
      throw storageFailure(
        "unavailable",
        `this browser does not let the app keep its data (IndexedDB could not be opened: ${cause}); ` +
          "allow this site to store data (a private window or blocked site data prevents it), then reload the page",
        error,
      );
    }
  }

  constructor(db) {
    this.db = db;
    this.savedSize = 0; // the file's size as IndexedDB holds it
    this.dirty = new Set(); // chunks written since the last save
    this.node = null; // the file system node whose writes are tracked
  }

  // Reads the stored file into one buffer the file system then owns (no second copy), or null.
  async load() {
    const size = await done(this.db.transaction("meta").objectStore("meta").get("size"));
    if (size === undefined) return null;
    const data = new Uint8Array(size);
    const count = Math.ceil(size / CHUNK);
    for (let first = 0; first < count; first += LOAD_BATCH) {
      const range = IDBKeyRange.bound(first, Math.min(first + LOAD_BATCH, count) - 1);
      const store = this.db.transaction("chunks").objectStore("chunks");
      const [keys, values] = await Promise.all([done(store.getAllKeys(range)), done(store.getAll(range))]);
      keys.forEach((index, i) => data.set(new Uint8Array(values[i]).subarray(0, size - index * CHUNK), index * CHUNK));
    }
    this.savedSize = size;
    return data;
  }

  // Wraps the write and resize functions of the database file's node so they note the chunks they touch.
  // The stream operations are copied onto the node first: they are shared by every MEMFS file.
  track(FS, path) {
    const node = FS.lookupPath(path).node;
    if (node === this.node) return;
    const dirty = this.dirty;
    const mark = (from, to) => {
      for (let i = Math.floor(from / CHUNK); i * CHUNK < to; i++) dirty.add(i);
    };
    const streamOps = node.stream_ops;
    node.stream_ops = {
      ...streamOps,
      write(stream, buffer, offset, length, position, canOwn) {
        const end = stream.node.usedBytes; // a write past the end also fills the gap before it (zeros)
        const written = streamOps.write(stream, buffer, offset, length, position, canOwn);
        mark(Math.min(position, end), position + written);
        return written;
      },
    };
    const nodeOps = node.node_ops;
    node.node_ops = {
      ...nodeOps,
      setattr(target, attr) {
        const before = target.usedBytes;
        const result = nodeOps.setattr(target, attr);
        if (attr.size !== undefined && attr.size !== before) mark(Math.min(before, attr.size), Math.max(before, attr.size));
        return result;
      },
    };
    if (this.node !== null) mark(0, node.usedBytes); // a new file in its place: store all of it
    this.node = node;
  }

  // Stores the chunks written since the last save. The chunks are copied synchronously (between two
  // SQLite transactions); if the browser refuses them, they are noted again for the next save.
  async save(FS, path) {
    if (!FS.analyzePath(path).exists) return;
    this.track(FS, path);
    const node = this.node;
    const size = node.usedBytes;
    if (!this.dirty.size && size === this.savedSize) return;
    const count = Math.ceil(size / CHUNK);
    const changed = [...this.dirty].filter((i) => i < count);
    this.dirty.clear();
    const tx = this.db.transaction(["chunks", "meta"], "readwrite");
    const chunks = tx.objectStore("chunks");
    for (const i of changed) chunks.put(node.contents.slice(i * CHUNK, Math.min((i + 1) * CHUNK, size)).buffer, i);
    const before = Math.ceil(this.savedSize / CHUNK);
    if (before > count) chunks.delete(IDBKeyRange.bound(count, before - 1));
    tx.objectStore("meta").put(size, "size");
    try {
      await committed(tx);
    } catch (error) {
      for (const i of changed) this.dirty.add(i);
      throw error;
    }
    this.savedSize = size;
  }
}

// Saves run one at a time; a request made while one runs is served by the next save (which must include
// the newer writes), and every request made meanwhile shares that save.
function makePersist(FS, file) {
  let running = null;
  let queued = null;
  const save = () => file.save(FS, dbPath);
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

async function main() {
  progress("starting");
  const yjs = loadYjs();
  const pyodide = await loadPyodide({
    indexURL: new URL("./pyodide/", import.meta.url).href,
    stdout: (line) => console.log(line),
    stderr: (line) => console.warn(line),
  });
  progress("python-loaded");
  const yjsModule = await yjs;
  if (yjsModule) pyodide.registerJsModule("offline_yjs", yjsModule);

  await lockDatabase();
  const FS = pyodide.FS;
  FS.mkdirTree(folder);
  const file = await StoredFile.open(config.database);
  // The file system takes the loaded buffer as the file's contents (canOwn: no copy); a new database starts
  // as an empty file, so its writes are tracked from the first one.
  const stored = await file.load().catch((error) => {
    throw storageFailure(
      "unreadable",
      `the data this app keeps in this browser could not be read (${(error && error.message) || error}); ` +
        "reload the page, and if this keeps happening, clear this site's data in the browser's settings",
      error,
    );
  });
  FS.writeFile(dbPath, stored || new Uint8Array(0), { canOwn: true });
  file.track(FS, dbPath);
  progress("storage-opened");

  const response = await fetch(new URL(config.python, import.meta.url));
  if (!response.ok) throw new Error(`cannot load the Python code ${config.python}: HTTP ${response.status}`);
  pyodide.unpackArchive(await response.arrayBuffer(), "zip", { extractDir: "/app" });
  pyodide.runPython("import sys\nif '/app' not in sys.path: sys.path.insert(0, '/app')");
  progress("code-loaded");

  const worker = pyodide.pyimport("offline.worker");
  const options = pyodide.toPy({
    schemaModule: config.schemaModule,
    actionsModule: config.actionsModule || null,
    dbPath,
    syncUrl: syncUrl(config.syncUrl),
    syncOptions: config.syncOptions || {},
  });
  persist = makePersist(FS, file);
  bridge = await worker.start(options, post, persist);
  options.destroy();
  if (!bridge) return; // the app could not open: Python told the page why (a "fatal" message)
  progress("ready");
  for (const text of early.splice(0)) serve(text);
}

main().catch((error) =>
  tell({ type: "fatal", message: String((error && error.message) || error), code: error && error.code, context: error && error.context }),
);
