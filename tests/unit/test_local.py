"""The local backend keeps the leak rules too (no Docker needed)."""

from __future__ import annotations

import gc
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import load_environment_text, procutil, spawn_runtime
from orchestrator.services.admission import Admission


def running(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_daemons_that_left_the_command_tree_die_at_cleanup(tmp_path: Path) -> None:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    seconds = str(30000 + uuid.uuid4().int % 9999)
    with spawn_runtime(env) as rt:
        # a new session, reparented away from us: no process tree leads to it any more
        r = rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null & echo ok", timeout=10)
        assert r.stdout == "ok\n"
        time.sleep(0.3)
        assert running(f"sleep\0{seconds}"), "the daemon did not start"
    deadline = time.monotonic() + 5
    while running(f"sleep\0{seconds}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(f"sleep\0{seconds}") == []


def test_poll_reports_what_is_not_what_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = load_environment_text(
        "version: 1\nname: l\nbackend: local\n", source="l.yaml", base_dir=tmp_path
    )
    seconds = str(30000 + uuid.uuid4().int % 9999)
    with spawn_runtime(env) as rt:
        rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null &", timeout=10)
        with monkeypatch.context() as m:  # a kill that misses: the daemon lives on
            m.setattr(os, "kill", lambda pid, sig: None)
            m.setattr(signal, "pidfd_send_signal", lambda fd, sig, *rest: None)
            m.setattr(procutil, "kill_tree", lambda pid, sig, known=None: [])
            rt.kill()
        time.sleep(0.3)
        assert running(f"sleep\0{seconds}") and rt.poll() is None
        rt.kill()
        deadline = time.monotonic() + 5
        while rt.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rt.poll() == 137 and running(f"sleep\0{seconds}") == []


def test_no_container_filesystem_to_snapshot_or_resume(tmp_path: Path) -> None:
    from dataclasses import replace

    from orchestrator import UsageError

    env = load_environment_text("version: 1\nname: fs\nbackend: local\n")
    with spawn_runtime(env) as rt:
        with pytest.raises(UsageError, match="no container filesystem"):
            rt.snapshot(tmp_path / "s.tar", filesystem=True)
        snap = rt.snapshot(tmp_path / "s.tar")
    with pytest.raises(UsageError, match="only the docker backend resumes"):
        spawn_runtime(env, resume=replace(snap, image="orchestrator-snapshot:x"))


def test_a_snapshot_replaces_a_snapshot_and_never_a_suspended_record() -> None:
    """A snapshot saved under a name taken replaced whatever record held it: a suspended
    environment's or a checkpoint's too, whose images (naming that record) no reap then
    took. A snapshot replaces only a snapshot now; the others are refused, kept whole."""
    import json

    from orchestrator import Snapshot, UsageError
    from orchestrator.sandbox.snapshot import snapshots_dir

    env = load_environment_text("version: 1\nname: again\nbackend: local\n")
    with spawn_runtime(env) as rt:
        rt.write_file("a.txt", "first")
        first = rt.snapshot("again-snap")
        rt.write_file("a.txt", "second")
        assert rt.snapshot("again-snap").path == first.path  # a snapshot: replaced
        held = json.loads(first.record.read_text()) | {"suspended": True}
        first.record.write_text(json.dumps(held))
        before = first.record.read_bytes(), first.path.read_bytes()
        with pytest.raises(UsageError, match="does not replace"):
            rt.snapshot("again-snap")
    assert (first.record.read_bytes(), first.path.read_bytes()) == before
    assert not list(snapshots_dir().glob("*.pending"))
    Snapshot.find("again-snap").remove()


def test_a_runtime_dropped_without_cleanup_leaves_nothing() -> None:
    """Collected without `with` or cleanup(): its processes and its folder go all the same."""
    rt = spawn_runtime(load_environment_text("version: 1\nname: dropped\nbackend: local\n"))
    seconds = str(30000 + uuid.uuid4().int % 9999)
    rt.execute(f"setsid sleep {seconds} >/dev/null 2>&1 < /dev/null &", timeout=10)
    token = f"sleep\0{seconds}"
    folder = Path(rt.info().workdir).parent
    deadline = time.monotonic() + 5
    while not running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert folder.is_dir() and running(token)
    del rt
    gc.collect()
    assert not folder.exists()
    deadline = time.monotonic() + 5
    while running(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(token)


_OWNER = """
import os, sys, time
from orchestrator import load_environment_text, spawn_runtime
env = load_environment_text("version: 1\\nname: l\\nbackend: local\\n", source="l.yaml")
os.chdir({cwd!r})  # the owner's current folder: where a sandbox might have written
rt = spawn_runtime(env)
r = rt.execute("setsid sleep {seconds} >/dev/null 2>&1 < /dev/null & sleep {seconds} & echo ok")
print(rt.workdir, flush=True)
time.sleep(300)
"""


_FORKER = """
import gc, os, sys, threading, time
from orchestrator import UsageError, load_environment_text, spawn_runtime
from orchestrator.services.ledger import Ledger
def daemon():
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"sleep\\x00{seconds}" in open(f"/proc/{{p}}/cmdline", "rb").read():
                return True
        except OSError:
            pass
    return False
def admitted():
    with Ledger().locked():
        return len([t for t in Ledger().read() if t.pid == os.getpid() and t.admitted])
env = load_environment_text("version: 1\\nname: l\\nbackend: local\\n", source="l.yaml")
rt = spawn_runtime(env)
rt.execute("setsid sleep {seconds} >/dev/null 2>&1 < /dev/null & echo ok")
deadline = time.monotonic() + 10
while not daemon() and time.monotonic() < deadline:
    time.sleep(0.05)
before = admitted()
for how in ("drops it", "exits", "leaves a with block", "uses it", "forked under a lock"):
    held, go = threading.Event(), threading.Event()
    if how == "forked under a lock":  # another thread of the owner holds the ledger's lock
        def hold():
            with Ledger().locked():
                held.set()
                go.wait()
        threading.Thread(target=hold).start()
        held.wait()
    pid = os.fork()
    if pid == 0:  # the child ends normally: its finalizers and atexit hooks run
        if how == "drops it":
            del rt
            gc.collect()
        elif how == "leaves a with block":
            with rt:
                pass
        elif how == "uses it":
            try:
                rt.execute("echo from-child")
                os._exit(3)
            except UsageError:
                pass
        elif how == "forked under a lock":
            time.sleep(60)  # while it lives, the owner must still take the lock
        sys.exit(0)
    if how == "forked under a lock":
        go.set()
        with Ledger().locked(deadline=time.monotonic() + 10):
            pass
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    assert how == "forked under a lock" or status == 0, (how, status)
time.sleep(0.2)
alive = rt.execute("echo alive").stdout.strip()
print(os.path.isdir(rt.workdir), alive, daemon(), before, admitted(), flush=True)
rt.cleanup()
"""


def test_a_forked_child_leaves_its_parents_runtime_alone() -> None:
    """A child forked from the owner holds a copy of its runtime: whether it drops it, just
    exits, leaves a `with` block or tries to run a command (UsageError), the parent's
    runtime goes on (folder, daemons, commands, its admission), and a lock another thread
    held at the fork is not held by the child."""
    import subprocess
    import sys

    seconds = str(30000 + uuid.uuid4().int % 9999)
    done = subprocess.run(
        [sys.executable, "-c", _FORKER.format(seconds=seconds)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "alive", "True", "1", "1"], done.stdout
    deadline = time.monotonic() + 5
    while running(f"sleep\0{seconds}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running(f"sleep\0{seconds}") == [], "the parent's cleanup left its daemon"


_FED_FORK = """
import os, threading, time
from orchestrator import load_environment_text, spawn_runtime
children = []
def fork():  # while the command sleeps, its 4 MB input waits in the pipe, being fed
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
env = load_environment_text("version: 1\\nname: fed\\nbackend: local\\n")
try:
    with spawn_runtime(env) as rt:
        threading.Timer(0.5, fork).start()
        done = rt.execute(["sh", "-c", "sleep 2; wc -c"], stdin=b"x" * (4 << 20), timeout=15)
        print(len(children), done.exit_code, done.timed_out, done.stdout, flush=True)
finally:
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
"""


def test_a_child_forked_while_a_command_is_fed_does_not_hold_its_input_open() -> None:
    """A child forked (multiprocessing's fork, say) while a local command's stdin is being
    fed gets a copy of that pipe's write end. The command must still see the end of its
    input when the parent is done feeding, not when that child exits (here: after the
    command's own timeout)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FED_FORK], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "0", "False", str(4 << 20)], done.stdout


def test_a_failed_removal_is_tried_again_by_the_next_cleanup_and_frees_its_admission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cleanup() whose removal raised leaves the runtime closed to calls and its admission
    released (a failing engine must not hold back every later spawn); the exit's safety net
    does not wait on it again (the guardian removes what is left); the next cleanup() tries
    the removal again, and once done never again."""
    from orchestrator import RuntimeClosed
    from orchestrator.sandbox import base

    rt = spawn_runtime(load_environment_text("version: 1\nname: retried\nbackend: local\n"))
    folder = Path(rt.workdir)
    real_close, tries = rt._close, []

    def close_once_failing() -> None:
        tries.append(1)
        if len(tries) == 1:
            raise OSError("the first removal fails")
        real_close()

    monkeypatch.setattr(rt, "_close", close_once_failing)
    with pytest.raises(OSError):
        rt.cleanup()
    with pytest.raises(RuntimeClosed):
        rt.execute("true")
    held = rt._hold
    assert held is None or (isinstance(held, Admission) and held._released)
    base._cleanup_at_exit()
    assert len(tries) == 1 and folder.exists()
    rt.cleanup()
    assert len(tries) == 2 and not folder.exists()
    rt.cleanup()
    assert len(tries) == 2  # done: never again


PLANTED = "open({out!r}, 'w').write('ran'); raise SystemExit(3)\n"
"""What a sandbox could leave in the owner's current folder for the guardian to import."""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGKILL of its process group", "planted files"])
def test_an_owner_killed_outright_leaves_no_process_and_no_folder(how: str, tmp_path: Path) -> None:
    """A harness killed by SIGKILL runs no cleanup, finalizer or atexit hook: the runtime's
    guardian (a process of its own session) kills what its commands left running, daemons
    included, and removes its folder. Modules planted in the owner's current folder are
    never imported by it."""
    import signal
    import subprocess
    import sys

    seconds = str(30000 + uuid.uuid4().int % 9999)
    ran = tmp_path / "ran"
    if how == "planted files":
        for name in ("selectors.py", "threading.py", "shutil.py", "orchestrator.py"):
            (tmp_path / name).write_text(PLANTED.format(out=str(ran)))
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER.format(seconds=seconds, cwd=str(tmp_path))],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert owner.stdout is not None
        workdir = Path(owner.stdout.readline().strip())
        deadline = time.monotonic() + 10
        while len(running(f"sleep\0{seconds}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(running(f"sleep\0{seconds}")) == 2 and workdir.is_dir()
    finally:
        if how == "SIGKILL of its process group":
            os.killpg(owner.pid, signal.SIGKILL)
        else:
            owner.kill()
        owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
    deadline = time.monotonic() + 10
    while (running(f"sleep\0{seconds}") or workdir.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running(f"sleep\0{seconds}") == [], "a command of the dead owner still runs"
    assert not workdir.exists(), "the dead owner's folder is still there"
    assert not ran.exists(), "the guardian imported a module planted in the owner's folder"
