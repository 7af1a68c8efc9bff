"""Spawners: the executor's way to start a command as another user without a fork.

A command that runs as another user than the executor's (root) is started by fork, a switch
of user, then exec: Python only uses the cheap vfork when no switch is asked. Under gVisor a
fork of the executor costs about 25 ms (the Sentry copies its address space), more than the
whole vfork and exec. So the executor forks, once per user, a spawner: a copy of itself that
drops to that user (and, by that change of ids, is no longer dumpable: a process of the
sandbox's, even of the same user, may not trace it or read its memory), then starts each
command it is sent with Popen (a vfork, from Python 3.10), in a session of its own, and
reports each one's pid, then its exit status.

The executor keeps every guarantee: it (root) still kills command trees by pid and session,
after checking that a pid a spawner names is its child; a spawner killed by the sandbox (its
user may signal it) costs the commands it had started (reported killed) and a fork for the
next command; a stopped one is continued, a silent one given up after SPAWN_DEADLINE; a
request, once sent, is never sent again. Where a spawner cannot be had (no right to switch
user, no process slot, MAX_SPAWNERS users), the executor starts the command itself, as
before. This module is the executor's side; the forked spawner's own is `spawnchild`.
Standard library only, Python 3.7+.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import socket
import threading
from typing import IO, TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple, Union

if TYPE_CHECKING:
    from orchestrator import procutil
    from orchestrator.backends.container.executor.spawnchild import (
        POLL,
        Message,
        child_main,
        recv_message,
        send_message,
    )
else:  # in the container they sit beside this file
    import procutil
    from spawnchild import POLL, Message, child_main, recv_message, send_message

__all__ = ["MAX_SPAWNERS", "POLL", "Spawner", "Spawners"]

SPAWN_DEADLINE = 10.0
"""Seconds a spawner may take to start one command (it is continued every second)."""
MAX_REPLY = 64 << 10
"""Largest message a spawner may send back (its answers are a few bytes)."""
MAX_EARLY = 64
"""Exits of processes not named yet that a spawner may report before it is given up."""
LOST = (
    "orchestrator: this command's spawner was killed (by a process of its user) before it"
    " said whether the command started; reported as killed, it was not run again"
)
FORGED = (
    "orchestrator: this command's spawner named process %r, which it did not start; it was"
    " given up (reported as killed, not run again)"
)
STALE = 5
"""Seconds a command may stay a zombie unreported before its spawner is given up."""
MAX_SPAWNERS = 8
"""Spawners one executor keeps (one per user it runs commands as); past this, fork."""


class Child:
    """What the executor holds of a command a spawner started: the part of Popen's face
    that procutil uses (pid, the pipes, poll, wait, returncode)."""

    def __init__(
        self,
        spawner: Spawner,
        stdin: Optional[IO[bytes]],
        stdout: Optional[IO[bytes]],
        stderr: IO[bytes],
    ) -> None:
        self.spawner = spawner
        self.pid = 0
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: Optional[int] = None
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        self.returncode = code
        self._done.set()

    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self) -> Optional[int]:
        """Its exit status. A spawner the sandbox stopped is continued every second; one
        that leaves an ended command unreported for STALE seconds is given up (the command
        then reads as killed)."""
        stale = 0
        while not self._done.wait(1.0):
            self.spawner.nudge()
            fields = procutil.stat_fields(self.pid)
            stale = stale + 1 if not fields or fields[0] in (b"Z", b"X") else 0
            if stale >= STALE:
                self.spawner.close()
        return self.returncode


class RootCwd(OSError):
    """The command's user may not enter its working directory: root may (the executor
    starts it, as before, entering the folder before it switches user)."""


def _wrap(fd: int, mode: str) -> IO[bytes]:
    return io.open(fd, mode, -1)  # buffered, as Popen makes its pipes


class Spawner:
    """One spawner process, as seen from the executor."""

    def __init__(self, uid: int, gid: int) -> None:
        self.lock = threading.Lock()  # one start at a time: its answer is the next reply
        self.write_lock = threading.Lock()
        self.reply: Optional[Message] = None
        self.replied = threading.Condition()
        self.children: Dict[int, Child] = {}
        self.early: Dict[int, int] = {}
        self.dead = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            ours.close()
            child_main(theirs, uid, gid)
        theirs.close()
        self.pid, self.sock = pid, ours
        self.sock.settimeout(SPAWN_DEADLINE)
        try:
            hello, _ = recv_message(self.sock, limit=MAX_REPLY)
        except (EOFError, OSError, ValueError):
            hello = {"ready": False}
        self.sock.settimeout(None)
        if not hello.get("ready"):
            self.close()
            raise OSError(errno.EPERM, "no spawner: %s" % hello.get("error", "no answer"))
        threading.Thread(target=self._read, daemon=True).start()

    def nudge(self) -> None:
        """Continue a spawner the sandbox stopped (its user may send it SIGSTOP)."""
        if not self.dead:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except OSError:
                pass

    def _read(self) -> None:
        try:
            while True:
                msg, _ = recv_message(self.sock, limit=MAX_REPLY)
                if "exit" in msg:
                    pid = int(msg["exit"])
                    self._exit(pid, int(msg["code"]))
                    self._send({"reap": pid})  # recorded: the spawner may release the pid
                else:
                    with self.replied:
                        self.reply = msg
                        self.replied.notify_all()
        except (EOFError, OSError, ValueError, KeyError, TypeError):
            pass
        self.close()

    def _exit(self, pid: int, code: int) -> None:
        with self.replied:
            child = self.children.pop(pid, None)
            if child is None:  # before the answer that named it (at most one is awaited)
                self.early[pid] = code
                if len(self.early) > MAX_EARLY:
                    raise ValueError("a spawner reporting processes it never named")
                return
        child._exited(code)

    def _send(self, msg: Message, fds: Sequence[int] = ()) -> None:
        with self.write_lock:
            send_message(self.sock, msg, fds)

    def close(self) -> None:
        """The spawner is gone (or must go): what it started is killed, reported as such."""
        with self.replied:
            if self.dead:
                return
            self.dead = True
            orphans, self.children = list(self.children.values()), {}
            self.replied.notify_all()
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self.sock.close()
        for child in orphans:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass
            child._exited(-signal.SIGKILL)

    def start(
        self,
        argv: List[str],
        env: Dict[str, str],
        cwd: Optional[str],
        stdin: Union[int, bool, None],
        stdout: Optional[int],
    ) -> Child:
        """Start `argv`: `stdin` an fd, True (a pipe) or None (/dev/null); `stdout` an fd or
        None (a pipe). A Child, or OSError as Popen raises it (EPIPE: the spawner is gone
        and nothing was started; start it another way). Once the request is sent it is
        never sent again: a spawner that dies before it answers (the sandbox killed it, or
        the command it started did) may have started the command, so that command is
        reported killed (procutil.Lost), with a line on stderr that says why."""
        ours: List[Tuple[str, int]] = []  # our ends of the pipes made here
        made: List[int] = []  # their ends, and /dev/null: closed here once sent
        fds: List[int] = []  # the command's 0, 1 and 2
        try:
            if isinstance(stdin, bool) or stdin is None:
                if stdin:
                    read, write = os.pipe()
                    ours.append(("stdin", write))
                else:
                    read = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                made.append(read)
                fds.append(read)
            else:
                fds.append(stdin)
            if stdout is None:
                read, write = os.pipe()
                ours.append(("stdout", read))
                made.append(write)
                fds.append(write)
            else:
                fds.append(stdout)
            read, write = os.pipe()
            ours.append(("stderr", read))
            made.append(write)
            fds.append(write)
            answer = self._ask({"argv": argv, "env": env, "cwd": cwd}, fds)
            pid = None if answer is None else answer.get("pid")
            if answer is not None and pid is None:  # it could not start it
                err = answer.get("errno")
                if answer.get("cwd"):
                    raise RootCwd(err, answer.get("strerror", ""))
                if err is None:  # no answer of a spawner's: it is not to be trusted
                    self.close()
                    raise procutil.Lost(LOST)
                raise (
                    OSError(err, answer.get("strerror", ""))
                    if err
                    else ValueError(answer.get("strerror", "cannot start the command"))
                )
            if answer is None:
                raise procutil.Lost(LOST)
            if not isinstance(pid, int) or not self._started(pid):
                # its command may have killed it already (the pid then reads as init's
                # child); else a spawner that names another process is not to be trusted
                state = procutil.stat_fields(self.pid)[:1]
                gone = self.dead or state in ([], [b"Z"], [b"X"])
                self.close()
                raise procutil.Lost(LOST if gone else FORGED % (pid,))
        except BaseException:
            for _, fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in made:
                os.close(fd)
        files = {name: _wrap(fd, "wb" if name == "stdin" else "rb") for name, fd in ours}
        child = Child(self, files.get("stdin"), files.get("stdout"), files["stderr"])
        child.pid = pid
        with self.replied:
            if pid in self.early:
                code: Optional[int] = self.early.pop(pid)
            elif self.dead:
                code = -signal.SIGKILL
            else:
                self.children[pid] = child
                code = None
        if code is not None:
            child._exited(code)
        return child

    def _started(self, pid: int) -> bool:
        """Whether `pid` can be the spawner's child: the executor kills what it is told, as
        root, so a spawner taken over by the sandbox (its user's) must not name a process
        of root's. One that has exited and is being released (Z or X, its parent 0 by
        then) or is gone from /proc can be killed no more."""
        if pid <= 1:
            return False
        fields = procutil.stat_fields(pid)
        if not fields:
            return True
        released = fields[0] in (b"Z", b"X") and fields[1] == b"0"
        return released or int(fields[1]) == self.pid

    def _ask(self, req: Message, fds: List[int]) -> Optional[Message]:
        """The spawner's answer; None when it died (or went silent) after the request went."""
        with self.lock:
            if self.dead:
                raise OSError(errno.EPIPE, "the spawner is gone")
            with self.replied:
                self.reply = None
            try:
                self._send(req, fds)
            except OSError:
                self.close()
                raise OSError(errno.EPIPE, "the spawner is gone") from None
            waited = 0.0
            with self.replied:
                while self.reply is None and not self.dead and waited < SPAWN_DEADLINE:
                    self.replied.wait(1.0)
                    waited += 1.0
                    if self.reply is None:
                        self.nudge()
                answer, self.reply = self.reply, None
            if answer is None:
                self.close()
            return answer


