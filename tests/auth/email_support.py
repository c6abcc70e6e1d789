"""Pieces the password-reset and email-verification tests share: auth routes sending through a loopback SMTP
server, the token in a received message, and what an auth store holds in its emailed-token table."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections import Counter
from collections.abc import Mapping
from typing import Any

from server_runtime.auth import AuthRoutes
from server_runtime.auth.storage import AuthStore, _MemoryTx, _SqlTx
from server_runtime.email import EmailTemplates, RenderedEmail, SmtpEmailSender
from tests.support.smtp import MailServer, Received

from .conftest import make_routes

APP = "https://notes.example"
FROM = "Notes <no-reply@notes.example>"
RESET = "Reset your password"  # the shipped templates' subjects
VERIFY = "Confirm your email address"


class CountingTemplates(EmailTemplates):
    """The shipped templates, counting what is rendered for whom (name, recipient)."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: Counter[tuple[str, str]] = Counter()

    def render(self, name: str, context: Mapping[str, Any]) -> RenderedEmail:
        self.rendered[(name, str(context["email"]))] += 1
        return super().render(name, context)


def mail_routes(mail: MailServer, **options: Any) -> AuthRoutes:
    options.setdefault("email_sender", SmtpEmailSender(mail.url(), sender=FROM))
    options.setdefault("app_url", APP)
    return make_routes(**options)


def token_in(message: Received, page: str) -> str:
    """The token of the link to ``page`` (``reset-password`` or ``verify-email``) in the plain-text body."""
    prefix = f"{APP}/{page}?token="
    for line in message.body("plain").splitlines():
        if line.strip().startswith(prefix):
            return urllib.parse.unquote(line.strip()[len(prefix) :])
    raise AssertionError(f"no {page} link in:\n{message.body('plain')}")


async def stored_token_values(store: AuthStore) -> list[str]:
    """Every value of every row of the emailed-token table, as text."""
    async with store.reader() as tx:
        if isinstance(tx, _MemoryTx):
            return [str(v) for row in tx.d.email_tokens.values() for v in dataclasses.astuple(row)]
        assert isinstance(tx, _SqlTx)
        found = await tx.c.fetch("SELECT * FROM offline_auth_email_tokens")
        return [str(v) for row in found for v in row]
