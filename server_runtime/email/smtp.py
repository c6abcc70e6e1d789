"""Sending through an SMTP server (aiosmtplib), configured by one URL.

``smtp://user:pass@host:port?starttls=1`` connects in plain text and upgrades with STARTTLS before logging
in (port 587 by default); ``smtps://user:pass@host:port`` speaks TLS from the first byte (port 465 by
default); ``smtp://host:port`` without ``starttls`` stays plain (port 25 by default: a relay on the same
machine or network). User and password are percent-decoded. Credentials over plain ``smtp://`` are refused
unless the host is a loopback address: they would cross the network in clear.

The password is kept out of ``repr``, of every error message and of the log: a failure from the SMTP client
is reported by its type and the server's reply, with the password (and the URL) cut out.
"""

from __future__ import annotations

import email.message
import email.utils
import logging
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Final

from offline.core.errors import OfflineError

from ..client_address import is_loopback_host
from .sender import EMAIL_CONFIG, EMAIL_DELIVERY_FAILED, EmailMessage, EmailSender

__all__ = ["SmtpEmailSender", "SmtpSettings", "check_sender_address", "smtp_settings_from_url"]

log = logging.getLogger("offline.server.email")

_DEFAULT_PORTS: Final = {"smtps": 465, "starttls": 587, "smtp": 25}
_TRUE: Final = {"1", "true", "yes", "on"}
_FALSE: Final = {"0", "false", "no", "off", ""}


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    host: str
    port: int
    username: str | None
    password: str | None = field(repr=False)
    use_tls: bool  # TLS from the start (smtps://)
    start_tls: bool  # STARTTLS after connecting (smtp://...?starttls=1)


def _config(message: str, name: str) -> OfflineError:
    return OfflineError(message, EMAIL_CONFIG, {"field": name})


def smtp_settings_from_url(url: str, *, name: str = "OFFLINE_SMTP_URL") -> SmtpSettings:
    """Parse an SMTP URL; an error names ``name`` and never repeats the URL (it holds the password)."""
    if not isinstance(url, str) or not url.strip():
        raise _config(f"{name} is empty; set it to smtp://user:pass@host:587?starttls=1 or smtps://...", name)
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port_given = parts.port
    except ValueError:
        raise _config(f"{name} is not a valid URL (check the host and the port number)", name) from None
    scheme = parts.scheme.lower()
    if scheme not in ("smtp", "smtps"):
        raise _config(
            f"{name} must start with smtp:// or smtps:// (got a {scheme or 'missing'} scheme)", name
        )
    if not parts.hostname:
        raise _config(f"{name} names no host; write smtp://user:pass@mail.example.com:587?starttls=1", name)
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"starttls"})
    if unknown:
        raise _config(f"{name} has unknown options {', '.join(unknown)}; the only one is starttls=1", name)
    flag = query.get("starttls", ["0"])[-1].strip().lower()
    if flag not in _TRUE | _FALSE:
        raise _config(f"{name}: starttls must be 1 or 0", name)
    start_tls = flag in _TRUE
    if scheme == "smtps" and start_tls:
        raise _config(f"{name}: smtps:// is TLS from the start; drop starttls=1 (or use smtp://)", name)
    username = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    host = parts.hostname
    if password is not None and scheme == "smtp" and not start_tls and not is_loopback_host(host):
        raise _config(
            f"{name} sends a password over plain SMTP; add ?starttls=1 or use smtps:// so it is encrypted",
            name,
        )
    port = port_given or _DEFAULT_PORTS["smtps" if scheme == "smtps" else "starttls" if start_tls else "smtp"]
    return SmtpSettings(host, port, username, password, scheme == "smtps", start_tls)


def check_sender_address(value: str, *, name: str = "OFFLINE_EMAIL_FROM") -> str:
    """``value`` when it is an address (``no-reply@app.example`` or ``App <no-reply@app.example>``)."""
    text = value.strip() if isinstance(value, str) else ""
    _, address = email.utils.parseaddr(text)
    if not text or "@" not in address or any(ch in text for ch in "\r\n"):
        raise _config(f"{name} must be an email address such as 'App <no-reply@app.example>'", name)
    return text


class SmtpEmailSender(EmailSender):
    """Sends each message on its own SMTP connection (reset and verification mail is rare; a connection kept
    open would time out between messages). ``tls_context``: trust settings for the server's certificate (the
    system's by default)."""

    def __init__(
        self,
        url: str | SmtpSettings,
        *,
        sender: str,
        tls_context: ssl.SSLContext | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.settings = url if isinstance(url, SmtpSettings) else smtp_settings_from_url(url)
        self.sender = check_sender_address(sender, name="sender")
        self._tls_context = tls_context
        self.timeout = timeout

    def __repr__(self) -> str:
        s = self.settings
        mode = "tls" if s.use_tls else "starttls" if s.start_tls else "plain"
        return f"SmtpEmailSender(host={s.host!r}, port={s.port}, mode={mode}, sender={self.sender!r})"

    def mime(self, message: EmailMessage) -> email.message.EmailMessage:
        mime = email.message.EmailMessage()
        mime["From"] = self.sender
        mime["To"] = message.to
        mime["Subject"] = message.subject
        mime["Date"] = email.utils.formatdate(localtime=False, usegmt=True)
        domain = email.utils.parseaddr(self.sender)[1].rpartition("@")[2] or None
        mime["Message-ID"] = email.utils.make_msgid(domain=domain)
        mime.set_content(message.text)
        if message.html is not None:
            mime.add_alternative(message.html, subtype="html")
        return mime

    async def send(self, message: EmailMessage) -> None:
        import aiosmtplib  # loaded when the first message is sent

        s = self.settings
        try:
            await aiosmtplib.send(
                self.mime(message),
                hostname=s.host,
                port=s.port,
                username=s.username,
                password=s.password,
                use_tls=s.use_tls,
                start_tls=s.start_tls,
                tls_context=self._tls_context,
                timeout=self.timeout,
            )
        except (aiosmtplib.SMTPException, OSError, ssl.SSLError) as exc:
            raise OfflineError(
                f"sending email through {s.host}:{s.port} failed: {type(exc).__name__}: {self._scrub(exc)}",
                EMAIL_DELIVERY_FAILED,
                {"host": s.host, "port": s.port, "cause": type(exc).__name__},
            ) from None

    def _scrub(self, exc: BaseException) -> str:
        text = str(exc)
        password = self.settings.password
        if password:
            for form in {password, urllib.parse.quote(password, safe=""), urllib.parse.quote(password)}:
                text = text.replace(form, "***")
        return text[:300]
