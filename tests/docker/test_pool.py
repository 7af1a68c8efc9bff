"""The warm pool on Docker: what acquire() hands out was started and set up before the call,
a replacement starts behind it, and closing the pool leaves nothing. (How much faster that is
than a cold start is measured in bench/, not here.)"""

from __future__ import annotations

import time

from orchestrator import Pool, load_environment
from orchestrator.project import list_projects
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
