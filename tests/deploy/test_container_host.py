"""ContainerHost's exec over SSH, against a stand-in for the docker SDK's client: the failure seen against a
real sshd (tests/e2e/test_self_hosted_deploy.py) reproduced without one.

Over SSH the SDK's connection is an `ssh ... docker system dial-stdio` process. An exec's raw stream ends when
the command ends; the engine closes it, the ssh process exits, and the SDK's close of that stream writes into
the gone process's stdin (BrokenPipeError). That connection is dead from then on.
"""

from __future__ import annotations

from typing import Any

from platform_adapters.container_host import ContainerHost


class _DeadAfterExec:
    """One SDK connection: exec_start reads the output, then raises as the SDK's close does over SSH; every
    request after that on this connection finds the pipe closed."""

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.spent = False
        self.closed = False

    @property
    def api(self) -> _DeadAfterExec:
        return self

    def _check(self) -> None:
        if self.spent:
            raise BrokenPipeError(32, "Broken pipe")

    def exec_create(self, name: str, command: list[str]) -> dict[str, str]:
        self._check()
        return {"Id": "exec-1"}

    def exec_start(self, exec_id: str) -> bytes:
        self._check()
        self.spent = True
        raise BrokenPipeError(32, "Broken pipe")

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        self._check()
        return {"ExitCode": self.exit_code}

    def close(self) -> None:
        self.closed = True


class _Host(ContainerHost):
    def __init__(self, exit_code: int) -> None:
        super().__init__({"DOCKER_HOST": "ssh://deploy@machine"})
        self.connections: list[_DeadAfterExec] = []
        self.exit_code = exit_code

    def _connect(self) -> Any:
        if self._client is None:
            self._client = _DeadAfterExec(self.exit_code)
            self.connections.append(self._client)
        return self._client


def test_an_exec_over_ssh_reports_the_commands_exit_code_when_its_stream_closes_into_a_gone_ssh() -> None:
    host = _Host(exit_code=0)
    assert host.exec("app-postgres", ["pg_isready"]) == 0
    # The exec's connection was given up; the exit code came over a fresh one.
    assert len(host.connections) == 2 and host.connections[0].closed


def test_requests_after_an_exec_over_ssh_do_not_reuse_its_dead_connection() -> None:
    host = _Host(exit_code=1)
    assert [host.exec("app-postgres", ["pg_isready"]) for _ in range(3)] == [1, 1, 1]
    assert all(connection.closed for connection in host.connections[:-1])
