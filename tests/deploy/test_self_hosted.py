"""The self-hosted adapter's decisions that need no engine: refusals before anything is touched, the plan,
the URL people and clients use, where the health probe goes. The engine side runs for real in
tests/e2e/test_self_hosted_deploy.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from platform_adapters import load_adapter
from platform_adapters.base import DeployError
from platform_adapters.self_hosted import SelfHostedAdapter, Target

from ._aws_support import make_context


def test_aliases_load_the_self_hosted_adapter() -> None:
    for name in ("self-hosted", "docker", "self-hosted-image"):
        adapter = load_adapter(name)
        assert isinstance(adapter, SelfHostedAdapter) and adapter.persistent_storage


def test_with_postgres_and_a_database_url_are_refused_before_any_engine_is_asked(tmp_path: Path) -> None:
    ctx = make_context(tmp_path, options={"with_postgres": True}, engine=None)
    with pytest.raises(DeployError) as caught:
        SelfHostedAdapter().check_prerequisites(ctx)
    assert caught.value.code == "INVALID_OPTION"
    assert "--with-postgres" in caught.value.message and "DATABASE_URL" in caught.value.hint


def test_bad_flags_are_refused_naming_them(tmp_path: Path) -> None:
    for options, flag in (
        ({"host": "deploy@server"}, "--host"),
        ({"publish": "eighty"}, "--publish"),
        ({"registry": "ghcr.io"}, "--registry"),
    ):
        with pytest.raises(DeployError) as caught:
            SelfHostedAdapter().check_prerequisites(
                make_context(tmp_path, options=options, with_secrets=False)
            )
        assert caught.value.code == "INVALID_OPTION" and flag in caught.value.message


def test_plan_url_and_health_probe_follow_the_target(tmp_path: Path) -> None:
    adapter = SelfHostedAdapter()
    local = make_context(tmp_path, options={"publish": "127.0.0.1:8080"}, with_secrets=False)
    assert adapter.public_url(local) == "http://127.0.0.1:8080"
    assert Target.of(local).probe_base == "http://127.0.0.1:8080"
    assert adapter.storage(local).startswith("SQLite on the named volume")
    assert any("kept in the local engine" in line for line in adapter.planned_resources(local))

    remote = make_context(
        tmp_path,
        options={"host": "ssh://deploy@box.example.com", "registry": "ghcr.io/team", "with_postgres": True},
        env={"PUBLIC_URL": "https://notes.example.com/"},
        with_secrets=False,
    )
    assert adapter.public_url(remote) == "https://notes.example.com"  # the proxy in front: what clients use
    assert Target.of(remote).probe_base == "http://box.example.com:3001"
    plan = adapter.planned_resources(remote)
    assert any("deploy@box.example.com (over SSH)" in line for line in plan)
    assert any("pushed to ghcr.io/team and pulled there" in line for line in plan)
    assert any("postgres" in line for line in plan)
    assert "PostgreSQL" in adapter.storage(remote)

    copied = make_context(tmp_path, options={"host": "ssh://deploy@box.example.com"}, with_secrets=False)
    assert any("copied over SSH (save | load)" in line for line in adapter.planned_resources(copied))
