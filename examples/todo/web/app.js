// The example's to-do page (the `offline init` template's page, for this example's schema: a to-do has a
// status, open or done, instead of a done flag). All data work happens in Python (todos.py and the offline
// library) inside the worker; this file only renders what the worker reports and forwards clicks as calls.
import { OfflineClient } from "./offline-client.js";
import { keepForOffline } from "./offline-reload.js";
import { todoList } from "./todo-list.js";
import { notice, showError, showStatus } from "./page-status.js";

const $ = (selector) => document.querySelector(selector);
const client = new OfflineClient();
window.offlineClient = client; // for the browser console (and tests)

// A to-do of this schema is done when its status says so.
const isDone = (todo) => todo.status === "done";
// The list is windowed (list-window.js, through todo-list.js): a list of 50,000 to-dos costs about what one
// screenful does.
const { rows, changed } = todoList(client, isDone);

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

// Offline reloads: a service worker keeps this page, Pyodide and the Python code (offline-reload.js).
keepForOffline(client);
