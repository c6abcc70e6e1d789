"""The deploy prompts: questionary driven through prompt_toolkit's pipe input, and the injectable prompter."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from prompt_toolkit.input import PipeInput, create_pipe_input
from prompt_toolkit.output import DummyOutput

import platform_adapters
from offline_cli.commands import deploy as deploy_command
from offline_cli.deploy.flow import Services
from offline_cli.deploy.prompts import QuestionaryPrompter, ScriptedPrompter
from offline_cli.deploy.state import load_state
from offline_cli.environment import Environment
from offline_cli.main import cli

from ._core_fakes import FakeBundler, FakePlatform, register_fake, write_project

DOWN = "\x1b[B"
ENTER = "\r"


@pytest.fixture
def pipe() -> Iterator[PipeInput]:
    with create_pipe_input() as pipe_input:
        yield pipe_input


def test_select_moves_and_returns_the_value_not_the_title(pipe: PipeInput) -> None:
    prompter = QuestionaryPrompter(input=pipe, output=DummyOutput())
    pipe.send_text(DOWN + ENTER)
    answer = prompter.select("Where?", [("host-a", "Fly.io"), ("host-b", "Railway"), ("x", "X")])
    assert answer == "host-b"


def test_select_starts_on_the_default(pipe: PipeInput) -> None:
    prompter = QuestionaryPrompter(input=pipe, output=DummyOutput())
    pipe.send_text(DOWN + ENTER)
    assert prompter.select("Region", [("fra", "fra"), ("iad", "iad"), ("syd", "syd")], default="iad") == "syd"


def test_text_keeps_the_default_or_takes_typing(pipe: PipeInput) -> None:
    prompter = QuestionaryPrompter(input=pipe, output=DummyOutput())
    pipe.send_text(ENTER)
    assert prompter.text("App name", default="notes") == "notes"
    pipe.send_text("-v2" + ENTER)
    assert prompter.text("App name", default="notes") == "notes-v2"


def test_confirm_answers_yes_and_no(pipe: PipeInput) -> None:
    prompter = QuestionaryPrompter(input=pipe, output=DummyOutput())
    pipe.send_text("y")
    assert prompter.confirm("Roll back?") is True
    pipe.send_text("n")
    assert prompter.confirm("Roll back?", default=True) is False
    pipe.send_text(ENTER)
    assert prompter.confirm("Delete?", default=False) is False


def test_ctrl_c_aborts_instead_of_answering(pipe: PipeInput) -> None:
    prompter = QuestionaryPrompter(input=pipe, output=DummyOutput())
    pipe.send_text("\x03")
    with pytest.raises(KeyboardInterrupt):
        prompter.text("App name")


def test_environment_gives_one_prompter_lazily() -> None:
    scripted = ScriptedPrompter()
    assert Environment(env={}, prompter=scripted).get_prompter() is scripted
    env = Environment(env={})
    first = env.get_prompter()
    assert isinstance(first, QuestionaryPrompter) and env.get_prompter() is first


def test_scripted_prompter_fails_loudly_on_unexpected_questions() -> None:
    prompter = ScriptedPrompter(["nope"])
    with pytest.raises(AssertionError, match="not among the choices"):
        prompter.select("Where?", [("a", "A")])
    with pytest.raises(AssertionError, match="unexpected text prompt"):
        prompter.text("App name")


@dataclass
class KeyedPrompter:
    """The real questionary prompter, fed the keystrokes of each question just before it is asked (a user at
    the keyboard), so the whole interactive deploy runs through prompt_toolkit."""

    pipe: PipeInput
    keys: list[str]
    asked: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.inner = QuestionaryPrompter(input=self.pipe, output=DummyOutput())

    def _feed(self, message: str) -> None:
        self.asked.append(message)
        self.pipe.send_text(self.keys.pop(0))

    def select(self, message: str, choices: Sequence[tuple[str, str]], default: str | None = None) -> str:
        self._feed(message)
        return self.inner.select(message, choices, default)

    def text(self, message: str, default: str = "") -> str:
        self._feed(message)
        return self.inner.text(message, default)

    def confirm(self, message: str, default: bool = False) -> bool:
        self._feed(message)
        return self.inner.confirm(message, default)


def test_interactive_deploy_through_the_real_prompts(
    pipe: PipeInput, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = FakePlatform()
    register_fake(monkeypatch, remote)
    real_build = deploy_command.build_services

    def build(environment: Environment) -> Services:
        return replace(real_build(environment), bundler=FakeBundler(), health_probe=None)

    monkeypatch.setattr(deploy_command, "build_services", build)
    project = write_project(tmp_path / "field-notes")
    # fake-host is the last platform in the list: walk down to it. Keep the suggested app name.
    # The region list starts on the platform default (fra): one down is iad.
    platforms = len(platform_adapters.PLATFORMS)
    prompter = KeyedPrompter(pipe, [DOWN * (platforms - 1) + ENTER, ENTER, DOWN + ENTER, ENTER])
    out, err = io.StringIO(), io.StringIO()
    environment = Environment(
        stdin=io.StringIO(), stdout=out, stderr=err, env={"PATH": os.environ.get("PATH", "")},
        stdin_isatty=True, stdout_isatty=False, prompter=prompter,
    )  # fmt: skip
    result = CliRunner().invoke(cli, ["deploy", "--project-dir", str(project)], obj=environment)
    assert result.exit_code == 0, err.getvalue()
    assert prompter.asked == ["Where should the app run?", "App name", "Region", "Go ahead?"]
    state = load_state(project)
    assert state is not None
    assert (state.platform, state.app, state.region) == ("fake-host", "field-notes", "iad")
    assert out.getvalue().startswith("url:  https://field-notes.fake.test")
    # Then a rollback confirmation through the same terminal, declined with "n".
    prompter.keys.append("n")
    result = CliRunner().invoke(cli, ["deploy", "--project-dir", str(project), "--confirm"], obj=environment)
    assert result.exit_code == 0
    prompter.keys.append("n")
    result = CliRunner().invoke(cli, ["deploy", "rollback", "--project-dir", str(project)], obj=environment)
    assert result.exit_code == 1 and prompter.asked[-1].startswith("Roll field-notes")
    assert not any(call.startswith("rollback") for call in remote.calls)
