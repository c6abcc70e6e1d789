"""Error types shared by every layer (SPEC 7, DESIGN.md section 2).

Every error carries a stable machine-readable ``code`` and an optional ``context`` dict naming what was
wrong, so callers (and the sync protocol) can act on it without parsing messages.
"""

from __future__ import annotations

from typing import Any, Final

INVALID_SCHEMA: Final = "INVALID_SCHEMA"
MERGE_CONFLICT: Final = "MERGE_CONFLICT"
CONSTRAINT_VIOLATION: Final = "CONSTRAINT_VIOLATION"
STORAGE_ERROR: Final = "STORAGE_ERROR"
SYNC_ERROR: Final = "SYNC_ERROR"
CLOCK_DRIFT: Final = "CLOCK_DRIFT"
INVALID_OPERATION: Final = "INVALID_OPERATION"
MIGRATION_ROLLBACK: Final = "MIGRATION_ROLLBACK"
SCHEMA_VALIDATION: Final = "SCHEMA_VALIDATION"
INVALID_TRANSITION: Final = "INVALID_TRANSITION"

#: Every code SPEC 7.1 lists, plus the two DESIGN.md adds for its subclasses.
ERROR_CODES: Final = frozenset(
    {
        INVALID_SCHEMA,
        MERGE_CONFLICT,
        CONSTRAINT_VIOLATION,
        STORAGE_ERROR,
        SYNC_ERROR,
        CLOCK_DRIFT,
        INVALID_OPERATION,
        MIGRATION_ROLLBACK,
        SCHEMA_VALIDATION,
        INVALID_TRANSITION,
    }
)


class OfflineError(Exception):
    """Base class of every error the framework raises on purpose."""

    def __init__(self, message: str, code: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.context = context

    @property
    def name(self) -> str:
        # SPEC 7.1: `name` is always 'OfflineError', whatever the subclass.
        return "OfflineError"

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, {self.code!r}, {self.context!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable (they cross process boundaries in tests and workers).
        return (_rebuild, (type(self), self.message, self.code, self.context))


def _rebuild(
    cls: type[OfflineError], message: str, code: str, context: dict[str, Any] | None
) -> OfflineError:
    err = OfflineError.__new__(cls)
    OfflineError.__init__(err, message, code, context)
    return err


class SchemaValidationError(OfflineError):
    """A builder, modifier or state machine definition was misused."""

    def __init__(self, message: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, SCHEMA_VALIDATION, context)


class MigrationRollbackError(OfflineError):
    """A migration step cannot be rolled back automatically and has no explicit down step."""

    def __init__(self, message: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, MIGRATION_ROLLBACK, context)


class InvalidTransitionError(OfflineError):
    """A write moved a state-machine field along a transition the schema does not allow ('reject')."""

    def __init__(self, message: str, context: dict[str, Any] | None = None) -> None:
        super().__init__(message, INVALID_TRANSITION, context)
