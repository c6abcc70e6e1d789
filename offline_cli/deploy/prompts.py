"""Interactive questions of `offline deploy`, behind the ``Prompter`` interface of offline_cli.environment.

``QuestionaryPrompter`` asks with questionary (prompt_toolkit); ``input``/``output`` let a test drive the real
prompts through a pipe. ``ScriptedPrompter`` answers from a list and records the questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class QuestionaryPrompter:
    """The terminal prompter. ``input``/``output`` are prompt_toolkit Input/Output objects (None: the TTY)."""

    def __init__(self, *, input: Any = None, output: Any = None) -> None:
        self.input = input
        self.output = output

    def _io(self) -> dict[str, Any]:
        return {k: v for k, v in (("input", self.input), ("output", self.output)) if v is not None}

    def select(self, message: str, choices: Sequence[tuple[str, str]], default: str | None = None) -> str:
        import questionary

        options = [questionary.Choice(title, value=value) for value, title in choices]
        start = next((c for c in options if c.value == default), None)
        # unsafe_ask: Ctrl-C raises KeyboardInterrupt (click turns it into "Aborted!", exit 1) instead of None.
        answer = questionary.select(message, choices=options, default=start, **self._io()).unsafe_ask()
        return str(answer)

    def text(self, message: str, default: str = "") -> str:
        import questionary

        return str(questionary.text(message, default=default, **self._io()).unsafe_ask())

    def confirm(self, message: str, default: bool = False) -> bool:
        import questionary

        return bool(questionary.confirm(message, default=default, **self._io()).unsafe_ask())


@dataclass
class ScriptedPrompter:
    """Answers questions from ``answers`` in order; ``asked`` records ``(kind, message)``. An unexpected
    question fails loudly rather than hanging."""

    answers: list[Any] = field(default_factory=list)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def _next(self, kind: str, message: str) -> Any:
        self.asked.append((kind, message))
        if not self.answers:
            raise AssertionError(f"unexpected {kind} prompt: {message!r}")
        return self.answers.pop(0)

    def select(self, message: str, choices: Sequence[tuple[str, str]], default: str | None = None) -> str:
        answer = self._next("select", message)
        values = [value for value, _ in choices]
        if answer not in values:
            raise AssertionError(f"{answer!r} is not among the choices {values} of {message!r}")
        return str(answer)

    def text(self, message: str, default: str = "") -> str:
        answer = self._next("text", message)
        return default if answer is None else str(answer)

    def confirm(self, message: str, default: bool = False) -> bool:
        answer = self._next("confirm", message)
        return default if answer is None else bool(answer)
