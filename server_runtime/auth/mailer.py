"""Sending the auth routes' emails in the background, so a request never waits for (or reveals) delivery.

A request that should lead to an email submits a job and answers at once; the job (looking the account up,
storing a token, rendering and sending) runs as a task of its own. So the answer to a password-reset request
is the same, and comes as fast, whether or not the address has an account, and a slow or failing mail
server never holds a request. At most ``max_pending`` jobs run at a time; more are dropped with a warning
(the per-address and per-account limits keep honest traffic far below that). A failure is logged with the
sender's message (which never holds the SMTP password) and the recipient is not told.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Final

from offline.core.errors import OfflineError

from ..email.sender import EmailMessage, EmailSender
from ..email.templates import EmailTemplates
from .rate_limit import SlidingWindow

__all__ = ["AuthMailer", "EmailLimits"]

log = logging.getLogger("offline.server.auth")

#: The page of the app each message links to, under ``app_url``.
LINK_PATHS: Final = {"password-reset": "/reset-password", "verify-email": "/verify-email"}


class AuthMailer:
    def __init__(
        self,
        sender: EmailSender | None,
        templates: EmailTemplates,
        *,
        app_url: str | None = None,
        max_pending: int = 256,
    ) -> None:
        self.sender = sender
        self.templates = templates
        self.app_url = app_url.rstrip("/") if app_url else None
        self.max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def configured(self) -> bool:
        return self.sender is not None

    def submit(self, job: Callable[[], Awaitable[None]], what: str) -> None:
        """Run ``job`` in the background (dropped, with a warning, when too many are running)."""
        if len(self._tasks) >= self.max_pending:
            log.warning("email job dropped (%s): %d already running", what, len(self._tasks))
            return

        async def run() -> None:
            try:
                await job()
            except OfflineError as exc:
                log.error("email job failed (%s): [%s] %s", what, exc.code, exc.message)
            except Exception as exc:  # a job must never take the server down; its type says enough
                log.error("email job failed (%s): %s", what, type(exc).__name__)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        self._idle.clear()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def idle(self) -> None:
        """Wait until no job is running (tests; a graceful stop)."""
        await self._idle.wait()

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def link(self, name: str, token: str) -> str | None:
        if self.app_url is None:
            return None
        return f"{self.app_url}{LINK_PATHS[name]}?token={urllib.parse.quote(token, safe='')}"

    def message(self, name: str, to: str, *, token: str, expires_in: int) -> EmailMessage:
        rendered = self.templates.render(
            name,
            {
                "email": to,
                "token": token,
                "link": self.link(name, token),
                "app_url": self.app_url,
                "expires_in_minutes": max(1, expires_in // 60),
            },
        )
        return EmailMessage(to, rendered.subject, rendered.text, rendered.html)

    async def send(self, message: EmailMessage) -> None:
        if self.sender is None:
            return
        await self.sender.send(message)


class EmailLimits:
    """The windows of the emailed-token routes (``RateLimits``' ``email_*`` and ``token_*`` settings)."""

    def __init__(
        self, attempts: int, per_address: int, window: float, tokens: int, token_window: float
    ) -> None:

        #: Password-reset requests per email address as typed (normalised), whether it has an account or not.
        self.per_email = SlidingWindow(attempts, window)
        #: Requests (reset and verification) per client address.
        self.per_address = SlidingWindow(per_address, window)
        #: Messages sent to one account (reset and verification together).
        self.per_account = SlidingWindow(attempts, window)
        #: Wrong, spent or expired tokens presented per client address.
        self.token_failures = SlidingWindow(tokens, token_window)
