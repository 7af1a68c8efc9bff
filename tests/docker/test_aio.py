"""The asyncio front door on the Docker backend, where commands go natively through the
executor: no thread per call, cancellation that kills what runs in the sandbox, and the
channel clean after it. (The whole conformance suite also runs through this door: the
`-async` targets of tests/conformance.)"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import (
    ExecutorLost,
    Runtime,
    RuntimeResult,
    SandboxUnavailable,
    aio,
    spawn_runtime,
)
from orchestrator.backends.container.executor.client import ExecutorClient
from orchestrator.procutil.workers import WORKER_NAME
from tests.conftest import BUSYBOX_IMAGE, labelled_ids, main_container
from tests.docker.conftest import MakeEnv, spawn_in_mode


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    folder = tmp_path_factory.mktemp("aio")
    path = folder / "env.yaml"
    path.write_text(
        "version: 1\nname: aio\nimage: orchestrator-test/python:3.11\nuser: '1000:1000'\n"
    )
    with spawn_runtime(path) as runtime:
        assert runtime.info().exec_mode == "executor"
        yield runtime


def door(runtime: Runtime) -> aio.AsyncRuntime:
    return aio.AsyncRuntime(runtime)


async def survivors(art: aio.AsyncRuntime, marker: str) -> list[str]:
    """Processes whose command line holds `marker` (the pattern never matches itself)."""
    pattern = marker[:-1] + "[" + marker[-1] + "]"
    script = (
        "for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null "
        f"| grep -q '{pattern}' && echo $f; done; true"
    )
    return (await art.execute(script, user="0", timeout=20)).stdout.split()


def test_calls_in_flight_take_no_thread_each(rt: Runtime) -> None:
    async def main() -> tuple[int, int, list[str]]:
        art = door(rt)
        await art.execute("true")  # the executor is up
        before = threading.active_count()
        calls = [asyncio.ensure_future(art.execute(f"sleep 2; echo {i}")) for i in range(40)]
        await asyncio.sleep(1.0)  # all forty are running in the sandbox now
        during = threading.active_count()
        results = await asyncio.gather(*calls)
        return before, during, [r.stdout for r in results]

    before, during, outs = asyncio.run(main())
    assert outs == [f"{i}\n" for i in range(40)]
    assert during <= before + 2, f"{during - before} threads for 40 calls in flight"


@pytest.mark.parametrize(
    "command",
    [
        "sleep 311 & sleep 311",
        "setsid sh -c 'sleep 311 & sleep 311' & sleep 311",
    ],
    ids=["child", "new-session"],
)
def test_cancelling_a_call_kills_its_tree_and_the_channel_goes_on(
    rt: Runtime, command: str
) -> None:
    async def main() -> tuple[list[str], str]:
        art = door(rt)
        task = asyncio.ensure_future(art.execute(command))
        # every sleep of the command runs before the cancel (a fixed pause was too short
        # under load); "^" counts the sleeps alone, not the shells that hold their text
        deadline = time.monotonic() + 30
        while len(await survivors(art, "^sleep 311")) < command.count("sleep 311"):
            assert time.monotonic() < deadline, "the command never started"
            assert not task.done(), task
            await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while (left := await survivors(art, "sleep 311")) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        after = await art.execute("echo clean; echo err >&2")
        return left, after.stdout + after.stderr

    left, after = asyncio.run(main())
    assert left == []
    assert after == "clean\nerr\n"


def test_leaving_a_stream_early_kills_the_command(rt: Runtime) -> None:
    async def main() -> list[str]:
        art = door(rt)
        async for event in art.stream("echo first; sleep 312"):
            assert event.text == "first\n"
            break  # the generator is finalized by the loop, which kills the command
        deadline = time.monotonic() + 10
        while (left := await survivors(art, "sleep 312")) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return left

    assert asyncio.run(main()) == []


def test_a_timeout_ends_the_command_and_keeps_its_output(rt: Runtime) -> None:
    async def main() -> tuple[RuntimeResult, list[str]]:
        art = door(rt)
        result = await art.execute("echo before; sleep 313", timeout=1)
        return result, await survivors(art, "sleep 313")

    result, left = asyncio.run(main())
    assert result.timed_out and result.exit_code != 0
    assert result.stdout == "before\n"
    assert result.elapsed < 10
    assert left == []


def test_stdin_and_output_bigger_than_any_buffer(rt: Runtime) -> None:
    data = os.urandom(20 << 20)

    async def main() -> tuple[str, bool, int]:
        art = door(rt)
        digest = await art.execute("sha256sum | cut -d' ' -f1", stdin=data, timeout=120)
        big = await art.execute("head -c 30000000 /dev/zero", output_limit=1 << 20, timeout=120)
        return digest.stdout.strip(), big.stdout_truncated, len(big.stdout)

    digest, truncated, kept = asyncio.run(main())
    assert digest == hashlib.sha256(data).hexdigest()
    assert truncated and kept == 1 << 20


KILL_EXECUTOR = (
    "pids=; for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null | grep -q "
    "'[a]gent.py' && p=${f#/proc/} && pids=\"$pids ${p%/cmdline}\"; done; "
    "kill -9 $(printf '%s\\n' $pids | sort -n) 2>/dev/null; true"
)
"""Kill the executor and the processes it forked, all at once, the executor (the oldest, the
lowest id) first: one by one in the glob's order (by name: 100 before 27), a child that
hosts the command could die first, and the executor report its end as the command's."""


