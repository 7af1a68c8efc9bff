"""Checkpoints and forks with memory (backends/docker/memory.py, docs/fork.md): a gVisor
sandbox with no network saved with its processes, memory and tmpfs; copies whose processes
run on from that instant, independently; the original running on. And what is refused: a
memory image changed after it was saved (or swapped for a link), a sandbox with a network,
and a backend without gVisor."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import (
    OrchestratorError,
    UsageError,
    fork,
    list_snapshots,
    procutil,
    spawn_runtime,
    wake,
)
from orchestrator.backends.docker import memory
from orchestrator.sandbox.base import Runtime
from orchestrator.sandbox.snapshot import Snapshot
from tests.conftest import labelled_ids, main_container
from tests.docker.conftest import MakeEnv, engine_events, killed_owner

pytestmark = pytest.mark.docker
CLI = [sys.executable, "-m", "orchestrator"]

SEALED = """\
isolation: gvisor
network: {egress: none}
setup:
  commands: ['echo setup >> setup.log']
  resume_commands: ['echo resumed >> setup.log']
"""

# a counter, and a value only its memory holds, which it writes out on SIGUSR1
HOLDER = r"""
import os, signal, time
secret = os.urandom(8).hex()
def say(*_):
    with open('/tmp/said.part', 'w') as fh:
        fh.write(secret)
    os.rename('/tmp/said.part', '/tmp/said')
signal.signal(signal.SIGUSR1, say)
open('/tmp/holder.pid', 'w').write(str(os.getpid()))
i = 0
while True:
    i += 1
    with open('/tmp/count.part', 'w') as fh:
        fh.write(str(i))
    os.rename('/tmp/count.part', '/tmp/count')
    time.sleep(0.02)
