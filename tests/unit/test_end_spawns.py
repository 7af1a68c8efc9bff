"""What an owner starts for its sandboxes (its engine clients) carries its mark, and goes
when the owner is gone: a `docker exec` into a gVisor sandbox that was removed never
returns, so one left behind by a SIGKILLed owner would run for good (identity.end_spawns,
called by the owner's guardian and by any reaper of its projects)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator import procutil
from orchestrator.backends.container import guardian, images, inventory
from orchestrator.backends.container.identity import end_spawns, owner_labels
from orchestrator.errors import DockerError

ROOT = Path(__file__).resolve().parents[2]


def _marked_sleep(pid: int, start: str) -> subprocess.Popen[bytes]:
    mark = procutil.spawn_mark(pid, start).decode()
    name, value = mark.split("=", 1)
    proc = subprocess.Popen(["sleep", "600"], env={name: value, **os.environ})  # first
    # (its environment is read once it exec'd; a bound, not a timing: a loaded run's
    # passes over every process take long)
    deadline = time.monotonic() + 30
    while not procutil.marked(mark.encode(), first=True):
        assert time.monotonic() < deadline, "the marked sleep was never seen"
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


def test_the_mark_comes_first_so_a_pass_reads_a_few_bytes_of_each() -> None:
    assert next(iter(procutil.marked_environ())) == procutil.SPAWNED_BY


@pytest.mark.parametrize("where", ["list_projects", "orphan_folders_of"])
def test_a_guardian_ends_the_clients_even_when_its_removal_fails(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The engine failing the guardian's listing (or its look at the owner's folders) must
    not leave the dead owner's clients running: no reaper names that owner again."""
    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)

    def fails(*_: Any, **__: Any) -> None:
        raise DockerError("the engine did not answer")

    if where == "list_projects":
        monkeypatch.setattr(inventory, "list_projects", fails)
    else:
        monkeypatch.setattr(inventory, "list_projects", lambda *a, **k: [])
        monkeypatch.setattr(inventory, "orphan_folders_of", fails)
    try:
        with pytest.raises(DockerError):
            guardian.remove_owned(owner_labels(str(pid), start, socket.gethostname()))
        assert client.wait(3) == -9
    finally:
        client.kill()
        client.wait()


def _big_stack() -> None:
    resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY,) * 2)


BIG = {f"V{i}": "x" * (128 * 1024 - 16) for i in range(46)}
"""About 6 MiB of variables, as exec allows: what anyone's process may carry."""


def test_a_pass_reads_only_the_head_of_each_environment() -> None:
    """A reaper (root, here) reads every process's environment: twenty processes of 6 MiB
    each made one pass take half a second."""
    heavy = [subprocess.Popen(["sleep", "60"], env=BIG, preexec_fn=_big_stack) for _ in range(20)]
    try:
        mark = procutil.spawn_mark(4242, "777")
        began = time.monotonic()
        procutil.kill_marked(mark, within=5.0, first=True)  # three quiet passes, of heads
        assert time.monotonic() - began < 1.0
    finally:
        for proc in heavy:
            proc.kill()
            proc.wait()


REUSE = """
import os, resource, subprocess, sys, threading, time
from orchestrator.procutil import tree
resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY,) * 2)
def last_pid(n):
    with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
        fh.write(str(n))
last_pid(999)  # slow processes, read after the client
big = {"V%d" % i: "x" * (128 * 1024 - 16) for i in range(46)}
slow = [subprocess.Popen(["sleep", "60"], env=big) for _ in range(15)]
last_pid(99)  # the marked client: read first in a pass
client = subprocess.Popen(["sleep", "60"], env={"ORCHESTRATOR_SPAWNED_BY": "4242:777"})
killer = threading.Thread(
    target=tree.kill_marked, args=(b"ORCHESTRATOR_SPAWNED_BY=4242:777",), kwargs={"within": 2.0}
)
killer.start()
time.sleep(0.05)  # the pass has read the client's environment
client.kill()
client.wait()  # it ends by itself...
last_pid(client.pid - 1)  # ...and its pid is taken again (elsewhere: by wrap-around)
victim = subprocess.Popen(["sleep", "60"])
assert victim.pid == client.pid, (victim.pid, client.pid)
killer.join()
print("victim:", victim.poll())
for proc in slow:
    proc.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a pid namespace of its own needs root")
def test_a_pid_taken_again_between_the_read_and_the_kill_is_spared() -> None:
    """The marked client exits while a pass runs and an unmarked process takes its pid
    (forced in a pid namespace of its own): the kill checks the start time again first."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REUSE],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "victim: None" in done.stdout, done.stdout