def test_a_lost_executor_fails_its_call_and_the_next_call_starts_another(rt: Runtime) -> None:
    container = main_container(rt)

    async def main() -> tuple[BaseException | None, str, str]:
        art = door(rt)
        task = asyncio.ensure_future(art.execute("sleep 314"))
        # the command runs before its executor is killed (a fixed pause can be too short
        # under load, and the kill then lands before the call is under way)
        deadline = time.monotonic() + 30
        while not await survivors(art, "^sleep 314"):
            assert time.monotonic() < deadline, "the command never started"
            assert not task.done(), task
            await asyncio.sleep(0.1)
        subprocess.run(
            ["docker", "exec", "-u", "0", container, "sh", "-c", KILL_EXECUTOR],
            check=True,
            capture_output=True,
        )
        error: BaseException | None = None
        try:
            await asyncio.wait_for(task, 30)
        except (ExecutorLost, SandboxUnavailable) as exc:
            error = exc
        again = await art.execute("echo again")
        native = await art.execute("echo native")  # the new executor, awaited natively
        return error, again.stdout, native.stdout

    error, again, native = asyncio.run(main())
    assert isinstance(error, ExecutorLost)
    assert (again, native) == ("again\n", "native\n")


def test_files_through_the_async_door(rt: Runtime, tmp_path: Path) -> None:
    async def main() -> tuple[bytes, list[str]]:
        art = door(rt)
        await art.write_file("aio/bin.dat", b"\x00\xff" * 1000)
        data = await art.read_file("aio/bin.dat", text=False)
        return data, await art.download("aio", tmp_path / "out")

    data, names = asyncio.run(main())
    assert data == b"\x00\xff" * 1000
    assert names == ["bin.dat"]
    assert (tmp_path / "out" / "bin.dat").read_bytes() == data


