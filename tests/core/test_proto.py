"""generate_proto_definitions (SPEC 2.13, DESIGN.md section 2): naming, type map, determinism, collisions,
and that the output really loads in protoc (grpc_tools) and in protobuf.js (tests/js)."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from offline.core.errors import INVALID_SCHEMA, OfflineError
from offline.core.fields import t
from offline.core.proto import (
    FIXED_MESSAGE_NAMES,
    PROTO_PACKAGE,
    ProtoOutput,
    enum_type_name,
    enum_value_name,
    generate_proto_definitions,
    record_message_name,
    to_pascal_case,
    to_snake_case,
    to_upper_snake_case,
)
from offline.core.schema import SchemaDefinition, define_schema

REPO_ROOT = Path(__file__).resolve().parents[2]
JS_DIR = REPO_ROOT / "tests" / "js"
JS_SCRIPT = JS_DIR / "load_descriptor.mjs"


def full_schema() -> SchemaDefinition:
    """Every field type and modifier the proto generator has to handle."""
    return define_schema(
        {
            "version": 3,
            "collections": {
                "todos": {
                    "fields": {
                        "title": t.string(),
                        "priority": t.number(),
                        "done": t.boolean(),
                        "status": t.enum(["todo", "in-progress", "done"]).transitions(
                            {"todo": ["in-progress"], "in-progress": ["done", "todo"], "done": []}
                        ),
                        "createdAt": t.timestamp().auto(),
                        "tags": t.array(t.string()),
                        "scores": t.array(t.number()),
                        "labels": t.array(t.enum(["urgent", "lowPriority"])),
                        "notes": t.richtext(),
                        "dueDate": t.timestamp().optional(),
                        "assignee": t.string().optional(),
                        "HTTPCode": t.number().optional(),
                    }
                },
                "project_members": {
                    "fields": {
                        "userId": t.string(),
                        "role": t.enum(["owner", "viewer"]).default("viewer"),
                    }
                },
            },
        }
    )


EXPECTED_TYPE_MAP = {
    "todos.id": "string",
    "todos.title": "string",
    "todos.priority": "double",
    "todos.done": "bool",
    "todos.status": "TodosRecordStatus",
    "todos.createdAt": "int64",
    "todos.tags": "repeated string",
    "todos.scores": "repeated double",
    "todos.labels": "repeated TodosRecordLabels",
    "todos.notes": "bytes",
    "todos.dueDate": "int64",
    "todos.assignee": "string",
    "todos.HTTPCode": "double",
    "project_members.id": "string",
    "project_members.userId": "string",
    "project_members.role": "ProjectMembersRecordRole",
}

# (proto field name, number, protobuf.js type, repeated) of TodosRecord, in declaration order.
EXPECTED_TODOS_FIELDS = [
    ("id", 1, "string", False),
    ("title", 2, "string", False),
    ("priority", 3, "double", False),
    ("done", 4, "bool", False),
    ("status", 5, "TodosRecordStatus", False),
    ("created_at", 6, "int64", False),
    ("tags", 7, "string", True),
    ("scores", 8, "double", True),
    ("labels", 9, "TodosRecordLabels", True),
    ("notes", 10, "bytes", False),
    ("due_date", 11, "int64", False),
    ("assignee", 12, "string", False),
    ("http_code", 13, "double", False),
]

EXPECTED_ENUMS = {
    "TodosRecord": {
        "TodosRecordStatus": {
            "TODOS_RECORD_STATUS_UNSPECIFIED": 0,
            "TODOS_RECORD_STATUS_TODO": 1,
            "TODOS_RECORD_STATUS_IN_PROGRESS": 2,
            "TODOS_RECORD_STATUS_DONE": 3,
        },
        "TodosRecordLabels": {
            "TODOS_RECORD_LABELS_UNSPECIFIED": 0,
            "TODOS_RECORD_LABELS_URGENT": 1,
            "TODOS_RECORD_LABELS_LOW_PRIORITY": 2,
        },
    },
    "ProjectMembersRecord": {
        "ProjectMembersRecordRole": {
            "PROJECT_MEMBERS_RECORD_ROLE_UNSPECIFIED": 0,
            "PROJECT_MEMBERS_RECORD_ROLE_OWNER": 1,
            "PROJECT_MEMBERS_RECORD_ROLE_VIEWER": 2,
        }
    },
    "OfflineOperation": {
        "OfflineOperationType": {
            "OFFLINE_OPERATION_TYPE_UNSPECIFIED": 0,
            "OFFLINE_OPERATION_TYPE_INSERT": 1,
            "OFFLINE_OPERATION_TYPE_UPDATE": 2,
            "OFFLINE_OPERATION_TYPE_DELETE": 3,
        }
    },
}


def _f(type_: str, number: int, rule: str | None = None) -> dict[str, Any]:
    return {"rule": rule, "type": type_, "id": number} if rule else {"type": type_, "id": number}


def _map(number: int) -> dict[str, Any]:
    return {"keyType": "string", "type": "int64", "id": number}


EXPECTED_FIXED_JSON: dict[str, Any] = {
    "OfflineOperation": {
        "fields": {
            "id": _f("string", 1),
            "node_id": _f("string", 2),
            "type": _f("OfflineOperationType", 3),
            "collection": _f("string", 4),
            "record_id": _f("string", 5),
            "data": _f("bytes", 6),
            "previous_data": _f("bytes", 7),
            "timestamp": _f("HLCTimestamp", 8),
            "sequence_number": _f("int64", 9),
            "causal_deps": _f("string", 10, "repeated"),
            "schema_version": _f("uint32", 11),
            "causal_context": _map(12),
        },
        "nested": {
            "OfflineOperationType": {"values": EXPECTED_ENUMS["OfflineOperation"]["OfflineOperationType"]}
        },
    },
    "HLCTimestamp": {
        "fields": {"wall_time": _f("int64", 1), "logical": _f("uint32", 2), "node_id": _f("string", 3)}
    },
    "OperationBatch": {
        "fields": {
            "operations": _f("OfflineOperation", 1, "repeated"),
            "is_final": _f("bool", 2),
            "batch_index": _f("uint32", 3),
        }
    },
    "HandshakeMessage": {
        "fields": {
            "node_id": _f("string", 1),
            "version_vector": _map(2),
            "schema_version": _f("uint32", 3),
            "auth_token": _f("string", 4),
        }
    },
    "HandshakeResponse": {
        "fields": {
            "accepted": _f("bool", 1),
            "node_id": _f("string", 2),
            "version_vector": _map(3),
            "schema_version": _f("uint32", 4),
            "server_time": _f("int64", 5),
            "reject_reason": _f("string", 6),
        }
    },
    "Acknowledgment": {
        "fields": {"acknowledged_message_id": _f("string", 1), "last_sequence_number": _f("int64", 2)}
    },
}


@pytest.fixture(scope="module")
def output() -> ProtoOutput:
    return generate_proto_definitions(full_schema())


def _message_block(proto: str, name: str) -> list[str]:
    """The stripped, non-empty lines between `message <name> {` and its closing brace."""
    match = re.search(rf"^message {name} \{{\n(.*?)^\}}\n", proto, re.S | re.M)
    assert match, f"message {name} not found in:\n{proto}"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


# -- naming ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "snake"),
    [
        ("dueDate", "due_date"),
        ("HTTPCode", "http_code"),
        ("todo_items", "todo_items"),
        ("todoItems", "todo_items"),
        ("userID", "user_id"),
        ("address2Line", "address2_line"),
        ("in-progress", "in_progress"),
        ("In Progress", "in_progress"),
        ("trailing_", "trailing"),
        ("a__b", "a_b"),
        ("x", "x"),
    ],
)
def test_to_snake_case(name: str, snake: str) -> None:
    assert to_snake_case(name) == snake


@pytest.mark.parametrize(
    ("name", "pascal"),
    [
        ("todos", "Todos"),
        ("todo_items", "TodoItems"),
        ("todoItems", "TodoItems"),
        ("TodoItems", "TodoItems"),
        ("HTTPCode", "HttpCode"),
        ("dueDate", "DueDate"),
        ("v2Items", "V2Items"),
    ],
)
def test_to_pascal_case(name: str, pascal: str) -> None:
    assert to_pascal_case(name) == pascal


@pytest.mark.parametrize(
    ("name", "upper"),
    [
        ("TodosRecordStatus", "TODOS_RECORD_STATUS"),
        ("in-progress", "IN_PROGRESS"),
        ("inProgress", "IN_PROGRESS"),
        ("IN_PROGRESS", "IN_PROGRESS"),
        ("lowPriority", "LOW_PRIORITY"),
        ("1st", "1ST"),
    ],
)
def test_to_upper_snake_case(name: str, upper: str) -> None:
    assert to_upper_snake_case(name) == upper


def test_message_enum_and_value_names() -> None:
    assert record_message_name("todo_items") == "TodoItemsRecord"
    assert record_message_name("todoItems") == "TodoItemsRecord"
    assert enum_type_name("todos", "status") == "TodosRecordStatus"
    assert enum_type_name("project_members", "accessLevel") == "ProjectMembersRecordAccessLevel"
    assert enum_value_name("TodosRecordStatus", "in-progress") == "TODOS_RECORD_STATUS_IN_PROGRESS"
    assert enum_value_name("TodosRecordStatus", "inProgress") == "TODOS_RECORD_STATUS_IN_PROGRESS"


# -- proto text --------------------------------------------------------------------------------------------


def test_proto_starts_with_syntax_and_declares_package(output: ProtoOutput) -> None:
    assert output.proto.startswith('syntax = "proto3";\n')
    assert "\npackage offline;\n" in output.proto
    assert PROTO_PACKAGE == "offline"
    assert output.proto.endswith("}\n")


def test_messages_in_order_records_first_then_fixed(output: ProtoOutput) -> None:
    names = re.findall(r"^message (\w+) \{", output.proto, re.M)
    assert names == ["TodosRecord", "ProjectMembersRecord", *FIXED_MESSAGE_NAMES]
    assert list(output.json_descriptor["nested"]["offline"]["nested"]) == names


def test_record_message_fields_enums_and_numbering(output: ProtoOutput) -> None:
    lines = _message_block(output.proto, "TodosRecord")
    expected_enum_lines = []
    for enum_name, values in EXPECTED_ENUMS["TodosRecord"].items():
        expected_enum_lines += [f"enum {enum_name} {{", *(f"{k} = {v};" for k, v in values.items()), "}"]
    expected_field_lines = [
        f"{'repeated ' if repeated else ''}{type_} {name} = {number};"
        for name, number, type_, repeated in EXPECTED_TODOS_FIELDS
    ]
    assert lines == expected_enum_lines + expected_field_lines

    assert _message_block(output.proto, "ProjectMembersRecord") == [
        "enum ProjectMembersRecordRole {",
        "PROJECT_MEMBERS_RECORD_ROLE_UNSPECIFIED = 0;",
        "PROJECT_MEMBERS_RECORD_ROLE_OWNER = 1;",
        "PROJECT_MEMBERS_RECORD_ROLE_VIEWER = 2;",
        "}",
        "string id = 1;",
        "string user_id = 2;",
        "ProjectMembersRecordRole role = 3;",
    ]


def test_fixed_messages_text(output: ProtoOutput) -> None:
    assert _message_block(output.proto, "HandshakeMessage") == [
        "string node_id = 1;",
        "map<string, int64> version_vector = 2;",
        "uint32 schema_version = 3;",
        "string auth_token = 4;",
    ]
    assert _message_block(output.proto, "OperationBatch") == [
        "repeated OfflineOperation operations = 1;",
        "bool is_final = 2;",
        "uint32 batch_index = 3;",
    ]
    op_lines = _message_block(output.proto, "OfflineOperation")
    assert "HLCTimestamp timestamp = 8;" in op_lines
    assert "OfflineOperationType type = 3;" in op_lines
    assert "bytes previous_data = 7;" in op_lines


def test_type_map_covers_every_field_type(output: ProtoOutput) -> None:
    assert output.type_map == EXPECTED_TYPE_MAP
    assert list(output.type_map) == list(EXPECTED_TYPE_MAP)  # id first, then schema order


def test_type_map_matches_the_declarations_in_the_proto_text(output: ProtoOutput) -> None:
    schema = full_schema()
    for key, proto_type in output.type_map.items():
        collection, field = key.split(".")
        block = _message_block(output.proto, record_message_name(collection))
        assert any(line.startswith(f"{proto_type} {to_snake_case(field)} = ") for line in block), key
    assert {k.split(".")[0] for k in output.type_map} == set(schema.collections)


def test_json_descriptor_shape(output: ProtoOutput) -> None:
    nested = output.json_descriptor["nested"]["offline"]["nested"]
    todos = nested["TodosRecord"]
    assert todos["fields"] == {
        name: _f(type_, number, "repeated" if repeated else None)
        for name, number, type_, repeated in EXPECTED_TODOS_FIELDS
    }
    assert todos["nested"] == {
        name: {"values": values} for name, values in EXPECTED_ENUMS["TodosRecord"].items()
    }
    for name, expected in EXPECTED_FIXED_JSON.items():
        assert nested[name] == expected, name
    assert set(output.json_descriptor) == {"nested"}
    json.dumps(output.json_descriptor)  # plain JSON data


def test_output_is_frozen(output: ProtoOutput) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        output.proto = ""  # type: ignore[misc]


def test_output_is_deterministic(output: ProtoOutput) -> None:
    again = generate_proto_definitions(full_schema())
    assert again == output
    assert json.dumps(again.json_descriptor) == json.dumps(output.json_descriptor)
    # A fresh interpreter with a different hash seed gives the same bytes.
    code = (
        "import json, sys; from tests.core.test_proto import full_schema;"
        "from offline.core.proto import generate_proto_definitions as g; o = g(full_schema());"
        "sys.stdout.write(json.dumps([o.proto, o.type_map, o.json_descriptor]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout == json.dumps([output.proto, output.type_map, output.json_descriptor])


# -- collisions --------------------------------------------------------------------------------------------


def _schema(collections: dict[str, Any]) -> SchemaDefinition:
    return define_schema({"version": 1, "collections": collections})


def _collision(collections: dict[str, Any]) -> OfflineError:
    schema = _schema(collections)
    with pytest.raises(OfflineError) as info:
        generate_proto_definitions(schema)
    assert info.value.code == INVALID_SCHEMA
    return info.value


def test_collection_names_that_collide_raise() -> None:
    err = _collision(
        {"todo_items": {"fields": {"a": t.string()}}, "todoItems": {"fields": {"a": t.string()}}}
    )
    assert "todo_items" in err.message and "todoItems" in err.message and "TodoItemsRecord" in err.message
    assert err.context is not None and err.context["names"] == ["todo_items", "todoItems"]


def test_field_names_that_collide_raise() -> None:
    err = _collision({"todos": {"fields": {"dueDate": t.timestamp(), "due_date": t.timestamp()}}})
    assert "dueDate" in err.message and "due_date" in err.message
    assert err.context is not None and err.context["collection"] == "todos"
    assert err.context["names"] == ["dueDate", "due_date"]


def test_field_colliding_with_the_id_field_raises() -> None:
    err = _collision({"todos": {"fields": {"ID": t.string()}}})
    assert err.context is not None and err.context["names"] == ["id", "ID"]


def test_fields_with_the_same_protobuf_json_name_raise() -> None:
    # protoc rejects `item_2` next to `item2`: both have the JSON name `item2`.
    err = _collision({"todos": {"fields": {"item_2": t.string(), "item2": t.string()}}})
    assert "item_2" in err.message and "item2" in err.message


def test_enum_values_that_collide_raise() -> None:
    err = _collision({"todos": {"fields": {"status": t.enum(["in-progress", "inProgress"])}}})
    assert "in-progress" in err.message and "inProgress" in err.message
    assert "TODOS_RECORD_STATUS_IN_PROGRESS" in err.message
    assert err.context is not None and err.context["field"] == "status"


def test_enum_value_colliding_with_unspecified_raises() -> None:
    err = _collision({"todos": {"fields": {"status": t.enum(["open", "unspecified"])}}})
    assert "TODOS_RECORD_STATUS_UNSPECIFIED" in err.message


def test_enum_value_without_letters_or_digits_raises() -> None:
    err = _collision({"todos": {"fields": {"mood": t.enum(["ok", "!!"])}}})
    assert "'!!'" in err.message
    assert err.context is not None and err.context["value"] == "!!"


def test_enum_values_of_two_fields_in_one_message_scope_collide() -> None:
    # Nested enum values share the message scope: status/x_y and statusX/y are both TODOS_RECORD_STATUS_X_Y.
    err = _collision({"todos": {"fields": {"status": t.enum(["x_y"]), "statusX": t.enum(["y"])}}})
    assert "TODOS_RECORD_STATUS_X_Y" in err.message and "statusX" in err.message


def test_same_enum_values_in_different_fields_are_fine() -> None:
    out = generate_proto_definitions(
        _schema({"todos": {"fields": {"a": t.enum(["x"]), "b": t.array(t.enum(["x"]))}}})
    )
    assert "TODOS_RECORD_A_X = 1;" in out.proto and "TODOS_RECORD_B_X = 1;" in out.proto
    assert out.type_map["todos.b"] == "repeated TodosRecordB"


# -- protoc (grpc_tools) -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled(output: ProtoOutput, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Compile the generated proto with real protoc; load it into a private descriptor pool."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools is a test dependency (pip install offline[test])")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

    tmp = tmp_path_factory.mktemp("proto")
    (tmp / "offline_schema.proto").write_text(output.proto, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"--python_out={tmp}",
            f"--descriptor_set_out={tmp / 'x.pb'}",
            str(tmp / "offline_schema.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"protoc failed:\n{result.stderr}\n{output.proto}"
    assert (tmp / "offline_schema_pb2.py").is_file()
    file_set = descriptor_pb2.FileDescriptorSet.FromString((tmp / "x.pb").read_bytes())
    assert len(file_set.file) == 1
    # A private pool, so this never clashes with other tests' files in the default pool.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_set.file[0])

    def message_class(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"offline.{name}"))

    return {"file": file_set.file[0], "message_class": message_class, "dir": tmp}


def _descriptor_as_protobufjs_json(file: Any) -> dict[str, Any]:
    """Turn protoc's FileDescriptorProto into the protobuf.js JSON form, to compare with json_descriptor."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    scalar = {
        fdp.TYPE_STRING: "string",
        fdp.TYPE_DOUBLE: "double",
        fdp.TYPE_BOOL: "bool",
        fdp.TYPE_INT64: "int64",
        fdp.TYPE_UINT32: "uint32",
        fdp.TYPE_BYTES: "bytes",
    }

    def type_of(field: Any) -> str:
        return scalar.get(field.type) or field.type_name.rsplit(".", 1)[-1]

    messages: dict[str, Any] = {}
    for message in file.message_type:
        map_entries = {m.name: m for m in message.nested_type if m.options.map_entry}
        fields: dict[str, Any] = {}
        for field in message.field:
            entry = map_entries.get(field.type_name.rsplit(".", 1)[-1])
            if entry is not None:
                key, value = entry.field
                fields[field.name] = {"keyType": type_of(key), "type": type_of(value), "id": field.number}
            elif field.label == fdp.LABEL_REPEATED:
                fields[field.name] = {"rule": "repeated", "type": type_of(field), "id": field.number}
            else:
                fields[field.name] = {"type": type_of(field), "id": field.number}
        body: dict[str, Any] = {"fields": fields}
        if message.enum_type:
            body["nested"] = {
                enum.name: {"values": {v.name: v.number for v in enum.value}} for enum in message.enum_type
            }
        messages[message.name] = body
    return {"nested": {file.package: {"nested": messages}}}


