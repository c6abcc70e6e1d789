"""Fixtures for the deploy tests.

- ``fake_cli``: a ``FakeCliEnv`` (tests/deploy/fakes/harness.py) in a temporary directory: ``install(name)``
  puts a fake vendor executable (``flyctl``, ``fly``, ``railway``, or any module with a ``main()``) on a
  private PATH; ``env()`` is the environment to give ``SubprocessRunner``; ``set_world``/``world`` hold
  the vendor scenario; ``argvs()``/``calls()``/``stdin_of()`` read back what the fakes were asked.
- ``fake_railway_api``: a started loopback fake of Railway's GraphQL API bound to ``fake_cli``'s Railway
  world (``.url`` for ``OFFLINE_RAILWAY_API_URL``, ``.requests`` for assertions); stopped afterwards.
- ``project_dir``: an empty project directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.fakes.harness import FakeCliEnv
from tests.deploy.fakes.railway_api import FakeRailwayApi


@pytest.fixture
def fake_cli(tmp_path: Path) -> FakeCliEnv:
    return FakeCliEnv(tmp_path / "fakes")


@pytest.fixture
def fake_railway_api(fake_cli: FakeCliEnv) -> Iterator[FakeRailwayApi]:
    api = FakeRailwayApi(world_path=fake_cli.world_path("railway")).start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


#: The server's auth and email settings as a shell would set them for `offline deploy` (all forwarded).
SERVER_SETTINGS = {
    "OFFLINE_JWT_ISSUERS": '[{"issuer": "https://id.example/", "audience": "notes"}]',
    "OFFLINE_OAUTH_PROVIDERS": '{"github": {"clientId": "cid", "clientSecret": "oauth-s3cret"}}',
    "OFFLINE_SMTP_URL": "smtp://mailer:p%40ss-smtp@smtp.example:587?starttls=1",
    "OFFLINE_EMAIL_FROM": "Notes <no-reply@notes.example>",
    "OFFLINE_APP_URL": "https://notes.example",
    "OFFLINE_AUTH_REQUIRE_VERIFIED_EMAIL": "true",
}
