"""Email delivery for the server: an ``EmailSender`` interface, an SMTP sender, a console sender for
development, and the message templates (jinja2, plain text and HTML) an app can override.

``create_auth_routes(..., email_sender=SmtpEmailSender(url, sender="App <no-reply@app.example>"))`` sends the
password-reset and verification messages; a server built from the environment reads ``OFFLINE_SMTP_URL`` and
``OFFLINE_EMAIL_FROM`` (``settings``). Without an SMTP URL it uses ``ConsoleEmailSender``: under ``offline
dev`` it prints each message with its link; elsewhere it warns at start and prints no link (a reset link in a
production log would let anyone reading the log take over the account).
"""

from .sender import EMAIL_CONFIG, EMAIL_DELIVERY_FAILED, ConsoleEmailSender, EmailMessage, EmailSender
from .smtp import SmtpEmailSender, SmtpSettings, smtp_settings_from_url
from .templates import EmailTemplates, RenderedEmail

__all__ = [
    "EMAIL_CONFIG",
    "EMAIL_DELIVERY_FAILED",
    "ConsoleEmailSender",
    "EmailMessage",
    "EmailSender",
    "EmailTemplates",
    "RenderedEmail",
    "SmtpEmailSender",
    "SmtpSettings",
    "smtp_settings_from_url",
]
