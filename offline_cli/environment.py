"""All terminal and process-environment access of the CLI goes through one `Environment` object.

Commands never read `os.environ`, `sys.stdin` or `isatty()` themselves; tests build an Environment with
their own streams and variables and pass it as the click context object. Interactive questions go through
`Environment.get_prompter()` (questionary on the terminal; tests inject a scripted `prompter`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import click
from rich.console import Console

# Variables that CI services set; any of them means nobody is there to answer a prompt.
_CI_VARIABLES = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "CIRCLECI", "JENKINS_URL", "TF_BUILD")


class Prompter(Protocol):
    """Asks the user. ``choices`` of ``select`` are ``(value, title)`` pairs; the chosen value comes back."""

    def select(self, message: str, choices: Sequence[tuple[str, str]], default: str | None = None) -> str: ...

    def text(self, message: str, default: str = "") -> str: ...

    def confirm(self, message: str, default: bool = False) -> bool: ...


@dataclass
class Environment:
    stdin: IO[str] = field(default_factory=lambda: sys.stdin)
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    stdin_isatty: bool | None = None
    stdout_isatty: bool | None = None
    stderr_isatty: bool | None = None
    prompter: Prompter | None = None  # None: questionary on the terminal, created on first use

    def __post_init__(self) -> None:
        if self.stdin_isatty is None:
            self.stdin_isatty = _isatty(self.stdin)
        if self.stdout_isatty is None:
            self.stdout_isatty = _isatty(self.stdout)
        if self.stderr_isatty is None:
            self.stderr_isatty = _isatty(self.stderr)

    @property
    def is_ci(self) -> bool:
        return any(self.env.get(name, "").strip().lower() not in ("", "0", "false") for name in _CI_VARIABLES)

    @property
    def interactive(self) -> bool:
        """True when a prompt may be shown: a terminal on stdin and not running under CI."""
        return bool(self.stdin_isatty) and not self.is_ci

    @property
    def live_progress(self) -> bool:
        """True when progress may redraw itself (a live view of vendor output): a terminal on stderr, not CI,
        and not TERM=dumb. Otherwise progress is plain lines."""
        return bool(self.stderr_isatty) and not self.is_ci and self.env.get("TERM", "") != "dumb"

    @property
    def out(self) -> Console:
        """Console for data (stdout)."""
        return Console(file=self.stdout, force_terminal=bool(self.stdout_isatty), soft_wrap=True)

    @property
    def err(self) -> Console:
        """Console for progress and messages (stderr)."""
        return Console(file=self.stderr, stderr=True, soft_wrap=True)

    def getenv(self, name: str, default: str | None = None) -> str | None:
        return self.env.get(name, default)

    def get_prompter(self) -> Prompter:
        """The one object that asks questions. Callers check `interactive` first."""
        if self.prompter is None:
            from .deploy.prompts import QuestionaryPrompter  # questionary loads only when a prompt is shown

            self.prompter = QuestionaryPrompter()
        return self.prompter


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def current_environment() -> Environment:
    """The Environment of the running click command (a default one outside click or when none was given)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        root = ctx.find_root()
        if isinstance(root.obj, Environment):
            return root.obj
        if root.obj is None:
            env = Environment()
            root.obj = env
            return env
    return Environment()