class Spawners:
    """The executor's spawners, one per (uid, gid), made on first use (one user's, which
    may take a while, holding up no other user's commands)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.making: Dict[Tuple[int, int], threading.Lock] = {}
        self.by_ids: Dict[Tuple[int, int], Spawner] = {}
        self.refused: Set[Tuple[int, int]] = set()

    def pids(self) -> List[int]:
        """The spawners alive (a successor executor kills what a dead one left)."""
        with self.lock:
            return [one.pid for one in self.by_ids.values() if not one.dead]

    def _get(self, uid: int, gid: int) -> Optional[Spawner]:
        key = (uid, gid)
        with self.lock:
            making = self.making.setdefault(key, threading.Lock())
        with making:
            with self.lock:
                spawner = self.by_ids.get(key)
                if spawner is not None and not spawner.dead:
                    return spawner
                self.by_ids.pop(key, None)
                if key in self.refused or len(self.by_ids) >= MAX_SPAWNERS:
                    return None
            try:
                spawner = Spawner(uid, gid)
            except OSError as exc:  # no right to switch, no process slot: as before
                if exc.errno == errno.EPERM:
                    with self.lock:
                        self.refused.add(key)
                return None
            with self.lock:
                self.by_ids[key] = spawner
            return spawner

    def __call__(
        self,
        argv: List[str],
        env: Dict[str, str],
        cwd: Optional[str],
        uid: int,
        gid: int,
        stdin: Union[int, bool, None],
        stdout: Optional[int],
    ) -> Optional[Child]:
        """A Child, or None when the caller must start the command itself (nothing was
        started: no spawner to be had, or one gone before it got the request)."""
        spawner = self._get(uid, gid)
        if spawner is None:
            return None
        try:
            return spawner.start(argv, env, cwd, stdin, stdout)
        except RootCwd:
            return None
        except OSError:
            if spawner.dead:
                return None
            raise
