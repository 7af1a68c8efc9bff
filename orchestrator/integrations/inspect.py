"""The Inspect AI sandbox provider: `sandbox=("orchestrator", "env.yaml")` in a task runs each
sample in an environment of ours (install `orchestrator[inspect]`; Inspect finds the provider
through the `inspect_ai` entry point).

One environment per sample: its main sandbox is "default" (first), and every extra service is
a sandbox by its own name. The file may be a Compose file (or a Dockerfile), as Inspect's docker
sandbox takes it: its default service (`x-default: true`, or named `default`) comes first under
its own name, and the sample's metadata is interpolated into it (`${SAMPLE_METADATA_KEY}`).
Calls follow Inspect's contract to the letter: its output and file
limits (`SandboxEnvironmentLimits`), `TimeoutError`, `PermissionError`, `FileNotFoundError`,
`IsADirectoryError`, `UnicodeDecodeError` for text that is not UTF-8,
`OutputLimitExceededError`, and `SandboxUnavailableError` when the sandbox itself is gone.

Commands, files and `exec_remote` (integrations/inspect_remote.py) go through
`orchestrator.aio`, awaited on Inspect's event loop: no call waits on a thread limiter, and a
sample cancelled while its command runs kills it in the sandbox. Engine work (starting and
removing environments) runs in threads of our own; under trio, every call in anyio's.

The config is the environment file's path, or `OrchestratorSandboxConfig(file=...,
prewarm=N)`: N environments are started in `task_init` and kept ready (a warm pool), so a
sample starts on one already up. Every sample still gets an environment of its own, never
used before and removed after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar, Union, overload

import anyio.to_thread
import sniffio
from inspect_ai.tool import Tool, ToolResult, tool
from inspect_ai.tool._tool import ToolParsingError
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    sandbox,
    sandboxenv,
    tool_state_instance,
)
from inspect_ai.util._sandbox.exec_remote import (
    ExecRemoteAwaitableOptions,
    ExecRemoteCommonOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
)
from pydantic import BaseModel

from orchestrator import (
    Pool,
    Usage,
    aio,
    attach,
    prepare,
    spawn_runtime,
)
from orchestrator.aio import AsyncPool, AsyncRuntime, AsyncSandbox
from orchestrator.errors import (
    NoTerminal,
    OrchestratorError,
    OutputLimitExceeded,
    PoolExhausted,
    ProjectNotFound,
    UsageError,
)
from orchestrator.integrations import inspect_config, inspect_remote, inspect_session
from orchestrator.integrations.inspect_config import OrchestratorSandboxConfig, metadata_env
from orchestrator.spec.resolve import MAIN

PROVIDER = "orchestrator"
USAGE_SOURCE = "orchestrator usage"
"""The `source` of the info event holding a sample's usage in its transcript."""
log = logging.getLogger("orchestrator.integrations.inspect")
T = TypeVar("T")
_NOT_RUNNABLE = re.compile(r"permission denied|not executable", re.IGNORECASE)


def _on_asyncio() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


async def _call(fn: Callable[[], T], native: Callable[[], Awaitable[T]] | None = None) -> T:
    """One of our calls; our errors become Inspect's. On asyncio: `native()` awaited, else
    `fn` in a thread of our own (no limiter). On trio: `fn` in anyio's worker threads."""
    with inspect_remote.inspect_errors(None):
        if not _on_asyncio():
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=False)
        if native is not None:
            return await native()
        return await aio.in_thread(fn)


def _quietly(fn: Callable[[], None]) -> Callable[[], None]:
    """For a background removal: an engine error is logged, the guardian and `orchestrator
    cleanup` remove what it could not."""

    def run() -> None:
        try:
            fn()
        except OrchestratorError as exc:
            log.warning("removing a sample's environment failed: %s", exc)

    return run


async def _log_usage(runtime: AsyncRuntime) -> None:
    """The environment's usage (`rt.usage()`, read in a thread: it may read the gateway's
    log) into the sample's transcript, as an info event the log viewer shows, read as the
    sample ends: before its removal, which runs in the background."""
    from inspect_ai.log import transcript

    def read() -> Usage | None:
        try:
            return runtime.sync.usage()
        except OrchestratorError as exc:
            log.warning("reading a sample's usage failed: %s", exc)
            return None

    got = await _call(read)
    if got is not None:
        transcript().info(dataclasses.asdict(got), source=USAGE_SOURCE)


