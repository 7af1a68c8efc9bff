"""How a runtime is spawned, how one command is described, and the size limits."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from orchestrator import settings
from orchestrator.errors import UsageError
from orchestrator.sandbox.results import Outcome, StreamKind
from orchestrator.spec.models import Mount, PortMap
from orchestrator.spec.policy import Policy

if TYPE_CHECKING:  # (a type only: snapshots build on this module)
    from orchestrator.sandbox.live import Control
    from orchestrator.sandbox.snapshot import Snapshot

MiB = 1024 * 1024
OUTPUT_LIMIT_ENV = settings.OUTPUT_LIMIT.name
FILE_LIMIT_ENV = settings.FILE_LIMIT.name
SETUP_TIMEOUT_ENV = settings.SETUP_TIMEOUT.name
SNAPSHOT_LIMIT_ENV = settings.SNAPSHOT_LIMIT.name
GiB = 1024 * MiB

BuildChoice = Literal["auto", "always", "never"]
"""How a spawn gets the images its file builds: "auto" builds one whose inputs changed (a new
Dockerfile, build args or context), "always" builds through the engine's layer cache (cheap
when nothing changed), "never" builds none: an image missing is a UsageError naming it."""
BUILD_CHOICES: tuple[BuildChoice, ...] = ("auto", "always", "never")

Chunks = Generator[tuple[StreamKind, bytes], None, Outcome]
"""What a backend's `_run` is: output as it arrives, then the Outcome."""
AChunks = AsyncGenerator["tuple[StreamKind, bytes] | Outcome", None]
"""What a backend's `_arun` is, for asyncio callers: output as it arrives, then the Outcome,
last. Closing it early (or cancelling the task awaiting it) kills the command's tree."""


def default_output_limit() -> int:
    return settings.OUTPUT_LIMIT.get()


def output_limit_of(asked: int | None) -> int:
    """A call's `output_limit`: the default when None; UsageError unless a positive whole
    number of bytes (0 read as "the default", and a negative one dropped all output)."""
    if asked is None:
        return default_output_limit()
    if isinstance(asked, bool) or not isinstance(asked, int) or asked <= 0:
        raise UsageError(f"output_limit must be a positive number of bytes, not {asked!r}")
    return asked


def default_file_limit() -> int:
    return settings.FILE_LIMIT.get()


def snapshot_limit() -> int:
    return settings.SNAPSHOT_LIMIT.get()


def setup_timeout() -> float:
    return settings.SETUP_TIMEOUT.get()


@dataclass(frozen=True)
class SpawnOptions:
    """How one runtime is spawned from an environment."""

    workspace: Path | None = None
    """Host workspace; None makes a temporary one, removed at cleanup."""
    mounts: tuple[Mount, ...] = ()
    ports: tuple[PortMap, ...] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    is_evaluation: bool = False
    is_resume: bool = False
    disable_setup: bool = False
    policy: Policy = field(default_factory=Policy.from_env)
    detached: bool = False
    """Started for `orchestrator up`: lives on after this process, until `down`/`cleanup`."""
    resume: Snapshot | None = None
    """Restore this workspace before setup (which then runs `setup.resume_commands`)."""
    host: str | None = None
    """The engine (any `docker --host` address; for swarm, the manager); None: the
    process's (ORCHESTRATOR_DOCKER_HOST, DOCKER_HOST, or the local engine)."""
    build: BuildChoice = "auto"
    """How the images the file builds are got (see BuildChoice)."""

    def __post_init__(self) -> None:
        if self.host:  # `podman` names Podman's socket; an address stays as it is
            object.__setattr__(self, "host", settings.engine_address(self.host))


@dataclass(frozen=True)
class Command:
    """One command, normalized: argv, the call's extra env, absolute cwd, user "uid:gid"."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: str | None
    timeout: float | None
    stdin: bytes | Iterable[bytes] | None
    """What the command reads: bytes, or chunks as they are produced (a folder being packed,
    a started process's `LiveInput`); None: nothing (end of file at once)."""
    tty: tuple[int, int] | None = None
    """(columns, rows): run it on a terminal of its own that size (a started process's
    `tty=True`): its output one stream (stdout), its input typed into the terminal."""
    control: Control | None = None
    """How a started process's caller signals or kills it (sandbox/live.py): the backend
    binds it once the command is sent, and unbinds it at its end. None for every other
    call."""
    keep: str | None = None
    """A kept process's id (a started process's `keep=True`): it outlives its caller."""
    attach: int | None = None
    """Read the kept process `keep` from this offset in its output on (`Sandbox.process`),
    instead of running `argv`."""


STDIN_CHUNK = 1 << 20


def stdin_chunks(stdin: bytes | Iterable[bytes]) -> Iterator[bytes]:
    """A command's input in pieces of at most STDIN_CHUNK bytes."""
    for data in [stdin] if isinstance(stdin, bytes) else stdin:
        view = memoryview(data)
        for i in range(0, len(view), STDIN_CHUNK):
            yield bytes(view[i : i + STDIN_CHUNK])