"""


def count(rt: Runtime) -> int:
    return int(rt.execute(["cat", "/tmp/count"], check=True).stdout)


def remembered(rt: Runtime) -> str:
    """The value the holder keeps in its memory, asked of it now."""
    rt.execute("rm -f /tmp/said && kill -USR1 $(cat /tmp/holder.pid)", check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = rt.execute("cat /tmp/said 2>/dev/null").stdout
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("the holder did not answer")


def start_holder(rt: Runtime) -> None:
    rt.write_file("holder.py", HOLDER)
    rt.execute("python3 holder.py >/dev/null 2>&1 &", check=True)
    deadline = time.monotonic() + 20
    while rt.execute("test -s /tmp/count").exit_code != 0:
        assert time.monotonic() < deadline, "the holder did not start"
        time.sleep(0.05)


def test_fork_carries_processes_and_memory_into_copies_that_run_apart(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    before = labelled_ids()
    snaps = {s.name for s in list_snapshots()}
    with spawn_runtime(make_env(SEALED, name="memfork")) as rt:
        assert rt.memory_refusal() is None
        start_holder(rt)
        secret = remembered(rt)
        rt.write_file("work.txt", "mine\n")
        copies = fork(rt, 2)  # (two show copies apart from each other and the original)
        try:
            saved_at = min(count(c) for c in copies)
            for n, copy in enumerate(copies):
                assert not copy.warnings, copy.warnings
                assert remembered(copy) == secret  # in its memory, not in any file
                # no setup ran: its processes run on, as they were
                assert copy.execute("cat work.txt setup.log").stdout == "mine\nsetup\n"
                copy.write_file("work.txt", f"copy {n}\n")
            # each counts on from where it was saved, on its own
            first = [count(c) for c in copies]
            time.sleep(0.5)
            later = [count(c) for c in copies]
            assert all(b > a for a, b in zip(first, later, strict=True)), (first, later)
            copies[0].execute("kill $(cat /tmp/holder.pid)", check=True)
            time.sleep(0.3)
            stopped = count(copies[0])
            time.sleep(0.3)
            assert count(copies[0]) == stopped
            assert count(copies[1]) > later[1] and count(rt) > saved_at  # the others run on
            assert [c.read_file("work.txt") for c in copies] == ["copy 0\n", "copy 1\n"]
            assert rt.read_file("work.txt") == "mine\n"
            assert remembered(rt) == secret
            assert len({rt.info().id, *(c.info().id for c in copies)}) == 3
        finally:
            for copy in copies:
                copy.cleanup()
    assert labelled_ids() <= before
    assert {s.name for s in list_snapshots()} == snaps


def test_a_checkpoint_with_memory_is_private_and_refused_once_changed(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    before = labelled_ids()
    with spawn_runtime(make_env(SEALED, name="memrec")) as rt:
        start_holder(rt)
        saved = rt.checkpoint(memory=True)
        try:
            assert saved.memory and rt.execute("true").ok  # the original runs on
            folder = saved.memory_folder
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            for name in saved.memory:
                assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
            record = json.loads(saved.record.read_text())
            assert record["memory"] == saved.memory
            # a copy wakes from it, and runs on from it
            copy = wake(saved.name, keep_record=True)
            try:
                assert count(copy) > 0 and not copy.warnings
            finally:
                copy.cleanup()
            # one byte changed: refused before anything starts from it
            image = folder / sorted(saved.memory)[0]
            data = bytearray(image.read_bytes())
            data[len(data) // 2] ^= 0xFF
            image.write_bytes(bytes(data))
            with pytest.raises(UsageError, match="changed since it was saved"):
                wake(saved.name, keep_record=True)
            # a link in its place: refused, and what it names is never read
            image.unlink()
            image.symlink_to("/etc/shadow")
            with pytest.raises(UsageError, match="cannot read the memory image"):
                wake(saved.name, keep_record=True)
        finally:
            Snapshot.find(saved.name).remove()
        assert not folder.exists()
    assert labelled_ids() <= before


def test_a_copy_is_forked_again_and_the_original_saved_again(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    """A sandbox that was itself started from a checkpoint (every copy, and the original
    after its first save) is saved again: a search goes as deep as it likes."""
    before = labelled_ids()
    with spawn_runtime(make_env(SEALED, name="memtwice")) as rt:
        start_holder(rt)
        secret = remembered(rt)
        (copy,) = fork(rt, 1)
        made = [copy]
        try:
            (grandchild,) = fork(copy, 1)
            made.append(grandchild)
            (again,) = fork(rt, 1)
            made.append(again)
            for one in (rt, *made):
                assert not one.warnings, one.warnings
                assert remembered(one) == secret
                seen = count(one)
                deadline = time.monotonic() + 10
                while count(one) <= seen:  # it runs on
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
        finally:
            for one in made:
                one.cleanup()
    assert labelled_ids() <= before


def test_a_save_given_up_at_its_deadline_leaves_the_sandbox_running(
    make_env: MakeEnv, sealed_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runsc killed at its deadline while the sandbox still saves 200 MB: the sandbox stops
    once saved, and is started again from what it saved; nothing of the record is left. (A
    runsc killed before it began, as a loaded machine starts it late, leaves the sandbox
    running as it was: the deadline grows until one save began.)"""
    before = labelled_ids()
    snaps = {s.name for s in list_snapshots()}
    with spawn_runtime(make_env(SEALED, name="memslow")) as rt:
        start_holder(rt)
        secret = remembered(rt)
        rt.execute("head -c 200000000 /dev/urandom > /tmp/ballast", check=True)
        restarted = False
        for seconds in (0.2, 0.4, 0.8):
            started = started_at(rt)
            monkeypatch.setattr(memory, "checkpoint_seconds", functools.partial(float, seconds))
            with pytest.raises(OrchestratorError, match="timed out"):
                rt.checkpoint(memory=True)
            monkeypatch.undo()
            restarted = started_at(rt) != started  # it stopped once saved, and started again
            assert remembered(rt) == secret  # the same process, memory and all
            seen = count(rt)
            deadline = time.monotonic() + 10
            while count(rt) <= seen:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            if restarted:
                break
        assert restarted, "no save began within 0.8 s"
    assert {s.name for s in list_snapshots()} == snaps
    assert labelled_ids() <= before


