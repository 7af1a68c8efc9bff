"""Inspect's `exec_remote` on the provider, natively on the process API: both modes, stdin
written as it runs, output as it comes (before the command ends), kill and cancellation
ending the whole tree, the timeout of the awaitable mode, a sandbox gone under a running
process; and the sandbox has no tool injected for it (nothing of Inspect's lands there)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from inspect_ai.util import SandboxEnvironment, SandboxUnavailableError
from inspect_ai.util._sandbox._cli import SANDBOX_TOOLS_DIR
from inspect_ai.util._sandbox.exec_remote import (
    ExecCompleted,
    ExecOutput,
    ExecRemoteAwaitableOptions,
    ExecRemoteStreamingOptions,
    ExecStderr,
    ExecStdout,
)

from orchestrator.backends.container.inventory import list_projects
from orchestrator.integrations.inspect import OrchestratorSandbox
from tests.conftest import PYTHON_IMAGE

pytestmark = pytest.mark.docker
WITHIN = 60.0


def env_file(folder: Path) -> str:
    path = folder / "env.yaml"
    path.write_text(f"version: 1\nname: remote\nimage: {PYTHON_IMAGE}\nuser: '1000:1000'\n")
    return str(path)


async def _left(box: SandboxEnvironment, marker: str) -> str:
    script = (
        "for f in /proc/[0-9]*/cmdline; do "
        f"tr '\\000' ' ' < $f | grep -q '{marker}' && echo $f; done; true"
    )
    return (await box.exec(["sh", "-c", script])).stdout.strip()


async def _rest(events: AsyncIterator[ExecOutput]) -> list[ExecOutput]:
    """The events left, to the end (an ExecRemoteProcess is iterated once)."""
    rest = []
    while True:
        try:
            rest.append(await asyncio.wait_for(events.__anext__(), WITHIN))
        except StopAsyncIteration:
            return rest


def test_exec_remote_both_modes_natively(tmp_path: Path) -> None:
    config = env_file(tmp_path)

    made: list[str] = []

    async def scenario() -> None:
        envs = await OrchestratorSandbox.sample_init("t", config, {"word": "hi"})
        box = envs["default"]
        assert isinstance(box, OrchestratorSandbox)
        made.append(box.runtime.info().id)
        try:
            # streaming, stdin open: each line answered while the command runs
            opts = ExecRemoteStreamingOptions(stdin_open=True, input="first\n")
            proc = await box.exec_remote(
                ["sh", "-c", "while read l; do echo got-$l; done; echo bye >&2"], opts
            )
            events = proc.__aiter__()
            assert await asyncio.wait_for(events.__anext__(), WITHIN) == ExecStdout("got-first\n")
            await proc.write_stdin("second\n")
            assert await asyncio.wait_for(events.__anext__(), WITHIN) == ExecStdout("got-second\n")
            await proc.close_stdin()
            rest = await _rest(events)
            assert rest == [ExecStderr("bye\n"), ExecCompleted(exit_code=0)]
            with pytest.raises(RuntimeError):
                await proc.write_stdin("late\n")

            # awaitable: the result, the sample's variables, the exit code
            result = await box.exec_remote(
                ["sh", "-c", "echo $SAMPLE_METADATA_WORD; exit 3"], stream=False
            )
            assert (result.success, result.returncode, result.stdout) == (False, 3, "hi\n")

            # the awaitable timeout kills the whole tree
            marker = f"sleep {40000 + uuid.uuid4().int % 9999}"
            with pytest.raises(TimeoutError):
                await box.exec_remote(
                    ["sh", "-c", f"{marker} & {marker}"],
                    ExecRemoteAwaitableOptions(timeout=1),
                    stream=False,
                )
            assert not await _left(box, marker.replace("sleep", "slee[p]"))

            # kill: the tree ends, the iteration ends without a completion
            proc = await box.exec_remote(["sh", "-c", f"echo up; {marker} & {marker}"])
            events = proc.__aiter__()
            assert await asyncio.wait_for(events.__anext__(), WITHIN) == ExecStdout("up\n")
            await proc.kill()
            assert await _rest(events) == []
            assert not await _left(box, marker.replace("sleep", "slee[p]"))

            # a cancelled caller kills it before the cancellation goes on
            proc = await box.exec_remote(["sh", "-c", f"{marker} & {marker}"])
            reader = asyncio.ensure_future(proc.__aiter__().__anext__())
            await asyncio.sleep(0.5)
            reader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reader
            assert not await _left(box, marker.replace("sleep", "slee[p]"))

            # cancelled before exec_remote returned: killed all the same
            for stream in (False, True):
                early = asyncio.ensure_future(
                    box.exec_remote(["sh", "-c", f"{marker} & {marker}"], stream=stream)
                )
                await asyncio.sleep(0)
                early.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await early
                await asyncio.sleep(1.0)
                assert not await _left(box, marker.replace("sleep", "slee[p]")), stream

            # killed: what it printed before still comes; a write after the end is
            # Inspect's RuntimeError
            proc = await box.exec_remote(
                ["sh", "-c", f"echo before-kill; {marker}"],
                ExecRemoteStreamingOptions(stdin_open=True),
            )
            # the echo has run once the sleep after it has started (a fixed pause was too
            # short under load: the kill came first, and nothing was printed)
            deadline = time.monotonic() + 30
            while not await _left(box, marker.replace("sleep", "slee[p]")):
                assert time.monotonic() < deadline, "the command never started"
                await asyncio.sleep(0.1)
            await proc.kill()
            assert await _rest(proc.__aiter__()) == [ExecStdout("before-kill\n")]
            with pytest.raises(RuntimeError):
                await proc.write_stdin("late\n")

            # nothing of Inspect's tools was put into the sandbox for any of it
            found = await box.exec(["sh", "-c", f"ls -d {SANDBOX_TOOLS_DIR} 2>/dev/null; true"])
            assert found.stdout == ""

            # the sandbox gone under a running process
            proc = await box.exec_remote(["sleep", "600"])
            assert isinstance(box, OrchestratorSandbox)
            subprocess.run(
                ["docker", "kill", box.runtime.info().id + "-main-1"], capture_output=True
            )
            with pytest.raises(SandboxUnavailableError):
                async for _ in proc:
                    pass
        finally:
            await OrchestratorSandbox.sample_cleanup("t", config, envs, interrupted=False)
            # sample_cleanup removes in the background; task_cleanup waits for it
            await OrchestratorSandbox.task_cleanup("t", config, cleanup=True)

    asyncio.run(scenario())
    # nothing of its environment is left (by its id: other runs' come and go meanwhile)
    assert made and [p.name for p in list_projects() if p.name in made] == []
