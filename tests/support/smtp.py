"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for the email tests.

``async with smtp_server() as mail:`` listens on a free port of 127.0.0.1 in the test's event loop; its
``url(...)`` is what ``OFFLINE_SMTP_URL`` would hold. ``tls="starttls"`` offers STARTTLS (and requires it
before AUTH), ``tls="implicit"`` speaks TLS from the first byte; both with a certificate made for the test
(``client_context`` trusts it). With ``user``/``password`` the server requires AUTH. ``hold()`` makes it
wait before accepting message data until ``release()``: a test can then see that a request's answer does not
wait for delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email
import email.message
import email.policy
import ipaddress
import ssl
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

Tls = Literal["none", "starttls", "implicit"]


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate (and its key) for ``host``, valid for a day: (cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class Received:
    sender: str
    recipients: list[str]
    message: email.message.EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    def body(self, subtype: str = "plain") -> str:
        part = self.message.get_body(preferencelist=(subtype,))
        assert part is not None, f"no text/{subtype} part"
        return str(part.get_content())  # type: ignore[attr-defined]


@dataclass
class MailServer:
    port: int
    tls: Tls
    user: str | None
    password: str | None
    cert: Path | None
    messages: list[Received] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    tls_sessions: int = 0
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._gate.set()

    def url(self, *, user: str | None = None, password: str | None = None) -> str:
        user = self.user if user is None else user
        password = self.password if password is None else password
        creds = ""
        if user is not None:
            creds = urllib.parse.quote(user, safe="")
            if password is not None:
                creds += ":" + urllib.parse.quote(password, safe="")
            creds += "@"
        scheme = "smtps" if self.tls == "implicit" else "smtp"
        query = "?starttls=1" if self.tls == "starttls" else ""
        return f"{scheme}://{creds}127.0.0.1:{self.port}{query}"

    def client_context(self) -> ssl.SSLContext:
        """Trusts this server's certificate (and nothing else)."""
        assert self.cert is not None
        return ssl.create_default_context(cafile=str(self.cert))

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def to(self, address: str, subject: str | None = None) -> list[Received]:
        """The messages to ``address`` (with ``subject`` only, when given), oldest first."""
        return [
            m for m in self.messages if address in m.recipients and (subject is None or m.subject == subject)
        ]

    async def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.02)

    async def next_to(self, address: str, count: int = 1, subject: str | None = None) -> Received:
        """Wait for the ``count``-th message to ``address`` (with ``subject``); returns it."""
        await self.wait_for(
            lambda: len(self.to(address, subject)) >= count, f"message {count} to {address} ({subject})"
        )
        return self.to(address, subject)[count - 1]

    # -- aiosmtpd handler hooks
    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        await self._gate.wait()
        raw = envelope.original_content or b""
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(parsed, email.message.EmailMessage)
        self.messages.append(Received(str(envelope.mail_from), [str(r) for r in envelope.rcpt_tos], parsed))
        transport = server.transport
        if transport is not None and transport.get_extra_info("ssl_object") is not None:
            self.tls_sessions += 1
        return "250 OK"

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        ok = data.login.decode() == self.user and data.password.decode() == self.password
        if ok:
            self.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)  # handled=False: aiosmtpd answers 535 itself


@contextlib.asynccontextmanager
async def smtp_server(
    *, tls: Tls = "none", user: str | None = None, password: str | None = None
) -> AsyncIterator[MailServer]:
    with tempfile.TemporaryDirectory() as folder:
        cert = key = None
        context = None
        if tls != "none":
            cert, key = self_signed(Path(folder))
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(cert), str(key))
        mail = MailServer(0, tls, user, password, cert)

        def protocol() -> SMTP:
            with warnings.catch_warnings():
                # "AUTH without requiring TLS": under implicit TLS the whole connection is encrypted.
                warnings.simplefilter("ignore", UserWarning)
                return make()

        def make() -> SMTP:
            return SMTP(
                mail,
                hostname="mail.test",
                tls_context=context if tls == "starttls" else None,
                require_starttls=tls == "starttls",
                auth_required=user is not None,
                # Implicit TLS is below aiosmtpd (it cannot tell): it requires STARTTLS itself otherwise.
                auth_require_tls=tls == "starttls",
                authenticator=mail.authenticate if user is not None else None,
            )

        loop = asyncio.get_running_loop()
        listener = await loop.create_server(
            protocol, "127.0.0.1", 0, ssl=context if tls == "implicit" else None
        )
        mail.port = listener.sockets[0].getsockname()[1]
        try:
            yield mail
        finally:
            mail.release()
            listener.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.wait_closed(), 5)
