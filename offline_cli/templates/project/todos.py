"""The to-do list's application code.

The browser runs these functions in its Web Worker (the page calls them by name: `client.call("add_todo",
"milk")`), and desktop.py runs the very same functions on native SQLite. Each takes the app first.
"""

from __future__ import annotations

from typing import Any

from offline import App, OfflineError


def add_todo(app: App, title: str) -> dict[str, Any]:
    """Add a to-do; a blank title is refused."""
    title = str(title).strip()
    if not title:
        raise OfflineError("a to-do needs a title", "INVALID_OPERATION", {"field": "title"})
    return app.todos.insert({"title": title})


def toggle_todo(app: App, todo_id: str) -> dict[str, Any]:
    """Mark a to-do done, or not done again."""
    todo = app.todos.find_by_id(todo_id)
    if todo is None:
        raise OfflineError(f"no to-do {todo_id!r}", "INVALID_OPERATION", {"field": "id"})
    return app.todos.update(todo_id, {"done": not todo["done"]})


def rename_todo(app: App, todo_id: str, title: str) -> dict[str, Any]:
    title = str(title).strip()
    if not title:
        raise OfflineError("a to-do needs a title", "INVALID_OPERATION", {"field": "title"})
    return app.todos.update(todo_id, {"title": title})


def remove_todo(app: App, todo_id: str) -> bool:
    return app.todos.delete(todo_id)


def clear_completed(app: App) -> int:
    """Delete every done to-do in one transaction; returns how many."""
    done = app.todos.where({"done": True}).fetch()
    with app.batch():
        for todo in done:
            app.todos.delete(todo["id"])
    return len(done)


__all__ = ["add_todo", "clear_completed", "remove_todo", "rename_todo", "toggle_todo"]
