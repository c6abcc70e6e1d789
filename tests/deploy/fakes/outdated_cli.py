"""A vendor CLI too old for the commands the adapters run: it records the call and rejects the command line
the way cobra (flyctl) or clap (railway) reject a flag they do not know. Install it under the vendor's
name: ``fake_cli.install("flyctl", "tests.deploy.fakes.outdated_cli")``."""

from __future__ import annotations

import sys

from tests.deploy.fakes._runtime import Invocation, fail


def main() -> int:
    inv = Invocation("outdated")
    flag = next((arg for arg in inv.args if arg.startswith("--")), "--json")
    if inv.tool == "railway":
        return fail(f"error: unexpected argument '{flag}' found\n\nUsage: railway [COMMAND]", 2)
    return fail(f"Error: unknown flag: {flag}")


if __name__ == "__main__":
    sys.exit(main())
