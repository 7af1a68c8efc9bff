"""Which processes belong to a command, read from /proc, and how they are ended: a
command's tree and group, the processes marked by its environment, the guardians that
outlive their owner to clean up after it. Standard library only, Python 3.7+."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple


def stat_fields(pid: int | str) -> List[bytes]:
    """The fields of /proc/PID/stat after the command name, which may hold spaces and
    parentheses (so: split after the last ')'). Field 0 is the state, 1 the parent, 3 the
    session, 19 the start time. Empty when the process is gone or there is no /proc."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as fh:
            stat = fh.read()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2 :].split()


def _pids() -> List[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def _ppid_map() -> Dict[int, int]:
    out: Dict[int, int] = {}
    for pid in _pids():
        fields = stat_fields(pid)
        if len(fields) > 1:
            out[pid] = int(fields[1])
    return out


def descendants(pid: int) -> List[int]:
    """Every live descendant of `pid`, found through /proc (empty where there is no /proc)."""
    children: Dict[int, List[int]] = {}
    for child, parent in _ppid_map().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


SPAWNED_BY = "ORCHESTRATOR_SPAWNED_BY"
"""The variable that marks the engine clients a process starts for its sandboxes (an
executor's or a tether's `docker exec`, a plain command's): PID:START of that process. When
it dies, its guardian (or a reaper) ends what still carries its mark: a `docker exec` into
a gVisor container that was removed never returns, and would outlive it for good."""


def spawn_mark(pid: int, start: str) -> bytes:
    """The environment entry of the clients process `pid` (started at `start`) starts."""
    return ("%s=%d:%s" % (SPAWNED_BY, pid, start)).encode()


_own_mark: List[str] = []  # [pid, start] of this process, once read


def marked_environ() -> Dict[str, str]:
    """This process's environment with its own spawn mark (see SPAWNED_BY), for a client
    it starts for a sandbox (a forked child marks its own with its own pid). The mark comes
    first: a reaper reads only the head of each process's environment (`marked`)."""
    pid = os.getpid()
    if not _own_mark or _own_mark[0] != str(pid):
        _own_mark[:] = [str(pid), process_start(pid)]
    env = {SPAWNED_BY: "%s:%s" % tuple(_own_mark)}
    env.update((k, v) for k, v in os.environ.items() if k != SPAWNED_BY)
    return env


def _environ_of(pid: int, head: int) -> Optional[Tuple[bytes, str]]:
    """The environment of `pid` (its first `head` bytes; 0: all of it) and its start time,
    both of one process: the start is read before and after (None: gone, or another)."""
    start = process_start(pid)
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            data = fh.read(head) if head else fh.read()
    except OSError:
        return None
    if not start or process_start(pid) != start:
        return None
    return data, start


def _marked(
    entries: Tuple[bytes, ...], first: bool, deadline: Optional[float]
) -> List[Tuple[int, str]]:
    """(pid, start) of each process `marked` finds; the pass stops at `deadline`."""
    found: List[Tuple[int, str]] = []
    if not entries:
        return found
    own, wanted = os.getpid(), set(entries)
    heads = tuple(entry + b"\0" for entry in entries)
    head = max(len(entry) for entry in heads) if first else 0
    for pid in _pids():
        if deadline is not None and time.monotonic() > deadline:
            break
        got = None if pid == own else _environ_of(pid, head)
        if got is None:
            continue
        data, start = got
        if data.startswith(heads) if first else not wanted.isdisjoint(data.split(b"\0")):
            found.append((pid, start))
    return found


def marked(*entries: bytes, first: bool = False) -> List[int]:
    """Pids whose environment holds one of `entries` (b"NAME=value"): processes that left a
    command's tree (a `setsid` daemon) still inherit its environment. Only processes whose
    environ we may read are found (our own uid, or any as a privileged user); never this
    process. `first`: only where it is the first variable (as `marked_environ` puts its
    mark), so that only a few bytes of each process's environment are read, however large
    others make theirs."""
    return [pid for pid, _ in _marked(entries, first, None)]


def _kill_same(pid: int, start: str) -> None:
    """SIGKILL `pid` if it is still the process that started at `start`: through a pidfd
    where there is one (the process is pinned once its start is checked again), else by
    pid right after that check."""
    opener = getattr(os, "pidfd_open", None)
    sender = getattr(signal, "pidfd_send_signal", None)
    if opener is not None and sender is not None:
        try:
            fd = opener(pid)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return  # gone
            # (no pidfd here: a seccomp profile, no descriptor left) the check, then the pid
        else:
            try:
                if process_start(pid) == start:
                    sender(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
            return
    if process_start(pid) == start:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def guardian(
    code: str,
    args: List[str],
    log: Optional[str] = None,
    environ: Optional[Dict[str, str]] = None,
) -> "subprocess.Popen[bytes]":
    """Start one of our guardians: `code` run by this interpreter, in a session of its own
    (signals to the caller's process group do not reach it), stdin a pipe only the caller
    holds. From / and with `-P`: nothing in the caller's current folder (a workspace a
    sandbox writes into, say) is on its sys.path, so no file planted there is imported; and
    with this package's folder first on PYTHONPATH, however the package was installed.
    Errors go to `log` (appended), else nowhere. Its variables: `environ` (default: ours)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(log or os.devnull, flags, 0o600), "ab") as err:  # (private)
        return subprocess.Popen(
            [sys.executable, "-P", "-c", code, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd="/",
            env=env,
            start_new_session=True,
        )


def kill_marked(*entries: bytes, within: float = 1.0, first: bool = False) -> None:
    """SIGKILL every process whose environment holds one of `entries` (see `marked`), in
    passes until three in a row find none: a process forking while a pass read /proc has a
    child that pass never saw, and one in the middle of exec() has no environment to read
    for an instant. The first pass reads every process; after `within` seconds, give up,
    in the middle of a later pass too. Each is killed only if it is still the process whose
    environment was read (its start time)."""
    deadline, quiet, passes = time.monotonic() + within, 0, 0
    while passes == 0 or (quiet < 3 and time.monotonic() < deadline):
        found = _marked(entries, first, deadline if passes else None)
        passes += 1
        quiet = 0 if found else quiet + 1
        for pid, start in found:
            _kill_same(pid, start)
        time.sleep(0.02)


def guard_marked(owner: int, start: str, entry: bytes, folder: str) -> None:
    """The local backend's guardian (a `python -c` of its own session, one per runtime):
    block until the runtime is done with (the end of stdin, whose only write end the owner
    holds and closes at cleanup or by dying) or its owner is gone (its pid no longer started
    at `start`: a forked child may hold that end too), then kill every process carrying
    `entry` and remove `folder` (after a cleanup, there is nothing left to find)."""
    ended = threading.Event()

    def read_to_end() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except OSError:
            pass
        ended.set()

    threading.Thread(target=read_to_end, daemon=True).start()
    while not ended.is_set() and alive(owner, start):
        ended.wait(0.5)
    kill_marked(entry, within=5.0)
    remove_tree(folder)


def alive(pid: int, start: str) -> bool:
    """Whether the process `pid` that started at `start` still runs (a zombie does not: it
    waits only for its parent to reap it)."""
    fields = stat_fields(pid)
    return len(fields) > 19 and fields[19].decode() == start and fields[0] != b"Z"


def process_start(pid: int) -> str:
    """Start time of a process in clock ticks since boot ('' when it is gone)."""
    fields = stat_fields(pid)
    return fields[19].decode() if len(fields) > 19 else ""


def remove_tree(folder: str) -> None:
    """Remove a folder whose parts may have been made read-only (write bits given back)."""
    for dirpath, dirnames, _ in os.walk(folder):
        for path in [dirpath, *(os.path.join(dirpath, d) for d in dirnames)]:
            try:
                if not os.path.islink(path):
                    os.chmod(path, os.stat(path).st_mode | 0o700)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)


def kill_tree(pid: int, sig: int, known: Optional[List[int]] = None) -> List[int]:
    """Signal the process group led by `pid` and every descendant; return the pids signalled
    (pass them back as `known` so processes that were reparented meanwhile are not missed)."""
    pids = set(known or []) | set(descendants(pid)) | {pid}
    try:
        os.killpg(pid, sig)
    except OSError:
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    return sorted(pids)
