// The example's to-do page (the `offline init` template's page, for this example's schema: a to-do has a
// status, open or done, instead of a done flag). All data work happens in Python (todos.py and the offline
// library) inside the worker; this file only renders what the worker reports and forwards clicks as calls.
import { isDesktop, OfflineClient } from "./offline-client.js";

const $ = (selector) => document.querySelector(selector);
const client = new OfflineClient();
window.offlineClient = client; // for the browser console (and tests)

const STATUS_TEXT = {
  starting: () => "Starting Python…",
  connecting: () => "Connecting…",
  syncing: () => "Syncing…",
  connected: (s) => (s.pending ? `Syncing ${s.pending} change${s.pending === 1 ? "" : "s"}…` : "Synced"),
  offline: (s) =>
    s.pending
      ? `Offline · ${s.pending} change${s.pending === 1 ? "" : "s"} saved on this device`
      : "Offline · changes are saved on this device",
  disconnected: () => "Sync paused",
  disabled: () => (isDesktop() ? "This computer only (no sync server set)" : "This device only (built without a sync URL)"),
  error: (s) => `Sync stopped: ${s.error ? s.error.message : "unknown error"}`,
};

function showStatus(status) {
  const element = $("#sync-status");
  element.dataset.status = status.status;
  element.dataset.pending = String(status.pending);
  element.textContent = (STATUS_TEXT[status.status] || (() => status.status))(status);
  // A first sync (or a long catch-up) shows how far it is: changes received of the server's total.
  const progress = $("#sync-progress");
  progress.dataset.received = String(status.received);
  progress.dataset.total = String(status.serverTotal);
  progress.hidden = !(status.status === "syncing" && status.received < status.serverTotal);
  if (!progress.hidden) {
    const bar = progress.querySelector("progress");
    bar.max = status.serverTotal;
    bar.value = status.received;
    progress.querySelector("span").textContent =
      `Received ${status.received.toLocaleString("en")} of ${status.serverTotal.toLocaleString("en")} changes from the server`;
  }
}

function notice(text, { kind = "warning", key = null } = {}) {
  if (key && document.querySelector(`#notices [data-key="${key}"]`)) return;
  const element = document.createElement("p");
  element.className = `notice ${kind}`;
  if (key) element.dataset.key = key;
  element.textContent = text;
  $("#notices").append(element);
}

function showError(error) {
  const element = $("#error");
  element.hidden = false;
  element.textContent = error.code ? `${error.message} (${error.code})` : String(error.message || error);
}

// The list is windowed: only the rows in view (and a few around them) exist in the page, each placed at
// its index times a fixed row height, so a list of 50,000 to-dos costs about what one screenful does. A
// live change re-draws only the rows in view whose record changed.
const ROW_HEIGHT = 40; // px, as li's height in style.css
const OVERSCAN = 8; // rows drawn above and below the visible ones
const items = new Map(); // record id -> its row, for the rows drawn
let todos = []; // the whole list, in order (kept by the client from the worker's changes)
let openCount = 0;

function createItem(id) {
  const item = document.createElement("li");
  item.dataset.id = id;
  const toggle = document.createElement("input");
  toggle.type = "checkbox";
  toggle.className = "toggle";
  toggle.addEventListener("change", () => client.call("toggle_todo", id).catch(showError));
  const title = document.createElement("span");
  title.className = "title";
  const remove = document.createElement("button");
  remove.className = "delete";
  remove.type = "button";
  remove.textContent = "×";
  remove.addEventListener("click", () => client.call("remove_todo", id).catch(showError));
  item.append(toggle, title, remove);
  return { item, toggle, title, remove, shown: null, top: -1 };
}

