"""Masking secrets in what is shown, and the quiet reporters satisfying ``platform_adapters.base.Reporter``
(a list in tests, nothing for library callers). The CLI's own is offline_cli.deploy.progress."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by ``***`` (values shorter than 4 characters are left alone,
    so a stray ``1`` does not mangle a message)."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


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
