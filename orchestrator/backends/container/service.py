"""A service of a Docker environment as a sandbox: `rt.service("web")` runs commands and moves
files in that container with the same rules as the main one (exit codes, separate streams,
timeouts that kill the whole tree inside it, users by name), through its own executor where
python3 is there, else plain `docker exec` (which needs nothing but a POSIX shell)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.container.channel import Channel
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.layout import STATIC_ROOT
from orchestrator.errors import UsageError
from orchestrator.sandbox.calls import Sandbox
from orchestrator.sandbox.options import AChunks, Chunks, Command
from orchestrator.sandbox.results import Connection
from orchestrator.spec.models import Service, StaticAsset

SHELL = "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"
"""An interactive shell: bash where the image has it."""


def shell_connection(engine: Engine, container: str, workdir: str, user: str | None) -> Connection:
    """`docker exec -it` into a container's workdir, as `user`, with an interactive shell."""
    target = engine.exec_target(container)
    command = ("/bin/sh", "-c", SHELL)
    argv = target.argv(list(command), user=user, workdir=workdir, stdin=True, tty=True)
    return Connection("docker", tuple(argv), container, command)


@dataclass(eq=False)
class ServiceSandbox(Sandbox):
    name: str
    spec: Service
    container: str
    image_workdir: str
    """Where its commands start: the image's WORKDIR, or /."""
    user: str | None
    """Its default user: the service's `user:`, else the image's (None: root)."""
    channel: Channel
    engine: Engine
    static_asset: Callable[[str], StaticAsset]
    check_usable: Callable[[], None]
    host_folders: Callable[[], Sequence[Path]] = lambda: ()
    """The environment's `writable_host_folders` (a download never follows a link there)."""

    def _check_usable(self) -> None:
        self.check_usable()

    def writable_host_folders(self) -> Sequence[Path]:
        return self.host_folders()

    @property
    def workdir(self) -> str:
        """The service's `workdir`, else the image's WORKDIR (or /)."""
        return self.spec.workdir or self.image_workdir

    @property
    def default_user(self) -> str | None:
        return self.user

    def static_path(self, name: str) -> str:
        if not self.spec.static_assets:
            raise UsageError(
                f"service {self.name!r} has no static assets (its `static_assets: false`)"
            )
        return f"{STATIC_ROOT}/{self.static_asset(name).save_path}"

    def _gives_terminal(self) -> bool:
        self._check_usable()
        return self.channel.ready() is not None

    def connection(self, *, user: str | None = None) -> Connection:
        self._check_usable()
        return shell_connection(self.engine, self.container, self.workdir, self._user(user))

    def _run(self, cmd: Command) -> Chunks:
        return (yield from self.channel.run(cmd))

    def _arun(self, cmd: Command) -> AChunks:
        return self.channel.arun(cmd)

    def _run_bulk(self, cmd: Command) -> Chunks:
        return (yield from self.channel.run(cmd, bulk=True))
