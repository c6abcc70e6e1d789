"""Email delivery against a real SMTP server on loopback (aiosmtpd): STARTTLS and implicit TLS with a login,
plain SMTP to a local relay, the URL rules, templates an app overrides, the console sender, and the SMTP
password kept out of every error and log line."""

from __future__ import annotations

import asyncio
import io
import logging
import urllib.parse
from pathlib import Path

import pytest

from offline.core.errors import OfflineError
from server_runtime.email import (
    EMAIL_CONFIG,
    EMAIL_DELIVERY_FAILED,
    ConsoleEmailSender,
    EmailMessage,
    EmailTemplates,
    SmtpEmailSender,
    smtp_settings_from_url,
)
from server_runtime.email.settings import email_options_from_environment
from tests.support.smtp import smtp_server

from .conftest import Capture

SMTP_PASSWORD = "s3cret/p@ss word%"  # characters that need percent-encoding in the URL
MESSAGE = EmailMessage("ada@example.com", "Hello", "plain body https://app.example/x", "<p>html body</p>")


@pytest.mark.parametrize("tls", ["starttls", "implicit"])
def test_a_message_goes_through_tls_with_a_login(tls: str) -> None:
    async def scenario() -> None:
        async with smtp_server(tls=tls, user="mailer", password=SMTP_PASSWORD) as mail:  # type: ignore[arg-type]
            sender = SmtpEmailSender(
                mail.url(), sender="App <no-reply@app.example>", tls_context=mail.client_context()
            )
            await sender.send(MESSAGE)
            received = await mail.next_to("ada@example.com")
            assert mail.logins == ["mailer"]
            assert mail.tls_sessions == 1
            assert received.subject == "Hello"
            assert received.sender == "no-reply@app.example"
            assert str(received.message["From"]) == "App <no-reply@app.example>"
            assert received.body("plain").strip() == "plain body https://app.example/x"
            assert received.body("html").strip() == "<p>html body</p>"

    asyncio.run(scenario())


def test_plain_smtp_reaches_a_local_relay_without_a_login() -> None:
    async def scenario() -> None:
        async with smtp_server() as mail:
            await SmtpEmailSender(mail.url(), sender="no-reply@app.example").send(MESSAGE)
            assert (await mail.next_to("ada@example.com")).subject == "Hello"
            assert mail.tls_sessions == 0

    asyncio.run(scenario())


def test_url_settings_and_their_errors_never_repeat_the_password() -> None:
    s = smtp_settings_from_url("smtp://u%40x:p%2Fw@mail.example.com?starttls=1")
    assert (s.host, s.port, s.username, s.password, s.start_tls, s.use_tls) == (
        "mail.example.com",
        587,
        "u@x",
        "p/w",
        True,
        False,
    )
    assert smtp_settings_from_url("smtps://u:p@mail.example.com").port == 465
    assert smtp_settings_from_url("smtp://relay.local").port == 25
    assert "p/w" not in repr(s) and "p/w" not in repr(SmtpEmailSender(s, sender="a@b.example"))
    bad = [
        "http://u:hunter22@mail.example.com",  # scheme
        "smtp://u:hunter22@mail.example.com",  # a password in clear over the network
        "smtps://u:hunter22@mail.example.com?starttls=1",
        "smtp://u:hunter22@mail.example.com?tls=1",
        "smtp://u:hunter22@mail.example.com:notaport?starttls=1",
        "smtp://u:hunter22@?starttls=1",
    ]
    for url in bad:
        with pytest.raises(OfflineError) as caught:
            smtp_settings_from_url(url)
        assert caught.value.code == EMAIL_CONFIG
        assert caught.value.context["field"] == "OFFLINE_SMTP_URL"
        assert "hunter22" not in str(caught.value), url
    # Loopback relays may take a password over plain SMTP (nothing crosses the network).
    assert smtp_settings_from_url("smtp://u:p@127.0.0.1:2525").password == "p"


def test_a_refused_login_fails_with_a_clear_code_and_no_password_anywhere() -> None:
    wrong = "Wr0ng-pa55word-for/the:relay"
    handler = Capture()
    logger = logging.getLogger("offline")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    async def scenario() -> None:
        async with smtp_server(tls="starttls", user="mailer", password=SMTP_PASSWORD) as mail:
            sender = SmtpEmailSender(
                mail.url(password=wrong), sender="no-reply@app.example", tls_context=mail.client_context()
            )
            with pytest.raises(OfflineError) as caught:
                await sender.send(MESSAGE)
            assert caught.value.code == EMAIL_DELIVERY_FAILED
            assert "SMTPAuthenticationError" in caught.value.message
            logging.getLogger("offline.server.email").error("%s", caught.value)
            for text in (str(caught.value), repr(caught.value.context), *handler.lines):
                assert wrong not in text and "Wr0ng" not in text
            assert mail.messages == []

    try:
        asyncio.run(scenario())
    finally:
        logger.removeHandler(handler)


