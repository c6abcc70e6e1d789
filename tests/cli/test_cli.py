"""The `offline` command: version, help, laziness, and `schema check` as a user runs it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from offline_cli import __version__
from offline_cli.environment import Environment
from offline_cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "todo" / "schema.py"


def run_offline(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offline_cli", *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_version_is_the_installed_distribution_version() -> None:
    result = run_offline("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"offline, version {__version__}"
    assert __version__ != "0.0.0+unknown"


def test_help_lists_commands_with_examples_and_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from offline_cli.main import cli\n"
        "try:\n"
        "    cli(['--help'], prog_name='offline')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in ('boto3', 'botocore', 'docker', 'offline_cli.commands.schema', 'grpc_tools') "
        "if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "schema" in result.stdout
    assert "Examples:" in result.stdout
    assert "HEAVY []" in result.stdout


@pytest.mark.parametrize("args", [["schema", "--help"], ["schema", "check", "--help"]])
def test_every_command_help_has_examples(args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0
    assert "Examples:" in result.output


def test_schema_check_prints_collections_and_proto_on_stdout() -> None:
    result = run_offline("schema", "check", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "todos" in result.stdout and "lists" in result.stdout
    assert 'syntax = "proto3";' in result.stdout
    assert "message TodosRecord" in result.stdout
    assert "2 collection(s) OK" in result.stdout


def test_schema_check_json_is_machine_readable(tmp_path: Path) -> None:
    proto_file = tmp_path / "out.proto"
    result = run_offline("schema", "check", str(EXAMPLE), "--json", "--proto-out", str(proto_file))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["version"] == 1
    fields = data["collections"]["todos"]["fields"]
    assert fields["views"] == {"type": "number", "required": True, "merge": "counter", "default": 0}
    assert fields["status"]["values"] == ["open", "doing", "done"]
    assert fields["notes"]["merge"] == "crdt-text"
    assert data["stateMachines"][0]["transitions"]["done"] == ["open"]
    assert data["proto"].startswith('syntax = "proto3";')
    assert proto_file.read_text() == data["proto"]


def test_schema_check_missing_file_says_what_to_do(tmp_path: Path) -> None:
    result = run_offline("schema", "check", str(tmp_path / "nope.py"))
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert result.stdout == ""


def test_schema_check_invalid_schema_names_code_and_culprit(tmp_path: Path) -> None:
    bad = tmp_path / "schema.py"
    bad.write_text(
        "from offline import define_schema, t\n"
        "schema = define_schema({'version': 1, 'collections': {'todos': {'fields': {'id': t.string()}}}})\n"
    )
    result = run_offline("schema", "check", cwd=tmp_path)
    assert result.returncode == 1
    assert "INVALID_SCHEMA" in result.stderr
    assert "'id'" in result.stderr
    assert "Traceback" not in result.stderr


def test_schema_check_file_without_schema(tmp_path: Path) -> None:
    empty = tmp_path / "schema.py"
    empty.write_text("x = 1\n")
    result = run_offline("schema", "check", str(empty))
    assert result.returncode == 1
    assert "defines no schema" in result.stderr


def test_schema_check_writes_through_the_injected_environment() -> None:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdout=out, stderr=err, env={}, stdin_isatty=False, stdout_isatty=False)
    result = CliRunner().invoke(cli, ["schema", "check", str(EXAMPLE), "--json"], obj=env)
    assert result.exit_code == 0, result.output
    assert json.loads(out.getvalue())["collections"]["lists"]["fields"]["name"]["type"] == "string"


@pytest.mark.parametrize(
    ("variables", "tty", "interactive"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"CI": "true"}, True, False),
        ({"GITHUB_ACTIONS": "true"}, True, False),
        ({"CI": "0"}, True, True),
    ],
)
def test_environment_knows_when_nobody_can_answer_a_prompt(
    variables: dict[str, str], tty: bool, interactive: bool
) -> None:
    env = Environment(env=variables, stdin_isatty=tty, stdout_isatty=tty)
    assert env.interactive is interactive
