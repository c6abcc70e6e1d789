// Where the worker keeps the SQLite database: the browser's Origin Private File System (OPFS) where the
// browser lets a worker write it synchronously (a FileSystemSyncAccessHandle), else IndexedDB.
//
// SQLite works on files in Pyodide's in-memory file system (MEMFS); this module makes the database file's
// node (and its rollback journal's) keep their contents in browser storage instead, by replacing the nodes'
// read, write and resize functions:
//
// - OPFS (`OpfsStorage`): SQLite's reads and writes go straight to the OPFS file, as on a disk. Nothing of
//   the file is held in the worker's memory (a 50,000-record database is 75 MB: kept in memory, it was a
//   quarter of the page's renderer), and a write is in the file, flushed to the disk, once save() returns
//   after its commit: it survives a reload. The journal is an OPFS file too, and the two files change in the
//   order SQLite changed them (see OpfsFile), so a commit the worker did not finish (the tab closed in the
//   middle) is rolled back by the next start, as SQLite does on a disk. A sync access handle is exclusive, which is what the tabs need anyway (one owner, see tabs.js).
//   A database an earlier version of the app kept in IndexedDB is copied into OPFS at the first start.
// - IndexedDB (`StoredFile`), where OPFS is missing (an insecure context, an older browser): the file is
//   held in memory as fixed-size chunks, read from IndexedDB at startup; after a commit the chunks written
//   are stored in one IndexedDB transaction.
//
// Both answer the worker the same way: `Storage.open(name)` (before Python has started: reads or opens
// what is stored), `storage.mount(FS, folder, path)` (once it has: the file at `path` becomes the stored
// database), `storage.save()` (after a commit: makes it durable; a write is acknowledged only after it) and
// `storage.opened()` (the app opened the database: leftovers of a copy into OPFS may go) and
// `storage.close()` (this worker will not serve the database: another tab's may open it). Before mount,
// `storage.empty` says whether a database is stored at all, and `storage.snapshotWriter()` writes a whole
// database file the server built (snapshot.js) in its place: its first HEAD bytes last, so a write cut
// short leaves a file starting with zeros, which the next open empties (a database file never starts
// with zeros: SQLite writes its header with its first page).

export const CHUNK = 16384;
const LOAD_BATCH = 256; // chunks per IndexedDB request at startup

// Emscripten's numbering of the errors a file operation reports to SQLite.
const EIO = 29;
const ENODEV = 43;
const ENOSPC = 51;

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

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Whether the first 16 bytes of a file (where a database has "SQLite format 3\0") are all zero: what a
// snapshot whose writing was cut short leaves (see the comment at the top).
export const cutShort = (first) => first.length >= 16 && first.subarray(0, 16).every((byte) => byte === 0);

// A failure of the browser's storage, as the page shows it: a code, what happened and what to do next.
export function storageFailure(reason, message, error) {
  const failure = new Error(message);
  failure.code = "STORAGE_ERROR";
  failure.context = { reason, cause: String((error && (error.message || error.name)) || error) };
  return failure;
}

const unreadable = (error) =>
  storageFailure(
    "unreadable",
    `the data this app keeps in this browser could not be read (${(error && error.message) || error}); ` +
      "reload the page, and if this keeps happening, clear this site's data in the browser's settings",
    error,
  );

// A chunk as the file keeps it: CHUNK bytes (a stored last chunk holds only the file's bytes).
function fullChunk(buffer) {
  if (buffer.byteLength === CHUNK) return new Uint8Array(buffer);
  const chunk = new Uint8Array(CHUNK);
  chunk.set(new Uint8Array(buffer, 0, Math.min(buffer.byteLength, CHUNK)));
  return chunk;
}

// Copies `bytes` into `chunks` (CHUNK-byte arrays, made as needed) at file position `position`; `touched(i)`
// hears the index of each chunk written.
function putChunks(chunks, bytes, position, touched = () => {}) {
  for (let copied = 0; copied < bytes.length; ) {
    const at = position + copied;
    const i = Math.floor(at / CHUNK);
    const from = at - i * CHUNK;
    const n = Math.min(CHUNK - from, bytes.length - copied);
    (chunks[i] ||= new Uint8Array(CHUNK)).set(bytes.subarray(copied, copied + n), from);
    touched(i);
    copied += n;
  }
}

