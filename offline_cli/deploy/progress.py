"""The deploy's progress as people watch it: numbered steps with their elapsed time, messages that stay, and
the vendors' own output (flyctl, railway, docker, npm, pip) streaming into a small view of its last lines
that collapses when the step ends. All of it, vendor output included, goes to a log file under
``.offline/deploy/logs/`` (DESIGN.md section 7), with every secret value masked, so a failure can point at
the whole story while the terminal shows only its end.

Without a terminal on stderr (CI, a pipe) there is no live view: steps and messages print as lines, vendor
output goes only to the log, and a failure prints its last lines.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.markup import escape

from .reporter import redact

#: Vendor lines the live view shows (the view is bounded; the log keeps everything).
VIEW_LINES = 8
#: Vendor lines kept for a failure report.
TAIL_LINES = 15
LOG_DIR = "logs"


def log_file_name(now: datetime | None = None) -> str:
    """``20260127T101500Z.log``: sortable, one per run, no characters a file system dislikes."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%S%fZ")[:-7] + "Z.log"


class _StepView:
    """What the live view renders: the running step, its elapsed time, and the last vendor lines."""

    def __init__(self, owner: ProgressReporter) -> None:
        self.owner = owner

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        owner = self.owner
        with owner._lock:
            title = owner._title
            elapsed = owner._clock() - owner._started
            lines = list(owner._recent)
        parts = [Text(f"    … {title} ({elapsed:.0f} s)", style="dim")]
        parts += [Text(f"    │ {line}", style="dim", overflow="ellipsis", no_wrap=True) for line in lines]
        return Group(*parts)


class ProgressReporter:
    """A ``platform_adapters.base.Reporter`` that also takes vendor output (``vendor_line``) and keeps the
    log file. ``live`` None: a live view when ``console`` is a terminal."""

    def __init__(
        self,
        console: Console,
        secrets: Iterable[str] = (),
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        view_lines: int = VIEW_LINES,
    ) -> None:
        self.console = console
        self.secrets: list[str] = list(secrets)
        self.live_view = console.is_terminal if live is None else live
        self.steps = 0
        self.log_path: Path | None = None
        self._clock = clock
        self._lock = threading.RLock()
        self._log: IO[str] | None = None
        self._pending: list[str] = []  # what was said before the log file was opened
        self._title = ""
        self._started = clock()
        self._recent: deque[str] = deque(maxlen=view_lines)
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._live: Any = None

    # -- secrets and the log file

    def mask(self, value: str) -> None:
        """A secret learned after start (the generated admin token): never shown or logged from now on."""
        with self._lock:
            self.secrets.append(value)

    def _clean(self, text: str) -> str:
        return redact(text, self.secrets)

    def open_log(self, deploy_dir: Path) -> Path:
        """Start ``<deploy_dir>/logs/<timestamp>.log`` with everything said so far."""
        with self._lock:
            if self.log_path is not None:
                return self.log_path
            folder = deploy_dir / LOG_DIR
            folder.mkdir(parents=True, exist_ok=True)
            self.log_path = folder / log_file_name()
            self._log = self.log_path.open("a", encoding="utf-8")
            for line in self._pending:
                self._log.write(self._clean(line) + "\n")
            self._pending.clear()
            self._log.flush()
            return self.log_path

    def _write_log(self, line: str) -> None:
        with self._lock:
            if self._log is None:
                self._pending.append(line)
                return
            self._log.write(self._clean(line) + "\n")
            self._log.flush()

    # -- the Reporter interface

    def step(self, title: str) -> None:
        with self._lock:
            self._finish_step()
            self.steps += 1
            self._title = self._clean(title)
            self._started = self._clock()
            self._recent.clear()
        self.console.print(
            f"[bold cyan]\\[{self.steps}][/bold cyan] [bold]{escape(self._title)}[/bold]", highlight=False
        )
        self._write_log(f"[{self.steps}] {title}")
        if self.live_view:
            from rich.live import Live  # loaded only when a deploy runs on a terminal

            self._live = Live(
                _StepView(self),
                console=self.console,
                transient=True,
                refresh_per_second=4,
                redirect_stderr=False,
            )
            self._live.start()

    def info(self, message: str) -> None:
        self.console.print(f"    {escape(self._clean(message))}", style="dim", highlight=False)
        self._write_log(f"    {message}")

    def warn(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {escape(self._clean(message))}", highlight=False)
        self._write_log(f"warning: {message}")

    def success(self, message: str) -> None:
        self.console.print(f"[green]✓[/green] {escape(self._clean(message))}", highlight=False)
        self._write_log(f"ok: {message}")

    # -- vendor output

    def vendor_line(self, line: str) -> None:
        """One line a vendor tool printed while it runs: into the view and the log."""
        text = self._clean(line.rstrip("\r\n")).replace("\r", "")
        if not text.strip():
            return
        with self._lock:
            self._recent.append(text)
            self._tail.append(text)
        self._write_log(f"  | {text}")
        live = self._live
        if live is not None:
            live.refresh()

    def vendor_output(self, argv: Sequence[str], stdout: str, stderr: str, returncode: int) -> None:
        """A quick vendor command that ran without streaming: its output goes to the log only."""
        words = " ".join(word for word in argv[:4])
        self._write_log(f"  $ {words} (exit {returncode})")
        for line in f"{stdout}\n{stderr}".splitlines():
            if line.strip():
                self._write_log(f"  | {line}")

    def tail(self) -> list[str]:
        """The last vendor lines (masked), for a failure report."""
        with self._lock:
            return list(self._tail)

    def visible_lines(self) -> list[str]:
        """What the live view shows now under the step title (bounded)."""
        with self._lock:
            return list(self._recent)

    def pause(self) -> None:
        """Stop the live view (a question is about to be asked on the same terminal)."""
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    # -- the end

    def _finish_step(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self.steps:
            elapsed = self._clock() - self._started
            self.console.print(f"    [dim]{escape(self._title)}: {elapsed:.1f} s[/dim]", highlight=False)
            self._write_log(f"    ({elapsed:.1f} s)")

    def close(self) -> None:
        """End the last step (its time is printed) and the log file. Closing twice is harmless."""
        with self._lock:
            if self.steps:
                self._finish_step()
            self.steps = 0
            if self._log is not None:
                self._log.close()
                self._log = None
