"""`orchestrator exec` through an environment's own endpoint, before anything heavy loads.

The `orchestrator` command starts here. For `exec [-i] ID [--timeout S] [--] CMD...` on an
environment that has an endpoint (a detached Docker environment: `up`), it runs the command
over that endpoint: a unix socket in the folder the host shares with the main container
alone, held by the environment's resident executor (see backends/container/resident.py), the
same executor protocol as the library's commands. No docker exec, no Typer, no pydantic: a
command costs a connection and a few frames. Anything else, or whatever this path cannot
answer exactly as the full CLI would (an id it does not find whole, another option, a
paused environment, kills owed, no endpoint), goes to the full CLI unchanged, before any
command ran. Standard library only (and the executor's wire format), so that this module
loads in a few milliseconds: Typer and argparse are not used here on purpose.

Who can use the endpoint: its socket is the owner's (mode 0600, in the owner's 0700 project
folder; read-only in the container); a connection must first show the token that only the
environment's record (owner-only) and the resident hold. The command then runs as the full
CLI would run it: the environment's user and workdir, its timeout kills its tree, its exit
code is ours (124 on timeout), its stdout and stderr apart; it dies with our connection
(Ctrl-C, a kill of this process), as the full CLI kills it. One difference: a command
already running when its environment is paused waits here for the resume (as under `docker
exec`), where the full CLI fails it at once (SandboxPaused) and kills it while frozen.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from orchestrator.backends.container.executor import wire

if TYPE_CHECKING:
    import threading

ENDPOINT = "exec.sock"
"""The resident's socket, in <project>/io/main."""
RECORD = "exec.json"
"""In <project> (owner-only): the token, and what a command gets when the call says nothing."""
RECORD_LIMIT = 64 * 1024
READY_WITHIN = 1.0
"""Seconds for the resident to greet (a paused environment does not: the full CLI says so)."""
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
PIECE = 64 * 1024
OVERDUE = 5.0
"""Seconds past a command's timeout before we stop waiting for its end (its sandbox frozen
meanwhile): reported as a timeout, and the command dies with our connection."""


class Call(NamedTuple):
    ident: str
    interactive: bool
    timeout: float | None
    argv: list[str]


class NotHere(Exception):
    """This call is not for the endpoint: the full CLI takes it (nothing ran)."""


def main() -> None:
    """The `orchestrator` command."""
    try:
        code = run(sys.argv[1:])
    except KeyboardInterrupt:  # the command died with our connection, as the full CLI's
        code = 130
    except NotHere:
        from orchestrator.cli import main as full

        full()
        return
    sys.exit(code)


def run(args: list[str]) -> int:
    call = parse(args)
    folder = _project_folder(call.ident)
    owed = os.path.join(folder, "owed-kills")
    if os.path.isdir(owed) and os.listdir(owed):
        raise NotHere("kills are owed")
    record = _record(folder)
    try:
        token = bytes.fromhex(str(record["token"]))
    except ValueError:
        raise NotHere("a record that is not one") from None
    sock, reader = _connect(folder, token)
    try:
        return _run(sock, reader, call, record)
    finally:
        sock.close()


def parse(args: list[str]) -> Call:
    """`exec [-i|--interactive] ID [--timeout S|--timeout=S] [--] CMD...`, as the full CLI
    reads it; NotHere for anything else."""
    if not args or args[0] != "exec":
        raise NotHere("not exec")
    rest = args[1:]
    interactive = False
    while rest and rest[0] in ("-i", "--interactive"):
        interactive, rest = True, rest[1:]
    if not rest or not ID.fullmatch(rest[0]):
        raise NotHere("no id first")
    ident, rest = rest[0], rest[1:]
    timeout = None
    if rest and (rest[0] == "--timeout" or rest[0].startswith("--timeout=")):
        raw = rest[0].partition("=")[2] if "=" in rest[0] else (rest[1:2] or [""])[0]
        rest = rest[1:] if "=" in rest[0] else rest[2:]
        try:
            timeout = float(raw)
        except ValueError:
            raise NotHere("a timeout that is not a number") from None
        if not 0 < timeout < float("inf"):
            raise NotHere("a timeout out of range")
    if len(rest) >= 2 and rest[1] == "--":
        raise NotHere("`exec ID SERVICE -- ...`: the full CLI says what it means")
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest and rest[0].startswith("-"):
        raise NotHere("an option")
    if not rest:
        raise NotHere("no command")
    argv = ["/bin/sh", "-c", rest[0]] if len(rest) == 1 else list(rest)
    return Call(ident, interactive, timeout, argv)


def state_dir() -> str:
    """The state folder, by the rule of settings.STATE_DIR (held equal by a unit test)."""
    raw = os.environ.get("ORCHESTRATOR_STATE_DIR", "").strip()
    if raw:
        path = os.path.expanduser(raw)
        if not os.path.isabs(path):
            raise NotHere("a state folder setting the full CLI refuses")
        return path
    from platformdirs.unix import Unix

    return str(Unix("orchestrator").user_state_dir)