def test_templates_fall_back_file_by_file_to_the_shipped_ones(tmp_path: Path) -> None:
    (tmp_path / "password-reset.txt").write_text(
        "Hi {{ email }}: {{ link }} ({{ expires_in_minutes }} min)\n"
    )
    (tmp_path / "verify-email.subject.txt").write_text("Welcome to Notes\n")
    templates = EmailTemplates(tmp_path)
    context = {
        "email": "ada@example.com",
        "token": "tok",
        "link": "https://app.example/reset-password?token=tok",
        "app_url": "https://app.example",
        "expires_in_minutes": 30,
    }
    reset = templates.render("password-reset", context)
    assert reset.text == "Hi ada@example.com: https://app.example/reset-password?token=tok (30 min)\n"
    assert reset.subject == "Reset your password"  # shipped
    assert 'href="https://app.example/reset-password?token=tok"' in reset.html
    verify = templates.render("verify-email", {**context, "link": None})
    assert verify.subject == "Welcome to Notes"
    assert "tok" in verify.text  # without a link the token itself is shown
    # HTML is escaped; plain text is not.
    (tmp_path / "verify-email.html").write_text("<p>{{ email }}</p>")
    assert (
        EmailTemplates(tmp_path).render("verify-email", {**context, "email": "<b>@x"}).html
        == "<p>&lt;b&gt;@x</p>"
    )
    with pytest.raises(OfflineError) as caught:
        EmailTemplates(tmp_path / "missing")
    assert caught.value.code == EMAIL_CONFIG and caught.value.context["field"] == "email_templates"
    (tmp_path / "password-reset.txt").write_text("{{ nonsense }}")
    with pytest.raises(OfflineError) as caught:
        EmailTemplates(tmp_path).render("password-reset", context)
    assert caught.value.code == EMAIL_CONFIG and "nonsense" in caught.value.message


def test_the_console_sender_prints_links_in_development_and_only_warns_elsewhere(
    captured_logs: Capture,
) -> None:
    stream = io.StringIO()
    asyncio.run(ConsoleEmailSender(reveal=True, stream=stream).send(MESSAGE))
    assert "https://app.example/x" in stream.getvalue() and "ada@example.com" in stream.getvalue()
    quiet = io.StringIO()
    asyncio.run(ConsoleEmailSender(reveal=False, stream=quiet).send(MESSAGE))
    assert quiet.getvalue() == ""
    assert not any("https://app.example/x" in line for line in captured_logs.lines)
    assert any("not sent" in line and "OFFLINE_SMTP_URL" in line for line in captured_logs.lines)

    # Built from the environment: development (offline dev sets OFFLINE_DEV) prints; production warns at start.
    captured_logs.lines.clear()
    dev = email_options_from_environment({"OFFLINE_DEV": "1"})["email_sender"]
    assert isinstance(dev, ConsoleEmailSender) and dev.reveal
    assert not captured_logs.lines
    prod = email_options_from_environment({})["email_sender"]
    assert isinstance(prod, ConsoleEmailSender) and not prod.reveal
    assert any("WARNING" in line and "NOT be delivered" in line for line in captured_logs.lines)


def test_a_production_server_without_smtp_warns_once_then_logs_unsent_messages_on_a_budget(
    captured_logs: Capture,
) -> None:
    """No OFFLINE_SMTP_URL outside development: one warning at start; a burst of sign-ups then costs one line
    (budgeted, server_runtime.log_budget) and a count of the rest, not a warning per message."""
    prod = email_options_from_environment({})["email_sender"]

    async def burst() -> None:
        for _ in range(25):
            await prod.send(MESSAGE)

    asyncio.run(burst())
    warnings = [line for line in captured_logs.lines if "WARNING" in line]
    assert len(warnings) == 1 and "NOT be delivered" in warnings[0]
    unsent = [line for line in captured_logs.lines if "not sent" in line]
    assert len(unsent) == 1 and "ada@example.com" in unsent[0]
    assert not any("https://app.example/x" in line for line in captured_logs.lines)


def test_smtp_settings_from_the_environment_need_a_from_address() -> None:
    url = f"smtp://mailer:{urllib.parse.quote(SMTP_PASSWORD, safe='')}@127.0.0.1:2525"
    with pytest.raises(OfflineError) as caught:
        email_options_from_environment({"OFFLINE_SMTP_URL": url})
    assert caught.value.context["field"] == "OFFLINE_EMAIL_FROM"
    options = email_options_from_environment(
        {
            "OFFLINE_SMTP_URL": url,
            "OFFLINE_EMAIL_FROM": "Notes <no-reply@notes.example>",
            "OFFLINE_APP_URL": "https://notes.example",
        }
    )
    assert isinstance(options["email_sender"], SmtpEmailSender)
    assert options["app_url"] == "https://notes.example"
    with pytest.raises(OfflineError) as caught:
        email_options_from_environment({"OFFLINE_SMTP_URL": url, "OFFLINE_EMAIL_FROM": "not an address"})
    assert caught.value.context["field"] == "OFFLINE_EMAIL_FROM"
