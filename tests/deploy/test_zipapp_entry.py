"""The zipapp's generated entry module (dockerfile_templates/zipapp_main.py.j2): started as root, it hands
the SQLite folder to OFFLINE_RUN_AS and drops privileges before the server is imported; otherwise it just
runs. The real thing in a container, with a root-owned volume: tests/e2e/test_container_deploy.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from offline_cli.deploy.templates import CONTAINER_UID, render_template

UID = CONTAINER_UID


def load_entry() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__file__": "/app/_offline_zipapp_main.py", "__name__": "entry_under_test"}
    exec(compile(render_template("zipapp_main.py.j2", entry="server.py"), "entry", "exec"), namespace)
    return namespace


class FakeOs(SimpleNamespace):
    """Stands in for the module's ``os`` so no test can change the test process's own ids."""

    def __init__(self, euid: int, cwd: str = "/app", fail_chown: bool = False) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.euid = euid
        self.uid = euid
        self.cwd = cwd
        self.fail_chown = fail_chown
        self.environ: dict[str, str] = {"HOME": "/root"}
        self.X_OK = os.X_OK

    def access(self, path: str, mode: int) -> bool:
        return self.uid == 0  # only root may enter /root

    def geteuid(self) -> int:
        return int(self.euid)

    def getuid(self) -> int:
        return int(self.uid)

    def getcwd(self) -> str:
        return str(self.cwd)

    def chown(self, path: Path, uid: int, gid: int) -> None:
        self.calls.append(("chown", str(path), uid, gid))
        if self.fail_chown:
            raise PermissionError(1, "Operation not permitted", str(path))

    def setgroups(self, groups: list[int]) -> None:
        self.calls.append(("setgroups", groups))

    def setgid(self, gid: int) -> None:
        self.calls.append(("setgid", gid))

    def setuid(self, uid: int) -> None:
        self.calls.append(("setuid", uid))
        self.uid = self.euid = uid


@pytest.fixture
def entry() -> dict[str, Any]:
    return load_entry()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("10001:10001", (10001, 10001)), ("10001:20", (10001, 20)), ("10001", (10001, 10001)), (" ", None)],
)
def test_run_as_reads_uid_and_gid(entry: dict[str, Any], value: str, expected: Any) -> None:
    assert entry["run_as"]({"OFFLINE_RUN_AS": value}) == expected
    assert entry["run_as"]({}) is None


@pytest.mark.parametrize("value", ["app", "10001:staff", "-1:0"])
def test_run_as_refuses_anything_but_numbers(entry: dict[str, Any], value: str) -> None:
    with pytest.raises(SystemExit, match="OFFLINE_RUN_AS"):
        entry["run_as"]({"OFFLINE_RUN_AS": value})


def test_data_paths_follow_offline_server_db(entry: dict[str, Any], tmp_path: Path) -> None:
    database = tmp_path / "volume" / "notes.db"
    database.parent.mkdir()
    database.write_bytes(b"")
    Path(f"{database}-wal").write_bytes(b"")
    folder, files = entry["data_paths"]({"OFFLINE_SERVER_DB": str(database)}, "/app")
    assert folder == database.parent
    assert files == [database, Path(f"{database}-wal")]  # only the files that exist
    # Unset: server_runtime's default, relative to the working directory.
    folder, files = entry["data_paths"]({}, str(tmp_path))
    assert (folder, files) == (tmp_path, [])


def test_as_root_hands_over_the_data_folder_then_drops_for_good(
    entry: dict[str, Any], tmp_path: Path
) -> None:
    fake = FakeOs(euid=0)
    entry["os"] = fake
    volume = tmp_path / "data"  # missing: created before it is handed over
    database = volume / "offline-server.db"
    entry["drop_privileges"]({"OFFLINE_RUN_AS": f"{UID}:{UID}", "OFFLINE_SERVER_DB": str(database)})
    assert volume.is_dir()
    assert fake.calls == [
        ("chown", str(volume), UID, UID),
        ("setgroups", []),
        ("setgid", UID),
        ("setuid", UID),
    ]
    # root's HOME is no place for the server's user (asyncpg looks for client certificates there)
    assert fake.environ["HOME"] == str(volume)


def test_an_existing_root_owned_database_is_handed_over_too(entry: dict[str, Any], tmp_path: Path) -> None:
    fake = FakeOs(euid=0)
    entry["os"] = fake
    database = tmp_path / "offline-server.db"
    database.write_bytes(b"SQLite format 3\x00")
    Path(f"{database}-shm").write_bytes(b"")
    entry["drop_privileges"]({"OFFLINE_RUN_AS": "10001:10002", "OFFLINE_SERVER_DB": str(database)})
    chowned = [call[1] for call in fake.calls if call[0] == "chown"]
    assert chowned == [str(tmp_path), str(database), f"{database}-shm"]
    assert fake.calls[-2:] == [("setgid", 10002), ("setuid", 10001)]


def test_not_root_or_no_target_changes_nothing(entry: dict[str, Any], tmp_path: Path) -> None:
    for euid, environ in ((UID, {"OFFLINE_RUN_AS": f"{UID}:{UID}"}), (0, {})):
        fake = FakeOs(euid=euid)
        entry["os"] = fake
        entry["drop_privileges"]({**environ, "OFFLINE_SERVER_DB": str(tmp_path / "x" / "db")})
        assert fake.calls == []
    assert not (tmp_path / "x").exists()


def test_a_chown_the_mount_refuses_is_reported_and_the_drop_still_happens(
    entry: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeOs(euid=0, fail_chown=True)
    entry["os"] = fake
    entry["drop_privileges"]({"OFFLINE_RUN_AS": "10001:10001", "OFFLINE_SERVER_DB": str(tmp_path / "db")})
    assert "could not give" in capsys.readouterr().err
    assert fake.calls[-1] == ("setuid", 10001)  # never keep running as root


def test_a_failed_drop_stops_the_process(entry: dict[str, Any], tmp_path: Path) -> None:
    fake = FakeOs(euid=0)
    fake.setuid = lambda uid: None  # type: ignore[method-assign]  # the kernel said no, silently
    entry["os"] = fake
    with pytest.raises(SystemExit, match="could not drop privileges"):
        entry["drop_privileges"]({"OFFLINE_RUN_AS": "10001:10001", "OFFLINE_SERVER_DB": str(tmp_path / "db")})


# -- for real, as root, in a child process --------------------------------------------------------------------

FAKE_SERVER_RUNTIME = """
import json, os, sys
IMPORTED_AS = os.getuid()
"""
FAKE_SERVER_MAIN = """
import json, os, sys
import server_runtime

