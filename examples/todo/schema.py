"""The schema of the example to-do app: one file the CLI, the server and every client share."""

from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "lists": {
                "fields": {
                    "name": t.string(),
                    "ownerId": t.string(),
                    "createdAt": t.timestamp().auto(),
                },
            },
            "todos": {
                "fields": {
                    "title": t.string(),
                    "notes": t.richtext(),
                    "listId": t.string().optional(),
                    "ownerId": t.string(),
                    "status": t.enum(["open", "doing", "done"]).transitions(
                        {"open": ["doing", "done"], "doing": ["open", "done"], "done": ["open"]}
                    ),
                    "priority": t.number().merge("max").default(0),
                    "views": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "dueAt": t.timestamp().optional(),
                    "createdAt": t.timestamp().auto(),
                },
                "indexes": ["listId", "status"],
            },
        },
        "relations": {
            "todoList": {
                "from": "todos",
                "to": "lists",
                "type": "many-to-one",
                "field": "listId",
                "onDelete": "cascade",
            },
        },
        "sync": {
            "lists": {"where": {"ownerId": "userId"}},
            "todos": {"where": {"ownerId": "userId"}},
        },
    }
)
