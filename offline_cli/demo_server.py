"""The built-in demo that `offline dev` serves when a project has no server.py: a shared to-do list."""

from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "votes": t.number().merge("counter").default(0),
                    "tags": t.array(t.string()).default([]),
                    "createdAt": t.timestamp().auto(),
                },
                "indexes": ["done"],
            }
        },
    }
)
