"""One call on a sandbox, described once: the command it runs, how much of its output is kept,
and how its output and outcome become its answer or its error (`Call`; a stream's events:
`Events`). Both front doors drive the same description: the blocking one
(`Sandbox.perform`, `Sandbox.events`) and the asyncio one (`aperform`, `aevents`, through
`orchestrator.aio`), so a call's argv, its checks and its result are written once, and the
two doors differ only in how they wait.

A Sandbox describes each call (`execute_call`, `read_file_call`, ...) and makes its blocking
door of it here (`execute = blocking(execute_call)`); `orchestrator.aio` makes the awaited
door of the same description."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Generator
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from orchestrator.errors import (
    CommandFailed,
    CommandTimeout,
    SandboxFileTimeout,
    SandboxUnavailable,
    UsageError,
)
from orchestrator.sandbox import files
from orchestrator.sandbox.options import Command
from orchestrator.sandbox.results import (
    Outcome,
    RuntimeResult,
    StreamEvent,
    StreamKind,
    TailBuffer,
    decode,
    decoder,
)
from orchestrator.settings import FILE_TIMEOUT
from orchestrator.spec.models import USER_RE
from orchestrator.tables import printable

T = TypeVar("T")
P = ParamSpec("P")
Answer = Callable[[TailBuffer, TailBuffer, Outcome], T]
"""How a call's kept output (stdout, stderr) and its outcome become its answer, or raise."""
ERR_LIMIT = 64 * 1024
"""Bytes of a file helper's stderr kept for its error message."""


@dataclasses.dataclass(frozen=True)
class Call(Generic[T]):
    """One call, ready to run: either door runs `cmd`, keeps the last `limit` bytes of each
    stream, and gives back what `answer` makes of them."""

    cmd: Command
    limit: int
    answer: Answer[T]
    bulk: bool = False
    """A folder's archive in or out: a backend's cheaper path for many bytes takes it."""


@dataclasses.dataclass(frozen=True)
class Streamed:
    """One `stream` call, ready to run: its command, and the bytes of each stream its last
    event's result keeps."""

    cmd: Command
    limit: int


class Events:
    """A command's output as stream events: text as it decodes, both streams' tails kept,
    and at the end the "finished" event with the result (`result` makes it, as `execute`
    would have)."""

    def __init__(self, limit: int, result: Answer[RuntimeResult]) -> None:
        self._result = result
        self._bufs: dict[StreamKind, TailBuffer] = {
            "stdout": TailBuffer(limit),
            "stderr": TailBuffer(limit),
        }
        self._decoders: dict[StreamKind, Any] = {"stdout": decoder(), "stderr": decoder()}

    def add(self, kind: StreamKind, data: bytes) -> StreamEvent | None:
        self._bufs[kind].add(data)
        text = self._decoders[kind].decode(data)
        return StreamEvent(kind, text, data=data) if data else None

    def finish(self, outcome: Outcome) -> list[StreamEvent]:
        events = []
        for name, dec in self._decoders.items():
            tail = dec.decode(b"", final=True)
            if tail:
                events.append(StreamEvent(name, tail))
        result = self._result(self._bufs["stdout"], self._bufs["stderr"], outcome)
        return [*events, StreamEvent("finished", result=result)]


class Performs(Protocol):
    """What drives a described call: the blocking door's side of a Sandbox."""

    def perform(self, call: Call[T]) -> T: ...

    def events(self, call: Streamed) -> Generator[StreamEvent, None, None]: ...


S = TypeVar("S", bound=Performs)


