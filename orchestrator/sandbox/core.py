"""What every place commands run provides, and the calls written once over it.

A place (the main sandbox, or one service of it) provides `_run` (and `_arun` for asyncio
callers, `_run_bulk` for archives), `workdir`, `static_path` and `connection`. Each call on
it is described once (`execute_call`, `stream_call`, `write_file_call`, `read_file_call`:
the command, its checks and how its output becomes the answer, sandbox/call.py) and driven
by either door: `perform`/`events` block, `aperform`/`aevents` await (orchestrator.aio).
`Sandbox` (sandbox/calls.py) adds folder transfers; `Runtime` the lifecycle.

`{{static:NAME}}` placeholders are resolved in the environment file's own commands (setup,
`commands`), never in the text a caller passes to `execute`: that text may be model-written,
and runs exactly as given (use `static_path(NAME)` to build a path).
"""

from __future__ import annotations

import contextlib
import dataclasses
import posixpath
import secrets
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import Any, Literal, TypeVar, cast, overload

from orchestrator import procutil
from orchestrator.errors import ExecutorLost, NoTerminal, UsageError
from orchestrator.sandbox import files
from orchestrator.sandbox.call import (
    ERR_LIMIT,
    Call,
    Events,
    Read,
    Streamed,
    blocking,
    checked,
    file_deadline,
    streaming,
    validated,
    written,
)
from orchestrator.sandbox.live import Control, LiveInput
from orchestrator.sandbox.options import (
    AChunks,
    Chunks,
    Command,
    default_file_limit,
    output_limit_of,
)
from orchestrator.sandbox.process import KEPT_ID, Process, terminal_size
from orchestrator.sandbox.results import (
    Connection,
    Outcome,
    RuntimeResult,
    StreamEvent,
    TailBuffer,
    decode,
)
from orchestrator.sandbox.threads import thread_chunks
from orchestrator.sandbox.usage import Tally
from orchestrator.spec.resolve import resolve_user

T = TypeVar("T")


