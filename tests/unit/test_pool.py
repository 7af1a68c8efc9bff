"""The warm pool on the local backend (the Docker one is in tests/docker/test_pool.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator import (
    Pool,
    PoolExhausted,
    RuntimeClosed,
    SetupFailed,
    UsageError,
    load_environment_text,
)


def env(setup: str = "echo ready > .ready") -> str:
    return f"version: 1\nname: pooled\nbackend: local\nsetup: {{commands: ['{setup}']}}\n"


def test_acquire_hands_out_ready_environments_and_refills(tmp_path: Path) -> None:
    given = []
    with Pool(load_environment_text(env()), size=2) as pool:
        deadline = time.monotonic() + 20
        while pool.ready < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        started = time.monotonic()
        first = pool.acquire()
        assert time.monotonic() - started < 0.5  # it was ready: no start on this path
        given.append(first)
        assert first.read_file(".ready") == "ready\n"  # set up before it was handed out
        second, third = pool.acquire(timeout=20), pool.acquire(timeout=20)
        given += [second, third]
        assert len({id(r) for r in given}) == 3 and len({r.workdir for r in given}) == 3
        pool.release(first)
        assert first.closed
    assert all(r.closed for r in given[:1]) and not given[1].closed
    for r in given[1:]:
        r.cleanup()
    with pytest.raises(RuntimeClosed):
        pool.acquire()


def test_close_removes_what_waits_and_what_was_starting() -> None:
    pool = Pool(load_environment_text(env("sleep 0.5")), size=3)
    pool.close()  # while starts are in flight: they finish and are removed
    assert pool.ready == 0


def test_a_failing_start_is_raised_by_acquire_and_a_slow_one_times_out() -> None:
    with Pool(load_environment_text(env("exit 3")), size=1) as pool, pytest.raises(SetupFailed):
        pool.acquire(timeout=20)
    with Pool(load_environment_text(env("sleep 3")), size=1) as slow, pytest.raises(TimeoutError):
        slow.acquire(timeout=0.2)


def test_bad_pools_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        Pool(load_environment_text(env()), size=0)
    with pytest.raises(UsageError, match="workspace"):
        Pool(load_environment_text(env()), size=1, workspace=tmp_path)


def _filled(pool: Pool, count: int) -> None:
    deadline = time.monotonic() + 20
    while pool.ready < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.ready == count


def test_a_reuse_pool_resets_what_comes_back_and_hands_it_out_again() -> None:
    with Pool(load_environment_text(env()), size=1, reuse=True) as pool:
        rt = pool.acquire(timeout=20)
        rt.write_file(".ready", "scribbled\n")
        rt.write_file("left-behind.txt", "x")
        pool.release(rt)
        assert pool.ready == 1 and not rt.closed
        again = pool.acquire(timeout=20)
        assert again is rt  # the same environment, put back as setup left it
        assert rt.read_file(".ready") == "ready\n"
        assert rt.execute("ls -A").stdout.split() == [".ready"]
        with pytest.raises(TimeoutError):  # all of it is out: nothing starts in its place
            pool.acquire(timeout=0.3)
        pool.release(rt, reset=False)  # discarded instead: a new one starts
        assert rt.closed
        _filled(pool, 1)
        with pool.acquire(timeout=20) as fresh:
            assert fresh is not rt


def test_a_disposable_pool_keeps_a_reset_one_only_when_it_is_short() -> None:
    with Pool(load_environment_text(env()), size=1) as pool:
        rt = pool.acquire(timeout=20)
        _filled(pool, 1)  # the replacement is up: the pool is full
        pool.release(rt, reset=True)
        assert rt.closed and pool.ready == 1


def test_only_the_pools_own_environments_go_back() -> None:
    with (
        Pool(load_environment_text(env()), size=1) as first,
        Pool(load_environment_text(env()), size=1) as second,
    ):
        rt = first.acquire(timeout=20)
        with pytest.raises(UsageError, match="not an environment of this pool"):
            second.release(rt)
        first.release(rt)


def test_watchers_hear_every_offer_and_the_close() -> None:
    heard: list[int] = []
    pool = Pool(load_environment_text(env()), size=2)
    stop = pool.watch(lambda: heard.append(pool.offered))
    try:
        deadline = time.monotonic() + 20
        while len(heard) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(heard)[-1] == 2  # each start, once offered, woke the watcher
        rt = pool.acquire(timeout=20)
        pool.release(rt)
    finally:
        pool.close()
    assert len(heard) >= 3  # the replacement offered, and the close
    stop()
    stop()  # twice is harmless


def test_a_pool_with_a_total_starts_no_more_than_that() -> None:
    """A batch of 3 through a pool of 2: three environments are started in all, none for
    nothing at the end, and a fourth acquire is told to start its own."""
    with Pool(load_environment_text(env()), size=2, total=3) as pool:
        given = [pool.acquire(timeout=20) for _ in range(3)]
        assert len({r.workdir for r in given}) == 3
        assert pool.ready == 0 and pool.starting == 0 and pool.exhausted
        with pytest.raises(PoolExhausted, match="spawn_runtime"):
            pool.acquire(timeout=5)  # at once, not after the timeout
        for rt in given:
            pool.release(rt)


def test_a_failed_start_does_not_spend_the_total() -> None:
    """Each failed start is raised by acquire() and replaced; the total still counts only
    what it could hand out (setup fails: none), so acquire never says exhausted."""
    with Pool(load_environment_text(env("exit 3")), size=1, total=1) as pool:
        for _ in range(3):
            with pytest.raises(SetupFailed):
                pool.acquire(timeout=20)
        assert not pool.exhausted


def test_a_total_is_for_disposable_pools_of_at_least_one() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        Pool(load_environment_text(env()), size=1, total=0)
    with pytest.raises(UsageError, match="reuse"):
        Pool(load_environment_text(env()), size=1, total=4, reuse=True)
