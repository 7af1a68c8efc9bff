"""The calls every place commands run answers, written once for every backend.

A `Sandbox` is a place commands run (the main sandbox, or one service of it): it provides
`_run`, `workdir`, `static_path` and `connection`, and execute, stream and the file calls are
written once over them (`Runtime`, in sandbox/base.py, adds the lifecycle).

`{{static:NAME}}` placeholders are resolved in the environment file's own commands (setup,
`commands`), never in the text a caller passes to `execute`: that text may be model-written,
and runs exactly as given (use `static_path(NAME)` to build a path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

from orchestrator.errors import (
    CommandFailed,
    CommandTimeout,
    ExecutorLost,
    OrchestratorError,
    OutputLimitExceeded,
    SandboxFileTimeout,
    SandboxUnavailable,
    UsageError,
)
from orchestrator.sandbox import files
from orchestrator.sandbox.options import (
    FILE_LIMIT_ENV,
    AChunks,
    Chunks,
    Command,
    default_file_limit,
    output_limit_of,
)
from orchestrator.sandbox.results import (
    Connection,
    Outcome,
    RuntimeResult,
    StreamEvent,
    StreamKind,
    TailBuffer,
    decode,
    decoder,
)
from orchestrator.sandbox.streams import ArchiveStream
from orchestrator.sandbox.threads import thread_chunks
from orchestrator.settings import FILE_TIMEOUT
from orchestrator.spec.models import USER_RE
from orchestrator.spec.resolve import resolve_user


class Sandbox(ABC):
    """Commands and files in one place: the main sandbox (a Runtime) or one of its services.
    Everything callers use is written here once over `_run`, so every place keeps the same
    semantics."""

    @abstractmethod
    def _run(self, cmd: Command) -> Chunks:
        """Run one command: yield (stream, bytes), return its Outcome. Closing the generator
        early must kill the command's whole tree."""

    @abstractmethod
    def _check_usable(self) -> None:
        """Raise RuntimeClosed when no command may run here any more."""

    @property
    @abstractmethod
    def workdir(self) -> str:
        """Working folder, as commands see it."""

    @abstractmethod
    def static_path(self, name: str) -> str:
        """Where static asset `name` is, as commands see it."""

    @property
    def default_user(self) -> str | None:
        """User commands run as when the call names none, None for the backend's."""
        return None

    def _setup_output(self) -> RuntimeResult | None:
        """The environment's setup output, carried apart in every result (None: no setup)."""
        return None

    @abstractmethod
    def connection(self, *, user: str | None = None) -> Connection:
        """How a person opens a shell here from the host (as `user`, else the default)."""

    # ----- commands ------------------------------------------------------------------------
    def _command(
        self,
        command: str | Sequence[str],
        env: Mapping[str, str] | None,
        stdin: Any,
        cwd: str | None,
        user: str | None,
        timeout: float | None,
    ) -> Command:
        self._check_usable()
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        else:
            argv = [str(a) for a in command]
            if not argv:
                raise UsageError("empty command")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise UsageError(f"timeout must be a positive number of seconds, got {timeout}")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        elif stdin is not None and not isinstance(stdin, bytes | bytearray | memoryview):
            raise UsageError("stdin must be str or bytes")
        return _validated(
            Command(
                argv=argv,
                env={str(k): str(v) for k, v in (env or {}).items()},
                cwd=posixpath.normpath(posixpath.join(self.workdir, cwd)) if cwd else self.workdir,
                user=self._user(user),
                timeout=timeout,
                stdin=bytes(stdin) if stdin is not None else None,
            )
        )

    def _user(self, user: str | None) -> str | None:
        return resolve_user(user) if user is not None else self.default_user

    def _result(self, out: TailBuffer, err: TailBuffer, outcome: Outcome) -> RuntimeResult:
        setup = self._setup_output()
        return RuntimeResult(
            exit_code=outcome.exit_code,
            stdout=decode(out.value()),
            stderr=decode(err.value()),
            elapsed=outcome.elapsed,
            timed_out=outcome.timed_out,
            truncated=out.truncated or err.truncated,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            oom_killed=outcome.oom_killed,
            setup_stdout=setup.stdout if setup else "",
            setup_stderr=setup.stderr if setup else "",
        )

    def _run_bulk(self, cmd: Command) -> Chunks:
        """A command printing a folder's archive, or reading one (its stdin a
        files.PackStream): where a backend has a cheaper path for many bytes than for many
        commands, it takes it."""
        return self._run(cmd)

    def _collect(
        self, cmd: Command, limit: int, *, bulk: bool = False
    ) -> tuple[TailBuffer, TailBuffer, Outcome]:
        out, err = TailBuffer(limit), TailBuffer(limit)
        gen = self._run_bulk(cmd) if bulk else self._run(cmd)
        try:
            while True:
                kind, data = next(gen)
                (out if kind == "stdout" else err).add(data)
        except StopIteration as stop:
            return out, err, stop.value
        finally:
            gen.close()

    def _arun(self, cmd: Command) -> AChunks:
        """`_run` for an asyncio caller (see AChunks): by default the blocking `_run` in a
        thread of its own; a backend with a native way overrides it."""
        return thread_chunks(lambda: self._run(cmd))

    async def _acollect(self, cmd: Command, limit: int) -> tuple[TailBuffer, TailBuffer, Outcome]:
        out, err = TailBuffer(limit), TailBuffer(limit)
        async with contextlib.aclosing(self._arun(cmd)) as run:
            async for item in run:
                if isinstance(item, Outcome):
                    return out, err, item
                kind, data = item
                (out if kind == "stdout" else err).add(data)
        raise ExecutorLost("the command's output ended without its exit status")

    def execute(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        check: bool = False,
        output_limit: int | None = None,
    ) -> RuntimeResult:
        """Run a command to completion. A str runs through /bin/sh -c; a list runs as argv.
        `cwd` is relative to the workdir; `user` is "uid[:gid]", "root" or "host"."""
        cmd = self._command(command, env, stdin, cwd, user, timeout)
        out, err, outcome = self._collect(cmd, output_limit_of(output_limit))
        result = self._result(out, err, outcome)
        if check:
            _check(result, timeout)
        return result

    def stream(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """Yield output as it arrives, then a "finished" event carrying the result. Closing
        the generator (or breaking out of a `for` over it) kills the command."""
        if stdin is not None:
            raise UsageError("stream() takes no stdin; use execute(..., stdin=...)")
        cmd = self._command(command, env, None, cwd, user, timeout)
        return self._stream(cmd, output_limit_of(output_limit))

    def _stream(self, cmd: Command, limit: int) -> Generator[StreamEvent, None, None]:
        self._check_usable()  # again where it is iterated (another process, after a pause)
        events = _Events(self, limit)
        gen = self._run(cmd)
        try:
            while True:
                try:
                    kind, data = next(gen)
                except StopIteration as stop:
                    yield from events.finish(stop.value)
                    return
                event = events.add(kind, data)
                if event is not None:
                    yield event
        finally:
            gen.close()

    # ----- files ---------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, str(path)))

    def write_file(
        self,
        path: str,
        content: str | bytes,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Write text or bytes (line endings kept as given), creating parent folders. Raises
        SandboxPermissionError for a path that is no regular file (a FIFO, device or socket:
        never opened), SandboxFileTimeout past `timeout` seconds (default:
        ORCHESTRATOR_FILE_TIMEOUT)."""
        cmd, target, deadline = self._write_command(path, content, user, timeout)
        _, err, outcome = self._collect(cmd, ERR_LIMIT)
        _written(err, outcome, target, deadline)

    def _write_command(
        self, path: str, content: str | bytes, user: str | None, timeout: float | None
    ) -> tuple[Command, str, float]:
        data = content.encode() if isinstance(content, str) else bytes(content)
        target, deadline = self._path(path), _deadline(timeout)
        cmd = self._command(files.write_argv(target), None, data, None, user, deadline)
        return cmd, target, deadline

    @overload
    def read_file(
        self,
        path: str,
        *,
        text: Literal[True] = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str: ...
    @overload
    def read_file(
        self,
        path: str,
        *,
        text: Literal[False],
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> bytes: ...
    @overload
    def read_file(
        self,
        path: str,
        *,
        text: bool,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str | bytes: ...
    def read_file(
        self,
        path: str,
        *,
        text: bool = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> str | bytes:
        """Return a file's content as text (UTF-8, invalid bytes replaced) or bytes. Raises
        SandboxFileNotFound, SandboxIsADirectory, SandboxPermissionError (also the built-in
        errors; also for a path that is no regular file: a FIFO, device or socket is never
        read), OutputLimitExceeded past `limit` bytes, or SandboxFileTimeout past `timeout`
        seconds (default: ORCHESTRATOR_FILE_TIMEOUT)."""
        read = self._read_command(path, user, limit, timeout)
        out, err, outcome = self._collect(read.cmd, read.limit + 1)
        return read.result(out, err, outcome, text)

    def _read_command(
        self, path: str, user: str | None, limit: int | None, timeout: float | None
    ) -> _Read:
        limit = limit or default_file_limit()
        target, deadline = self._path(path), _deadline(timeout)
        cmd = self._command(files.read_argv(target, limit), None, None, None, user, deadline)
        return _Read(cmd, target, deadline, limit)

    def upload(
        self,
        local: str | Path,
        dest: str,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Copy a local folder's content into folder `dest` (created if missing) as one tar
        stream: modes and symlinks kept, files owned by the command user. Raises
        SandboxFileTimeout past `timeout` seconds (default: ORCHESTRATOR_FILE_TIMEOUT)."""
        stream = files.PackStream(Path(local))
        try:
            self._unpack_here(stream, dest, user, timeout)
        except SandboxFileTimeout:
            raise  # the sandbox held it: whatever the packer then said is a consequence
        except OrchestratorError:
            if stream.error is None:
                raise
        if stream.error is not None:  # the sandbox saw a cut archive; this is why
            raise stream.error

    def _unpack_here(
        self,
        archive: bytes | Iterable[bytes],
        dest: str,
        user: str | None,
        timeout: float | None = None,
    ) -> None:
        target, deadline = self._path(dest), _deadline(timeout)
        cmd = self._command(files.upload_argv(target), None, b"", None, user, deadline)
        cmd = dataclasses.replace(cmd, stdin=archive)
        _, err, outcome = self._collect(cmd, 64 * 1024, bulk=isinstance(archive, ArchiveStream))
        stderr = decode(err.value())
        _raise_held(outcome, stderr, target, "upload into", deadline)
        files.raise_for_folder(outcome.exit_code, target, "upload into", stderr)

    def _pack_here(
        self, src: str, user: str | None, limit: int, timeout: float | None = None
    ) -> bytes:
        """The folder `src` packed by the sandbox, as bytes (a pool's baseline)."""
        archive = bytearray()
        self._pack_into(src, user, limit, timeout, archive.extend)
        return bytes(archive)

    def _pack_into(
        self,
        src: str,
        user: str | None,
        limit: int,
        timeout: float | None,
        sink: Callable[[bytes], object],
    ) -> None:
        """The folder `src` packed by the sandbox, its archive handed to `sink` chunk by chunk
        as it comes (a snapshot's file: never whole in this process). Past `limit` bytes,
        OutputLimitExceeded at once (the command is killed); past `timeout` seconds
        SandboxFileTimeout."""
        target, deadline = self._path(src), _deadline(timeout)
        cmd = self._command(files.download_argv(target), None, None, None, user, deadline)
        err, size = TailBuffer(ERR_LIMIT), 0
        gen = self._run_bulk(cmd)
        try:
            while True:
                try:
                    kind, data = next(gen)
                except StopIteration as stop:
                    outcome: Outcome = stop.value
                    break
                if kind == "stderr":
                    err.add(data)
                    continue
                size += len(data)
                if size > limit:
                    raise OutputLimitExceeded(
                        f"{target} packs to more than the limit of {limit} bytes (pass limit= "
                        f"or set {FILE_LIMIT_ENV})"
                    )
                sink(data)
        finally:
            gen.close()  # stopped early: the command is killed
        stderr = decode(err.value())
        _raise_held(outcome, stderr, target, "download", deadline)
        files.raise_for_folder(outcome.exit_code, target, "download", stderr)

    def download(
        self,
        src: str,
        local: str | Path,
        *,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Copy folder `src`'s content into a local folder as one tar stream, refusing any
        entry that would land outside it (SandboxUnsafeArchive); returns the names copied.
        Past `limit` bytes of archive (default: the file read limit) raises
        OutputLimitExceeded and writes nothing; past `timeout` seconds (default:
        ORCHESTRATOR_FILE_TIMEOUT) SandboxFileTimeout, writing nothing. The archive is
        unpacked as it arrives, into a private folder inside `local` that is moved into
        place only once every entry has passed and the sandbox's side succeeded."""
        target, deadline = self._path(src), _deadline(timeout)
        cmd = self._command(files.download_argv(target), None, None, None, user, deadline)
        err, ended = TailBuffer(64 * 1024), []

        def archive() -> Generator[bytes, None, None]:
            gen = self._run_bulk(cmd)
            try:
                while True:
                    kind, data = next(gen)
                    if kind == "stdout":
                        yield data
                    else:
                        err.add(data)
            except StopIteration as stop:
                ended.append(stop.value)
            finally:
                gen.close()  # stopped early (refused, over the limit): the command is killed

        stream = archive()
        try:
            staged = files.stage(stream, Path(local), limit or default_file_limit())
        except OrchestratorError as exc:  # a cut archive: the deadline may be why
            if ended:
                _raise_held(ended[0], decode(err.value()), target, "download", deadline, exc)
            raise
        finally:
            stream.close()
        outcome: Outcome = ended[0]
        if outcome.exit_code != 0 or outcome.timed_out:
            staged.discard()
            stderr = decode(err.value())
            _raise_held(outcome, stderr, target, "download", deadline)
            files.raise_for_folder(outcome.exit_code, target, "download", stderr)
        return staged.commit()


_USER = re.compile(USER_RE)


def _validated(cmd: Command) -> Command:
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


def _deadline(timeout: float | None) -> float:
    """A file call's deadline: the caller's, else ORCHESTRATOR_FILE_TIMEOUT."""
    return FILE_TIMEOUT.get() if timeout is None else timeout


# What a shell says when it cannot start a process (busybox ash, dash, bash), and what the
# engine's runtime says when `docker exec` itself cannot start a thread in the container (the
# plain path): our helper could not run, which is the sandbox failing, not the file being
# missing or locked (Go's abort exits 2, the helper's "not found")
_NO_FORK = re.compile(
    r"^(?:[^:\n]+: )*(?:\d+: )?(?:can't fork|cannot fork|fork: (?:retry: )?"
    r"(?:resource temporarily unavailable|cannot allocate memory)"
    r"|pthread_create failed: resource temporarily unavailable)",
    re.IGNORECASE | re.MULTILINE,
)


def _raise_held(
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
            f"cannot {verb} {target}: the sandbox cannot start a process ({found.group(0)}): "
            "its pids or memory limit is reached; the file was not touched"
        ) from cause


def _check(result: RuntimeResult, timeout: float | None) -> None:
    if result.timed_out:
        raise CommandTimeout(result, timeout or 0.0)
    if result.exit_code != 0:
        raise CommandFailed(result)


ERR_LIMIT = 64 * 1024
"""Bytes of a file helper's stderr kept for its error message."""


def _written(err: TailBuffer, outcome: Outcome, target: str, deadline: float) -> None:
    """Raise what a write_file's command says went wrong, if anything."""
    stderr = decode(err.value())
    _raise_held(outcome, stderr, target, "write", deadline)
    files.raise_for(outcome.exit_code, target, "write", stderr)


@dataclasses.dataclass(frozen=True)
class _Read:
    """One read_file: its command, and how its output becomes the content or an error."""

    cmd: Command
    target: str
    deadline: float
    limit: int

    def result(self, out: TailBuffer, err: TailBuffer, outcome: Outcome, text: bool) -> str | bytes:
        data, stderr = out.value(), decode(err.value())
        _raise_held(outcome, stderr, self.target, "read", self.deadline)
        snippet = decode(data[:32]).strip()
        files.raise_for(outcome.exit_code, self.target, "read", stderr, self.limit, snippet)
        return decode(data) if text else data


class _Events:
    """A command's output as stream events: text as it decodes, both streams' tails kept,
    and at the end the "finished" event with the result."""

    def __init__(self, sandbox: Sandbox, limit: int) -> None:
        self._sandbox = sandbox
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
        result = self._sandbox._result(self._bufs["stdout"], self._bufs["stderr"], outcome)
        return [*events, StreamEvent("finished", result=result)]
