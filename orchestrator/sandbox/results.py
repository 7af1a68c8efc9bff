"""Typed results and stream events. A non-zero exit is data, not an exception."""

from __future__ import annotations

import codecs
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.sandbox.usage import Usage
from orchestrator.spec.published import PublishedPort

if TYPE_CHECKING:  # (`ps` lists environments without procutil: 4 ms of its ~70)
    from orchestrator.procutil import Outcome

__all__ = [
    "Connection",
    "ExecMode",
    "Outcome",
    "PublishedPort",
    "RuntimeInfo",
    "RuntimeResult",
    "StreamEvent",
    "StreamKind",
]


def __getattr__(name: str) -> Any:
    if name == "Outcome":  # (here for those who take it with the results)
        from orchestrator.procutil import Outcome

        return Outcome
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DECODE_ERRORS = "replace"
StreamKind = Literal["stdout", "stderr"]
"""Which output stream a chunk of output came from."""


@dataclass(frozen=True)
class RuntimeResult:
    """The outcome of one command."""

    exit_code: int
    """The command's exit status; 128+N when it was killed by signal N."""
    stdout: str
    stderr: str
    elapsed: float
    """Wall-clock seconds from start to finish."""
    timed_out: bool = False
    truncated: bool = False
    """Some output was dropped (each stream keeps its last `output_limit` bytes)."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    oom_killed: bool = False
    """The kernel's out-of-memory killer ended the command (container memory limit)."""
    setup_stdout: str = ""
    """Output of the environment's setup commands, kept apart from the command's own."""
    setup_stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class StreamEvent:
    """One event of `Runtime.stream`: output as it arrives, then "finished" with the result."""

    kind: Literal["stdout", "stderr", "finished"]
    """Output of one stream, or "finished" (last, with `result`)."""
    text: str = ""
    """The output decoded (UTF-8, undecodable bytes replaced); a character cut in two between
    chunks comes whole in the later event."""
    result: RuntimeResult | None = None
    data: bytes = b""
    """The output's own bytes, as the command wrote them (`text` is their decoding): what
    passes binary output on unchanged. All events' `data` of a stream joined are its
    output; an event may carry `data` whose `text` comes later, and the decoder's last
    characters come in an event with no `data`."""


ExecMode = Literal["executor", "plain", "process"]
"""How commands reach the sandbox: the in-container executor, one `docker exec` per command
(images without python3), or host processes (the local backend)."""


@dataclass(frozen=True)
class RuntimeInfo:
    """What a live runtime is, for printing and for harnesses (`orchestrator up --json`)."""

    id: str
    """The environment's id: its Compose project name on Docker."""
    env: str
    """The environment file's `name`."""
    backend: str
    workdir: str
    """Where commands start, as they see it."""
    user: str | None
    """Default command user ("uid:gid" or a name); None: the backend's own."""
    exec_mode: ExecMode
    container: str | None = None
    """The main container's id (Docker)."""
    ports: tuple[PublishedPort, ...] = ()
    """Published ports of every service."""


@dataclass(frozen=True)
class Connection:
    """How a person reaches the sandbox from a terminal on the host."""

    kind: str
    """How it is reached, named by the backend ("docker": `docker exec` into `container`;
    "local": a host shell); a plugin backend names its own."""
    shell: tuple[str, ...]
    """argv of an interactive shell in the workdir, as the sandbox user."""
    container: str | None = None
    """The container it enters (Docker)."""
    command: tuple[str, ...] = ()
    """The interactive shell's own argv, as run in the sandbox: what `orchestrator shell`
    starts there on a terminal of the process API (empty: it runs `shell` instead)."""

    def __str__(self) -> str:
        return shlex.join(self.shell)


class TailBuffer:
    """Keeps the last `limit` bytes of a stream; memory stays bounded whatever arrives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self.truncated = False

    def add(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self.limit + 65536:
            self._trim()

    def _trim(self) -> None:
        if len(self._buf) > self.limit:
            del self._buf[: len(self._buf) - self.limit]
            self.truncated = True

    def value(self) -> bytes:
        self._trim()
        return bytes(self._buf)


def decoder() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(DECODE_ERRORS)


def decode(data: bytes) -> str:
    return data.decode("utf-8", DECODE_ERRORS)


@dataclass(frozen=True)
class EnvironmentStatus:
    """One environment left running, as `orchestrator ps` shows it."""

    id: str
    env: str
    """The environment file's `name`."""
    owner: str
    """The process that uses it ("detached" for `orchestrator up`)."""
    state: str
    """The states of its containers, comma-separated ("no containers" when none): "paused"
    for those frozen by `pause` (`orchestrator resume ID` lets them run on)."""
    containers: int
    networks: int
    ports: tuple[PublishedPort, ...]
    """Published ports of every service."""
    pool: str = ""
    """"<pool id> <state>" for a member of a warm pool (ready, in-use, claimed), else ""."""
    paused: bool = False
    """Whether it is paused (`rt.pause()`, `orchestrator pause`): a container of it is."""
    started: str = ""
    """When it started (UTC, ISO 8601 to the second); "" when unknown."""
    usage: Usage | None = None
    """What it cost so far, when asked (`environments(usage=True)`): one reading of its
    containers' accounting and its gateway's counts, from outside its owner (no memory over
    time, no commands: those are its owner's `rt.usage()`)."""
    command: str = ""
    """With `usage`: the command line of the newest process its main sandbox runs, not one
    of ours ("" when none, or not read); the sandbox's own text, shown as text only."""
