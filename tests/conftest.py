"""Shared pytest fixtures.

PostgreSQL: ``postgres_url`` gives each test a fresh, uniquely named schema in the database named by
``OFFLINE_TEST_DATABASE_URL`` or ``DATABASE_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``), as a
connection string whose ``search_path`` is that schema; the schema is dropped afterwards. When PostgreSQL is
unreachable the test is skipped with the URL that was tried, except in CI (env ``CI`` set), where it fails.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_base_url() -> str:
    return (
        os.environ.get("OFFLINE_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_POSTGRES_URL
    )


def _redacted(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return urllib.parse.urlunsplit(
        parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
    )


def with_search_path(url: str, schema: str) -> str:
    """``url`` with ``options=-c search_path=<schema>`` (understood by asyncpg and libpq alike)."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "options"]
    query.append(("options", f"-c search_path={schema}"))
    return urllib.parse.urlunsplit(
        parts._replace(query=urllib.parse.urlencode(query, quote_via=urllib.parse.quote))
    )


def _plain_url(url: str) -> str:
    # asyncpg takes postgres:// and postgresql://, not SQLAlchemy's postgresql+driver://
    scheme, sep, rest = url.partition("://")
    return ("postgresql" if scheme.startswith("postgres") else scheme) + sep + rest


async def _postgres_execute(url: str, sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped, unused-ignore]

    conn = await asyncpg.connect(_plain_url(url), timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The base URL of a reachable PostgreSQL (checked once per session), else skip (fail in CI)."""
    url = postgres_base_url()
    try:
        asyncio.run(_postgres_execute(url, "SELECT 1"))
    except Exception as exc:
        message = f"PostgreSQL is not reachable at {_redacted(url)} ({type(exc).__name__}: {exc})"
        if os.environ.get("CI"):
            pytest.fail(
                f"{message}; CI must run PostgreSQL (set OFFLINE_TEST_DATABASE_URL or DATABASE_URL)",
                pytrace=False,
            )
        pytest.skip(f"{message}; set OFFLINE_TEST_DATABASE_URL or DATABASE_URL to run the PostgreSQL tests")
    return url


@pytest.fixture
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A connection string to a fresh schema (its own tables, sequences and NOTIFY channel), dropped afterwards."""
    schema = f"offline_test_{uuid.uuid4().hex[:16]}"
    asyncio.run(_postgres_execute(postgres_server_url, f'CREATE SCHEMA "{schema}"'))
    try:
        yield with_search_path(postgres_server_url, schema)
    finally:
        asyncio.run(_postgres_execute(postgres_server_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
