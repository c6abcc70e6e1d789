"""`offline dev`: run a project's sync server locally on SQLite, restarting it when Python files change."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ..environment import current_environment

IGNORED_DIRS = {".venv", "venv", "node_modules", ".offline", ".git", "__pycache__", "dist", "build"}


def _snapshot(root: Path) -> dict[str, float]:
    seen: dict[str, float] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in IGNORED_DIRS and not d.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                try:
                    seen[path] = os.stat(path).st_mtime
                except OSError:
                    continue
    return seen


def _entry(project: Path) -> tuple[Path, bool]:
    from server_runtime.environment import find_entry

    found = find_entry(project)
    if found is not None:
        return found, False
    return Path(__file__).resolve().parent.parent / "demo_server.py", True


def _port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on (host, port), checked the way it binds; None when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.1)
    return False


@click.command(
    epilog="""\b
Examples:
  offline dev                      serve ./server.py (or a built-in demo) on http://127.0.0.1:3001
  offline dev my-app --port 4000   another project folder and port
  offline dev --no-reload          do not restart when files change
  offline dev --desktop            also open the desktop app, synced with this server
                                   (its page from the dev server on 5173 when the project has one)
"""
)
@click.argument("project", type=click.Path(file_okay=False, path_type=Path), default=".")
@click.option("--port", type=int, default=None, help="Port (default: $PORT or 3001).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    default=None,
    help="SQLite file (default: $OFFLINE_SERVER_DB or ./offline-server.db in the project).",
)
@click.option("--reload/--no-reload", default=True, show_default=True, help="Restart when .py files change.")
@click.option(
    "--desktop",
    is_flag=True,
    help="Also open the project's desktop app (pip install 'offline[desktop]'); closing it stops dev.",
)
@click.option("--exit-after", type=float, default=None, hidden=True, help="Stop after N seconds (tests).")
def dev(
    project: Path,
    port: int | None,
    host: str,
    db: str | None,
    reload: bool,
    desktop: bool,
    exit_after: float | None,
) -> None:
    """Run the project's sync server (server.py, src/server.py, or a demo) on SQLite for development."""
    env = current_environment()
    project = project.resolve()
    if not project.is_dir():
        raise click.ClickException(f"{project} is not a folder; pass your project folder")
    entry, is_demo = _entry(project)
    port = port or int(env.getenv("PORT") or 3001)
    database = db or env.getenv("OFFLINE_SERVER_DB") or str(project / "offline-server.db")
    child_env = dict(env.env)
    # OFFLINE_DEV: the server may print emails (reset and verification links) instead of sending them.
    child_env.update({"PORT": str(port), "HOST": host, "OFFLINE_SERVER_DB": database, "OFFLINE_DEV": "1"})
    child_env.pop("DATABASE_URL", None)  # dev always runs on the embedded SQLite store
    if (project / "dist" / "index.html").is_file():
        child_env["OFFLINE_STATIC_DIR"] = str(project / "dist")
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    base = f"http://{shown}:{port}"
    err = env.err
    if is_demo:
        err.print(f"[yellow]no server.py in {project}: serving the built-in demo schema[/yellow]")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "server_runtime", str(entry)], env=child_env, cwd=str(project)
        )

    app_window: _DesktopApp | None = None
    if desktop:
        app_window = _DesktopApp(project, dict(env.env), sync_url=f"ws://{shown}:{port}/offline-sync")
        app_window.check()

    problem = _port_problem(host, port)
    if problem is not None:
        raise click.ClickException(
            f"port {port} on {shown} is not available ({problem}); stop whatever uses it or pick another "
            "with --port"
        )
    with _stopped_by_signals() as stopping:
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = start()
            if not _wait_healthy(base, proc, 30):
                code = proc.poll()
                raise click.ClickException(
                    f"the server did not start (exit code {code}); see the output above. Is port {port} free? "
                    "(--port)"
                )
            env.stdout.write(f"app:       {base}\nsync:      ws://{shown}:{port}/offline-sync\n")
            env.stdout.write(f"dashboard: {base}/__offline\nhealth:    {base}/health\n")
            env.stdout.flush()
            err.print(
                f"serving {entry} with SQLite at {database}" + (" · watching for changes" if reload else "")
            )
            if app_window is not None:
                app_window.start(err)
            started = time.monotonic()
            snapshot = _snapshot(project) if reload else {}
            while True:
                time.sleep(0.5)
                if exit_after is not None and time.monotonic() - started > exit_after:
                    break
                if proc.poll() is not None and not reload:
                    raise click.ClickException(f"the server stopped with exit code {proc.returncode}")
                if app_window is not None and app_window.closed():
                    err.print("the desktop app was closed: stopping")
                    break
                if reload:
                    current = _snapshot(project)
                    if current != snapshot:
                        snapshot = current
                        err.print("[cyan]change detected: restarting the server[/cyan]")
                        _stop(proc)
                        proc = start()
                        if _wait_healthy(base, proc, 30):
                            err.print(f"[green]server restarted[/green] on {base}")
                        else:
                            err.print("[red]the server failed to start; fix the error and save again[/red]")
                        if app_window is not None:
                            app_window.restart(err)
        except _Stop:
            pass
        finally:
            stopping.set()  # a second Ctrl-C must not interrupt stopping the server
            if app_window is not None:
                app_window.stop()
            if proc is not None:
                _stop(proc)


