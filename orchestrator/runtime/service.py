"""A service of a Docker environment as a sandbox: `rt.service("web")` runs commands and moves
files in that container with the same rules as the main one (exit codes, separate streams,
timeouts that kill the whole tree inside it, users by name), through its own executor where
python3 is there, else plain `docker exec` (which needs nothing but a POSIX shell)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.compile.mounts import STATIC_ROOT
from orchestrator.errors import UsageError
from orchestrator.runtime.base import Sandbox
from orchestrator.runtime.channel import Channel
from orchestrator.runtime.options import Chunks, Command
from orchestrator.runtime.results import Connection
from orchestrator.spec.models import Service, StaticAsset

SHELL = "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"
"""An interactive shell: bash where the image has it."""


def shell_connection(
    docker_cmd: Sequence[str], container: str, workdir: str, user: str | None
) -> Connection:
    """`docker exec -it` into a container's workdir, as `user`, with an interactive shell."""
    who = ["-u", user] if user else []
    argv = (*docker_cmd, "exec", "-it", *who, "-w", workdir, container, "/bin/sh", "-c", SHELL)
    return Connection("docker", argv, container)


"""Why a service's container cannot run commands (gone, stopped, paused), or None."""


class ServiceSandbox(Sandbox):
    def __init__(
        self,
        name: str,
        spec: Service,
        *,
        container: str,
        workdir: str,
        user: str | None,
        channel: Channel,
        docker_cmd: list[str],
        static_asset: Callable[[str], StaticAsset],
        check_usable: Callable[[], None],
    ) -> None:
        self.name = name
        self.spec = spec
        self.container = container
        self._workdir = workdir
        self._default_user = user
        self._docker_cmd = docker_cmd
        self._static_asset = static_asset
        self._usable = check_usable
        self.channel = channel

    def _check_usable(self) -> None:
        self._usable()

    @property
    def workdir(self) -> str:
        return self._workdir

    @property
    def default_user(self) -> str | None:
        return self._default_user

    def static_path(self, name: str) -> str:
        if not self.spec.static_assets:
            raise UsageError(
                f"service {self.name!r} has no static assets (its `static_assets: false`)"
            )
        return f"{STATIC_ROOT}/{self._static_asset(name).save_path}"

    def connection(self, *, user: str | None = None) -> Connection:
        self._check_usable()
        return shell_connection(self._docker_cmd, self.container, self.workdir, self._user(user))

    def _run(self, cmd: Command) -> Chunks:
        return (yield from self.channel.run(cmd))