def test_protoc_descriptor_matches_promises(output: ProtoOutput, compiled: dict[str, Any]) -> None:
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FieldDescriptorProto
    file = compiled["file"]
    assert file.package == "offline"
    assert file.syntax == "proto3"
    assert [m.name for m in file.message_type] == [
        "TodosRecord",
        "ProjectMembersRecord",
        *FIXED_MESSAGE_NAMES,
    ]

    todos = next(m for m in file.message_type if m.name == "TodosRecord")
    scalar = {"string": fdp.TYPE_STRING, "double": fdp.TYPE_DOUBLE, "bool": fdp.TYPE_BOOL}
    scalar |= {"int64": fdp.TYPE_INT64, "bytes": fdp.TYPE_BYTES}
    got = [(f.name, f.number, f.type, f.label, f.type_name) for f in todos.field]
    want = [
        (
            name,
            number,
            scalar.get(type_, fdp.TYPE_ENUM),
            fdp.LABEL_REPEATED if repeated else fdp.LABEL_OPTIONAL,
            "" if type_ in scalar else f".offline.TodosRecord.{type_}",
        )
        for name, number, type_, repeated in EXPECTED_TODOS_FIELDS
    ]
    assert got == want
    for message in file.message_type:
        enums = {e.name: {v.name: v.number for v in e.value} for e in message.enum_type}
        assert enums == EXPECTED_ENUMS.get(message.name, {}), message.name

    op = next(m for m in file.message_type if m.name == "OfflineOperation")
    timestamp = next(f for f in op.field if f.name == "timestamp")
    assert (timestamp.type, timestamp.type_name) == (fdp.TYPE_MESSAGE, ".offline.HLCTimestamp")

    # Everything protoc saw is exactly what json_descriptor tells protobuf.js.
    assert _descriptor_as_protobufjs_json(file) == output.json_descriptor