FRONTEND_DEV_URL = "http://localhost:5173/"


class _DesktopApp:
    """The desktop app beside the dev server (SPEC 4.7 rule 5): ``python -m offline_desktop PROJECT``.

    It syncs with this server (``BUILD_SYNC_URL``) and keeps its settings and database in the project's
    ``.offline/desktop/``. Its page comes from the frontend dev server on 5173 when the project has a
    ``dev`` script (started here) or one already answers there; else from the project's web folder.
    """

    def __init__(self, project: Path, env: dict[str, str], *, sync_url: str) -> None:
        self.project = project
        self.env = {**env, "BUILD_SYNC_URL": sync_url}
        self.env.setdefault("OFFLINE_DESKTOP_CONFIG_DIR", str(project / ".offline" / "desktop"))
        self.app: subprocess.Popen[bytes] | None = None
        self.frontend: subprocess.Popen[bytes] | None = None
        self.page_url: str | None = None

    def check(self) -> None:
        probe = subprocess.run(
            [sys.executable, "-c", "import webview, offline_desktop.shell"], capture_output=True, env=self.env
        )
        if probe.returncode != 0:
            raise click.ClickException(
                "--desktop needs the desktop shell: pip install 'offline[desktop]' (pywebview with Qt WebEngine)"
            )
        if not (self.project / "package.json").is_file():
            raise click.ClickException(
                f"no package.json in {self.project}: --desktop opens a project made by `offline init`"
            )

    def _dev_script(self) -> bool:
        try:
            scripts = json.loads((self.project / "package.json").read_text(encoding="utf-8")).get("scripts")
        except (OSError, ValueError, AttributeError):
            return False
        return isinstance(scripts, dict) and "dev" in scripts

    def start(self, err: Any) -> None:
        if self.page_url is None:
            if _answers(FRONTEND_DEV_URL):
                self.page_url = FRONTEND_DEV_URL
            elif self._dev_script():
                err.print("starting the frontend dev server (npm run dev) on port 5173")
                # Its own process group: npm runs the dev server as a grandchild, which must stop with it.
                self.frontend = subprocess.Popen(
                    ["npm", "run", "dev"], cwd=str(self.project), env=self.env, start_new_session=True
                )
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and self.frontend.poll() is None:
                    if _answers(FRONTEND_DEV_URL):
                        self.page_url = FRONTEND_DEV_URL
                        break
                    time.sleep(0.3)
                else:
                    err.print("[yellow]the frontend dev server did not answer on 5173: using web/[/yellow]")
        command = [sys.executable, "-m", "offline_desktop", str(self.project)]
        if self.page_url is not None:
            command += ["--app-url", self.page_url]
        self.app = subprocess.Popen(command, cwd=str(self.project), env=self.env)
        err.print(f"desktop app started (page: {self.page_url or 'web/'})")

    def closed(self) -> bool:
        return self.app is not None and self.app.poll() is not None

    def restart(self, err: Any) -> None:
        if self.app is not None:
            _stop(self.app)
        self.start(err)

    def stop(self) -> None:
        if self.app is not None:
            _stop(self.app)
        if self.frontend is not None and self.frontend.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.frontend.pid, signal.SIGTERM)
            try:
                self.frontend.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.frontend.pid, signal.SIGKILL)
                self.frontend.wait(5)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status < 500)
    except OSError:
        return False


class _Stop(BaseException):
    """Raised in the main thread when dev is asked to stop (Ctrl-C, SIGTERM, SIGHUP); a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` on the way swallows it."""


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[threading.Event]:
    """Turn SIGINT, SIGTERM and SIGHUP into `_Stop`, so each one stops the server child before dev exits.

    By default SIGTERM (a process manager, `kill`, an IDE's stop button) and SIGHUP (a closed terminal) end
    dev at once, leaving its server child running and holding the port.
    """

    stopping = threading.Event()

    def handler(signum: int, frame: object) -> None:
        if not stopping.is_set():
            stopping.set()
            raise _Stop(signal.Signals(signum).name)

    wanted: list[int] = [signal.SIGINT, signal.SIGTERM]
    if hasattr(signal, "SIGHUP"):
        wanted.append(signal.SIGHUP)
    previous: dict[int, Any] = {}
    try:
        for signum in wanted:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread (an embedding app): leave its signal handling alone
        pass
    try:
        yield stopping
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
