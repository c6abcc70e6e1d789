"""The example to-do app's functions: the page calls them by name in its Web Worker (`client.call("add_todo",
"milk")`), where they run on the `offline` library in Pyodide. Each takes the app first."""

from __future__ import annotations

from typing import Any

from offline import App, OfflineError

#: Whose to-dos these are. Without sign-in every browser writes as this one guest, and the server, which has
#: no auth provider in `scripts/main.sh`, syncs every to-do to everyone (the schema's scope needs a user id
#: claim to narrow that down).
GUEST = "guest"


def _title(title: Any) -> str:
    text = str(title).strip()
    if not text:
        raise OfflineError("a to-do needs a title", "INVALID_OPERATION", {"field": "title"})
    return text


def add_todo(app: App, title: str) -> dict[str, Any]:
    """Add an open to-do; a blank title is refused."""
    return app.todos.insert({"title": _title(title), "ownerId": GUEST, "status": "open"})


def toggle_todo(app: App, todo_id: str) -> dict[str, Any]:
    """Mark a to-do done, or open again (the schema allows both moves)."""
    todo = app.todos.find_by_id(todo_id)
    if todo is None:
        raise OfflineError(f"no to-do {todo_id!r}", "INVALID_OPERATION", {"field": "id"})
    return app.todos.update(todo_id, {"status": "open" if todo["status"] == "done" else "done"})


def remove_todo(app: App, todo_id: str) -> bool:
    return app.todos.delete(todo_id)


def clear_completed(app: App) -> int:
    """Delete every done to-do in one transaction; returns how many."""
    done = app.todos.where({"status": "done"}).fetch()
    with app.batch():
        for todo in done:
            app.todos.delete(todo["id"])
    return len(done)


__all__ = ["add_todo", "clear_completed", "remove_todo", "toggle_todo"]
