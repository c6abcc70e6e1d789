"""Progress reporters satisfying ``platform_adapters.base.Reporter``: rich on stderr, or a list in tests."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***`` (values shorter than 4 characters are left alone,
    so a stray ``1`` does not mangle a message)."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class RichReporter:
    """Numbered steps, notes and warnings on a (stderr) rich console. Secret values are masked."""

    def __init__(self, console: Console, secrets: Iterable[str] = ()) -> None:
        self.console = console
        self.secrets = tuple(secrets)
        self.steps = 0

    def _clean(self, message: str) -> str:
        return escape(redact(message, self.secrets))

    def step(self, title: str) -> None:
        self.steps += 1
        self.console.print(f"[bold cyan]\\[{self.steps}][/bold cyan] [bold]{self._clean(title)}[/bold]")

    def info(self, message: str) -> None:
        self.console.print(f"    {self._clean(message)}", style="dim", highlight=False)

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {self._clean(message)}", highlight=False)

    def success(self, message: str) -> None:
        self.console.print(f"[green]✓[/green] {self._clean(message)}", highlight=False)


@dataclass
class RecordingReporter:
    """Keeps every event as ``(kind, message)``; for tests and for callers that print later."""

    events: list[tuple[str, str]] = field(default_factory=list)

    def step(self, title: str) -> None:
        self.events.append(("step", title))

    def info(self, message: str) -> None:
        self.events.append(("info", message))

    def warn(self, message: str) -> None:
        self.events.append(("warn", message))

    def success(self, message: str) -> None:
        self.events.append(("success", message))

    def of(self, kind: str) -> list[str]:
        return [message for k, message in self.events if k == kind]


class NullReporter:
    """Says nothing (library callers that do not want progress)."""

    def step(self, title: str) -> None:
        pass

    def info(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass
