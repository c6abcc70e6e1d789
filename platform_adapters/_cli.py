"""Helpers shared by the adapters that drive a vendor CLI (Fly.io's ``flyctl``, Railway's ``railway``).

They find the executable, run an argv through ``ctx.runner`` and turn a failed run into a ``DeployError``
whose text never carries a forwarded secret, and they poll the platform for readiness without reading the
wall clock in tests (``ctx.sleep`` is a no-op there, so elapsed time is counted from the sleeps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .base import (
    CLI_NOT_INSTALLED,
    HEALTH_TIMEOUT,
    NOT_AUTHENTICATED,
    PLATFORM_ERROR,
    CommandResult,
    DeployContext,
    DeployError,
    StatusReport,
    masked_values,
)

__all__ = [
    "find_cli",
    "output_tail",
    "poll_until_healthy",
    "redact",
    "run_cli",
    "tail_lines",
]

#: How long a quick vendor call (whoami, status, list) may take before we give up on it.
QUICK_TIMEOUT = 120.0
#: Remote image builds and rollouts: generous, a stuck CLI still ends eventually.
LONG_TIMEOUT = 3600.0
#: What cobra (flyctl) and clap (railway) say about a command line they do not understand.
USAGE_MARKERS = (
    "unknown flag",
    "unknown command",
    "unknown shorthand flag",
    "unrecognized subcommand",
    "unexpected argument",
)


def find_cli(ctx: DeployContext, names: Sequence[str], *, vendor: str, install_hint: str) -> str:
    """The first of ``names`` on the runner's PATH; DeployError(CLI_NOT_INSTALLED) naming them otherwise."""
    for name in names:
        if ctx.runner.which(name):
            return name
    listed = " or ".join(f"`{name}`" for name in names)
    raise DeployError(
        f"host CLI required but not installed: {vendor} needs {listed} on PATH.",
        CLI_NOT_INSTALLED,
        {"cli": list(names)},
        hint=install_hint,
    )


def redact(text: str, ctx: DeployContext) -> str:
    """``text`` with every forwarded secret value (and a database URL's password) masked: vendor output may
    echo what it was given."""
    for value in sorted(masked_values(ctx.env), key=len, reverse=True):
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def tail_lines(text: str, count: int) -> list[str]:
    """The last ``count`` non-blank lines of ``text`` (right-stripped)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-count:] if count > 0 else []


def output_tail(result: CommandResult, ctx: DeployContext, count: int = 6) -> str:
    """What the vendor said last (stderr first, stdout otherwise), redacted, for an error message."""
    lines = tail_lines(result.stderr, count) or tail_lines(result.stdout, count)
    return redact("\n".join(lines), ctx) or f"exit status {result.returncode}"


def command_label(argv: Sequence[str]) -> str:
    # The first words name the command; later ones may be app names or flags, never secrets.
    words = [word for word in argv[:4] if not word.startswith("-")]
    return " ".join(words)


def run_cli(
    ctx: DeployContext,
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    input: str = "",
    env: Mapping[str, str] | None = None,
    timeout: float = QUICK_TIMEOUT,
    check: bool = True,
    hint: str = "",
    auth_markers: Sequence[str] = (),
    login_hint: str = "",
    update_hint: str = "",
    stream: bool = False,
    secret_output: bool = False,
) -> CommandResult:
    """Run ``argv`` (``stream``: its output is shown as it comes, for long steps); with ``check``, a non-zero exit becomes DeployError (NOT_AUTHENTICATED when the output
    contains one of ``auth_markers``, PLATFORM_ERROR otherwise). Stdin is ``input``, empty by default: a
    vendor CLI then sees no terminal and fails instead of waiting for an answer nobody gives."""
    result = ctx.runner.run(
        argv, env=env, cwd=cwd, input=input, timeout=timeout, stream=stream, secret_output=secret_output
    )
    if check and result.returncode != 0:
        raise failure(
            ctx, result, hint=hint, auth_markers=auth_markers, login_hint=login_hint, update_hint=update_hint
        )
    return result


def failure(
    ctx: DeployContext,
    result: CommandResult,
    *,
    hint: str = "",
    auth_markers: Sequence[str] = (),
    login_hint: str = "",
    update_hint: str = "",
) -> DeployError:
    """The DeployError for a failed vendor command. A CLI that rejects the command line itself is most
    likely older than the flags used here, so ``update_hint`` replaces ``hint`` then."""
    detail = output_tail(result, ctx)
    label = command_label(result.argv)
    context = {"command": label, "returncode": result.returncode}
    said = f"{result.stdout}\n{result.stderr}".lower()
    if any(marker.lower() in said for marker in auth_markers):
        return DeployError(
            f"cloud CLI is not authenticated: `{label}` was refused.\n{detail}",
            NOT_AUTHENTICATED,
            context,
            hint=login_hint,
        )
    if update_hint and any(marker in said for marker in USAGE_MARKERS):
        hint = update_hint
    return DeployError(f"`{label}` failed:\n{detail}", PLATFORM_ERROR, context, hint=hint)


def poll_until_healthy(
    ctx: DeployContext,
    probe: Callable[[], StatusReport],
    *,
    what: str,
    hint: str,
    give_up: Callable[[StatusReport], DeployError | None] | None = None,
) -> StatusReport:
    """Call ``probe`` every ``ctx.poll_interval`` seconds until it reports RUNNING and healthy.

    ``give_up`` may turn a report into an error to raise at once (a deployment the platform marked failed).
    After ``ctx.health_timeout`` seconds, raise DeployError(HEALTH_TIMEOUT) with the last report.
    """
    sleep = ctx.sleep or time.sleep
    started = time.monotonic()
    slept = 0.0
    while True:
        report = probe()
        if report.state == "RUNNING" and report.healthy:
            return report
        if give_up is not None and (error := give_up(report)) is not None:
            raise error
        # Counting the sleeps keeps the deadline meaningful when tests make sleep a no-op.
        elapsed = max(slept, time.monotonic() - started)
        if elapsed >= ctx.health_timeout:
            raise DeployError(
                f"{what} did not report healthy within {ctx.health_timeout:.0f} s "
                f"(last state {report.state}).",
                HEALTH_TIMEOUT,
                {"state": report.state, "deployment_id": report.deployment_id, **report.details},
                hint=hint,
            )
        interval = ctx.poll_interval if ctx.poll_interval > 0 else 1.0
        pause = min(interval, ctx.health_timeout - elapsed)
        sleep(pause)
        slept += pause