@pytest.mark.parametrize("when", ["at-once", "in-setup"])
def test_a_cancelled_spawn_removes_what_it_started(make_env: MakeEnv, when: str) -> None:
    """Cancelled before the project exists, or once its container runs and its setup is
    under way (a slow setup command keeps it there: a bare sandbox is up in a quarter of a
    second, faster than any fixed sleep could aim at)."""
    path = make_env("setup:\n  commands: ['sleep 3']\n", name=f"aio-cancel-{when}")
    before = labelled_ids()

    async def main() -> None:
        task = asyncio.ensure_future(aio.spawn(path))
        await asyncio.sleep(0)
        if when == "in-setup":
            deadline = time.monotonic() + 60
            while not (seen := labelled_ids() - before) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert seen, "no container appeared within 60 s"
            assert not task.done(), "the spawn ended before its setup command could"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 90
    while (left := labelled_ids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == set()


def test_a_pool_hands_out_through_the_async_door(make_env: MakeEnv) -> None:
    path = make_env("", name="aio-pool")

    async def main() -> tuple[str, str]:
        async with await aio.AsyncPool.start(path, 1) as pool:
            first = await pool.acquire(timeout=120)
            out, ident = (await first.execute("echo pooled")).stdout, first.info().id
            await pool.release(first)
            second = await pool.acquire(timeout=120)  # the replacement
            other = second.info().id
            await pool.release(second)
            return out, other if other != ident else ""

    out, second = asyncio.run(main())
    assert out == "pooled\n"
    assert second, "the second environment was the first one again"


def _count(runtime: Runtime, marker: str) -> int:
    script = (
        "for p in /proc/[0-9]*; do tr '\\000' ' ' < $p/cmdline 2>/dev/null; echo; done "
        f"| grep -c '^{marker}' || true"
    )
    return int(runtime.execute(script, user="0", timeout=20).stdout.strip() or 0)


def _gone(runtime: Runtime, marker: str) -> int:
    """How many processes starting with `marker` are left after up to 10 s of waiting."""
    deadline = time.monotonic() + 10
    while (left := _count(runtime, marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


MISUSE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
"""Python itself complains when a loop is closed under pending tasks ("Task was destroyed but
it is pending!", an error closing the dropped coroutine): the misuse these tests make."""


@MISUSE
@pytest.mark.parametrize("how", ["call", "stream", "starting"])
def test_a_call_whose_event_loop_closes_under_it_is_killed(
    rt: Runtime, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A careless caller closes its loop with a call in flight (no cancel, no aclose): the
    call is garbage, and its silent command must die as a dropped blocking call's does,
    whenever the garbage collector finds it. "starting": the executor reads as still
    starting, so the call is run by the blocking path in a thread of its own (a busy CI
    machine lost this one: nothing killed it until the collector ran, a test later)."""
    if how == "starting":
        monkeypatch.setattr(ExecutorClient, "ready_now", property(lambda self: False))
    art, marker = door(rt), f"sleep 77{'2' if how == 'stream' else '1'}"
    loop = asyncio.new_event_loop()
    if how != "stream":
        pending: object = loop.create_task(art.execute(marker))
        deadline = time.monotonic() + 30  # a busy machine starts it late (the thread path)
        while _count(rt, marker) == 0 and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.2))
    else:

        async def first() -> object:
            events = art.stream(f"echo hi; {marker}")
            await events.__anext__()
            return events

        pending = loop.run_until_complete(first())
    assert _count(rt, marker) == 1
    loop.close()  # and the call is kept: no collector can end it
    assert _gone(rt, marker) == 0
    assert rt.execute("echo fine").stdout == "fine\n"
    del pending, loop
    gc.collect()


@MISUSE
def test_a_call_driven_by_a_thread_dies_with_its_closed_loop(make_env: MakeEnv) -> None:
    """The same on the path without an executor (plain docker exec, in a thread of its own):
    the thread ends and so does the command."""
    plain = spawn_in_mode("plain", make_env("", name="aio-plain", image=BUSYBOX_IMAGE))
    with plain:
        threads = _busy_threads()
        loop = asyncio.new_event_loop()
        task = loop.create_task(door(plain).execute("sleep 663"))
        deadline = time.monotonic() + 30  # a busy machine starts it late (a thread, docker exec)
        while _count(plain, "sleep 663") == 0 and time.monotonic() < deadline:
            loop.run_until_complete(asyncio.sleep(0.2))
        assert _count(plain, "sleep 663") == 1
        loop.close()
        del task, loop
        gc.collect()
        assert _gone(plain, "sleep 663") == 0
        deadline = time.monotonic() + 10
        while _busy_threads() - threads and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _busy_threads() - threads


def _busy_threads() -> set[threading.Thread]:
    """This process's threads but the process core's idle workers (kept for the next
    command: the first command of a run starts one, which then waits)."""
    return {t for t in threading.enumerate() if t.name != WORKER_NAME}


def test_a_silent_executor_is_probed_once_for_all_the_calls_waiting(rt: Runtime) -> None:
    """Root stops the executor (SIGSTOP) under 30 waiting calls: every call ends within its
    bound, and the engine is asked why once at a time, not by a thread per call. The calls
    would outlive their bound by far, so a stop that lands late on a loaded machine still
    finds every one of them waiting."""
    container = main_container(rt)
    stop = KILL_EXECUTOR.replace("kill -9", "kill -STOP")

    async def main() -> tuple[int, int, list[str]]:
        art = door(rt)
        await art.execute("true")
        before = threading.active_count()
        calls = [asyncio.ensure_future(art.execute("sleep 60", timeout=8)) for _ in range(30)]
        await asyncio.sleep(1.0)
        subprocess.run(["docker", "exec", "-u", "0", container, "sh", "-c", stop], check=True)
        peak, started = before, time.monotonic()
        while not all(c.done() for c in calls) and time.monotonic() - started < 60:
            peak = max(peak, threading.active_count())
            await asyncio.sleep(0.05)
        ends = [type(c.exception()).__name__ if c.exception() else "result" for c in calls]
        return before, peak, ends

    try:
        before, peak, ends = asyncio.run(main())
    finally:
        cont = KILL_EXECUTOR.replace("kill -9", "kill -CONT")
        subprocess.run(["docker", "exec", "-u", "0", container, "sh", "-c", cont], check=False)
    assert set(ends) == {"ExecutorLost"}, ends
    assert peak <= before + 4, f"{peak - before} threads for 30 waiting calls"
    assert rt.execute("echo back").stdout == "back\n"
