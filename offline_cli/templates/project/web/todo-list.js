// The page's to-do list: a windowed list (list-window.js) whose rows show a to-do (a checkbox, its title, a
// delete button), and the count of those left. The `offline init` template's page and the repository's
// example page both use it; they differ only in what makes a to-do done (`isDone`).
import { ListWindow } from "./list-window.js";
import { showError } from "./page-status.js";

const $ = (selector) => document.querySelector(selector);
const ROW_HEIGHT = 40; // px, as li's height in style.css

/**
 * Draw the to-dos in #todos (scrolled in #list), their counts in #count and whether #clear-completed shows.
 * @param {object} client the page's OfflineClient (a row's clicks are its calls: toggle_todo, remove_todo)
 * @param {(todo: object) => boolean} [isDone] whether a to-do is done
 * @returns {{rows: ListWindow, changed: (records: object[], changes: object) => void}} the list, and what the
 *   live query of the to-dos calls with each change
 */
export function todoList(client, isDone = (todo) => Boolean(todo.done)) {
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
  const open = (list) => list.reduce((count, todo) => count + (isDone(todo) ? 0 : 1), 0);

  function changed(records, changes) {
    if (changes.reset) openCount = open(records);
    else openCount += open(changes.inserted) + open(changes.updated) - open(changes.previous) - open(changes.removed);
    rows.show(records);
  }

  return { rows, changed };
}
