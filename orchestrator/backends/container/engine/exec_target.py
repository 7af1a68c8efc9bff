"""The one builder of `docker exec` command lines (`engine.exec_target(container).argv(...)`):
every command, executor, copy-in, tether and shell a container backend runs in a container is
spelled here.

Each option is one `--name=value` word, so no value (a user, a folder, a variable a caller
chose) can ever be read by the docker CLI as an option of its own, and the container comes
last before the command, after which the CLI reads nothing as an option. A backend that
reaches its containers another way (Podman, `kubectl exec`) is one class more with the same
`argv`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.backends.container.engine.core import EngineCore


@dataclass(frozen=True)
class ExecTarget:
    """One container of one engine (`engine.exec_target(container)`)."""

    engine: EngineCore
    container: str

    def argv(
        self,
        command: Sequence[str],
        *,
        user: str | None = None,
        workdir: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        tty: bool = False,
        seconds: float | None = None,
    ) -> list[str]:
        """`docker exec` of `command` (an argv, run as given: no shell is added), bounded at
        `seconds` when given (None: an exec that lasts as long as its command, as the
        executor's does; its caller keeps the deadline)."""
        if not command:
            raise ValueError("an exec needs a command")
        if not self.container or self.container.startswith("-"):
            raise ValueError(f"not a container name: {self.container!r}")
        argv = self.engine.argv("exec", bounded=seconds is not None, seconds=seconds)
        flags = ("i" if stdin else "") + ("t" if tty else "")
        if flags:
            argv.append(f"-{flags}")  # -it: what a person retyping it expects
        if user:
            argv.append(f"--user={user}")
        if workdir:
            argv.append(f"--workdir={workdir}")
        for key, value in (env or {}).items():
            argv.append(f"--env={key}={value}")
        return [*argv, self.container, *command]
