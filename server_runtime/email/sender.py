"""The ``EmailSender`` interface, the message it sends, and the console sender used in development.

A sender gets a finished ``EmailMessage`` (recipient, subject, plain text and optional HTML) and delivers it,
raising ``OfflineError`` with code ``EMAIL_DELIVERY_FAILED`` when it cannot; its message never holds a
credential. Apps with another delivery channel (an HTTP email API) subclass ``EmailSender``.
"""

from __future__ import annotations

import abc
import logging
import sys
from dataclasses import dataclass
from typing import Final, TextIO

from ..log_budget import LogBudget

__all__ = ["EMAIL_CONFIG", "EMAIL_DELIVERY_FAILED", "ConsoleEmailSender", "EmailMessage", "EmailSender"]

log = logging.getLogger("offline.server.email")

#: A bad email setting (SMTP URL, sender address, templates folder); the context names the setting.
EMAIL_CONFIG: Final = "EMAIL_CONFIG"
#: A message could not be handed to the mail server.
EMAIL_DELIVERY_FAILED: Final = "EMAIL_DELIVERY_FAILED"


@dataclass(frozen=True, slots=True)
class EmailMessage:
    to: str
    subject: str
    text: str
    html: str | None = None


class EmailSender(abc.ABC):
    """Delivers messages. ``send`` raises ``OfflineError`` (``EMAIL_DELIVERY_FAILED``) when it cannot."""

    #: Whether messages really leave the machine (False: a development sender that only shows them).
    delivers: bool = True

    @abc.abstractmethod
    async def send(self, message: EmailMessage) -> None: ...


class ConsoleEmailSender(EmailSender):
    """Writes each message to ``stream`` (standard error) instead of sending it: for development.

    With ``reveal=True`` (``offline dev``) the whole plain-text body is written, links included, so a developer
    can follow a reset or verification link. With ``reveal=False`` (a server not in development mode that has
    no SMTP settings) only the recipient and subject are logged, at most one line a minute plus a count of the
    rest (``server_runtime.log_budget``; the server warned at start): the body holds a link that signs its
    reader in, and logs are read by more people than the mailbox."""

    delivers = False

    def __init__(self, *, reveal: bool = True, stream: TextIO | None = None) -> None:
        self.reveal = reveal
        self._stream = stream
        self._unsent = LogBudget(log, "'email not sent' lines", period=60.0, burst=1)

    def __repr__(self) -> str:
        return f"ConsoleEmailSender(reveal={self.reveal})"

    async def send(self, message: EmailMessage) -> None:
        if not self.reveal:
            # The server warned once at start that nothing is delivered; a line per message, as a warning,
            # would let a burst of sign-ups flood the logs, so these are informational and budgeted.
            self._unsent.log(
                logging.INFO,
                "email to %s not sent (%r): no SMTP server is configured; set OFFLINE_SMTP_URL",
                message.to,
                message.subject,
            )
            return
        stream = self._stream or sys.stderr
        rule = "-" * 72
        stream.write(
            f"{rule}\nemail (not sent: development)\nTo: {message.to}\nSubject: {message.subject}\n\n"
        )
        stream.write(message.text.rstrip("\n") + f"\n{rule}\n")
        stream.flush()