@sandboxenv(name=PROVIDER)
class OrchestratorSandbox(SandboxEnvironment):
    """One sandbox (the main one or a service) of one sample's environment."""

    _live: dict[str, AsyncRuntime] = {}
    """Environments of samples not cleaned up yet, by id (for task_cleanup)."""
    _live_lock = threading.Lock()
    _forks: dict[AsyncRuntime, list[AsyncRuntime]] = {}
    """Copies made by `fork_sandboxes`, by the sample's environment they were made from:
    removed with it."""
    _removing: list[threading.Thread] = []
    """Background removals of finished samples (task_cleanup waits for them)."""
    _pools: dict[SandboxEnvironmentConfigType | None, AsyncPool] = {}
    """Warm pools, by config (see OrchestratorSandboxConfig). Not by task: Inspect calls
    task_init and task_cleanup once per config for the whole eval (as tasks "startup" and
    "shutdown"), and sample_init with each task's own name."""

    def __init__(
        self,
        runtime: AsyncRuntime,
        service: str,
        variables: dict[str, str] | None = None,
        pool: AsyncPool | None = None,
    ) -> None:
        super().__init__()
        self.runtime = runtime
        self.service = service
        self.sandbox: AsyncSandbox = runtime if service == MAIN else runtime.service(service)
        self.variables = variables or {}
        """The sample's metadata, given to every command (a prewarmed environment started
        before the sample was known)."""
        self.pool = pool
        self.shells: dict[str | None, inspect_session.Shell] = {}
        """The `bash_session` tool's shells in this sandbox, by instance."""
        self.shell_locks: dict[str | None, asyncio.Lock] = {}
        self.shells_closed = False
        self.terminal = True
        """Whether its commands can have a terminal (False once one was refused)."""

    # ----- lifecycle -------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return OrchestratorSandboxConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        """Samples at once: two per core (each sandbox mostly waits on its commands)."""
        return max(2, 2 * (os.cpu_count() or 1))

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Validate the file (and its policy) once, and build its images once, before any
        sample starts; with `prewarm`, start that many environments."""
        env = inspect_config.environment(config)
        await _call(lambda: prepare(env))
        size, total = inspect_config.prewarm(config)
        if size and any(v.startswith("SAMPLE_METADATA_") for v in env.variables):
            raise UsageError(
                f"{env.source}: prewarm starts environments before any sample exists, and this "
                "Compose file interpolates SAMPLE_METADATA_* into them; drop prewarm, or read "
                "the metadata from the commands' environment instead"
            )
        if size and config not in cls._pools:
            pool = await _call(lambda: AsyncPool(Pool(env, min(size, total or size), total=total)))
            cls._pools[config] = pool

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        variables = metadata_env(metadata)
        env = inspect_config.environment(config, variables)
        pool = cls._pools.get(config)
        runtime = None
        if pool is not None:
            warm = pool
            try:
                runtime = await _call(lambda: AsyncRuntime(warm.sync.acquire()), warm.acquire)
            except PoolExhausted:  # past the samples it was told of: a start of its own
                pool = None
        if runtime is None:
            runtime = await _call(
                lambda: AsyncRuntime(spawn_runtime(env, env_vars=variables)),
                lambda: aio.spawn(env, env_vars=variables),
            )
        with cls._live_lock:
            cls._live[runtime.info().id] = runtime
        names = [MAIN, *env.spec.services]  # the main sandbox first, as Inspect wants
        given = variables if pool is not None else None
        main = env.compose_main or "default"  # a Compose file's: its default service's name
        return {main if n == MAIN else n: cls(runtime, n, given, pool) for n in names}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        """Remove the sample's environment, in the background: the next sample need not wait
        for it (task_cleanup does, and the guardian removes it if this process dies first).
        An interrupted sample's is left to task_cleanup, as Inspect's own Docker sandbox
        does."""
        for box in environments.values():
            if isinstance(box, cls):
                await inspect_session.close_shells(box)
        if interrupted:
            return
        done = {e.runtime: e.pool for e in environments.values() if isinstance(e, cls)}
        with cls._live_lock:
            for runtime in list(done):
                done.update(dict.fromkeys(cls._forks.pop(runtime, []), None))  # its copies too
        for runtime, pool in done.items():
            await _log_usage(runtime)
            with cls._live_lock:
                for ident in [i for i, r in cls._live.items() if r is runtime]:
                    del cls._live[ident]
            remove = runtime.sync.cleanup
            if pool is not None:
                remove = functools.partial(pool.sync.release, runtime.sync)
            remover = threading.Thread(target=_quietly(remove), name="orch-cleanup")
            remover.start()
            with cls._live_lock:
                cls._removing.append(remover)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        """With cleanup, remove what is left; without (--no-sandbox-cleanup), keep every
        environment running past this process and say how to remove each. A warm pool's
        waiting environments are removed either way (no sample ever ran in them)."""
        with cls._live_lock:
            left, cls._live = dict(cls._live), {}
            cls._forks = {}  # (each copy is in _live)
            removing, cls._removing = cls._removing, []
        pool = cls._pools.pop(config, None)
        if pool is not None:
            await _call(pool.sync.close)
        for remover in removing:
            await _call(remover.join)
        for ident, runtime in left.items():
            if cleanup:
                await _call(runtime.sync.cleanup)
                continue
            try:
                await _call(runtime.sync.keep)
            except UsageError as exc:  # a backend that cannot outlive us (local)
                await _call(runtime.sync.cleanup)
                print(f"removed sandbox {ident}: {exc}")
                continue
            print(f"kept sandbox {ident}: remove it with `orchestrator down {ident}`")

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup orchestrator [ID]`: that environment, or every one of ours
        whose owner is gone (kept ones included)."""
        if id is None:
            from orchestrator import reap

            for name in await _call(lambda: reap(include_kept=True)):
                print(f"removed {name}")
            return
        try:
            runtime = await _call(lambda: attach(id))
        except ProjectNotFound as exc:
            print(f"error: {exc}")
            return
        name = runtime.info().id
        await _call(runtime.cleanup)
        print(f"removed {name}")

    # ----- calls -----------------------------------------------------------------------------
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        variables = {**self.variables, **env} if self.variables and env else self.variables or env
        options: dict[str, Any] = dict(
            stdin=input, cwd=cwd, env=variables, user=user, timeout=timeout, output_limit=limit
        )
        with inspect_remote.inspect_errors(user):
            result = await _call(
                lambda: self.sandbox.sync.execute(cmd, **options),
                lambda: self.sandbox.execute(cmd, **options),
            )
        if result.timed_out:
            raise TimeoutError(f"command timed out after {timeout} seconds: {cmd[0]}")
        if result.truncated:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                result.stdout if result.stdout_truncated else result.stderr,
            )
        if result.exit_code == 126 and _NOT_RUNNABLE.search(result.stderr):
            raise PermissionError(result.stderr.strip())
        return ExecResult(result.ok, result.exit_code, result.stdout, result.stderr)

    @overload
    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteStreamingOptions | None = None,
        *,
        stream: Literal[True] = True,
    ) -> ExecRemoteProcess: ...

    @overload
    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteAwaitableOptions | None = None,
        *,
        stream: Literal[False],
    ) -> ExecResult[str]: ...

    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteStreamingOptions | ExecRemoteAwaitableOptions | None = None,
        *,
        stream: bool = True,
    ) -> ExecRemoteProcess | ExecResult[str]:
        """Natively on our process API (integrations/inspect_remote.py); on trio, Inspect's
        own path."""
        if not _on_asyncio():
            return await super().exec_remote(cmd, options, stream=stream)  # type: ignore[call-overload, no-any-return]
        opts = options or ExecRemoteCommonOptions()
        env = {**self.variables, **(opts.env or {})} or None
        with inspect_remote.inspect_errors(opts.user):
            if stream:
                return await inspect_remote.streaming(self.sandbox, cmd, opts, env)
            return await inspect_remote.awaitable(self.sandbox, cmd, opts, env)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        deadline = inspect_config.file_deadline()
        await _call(
            lambda: self.sandbox.sync.write_file(file, contents, timeout=deadline),
            lambda: self.sandbox.write_file(file, contents, timeout=deadline),
        )

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:  # noqa: UP007
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        try:
            deadline = inspect_config.file_deadline()
            data = await _call(
                lambda: self.sandbox.sync.read_file(
                    file, text=False, limit=limit, timeout=deadline
                ),
                lambda: self.sandbox.read_file(file, text=False, limit=limit, timeout=deadline),
            )
        except OutputLimitExceeded as exc:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None
            ) from exc
        return data.decode("utf-8") if text else data  # strict: Inspect's UnicodeDecodeError

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        if self.runtime.closed:
            raise ConnectionError(f"the sandbox {self.service!r} is not running")
        info = self.runtime.info()
        connection = self.sandbox.connection(user=user)
        return SandboxConnection(
            type=PROVIDER,
            command=str(connection),
            ports=inspect_config.ports(info.ports, self.service) or None,
            container=connection.container,
        )


