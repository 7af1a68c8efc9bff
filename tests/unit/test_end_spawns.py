"""What an owner starts for its sandboxes (its engine clients) carries its mark, and goes
when the owner is gone: a `docker exec` into a gVisor sandbox that was removed never
returns, so one left behind by a SIGKILLed owner would run for good (identity.end_spawns,
called by the owner's guardian and by any reaper of its projects)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from orchestrator import procutil
from orchestrator.backends.container.identity import end_spawns, owner_labels


def _marked_sleep(pid: int, start: str) -> subprocess.Popen[bytes]:
    mark = procutil.spawn_mark(pid, start).decode()
    name, value = mark.split("=", 1)
    proc = subprocess.Popen(["sleep", "600"], env={**os.environ, name: value})
    deadline = time.monotonic() + 5
    while not procutil.marked(mark.encode()):  # (its environment is read once it exec'd)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def _dead_owner() -> tuple[int, str]:
    owner = subprocess.Popen(["sleep", "60"])
    start = procutil.process_start(owner.pid)
    owner.kill()
    owner.wait()
    return owner.pid, start


def test_a_dead_owners_marked_clients_are_ended() -> None:
    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)
    try:
        end_spawns(owner_labels(str(pid), start, socket.gethostname()))
        assert client.wait(5) == -9
    finally:
        client.kill()
        client.wait()


def test_a_live_owners_and_another_machines_are_left() -> None:
    me, start = os.getpid(), procutil.process_start(os.getpid())
    pid, dead_start = _dead_owner()
    clients = [_marked_sleep(me, start), _marked_sleep(pid, dead_start)]
    try:
        end_spawns(owner_labels(str(me), start, socket.gethostname()))  # alive
        end_spawns(owner_labels(str(pid), dead_start, "another-machine"))
        end_spawns(owner_labels(str(pid), "1", socket.gethostname()))  # another start
        time.sleep(0.2)
        assert [c.poll() for c in clients] == [None, None]
    finally:
        for client in clients:
            client.kill()
            client.wait()


def test_our_clients_carry_our_mark() -> None:
    env = procutil.marked_environ()
    assert env[procutil.SPAWNED_BY] == f"{os.getpid()}:{procutil.process_start(os.getpid())}"
    assert {k: v for k, v in env.items() if k != procutil.SPAWNED_BY} == dict(os.environ)
