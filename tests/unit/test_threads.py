"""Blocking work for asyncio callers (orchestrator/sandbox/threads.py) and the cancellation
hook of the process core (procutil.abandon_when), without Docker."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import threading
import time

import pytest

from orchestrator import procutil
from orchestrator.sandbox.options import Chunks
from orchestrator.sandbox.results import Outcome, StreamKind
from orchestrator.sandbox.threads import SingleFlight, in_thread, thread_chunks


def test_in_thread_returns_and_raises_as_the_call_does() -> None:
    def boom() -> int:
        raise KeyError("x")

    async def main() -> int:
        with pytest.raises(KeyError):
            await in_thread(boom)
        return await in_thread(lambda: 6 * 7)

    assert asyncio.run(main()) == 42


def test_what_a_cancelled_call_made_goes_to_abandoned() -> None:
    release, handed = threading.Event(), []
    done = threading.Event()

    def make() -> str:
        release.wait(10)
        return "made"

    def abandoned(value: str) -> None:
        handed.append(value)
        done.set()

    async def main() -> None:
        task = asyncio.ensure_future(in_thread(make, abandoned=abandoned))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()  # it finishes after its caller left

    asyncio.run(main())
    assert done.wait(10) and handed == ["made"]


def test_a_call_finished_as_its_caller_is_cancelled_is_not_lost() -> None:
    """The value may be on its way to the loop when the cancel lands: still handed over."""
    handed: list[int] = []
    for _ in range(20):

        async def main() -> None:
            task = asyncio.ensure_future(in_thread(lambda: 1, abandoned=handed.append))
            await asyncio.sleep(0)  # the thread may finish at any point around the cancel
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return
            handed.append(1)  # it came back first: the caller holds it

        asyncio.run(main())
        deadline = time.monotonic() + 5
        while len(handed) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handed == [1]
        handed.clear()


def _run(chunks: int, closed: list[bool], pause: float = 0.0) -> Chunks:
    try:
        for i in range(chunks):
            if pause:
                time.sleep(pause)
            kind: StreamKind = "stdout" if i % 2 == 0 else "stderr"
            yield kind, str(i).encode()
        return Outcome(3, False, 0.0)
    finally:
        closed.append(True)


def test_thread_chunks_hands_over_every_chunk_then_the_outcome() -> None:
    closed: list[bool] = []

    async def main() -> list[object]:
        return [item async for item in thread_chunks(lambda: _run(200, closed))]

    items = asyncio.run(main())
    assert items[:-1] == [
        ("stdout" if i % 2 == 0 else "stderr", str(i).encode()) for i in range(200)
    ]
    assert items[-1] == Outcome(3, False, 0.0) and closed == [True]


def test_thread_chunks_closes_the_run_when_its_caller_leaves() -> None:
    closed: list[bool] = []

    async def main() -> None:
        run = thread_chunks(lambda: _run(10_000, closed, pause=0.001))
        await run.__anext__()
        await run.aclose()

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [True]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_thread_chunks_stops_when_its_loop_is_closed_under_it() -> None:
    closed: list[bool] = []
    loop = asyncio.new_event_loop()

    async def first() -> object:
        run = thread_chunks(lambda: _run(10_000, closed, pause=0.01))
        await run.__anext__()
        return run

    run = loop.run_until_complete(first())
    loop.close()
    del run, loop
    gc.collect()
    deadline = time.monotonic() + 5
    while not closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert closed == [True]


def test_single_flight_shares_one_call_among_its_waiters() -> None:
    calls, gate = [], threading.Event()

    def probe() -> str:
        calls.append(1)
        gate.wait(5)
        return "answer"

    async def main() -> list[str]:
        once = SingleFlight()
        waiters = [asyncio.ensure_future(once(probe)) for _ in range(50)]
        await asyncio.sleep(0.2)
        gate.set()
        answers = await asyncio.gather(*waiters)
        again = await once(lambda: "later")  # the first finished: a new one runs
        return [*answers, again]

    answers = asyncio.run(main())
    assert answers == ["answer"] * 50 + ["later"] and calls == [1]


def test_an_abandoned_command_is_killed_within_moments() -> None:
    stop, outcome = threading.Event(), []
    procs: list[subprocess.Popen[bytes]] = []

    def pump() -> None:
        procutil.abandon_when(stop)
        run = procutil.run(["sleep", "30"], None, None, on_start=procs.append)
        try:
            while True:
                next(run)
        except StopIteration as end:
            outcome.append(end.value)
        finally:
            procutil.abandon_when(None)

    thread = threading.Thread(target=pump)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < 2
    assert outcome and outcome[0].exit_code == 137
    assert procs and procs[0].poll() is not None  # killed and reaped, not left sleeping