async def fork_sandboxes(
    n: int = 1, *, memory: bool | None = None, name: str | None = None
) -> list[dict[str, SandboxEnvironment]]:
    """`n` copies of the current sample's environment, as it is now (`Runtime.fork`: its
    files, and its running processes and memory where it can: docs/fork.md), each named as
    Inspect names a sample's sandboxes (the main one first, then each service). They are
    removed with the sample (at the task's end if it was interrupted; by the guardian if
    this process dies). `name`: which of the sample's sandboxes says which environment
    (any: they share one). TypeError when the sample's sandboxes are not ours."""
    found = sandbox(name)
    try:
        ours = found.as_type(OrchestratorSandbox)
    except TypeError:
        raise TypeError(
            f"fork_sandboxes forks an orchestrator sandbox; the sample's is {type(found).__name__}"
        ) from None
    runtime = ours.runtime
    copies = await runtime.fork(n, memory=memory)
    cls = OrchestratorSandbox
    with cls._live_lock:
        for copy in copies:
            cls._live[copy.info().id] = copy
        cls._forks.setdefault(runtime, []).extend(copies)
    env = runtime.sync.env
    main = env.compose_main or "default"
    names = [MAIN, *env.spec.services]
    return [
        {main if n == MAIN else n: cls(copy, n, ours.variables) for n in names} for copy in copies
    ]


