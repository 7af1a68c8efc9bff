"""Listing while others remove: `ps` (library and CLI) and `up --pool` never crash while
another thread creates and removes environments (issue 20, item 3)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator import Pool, environments, load_environment, spawn_runtime
from orchestrator.backends.container.inventory import list_projects, parse_ports, project_statuses
from orchestrator.cli import app
from orchestrator.procutil import process_start
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


FILES = 300_000
"""Names in the layer of the container another process removes: removing them takes the
engine seconds (about 4 s on an idle 2-core machine), which the listing must outlast."""
LINKED = 10
"""The names are LINKED copies (hard links) of FILES // LINKED files: the same removal, made
several times faster than as many new files (a full run's disk once took over 240 s for
300,000 `touch`es)."""


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _state(container: str) -> str:
    """The engine's state of a container as its listing says ("" once it is gone)."""
    return _docker(
        "ps", "-a", "--filter", f"id={container}", "--format", "{{.State}}"
    ).stdout.strip()


def test_ps_lists_while_another_process_removes_a_dead_owners_project(
    make_env: MakeEnv, tmp_path: Path
) -> None:
    """Every `ps` reaps projects whose owner is gone, and so does every other process's
    (a guardian, a reaper, a `down`). While one of them removes a container, the engine
    refuses the others ("removal ... is already in progress"); removing a layer of many
    files takes it seconds. `ps` gave up after 2 s of tries and failed whole: no listing,
    whichever environments ran. It waits for that removal (bounded), and a project it
    cannot remove is logged and listed as it is: never a failed listing."""
    owner = subprocess.Popen(["sleep", "600"])  # the foreign project's owner, alive until set up
    name = f"orch-slowgone-{uuid.uuid4().hex[:8]}"
    labels = {
        "managed": "1",
        "project": name,
        "env": "slowgone",
        "dir": f"{tmp_path}/other-state/projects/{name}",
        "owner.pid": str(owner.pid),
        "owner.start": process_start(owner.pid),
        "owner.host": socket.gethostname(),
    }
    argv = ["run", "-d"] + [f"--label=org.orchestrator.{k}={v}" for k, v in labels.items()]
    fill = (
        f"mkdir /d && cd /d && seq 1 {FILES // LINKED} | xargs touch && cd / && "
        f"for i in $(seq 2 {LINKED}); do cp -al /d /d$i; done && touch /ready && sleep 600"
    )
    made = _docker(*argv, BUSYBOX_IMAGE, "sh", "-c", fill)
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip()
    remover: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 360
        while _docker("exec", container, "test", "-e", "/ready").returncode != 0:
            assert _state(container) == "running", "the container that writes them ended"
            assert time.monotonic() < deadline, "the files were not written in time"
            time.sleep(0.5)
        env = load_environment(make_env("", name="ours", image=BUSYBOX_IMAGE))
        with spawn_runtime(env) as rt:
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait()
            remover = subprocess.Popen(["docker", "rm", "-f", container])  # "its guardian"
            deadline = time.monotonic() + 60
            while (state := _state(container)) != "removing":
                assert state, "removed before the listing could meet its removal: raise FILES"
                assert time.monotonic() < deadline, f"never seen being removed ({state})"
                time.sleep(0.02)
            rows, _ = environments()
            assert rt.info().id in {row.id for row in rows}
    finally:
        owner.kill()
        owner.wait()
        if remover is not None:
            remover.wait(timeout=300)
        _docker("rm", "-f", container)
