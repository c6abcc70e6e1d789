// Drives web/snapshot.js's loadSnapshot in Node.js against web/storage.js's OPFS storage over stand-in sync
// access handles (bytes in memory; `flushed`: what the last flush left on the disk) and a stand-in fetch
// answering as a scenario says, and prints, as JSON, what each scenario left: the request made, the stages
// reported, what the database file holds, the order of its writes and flushes.
//
// Usage: node snapshot_load.mjs <a SQLite database file>. Prints JSON.
import { readFileSync } from "node:fs";
import { FORMAT, HEAD, loadSnapshot } from "../../offline_cli/templates/project/web/snapshot.js";
import { OpfsStorage } from "../../offline_cli/templates/project/web/storage.js";

const database = new Uint8Array(readFileSync(process.argv[2]));
const NAME = "app";
const BASE = "http://127.0.0.1:8000/index.html";
const CONFIG = { syncUrl: "/offline-sync", offlineVersion: "0.1.0", schemaVersion: 3, database: NAME };

class Handle {
  constructor(log, bytes = new Uint8Array(0)) {
    Object.assign(this, { log, bytes, flushed: bytes.slice() });
  }
  getSize() {
    return this.bytes.length;
  }
  read(buffer, { at }) {
    const part = this.bytes.subarray(at, Math.min(at + buffer.length, this.bytes.length));
    buffer.set(part);
    return part.length;
  }
  write(buffer, { at }) {
    if (at + buffer.length > this.bytes.length) this.truncate(at + buffer.length, false);
    this.bytes.set(buffer, at);
    this.log.push(["write", at, buffer.length]);
    return buffer.length;
  }
  truncate(size, logged = true) {
    const bytes = new Uint8Array(size);
    bytes.set(this.bytes.subarray(0, Math.min(size, this.bytes.length)));
    this.bytes = bytes;
    if (logged) this.log.push(["truncate", size]);
  }
  flush() {
    this.flushed = this.bytes.slice();
    this.log.push(["flush"]);
  }
  close() {}
}

// An OPFS folder holding files (name -> Handle) as a start finds them.
function folder(files) {
  const entry = (name) => ({ createSyncAccessHandle: async () => files.get(name) });
  return {
    async getFileHandle(name, { create } = {}) {
      if (!files.has(name)) {
        if (!create) throw Object.assign(new Error(name), { name: "NotFoundError" });
        files.set(name, new Handle([]));
      }
      return entry(name);
    },
    async removeEntry(name) {
      files.delete(name);
    },
  };
}

// The storage a start opens over these files (the database's bytes, if any: it is not new).
async function openStorage(dbBytes = null) {
  const log = [];
  const files = new Map();
  if (dbBytes) files.set(`${NAME}.db`, new Handle(log, dbBytes));
  else files.set(`${NAME}.db`, new Handle(log)).set("import-pending", new Handle([])); // (as a first start)
  const storage = new OpfsStorage(NAME, folder(files));
  await storage._open();
  const handle = files.get(`${NAME}.db`);
  handle.log = log;
  return { storage, handle, log };
}

// A body arriving in `size`-byte parts; `stop`: the part after which nothing more comes (the stream stays
// open); `cut`: bytes left off the end.
function body(bytes, { size = 10_000, stop = null, cut = 0 } = {}) {
  const end = bytes.length - cut;
  let at = 0;
  let parts = 0;
  return new ReadableStream({
    pull(controller) {
      if (stop !== null && parts >= stop) return new Promise(() => {});
      if (at >= end) return controller.close();
      controller.enqueue(bytes.slice(at, Math.min(at + size, end)));
      at += size;
      parts++;
    },
  });
}

const SNAPSHOT_HEADERS = {
  "Content-Type": "application/vnd.sqlite3",
  "X-Offline-Snapshot-Format": String(FORMAT),
};

