"""`offline schema check`: validate a schema file, show its collections and its protobuf definitions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from offline.core.errors import OfflineError
from offline.core.frozen import thaw
from offline.core.proto import generate_proto_definitions
from offline.core.schema import SchemaDefinition
from offline.core.state_machine import build_state_machine_constraints

from ..environment import current_environment
from ..project import UserFileError, find_schema, load_python_file


@click.group(
    epilog="""\b
Examples:
  offline schema check schema.py
  offline schema check schema.py --json | jq .collections
  offline schema check schema.py --proto-out schema.proto
"""
)
def schema() -> None:
    """Work with a schema file (a Python file defining `schema = define_schema({...})`)."""


def _field_summary(descriptor: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": descriptor.type,
        "required": descriptor.required,
        "merge": descriptor.effective_merge_strategy,
    }
    if descriptor.has_default:
        out["default"] = thaw(descriptor.default_value)
    if descriptor.is_auto:
        out["auto"] = True
    if descriptor.enum_values:
        out["values"] = list(descriptor.enum_values)
    if descriptor.inner is not None:
        out["items"] = descriptor.inner.type
    return out


def schema_summary(definition: SchemaDefinition) -> dict[str, Any]:
    """A JSON-friendly description of a schema."""
    return {
        "version": definition.version,
        "collections": {
            name: {
                "fields": {f: _field_summary(d) for f, d in coll.fields.items()},
                "indexes": list(coll.indexes),
                "constraints": sorted(coll.constraints),
                "resolvers": sorted(coll.resolve),
            }
            for name, coll in definition.collections.items()
        },
        "relations": {
            name: {"from": r.from_, "to": r.to, "type": r.type, "field": r.field, "onDelete": r.on_delete}
            for name, r in definition.relations.items()
        },
        "stateMachines": [
            {
                "collection": c.collection,
                "field": c.field,
                "transitions": {k: list(v) for k, v in c.transitions.items()},
            }
            for c in build_state_machine_constraints(definition)
        ],
    }


@schema.command(
    epilog="""\b
Examples:
  offline schema check schema.py
  offline schema check examples/todo/schema.py --json
"""
)
@click.argument("path", type=click.Path(path_type=Path), default="schema.py")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (collections and proto) to stdout."
)
@click.option(
    "--proto-out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the generated .proto to this file.",
)
def check(path: Path, as_json: bool, proto_out: Path | None) -> None:
    """Validate the schema in PATH (default ./schema.py) and print its collections and .proto."""
    env = current_environment()
    try:
        definition = find_schema(load_python_file(path))
        proto = generate_proto_definitions(definition)
    except UserFileError as exc:
        raise click.ClickException(str(exc)) from None
    except OfflineError as exc:
        raise click.ClickException(
            f"{path}: invalid schema [{exc.code}] {exc.message}\nFix the schema and run the check again."
        ) from None
    if proto_out is not None:
        proto_out.write_text(proto.proto, encoding="utf-8")
    summary = schema_summary(definition)
    if as_json:
        summary["proto"] = proto.proto
        env.stdout.write(json.dumps(summary, indent=2, default=str) + "\n")
        env.stdout.flush()
        return
    out = env.out
    for name, coll in summary["collections"].items():
        table = Table(title=f"{name}", title_justify="left")
        for column in ("field", "type", "required", "merge", "details"):
            table.add_column(column)
        table.add_row("id", "string", "yes", "-", "record id (UUID v7)")
        for field_name, info in coll["fields"].items():
            details = []
            if "values" in info:
                details.append("values: " + ", ".join(info["values"]))
            if "items" in info:
                details.append(f"items: {info['items']}")
            if "default" in info:
                details.append(f"default: {info['default']!r}")
            if info.get("auto"):
                details.append("auto")
            table.add_row(
                field_name,
                info["type"],
                "yes" if info["required"] else "no",
                info["merge"],
                "; ".join(details),
            )
        out.print(table)
    out.print(f"schema version {definition.version}: {len(definition.collections)} collection(s) OK\n")
    env.stdout.write(proto.proto)
    if not proto.proto.endswith("\n"):
        env.stdout.write("\n")
    env.stdout.flush()
    if proto_out is not None:
        env.err.print(f"wrote {proto_out}")
