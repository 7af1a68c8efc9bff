"""Run one command as its own process group and pump its output; kill the whole tree on
timeout. Standard library only, Python 3.7+: this file is also copied into containers, where
the executor imports it, so the local backend and the Docker backend share these rules.

Rules kept here:
- each command starts a new session (its own process group);
- on timeout: SIGTERM to the group and to every descendant found in /proc (also those that
  left the group), then SIGKILL after a short grace;
- a process killed by signal N reports 128+N;
- after the main process exits, output is drained briefly; a background process that keeps
  the pipes open does not hold the call (it keeps running, its pipes are closed on our side).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, Generator, Iterable, List, Optional, Tuple

GRACE = 0.5
"""Seconds between SIGTERM and SIGKILL on timeout."""
DRAIN = 0.1
"""Seconds of pipe silence, after the main process exited, before we stop reading."""
DRAIN_MAX = 2.0
"""Longest we keep reading after the main process exited (a background writer)."""
CHUNK = 65536

Outcome = Tuple[int, bool, float]
"""(exit code, timed out, elapsed seconds)."""


def exit_status(returncode: int) -> int:
    """Popen's -N for "killed by signal N" becomes the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _ppid_map() -> Dict[int, int]:
    out: Dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: split after the last ')'
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
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


def marked(entry: bytes) -> List[int]:
    """Pids whose environment holds `entry` (b"NAME=value"): processes that left a command's
    tree (a `setsid` daemon) still inherit its environment. Only processes whose environ we
    may read are found (our own uid, or any as a privileged user)."""
    found = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                if entry in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


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


class UnknownUser(LookupError):
    """The user (or group) of a request does not exist where the command would run."""


def resolve_ids(user: str) -> Tuple[int, int]:
    """ "uid", "uid:gid", "name" or "name:group" as numbers, looked up in this system's
    passwd and group files. A bare uid without a passwd entry gets gid = uid."""
    name, _, group = user.partition(":")
    entry = None
    if name.isdigit():
        uid = int(name)
    else:
        try:
            import pwd

            entry = pwd.getpwnam(name)
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find user %s: no matching entries in passwd file" % name
            ) from None
        uid = entry.pw_uid
    if group.isdigit():
        return uid, int(group)
    if group:
        try:
            import grp

            return uid, grp.getgrnam(group).gr_gid
        except (ImportError, KeyError):
            raise UnknownUser(
                "unable to find group %s: no matching entries in group file" % group
            ) from None
    return uid, entry.pw_gid if entry is not None else uid


def spawn(
    argv: List[str],
    env: Optional[Dict[str, str]],
    cwd: Optional[str],
    user: Optional[Tuple[int, int]] = None,
    with_stdin: bool = False,
) -> subprocess.Popen:  # type: ignore[type-arg]
    """Start `argv` as a new session. Raises OSError when it cannot start."""
    kwargs: Dict[str, Any] = {}
    if user is not None and (user[0] != os.geteuid() or user[1] != os.getegid()):
        uid, gid = user
        if sys.version_info >= (3, 9):
            kwargs = {"user": uid, "group": gid, "extra_groups": []}
        else:  # pragma: no cover - old Pythons inside containers

            def drop() -> None:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)

            kwargs = {"preexec_fn": drop}
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
        **kwargs,
    )


def spawn_error(exc: OSError, argv: List[str], cwd: Optional[str]) -> Tuple[int, bytes]:
    """The exit code and message a shell would give for a command that could not start."""
    if isinstance(exc, FileNotFoundError) and cwd and not os.path.isdir(cwd):
        return 2, ("cannot change directory to %s: No such file or directory\n" % cwd).encode()
    if isinstance(exc, FileNotFoundError):
        return 127, ("%s: command not found\n" % argv[0]).encode()
    if isinstance(exc, PermissionError):
        return 126, ("%s: permission denied\n" % (argv[0],)).encode()
    return 126, ("%s: %s\n" % (argv[0], exc.strerror or exc)).encode()


def _feed(pipe: IO[bytes], chunks: Iterable[bytes]) -> None:
    try:
        for chunk in chunks:
            if chunk:
                pipe.write(chunk)
        pipe.close()
    except (BrokenPipeError, OSError, ValueError):
        pass  # the command stopped reading; that is its business
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _watchdog(
    proc: subprocess.Popen,  # type: ignore[type-arg]
    deadline: float,
    grace: float,
    kill: Callable[[int], None],
    finished: threading.Event,
    timed_out: threading.Event,
) -> None:
    """Enforce the deadline whatever the reader is doing: blocked on a consumer that stopped
    reading, or waiting for a process that closed its pipes."""
    if finished.wait(max(0.0, deadline - time.monotonic())) or proc.poll() is not None:
        return
    timed_out.set()
    kill(signal.SIGTERM)
    if not finished.wait(grace):
        kill(signal.SIGKILL)


def pump(
    proc: subprocess.Popen,  # type: ignore[type-arg]
    stdin: Optional[Iterable[bytes]] = None,
    timeout: Optional[float] = None,
    grace: float = GRACE,
    killer: Optional[Callable[[int], None]] = None,
    started: Optional[float] = None,
) -> Generator[Tuple[str, bytes], None, Outcome]:
    """Yield ("stdout"|"stderr", bytes) as output arrives; return (exit code, timed out,
    elapsed). `killer(sig)` replaces the default tree kill (the plain-exec path kills
    inside the container instead). The timeout is kept by a watchdog thread, so it holds even
    while the caller is not reading."""
    start = time.monotonic() if started is None else started
    if stdin is not None and proc.stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    known: List[int] = []
    kill_lock = threading.Lock()

    def kill(sig: int) -> None:
        with kill_lock:
            if killer is not None:
                killer(sig)
            else:
                known[:] = kill_tree(proc.pid, sig, known)

    finished, timed_out = threading.Event(), threading.Event()
    if timeout is not None:
        threading.Thread(
            target=_watchdog,
            args=(proc, start + timeout, grace, kill, finished, timed_out),
            daemon=True,
        ).start()
    sel = selectors.DefaultSelector()
    for pipe, kind in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        if pipe is not None:
            sel.register(pipe, selectors.EVENT_READ, kind)
    exited_at: Optional[float] = None
    last_data = start
    try:
        while True:
            if sel.get_map():
                for key, _ in sel.select(0.05):
                    data = os.read(key.fd, CHUNK)
                    if data:
                        last_data = time.monotonic()
                        yield key.data, data
                    else:
                        sel.unregister(key.fileobj)
            else:  # both pipes closed: wait for the process (the watchdog keeps the deadline;
                proc.wait()  # a timed wait would poll with sleeps and cost a millisecond)
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now  # leftovers of its group keep running, by design
            if exited_at is not None and (
                not sel.get_map()
                or (now - last_data >= DRAIN and now - exited_at >= DRAIN)
                or now - exited_at > DRAIN_MAX
            ):
                break
    finally:
        finished.set()
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        if proc.poll() is None:  # the caller gave up on us: nothing may outlive that
            kill(signal.SIGKILL)
    code = proc.wait()
    return exit_status(code), timed_out.is_set(), time.monotonic() - start
