// Cuts a worker's writes short at every point: web/storage.js's OPFS files under Pyodide's SQLite (the
// worker's settings: a rollback journal, an exclusive lock, synchronous=NORMAL), over stand-in sync access
// handles that keep each file's bytes as the browser would. A closed tab ends its worker between any two
// calls into the browser, and what those calls wrote stays; so after every call that changes a file, the
// two files as they then stand are opened as the next start would open them (SQLite rolls a hot journal
// back) and checked: the database must be whole, hold every write a save acknowledged, and hold each
// transaction all or nothing. Also recorded: whether every write to the database came after the journal's
// bytes of that transaction were flushed (what a power cut needs).
//
// Usage: node storage_cut.mjs <path of pyodide.mjs>. Prints JSON.
import { OpfsFile, OpfsStorage } from "../../offline_cli/templates/project/web/storage.js";

const { loadPyodide } = await import(process.argv[2]);
const pyodide = await loadPyodide();
const FS = pyodide.FS;

const DB = "cut.db";
const JOURNAL = `${DB}-journal`;

// A sync access handle over bytes in memory; `flushed` is what its last flush() left on the disk.
class Handle {
  constructor(name, events) {
    Object.assign(this, { name, events, bytes: new Uint8Array(0), flushed: new Uint8Array(0) });
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
    if (at + buffer.length > this.bytes.length) this._resize(at + buffer.length);
    this.bytes.set(buffer, at);
    this.events.changed(this, "write");
    return buffer.length;
  }
  truncate(size) {
    this._resize(size);
    this.events.changed(this, "truncate");
  }
  _resize(size) {
    const bytes = new Uint8Array(size);
    bytes.set(this.bytes.subarray(0, Math.min(size, this.bytes.length)));
    this.bytes = bytes;
  }
  flush() {
    this.flushed = this.bytes.slice();
    this.events.flushed(this);
  }
  close() {}
}

// Every state the two files pass through, and the writes to the database made while the journal held
// bytes of the open transaction that were not flushed.
const events = {
  states: [],
  unorderedWrites: 0,
  handles: null,
  changed(handle, what) {
    const [db, journal] = this.handles;
    if (handle === db && what === "write" && !sameBytes(journal.bytes, journal.flushed)) this.unorderedWrites++;
    this.states.push({ db: db.bytes.slice(), journal: journal.bytes.slice(), acknowledged: acknowledged.length });
  },
  flushed() {},
};

function sameBytes(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

const dbHandle = new Handle(DB, events);
const journalHandle = new Handle(JOURNAL, events);
events.handles = [dbHandle, journalHandle];
const storage = new OpfsStorage("cut", null);
storage.files.set(DB, new OpfsFile(DB, dbHandle)).set(JOURNAL, new OpfsFile(JOURNAL, journalHandle));
FS.mkdirTree("/stored");
storage.mount(FS, "/stored", `/stored/${DB}`);

// Transactions of several pages each (rows of 300 bytes, an index: page splits, pages of both b-trees),
// each saved (and so acknowledged) before the next, as the worker does.
const TRANSACTIONS = 12;
const ROWS = 40;
const acknowledged = []; // row counts of the saved transactions
const run = pyodide.runPython(`
import sqlite3
conn = sqlite3.connect("/stored/${DB}", isolation_level=None)
conn.execute("PRAGMA journal_mode=DELETE")
conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("PRAGMA synchronous=NORMAL")
conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, body TEXT)")
conn.execute("CREATE INDEX rows_body ON rows (body)")

def transaction(first, count):
    conn.execute("BEGIN")
    for i in range(first, first + count):
        conn.execute("INSERT INTO rows VALUES (?, ?)", (i, f"{(i * 7919) % 1000:04d}-" + "x" * 300))
    conn.execute("COMMIT")
transaction
`);
await storage.save();
acknowledged.push(0);
events.states.length = 0; // (from here on: the transactions the test counts)
for (let t = 0; t < TRANSACTIONS; t++) {
  run(t * ROWS, ROWS);
  await storage.save();
  acknowledged.push((t + 1) * ROWS);
}
run.destroy();

// Each state as the next start opens it: a fresh folder, the journal only where it holds bytes (as mount
// creates it), SQLite's own rollback of a hot journal.
const check = pyodide.runPython(`
import sqlite3

def check(path):
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        ids = [row[0] for row in conn.execute("SELECT id FROM rows ORDER BY id")]
        return [integrity, len(ids), ids == list(range(len(ids)))]
    except sqlite3.Error as exc:
        return [f"{type(exc).__name__}: {exc}", -1, False]
    finally:
        conn.close()
check
`);
const failures = [];
events.states.forEach((state, index) => {
  const folder = `/check${index}`;
  FS.mkdirTree(folder);
  FS.writeFile(`${folder}/${DB}`, state.db);
  if (state.journal.length) FS.writeFile(`${folder}/${JOURNAL}`, state.journal);
  const [integrity, count, prefix] = check(`${folder}/${DB}`).toJs();
  const saved = acknowledged[state.acknowledged - 1];
  const ok = integrity === "ok" && prefix && (count === saved || count === saved + ROWS);
  if (!ok) failures.push({ state: index, integrity: String(integrity).slice(0, 200), count, saved, prefix });
  for (const name of FS.readdir(folder)) if (name !== "." && name !== "..") FS.unlink(`${folder}/${name}`);
  FS.rmdir(folder);
});
check.destroy();

console.log(
  JSON.stringify({
    states: events.states.length,
    failures,
    unorderedWrites: events.unorderedWrites,
    rows: acknowledged[acknowledged.length - 1],
  }),
);
