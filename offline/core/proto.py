"""`generate_proto_definitions`: Protocol Buffers output for a schema (SPEC 2.13, DESIGN.md section 2).

One model of the messages is built first and then rendered twice, as proto3 text (for `protoc`) and as the
protobuf.js JSON descriptor (for `Root.fromJSON()`), so the two can never disagree. Naming rules:

- collection ``todo_items`` / ``todoItems`` -> message ``TodoItemsRecord``;
- field ``dueDate`` -> ``due_date`` (``HTTPCode`` -> ``http_code``); field 1 is always ``string id``;
- an enum field ``status`` of ``todos`` -> nested enum ``TodosRecordStatus`` whose entries are
  ``TODOS_RECORD_STATUS_UNSPECIFIED = 0`` then ``TODOS_RECORD_STATUS_<VALUE>`` numbered from 1.

Names that would collide once converted (two collections, two fields, two enum values, or anything protoc
itself would reject such as equal JSON names) raise `OfflineError` code INVALID_SCHEMA naming both sides.
The output depends only on the schema, so the same schema always gives identical text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .errors import INVALID_SCHEMA, OfflineError
from .fields import FieldDescriptor
from .schema import SchemaDefinition

__all__ = [
    "FIXED_MESSAGE_NAMES",
    "PROTO_PACKAGE",
    "SCALAR_PROTO_TYPES",
    "ProtoOutput",
    "enum_type_name",
    "enum_value_name",
    "generate_proto_definitions",
    "record_message_name",
    "to_pascal_case",
    "to_snake_case",
    "to_upper_snake_case",
]

PROTO_PACKAGE: Final = "offline"

#: Protobuf scalar type of each non-enum, non-array field type (SPEC 2.13).
SCALAR_PROTO_TYPES: Final[Mapping[str, str]] = {
    "string": "string",
    "number": "double",
    "boolean": "bool",
    "timestamp": "int64",
    "richtext": "bytes",
}

#: The messages every generated file carries after the record messages, in output order.
FIXED_MESSAGE_NAMES: Final = (
    "OfflineOperation",
    "HLCTimestamp",
    "OperationBatch",
    "HandshakeMessage",
    "HandshakeResponse",
    "Acknowledgment",
)

# Field numbers 19000-19999 are reserved by protobuf; a record never gets that far.
_FIRST_RESERVED_NUMBER: Final = 19000

_NON_ALNUM: Final = re.compile(r"[^A-Za-z0-9]+")
_ACRONYM_BOUNDARY: Final = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_BOUNDARY: Final = re.compile(r"([a-z0-9])([A-Z])")


@dataclass(frozen=True)
class ProtoOutput:
    """What `generate_proto_definitions` returns (SPEC 2.13)."""

    proto: str
    type_map: dict[str, str]
    json_descriptor: dict[str, Any]


# -- naming --------------------------------------------------------------------------------------------------


def _words(name: str) -> list[str]:
    spaced = _NON_ALNUM.sub("_", name)
    spaced = _ACRONYM_BOUNDARY.sub(r"\1_\2", spaced)
    spaced = _CAMEL_BOUNDARY.sub(r"\1_\2", spaced)
    return [word for word in spaced.split("_") if word]


def to_snake_case(name: str) -> str:
    """``dueDate`` -> ``due_date``, ``HTTPCode`` -> ``http_code``, ``in-progress`` -> ``in_progress``."""
    return "_".join(word.lower() for word in _words(name))


def to_pascal_case(name: str) -> str:
    """``todo_items`` and ``todoItems`` -> ``TodoItems``; ``HTTPCode`` -> ``HttpCode``."""
    return "".join(word[:1].upper() + word[1:].lower() for word in _words(name))


def to_upper_snake_case(name: str) -> str:
    """``TodosRecordStatus`` -> ``TODOS_RECORD_STATUS``; ``inProgress`` -> ``IN_PROGRESS``."""
    return to_snake_case(name).upper()


def record_message_name(collection: str) -> str:
    """``todos`` -> ``TodosRecord``."""
    return f"{to_pascal_case(collection)}Record"


def enum_type_name(collection: str, field: str) -> str:
    """Nested enum of an enum (or array of enum) field: ``{Collection}Record{FieldPascal}``."""
    return f"{record_message_name(collection)}{to_pascal_case(field)}"


def enum_value_name(enum_name: str, value: str) -> str:
    """``('TodosRecordStatus', 'in-progress')`` -> ``TODOS_RECORD_STATUS_IN_PROGRESS``."""
    return f"{to_upper_snake_case(enum_name)}_{to_upper_snake_case(value)}"


def _json_name(field_name: str) -> str:
    # protoc's default JSON name (ToJsonName): drop underscores and upper-case the letter after each one.
    out: list[str] = []
    upper_next = False
    for char in field_name:
        if char == "_":
            upper_next = True
        elif upper_next:
            out.append(char.upper())
            upper_next = False
        else:
            out.append(char)
    return "".join(out)


def _collision(what: str, first: str, second: str, converted: str, **context: Any) -> OfflineError:
    return OfflineError(
        f"{what} {first!r} and {second!r} both become {converted!r} in the generated protobuf definitions; "
        "rename one of them",
        INVALID_SCHEMA,
        {**context, "names": [first, second], "proto_name": converted},
    )


# -- message model -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Enum:
    name: str
    values: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class _Field:
    name: str
    number: int
    type: str
    repeated: bool = False
    key_type: str | None = None

    @property
    def proto_type(self) -> str:
        """The type as written in the .proto file (and in `type_map`)."""
        if self.key_type is not None:
            return f"map<{self.key_type}, {self.type}>"
        return f"repeated {self.type}" if self.repeated else self.type


@dataclass(frozen=True)
class _Message:
    name: str
    fields: tuple[_Field, ...]
    enums: tuple[_Enum, ...] = ()
    comment: str = ""


def _build_enum(name: str, values: Iterable[str], **context: Any) -> _Enum:
    unspecified = f"{to_upper_snake_case(name)}_UNSPECIFIED"
    seen: dict[str, str] = {unspecified: "(the UNSPECIFIED entry)"}
    entries = [(unspecified, 0)]
    for number, value in enumerate(values, start=1):
        if not to_snake_case(value):
            raise OfflineError(
                f"enum value {value!r} of {name} has no letters or digits, so it cannot become a protobuf "
                "enum value name",
                INVALID_SCHEMA,
                {**context, "value": value},
            )
        identifier = enum_value_name(name, value)
        if identifier in seen:
            raise _collision("enum values", seen[identifier], value, identifier, **context)
        seen[identifier] = value
        entries.append((identifier, number))
    return _Enum(name, tuple(entries))


def _record_message(
    collection: str, fields: Mapping[str, FieldDescriptor]
) -> tuple[_Message, dict[str, str]]:
    message_name = record_message_name(collection)
    proto_fields = [_Field("id", 1, "string")]
    enums: list[_Enum] = []
    type_map = {f"{collection}.id": "string"}
    field_names = {"id": "id"}  # proto field name -> schema field name
    json_names = {"id": "id"}
    enum_names: dict[str, str] = {}
    # Enum values live in the message scope (C++ scoping rules), so they must be unique across its enums.
    enum_values: dict[str, str] = {}

    for number, (field_name, descriptor) in enumerate(fields.items(), start=2):
        if number >= _FIRST_RESERVED_NUMBER:
            raise OfflineError(
                f"collection {collection!r} has too many fields for protobuf field numbers",
                INVALID_SCHEMA,
                {"collection": collection, "field": field_name},
            )
        context = {"collection": collection, "field": field_name}
        proto_name = to_snake_case(field_name)
        if proto_name in field_names:
            raise _collision("fields", field_names[proto_name], field_name, proto_name, collection=collection)
        json_name = _json_name(proto_name)
        if json_name in json_names:
            raise _collision(
                "fields (protobuf JSON names)",
                json_names[json_name],
                field_name,
                json_name,
                collection=collection,
            )
        field_names[proto_name] = field_name
        json_names[json_name] = field_name

        repeated = descriptor.type == "array"
        item = descriptor.inner if repeated and descriptor.inner is not None else descriptor
        if item.type == "enum":
            enum = _build_enum(enum_type_name(collection, field_name), item.enum_values or (), **context)
            if enum.name in enum_names:
                raise _collision(
                    "enum fields", enum_names[enum.name], field_name, enum.name, collection=collection
                )
            enum_names[enum.name] = field_name
            for value_name, _ in enum.values:
                if value_name in enum_values:
                    raise _collision(
                        "enum value names of fields",
                        enum_values[value_name],
                        field_name,
                        value_name,
                        collection=collection,
                    )
                enum_values[value_name] = field_name
            enums.append(enum)
            item_type = enum.name
        else:
            item_type = SCALAR_PROTO_TYPES[item.type]
        proto_field = _Field(proto_name, number, item_type, repeated=repeated)
        proto_fields.append(proto_field)
        type_map[f"{collection}.{field_name}"] = proto_field.proto_type

    return _Message(message_name, tuple(proto_fields), tuple(enums)), type_map


def _fixed_messages() -> tuple[_Message, ...]:
    def fields(*specs: tuple[str, str]) -> tuple[_Field, ...]:
        # (name, type as written in the .proto); numbered from 1 in order.
        out = []
        for number, (name, written) in enumerate(specs, start=1):
            if written.startswith("map<"):
                key_type, value_type = written[len("map<") : -1].split(", ")
                out.append(_Field(name, number, value_type, key_type=key_type))
            elif written.startswith("repeated "):
                out.append(_Field(name, number, written.removeprefix("repeated "), repeated=True))
            else:
                out.append(_Field(name, number, written))
        return tuple(out)

    return (
        _Message(
            "OfflineOperation",
            fields(
                ("id", "string"),
                ("node_id", "string"),
                ("type", "OfflineOperationType"),
                ("collection", "string"),
                ("record_id", "string"),
                ("data", "bytes"),
                ("previous_data", "bytes"),
                ("timestamp", "HLCTimestamp"),
                ("sequence_number", "int64"),
                ("causal_deps", "repeated string"),
                ("schema_version", "uint32"),
                # The record's version vector its writer held (offline.core.operations); empty: none.
                ("causal_context", "map<string, int64>"),
            ),
            (_build_enum("OfflineOperationType", ("insert", "update", "delete")),),
            comment="data and previous_data carry canonical JSON (UTF-8); empty when absent.",
        ),
        _Message(
            "HLCTimestamp",
            fields(("wall_time", "int64"), ("logical", "uint32"), ("node_id", "string")),
        ),
        _Message(
            "OperationBatch",
            fields(
                ("operations", "repeated OfflineOperation"),
                ("is_final", "bool"),
                ("batch_index", "uint32"),
            ),
        ),
        _Message(
            "HandshakeMessage",
            fields(
                ("node_id", "string"),
                ("version_vector", "map<string, int64>"),
                ("schema_version", "uint32"),
                ("auth_token", "string"),
            ),
        ),
        _Message(
            "HandshakeResponse",
            fields(
                ("accepted", "bool"),
                ("node_id", "string"),
                ("version_vector", "map<string, int64>"),
                ("schema_version", "uint32"),
                ("server_time", "int64"),
                ("reject_reason", "string"),
            ),
        ),
        _Message(
            "Acknowledgment",
            fields(("acknowledged_message_id", "string"), ("last_sequence_number", "int64")),
        ),
    )


# -- rendering -----------------------------------------------------------------------------------------------


def _render_proto(messages: Iterable[_Message]) -> str:
    lines = ['syntax = "proto3";', "", f"package {PROTO_PACKAGE};"]
    for message in messages:
        lines.append("")
        if message.comment:
            lines.append(f"// {message.comment}")
        lines.append(f"message {message.name} {{")
        for enum in message.enums:
            lines.append(f"  enum {enum.name} {{")
            lines.extend(f"    {name} = {number};" for name, number in enum.values)
            lines.append("  }")
            lines.append("")
        lines.extend(f"  {field.proto_type} {field.name} = {field.number};" for field in message.fields)
        lines.append("}")
    return "\n".join(lines) + "\n"


def _field_json(field: _Field) -> dict[str, Any]:
    if field.key_type is not None:
        return {"keyType": field.key_type, "type": field.type, "id": field.number}
    if field.repeated:
        return {"rule": "repeated", "type": field.type, "id": field.number}
    return {"type": field.type, "id": field.number}


def _render_json(messages: Iterable[_Message]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for message in messages:
        body: dict[str, Any] = {"fields": {field.name: _field_json(field) for field in message.fields}}
        if message.enums:
            body["nested"] = {enum.name: {"values": dict(enum.values)} for enum in message.enums}
        nested[message.name] = body
    return {"nested": {PROTO_PACKAGE: {"nested": nested}}}


def generate_proto_definitions(schema: SchemaDefinition) -> ProtoOutput:
    """Generate the proto3 file, type map and protobuf.js JSON descriptor of ``schema`` (SPEC 2.13)."""
    messages: list[_Message] = []
    type_map: dict[str, str] = {}
    message_names: dict[str, str] = {}
    for collection, definition in schema.collections.items():
        name = record_message_name(collection)
        if name in message_names:
            raise _collision("collections", message_names[name], collection, name)
        message_names[name] = collection
        message, collection_types = _record_message(collection, definition.fields)
        messages.append(message)
        type_map.update(collection_types)
    messages.extend(_fixed_messages())
    return ProtoOutput(
        proto=_render_proto(messages), type_map=type_map, json_descriptor=_render_json(messages)
    )