def test_a_save_gvisor_cannot_make_says_why_and_that_the_sandbox_stopped(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    """A program replaced while a process runs it (an upgrade of a running server's binary;
    or a root sandbox on purpose): this runsc cannot save the deleted file it still holds,
    stops the sandbox, and leaves no image to start it again from. The error said the last
    4 KiB of a Go stack trace, and nothing of the sandbox being gone (docs/fork.md said the
    original runs on). It says why, on one line, and that the sandbox stopped. (A runsc that
    saves it: the original runs on.)"""
    before = labelled_ids()
    snaps = {s.name for s in list_snapshots()}
    with spawn_runtime(make_env(SEALED + "user: root\n", name="memgone")) as rt:
        rt.execute("setsid sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 </dev/null &")
        replace = "r=$(readlink -f /bin/sh) && cp $r /tmp/sh && rm -f $r && cp /tmp/sh $r"
        rt.execute(replace, check=True)
        try:
            saved = rt.checkpoint(memory=True)
        except OrchestratorError as exc:
            said = str(exc)
            assert "deleted while in use" in said and "sandbox stopped" in said, said
            assert "\n" not in said and len(said) < 2000 and "goroutine" not in said, said
            with pytest.raises(OrchestratorError, match="not running"):
                rt.execute("true")
        else:
            saved.remove()
            assert rt.execute("echo on").stdout == "on\n"
    assert {s.name for s in list_snapshots()} == snaps
    assert labelled_ids() <= before


def test_two_saves_at_once_take_turns(make_env: MakeEnv, sealed_engine: str) -> None:
    with spawn_runtime(make_env(SEALED, name="memtwo")) as rt:
        start_holder(rt)
        secret = remembered(rt)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            saves = [pool.submit(rt.checkpoint, memory=True) for _ in range(2)]
            made = [f.result(timeout=300) for f in saves]
        try:
            assert len({m.name for m in made}) == 2 and all(m.memory for m in made)
            assert remembered(rt) == secret
        finally:
            for m in made:
                m.remove()


def _unpacked() -> set[str]:
    """The folders containerd unpacked images into to start containers from them, now."""
    return {
        os.path.join(where, name)
        for where in memory._containerd_temps()
        for name in os.listdir(where)
        if name.startswith(memory.UNPACKED)
    }


def test_no_unpacked_memory_image_is_left_on_the_host(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    """containerd unpacks the image of every start from a checkpoint into a folder of its
    own temporary folder (/tmp) and never removes it: a whole memory image (193 MB, once)
    stayed on the host's disk for every copy forked, and for the original's restart. Each
    restore now removes its own (other workers' restores remove theirs within moments)."""
    before = _unpacked()
    with spawn_runtime(make_env(SEALED, name="memtidy")) as rt:
        start_holder(rt)
        copies = fork(rt, 2)
        for copy in copies:
            copy.cleanup()
    deadline = time.monotonic() + 120
    while (left := _unpacked() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, sorted(left)


def starts(events: list[dict[str, object]], rt: Runtime) -> list[str]:
    """What the engine's events said of `rt`'s main container, in order."""
    name, out = main_container(rt), []
    for event in events:
        actor = event.get("Actor")
        attributes = actor.get("Attributes") if isinstance(actor, dict) else None
        if isinstance(attributes, dict) and attributes.get("name") == name:
            out.append(str(event["Action"]))
    return out


TICKS = """
import time
while True:
    with open("ticks", "a") as fh:
        fh.write("x")
    time.sleep(0.005)
"""
"""A process writing into the workspace (its working folder) all the time."""
OWNERS = """
import os, stat, sys
for name in sys.argv[1:]:
    st = os.lstat(name)
    kind = [k for k in ("REG", "FIFO", "LNK", "DIR") if getattr(stat, "S_IS" + k)(st.st_mode)]
    print(st.st_uid, *kind, name)
"""
"""Each named file's owner and kind, as the sandbox sees them (this runsc has no statx)."""


def test_a_copy_starts_once_from_its_memory_with_its_workspace_as_it_was(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    """A copy with memory is started once, from its memory, its workspace put in by the
    engine before (memory.first_start): never booted first only for its workspace, then
    stopped. The workspace is the original's: each file's owner, a FIFO, a link to a path
    only the sandbox resolves, a folder root made."""
    with spawn_runtime(make_env(SEALED + "user: '1000:1000'\n", name="memonce")) as rt:
        start_holder(rt)
        rt.write_file("mine.txt", "mine\n")
        rt.write_file("tick.py", TICKS)  # (its processes run on in the workspace at once)
        rt.execute("python3 tick.py >/dev/null 2>&1 &", check=True)
        rt.execute(
            "echo root > roots.txt; mkfifo pipe; ln -s /etc/hostname far; mkdir -p d/e;"
            " echo deep > d/e/f",
            user="root",
            check=True,
        )
        with engine_events("start", "die") as events:
            copies = fork(rt, 1)
        try:
            (copy,) = copies
            assert not copy.warnings, copy.warnings
            assert starts(events, copy) == ["start"]
            said = copy.execute(
                ["python3", "-c", OWNERS, "mine.txt", "roots.txt", "pipe", "far", "d/e/f"]
            )
            assert said.stdout.splitlines() == [
                "1000 REG mine.txt",
                "0 REG roots.txt",
                "0 FIFO pipe",
                "0 LNK far",
                "0 REG d/e/f",
            ], said
            copy.write_file("mine.txt", "the copy's\n")  # its user writes its own files
            assert copy.read_file("mine.txt") == "the copy's\n"
            assert rt.read_file("mine.txt") == "mine\n"
            before = count(copy), len(copy.read_file("ticks"))
            time.sleep(0.3)
            assert count(copy) > before[0]  # the holder runs on in it
            assert len(copy.read_file("ticks")) > before[1]  # and the workspace was its own
        finally:
            for copy in copies:
                copy.cleanup()


@pytest.mark.parametrize("climbing", [False, True], ids=["engine-unpacks", "sandbox-unpacks"])
def test_a_workspace_of_links_fifos_and_devices_plants_nothing_on_the_host(
    make_env: MakeEnv, sealed_engine: str, tmp_path: Path, climbing: bool
) -> None:
    """Root in the sandbox fills its workspace with a link to a host file, a FIFO and
    device nodes (gVisor refuses mknod in a host folder: the check on the host holds
    whichever way that goes), and maybe a link that climbs out of the workspace, then is
    forked with its memory: the host's files are untouched, and no copy's workspace on the
    host holds a device node or a link that was followed. Without the climbing link the
    engine unpacks the copy's workspace before it starts (one start); with it, the copy
    starts first and its own tar unpacks it (memory.first_start says no)."""
    victim = tmp_path / "victim"
    victim.write_text("host's own\n")
    body = SEALED + "user: '0:0'\n"
    with spawn_runtime(make_env(body, name="memhostile")) as rt:
        start_holder(rt)
        rt.execute(
            f"ln -s {victim} to-host; mkfifo pipe;"
            " mknod null-dev c 1 3 2>/dev/null; mknod disk b 8 0 2>/dev/null; true",
            check=True,
        )
        if climbing:
            rt.execute("ln -s ../../.. up", check=True)
        with engine_events("start", "die") as events:
            copies = fork(rt, 1)  # (what a copy plants on the host, one copy shows)
        try:
            for copy in copies:
                assert not copy.warnings, copy.warnings
                assert len(starts(events, copy)) == (3 if climbing else 1), starts(events, copy)
                assert copy.execute("readlink to-host").stdout.strip() == str(victim)
                copy.execute(f"echo planted > to-host; echo planted > {victim}")
                folder = copy._host_workspace()
                assert folder is not None and folder.is_dir()
                for entry in folder.rglob("*"):
                    mode = entry.lstat().st_mode
                    assert not (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)), entry
                assert os.readlink(folder / "to-host") == str(victim)  # a link, not a copy
        finally:
            for copy in copies:
                copy.cleanup()
    assert victim.read_text() == "host's own\n"


OWNER = """
import os, sys, time
from orchestrator import fork, procutil, spawn_runtime
rt = spawn_runtime(sys.argv[1])
rt.execute("sleep 600 >/dev/null 2>&1 &", check=True)
copies = fork(rt, 2)
mark = procutil.spawn_mark(os.getpid(), procutil.process_start(os.getpid())).decode()
assert procutil.marked(mark.encode()), "the executors' engine clients carry no mark"
print(rt.info().id, " ".join(c.info().id for c in copies), mark, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_owners_forks_are_removed(make_env: MakeEnv, sealed_engine: str) -> None:
    """...and so are the engine clients it ran them through: its executors' `docker exec`
    into a gVisor sandbox that was removed never returned, orphans for good."""
    before = labelled_ids()
    path = make_env(SEALED, name="memowner")
    original, *made, mark = killed_owner(OWNER, str(path))
    assert len(made) == 2, "the owner did not fork"
    deadline = time.monotonic() + 60
    while any(f"{one}-main-1" in running_names() for one in made):
        assert time.monotonic() < deadline, "the dead owner's forks are still there"
        time.sleep(0.3)  # its guardians remove them within a second or so
    while left := clients_of([original, *made]):
        assert time.monotonic() < deadline, f"the dead owner's engine clients run on: {left}"
        time.sleep(0.3)
    assert not procutil.marked(mark.encode())
    while not labelled_ids() <= before:  # and the images they ran (no reap of ours here)
        assert time.monotonic() < deadline, f"left: {labelled_ids() - before}"
        time.sleep(0.3)


def clients_of(projects: list[str]) -> list[str]:
    """The command lines of our processes that name one of `projects` (engine clients)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(name in word for word in words for name in projects):
                found.append(" ".join(words))
    return found


def running_names() -> str:
    argv = ["docker", "ps", "-a", "--format", "{{.Names}}"]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def test_static_assets_come_back_in_copies_forked_by_the_process_that_started_it(
    make_env: MakeEnv, sealed_engine: str, tmp_path: Path
) -> None:
    """A static asset is a pinned host folder, which only the descriptor of the process
    that started the sandbox names: that process forks it with its memory, and each copy
    (and the original, started again) mounts it; another process (the CLI, attached) is
    refused with the reason, and its fork copies files."""
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "given.txt").write_text("given\n")
    body = SEALED + "static_assets: [{name: a, path: assets, save_path: a}]\n"
    env = make_env(body, name="memstatic")
    with spawn_runtime(env) as rt:
        start_holder(rt)
        secret = remembered(rt)
        where = rt.static_path("a")
        copies = fork(rt, 1)  # (a copy, and the original started again)
        try:
            for one in (rt, *copies):
                assert not one.warnings, one.warnings
                assert one.execute(f"cat {where}/given.txt").stdout == "given\n"
                assert remembered(one) == secret
        finally:
            for copy in copies:
                copy.cleanup()
    ident = cli_up(env)
    made: list[str] = []
    try:
        refused = subprocess.run(
            [*CLI, "fork", ident, "--memory"], capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 2 and "from that process" in refused.stderr, refused.stderr
        files = subprocess.run([*CLI, "fork", ident], capture_output=True, text=True, timeout=180)
        assert files.returncode == 0 and "no memory carried" in files.stderr, files.stderr
        made = [line.split()[0] for line in files.stdout.splitlines() if line.strip()]
    finally:
        for gone in [*made, ident]:
            subprocess.run([*CLI, "down", gone], capture_output=True, timeout=120, check=False)


def started_at(rt: Runtime) -> str:
    """When the engine last started the main container."""
    argv = ["docker", "inspect", "-f", "{{.State.StartedAt}}", main_container(rt)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout


def cli_up(env: Path) -> str:
    """`orchestrator up FILE`: the id it prints."""
    up = subprocess.run([*CLI, "up", str(env)], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    return up.stdout.split()[0]


def test_memory_is_refused_with_its_reason_where_it_cannot_be_kept(make_env: MakeEnv) -> None:
    body = "setup:\n  resume_commands: ['true']\n"
    with spawn_runtime(make_env(body, name="memrunc")) as rt:
        why = rt.memory_refusal()
        assert why is not None and "gVisor" in why
        with pytest.raises(UsageError, match="no checkpoint with memory"):
            rt.checkpoint(memory=True)
        with pytest.raises(UsageError, match="no fork with memory"):
            fork(rt, 1, memory=True)
        (copy,) = fork(rt, 1)  # the default: its files, said so
        try:
            assert any("no memory carried" in w for w in copy.warnings), copy.warnings
        finally:
            copy.cleanup()


def test_a_sandbox_with_a_network_is_not_saved_with_memory(
    make_env: MakeEnv, sealed_engine: str
) -> None:
    body = "isolation: gvisor\nnetwork: {egress: all}\n"
    with spawn_runtime(make_env(body, name="memnet")) as rt:
        why = rt.memory_refusal()
        assert why is not None and "no network" in why


def test_cli_checkpoint_memory_and_fork(make_env: MakeEnv, sealed_engine: str) -> None:
    before = labelled_ids()
    env = make_env(SEALED, name="memcli")
    ident = cli_up(env)
    made: list[str] = []
    try:
        start = subprocess.run(
            [*CLI, "exec", ident, "--", "sh", "-c", "echo 41 > /tmp/kept"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert start.returncode == 0, start.stderr
        got = subprocess.run(
            [*CLI, "fork", ident, "-n", "2", "--memory"],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert got.returncode == 0, got.stderr
        made = [line.split()[0] for line in got.stdout.splitlines() if line.strip()]
        assert len(made) == 2
        for copy in made:
            said = subprocess.run(
                [*CLI, "exec", copy, "--", "cat", "/tmp/kept"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert said.stdout == "41\n", said.stderr  # its tmpfs, in memory, carried
        refused = subprocess.run(
            [*CLI, "checkpoint", ident, "--memory", "-o", "/nonexistent/../x"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
    finally:
        for one in [*made, ident]:
            subprocess.run([*CLI, "down", one], capture_output=True, timeout=120, check=False)
    assert labelled_ids() <= before
    assert not any(Path(s.memory_folder).exists() for s in list_snapshots() if s.env == "memcli")
