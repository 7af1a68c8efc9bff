"""Attacks of issue 37 on cancellation (item 13), without Docker: a call run in a thread for
an asyncio caller (`threads.stoppable`) is stopped when its caller is cancelled, and the
cancel returns only once it has stopped; on the local backend a cancelled `aio` download
lands nothing and a cancelled upload writes nothing more."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import aio, load_environment_text, spawn_runtime
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.threads import Stopped, check_stop, last_step, stoppable

QUIET = 2.0
"""Seconds the tests watch, after a cancel returned, for anything landing late."""


async def cancelled(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancel_returns_once_the_work_stopped_and_its_last_step_never_runs() -> None:
    began, steps = threading.Event(), []

    def work() -> None:
        began.set()
        while True:  # stops at a check, as a download's unpacking does at each chunk
            try:
                check_stop()
            except Stopped:
                time.sleep(0.3)  # undoing what it made takes a while
                steps.append("undone")
                raise
            time.sleep(0.01)

    async def main() -> None:
        task = asyncio.ensure_future(stoppable(work))
        while not began.is_set():
            await asyncio.sleep(0.01)
        await cancelled(task)
        assert steps == ["undone"]  # before the cancel returned

    asyncio.run(main())


def test_a_last_step_begun_before_the_cancel_ends_before_it_returns() -> None:
    inside, waiting, moved = threading.Event(), threading.Event(), []

    def work() -> str:
        last_step()  # from here on, a cancel waits
        inside.set()
        time.sleep(0.3)
        moved.append("moved")
        return "done"

    def after_cancel() -> None:
        waiting.set()
        # until the cancel has been taken (a fixed pause could end first on a busy machine):
        # check_stop says so
        deadline = time.monotonic() + 30
        while True:
            try:
                check_stop()
            except Stopped:
                break
            if time.monotonic() > deadline:
                moved.append("not told to stop within 30 s")
                return
            time.sleep(0.005)
        last_step()
        moved.append("too late")

    async def main() -> None:
        task = asyncio.ensure_future(stoppable(work))
        while not inside.is_set():
            await asyncio.sleep(0.01)
        await cancelled(task)
        assert moved == ["moved"]
        late = asyncio.ensure_future(stoppable(after_cancel))
        while not waiting.is_set():  # its thread runs: the cancel finds it under way
            await asyncio.sleep(0.01)
        await cancelled(late)

    asyncio.run(main())
    assert moved == ["moved"]  # the second one's last step was refused


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    with spawn_runtime(env) as runtime:
        yield runtime


async def until(check: Callable[[], object], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


def below(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_cancelled_download_lands_nothing(rt: Runtime, tmp_path: Path) -> None:
    tree = Path(rt.workdir, "tree")
    tree.mkdir()
    for i in range(400):
        (tree / f"f{i:03}").write_bytes(os.urandom(500_000))
    dest = tmp_path / "out"

    async def main() -> None:
        task = asyncio.ensure_future(aio.AsyncRuntime(rt).download("tree", dest))
        await until(lambda: any(dest.glob(".orchestrator-download-*/*")) or task.done())
        assert not task.done(), "the download was over before it could be cancelled"
        await cancelled(task)

    asyncio.run(main())
    assert below(dest) == []
    time.sleep(QUIET)
    assert below(dest) == []


def test_a_cancelled_upload_writes_nothing_more(rt: Runtime, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"f{i:03}").write_bytes(os.urandom(500_000))
    up = Path(rt.workdir, "up")

    def written() -> list[tuple[str, int]]:
        return sorted((p.name, p.stat().st_size) for p in up.glob("*")) if up.exists() else []

    async def main() -> list[tuple[str, int]]:
        task = asyncio.ensure_future(aio.AsyncRuntime(rt).upload(src, "up"))
        await until(lambda: written() or task.done())
        assert not task.done(), "the upload was over before it could be cancelled"
        await cancelled(task)
        return written()

    at_cancel = asyncio.run(main())
    assert sum(size for _, size in at_cancel) < 400 * 500_000  # it was cut short
    time.sleep(QUIET)
    assert written() == at_cancel
