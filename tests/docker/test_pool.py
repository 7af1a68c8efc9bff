"""The warm pool on Docker: what acquire() hands out was started and set up before the call,
a replacement starts behind it, and closing the pool leaves nothing. (How much faster that is
than a cold start is measured in bench/, not here.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from orchestrator import Pool, load_environment
from orchestrator.backends.container.inventory import list_projects, project_statuses
from tests.conftest import labelled_ids
from tests.docker.conftest import MakeEnv


def _wait_ready(pool: Pool, count: int) -> None:
    deadline = time.monotonic() + 60
    while pool.ready < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.ready >= count, "the pool never filled"


def test_acquire_hands_out_an_environment_started_before_the_call(make_env: MakeEnv) -> None:
    env = load_environment(make_env("setup: {commands: ['echo ready > .ready']}\n", name="pool"))
    before = labelled_ids()
    with Pool(env, size=2) as pool:
        _wait_ready(pool, 2)
        running = {p.name for p in list_projects() if p.env == "pool"}
        rt = pool.acquire(timeout=60)
        assert rt.info().id in running  # no start on the acquire path
        assert rt.execute("cat .ready").stdout == "ready\n"
        _wait_ready(pool, 2)  # the replacement came up behind it
        assert len({p.name for p in list_projects() if p.env == "pool"}) == 3
        pool.release(rt)
        assert rt.closed
    assert labelled_ids() <= before


def test_ps_shows_whether_a_member_waits_or_is_in_use(make_env: MakeEnv) -> None:
    env = load_environment(make_env("", name="poolps"))
    with Pool(env, size=1, reuse=True) as pool:
        _wait_ready(pool, 1)

        def shown() -> set[str]:
            return {r.pool for r in project_statuses()[0] if r.env == "poolps"}

        assert shown() == {f"{pool.id} ready"}
        rt = pool.acquire(timeout=60)
        assert shown() == {f"{pool.id} in-use"}
        rt.execute("setsid sleep 3000 >/dev/null 2>&1 < /dev/null & echo x > junk")
        pool.release(rt)  # reset: the daemon and the junk go, the container stays
        assert shown() == {f"{pool.id} ready"}
        again = pool.acquire(timeout=60)
        assert (
            again is rt
            and rt.execute("ls -A; grep -l '[s]leep.3000' /proc/[0-9]*/cmdline").stdout == ""
        )
        pool.release(rt)


CLI = [sys.executable, "-m", "orchestrator"]


class _PoolProcess:
    """`orchestrator pool` in the background, its progress lines collected."""

    def __init__(self, path: Path, size: int) -> None:
        self.proc = subprocess.Popen(
            [*CLI, "pool", str(path), "--size", str(size)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        assert self.proc.stderr is not None
        stderr = self.proc.stderr
        self.reader = threading.Thread(target=lambda: self.lines.extend(stderr), daemon=True)
        self.reader.start()

    def wait_for(self, line: str) -> None:
        deadline = time.monotonic() + 60
        while line not in [x.strip() for x in self.lines] and time.monotonic() < deadline:
            assert self.proc.poll() is None, self.lines
            time.sleep(0.05)
        assert line in [x.strip() for x in self.lines], self.lines

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self.reader.join(5)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code


def _up(*args: str) -> list[str]:
    done = subprocess.run([*CLI, "up", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_cli_pool_hands_ready_environments_to_up_pool(make_env: MakeEnv) -> None:
    path = make_env("setup: {commands: ['echo warm > .ready']}\n", name="clipool")
    before = labelled_ids()
    pool = _PoolProcess(path, 1)
    try:
        pool.wait_for("ready 1/1, starting 0, taken 0")
        [first] = _up(str(path), "--pool")
        pool.wait_for("ready 1/1, starting 0, taken 1")  # another took its place
        states = {r.id: r.pool for r in project_statuses()[0]}
        assert states[first].endswith(" claimed")
        shown = subprocess.run([*CLI, "exec", first, "--", "cat .ready"], capture_output=True)
        assert shown.stdout == b"warm\n"  # set up by the pool before it was asked for
        subprocess.run([*CLI, "down", first], check=True, capture_output=True)  # no --force
        [second] = _up(str(path), "--pool")
    finally:
        assert pool.stop() != 0  # stopped by a signal
    try:
        # the one taken outlives its pool; the one still waiting went with it
        left = {r.id for r in project_statuses()[0] if r.env == "clipool"}
        assert left == {second}
    finally:
        subprocess.run([*CLI, "down", second], check=True, capture_output=True)
    assert labelled_ids() <= before


def test_cli_up_starts_several_at_once_or_none(make_env: MakeEnv) -> None:
    path = make_env("", name="many")
    ids = _up(str(path), "-n", "3")
    try:
        assert len(set(ids)) == 3
        running = {r.id: r.state for r in project_statuses()[0]}
        assert all(running[i] == "running" for i in ids)
    finally:
        for ident in ids:
            subprocess.run([*CLI, "down", ident], check=True, capture_output=True)
    broken = make_env("setup: {commands: ['exit 3']}\n", name="manybad")
    before = labelled_ids()
    failed = subprocess.run([*CLI, "up", "-n", "3", str(broken)], capture_output=True, text=True)
    assert failed.returncode == 1 and "exit" in failed.stderr and failed.stdout == ""
    assert labelled_ids() <= before


def test_a_killed_pool_leaves_only_what_was_taken(make_env: MakeEnv) -> None:
    path = make_env("", name="killpool")
    before = labelled_ids()
    pool = _PoolProcess(path, 2)
    pool.wait_for("ready 2/2, starting 0, taken 0")
    [taken] = _up(str(path), "--pool")
    pool.proc.kill()  # no unwinding: its guardian removes what it still held
    pool.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = {r.id for r in project_statuses()[0] if r.env == "killpool"}
        if left == {taken}:
            break
        time.sleep(0.2)
    try:
        assert left == {taken}
    finally:
        subprocess.run([*CLI, "down", taken], check=True, capture_output=True)
    assert labelled_ids() <= before