def _python_todo(message_class: Any) -> Any:
    todos = message_class("TodosRecord")
    status, labels = todos.TodosRecordStatus, todos.TodosRecordLabels
    return todos(
        id="018f2c1e-0000-7000-8000-000000000001",
        title="Write tests",
        priority=2.5,
        done=True,
        status=status.Value("TODOS_RECORD_STATUS_IN_PROGRESS"),
        created_at=1_700_000_000_000,
        tags=["a", "b"],
        scores=[1.0, 0.25],
        labels=[labels.Value("TODOS_RECORD_LABELS_LOW_PRIORITY"), labels.Value("TODOS_RECORD_LABELS_URGENT")],
        notes=b"\x00\x01yjs-update",
        due_date=1_700_000_123_456,
        assignee="ann",
        http_code=404,
    )


def test_protoc_messages_round_trip(compiled: dict[str, Any]) -> None:
    message_class = compiled["message_class"]
    todo = _python_todo(message_class)
    parsed = message_class("TodosRecord").FromString(todo.SerializeToString())
    assert parsed == todo
    assert parsed.status == 2 and list(parsed.labels) == [2, 1]
    assert parsed.created_at == 1_700_000_000_000 and parsed.notes == b"\x00\x01yjs-update"

    op_class = message_class("OfflineOperation")
    op = op_class(
        id="op-1",
        node_id="n1",
        type=op_class.OfflineOperationType.Value("OFFLINE_OPERATION_TYPE_UPDATE"),
        collection="todos",
        record_id="r1",
        data=b'{"title":"x"}',
        timestamp=message_class("HLCTimestamp")(wall_time=1_700_000_000_000, logical=3, node_id="n1"),
        sequence_number=7,
        causal_deps=["op-0"],
        schema_version=3,
    )
    batch = message_class("OperationBatch")(operations=[op], is_final=True, batch_index=1)
    parsed_batch = message_class("OperationBatch").FromString(batch.SerializeToString())
    assert parsed_batch.operations[0].timestamp.logical == 3 and parsed_batch.is_final
    handshake = message_class("HandshakeMessage")(
        node_id="n1", version_vector={"n1": 7, "n2": 2}, schema_version=3
    )
    parsed_handshake = message_class("HandshakeMessage").FromString(handshake.SerializeToString())
    assert dict(parsed_handshake.version_vector) == {"n1": 7, "n2": 2}