def main():
    database = os.environ["OFFLINE_SERVER_DB"]
    with open(database, "ab") as handle:  # what SQLite needs: write access to the file (and its folder)
        handle.write(b"x")
    with open(database + "-wal", "wb") as handle:
        handle.write(b"w")
    print(json.dumps({
        "imported_as": server_runtime.IMPORTED_AS,
        "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid()],
        "groups": os.getgroups(),
        "entry": sys.argv[1],
    }))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged user can read (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="offline-entry-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_as_root_the_server_is_imported_and_writes_as_the_unprivileged_user(shared_dir: Path) -> None:
    python = "/usr/bin/python3"  # readable by every user (the venv's interpreter may live under /root)
    if os.geteuid() != 0:
        pytest.skip("dropping privileges for real needs root (the fake-os tests above cover the logic)")
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is missing: the child must run an interpreter every user can read")
    (shared_dir / "entry.py").write_text(render_template("zipapp_main.py.j2", entry="server.py"))
    package = shared_dir / "server_runtime"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_SERVER_RUNTIME)
    (package / "__main__.py").write_text(FAKE_SERVER_MAIN)
    for path in (package, package / "__init__.py", package / "__main__.py", shared_dir / "entry.py"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    volume = shared_dir / "volume"  # a fresh mount: root's, not writable by others
    volume.mkdir(mode=0o755)
    database = volume / "offline-server.db"
    database.write_bytes(b"")  # left by a server that once ran as root
    database.chmod(0o644)
    other = volume / "user-file.txt"
    other.write_text("not ours")

    done = subprocess.run(
        [
            python,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import entry; entry.main()",
            str(shared_dir),
        ],
        cwd=shared_dir,
        env={"PATH": "/usr/bin:/bin", "OFFLINE_RUN_AS": f"{UID}:{UID}", "OFFLINE_SERVER_DB": str(database)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["imported_as"] == UID  # the server was imported only after the drop
    assert report["ids"] == [UID, UID, UID, UID] and report["groups"] == []
    assert report["entry"].endswith("offline_app/server.py")
    for path in (volume, database, Path(f"{database}-wal")):
        assert (path.stat().st_uid, path.stat().st_gid) == (UID, UID), path
    assert database.read_bytes() == b"x"
    assert other.stat().st_uid == 0  # only the SQLite folder and files change hands
    assert stat.S_IMODE(volume.stat().st_mode) == 0o755
