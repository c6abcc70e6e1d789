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

self.onmessage = (event) => (bridge ? serve(event.data) : early.push(event.data));

// One tab at a time owns the database: two workers saving their own copy of the file to the same
// IndexedDB would overwrite each other's writes. A second tab waits here until the first one closes.
function lockDatabase() {
  if (!self.navigator.locks) return Promise.resolve();
  const waiting = setTimeout(() => progress("waiting-for-other-tab"), 300);
  return new Promise((resolve, reject) => {
    self.navigator.locks
      .request(`offline-db:${config.database}`, () => {
        clearTimeout(waiting);
        resolve();
        return new Promise(() => {}); // held for the life of this worker
      })
      .catch(reject);
  });
}

// -- persistence ----------------------------------------------------------------------------------------
// SQLite works on a file in Pyodide's in-memory file system. After every committed write the file is saved
// to IndexedDB in fixed-size chunks, and only the chunks that changed since the last save are written, in
// one IndexedDB transaction together with the file's size: the stored copy is always one whole committed
// state of the database (SQLite runs without a WAL here, and no transaction stays open between two JS
// turns), and a write costs about the pages it touched, not the size of the database.
const CHUNK = 16384;

const done = (request) =>
  new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });

function same(a, b) {
  if (a.length !== b.length) return false;
  const words = a.length >> 2;
  const x = new Uint32Array(a.buffer, a.byteOffset, words);
  const y = new Uint32Array(b.buffer, b.byteOffset, words);
  for (let i = 0; i < words; i++) if (x[i] !== y[i]) return false;
  for (let i = words << 2; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

class StoredFile {
  static async open(name) {
    const request = indexedDB.open(`offline:${name}`, 1);
    request.onupgradeneeded = () => {
      request.result.createObjectStore("chunks");
      request.result.createObjectStore("meta");
    };
    return new StoredFile(await done(request));
  }

  constructor(db) {
    this.db = db;
    this.saved = new Uint8Array(0); // the file as IndexedDB holds it
  }

  async load() {
    const tx = this.db.transaction(["chunks", "meta"], "readonly");
    const [size, keys, values] = await Promise.all([
      done(tx.objectStore("meta").get("size")),
      done(tx.objectStore("chunks").getAllKeys()),
      done(tx.objectStore("chunks").getAll()),
    ]);
    if (size === undefined) return null;
    const data = new Uint8Array(size);
    keys.forEach((index, i) => data.set(new Uint8Array(values[i]).subarray(0, size - index * CHUNK), index * CHUNK));
    this.saved = data.slice();
    return data;
  }

  // Saves `data` (a copy of the file, taken synchronously between two transactions).
  async save(data) {
    const previous = this.saved;
    const count = Math.ceil(data.length / CHUNK);
    const changed = [];
    for (let i = 0; i < count; i++) {
      const range = [i * CHUNK, (i + 1) * CHUNK];
      if (!same(data.subarray(...range), previous.subarray(...range))) changed.push(i);
    }
    if (!changed.length && data.length === previous.length) return;
    const tx = this.db.transaction(["chunks", "meta"], "readwrite");
    const chunks = tx.objectStore("chunks");
    for (const i of changed) chunks.put(data.slice(i * CHUNK, (i + 1) * CHUNK).buffer, i);
    const before = Math.ceil(previous.length / CHUNK);
    if (before > count) chunks.delete(IDBKeyRange.bound(count, before - 1));
    tx.objectStore("meta").put(data.length, "size");
    await new Promise((resolve, reject) => {
      tx.oncomplete = resolve;
      tx.onerror = tx.onabort = () => reject(tx.error || new Error("the IndexedDB transaction was aborted"));
    });
    this.saved = data; // only once stored: after a failure the next save compares with what is really there
  }
}

// Saves run one at a time; a request made while one runs is served by the next save (which must include
// the newer writes), and every request made meanwhile shares that save.
function makePersist(FS, file) {
  let running = null;
  let queued = null;
  const save = () => file.save(FS.analyzePath(dbPath).exists ? FS.readFile(dbPath) : new Uint8Array(0));
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

async function main() {
  progress("starting");
  const pyodide = await loadPyodide({
    indexURL: new URL("./pyodide/", import.meta.url).href,
    stdout: (line) => console.log(line),
    stderr: (line) => console.warn(line),
  });
  progress("python-loaded");

  await lockDatabase();
  const FS = pyodide.FS;
  FS.mkdirTree(folder);
  const file = await StoredFile.open(config.database);
  const data = await file.load();
  if (data) FS.writeFile(dbPath, data);
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
  progress("ready");
  for (const text of early.splice(0)) serve(text);
}

main().catch((error) => tell({ type: "fatal", message: String((error && error.message) || error) }));
