"""The `offline` command: a thin click group over lazily imported subcommands.

Subcommands live in their own modules and are imported only when invoked (or listed by --help with their
short help text taken from this table), so `offline --help` never pays for heavy imports such as boto3.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from . import __version__

# name -> (module:attribute, one-line help shown by `offline --help` without importing the module)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "schema": (
        "offline_cli.commands.schema:schema",
        "Check a schema file and print its protobuf definitions.",
    ),
    "init": (
        "offline_cli.commands.init:init",
        "Create a project: a to-do list running the same Python in the browser and the server.",
    ),
    "dev": (
        "offline_cli.commands.dev:dev",
        "Run the project's sync server locally on SQLite, reloading on change.",
    ),
    "deploy": (
        "offline_cli.commands.deploy:deploy",
        "Deploy the project to a hosting platform; also status, logs, rollback.",
    ),
    "status": ("offline_cli.commands.remote:status", "Show a running server's status."),
    "logs": ("offline_cli.commands.remote:logs", "Stream a running server's logs and events."),
    "compact": ("offline_cli.commands.remote:compact", "Compact a running server's operation log."),
    "users": (
        "offline_cli.commands.users:users",
        "Administer a running server's users (list, disable, sign out, delete) and read the audit log.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *SUBCOMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in SUBCOMMANDS:
            target, _ = SUBCOMMANDS[cmd_name]
            module_name, attr = target.split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table so listing commands imports nothing.
        rows = [(name, SUBCOMMANDS[name][1]) for name in sorted(SUBCOMMANDS)]
        rows += [
            (name, cmd.get_short_help_str())
            for name in super().list_commands(ctx)
            if (cmd := super().get_command(ctx, name)) is not None and name not in SUBCOMMANDS
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(sorted(rows))


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  offline init my-todos                   new project: web client (Python in the browser) + server
  offline dev                             serve ./server.py (or a demo) on http://127.0.0.1:3001
  offline deploy --platform host-a --app my-notes --confirm
  offline status --url http://localhost:3001 --token "$OFFLINE_ADMIN_TOKEN"
  offline logs --url http://localhost:3001 --no-follow
  offline schema check schema.py          validate a schema, print collections and .proto
  offline --version
""",
)
@click.version_option(__version__, "-V", "--version", prog_name="offline")
def cli(**_: Any) -> None:
    """offline: offline-first data and sync for Python.

    Apps keep their data in a local SQLite database, every write becomes a content-addressed operation,
    and devices converge through a sync server.
    """


def main() -> None:
    cli(prog_name="offline")


if __name__ == "__main__":
    main()
