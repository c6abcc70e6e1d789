"""Keep configured secrets and bearer tokens out of log output (defence in depth: nothing should log them).

``SecretRedactor`` is a ``logging.Filter``: attached to a handler it rewrites each record's message (and its
traceback text) so that the configured secrets and anything shaped like a JWT read ``[redacted]``.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable, Mapping

REDACTED = "[redacted]"

#: Environment variables whose values are secrets.
SECRET_ENV = ("OFFLINE_ADMIN_TOKEN", "OFFLINE_METRICS_TOKEN", "OFFLINE_BACKUP_TOKEN", "AUTH_SECRET")

# Three base64url parts, the first a JSON header ("eyJ" is the encoding of '{"'): access tokens and friends.
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")
_MIN_SECRET = 4  # shorter values would blank out ordinary words


def url_password(url: str) -> str | None:
    """The password in a connection URL (``scheme://user:password@host/...``), if any."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        return None
    return urllib.parse.unquote(password) if password else None


def secrets_from_environment(env: Mapping[str, str]) -> list[str]:
    found = [env.get(name, "").strip() for name in SECRET_ENV]
    password = url_password(env.get("DATABASE_URL", ""))
    if password:
        found += [password, urllib.parse.quote(password, safe="")]
    return [s for s in found if s]


class SecretRedactor(logging.Filter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        for secret in secrets:
            if secret and len(secret) >= _MIN_SECRET and secret not in self.secrets:
                self.secrets.append(secret)
        self.secrets.sort(key=len, reverse=True)  # a secret containing another is replaced whole

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _JWT.sub(REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error report
            return True
        cleaned = self.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


def install(redactor: SecretRedactor, handlers: Iterable[logging.Handler]) -> None:
    for handler in handlers:
        if redactor not in handler.filters:
            handler.addFilter(redactor)
