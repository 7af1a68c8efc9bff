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
    inside the container instead)."""
    start = time.monotonic() if started is None else started
    if stdin is not None and proc.stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    known: List[int] = []

    def kill(sig: int) -> None:
        if killer is not None:
            killer(sig)
        else:
            known[:] = kill_tree(proc.pid, sig, known)

    sel = selectors.DefaultSelector()
    for pipe, kind in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        if pipe is not None:
            sel.register(pipe, selectors.EVENT_READ, kind)
    deadline = start + timeout if timeout is not None else None
    timed_out = False
    kill_at: Optional[float] = None
    exited_at: Optional[float] = None
    last_data = start
    try:
        while sel.get_map():
            now = time.monotonic()
            wait = 0.05
            if deadline is not None and not timed_out:
                wait = max(0.0, min(wait, deadline - now))
            for key, _ in sel.select(wait):
                data = os.read(key.fd, CHUNK)
                if data:
                    last_data = time.monotonic()
                    yield key.data, data
                else:
                    sel.unregister(key.fileobj)
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now  # leftovers of its group keep running, by design
            if exited_at is not None and (
                (now - last_data >= DRAIN and now - exited_at >= DRAIN)
                or now - exited_at > DRAIN_MAX
            ):
                break
            if deadline is not None and not timed_out and now >= deadline:
                timed_out = True
                kill(signal.SIGTERM)
                kill_at = now + grace
            elif kill_at is not None and now >= kill_at:
                kill(signal.SIGKILL)
                kill_at = None
                if exited_at is None:
                    exited_at = now  # stop waiting on pipes that a dead tree can no longer fill
    finally:
        sel.close()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    if timed_out:
        try:
            proc.wait(grace + 1.0)
        except subprocess.TimeoutExpired:
            kill(signal.SIGKILL)
    code = proc.wait()
    return exit_status(code), timed_out, time.monotonic() - start
