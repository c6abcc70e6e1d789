"""The data model, shared by the server, the browser client (Pyodide in a Web Worker) and desktop.py."""

from offline import define_schema, t

schema = define_schema(
    {
        "version": 1,
        "collections": {
            "todos": {
                "fields": {
                    "title": t.string(),
                    "done": t.boolean().default(False),
                    "createdAt": t.timestamp().auto(),
                },
            },
        },
    }
)