// Makes `node` use `streamOps` (merged over its own) and resize through `resize(size)`.
function override(FS, node, streamOps, resize) {
  node.stream_ops = { ...node.stream_ops, ...streamOps }; // (shared by every MEMFS file: copied, not changed)
  const nodeOps = node.node_ops;
  node.node_ops = {
    ...nodeOps,
    setattr(target, attr) {
      const { size, ...rest } = attr;
      nodeOps.setattr(target, rest);
      if (size !== undefined) resize(size);
    },
  };
  // (A stream takes its operations when it is opened: one already open on this file gets them too.)
  for (const stream of FS.streams) if (stream && stream.node === node) stream.stream_ops = node.stream_ops;
}

// -- IndexedDB --------------------------------------------------------------------------------------------

// The database `offline:<name>` of IndexedDB: the file's chunks (key: the chunk's index) and its size.
async function openIndexedDB(name) {
  try {
    const request = indexedDB.open(`offline:${name}`, 1);
    request.onupgradeneeded = () => {
      request.result.createObjectStore("chunks");
      request.result.createObjectStore("meta");
    };
    return await done(request);
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

// Reads the chunks of the file IndexedDB holds, LOAD_BATCH at a time: `each(first, chunks)` gets each
// batch (a missing chunk is undefined: it reads as zeros). Every request is made at once, in one
// transaction: the browser reads them while Python loads, and the worker takes each answer when it is free.
// Returns the file's size (undefined: nothing stored).
async function readChunks(db, each) {
  const tx = db.transaction(["meta", "chunks"]);
  const size = await done(tx.objectStore("meta").get("size"));
  if (size === undefined) return undefined;
  const count = Math.ceil(size / CHUNK);
  const store = tx.objectStore("chunks");
  const reads = [];
  for (let first = 0; first < count; first += LOAD_BATCH) {
    const last = Math.min(first + LOAD_BATCH, count) - 1;
    const range = IDBKeyRange.bound(first, last);
    const read = done(store.getAll(range)).then(async (values) => {
      const chunks = new Array(last - first + 1);
      if (values.length === chunks.length) {
        values.forEach((value, i) => {
          chunks[i] = fullChunk(value);
        });
      } else {
        // Some chunks of this range are missing: each value goes by its key.
        const keys = await done(store.getAllKeys(range));
        keys.forEach((index, i) => {
          chunks[index - first] = fullChunk(values[i]);
        });
      }
      each(first, chunks);
    });
    reads.push(read);
  }
  await Promise.all(reads);
  return size;
}

export class StoredFile {
  static async open(name) {
    const file = new StoredFile(await openIndexedDB(name));
    await file.load().catch((error) => {
      throw unreadable(error);
    });
    return file;
  }

  constructor(db) {
    this.kind = "indexeddb";
    this.db = db;
    this.savedSize = 0; // the file's size as IndexedDB holds it
    this.size = 0; // the file's size (before the file system has the node: as loaded)
    this.chunks = []; // the file's contents; a missing chunk reads as zeros
    this.dirty = new Set(); // chunks written since the last save
    this.node = null; // the file system node whose contents these are
    this.FS = null;
    this.path = null;
  }

  // Reads the stored chunks (they become the file's contents when `adopt` takes the node).
  async load() {
    const chunks = [];
    const size = await readChunks(this.db, (first, batch) => {
      batch.forEach((chunk, i) => {
        chunks[first + i] = chunk;
      });
    });
    if (size === undefined) return;
    this.savedSize = size;
    if (size > 0 && cutShort(chunks[0] || new Uint8Array(16))) {
      // An interrupted snapshot: a new database (the next save replaces what is stored).
      this._mark(0, size);
      return;
    }
    this.chunks = chunks;
    this.size = size;
  }

  get empty() {
    return this.size === 0;
  }

  // Writes a database file (see the comment at the top) into this object's chunks as it comes, and stores
  // it in one IndexedDB transaction: whole or not at all.
  snapshotWriter() {
    const chunks = [];
    const write = (bytes, position) => putChunks(chunks, bytes, position);
    return {
      write,
      commit: async (head, size) => {
        write(head, 0);
        const count = Math.ceil(size / CHUNK);
        const tx = this.db.transaction(["chunks", "meta"], "readwrite");
        const store = tx.objectStore("chunks");
        store.clear(); // (whatever an earlier file left)
        for (let i = 0; i < count; i++) {
          const chunk = chunks[i] || (chunks[i] = new Uint8Array(CHUNK));
          const length = Math.min(CHUNK, size - i * CHUNK);
          store.put(length === CHUNK ? chunk.buffer : chunk.slice(0, length).buffer, i);
        }
        tx.objectStore("meta").put(size, "size");
        await committed(tx);
        this.chunks = chunks;
        this.size = this.savedSize = size;
        this.dirty.clear();
      },
      discard: async () => {}, // (nothing was stored)
    };
  }

  mount(FS, folder, path) {
    // An empty file whose contents become the loaded chunks (a new database: none, and every write is
    // stored from the first one).
    FS.writeFile(path, new Uint8Array(0));
    this.FS = FS;
    this.path = path;
    this.adopt(FS, path);
  }

  opened() {}

  close() {
    this.db.close();
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
    override(
      FS,
      node,
      {
        read: (stream, buffer, offset, length, position) => file._read(buffer, offset, length, position),
        write: (stream, buffer, offset, length, position) => file._write(buffer, offset, length, position),
        allocate: (stream, offset, length) => file._resize(Math.max(node.usedBytes, offset + length), true),
        mmap: () => {
          throw new FS.ErrnoError(ENODEV); // SQLite does not map this file
        },
      },
      (size) => file._resize(size, false),
    );
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
    putChunks(this.chunks, buffer.subarray(offset, offset + length), position, (i) => this.dirty.add(i));
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
  async save() {
    const FS = this.FS;
    if (!FS.analyzePath(this.path).exists) return;
    this.adopt(FS, this.path);
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

// -- OPFS -------------------------------------------------------------------------------------------------

// How long a start waits for the previous owner's worker to let go of the files (its tab is closing: the
// Web Lock can pass on a moment before the browser closes that worker's access handles).
const HANDLE_WAIT_MS = 20_000;

async function syncAccess(fileHandle) {
  const until = performance.now() + HANDLE_WAIT_MS;
  for (let wait = 10; ; wait = Math.min(wait * 2, 500)) {
    try {
      return await fileHandle.createSyncAccessHandle();
    } catch (error) {
      if (!error || error.name !== "NoModificationAllowedError" || performance.now() > until) throw error;
      await sleep(wait);
    }
  }
}

async function fileIn(folder, name, create) {
  try {
    return await folder.getFileHandle(name, { create });
  } catch (error) {
    if (error && error.name === "NotFoundError") return null;
    throw error;
  }
}

// Reads fetch whole blocks of this size, of which the last BLOCKS read are kept (4 MB a file at most).
const BLOCK = 65536;
const BLOCKS = 64;

// A file whose contents are an OPFS file, read and written through its sync access handle. Each call on
// the handle is a call into the browser (where the browser keeps OPFS in memory, as in a private window, a
// round trip to its storage process), and SQLite reads a page at a time and writes a journal record as
// three writes: writes that continue the one before are gathered and written as one, before anything else
// is done with the file, and a read fetches the block around it (a query scanning a table reads on in it).
//
// The files of one database change in the order SQLite changed them: before a file changes, what its
// `peers` (the database's other file) gathered is written and flushed. SQLite relies on that order (the
// journal holds a transaction's original pages before the database's pages change; the database holds the
// whole transaction before the journal is emptied), and asks for it with fsyncs that never reach this code:
// it calls fdatasync, which Emscripten answers without asking the file system. Without it a closed tab could
// leave pages of a transaction in the database file and a journal that did not say so: a damaged database.
export class OpfsFile {
  constructor(name, access) {
    this.name = name;
    this.access = access;
    this.peers = [];
    this.node = null;
    this.unflushed = false; // written since the last flush
    this.gathered = []; // copies of writes not made yet, one after the other from `gatheredAt`
    this.gatheredAt = 0;
    this.gatheredEnd = 0;
    this.blocks = new Map(); // block index -> its BLOCK bytes as last read or written, least recent first
  }

  // The I/O error SQLite is told of (Emscripten passes only an ErrnoError on to C); the cause is logged.
  _failed(FS, what, error) {
    console.warn(`${what} ${this.name} in the browser's storage failed: ${error}`);
    return new FS.ErrnoError(error && error.name === "QuotaExceededError" ? ENOSPC : EIO);
  }

  attach(FS, node) {
    const file = this;
    this._write();
    node.contents = null;
    node.usedBytes = this.access.getSize();
    override(
      FS,
      node,
      {
        read: (stream, buffer, offset, length, position) => file._read(FS, node, buffer, offset, length, position),
        write: (stream, buffer, offset, length, position) => file._gather(FS, node, buffer, offset, length, position),
        allocate: (stream, offset, length) => {
          if (offset + length > node.usedBytes) file._resize(FS, offset + length);
        },
        mmap: () => {
          throw new FS.ErrnoError(ENODEV); // SQLite does not map this file
        },
        fsync: () => {
          try {
            file.flush();
          } catch (error) {
            throw file._failed(FS, "flushing", error);
          }
          return 0;
        },
      },
      (size) => file._resize(FS, size),
    );
    this.node = node;
  }

  _read(FS, node, buffer, offset, length, position) {
    const size = node.usedBytes;
    if (position >= size) return 0;
    const total = Math.min(length, size - position);
    try {
      this._write();
      for (let copied = 0; copied < total; ) {
        const at = position + copied;
        const index = Math.floor(at / BLOCK);
        const from = at - index * BLOCK;
        const n = Math.min(BLOCK - from, total - copied);
        buffer.set(this._block(index, size).subarray(from, from + n), offset + copied);
        copied += n;
      }
      return total;
    } catch (error) {
      throw this._failed(FS, "reading", error);
    }
  }

  // The block `index` of a file of `size` bytes (past the end: zeros), read unless kept.
  _block(index, size) {
    let block = this.blocks.get(index);
    if (block) {
      this.blocks.delete(index); // (and set again below: now the most recent)
    } else {
      block = new Uint8Array(BLOCK);
      const length = Math.min(BLOCK, size - index * BLOCK);
      const read = this.access.read(block.subarray(0, length), { at: index * BLOCK });
      if (read !== length) throw new Error(`${read} of ${length} bytes read`);
      if (this.blocks.size >= BLOCKS) this.blocks.delete(this.blocks.keys().next().value);
    }
    this.blocks.set(index, block);
    return block;
  }

  // Makes what the other files gathered, and flushes them (see the class's comment).
  _orderAfterPeers() {
    for (const peer of this.peers) peer.flush();
  }

  _gather(FS, node, buffer, offset, length, position) {
    if (!length) return 0;
    try {
      this._orderAfterPeers();
      if (this.gathered.length && position !== this.gatheredEnd) this._write();
      if (!this.gathered.length) this.gatheredAt = this.gatheredEnd = position;
      const bytes = buffer.slice(offset, offset + length); // (a copy: the buffer is WebAssembly's memory)
      this.gathered.push(bytes);
      this.gatheredEnd += length;
      // The blocks kept take the write too.
      for (let index = Math.floor(position / BLOCK); index * BLOCK < position + length; index++) {
        const block = this.blocks.get(index);
        if (!block) continue;
        const start = Math.max(position, index * BLOCK);
        const end = Math.min(position + length, (index + 1) * BLOCK);
        block.set(bytes.subarray(start - position, end - position), start - index * BLOCK);
      }
      if (this.gatheredEnd - this.gatheredAt >= 1 << 20) this._write();
    } catch (error) {
      throw this._failed(FS, "writing", error);
    }
    node.usedBytes = Math.max(node.usedBytes, position + length);
    node.mtime = node.ctime = Date.now();
    return length;
  }

  // Makes the gathered writes (throws what the browser threw).
  _write() {
    const parts = this.gathered;
    if (!parts.length) return;
    this.gathered = [];
    let bytes = parts[0];
    if (parts.length > 1) {
      bytes = new Uint8Array(this.gatheredEnd - this.gatheredAt);
      let at = 0;
      for (const part of parts) {
        bytes.set(part, at);
        at += part.length;
      }
    }
    this.unflushed = true;
    const written = this.access.write(bytes, { at: this.gatheredAt });
    if (written !== bytes.length) throw new Error(`${written} of ${bytes.length} bytes written`);
  }

  _resize(FS, size) {
    this.blocks.clear(); // (bytes past a new end read as zeros if the file grows again)
    try {
      this._orderAfterPeers();
      this._write();
      this.access.truncate(size);
    } catch (error) {
      throw this._failed(FS, "resizing", error);
    }
    this.unflushed = true;
    if (this.node) {
      this.node.usedBytes = size;
      this.node.mtime = this.node.ctime = Date.now();
    }
  }

  // Makes every write and flushes the file to the disk (throws what the browser threw).
  flush() {
    this._write();
    if (!this.unflushed) return;
    this.access.flush();
    this.unflushed = false;
  }
}

export class OpfsStorage {
  // The folder `offline/<name>/` of this origin's OPFS, with the database `<name>.db` and its journal
  // `<name>.db-journal`; null when this browser has no OPFS with sync access handles here.
  static async open(name) {
    if (typeof FileSystemFileHandle === "undefined" || !FileSystemFileHandle.prototype.createSyncAccessHandle) return null;
    if (!self.navigator.storage || !self.navigator.storage.getDirectory) return null;
    let folder;
    try {
      const root = await self.navigator.storage.getDirectory();
      folder = await (await root.getDirectoryHandle("offline", { create: true })).getDirectoryHandle(name, { create: true });
    } catch (error) {
      // (A private window of some browsers, blocked site data: IndexedDB says whether anything is kept.)
      console.warn(`the browser's file system for apps (OPFS) cannot be used here, keeping data in IndexedDB: ${error}`);
      return null;
    }
    const storage = new OpfsStorage(name, folder);
    await storage._open();
    return storage;
  }

  constructor(name, folder) {
    this.kind = "opfs";
    this.name = name;
    this.folder = folder;
    this.files = new Map(); // file name -> OpfsFile: the database and its journal
    this.imported = false; // copied from IndexedDB at this start: the copy there goes once the app opened
  }

  async _open() {
    const dbName = `${this.name}.db`;
    const journalName = `${dbName}-journal`;
    try {
      const pending = (await fileIn(this.folder, "import-pending", false)) !== null;
      let dbHandle = await fileIn(this.folder, dbName, false);
      const fresh = dbHandle === null || pending;
      // The marker is made before the database file: a start that finds the file without it knows the file
      // is whole (a copy from IndexedDB cut short is made again).
      if (fresh) await this.folder.getFileHandle("import-pending", { create: true });
      dbHandle ||= await this.folder.getFileHandle(dbName, { create: true });
      const db = new OpfsFile(dbName, await syncAccess(dbHandle));
      const journal = new OpfsFile(journalName, await syncAccess(await this.folder.getFileHandle(journalName, { create: true })));
      this.files.set(dbName, db).set(journalName, journal);
      if (fresh) {
        journal.access.truncate(0); // (a journal left by an earlier file is not this one's)
        await this._import(db.access);
        await this.folder.removeEntry("import-pending");
      } else if (db.access.getSize() > 0) {
        const first = new Uint8Array(16);
        db.access.read(first, { at: 0 });
        if (cutShort(first)) {
          // An interrupted snapshot (see the comment at the top): a new database, with no journal of its own.
          db.access.truncate(0);
          journal.access.truncate(0);
          db.access.flush();
          journal.access.flush();
        }
      }
    } catch (error) {
      for (const file of this.files.values()) file.access.close();
      throw error && error.code ? error : unreadable(error);
    }
  }

  // The first start on OPFS: the database an earlier version of the app kept in IndexedDB, if any,
  // becomes the OPFS file (the IndexedDB copy is deleted once the app opened it: see opened()).
  async _import(access) {
    access.truncate(0);
    if (typeof indexedDB === "undefined") return;
    if (indexedDB.databases) {
      const names = (await indexedDB.databases()).map((info) => info.name);
      if (!names.includes(`offline:${this.name}`)) return;
    }
    const db = await openIndexedDB(this.name);
    try {
      const size = await readChunks(db, (first, chunks) => {
        chunks.forEach((chunk, i) => {
          if (chunk) access.write(chunk, { at: (first + i) * CHUNK });
        });
      }).catch((error) => {
        throw unreadable(error);
      });
      if (size === undefined) return;
      access.truncate(size);
      access.flush();
      this.imported = true;
    } finally {
      db.close();
    }
  }

  get empty() {
    return this.files.get(`${this.name}.db`).access.getSize() === 0;
  }

  // Writes a database file (see the comment at the top) straight into the OPFS file as it comes: all but its
  // head, flushed to the disk, then its head, flushed.
  snapshotWriter() {
    const access = this.files.get(`${this.name}.db`).access;
    const write = (bytes, at) => {
      const written = access.write(bytes, { at });
      if (written !== bytes.length) throw new Error(`${written} of ${bytes.length} bytes written`);
    };
    return {
      write,
      commit: async (head, size) => {
        access.truncate(size);
        access.flush();
        write(head, 0);
        access.flush();
      },
      discard: async () => {
        access.truncate(0);
        access.flush();
      },
    };
  }

  // Makes the files of `folder` named as the database and its journal keep their contents in OPFS: the
  // database now, the journal whenever SQLite creates it (deleting it empties the OPFS file: a journal with
  // nothing in it is not replayed). A journal with contents is there at startup: the next read rolls back
  // the commit it belongs to.
  mount(FS, folder, path) {
    for (const file of this.files.values()) file.peers = [...this.files.values()].filter((other) => other !== file);
    const dir = FS.lookupPath(folder).node;
    const ops = dir.node_ops;
    const files = this.files;
    dir.node_ops = {
      ...ops,
      mknod(parent, name, mode, dev) {
        const node = ops.mknod(parent, name, mode, dev);
        const file = files.get(name);
        if (file && FS.isFile(mode)) file.attach(FS, node);
        return node;
      },
      unlink(parent, name) {
        ops.unlink(parent, name);
        const file = files.get(name);
        if (file) {
          file.node = null;
          file._resize(FS, 0);
        }
      },
      rename(oldNode, newDir, newName) {
        if (files.has(oldNode.name) || files.has(newName)) throw new FS.ErrnoError(EIO); // (SQLite renames nothing)
        return ops.rename(oldNode, newDir, newName);
      },
    };
    for (const [name, file] of files) {
      const at = `${folder}/${name}`;
      if (at === path || file.access.getSize() > 0) FS.create(at, 0o644);
    }
  }

  // Everything SQLite wrote is in the files once its commit returned (and flushed to the disk where SQLite
  // asked for it); what it left unflushed is flushed here.
  async save() {
    try {
      for (const file of this.files.values()) file.flush();
    } catch (error) {
      throw storageFailure("unwritable", `the browser could not store this app's data (${error})`, error);
    }
  }

  // Lets go of the files (this worker will not serve the database: another tab's may open it).
  close() {
    for (const file of this.files.values()) {
      try {
        file.flush();
      } catch (error) {
        console.warn(`flushing ${file.name} failed: ${error}`);
      }
      file.access.close();
    }
    this.files.clear();
  }

  opened() {
    if (!this.imported) return;
    this.imported = false;
    const request = indexedDB.deleteDatabase(`offline:${this.name}`);
    request.onerror = () => console.warn(`the copy of the data kept in IndexedDB was not deleted: ${request.error}`);
  }
}

// Whether nothing is stored yet for the database `name` (a first start: no OPFS file with contents, no
// IndexedDB database), asked with a few calls into the browser: the worker asks the server for a snapshot
// on this answer while the storage is still being opened (many more calls, each of which may wait for
// Pyodide's long tasks on this thread). False when it cannot tell; `empty` of the opened storage decides
// whether a snapshot is written. Asked only by the tab that owns the database.
export async function nothingStored(name) {
  try {
    const root = await self.navigator.storage.getDirectory();
    const folder = await (await root.getDirectoryHandle("offline")).getDirectoryHandle(name);
    const file = await (await folder.getFileHandle(`${name}.db`)).getFile();
    if (file.size > 0 && !cutShort(new Uint8Array(await file.slice(0, 16).arrayBuffer()))) return false;
  } catch (error) {
    // Not there (a first start), or no OPFS here: IndexedDB says whether anything is kept.
    if (!error || (error.name !== "NotFoundError" && error.name !== "TypeError")) return false;
  }
  if (typeof indexedDB === "undefined" || !indexedDB.databases) return false;
  try {
    if (!(await indexedDB.databases()).some((info) => info.name === `offline:${name}`)) return true;
    return !(await indexedDBHolds(`offline:${name}`));
  } catch {
    return false;
  }
}

// Whether the IndexedDB database `name` (which exists) holds a file: openStorage creates it empty, and runs
// side by side with nothingStored, so being listed is not enough. Opened at whatever version it has; never
// created (if it went away meanwhile, the open is aborted: nothing held).
async function indexedDBHolds(name) {
  const request = indexedDB.open(name);
  request.onupgradeneeded = () => request.transaction.abort();
  let db;
  try {
    db = await done(request);
  } catch (error) {
    if (error && error.name === "AbortError") return false;
    throw error;
  }
  try {
    if (!db.objectStoreNames.contains("meta") || !db.objectStoreNames.contains("chunks")) return false;
    const tx = db.transaction(["meta", "chunks"]);
    const size = await done(tx.objectStore("meta").get("size"));
    if (!size) return false;
    // An interrupted snapshot reads as a new database (StoredFile.load), as in OPFS above.
    const first = await done(tx.objectStore("chunks").get(0));
    return !(first && cutShort(new Uint8Array(first).subarray(0, 16)));
  } finally {
    db.close();
  }
}

// The storage of the database `name`: OPFS where this browser offers it, else IndexedDB.
export async function openStorage(name) {
  return (await OpfsStorage.open(name)) || (await StoredFile.open(name));
}