# -- protobuf.js (tests/js) --------------------------------------------------------------------------------


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so the protobuf.js check may not be skipped")
    print(f"skipping protobuf.js check: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    node_bin, npm_bin = shutil.which("node"), shutil.which("npm")
    if node_bin is None or npm_bin is None:
        missing = " and ".join(name for name, path in (("node", node_bin), ("npm", npm_bin)) if path is None)
        _unavailable(f"Node.js tooling not found on PATH ({missing}); install Node 20+ with npm")
    assert node_bin is not None and npm_bin is not None
    if not (JS_DIR / "node_modules" / "protobufjs" / "package.json").is_file():
        result = subprocess.run(
            [npm_bin, "ci", "--prefix", str(JS_DIR), "--no-audit", "--no-fund"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            _unavailable(f"`npm ci --prefix tests/js` failed:\n{result.stdout}\n{result.stderr}")
    return node_bin


def test_json_descriptor_loads_in_protobufjs(
    output: ProtoOutput, compiled: dict[str, Any], node: str, tmp_path: Path
) -> None:
    message_class = compiled["message_class"]
    python_wire = base64.b64encode(_python_todo(message_class).SerializeToString()).decode()
    sample = {
        "id": "018f2c1e-0000-7000-8000-000000000001",
        "title": "Write tests",
        "priority": 2.5,
        "done": True,
        "status": "TODOS_RECORD_STATUS_IN_PROGRESS",
        "created_at": "1700000000000",
        "tags": ["a", "b"],
        "scores": [1, 0.25],
        "labels": ["TODOS_RECORD_LABELS_LOW_PRIORITY", "TODOS_RECORD_LABELS_URGENT"],
        "notes": base64.b64encode(b"\x00\x01yjs-update").decode(),
        "due_date": "1700000123456",
        "assignee": "ann",
        "http_code": 404,
    }
    (tmp_path / "descriptor.json").write_text(json.dumps(output.json_descriptor), encoding="utf-8")
    (tmp_path / "samples.json").write_text(
        json.dumps({"objects": {"TodosRecord": sample}, "wire": {"TodosRecord": python_wire}}),
        encoding="utf-8",
    )
    (tmp_path / "offline_schema.proto").write_text(output.proto, encoding="utf-8")
    result = subprocess.run(
        [
            node,
            str(JS_SCRIPT),
            str(tmp_path / "descriptor.json"),
            str(tmp_path / "samples.json"),
            str(tmp_path / "offline_schema.proto"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)

    assert summary["package"] == "offline"
    assert list(summary["messages"]) == ["TodosRecord", "ProjectMembersRecord", *FIXED_MESSAGE_NAMES]
    assert summary["records"] == ["TodosRecord", "ProjectMembersRecord"]
    todos = summary["messages"]["TodosRecord"]
    assert {name: (f["id"], f["type"], f["rule"]) for name, f in todos["fields"].items()} == {
        name: (number, type_, "repeated" if repeated else "optional")
        for name, number, type_, repeated in EXPECTED_TODOS_FIELDS
    }
    assert todos["fields"]["status"]["resolvedType"] == "offline.TodosRecord.TodosRecordStatus"
    assert todos["fields"]["labels"]["resolvedType"] == "offline.TodosRecord.TodosRecordLabels"
    for message, enums in EXPECTED_ENUMS.items():
        assert summary["messages"][message]["enums"] == enums, message
    handshake = summary["messages"]["HandshakeMessage"]["fields"]["version_vector"]
    assert (handshake["keyType"], handshake["type"], handshake["id"]) == ("string", "int64", 2)
    timestamp = summary["messages"]["OfflineOperation"]["fields"]["timestamp"]
    assert timestamp["resolvedType"] == "offline.HLCTimestamp"

    # protobuf.js encodes and decodes the sample without loss.
    todo_trip = summary["roundTrip"]["TodosRecord"]
    assert todo_trip["decoded"] == sample
    # Cross-runtime: what Python encodes, protobuf.js decodes, and the other way round.
    assert todo_trip["wireDecoded"] == sample
    from_js = message_class("TodosRecord").FromString(base64.b64decode(todo_trip["encoded"]))
    assert from_js == _python_todo(message_class)
    members = summary["roundTrip"]["ProjectMembersRecord"]["decoded"]
    assert members == {"id": "", "user_id": "", "role": "PROJECT_MEMBERS_RECORD_ROLE_UNSPECIFIED"}

    # protobuf.js parsing the .proto text yields exactly the JSON descriptor.
    assert summary["parsedProto"] == output.json_descriptor