function draw() {
  const list = $("#todos");
  const viewport = $("#list");
  list.style.height = `${todos.length * ROW_HEIGHT}px`;
  const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_HEIGHT) - OVERSCAN);
  const last = Math.min(todos.length, Math.ceil((viewport.scrollTop + viewport.clientHeight) / ROW_HEIGHT) + OVERSCAN);
  const alive = new Set();
  let cursor = list.firstElementChild;
  for (let index = first; index < last; index++) {
    const todo = todos[index];
    alive.add(todo.id);
    let entry = items.get(todo.id);
    if (!entry) items.set(todo.id, (entry = createItem(todo.id)));
    if (entry.shown !== todo) {
      entry.shown = todo; // records are replaced, never changed in place: a new object is a change
      const done = isDone(todo);
      entry.item.classList.toggle("done", done);
      entry.toggle.checked = done;
      entry.toggle.setAttribute("aria-label", `Done: ${todo.title}`);
      entry.title.textContent = todo.title;
      entry.remove.setAttribute("aria-label", `Delete ${todo.title}`);
    }
    if (entry.top !== index) {
      entry.top = index;
      entry.item.style.top = `${index * ROW_HEIGHT}px`;
    }
    // Rows stay in list order in the document too (for assistive technology and the tests).
    if (entry.item === cursor) cursor = cursor.nextElementSibling;
    else list.insertBefore(entry.item, cursor);
  }
  for (const [id, entry] of items) {
    if (!alive.has(id)) {
      entry.item.remove();
      items.delete(id);
    }
  }
  $("#count").textContent = `${openCount} left · ${todos.length} in total`;
  $("#clear-completed").hidden = openCount === todos.length;
}

// Many changes can arrive between two frames (a sync batch, a burst of writes): draw once per frame.
let drawScheduled = false;
function drawSoon() {
  if (drawScheduled) return;
  drawScheduled = true;
  requestAnimationFrame(() => {
    drawScheduled = false;
    draw();
  });
}

// The "left" count follows the changes too: no pass over the whole list per write.
const isDone = (todo) => todo.status === "done";
const open = (list) => list.reduce((count, todo) => count + (isDone(todo) ? 0 : 1), 0);

function changed(records, changes) {
  todos = records;
  if (changes.reset) openCount = open(records);
  else openCount += open(changes.inserted) + open(changes.updated) - open(changes.previous) - open(changes.removed);
  drawSoon();
}

client.on("status", showStatus);
client.on("log", (entry) => {
  if (entry.level === "warning" || entry.level === "error") notice(entry.message, { kind: entry.level });
});

client.ready.then(
  (info) => {
    // This page neither shows nor edits the schema's rich text field (todos.notes), which the browser cannot
    // merge: a footnote says so instead of a warning above the list.
    for (const field of info.unavailable) {
      const note = document.createElement("p");
      note.className = "unavailable";
      note.dataset.field = `${field.collection}.${field.field}`;
      note.textContent = `${field.collection}.${field.field}: ${field.reason}`;
      $("#unavailable").append(note);
    }
    client.collection("todos").orderBy("createdAt").subscribe(changed);
    $("#list").addEventListener("scroll", drawSoon, { passive: true });
    for (const element of [$("#title"), $("#add")]) element.disabled = false;
    document.body.dataset.ready = "true";
    $("#title").focus();
  },
  (error) => {
    showError(error);
    notice(`The app could not start: ${error.message}`, { kind: "error" });
  },
);

$("#new-todo").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("#title");
  const title = input.value;
  if (!title.trim()) return;
  try {
    await client.call("add_todo", title);
    input.value = "";
    $("#error").hidden = true;
  } catch (error) {
    showError(error);
  }
});

$("#clear-completed").addEventListener("click", () => client.call("clear_completed").catch(showError));

// Offline reloads: a service worker keeps this page, Pyodide and the Python code in the browser's cache.
const cacheStatus = $("#cache-status");
if ("serviceWorker" in navigator) {
  navigator.serviceWorker
    .register("./sw.js")
    .then(() => navigator.serviceWorker.ready)
    .then(() => {
      cacheStatus.dataset.cached = "true";
      cacheStatus.textContent = "· works offline";
    })
    .catch((error) => {
      cacheStatus.textContent = "· offline reload unavailable";
      notice(`This page cannot be cached for offline use: ${error.message}`, { key: "sw" });
    });
  // A first visit also gets a controller (the worker claims the page); only a later one means an update.
  const hadController = Boolean(navigator.serviceWorker.controller);
  navigator.serviceWorker.addEventListener("controllerchange", () => {
    if (hadController) notice("A new version of this app is installed; reload the page to use it.", { key: "update" });
  });
} else {
  cacheStatus.textContent = "· offline reload unavailable in this browser";
}
