"""The executor's frames over a unix socket instead of its `docker exec` pipes.

Over the pipes every frame crosses the docker CLI, the engine and the container's shim (about
2 ms a command); over a socket it goes straight between this process and the executor. Where
the container sees a host folder of its own (IO_MOUNT: `<project>/io/<service>`, the owner's,
mode 0700, read-only inside), the host listens there once the executor has greeted, tells it
over the pipes (which only the executor reads) the socket's path and a random token, and takes
the one connection that shows that token. The socket's name leaves the folder when the meeting
ends, whatever its outcome, and every later frame goes over that connection.

Who else could connect: on the host, only the owner and root (the folder is the owner's, 0700);
in the container, the socket is mode 0, so only a process holding CAP_DAC_OVERRIDE (the
executor, as root; or a root sandbox, which can replace the executor anyway) connects at all,
and it must show a token only the executor was told. Any other connection is closed; at most
PENDING wait at once, and the meeting ends within MEET_WITHIN (SWITCH_WITHIN more once the
connection with the token was told it was taken). A planted socket cannot stand in
for ours: the host listens, the folder is read-only inside, and no path in it is followed.

Where the executor cannot connect (gVisor keeps host sockets out; an engine that maps root to
another user; dropped capabilities) it says why and the pipes stay: the same protocol, slower.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import secrets
import select
import socket
import time
from pathlib import Path
from typing import IO

from orchestrator.backends.container.executor import wire

TOKEN_BYTES = 32
MEET_WITHIN = 3.0
"""Seconds from DIRECT to the executor's answer and its connection (it tries to connect for
1.5 s: fds.CONNECT_WITHIN)."""
SWITCH_WITHIN = 15.0
"""Seconds from telling the connection with the token it was taken to the executor's
SWITCHED: it has answered and connected, so only a starved machine (or a hostile executor)
is slower; given up on, it is sent RELEASE over that connection first, where it reads
from then on (its end of input must not read as its owner's death)."""
PENDING = 8
"""Silent connections held at once while the meeting waits for the one with the token."""


class Broken(Exception):
    """The executor answered DIRECT in a way ours never does."""


class Meeting:
    """A listening socket in the host folder one container sees, for one executor's
    connection (see the module). Close it: its name leaves the folder."""

    def __init__(self, folder: Path, inside: str, staging: Path | None = None) -> None:
        self.name = f".exec-{secrets.token_hex(8)}.sock"
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.inside = f"{inside}/{self.name}"
        self._pending: dict[socket.socket, bytearray] = {}
        self._found: socket.socket | None = None
        self._bound = False
        # the folders by descriptor: a path may be longer than a socket address allows
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        self._dir = os.open(folder, flags)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # made mode 0 in a folder of the owner's that no container sees (`staging`:
            # the shared folder's parent), then moved into the shared folder: never there
            # with the mode a umask gave it
            stage = os.open(staging or folder.parent, flags)
            try:
                self._listener.bind(f"/proc/self/fd/{stage}/{self.name}")
                try:
                    os.chmod(self.name, 0, dir_fd=stage)
                    os.rename(self.name, self.name, src_dir_fd=stage, dst_dir_fd=self._dir)
                except OSError:
                    os.unlink(self.name, dir_fd=stage)
                    raise
            finally:
                os.close(stage)
            self._bound = True
            self._listener.listen(PENDING)
            self._listener.setblocking(False)
        except OSError:
            self.close()
            raise

    def ask(self) -> bytes:
        """DIRECT's payload."""
        return json.dumps({"path": self.inside, "token": self.token.hex()}).encode()

    def meet(self, pipe: IO[bytes] | None) -> socket.socket | str | None:
        """Wait for the executor's answer on its output pipe and for its connection: the
        connection (SWITCHED), why it stays on its pipes (NOT_SWITCHED, or no answer in
        time: a sandbox paused or slow; the executor, once it goes on, finds no socket
        and stays on its pipes too), or None when its output ended. The connection with
        the token is told so (one byte) before the executor says SWITCHED: once told,
        SWITCHED must follow within SWITCH_WITHIN. Raises Broken for any other
        answer. Without a pipe (the resident's meeting), the connection alone is waited
        for, and Broken when none came."""
        deadline = time.monotonic() + MEET_WITHIN
        switched = pipe is None
        told = False
        while not (switched and self._found is not None):
            if self._found is not None and not told:
                self._found.setblocking(True)
                self._found.sendall(b"\1")  # taken: now it may say SWITCHED
                told, deadline = True, time.monotonic() + SWITCH_WITHIN
            left = deadline - time.monotonic()
            if left <= 0:
                if told and self._found is not None:
                    self._found.settimeout(0.5)
                    with contextlib.suppress(OSError):
                        self._found.sendall(wire.pack(wire.RELEASE, 0))
                if told or pipe is None:
                    raise Broken("it was told its connection was taken, but did not switch"
                                 if told else "no connection showed its token")  # fmt: skip
                return "no answer in time"
            watched = [self._listener, *self._pending]
            poller = select.poll()
            for sock in watched:
                poller.register(sock, select.POLLIN)
            if pipe is not None and not switched:
                poller.register(pipe, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(left * 1000)}
            if pipe is not None and pipe.fileno() in readable:
                frame = wire.read_frame(pipe, limit=4096)
                if frame is None:
                    return None
                kind, _, payload = frame
                if kind == wire.NOT_SWITCHED:
                    return payload.decode("utf-8", "replace")[:200] or "no reason given"
                if kind != wire.SWITCHED or not told:
                    raise Broken(f"a frame of kind {kind} as its answer to DIRECT")
                switched = True
            self._take(readable)
        found, self._found = self._found, None
        if not told:
            found.setblocking(True)
            found.sendall(b"\1")
        return found

    def _take(self, readable: set[int]) -> None:
        """Accept what waits and read the tokens that came. A connection is read at once
        (the executor sends its token as it connects); of those still silent at most
        PENDING are held, the oldest let go first."""
        if self._listener.fileno() in readable:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while self._found is None:
                    conn, _ = self._listener.accept()
                    conn.setblocking(False)
                    self._pending[conn] = bytearray()
                    self._read(conn)
                    if len(self._pending) > PENDING:
                        oldest = next(iter(self._pending))
                        del self._pending[oldest]
                        oldest.close()
        for conn in [c for c in self._pending if c.fileno() in readable]:
            self._read(conn)

    def _read(self, conn: socket.socket) -> None:
        """Read what `conn` sent of its token: it is the one, or let go, or still waited for."""
        got = self._pending[conn]
        try:
            data = conn.recv(TOKEN_BYTES - len(got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        got += data
        if data and len(got) < TOKEN_BYTES:
            return
        del self._pending[conn]
        if self._found is None and hmac.compare_digest(bytes(got), self.token):
            self._found = conn
        else:
            conn.close()

    def close(self) -> None:
        for conn in [*self._pending, *([self._found] if self._found else [])]:
            conn.close()
        self._pending.clear()
        self._found = None
        self._listener.close()
        if self._bound:
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=self._dir)
            self._bound = False
        if self._dir >= 0:
            os.close(self._dir)
            self._dir = -1
