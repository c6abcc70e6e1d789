"""Shared machinery of the fake vendor programs: call log, world file, and a strict flag parser.

Runs inside the fake executables, so it imports only the standard library.

Layout of the state directory (env ``FAKE_CLI_STATE``):
    calls.jsonl      one JSON object per call: tool, argv, cwd, env (names of watched variables that were
                     set, never their values), stdin (file name under stdin/ when stdin was not empty)
    stdin/NNNN.txt   what the call received on stdin
    <vendor>.json    the vendor's world, written by the test and updated by the fake
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

STATE_ENV = "FAKE_CLI_STATE"

#: Environment variables whose presence (not value) is recorded with each call.
WATCHED_ENV = (
    "DATABASE_URL",
    "AUTH_SECRET",
    "PUBLIC_URL",
    "FLY_API_TOKEN",
    "FLY_ACCESS_TOKEN",
    "RAILWAY_TOKEN",
    "RAILWAY_API_TOKEN",
    "NO_COLOR",
    "CI",
)


class UsageError(Exception):
    """A command line the real CLI would reject."""


class Invocation:
    """One run of a fake program: parsed arguments, stdin, and the vendor world."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.tool = Path(sys.argv[0]).name
        self.args = sys.argv[1:]
        self.state_dir = Path(os.environ[STATE_ENV])
        self.cwd = Path.cwd()
        self.stdin = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
        self._record()
        self.world: dict[str, Any] = self._load_world()

    @property
    def world_path(self) -> Path:
        return self.state_dir / f"{self.vendor}.json"

    def _load_world(self) -> dict[str, Any]:
        if self.world_path.exists():
            loaded = json.loads(self.world_path.read_text())
            return loaded if isinstance(loaded, dict) else {}
        return {}

    def save(self) -> None:
        self.world_path.write_text(json.dumps(self.world, indent=2, sort_keys=True))

    def _record(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = self.state_dir / "calls.jsonl"
        index = sum(1 for _ in log.open()) if log.exists() else 0
        stdin_name = None
        if self.stdin:
            stdin_dir = self.state_dir / "stdin"
            stdin_dir.mkdir(exist_ok=True)
            stdin_name = f"{index:04d}.txt"
            (stdin_dir / stdin_name).write_text(self.stdin)
        entry = {
            "tool": self.tool,
            "argv": [self.tool, *self.args],
            "cwd": str(self.cwd),
            "env": sorted(name for name in WATCHED_ENV if os.environ.get(name)),
            "stdin": stdin_name,
        }
        with log.open("a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def next_number(self, key: str = "counter") -> int:
        number = int(self.world.get(key, 0)) + 1
        self.world[key] = number
        return number


class Parsed:
    """Positional words and flags of a command line, checked against what the command accepts."""

    def __init__(self, positionals: list[str], flags: dict[str, list[str | None]]) -> None:
        self.positionals = positionals
        self.flags = flags

    def has(self, name: str) -> bool:
        return name in self.flags

    def value(self, name: str) -> str | None:
        values = self.flags.get(name)
        return values[-1] if values else None

    def values(self, name: str) -> list[str]:
        return [v for v in self.flags.get(name, []) if v is not None]


def parse(
    args: Sequence[str],
    *,
    valued: Iterable[str] = (),
    boolean: Iterable[str] = (),
    optional_value: Iterable[str] = (),
    aliases: dict[str, str] | None = None,
) -> Parsed:
    """Parse ``args`` the way cobra/clap would for a command with exactly these flags.

    ``valued`` flags take the next word (or ``--flag=value``); ``optional_value`` flags take the next word
    unless it starts with ``-``; an unknown flag raises UsageError like the real CLIs do.
    """
    valued_set, boolean_set, optional_set = set(valued), set(boolean), set(optional_value)
    aliases = aliases or {}
    positionals: list[str] = []
    flags: dict[str, list[str | None]] = {}
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word == "-":
            positionals.append(word)
            continue
        name, has_inline, inline = word.partition("=")
        name = aliases.get(name, name)
        if name in boolean_set:
            flags.setdefault(name, []).append(None)
        elif name in valued_set:
            if has_inline:
                value = inline
            elif i < len(words):
                value = words[i]
                i += 1
            else:
                raise UsageError(f"flag needs an argument: {name}")
            flags.setdefault(name, []).append(value)
        elif name in optional_set:
            if has_inline:
                flags.setdefault(name, []).append(inline)
            elif i < len(words) and not words[i].startswith("-"):
                flags.setdefault(name, []).append(words[i])
                i += 1
            else:
                flags.setdefault(name, []).append(None)
        else:
            raise UsageError(f"unknown flag: {name}")
    return Parsed(positionals, flags)


def emit(data: Any) -> None:
    print(json.dumps(data, indent=2))


def fail(message: str, code: int = 1) -> int:
    print(message, file=sys.stderr)
    return code
