// The browser client's Web Worker: CPython compiled to WebAssembly (Pyodide, served from this site's
// pyodide/ folder, never a CDN) runs the `offline` library and this project's Python modules against a
// SQLite database kept in the browser's IndexedDB. The page talks to it with JSON messages (see
// offline/worker.py for their shapes); this file only boots Python and owns the browser storage.
import config from "./config.js";
import { loadPyodide } from "./pyodide/pyodide.mjs";
import { Tabs } from "./tabs.js";

const started = performance.now();
const folder = `/offline/${config.database}`;
const dbPath = `${folder}/${config.database}.db`;
let bridge = null;
let persist = null;
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
// SQLite works on a file in Pyodide's in-memory file system (MEMFS), kept in IndexedDB in fixed-size
// chunks. The database file's node keeps its contents as those chunks (`StoredFile` replaces the node's
// read, write and resize functions): the chunks read from IndexedDB at startup become the file itself (no
// whole-file buffer, nothing copied), the file grows a chunk at a time (MEMFS would copy the whole file
// into a larger buffer), and every write notes the chunks it touched. After a commit only those chunks are
// stored, in one IndexedDB transaction together with the file's size, so a write costs the pages it
// touched whatever the size of the database, and the stored copy is always one whole committed state
// (SQLite runs without a WAL here, and no transaction stays open between two JS turns).
const CHUNK = 16384;
const LOAD_BATCH = 256; // chunks per IndexedDB request at startup

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

