"""Inspect's `exec_remote`, natively on the process API (`AsyncSandbox.start`): the command
starts at once (no tool injected into the sandbox, no polling), its output comes as it is
written, its stdin is written as it runs (`stdin_open`), `kill()` ends its whole tree, and a
cancelled caller kills it before the cancellation goes on, as Inspect's contract says. The
awaitable mode (`stream=False`) keeps the last `SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE`
bytes of each stream and kills the command at its `timeout` (TimeoutError).

On Inspect's trio backend the provider leaves `exec_remote` to Inspect's own path."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from inspect_ai.util import (
    ExecResult,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox.exec_remote import (
    ExecCompleted,
    ExecOutput,
    ExecRemoteAwaitableOptions,
    ExecRemoteCommonOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
    ExecStderr,
    ExecStdout,
)

from orchestrator.errors import ProcessEnded, SandboxUnavailable, UsageError

if TYPE_CHECKING:
    from orchestrator.aio import AsyncProcess, AsyncSandbox


@contextlib.contextmanager
def inspect_errors(user: str | None) -> Iterator[None]:
    """Ours as Inspect's: a sandbox gone is SandboxUnavailableError, a user this sandbox
    cannot run commands as (`user`, asked) SandboxUserUnsupportedError."""
    try:
        yield
    except SandboxUnavailable as exc:
        raise SandboxUnavailableError(str(exc)) from exc
    except UsageError as exc:
        if user is not None and "user" in str(exc):
            raise SandboxUserUnsupportedError(str(exc)) from exc
        raise


class NativeProcess(ExecRemoteProcess):
    """`exec_remote`'s handle over one of our started processes (see the module). It keeps
    the base class's name and calls, not its transport (none is made)."""

    def __init__(self, proc: AsyncProcess, stdin_open: bool) -> None:  # (no RPC transport)
        self._proc = proc
        self._stdin_open = stdin_open
        self._iteration_started = False
        self._completed = False
        self._killed = False

    @property
    def pid(self) -> int:
        """Not known here (the process runs in the sandbox, started by its executor): -1."""
        return -1

    def __aiter__(self) -> NativeProcess:
        if self._iteration_started:
            raise RuntimeError("ExecRemoteProcess can only be iterated once")
        self._iteration_started = True
        return self

    async def __anext__(self) -> ExecOutput:
        while not self._completed:  # (after a kill: what it printed before, then the end)
            try:
                event = await self._proc.read()
            except asyncio.CancelledError:  # nothing of it may outlive its caller
                await asyncio.shield(self.kill())
                raise
            except SandboxUnavailable as exc:  # the sandbox went away under it
                raise SandboxUnavailableError(str(exc)) from exc
            assert event is not None
            if event.kind == "finished":
                assert event.result is not None
                self._completed = True
                if self._killed:
                    break
                return ExecCompleted(exit_code=event.result.exit_code)
            if event.text:
                return (ExecStdout if event.kind == "stdout" else ExecStderr)(data=event.text)
        raise StopAsyncIteration

    def _writable(self, verb: str) -> bool:
        if not self._stdin_open:
            raise RuntimeError(f"{verb}() requires stdin_open=True in ExecRemoteStreamingOptions")
        return not (self._completed or self._killed or self._proc.ended)

    async def write_stdin(self, data: str | bytes) -> None:
        if not self._writable("write_stdin"):
            raise RuntimeError("Cannot write to stdin: process has terminated")
        try:
            await self._proc.write(data)
        except ProcessEnded as exc:  # ended (or its stdin closed) meanwhile: Inspect's error
            raise RuntimeError(f"Cannot write to stdin: {exc}") from exc

    async def close_stdin(self) -> None:
        if self._writable("close_stdin"):
            await self._proc.close_stdin()

    async def kill(self) -> None:
        """Kill its whole tree; its iteration then ends without a completion (as Inspect's)."""
        if self._completed or self._killed:
            return
        self._killed = True
        await self._proc.kill()


async def start(
    sandbox: AsyncSandbox,
    cmd: list[str],
    options: ExecRemoteCommonOptions,
    env: dict[str, str] | None,
    timeout: float | None = None,
) -> tuple[AsyncProcess, bool]:
    """The command started (and its `input` written) as `options` say, and whether its
    stdin stays open for the caller."""
    stdin_open = isinstance(options, ExecRemoteStreamingOptions) and options.stdin_open
    proc = await sandbox.start(
        cmd,
        stdin=True,
        cwd=options.cwd,
        env=env,
        user=options.user,
        timeout=timeout,
        output_limit=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
    )
    try:
        if options.input:
            await proc.write(options.input)
        if not stdin_open:
            await proc.close_stdin()
    except BaseException:  # cancelled (or failed) before its caller holds it: nobody would
        await asyncio.shield(proc.kill())
        raise
    return proc, stdin_open


async def streaming(
    sandbox: AsyncSandbox,
    cmd: list[str],
    options: ExecRemoteCommonOptions,
    env: dict[str, str] | None,
) -> NativeProcess:
    proc, stdin_open = await start(sandbox, cmd, options, env)
    return NativeProcess(proc, stdin_open)


async def awaitable(
    sandbox: AsyncSandbox,
    cmd: list[str],
    options: ExecRemoteCommonOptions,
    env: dict[str, str] | None,
) -> ExecResult[str]:
    """Run to its end: its result, or TimeoutError past `timeout` (its tree killed). A
    cancelled caller kills it first."""
    timeout = options.timeout if isinstance(options, ExecRemoteAwaitableOptions) else None
    proc, _ = await start(sandbox, cmd, options, env, timeout)
    try:
        result = await proc.wait()
    except asyncio.CancelledError:
        await asyncio.shield(proc.kill())
        raise
    if result.timed_out:
        raise TimeoutError(f"command timed out after {timeout} seconds: {cmd[0]}")
    return ExecResult(result.ok, result.exit_code, result.stdout, result.stderr)