def blocking(describe: Callable[Concatenate[S, P], Call[T]]) -> Callable[Concatenate[S, P], T]:
    """The blocking door of a call described by `describe` (a Sandbox method named
    `<door>_call`): its arguments and docs, run to its answer."""

    def door(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self.perform(describe(self, *args, **kwargs))

    return as_door_of(door, describe)


def streaming(
    describe: Callable[Concatenate[S, P], Streamed],
) -> Callable[Concatenate[S, P], Generator[StreamEvent, None, None]]:
    """The blocking door of a stream described by `describe`: its events as they come."""

    def door(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Generator[StreamEvent, None, None]:
        return self.events(describe(self, *args, **kwargs))

    return as_door_of(door, describe)


F = TypeVar("F", bound=Callable[..., Any])


def as_door_of(door: F, describe: Callable[..., Any], note: str = "") -> F:
    """`door` with the docs and signature of `describe` (and `note` after its docs), named
    as the door (`execute` for `execute_call`): what help() and the docs show of either."""
    functools.update_wrapper(door, describe)
    door.__name__ = describe.__name__.removesuffix("_call")
    door.__qualname__ = describe.__qualname__.removesuffix("_call")
    if note:
        door.__doc__ = f"{door.__doc__ or ''}\n\n{note}"
    return door


# ----- the checks and answers calls share ------------------------------------------------------
_USER = re.compile(USER_RE)


def validated(cmd: Command) -> Command:
    """Refuse what no process could be started with, before any backend sees it."""
    for i, arg in enumerate(cmd.argv):
        if "\0" in arg:
            raise UsageError(f"command argument {i} contains a NUL byte, which no program can take")
    for key, value in cmd.env.items():
        if not key or "=" in key or "\0" in key:
            raise UsageError(f"environment variable name {key!r} is invalid (empty, '=' or NUL)")
        if "\0" in value:
            raise UsageError(f"environment variable {key} contains a NUL byte")
    if "\0" in cmd.cwd:
        raise UsageError("cwd contains a NUL byte")
    if cmd.user is not None and not _USER.match(cmd.user):
        raise UsageError(f"user {cmd.user!r} is not a name, uid, name:group or uid:gid")
    return cmd


def checked(result: RuntimeResult, timeout: float | None) -> RuntimeResult:
    """`execute(check=True)`: the result of a command that succeeded; else CommandTimeout or
    CommandFailed, carrying it."""
    if result.timed_out:
        raise CommandTimeout(result, timeout or 0.0)
    if result.exit_code != 0:
        raise CommandFailed(result)
    return result


def file_deadline(timeout: float | None) -> float:
    """A file call's deadline: the caller's, else ORCHESTRATOR_FILE_TIMEOUT."""
    return FILE_TIMEOUT.get() if timeout is None else timeout


# What a shell says when it cannot start a process (busybox ash, dash, bash), and what the
# engine's runtime says when `docker exec` itself cannot start a thread or a process in the
# container (the plain path): our helper could not run, which is the sandbox failing, not the
# file being missing or locked (Go's abort exits 2, the helper's "not found")
_NO_FORK = re.compile(
    r"^(?:[^:\n]+: )*(?:\d+: )?(?:can't fork|cannot fork|fork: (?:retry: )?"
    r"(?:resource temporarily unavailable|cannot allocate memory)"
    r"|pthread_create failed: resource temporarily unavailable"
    r"|read init-p: connection reset by peer)",
    re.IGNORECASE | re.MULTILINE,
)


def raise_held(
    outcome: Outcome,
    stderr: str,
    target: str,
    verb: str,
    timeout: float,
    cause: BaseException | None = None,
) -> None:
    """Raise for a file helper that ran out of time, or could not run at all."""
    if outcome.timed_out:
        raise SandboxFileTimeout(
            f"cannot {verb} {target}: not done within {timeout:g} s, so it was stopped "
            "(something in the sandbox held it: a FIFO in its place, a stopped process); "
            f"pass timeout= or set {FILE_TIMEOUT.name} to allow longer",
            path=target,
            timeout=timeout,
        ) from cause
    found = _NO_FORK.search(stderr) if outcome.exit_code != 0 else None
    if found is not None:
        raise SandboxUnavailable(
            f"cannot {verb} {target}: the sandbox cannot start a process "
            f"({printable(found.group(0))}): "
            "its pids or memory limit is reached; the file was not touched"
        ) from cause


def written(target: str, deadline: float) -> Answer[None]:
    """The answer of a write_file: nothing, or what its command says went wrong."""

    def answer(out: TailBuffer, err: TailBuffer, outcome: Outcome) -> None:
        stderr = decode(err.value())
        raise_held(outcome, stderr, target, "write", deadline)
        files.raise_for(outcome.exit_code, target, "write", stderr)

    return answer


@dataclasses.dataclass(frozen=True)
class Read:
    """The answer of a read_file: the content (text or bytes), or its error."""

    target: str
    deadline: float
    limit: int
    text: bool

    def __call__(self, out: TailBuffer, err: TailBuffer, outcome: Outcome) -> str | bytes:
        data, stderr = out.value(), decode(err.value())
        raise_held(outcome, stderr, self.target, "read", self.deadline)
        snippet = decode(data[:32]).strip()
        files.raise_for(outcome.exit_code, self.target, "read", stderr, self.limit, snippet)
        return decode(data) if self.text else data