// `fresh`: what the first look (storage.js's nothingStored) said; by default, whether the storage is empty.
async function scenario({ answer = null, config = CONFIG, stored = null, waitMs = 5000, fresh = null } = {}) {
  const { storage, handle, log } = await openStorage(stored);
  const requests = [];
  const reports = [];
  const fetch = async (url, init) => {
    requests.push({ url, method: init.method, headers: init.headers, body: JSON.parse(init.body) });
    if (answer === "network") throw new TypeError("Failed to fetch");
    if (answer === "never") {
      return new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)));
    }
    return answer();
  };
  const infos = [];
  const info = console.info;
  console.info = (line) => infos.push(line);
  let result;
  try {
    const first = Promise.resolve(fresh === null ? storage.empty : fresh);
    const opened = Promise.resolve(storage); // (the storage opens while the request is out)
    result = await loadSnapshot(config, first, opened, { fetch, base: BASE, report: (stage) => reports.push(stage), waitMs });
  } catch (error) {
    result = `threw ${error}`;
  } finally {
    console.info = info;
  }
  const whole = handle.bytes.length === database.length && handle.bytes.every((byte, i) => byte === database[i]);
  return {
    result,
    requests,
    reports,
    infos,
    size: handle.bytes.length,
    whole,
    flushedWhole: handle.flushed.length === database.length && handle.flushed.every((b, i) => b === database[i]),
    empty: storage.empty,
    log,
  };
}

const ok = (bytes, options, headers = SNAPSHOT_HEADERS) => () => new Response(body(bytes, options), { status: 200, headers });

const seen = {};
seen.accepted = await scenario({ answer: ok(database) });
// A tab closed at any point of the download leaves the file as it stood then: each state the file passed
// through is opened as the next start would open it. Only the whole file is a database; every other state is
// emptied (a new database again), none is taken for a database.
seen.closedTab = await (async () => {
  const states = [];
  const { storage, handle } = await openStorage();
  const write = handle.write.bind(handle);
  handle.write = (buffer, options) => {
    const written = write(buffer, options);
    states.push(handle.bytes.slice());
    return written;
  };
  await loadSnapshot(CONFIG, true, storage, { fetch: async () => ok(database)(), base: BASE });
  const reopened = [];
  for (const bytes of states) {
    const { storage: next, handle: file } = await openStorage(bytes);
    const same = file.bytes.length === database.length && file.bytes.every((byte, i) => byte === database[i]);
    reopened.push(next.empty ? "empty" : same ? "whole" : "other");
  }
  return { writes: states.length, reopened };
})();
seen.noContent = await scenario({ answer: () => new Response(null, { status: 204 }) });
seen.unauthorized = await scenario({
  answer: () => new Response('{"code":"AUTH_FAILED"}', { status: 401, headers: { "Content-Type": "application/json" } }),
});
seen.otherFormat = await scenario({
  answer: ok(database, {}, { ...SNAPSHOT_HEADERS, "X-Offline-Snapshot-Format": String(FORMAT + 1) }),
});
seen.notSqlite = await scenario({ answer: ok(new TextEncoder().encode("<!doctype html>".repeat(10_000))) });
seen.truncated = await scenario({ answer: ok(database, { cut: 4096 }) });
seen.network = await scenario({ answer: "network" });
seen.neverAnswered = await scenario({ answer: "never", waitMs: 200 });
seen.stalled = await scenario({ answer: ok(database, { stop: 2 }), waitMs: 200 });
seen.notNew = await scenario({ answer: ok(database), stored: new Uint8Array(database) });
// The first look said nothing was stored, but the opened storage holds a database: it is kept as it was.
seen.storedAfterAll = await scenario({ answer: ok(database), stored: new Uint8Array(database), fresh: true });
seen.otherServer = await scenario({ answer: ok(database), config: { ...CONFIG, syncUrl: "wss://sync.example.com/offline-sync" } });
seen.olderBuild = await scenario({ answer: ok(database), config: { ...CONFIG, schemaVersion: undefined } });
seen.scoped = await scenario({ answer: ok(database), config: { ...CONFIG, syncOptions: { scope: { userId: "u1" } } } });
seen.headSize = HEAD;
seen.databaseSize = database.length;
process.stdout.write(JSON.stringify(seen));
