// The example's to-do page (the `offline init` template's page, for this example's schema: a to-do has a
// status, open or done, instead of a done flag). All data work happens in Python (todos.py and the offline
// library) inside the worker; this file only renders what the worker reports and forwards clicks as calls.
import { OfflineClient } from "./offline-client.js";
import { ListWindow } from "./list-window.js";
import { notice, showError, showStatus } from "./page-status.js";

const $ = (selector) => document.querySelector(selector);
const client = new OfflineClient();
window.offlineClient = client; // for the browser console (and tests)

// The list is windowed (list-window.js): a list of 50,000 to-dos costs about what one screenful does.
const ROW_HEIGHT = 40; // px, as li's height in style.css
let openCount = 0;

function createRow(id) {
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
  return { item, toggle, title, remove };
}

function updateRow(row, todo) {
  const done = isDone(todo);
  row.item.classList.toggle("done", done);
  row.toggle.checked = done;
  row.toggle.setAttribute("aria-label", `Done: ${todo.title}`);
  row.title.textContent = todo.title;
  row.remove.setAttribute("aria-label", `Delete ${todo.title}`);
}

const rows = new ListWindow({
  list: $("#todos"),
  viewport: $("#list"),
  rowHeight: ROW_HEIGHT,
  createRow,
  updateRow,
  afterDraw: () => {
    $("#count").textContent = `${openCount} left · ${rows.records.length} in total`;
    $("#clear-completed").hidden = openCount === rows.records.length;
  },
});

// The "left" count follows the changes too: no pass over the whole list per write.
const isDone = (todo) => todo.status === "done";
const open = (list) => list.reduce((count, todo) => count + (isDone(todo) ? 0 : 1), 0);

function changed(records, changes) {
  if (changes.reset) openCount = open(records);
  else openCount += open(changes.inserted) + open(changes.updated) - open(changes.previous) - open(changes.removed);
  rows.show(records);
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
    $("#list").addEventListener("scroll", () => rows.drawSoon(), { passive: true });
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

// The service worker's install downloads every file of this build again to keep it (Pyodide and the Python,
// about 17 MB): on a first visit that competed with starting Python and with the first sync for the network
// and the CPU. It is registered once the first sync is over (the sync status settled: synced, offline,
// paused, off or stopped), or SETTLE_MS after the app is ready whatever sync does, or at once if the app
// could not start.
const SETTLED = new Set(["connected", "offline", "disconnected", "disabled", "error"]);
const SETTLE_MS = 20000;

function firstSyncOver() {
  return client.ready.then(
    () =>
      new Promise((resolve) => {
        const settled = () => {
          stop();
          clearTimeout(timer);
          resolve();
        };
        const stop = client.on("status", (status) => SETTLED.has(status.status) && settled());
        const timer = setTimeout(settled, SETTLE_MS);
        if (SETTLED.has(client.status.status)) settled();
      }),
    () => undefined,
  );
}

// Offline reloads: a service worker keeps this page, Pyodide and the Python code in the browser's cache.
const cacheStatus = $("#cache-status");
if ("serviceWorker" in navigator) {
  firstSyncOver()
    .then(() => navigator.serviceWorker.register("./sw.js"))
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
