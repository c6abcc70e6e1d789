"""`offline deploy` as a person at a terminal sees it: the real CLI in a pseudo-terminal (``pty``), the real
questionary prompts, fake flyctl on PATH. A bad app name is asked again with the reason, the plan is shown
before anything is created, and answering no to it creates nothing."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from ._core_fakes import write_project
from .fakes.harness import FakeCliEnv

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>]|\r")
CLEAR_LINE = "\x15"  # Ctrl-U: the prompt's default text is pre-filled; this empties it
ENTER = "\r"


class Terminal:
    """A child process on a pseudo-terminal; ``expect`` waits (generously) for text on its screen."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            close_fds=True,
            start_new_session=True,
        )
        os.close(slave)
        self.raw = ""

    @property
    def screen(self) -> str:
        return ANSI.sub("", self.raw)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the child closed the terminal
            return False
        if not data:
            return False
        self.raw += data.decode("utf-8", "replace")
        return True

    def expect(self, text: str, after: int = 0, deadline: float = 90.0) -> int:
        """Wait until ``text`` is on screen after position ``after``; return where it ends."""
        end = time.monotonic() + deadline
        while True:
            found = self.screen.find(text, after)
            if found >= 0:
                return found + len(text)
            if time.monotonic() > end or not self._read(0.2):
                raise AssertionError(f"{text!r} did not appear; the screen shows:\n{self.screen[-3000:]}")

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def finish(self, deadline: float = 90.0) -> int:
        end = time.monotonic() + deadline
        while self.process.poll() is None and time.monotonic() < end:
            self._read(0.2)
        while self._read(0.05) and select.select([self.master], [], [], 0)[0]:
            pass
        os.close(self.master)
        return self.process.wait(5)


@pytest.mark.skipif(sys.platform == "win32", reason="pseudo-terminals are POSIX")
def test_a_person_fixes_a_bad_app_name_reads_the_plan_and_declines(
    fake_cli: FakeCliEnv, tmp_path: Path
) -> None:
    fake_cli.install("flyctl")
    fake_cli.set_world("fly", {"apps": {}})
    project = write_project(tmp_path / "field-notes")
    env = fake_cli.env({"TERM": "xterm-256color", "PYTHONUNBUFFERED": "1"})
    env["PATH"] = f"{env['PATH']}{os.pathsep}{Path(sys.executable).parent}"
    term = Terminal(
        [sys.executable, "-m", "offline_cli", "deploy", "--project-dir", str(project)], env, tmp_path
    )
    try:
        at = term.expect("Where should the app run?")
        at = term.expect("(not implemented yet)", at)  # stubs are marked in the menu
        term.send(ENTER)  # Fly.io, the recommended first entry
        at = term.expect("App name", at)
        term.send(CLEAR_LINE + "My Notes!" + ENTER)
        at = term.expect("is not a valid app name", at)
        at = term.expect("App name", at)
        term.send(CLEAR_LINE + "my-notes" + ENTER)
        at = term.expect("Region", at)
        term.send(ENTER)
        at = term.expect("platform:  Fly.io (--platform fly)", at)
        at = term.expect("app:       my-notes", at)
        at = term.expect("OFFLINE_ADMIN_TOKEN (new, generated", at)
        at = term.expect("Go ahead?", at)
        term.send("n")
        term.expect("Aborted: nothing was created or changed.", at)
        code = term.finish()
    finally:
        if term.process.poll() is None:
            term.process.kill()
    assert code == 1
    assert fake_cli.world("fly")["apps"] == {}  # nothing was created on the platform
    assert [argv[1:3] for argv in fake_cli.argvs("flyctl")] == [["auth", "whoami"], ["secrets", "list"]]
    assert not (project / ".offline" / "deploy" / "deploy.json").exists()