def _ours(found: SandboxEnvironment) -> OrchestratorSandbox | None:
    """The sample's sandbox as one of ours, where the tool runs natively (asyncio only)."""
    if not _on_asyncio():
        return None
    try:
        return found.as_type(OrchestratorSandbox)
    except TypeError:
        return None


@tool(name="bash_session")
def bash_session(
    *,
    timeout: int | None = None,
    wait_for_output: int | None = None,
    user: str | None = None,
    instance: str | None = None,
) -> Tool:
    """Inspect's `bash_session` tool (the same arguments and defaults), run natively on an
    orchestrator sandbox (integrations/inspect_session.py); on any other sandbox, or one
    that cannot give its commands a terminal (no python3 in the image), Inspect's own.

    Args:
      timeout: Seconds a call may take in all (default: `wait_for_output` + 180).
      wait_for_output: Seconds a call waits for the first output (default 30).
      user: The user the shell runs as (default: the sandbox's).
      instance: Which shell (each instance has its own); default: the current
          `tool_state_scope()`, if any.
    """
    wait = wait_for_output or inspect_session.WAIT_FOR_OUTPUT
    if timeout is None:
        timeout = wait + inspect_session.TRANSPORT
    elif timeout < wait + inspect_session.TRANSPORT:
        least = wait + inspect_session.TRANSPORT
        raise ValueError(f"Timeout must be at least {least} seconds, but got {timeout}.")
    fallback: list[Tool] = []

    async def execute(action: inspect_session.Action, input: str | None = None) -> ToolResult:
        r"""
        Interact with a bash shell.

        Sends text to a long-running bash shell and returns what it printed since the last
        call. A call may not return all of a command's output: call again (action "read")
        for more.

        USAGE NOTES:
        - Submit a new command when the shell is at its prompt (output ending in "$ " or
          "# ").
        - Send control characters as Unicode escapes ("\u0003" is Ctrl+C, "\u0004"
          Ctrl+D); the words "Ctrl+C" are typed as they are.
        - "read" returns new output without typing anything: use it while a long command
          runs.
        - Input typed while a command runs waits until it ends; "interrupt" (Ctrl+C)
          stops it.
        - Output ending in "> " is the shell's continuation prompt: the input left a quote
          or bracket open. Finish it, or "interrupt" and type it again.

        Examples:
        - bash_session(action="type_submit", input="echo foo") -> "foo\nuser@host:/# "
        - bash_session(action="type_submit", input="tail -f /tmp/foo.log") -> output;
          bash_session(action="read") -> more output;
          bash_session(action="interrupt") -> "^Cuser@host:/# "
        - bash_session(action="type_submit", input="ssh fred@foo.com") -> "password: ";
          bash_session(action="type_submit", input="secret") -> "fred@foo.com:~$ "

        Args:
          action: What to do:
                - "type": type the input, without pressing return
                - "type_submit": type the input and press return
                - "read": return new output, typing nothing
                - "interrupt": type Ctrl+C to stop what runs
                - "restart": start a new shell in place of this one
          input: The text to type. Needed for "type", optional for "type_submit", not
                given for "restart", "read" or "interrupt".

        Returns:
          The shell's output since the last call.
        """
        if action == "type" and input is None:
            raise ToolParsingError(f"'input' is required for '{action}' action.")
        if action in ("restart", "read", "interrupt") and input is not None:
            raise ToolParsingError(f"Do not provide 'input' with '{action}' action.")
        box = _ours(sandbox())
        if box is not None and box.terminal:
            try:
                with inspect_remote.inspect_errors(user):
                    return await inspect_session.interact(
                        box,
                        action,
                        input,
                        instance=tool_state_instance(instance),
                        user=user,
                        wait_for_output=wait,
                        timeout=timeout,
                    )
            except NoTerminal:  # (no python3 there: Inspect's own tool, from now on)
                box.terminal = False
        if not fallback:
            from inspect_ai.tool import bash_session as inspect_bash_session

            fallback.append(
                inspect_bash_session(
                    timeout=timeout, wait_for_output=wait, user=user, instance=instance
                )
            )
        return await fallback[0](action=action, input=input)

    return execute


__all__ = ["OrchestratorSandbox", "OrchestratorSandboxConfig", "bash_session", "metadata_env"]
