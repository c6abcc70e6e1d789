"""OfflineError and its subclasses (SPEC 7.1, DESIGN.md section 2)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from offline.core import errors
from offline.core.errors import (
    ERROR_CODES,
    INVALID_TRANSITION,
    MIGRATION_ROLLBACK,
    SCHEMA_VALIDATION,
    InvalidTransitionError,
    MigrationRollbackError,
    OfflineError,
    SchemaValidationError,
)

SPEC_CODES = [
    "INVALID_SCHEMA",
    "MERGE_CONFLICT",
    "CONSTRAINT_VIOLATION",
    "STORAGE_ERROR",
    "SYNC_ERROR",
    "CLOCK_DRIFT",
    "INVALID_OPERATION",
    "MIGRATION_ROLLBACK",
]

SUBCLASSES: list[tuple[type[OfflineError], str]] = [
    (SchemaValidationError, "SCHEMA_VALIDATION"),
    (MigrationRollbackError, "MIGRATION_ROLLBACK"),
    (InvalidTransitionError, "INVALID_TRANSITION"),
]


def test_base_error_properties() -> None:
    ctx = {"collection": "todos", "field": "title"}
    err = OfflineError("something broke", "STORAGE_ERROR", ctx)
    assert err.message == "something broke"
    assert err.code == "STORAGE_ERROR"
    assert err.context == ctx
    assert err.name == "OfflineError"
    assert isinstance(err, Exception)
    assert "something broke" in str(err)


def test_context_is_none_when_not_given() -> None:
    err = OfflineError("m", "SYNC_ERROR")
    assert err.context is None


def test_context_given_as_keyword() -> None:
    err = OfflineError("m", "SYNC_ERROR", context={"a": 1})
    assert err.context == {"a": 1}


def test_can_be_raised_and_caught_as_exception() -> None:
    with pytest.raises(OfflineError) as info:
        raise OfflineError("bad", "MERGE_CONFLICT", {"x": 1})
    assert info.value.code == "MERGE_CONFLICT"
    assert info.value.context == {"x": 1}


@pytest.mark.parametrize("code", SPEC_CODES)
def test_every_spec_code_has_a_constant(code: str) -> None:
    assert getattr(errors, code) == code
    assert code in ERROR_CODES


@pytest.mark.parametrize("code", SPEC_CODES)
def test_base_error_accepts_every_spec_code(code: str) -> None:
    err = OfflineError(f"failure {code}", code)
    assert err.code == code
    assert err.name == "OfflineError"


def test_subclass_code_constants() -> None:
    assert SCHEMA_VALIDATION == "SCHEMA_VALIDATION"
    assert MIGRATION_ROLLBACK == "MIGRATION_ROLLBACK"
    assert INVALID_TRANSITION == "INVALID_TRANSITION"
    assert {SCHEMA_VALIDATION, MIGRATION_ROLLBACK, INVALID_TRANSITION} <= ERROR_CODES


@pytest.mark.parametrize(("cls", "code"), SUBCLASSES)
def test_subclass_code_and_name(cls: type[Any], code: str) -> None:
    err = cls("went wrong", {"collection": "todos"})
    assert isinstance(err, OfflineError)
    assert issubclass(cls, OfflineError)
    assert err.code == code
    assert err.message == "went wrong"
    assert err.context == {"collection": "todos"}
    assert err.name == "OfflineError"


@pytest.mark.parametrize(("cls", "code"), SUBCLASSES)
def test_subclass_context_defaults_to_none(cls: type[Any], code: str) -> None:
    err = cls("went wrong")
    assert err.context is None
    assert err.code == code


@pytest.mark.parametrize(("cls", "code"), SUBCLASSES)
def test_subclass_caught_as_base(cls: type[Any], code: str) -> None:
    with pytest.raises(OfflineError) as info:
        raise cls("boom")
    assert type(info.value) is cls
    assert info.value.code == code


def test_subclasses_are_distinct() -> None:
    assert not issubclass(SchemaValidationError, MigrationRollbackError)
    assert not issubclass(MigrationRollbackError, SchemaValidationError)
    assert not issubclass(InvalidTransitionError, SchemaValidationError)


@pytest.mark.parametrize(
    "err",
    [
        OfflineError("m", "CLOCK_DRIFT"),
        OfflineError("m", "INVALID_SCHEMA", {"collection": "todos", "nested": {"a": [1, 2]}}),
        SchemaValidationError("bad transitions", {"state": "x"}),
        SchemaValidationError("no context"),
        MigrationRollbackError("removeField on todos", {"collection": "todos"}),
        InvalidTransitionError(
            "no", {"collection": "todos", "field": "status", "from": "a", "to": "b", "allowed": []}
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_pickle_round_trip(err: OfflineError) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(back) is type(err)
        assert back.message == err.message
        assert back.code == err.code
        assert back.context == err.context
        assert back.name == "OfflineError"
        assert str(back) == str(err)


def test_copy_keeps_fields() -> None:
    err = SchemaValidationError("m", {"a": 1})
    for dup in (copy.copy(err), copy.deepcopy(err)):
        assert type(dup) is SchemaValidationError
        assert dup.code == SCHEMA_VALIDATION
        assert dup.context == {"a": 1}


def test_repr_names_class_and_code() -> None:
    text = repr(MigrationRollbackError("m", {"a": 1}))
    assert "MigrationRollbackError" in text
    assert "MIGRATION_ROLLBACK" in text