// A chunk as the file keeps it: CHUNK bytes (a stored last chunk holds only the file's bytes).
function fullChunk(buffer) {
  if (buffer.byteLength === CHUNK) return new Uint8Array(buffer);
  const chunk = new Uint8Array(CHUNK);
  chunk.set(new Uint8Array(buffer, 0, Math.min(buffer.byteLength, CHUNK)));
  return chunk;
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
    this.size = 0; // the file's size (before the file system has the node: as loaded)
    this.chunks = []; // the file's contents; a missing chunk reads as zeros
    this.dirty = new Set(); // chunks written since the last save
    this.node = null; // the file system node whose contents these are
  }

  // Reads the stored chunks (they become the file's contents when `adopt` takes the node). Every request
  // is made at once, in one transaction: the browser reads them while Python loads, and the worker takes
  // each answer when it is free (one request after another waited for the worker between two).
  async load() {
    const tx = this.db.transaction(["meta", "chunks"]);
    const size = await done(tx.objectStore("meta").get("size"));
    if (size === undefined) return;
    const count = Math.ceil(size / CHUNK);
    const chunks = new Array(count);
    const store = tx.objectStore("chunks");
    const reads = [];
    for (let first = 0; first < count; first += LOAD_BATCH) {
      const last = Math.min(first + LOAD_BATCH, count) - 1;
      const range = IDBKeyRange.bound(first, last);
      const read = done(store.getAll(range)).then((values) => {
        if (values.length === last - first + 1) {
          values.forEach((value, i) => {
            chunks[first + i] = fullChunk(value);
          });
          return undefined;
        }
        // Some chunks of this range are missing (they read as zeros): each value goes by its key.
        return done(store.getAllKeys(range)).then((keys) =>
          keys.forEach((index, i) => {
            chunks[index] = fullChunk(values[i]);
          }),
        );
      });
      reads.push(read);
    }
    await Promise.all(reads);
    this.chunks = chunks;
    this.size = this.savedSize = size;
  }

  _mark(from, to) {
    for (let i = Math.floor(from / CHUNK); i * CHUNK < to; i++) this.dirty.add(i);
  }

  // Makes the file at `path` keep its contents in this object's chunks. A new file in the place of the
  // one adopted before (deleted and created again) brings its contents along, all of them to be stored.
  adopt(FS, path) {
    const node = FS.lookupPath(path).node;
    if (node === this.node) return;
    if (this.node !== null || node.usedBytes) {
      const contents = node.contents ? node.contents.subarray(0, node.usedBytes) : new Uint8Array(0);
      this.chunks = [];
      for (let at = 0; at < contents.length; at += CHUNK) this.chunks.push(fullChunk(contents.slice(at, at + CHUNK).buffer));
      this.size = contents.length;
      this._mark(0, Math.max(this.size, this.savedSize));
    }
    node.contents = null;
    node.usedBytes = this.size;
    const file = this;
    node.stream_ops = {
      ...node.stream_ops, // (shared by every MEMFS file: copied, not changed)
      read: (stream, buffer, offset, length, position) => file._read(buffer, offset, length, position),
      write: (stream, buffer, offset, length, position) => file._write(buffer, offset, length, position),
      allocate: (stream, offset, length) => file._resize(Math.max(node.usedBytes, offset + length), true),
      mmap: () => {
        throw new FS.ErrnoError(43); // ENODEV (Emscripten's numbering): SQLite does not map this file
      },
    };
    const nodeOps = node.node_ops;
    node.node_ops = {
      ...nodeOps,
      setattr(target, attr) {
        const { size, ...rest } = attr;
        nodeOps.setattr(target, rest);
        if (size !== undefined) file._resize(size, false);
      },
    };
    // (A stream takes its operations when it is opened: one already open on this file gets them too.)
    for (const stream of FS.streams) if (stream && stream.node === node) stream.stream_ops = node.stream_ops;
    this.node = node;
  }

  _read(buffer, offset, length, position) {
    const size = this.node.usedBytes;
    if (position >= size) return 0;
    const total = Math.min(length, size - position);
    for (let copied = 0; copied < total; ) {
      const at = position + copied;
      const i = Math.floor(at / CHUNK);
      const from = at - i * CHUNK;
      const n = Math.min(CHUNK - from, total - copied);
      const chunk = this.chunks[i];
      if (chunk) buffer.set(chunk.subarray(from, from + n), offset + copied);
      else buffer.fill(0, offset + copied, offset + copied + n);
      copied += n;
    }
    return total;
  }

  _write(buffer, offset, length, position) {
    if (!length) return 0;
    const node = this.node;
    if (position > node.usedBytes) this._mark(node.usedBytes, position); // the gap reads (and is stored) as zeros
    for (let copied = 0; copied < length; ) {
      const at = position + copied;
      const i = Math.floor(at / CHUNK);
      const from = at - i * CHUNK;
      const n = Math.min(CHUNK - from, length - copied);
      const chunk = this.chunks[i] || (this.chunks[i] = new Uint8Array(CHUNK));
      chunk.set(buffer.subarray(offset + copied, offset + copied + n), from);
      this.dirty.add(i);
      copied += n;
    }
    node.usedBytes = Math.max(node.usedBytes, position + length);
    node.mtime = node.ctime = Date.now();
    return length;
  }

  _resize(size, growOnly) {
    const node = this.node;
    const before = node.usedBytes;
    if (size === before || (growOnly && size < before)) return;
    if (size < before) {
      // Bytes past the new end read as zeros if the file grows again: drop whole chunks, zero the rest.
      const count = Math.ceil(size / CHUNK);
      if (this.chunks.length > count) this.chunks.length = count;
      const last = this.chunks[count - 1];
      if (last && size % CHUNK) last.fill(0, size % CHUNK);
    }
    this._mark(Math.min(before, size), Math.max(before, size));
    node.usedBytes = size;
    node.mtime = node.ctime = Date.now();
  }

  // Stores the chunks written since the last save. The chunks are handed over synchronously (IndexedDB
  // copies a value when it is put, between two SQLite transactions); if the browser refuses them, they are
  // noted again for the next save.
  async save(FS, path) {
    if (!FS.analyzePath(path).exists) return;
    this.adopt(FS, path);
    const size = this.node.usedBytes;
    if (!this.dirty.size && size === this.savedSize) return;
    const count = Math.ceil(size / CHUNK);
    const changed = [...this.dirty].filter((i) => i < count);
    this.dirty.clear();
    const tx = this.db.transaction(["chunks", "meta"], "readwrite");
    const chunks = tx.objectStore("chunks");
    for (const i of changed) {
      const chunk = this.chunks[i] || new Uint8Array(CHUNK);
      const length = Math.min(CHUNK, size - i * CHUNK);
      chunks.put(length === CHUNK ? chunk.buffer : chunk.slice(0, length).buffer, i);
    }
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
// database is read from IndexedDB (the browser's storage process), and the app's Python code is fetched.
// Reading the database after Pyodide (as one step after another) made a reload wait for both in turn, and
// the read grows with the database. The read starts once this tab holds the database (tabs.lock), so it
// never sees another tab's half-saved state.
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
  const stored = tabs.lock().then(async () => {
    progress("database-owned");
    const file = await StoredFile.open(config.database);
    await file.load().catch((error) => {
      throw storageFailure(
        "unreadable",
        `the data this app keeps in this browser could not be read (${(error && error.message) || error}); ` +
          "reload the page, and if this keeps happening, clear this site's data in the browser's settings",
        error,
      );
    });
    progress("storage-read");
    return file;
  });
  const code = fetch(new URL(config.python, import.meta.url)).then((response) => {
    if (!response.ok) throw new Error(`cannot load the Python code ${config.python}: HTTP ${response.status}`);
    return response.arrayBuffer();
  });
  const bytecode = loadBytecode();
  // (A failure in one is reported by main's catch; the others are left to settle unobserved.)
  for (const step of [stored, code]) step.catch(() => {});

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
  const file = await stored;
  // An empty file whose contents become the loaded chunks (a new database: none, and every write is
  // stored from the first one).
  FS.writeFile(dbPath, new Uint8Array(0));
  file.adopt(FS, dbPath);
  progress("storage-opened");

  const options = pyodide.toPy({
    schemaModule: config.schemaModule,
    actionsModule: config.actionsModule || null,
    dbPath,
    syncUrl: syncUrl(config.syncUrl),
    syncOptions: config.syncOptions || {},
  });
  // Sync sends an operation only once it is stored (see offline.worker_tabs.DurableSync): a save notes this
  // node's last sequence number as it starts (it copies what is there then), and passes it on once stored.
  const tabsModule = pyodide.pyimport("offline.worker_tabs");
  const save = makePersist(FS, file);
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
    tabs.resign(); // another tab may open it (else every tab waits for this one to close)
    return; // the app could not open: Python told the page why (a "fatal" message)
  }
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
  // This worker holds (or waits for) the database's lock and will never serve it: hand it on.
  tabs.resign();
  tell({ type: "fatal", message: String((error && error.message) || error), code: error && error.code, context: error && error.context });
});
