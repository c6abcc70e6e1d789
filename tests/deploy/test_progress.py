"""The deploy's progress as people watch it (offline_cli.deploy.progress): vendor output streams into a
bounded live view while the tool runs, every line lands in the run's log file with secrets masked, each step
shows its time, and a failure ends with the vendor's last lines and the log's path."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from offline_cli.deploy.progress import VIEW_LINES, ProgressReporter
from platform_adapters.base import CommandResult, SubprocessRunner

from .fakes.harness import FakeCliEnv

SECRET = "s3cr3t-value-that-must-not-show"


def wait_for(condition: Callable[[], bool], what: str, deadline: float = 60.0) -> None:
    """Poll ``condition`` (a busy machine may be slow; nothing here depends on how slow)."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_slow_vendor_output_shows_in_the_live_view_while_it_runs_and_the_log_keeps_all_of_it(
    fake_cli: FakeCliEnv, tmp_path: Path
) -> None:
    fake_cli.install("slowvendor", "tests.deploy.fakes.slow_vendor")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    reporter = ProgressReporter(console, [SECRET], live=True)
    log_path = reporter.open_log(tmp_path / "deploy")
    env = fake_cli.env({"SLOW_LINES": "12", "SLOW_SECRET": SECRET})
    runner = SubprocessRunner(env, listener=reporter)
    reporter.step("Deploying to Slowhost")

    results: list[CommandResult] = []
    worker = threading.Thread(
        target=lambda: results.append(runner.run(["slowvendor"], stream=True, timeout=300))
    )
    worker.start()
    try:
        for index in range(1, 13):
            line = f"slow line {index}"
            # Drawn on the terminal, not only held in memory: the view takes the line, then redraws, so the
            # screen is what to wait for.
            wait_for(lambda line=line: line in screen.getvalue(), line)
            # The tool is still running (it waits for this acknowledgement): the view updated during the run.
            assert worker.is_alive() and not results
            visible = reporter.visible_lines()
            assert len(visible) <= VIEW_LINES and visible[-1].startswith(line)
            (fake_cli.state_dir / f"ack-{index}").write_text("")
    finally:
        for index in range(1, 13):
            (fake_cli.state_dir / f"ack-{index}").write_text("")
        worker.join(120)
    assert results and results[0].returncode == 0
    assert "slow line 12" in results[0].stderr and "slow line 11" in results[0].stdout  # still captured

    # Bounded: only the last lines are in view; the step's time is printed when it ends.
    assert reporter.visible_lines() == [f"slow line {i}" for i in range(13 - VIEW_LINES, 13)]
    reporter.close()
    assert "Deploying to Slowhost:" in screen.getvalue() and " s" in screen.getvalue()

    log = log_path.read_text()
    for index in range(1, 13):
        assert f"slow line {index}" in log
    assert "[1] Deploying to Slowhost" in log
    assert SECRET not in log and SECRET not in screen.getvalue() and "token=***" in log
    assert log_path.parent.name == "logs" and log_path.suffix == ".log"


def test_without_a_terminal_vendor_output_goes_to_the_log_only(fake_cli: FakeCliEnv, tmp_path: Path) -> None:
    fake_cli.install("slowvendor", "tests.deploy.fakes.slow_vendor")
    for index in range(1, 4):
        (fake_cli.state_dir / f"ack-{index}").write_text("")
    screen = io.StringIO()
    reporter = ProgressReporter(Console(file=screen, width=120), [])
    assert reporter.live_view is False
    reporter.info("said before the log was opened")
    log_path = reporter.open_log(tmp_path / "deploy")
    reporter.step("Building")
    runner = SubprocessRunner(fake_cli.env({"SLOW_LINES": "3"}), listener=reporter)
    assert runner.run(["slowvendor"], stream=True, timeout=300).returncode == 0
    quick = runner.run(["slowvendor"], timeout=300)  # not streamed: logged when it ends
    assert quick.returncode == 0
    reporter.close()
    assert "slow line" not in screen.getvalue()
    assert "[1] Building" in screen.getvalue() and "Building:" in screen.getvalue()
    log = log_path.read_text()
    assert log.startswith("    said before the log was opened")
    assert log.count("slow line 3") == 2 and "$ slowvendor (exit 0)" in log
    assert set(reporter.tail()) == {"slow line 1", "slow line 2", "slow line 3"}  # two pipes: any order


def test_the_live_view_is_decided_in_the_environment() -> None:
    from offline_cli.environment import Environment

    def env(**kwargs: object) -> Environment:
        return Environment(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), **kwargs)  # type: ignore[arg-type]

    assert env(env={}, stderr_isatty=True).live_progress is True
    assert env(env={}).live_progress is False  # a pipe or file
    assert env(env={"CI": "true"}, stderr_isatty=True).live_progress is False
    assert env(env={"TERM": "dumb"}, stderr_isatty=True).live_progress is False
