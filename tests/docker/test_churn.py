"""Listing while others remove: `ps` (library and CLI) and `up --pool` never crash while
another thread creates and removes environments (issue 20, item 3)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator import Pool, load_environment, spawn_runtime
from orchestrator.backends.container.inventory import list_projects, parse_ports, project_statuses
from orchestrator.cli import app
from tests.docker.conftest import BUSYBOX_IMAGE, MakeEnv

CHURNERS = 2


@pytest.fixture
def churn(make_env: MakeEnv) -> Iterator[list[BaseException]]:
    """Threads that start and remove environments until the test ends; their errors."""
    env = load_environment(make_env("", name="churn", image=BUSYBOX_IMAGE))
    stop, errors = threading.Event(), list[BaseException]()
    done = [0]

    def loop() -> None:
        while not stop.is_set():
            try:
                with spawn_runtime(env):
                    time.sleep(0.05)
                done[0] += 1
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(CHURNERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while done[0] < CHURNERS and time.monotonic() < deadline:  # churning for real
        time.sleep(0.05)
    yield errors
    stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a churn thread did not end"
    assert done[0] >= CHURNERS


LISTINGS = 80
"""Listings under churn: the crash this pins showed in about 1 of 6 runs of `ps`, so 40 runs
of it miss it about once in 1,500 (each listing costs a churn of CPU on a shared machine)."""


def test_ps_never_crashes_while_environments_come_and_go(churn: list[BaseException]) -> None:
    runner = CliRunner()
    failures: list[str] = []
    started = time.monotonic()
    for i in range(LISTINGS):
        try:
            if i % 2:
                out = runner.invoke(app, ["ps", "--json"])
                if out.exit_code != 0:
                    failures.append(f"ps exited {out.exit_code}: {out.output} {out.exception!r}")
                else:
                    json.loads(out.stdout)
            else:
                project_statuses()
                list_projects()
        except Exception as exc:
            failures.append(repr(exc))
    assert not churn, churn
    assert failures == [], f"{len(failures)} of {LISTINGS} listings failed: {failures[:3]}"
    assert time.monotonic() - started < 300  # about 10 s alone; a bound against a hang


def test_up_pool_claims_under_churn(make_env: MakeEnv, churn: list[BaseException]) -> None:
    path = make_env("setup: {commands: ['echo warm > .ready']}\n", name="churnpool")
    runner = CliRunner()
    taken: list[str] = []
    try:
        with Pool(path, size=2) as pool:
            for _ in range(4):
                deadline = time.monotonic() + 60
                while pool.ready < 1 and time.monotonic() < deadline:
                    pool.sweep()
                    time.sleep(0.05)
                out = runner.invoke(app, ["up", str(path), "--pool", "--json"])
                assert out.exit_code == 0, (out.output, out.exception)
                [line] = out.stdout.splitlines()
                record = json.loads(line)
                taken.append(record["id"])
                assert record["env"] == "churnpool"
                assert "no pool" not in out.stderr  # taken from the pool, not started
                pool.sweep()
    finally:
        for ident in taken:
            down = runner.invoke(app, ["down", ident])
            assert down.exit_code == 0, down.output
    assert not churn, churn
    assert Path(path).exists()


def test_ports_are_read_from_the_listing_line() -> None:
    """What `docker ps` prints in its Ports column is what `ps` shows: ranges unfolded,
    IPv6 addresses unbracketed, exposed ports that are not published left out."""
    text = "127.0.0.1:32768->53/udp, [::1]:32770->81/tcp, 127.0.0.1:18000-18001->8000-8001/tcp"
    shown = [str(p) for p in parse_ports("web", f"{text}, 9000/tcp")]
    assert shown == [
        "web:53/udp -> 127.0.0.1:32768",
        "web:8000/tcp -> 127.0.0.1:18000",
        "web:8001/tcp -> 127.0.0.1:18001",
        "web:81/tcp -> ::1:32770",
    ]
