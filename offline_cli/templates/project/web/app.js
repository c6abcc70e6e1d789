// The to-do page. All data work happens in Python (todos.py and the offline library) inside the worker;
// this file only renders what the worker reports and forwards clicks as calls.
import { isDesktop, OfflineClient } from "./offline-client.js";
import { keepForOffline } from "./offline-reload.js";
import { todoList } from "./todo-list.js";
import { notice, showError, showStatus } from "./page-status.js";

const $ = (selector) => document.querySelector(selector);
const client = new OfflineClient();
window.offlineClient = client; // for the browser console (and tests)

// The list is windowed (list-window.js, through todo-list.js): a list of 50,000 to-dos costs about what one
// screenful does.
const { rows, changed } = todoList(client);

client.on("status", showStatus);
client.on("log", (entry) => {
  if (entry.level === "warning" || entry.level === "error") notice(entry.message, { kind: entry.level });
});

client.ready.then(
  (info) => {
    for (const field of info.unavailable) {
      notice(field.reason, { key: `unavailable-${field.collection}-${field.field}` });
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

// Offline reloads: a service worker keeps this page, Pyodide and the Python code (offline-reload.js).
// The desktop shell needs none of that (its files are on disk); it has a settings page for the sync server.
if (isDesktop()) {
  const settings = $("#sync-settings");
  settings.hidden = false;
  settings.addEventListener("click", () => window.pywebview.api.open_settings());
} else {
  keepForOffline(client);
}
