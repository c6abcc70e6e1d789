"""Email settings of a server built from the environment (``python -m server_runtime``).

- ``OFFLINE_SMTP_URL``: ``smtp://user:pass@host:587?starttls=1`` or ``smtps://user:pass@host:465`` (see
  ``smtp``); ``OFFLINE_EMAIL_FROM`` (required with it): the From address, e.g. ``App <no-reply@app.example>``.
- Without ``OFFLINE_SMTP_URL`` messages go to a ``ConsoleEmailSender``: with ``OFFLINE_DEV=1`` (set by
  ``offline dev``) it prints them with their links; otherwise the server warns at start that no email will
  be delivered, and each message is logged without its body.
- ``OFFLINE_EMAIL_TEMPLATES``: a folder of templates overriding the shipped ones (see ``templates``).
- ``OFFLINE_APP_URL``: the app's address; links in messages point at ``/reset-password`` and
  ``/verify-email`` under it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from offline.core.errors import OfflineError

from .sender import EMAIL_CONFIG, ConsoleEmailSender, EmailSender
from .smtp import SmtpEmailSender, check_sender_address
from .templates import EmailTemplates

__all__ = ["DEV_ENV", "email_options_from_environment", "is_dev_mode"]

log = logging.getLogger("offline.server.email")

#: Set to 1 by ``offline dev``: the server runs on a developer's machine.
DEV_ENV: Final = "OFFLINE_DEV"


def is_dev_mode(env: Mapping[str, str]) -> bool:
    return env.get(DEV_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def email_options_from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """``email_sender``, ``email_templates`` and ``app_url`` keyword arguments for ``create_auth_routes``."""
    url = env.get("OFFLINE_SMTP_URL", "").strip()
    sender_address = env.get("OFFLINE_EMAIL_FROM", "").strip()
    sender: EmailSender
    if url:
        if not sender_address:
            raise OfflineError(
                "OFFLINE_SMTP_URL is set but OFFLINE_EMAIL_FROM is not; set it to the From address, "
                "e.g. 'App <no-reply@app.example>'",
                EMAIL_CONFIG,
                {"field": "OFFLINE_EMAIL_FROM"},
            )
        sender = SmtpEmailSender(url, sender=check_sender_address(sender_address))
    else:
        dev = is_dev_mode(env)
        sender = ConsoleEmailSender(reveal=dev)
        if not dev:
            log.warning(
                "no OFFLINE_SMTP_URL: password-reset and verification emails will NOT be delivered (each is "
                "only logged, without its link); set OFFLINE_SMTP_URL and OFFLINE_EMAIL_FROM for production"
            )
    options: dict[str, Any] = {"email_sender": sender}
    folder = env.get("OFFLINE_EMAIL_TEMPLATES", "").strip()
    if folder:
        options["email_templates"] = EmailTemplates(folder)
    app_url = env.get("OFFLINE_APP_URL", "").strip()
    if app_url:
        options["app_url"] = app_url
    return options