def test_the_first_pass_reads_every_process_whatever_the_deadline() -> None:
    """A pass cut at the deadline left the processes it had not come to: after a removal no
    reaper names that owner again, so those would run for good."""
    pid, start = _dead_owner()
    clients = [_marked_sleep(pid, start) for _ in range(3)]
    try:
        procutil.kill_marked(procutil.spawn_mark(pid, start), within=0.0, first=True)
        assert [c.wait(3) for c in clients] == [-9, -9, -9]
    finally:
        for client in clients:
            client.kill()
            client.wait()


def test_without_a_pidfd_the_kill_goes_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """pidfd_open refused (a seccomp profile, no descriptor left): the start is checked,
    then the pid is signalled; only a process that is gone is left."""

    def refused(pid: int, flags: int = 0) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "pidfd_open", refused)
    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)
    try:
        procutil.kill_marked(procutil.spawn_mark(pid, start), within=1.0, first=True)
        assert client.wait(3) == -9
    finally:
        client.kill()
        client.wait()


def test_a_pid_too_large_is_an_owner_not_to_judge() -> None:
    from orchestrator.sandbox.snapshot import owner_alive as record_owner_alive

    huge = "9" * 30
    assert record_owner_alive({"host": socket.gethostname(), "pid": huge, "start": "1"})
    end_spawns(owner_labels(huge, "1", socket.gethostname()))  # (no error)


def test_a_guardian_ends_the_clients_before_its_slower_engine_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The folders' and records' reaps after the removal each ask the engine, which may take
    its whole timeout: the dead owner's clients are ended before them, not after."""
    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)
    seen: list[int | None] = []

    def look(*_: Any, **__: Any) -> list[str]:
        seen.append(client.poll())
        return []

    monkeypatch.setattr(inventory, "list_projects", lambda *a, **k: [])
    monkeypatch.setattr(inventory, "orphan_folders_of", look)
    try:
        guardian.remove_owned(owner_labels(str(pid), start, socket.gethostname()))
        assert seen == [-9]
    finally:
        client.kill()
        client.wait()


def test_a_down_of_a_dead_owners_project_ends_its_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`down ID` of a project whose owner was SIGKILLed (no guardian: ORCHESTRATOR_GUARDIAN=0)
    left that owner's clients running: no reaper names the owner once its project is gone."""
    from orchestrator.backends.container.identity import LABEL_PROJECT
    from orchestrator.backends.container.projects import ProjectInfo

    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)
    labels = {**owner_labels(str(pid), start, socket.gethostname()), LABEL_PROJECT: "orch-t-1"}
    info = ProjectInfo("orch-t-12345678", labels, [], [])
    removed: list[str] = []
    monkeypatch.setattr(inventory, "elsewhere", lambda: {})
    monkeypatch.setattr(inventory, "list_projects", lambda *a, **k: [info])
    monkeypatch.setattr(inventory, "remove_project", lambda p, e=None: removed.append(p.name))
    monkeypatch.setattr(images, "reap_orphans", lambda *a, **k: [])
    try:
        assert inventory.remove_by_id("orch-t-12345678") == "orch-t-12345678"
        assert removed == ["orch-t-12345678"] and client.wait(3) == -9
    finally:
        client.kill()
        client.wait()


def test_a_reap_of_a_dead_owners_folder_ends_its_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder whose project the engine no longer lists (a Swarm stack's, say) is reaped
    without any project of it: its dead creator's clients go with it."""
    from orchestrator.backends.container import reaping

    pid, start = _dead_owner()
    client = _marked_sleep(pid, start)
    folder = tmp_path / "orch-t-87654321"
    folder.mkdir()
    (folder / "owner").write_text(f"{pid} {start} {socket.gethostname()}\n")
    reaped: list[Path] = []
    monkeypatch.setattr(reaping, "orphan_folders", lambda live: [folder])
    monkeypatch.setattr(reaping, "folder_backend", lambda f: "swarm")
    monkeypatch.setattr(reaping, "reap_folder", reaped.append)
    try:
        assert reaping._reap_folders(set(), None, {}, []) == [folder.name]
        assert reaped == [folder] and client.wait(3) == -9
    finally:
        client.kill()
        client.wait()