def _project_folder(ident: str) -> str:
    folder = os.path.join(state_dir(), "projects", ident)
    if not os.path.isdir(folder) or os.path.islink(folder):
        raise NotHere("no such project folder")
    return folder


def _record(folder: str) -> dict[str, object]:
    try:
        fd = os.open(os.path.join(folder, RECORD), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NotHere("no endpoint") from None
    with os.fdopen(fd, "rb") as fh:
        try:
            data = json.loads(fh.read(RECORD_LIMIT).decode())
        except (OSError, ValueError):
            raise NotHere("a record that is not one") from None
    if not isinstance(data, dict) or not isinstance(data.get("token"), str):
        raise NotHere("a record that is not one")
    return data


def _connect(folder: str, token: bytes) -> tuple[socket.socket, BinaryIO]:
    """A connection to the resident, its token shown and its greeting read; NotHere when
    there is none (gone, paused, not ours)."""
    place = os.path.join(folder, "io", "main")
    try:
        dirfd = os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NotHere("no shared folder") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(READY_WITHIN)
        sock.connect(f"/proc/self/fd/{dirfd}/{ENDPOINT}")
        sock.sendall(token)
        reader = sock.makefile("rb")
        frame = wire.read_frame(reader, limit=4096)
        if frame is None or frame[0] != wire.READY:
            raise NotHere("no greeting")
        sock.settimeout(None)
    except (OSError, ValueError):
        sock.close()
        raise NotHere("no resident") from None
    except NotHere:
        sock.close()
        raise
    finally:
        os.close(dirfd)
    return sock, reader


def _run(sock: socket.socket, reader: BinaryIO, call: Call, record: dict[str, object]) -> int:
    timeout, interactive = call.timeout, call.interactive
    cwd, user = record.get("cwd"), record.get("user")
    if not isinstance(cwd, str) or not (user is None or isinstance(user, str)):
        raise NotHere("a record that is not one")
    request = wire.Request(call.argv, {}, cwd, user, timeout, interactive)
    sock.sendall(wire.pack(wire.RUN, 1, wire.encode_request(request)))
    window = _feed_in_thread(sock) if interactive else None
    outs = {wire.OUT: _raw(sys.stdout), wire.ERR: _raw(sys.stderr)}
    consumed = 0
    if timeout is not None:
        sock.settimeout(timeout + OVERDUE)
    while True:
        try:
            frame = wire.read_frame(reader, limit=PIECE * 4)
        except TimeoutError:
            return _timed_out(timeout)
        if frame is None:
            print("error: the environment's executor went away while the command ran",
                  file=sys.stderr)  # fmt: skip
            return 1
        kind, cid, payload = frame
        if cid != 1:
            continue
        if kind in outs:
            _write(outs[kind], payload)
            consumed += 1
            if consumed >= wire.WINDOW // 2:
                sock.sendall(wire.pack(wire.CREDIT, 1, wire.COUNT.pack(consumed)))
                consumed = 0
        elif kind == wire.TAKEN and window is not None and len(payload) == wire.COUNT.size:
            for _ in range(min(wire.COUNT.unpack(payload)[0], wire.STDIN_WINDOW)):
                window.release()
        elif kind == wire.EXIT:
            end = wire.decode_exit(payload)
            if end.unavailable:
                print(f"error: the sandbox cannot run the command: {end.unavailable}",
                      file=sys.stderr)  # fmt: skip
                return 1
            return _timed_out(timeout) if end.timed_out else int(end.exit_code)


def _timed_out(timeout: float | None) -> int:
    print(f"error: timed out after {timeout or 0:g}s", file=sys.stderr)
    return 124  # as timeout(1), as the full CLI


def _raw(stream: object) -> object:
    """Where a stream's bytes go: its binary buffer, or None when it was closed at our start."""
    return getattr(stream, "buffer", None) if stream is not None else None


def _write(out: object, data: bytes) -> None:
    if out is None:
        return
    try:
        out.write(data)  # type: ignore[attr-defined]
        out.flush()  # type: ignore[attr-defined]
    except BrokenPipeError:
        pass  # the reader went: the command runs on to its end, its status is ours


def _feed_in_thread(sock: socket.socket) -> threading.BoundedSemaphore:
    """Our stdin to the command as it comes, then its end: at most STDIN_WINDOW pieces
    ahead of what the command took (the returned window, released as TAKEN frames come)."""
    import threading  # (only for -i)

    window = threading.BoundedSemaphore(wire.STDIN_WINDOW)

    def feed() -> None:
        fd = sys.stdin.fileno() if sys.stdin is not None else -1
        try:
            while data := os.read(fd, PIECE):
                window.acquire()
                sock.sendall(wire.pack(wire.STDIN, 1, data))
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError):
            sock.sendall(wire.pack(wire.STDIN_EOF, 1))

    threading.Thread(target=feed, daemon=True).start()
    return window
