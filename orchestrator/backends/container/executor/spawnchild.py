"""The spawner's own side: a child forked from the executor that drops to one user and then,
on one thread, starts each command it is asked for and reports its pid and its exit; and the
messages it and the executor exchange over their socket (a length, JSON, and descriptors
passed alongside). The executor's side is `spawner`. Standard library only, Python 3.7+."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import subprocess
from typing import Any, Dict, List, Sequence, Set, Tuple

Message = Dict[str, Any]

HEADER = struct.Struct(">I")
MAX_MESSAGE = 16 << 20  # an argv and environment together stay far under this
POLL = 0.5
"""Seconds between a spawner's looks for ended commands when no SIGCHLD woke it."""


def send_message(sock: socket.socket, obj: Message, fds: Sequence[int] = ()) -> None:
    body = json.dumps(obj).encode()
    head = HEADER.pack(len(body))
    if fds:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("%di" % len(fds), *fds))]
        sent = sock.sendmsg([head], rights)
        head = head[sent:]
    sock.sendall(head + body)


def _exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        part = sock.recv(count - len(data))
        if not part:
            raise EOFError
        data += part
    return data


def recv_message(
    sock: socket.socket, max_fds: int = 0, limit: int = MAX_MESSAGE
) -> Tuple[Message, List[int]]:
    """(object, fds) of the next message; EOFError when the other end is gone or sends
    more than `limit` bytes in one."""
    fds: List[int] = []
    if max_fds:
        space = socket.CMSG_SPACE(max_fds * 4)
        flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
        head, ancillary, _, _ = sock.recvmsg(HEADER.size, space, flags)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack("%di" % (len(data) // 4), data[: len(data) // 4 * 4])
        if not head:
            raise EOFError
        head += _exactly(sock, HEADER.size - len(head))
    else:
        head = _exactly(sock, HEADER.size)
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise EOFError
    msg = json.loads(_exactly(sock, size).decode())
    if not isinstance(msg, dict):
        raise EOFError
    return msg, fds


def _close_inherited(keep: int) -> None:
    """Close every descriptor inherited from the executor (its frames, other commands'
    pipes) but `keep`; 0-2 become /dev/null. Listed from /proc: closing up to the fd limit
    would be a million system calls."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(3, 1024))
    for fd in open_fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


class _Server:
    """The spawner's loop, on one thread: requests from the socket, and the exits of the
    commands it started, looked for on every SIGCHLD (through the wakeup descriptor) and at
    least every POLL seconds (under gVisor a process of the sandbox's user may read the
    wakeup pipe empty). An exit is reported but the command is left a zombie, its pid
    taken, until the executor says it has it: the executor kills by pid, as root, and a pid
    released before it knew could meanwhile be another process's."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.procs: Dict[int, "subprocess.Popen[bytes]"] = {}
        self.told: Set[int] = set()  # exits reported, not yet acknowledged
        self.wake_r, wake_w = os.pipe()
        for fd in (self.wake_r, wake_w):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def look(self) -> None:
        """Report each command that has ended, without reaping it."""
        try:
            while os.read(self.wake_r, 4096):
                pass
        except OSError:
            pass
        for pid in list(self.procs):
            if pid in self.told:
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # gone (never ours to lose: the loop alone waits)
                info = None
                self.procs.pop(pid)
                send_message(self.sock, {"exit": pid, "code": -signal.SIGKILL})
            if info is None:
                continue
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            self.told.add(pid)
            send_message(self.sock, {"exit": pid, "code": code})

    def reap(self, pid: object) -> None:
        """The executor has the exit of `pid`: release it."""
        if not isinstance(pid, int) or pid not in self.told:
            return
        self.told.discard(pid)
        proc = self.procs.pop(pid)
        try:
            _, status = os.waitpid(pid, 0)
            proc.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        except ChildProcessError:
            proc.returncode = -1  # Popen must not wait for it again

    def spawn(self, req: Message, fds: List[int]) -> None:
        cwd = req.get("cwd")
        try:
            proc = subprocess.Popen(
                req["argv"],
                stdin=fds[0],
                stdout=fds[1],
                stderr=fds[2],
                env=req["env"],
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            reply = {"errno": exc.errno or errno.EIO, "strerror": exc.strerror or str(exc)}
            if cwd and exc.filename == cwd and isinstance(exc, PermissionError):
                reply["cwd"] = True  # root may enter it: the executor starts this one
            send_message(self.sock, reply)
            return
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            send_message(self.sock, {"errno": 0, "strerror": "cannot start: %s" % exc})
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.procs[proc.pid] = proc
        send_message(self.sock, {"pid": proc.pid})

    def serve(self) -> None:
        while True:
            ready, _, _ = select.select([self.sock.fileno(), self.wake_r], [], [], POLL)
            if self.sock.fileno() in ready:
                try:
                    req, fds = recv_message(self.sock, max_fds=3)
                except (EOFError, OSError, ValueError):
                    return
                if "reap" in req:
                    self.reap(req["reap"])
                elif len(fds) == 3:
                    self.spawn(req, fds)
                else:
                    for fd in fds:
                        os.close(fd)
                    reply = {"errno": errno.EINVAL, "strerror": "three descriptors expected"}
                    send_message(self.sock, reply)
            self.look()


def child_main(sock: socket.socket, uid: int, gid: int) -> None:
    """In the forked child: never returns. Its own session (a successor executor kills it
    by that, as it kills commands a dead executor left); SIGINT at its default (Python's
    KeyboardInterrupt would be a message, not a death)."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()
        _close_inherited(sock.fileno())
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # a change of ids: the kernel (Linux's, gVisor's) marks it not dumpable
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError(errno.EPERM, "the user switch did not hold")
        server = _Server(sock)
        send_message(sock, {"ready": True})
        server.serve()
    except BaseException as exc:
        try:
            send_message(sock, {"ready": False, "error": repr(exc)})
        except BaseException:
            pass
        code = 1
    os._exit(code)