class SandboxCore(ABC):
    """Commands and single files in one place, written once over `_run` (see the module)."""

    @abstractmethod
    def _run(self, cmd: Command) -> Chunks:
        """Run one command: yield (stream, bytes), return its Outcome. Closing the generator
        early must kill the command's whole tree."""

    def _run_kept(self, cmd: Command) -> Chunks:
        """Run the kept process `cmd.keep` (or, with `cmd.attach`, read it again from
        there): as `_run`, but it outlives its caller (closing the generator early leaves
        it running). Where `_check_keeps` passes."""
        raise UsageError(f"{type(self).__name__} keeps no process")

    def _check_keeps(self) -> None:
        """UsageError, before anything runs, where processes cannot outlive their caller."""
        raise UsageError(
            "a kept process (keep=True, process(id)) needs a detached Docker environment's "
            "endpoint: this backend keeps no process beyond its caller"
        )

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

    def _gives_terminal(self) -> bool:
        """Whether `start(tty=True)` can run here (not where commands go by plain `docker
        exec`): asked by `start`, which refuses one (NoTerminal) before anything runs; it
        may start the sandbox's executor to know."""
        return True

    # ----- a command, checked ----------------------------------------------------------------
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
        return validated(
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

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, str(path)))

    @property
    def tally(self) -> Tally:
        """The commands run here through this object, and their total time (`usage()`)."""
        found = self.__dict__.get("_tally")
        if found is None:  # (setdefault: one Tally, whichever thread asks first)
            found = self.__dict__.setdefault("_tally", Tally())
        return cast(Tally, found)

    def _result(self, out: TailBuffer, err: TailBuffer, outcome: Outcome) -> RuntimeResult:
        self.tally.add(outcome.elapsed)
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

    # ----- running one: the blocking door's transport and the awaited one's ------------------
    def _run_bulk(self, cmd: Command) -> Chunks:
        """A command printing a folder's archive, or reading one (its stdin a
        hostpack.PackStream): where a backend has a cheaper path for many bytes than for many
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

    def perform(self, call: Call[T]) -> T:
        """Run a described call (`execute_call`, ...) and give its answer: the blocking door."""
        return call.answer(*self._collect(call.cmd, call.limit, bulk=call.bulk))

    async def aperform(self, call: Call[T]) -> T:
        """`perform`, awaited: the command runs through `_arun` (the executor's own channel
        where the backend has one, else a thread of its own); cancelling kills it."""
        return call.answer(*await self._acollect(call.cmd, call.limit))

    def events(self, call: Streamed) -> Generator[StreamEvent, None, None]:
        """A described stream's events as they come; closing the generator kills it."""
        self._check_usable()  # again where it is iterated (another process, after a pause)
        events = Events(call.limit, self._result)
        gen = self._run(call.cmd)
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

    async def aevents(self, call: Streamed) -> AsyncGenerator[StreamEvent, None]:
        """`events`, awaited (`async for`); leaving early or cancelling kills the command."""
        self._check_usable()  # again where it is iterated (another process, a pause)
        events = Events(call.limit, self._result)
        async with contextlib.aclosing(self._arun(call.cmd)) as run:
            async for item in run:
                if isinstance(item, Outcome):
                    for last in events.finish(item):
                        yield last
                    return
                event = events.add(*item)
                if event is not None:
                    yield event

    # ----- the calls, each described once ----------------------------------------------------
    def execute_call(
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
    ) -> Call[RuntimeResult]:
        """Run a command to completion. A str runs through /bin/sh -c; a list runs as argv.
        `cwd` is relative to the workdir; `user` is "uid[:gid]", "root" or "host". `check`:
        raise CommandFailed (CommandTimeout) unless it exits 0 in time."""
        cmd = self._command(command, env, stdin, cwd, user, timeout)

        def answer(out: TailBuffer, err: TailBuffer, outcome: Outcome) -> RuntimeResult:
            result = self._result(out, err, outcome)
            return checked(result, timeout) if check else result

        return Call(cmd, output_limit_of(output_limit), answer)

    def stream_call(
        self,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        stdin: None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> Streamed:
        """Yield output as it arrives, then a "finished" event carrying the result. Closing
        the generator (or breaking out of a `for` over it) kills the command. Bad arguments
        raise at the call, before anything runs."""
        if stdin is not None:
            raise UsageError("stream() takes no stdin; use execute(..., stdin=...)")
        cmd = self._command(command, env, None, cwd, user, timeout)
        return Streamed(cmd, output_limit_of(output_limit))

    def write_file_call(
        self,
        path: str,
        content: str | bytes,
        *,
        user: str | None = None,
        timeout: float | None = None,
    ) -> Call[None]:
        """Write text or bytes (line endings kept as given), creating parent folders. Raises
        SandboxPermissionError for a path that is no regular file (a FIFO, device or socket:
        never opened), SandboxFileTimeout past `timeout` seconds (default:
        ORCHESTRATOR_FILE_TIMEOUT)."""
        data = content.encode() if isinstance(content, str) else bytes(content)
        target, deadline = self._path(path), file_deadline(timeout)
        cmd = self._command(files.write_argv(target), None, data, None, user, deadline)
        return Call(cmd, ERR_LIMIT, written(target, deadline))

    @overload
    def read_file_call(
        self,
        path: str,
        *,
        text: Literal[True] = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Call[str]: ...
    @overload
    def read_file_call(
        self,
        path: str,
        *,
        text: Literal[False],
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Call[bytes]: ...
    @overload
    def read_file_call(
        self,
        path: str,
        *,
        text: bool,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Call[str | bytes]: ...
    def read_file_call(
        self,
        path: str,
        *,
        text: bool = True,
        user: str | None = None,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Call[str] | Call[bytes] | Call[str | bytes]:
        """Return a file's content as text (UTF-8, invalid bytes replaced) or bytes. Raises
        SandboxFileNotFound, SandboxIsADirectory, SandboxPermissionError (also the built-in
        errors; also for a path that is no regular file: a FIFO, device or socket is never
        read), OutputLimitExceeded past `limit` bytes, or SandboxFileTimeout past `timeout`
        seconds (default: ORCHESTRATOR_FILE_TIMEOUT)."""
        limit = limit or default_file_limit()
        target, deadline = self._path(path), file_deadline(timeout)
        cmd = self._command(files.read_argv(target, limit), None, None, None, user, deadline)
        return Call(cmd, limit + 1, Read(target, deadline, limit, text))

    def start(
        self,
        command: str | Sequence[str],
        *,
        stdin: bool = True,
        tty: bool = False,
        cols: int = 80,
        rows: int = 24,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
        keep: bool = False,
    ) -> Process:
        """Start a command and return at once with its `Process` (sandbox/process.py): write
        its stdin as it runs (`stdin=False`: it reads end of file at once), read its output
        as it comes, signal or kill it, `wait()` for the result `execute` would give.
        `tty`: on a terminal of its own, `cols` x `rows` (`resize` changes it), its output
        one stream (stdout) with the terminal's echo, as `docker exec -t` gives it; where
        commands go by plain `docker exec` (no python3 in the image) a terminal is refused
        (NoTerminal, a UsageError). `timeout` kills its whole tree, counted from its start.
        `keep`: it outlives this Process and this process (a detached Docker environment
        only: UsageError elsewhere); `process(id)` reads it again, from any process of its
        owner. Bad arguments raise here, before anything runs."""
        cmd = self._command(command, env, None, cwd, user, timeout)
        size = terminal_size(cols, rows) if tty else None
        if tty and not self._gives_terminal():
            raise NoTerminal()
        live = LiveInput(end=procutil.VEOF if tty else b"") if stdin or tty else None
        if live is not None and not stdin:
            live.close()  # a terminal reads the end of its input at once, as a pipe would
        cmd = dataclasses.replace(cmd, stdin=live, tty=size, control=Control())
        events = Events(output_limit_of(output_limit), self._result)
        if not keep:
            return Process(self._run, cmd, events, self._check_usable, writable=stdin)
        self._check_keeps()
        cmd = dataclasses.replace(cmd, keep=secrets.token_hex(16))
        return Process(self._run_kept, cmd, events, self._check_usable, writable=stdin)

    def process(self, ident: str, *, cursor: int = 0, output_limit: int | None = None) -> Process:
        """A kept process (`start(..., keep=True)`) again, from this or any other process
        of the environment's owner, even after its starter died: its output from `cursor`
        on (its `Process.cursor` where a reader left off; 0: the oldest its bounded
        scrollback holds, what was dropped counted in `cursor`), its input, signals, kill
        and result. ProcessNotFound (at the first read) for an id it does not know: an id is
        known once its start reached the sandbox (as soon as it printed anything)."""
        if not isinstance(ident, str) or not KEPT_ID.fullmatch(ident):
            raise UsageError(f"not a kept process's id: {ident!r} (Process.id gives one)")
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise UsageError(f"cursor must be a whole number from 0, not {cursor!r}")
        self._check_keeps()
        cmd = Command(["(kept)"], {}, self.workdir, None, None, LiveInput(), control=Control())
        cmd = dataclasses.replace(cmd, keep=ident, attach=cursor)
        events = Events(output_limit_of(output_limit), self._result)
        return Process(self._run_kept, cmd, events, self._check_usable)

    # ----- the blocking door of each ---------------------------------------------------------
    execute = blocking(execute_call)
    stream = streaming(stream_call)
    write_file = blocking(write_file_call)
    read_file = blocking(read_file_call)
