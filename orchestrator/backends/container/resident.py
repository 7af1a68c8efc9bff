"""An environment's endpoint for `orchestrator exec` (the client: orchestrator/endpoint.py).

A detached Docker environment (`orchestrator up`) gets a resident executor: started once by
`docker exec -i` (`agent.py --resident`), it leaves that exec's sight and lives as long as
its container. The host makes the listening socket itself, in the project folder, which no
container sees (`<project>/exec.sock`, mode 0600, in the owner's 0700 folder): no process of
the sandbox, root included, can reach it by a path, plant or replace it. It hands the socket
to the resident over a meeting in the folder it shares with the main container alone
(executor/direct.py: the one connection that shows the token the resident was told on its
stdin), with the token every client must show first. That token, and what a command gets
when the call says nothing (the environment's user and workdir), go in the project folder's
record (`exec.json`, owner-only), written only once the resident holds the socket. Every
step has a deadline, and nothing the resident's start prints is kept. Each client connection
is an executor session of its own: its command dies with it.

The library reaches the same endpoint for kept processes (`Sandbox.start(keep=True)`,
`Sandbox.process(id)`: executor/kept.py in the container): each is run, and each reader
of one attached, over a connection of its own (a `ResidentLink`), which closing leaves the
process running.

Best effort: an environment without it (gVisor keeps host sockets out; a remote engine; a
reset killed the resident; a suspended one) runs `exec` as before, by the full CLI.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import procutil
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.executor import direct
from orchestrator.backends.container.executor.client import ExecutorClient
from orchestrator.backends.container.executor.link import Probe
from orchestrator.backends.container.executor.spawnchild import send_message
from orchestrator.backends.container.layout import IO_MOUNT, SANDBOX_MOUNT
from orchestrator.endpoint import ENDPOINT, READY_WITHIN, RECORD, NotHere, answers, dial
from orchestrator.errors import ExecutorLost, SandboxUnavailable, UsageError
from orchestrator.paths import write_file
from orchestrator.sandbox.options import Chunks, Command

log = logging.getLogger("orchestrator.docker")

START_WITHIN = 10.0
"""Seconds for `docker exec` to start the resident (it returns once the resident left it)."""
BACKLOG = 64


def open_endpoint(
    engine: Engine, container: str, project: Path, shared: Path, defaults: dict[str, object]
) -> bool:
    """Start the resident of `container` (its shared folder `shared`, seen at IO_MOUNT) and
    record its endpoint in `project`: True once it holds the socket. Never raises: without
    it, `exec` takes the full CLI's path."""
    # (a former resident's record stays until the new one replaces it whole: a caller that
    # reads it meanwhile finds no resident behind it, and a start that fails leaves it for
    # the next `reopen` to try again)
    try:
        token = _start(engine, container, project, shared)
        write_file(project / RECORD, json.dumps({**defaults, "token": token.hex()}))
    except (OSError, subprocess.SubprocessError, direct.Broken) as exc:
        log.info("%s: no exec endpoint (%s); exec goes by the full CLI", container, exc)
        return False
    return True


def _start(engine: Engine, container: str, project: Path, shared: Path) -> bytes:
    token = secrets.token_bytes(direct.TOKEN_BYTES)
    dirfd = os.open(project, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held = False
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ENDPOINT, dir_fd=dirfd)
        listener.bind(f"/proc/self/fd/{dirfd}/{ENDPOINT}")
        os.chmod(ENDPOINT, 0o600, dir_fd=dirfd)
        listener.listen(BACKLOG)
        meeting = direct.Meeting(shared, IO_MOUNT)
        try:
            command = ["python3", "-u", "-I", "-S", f"{SANDBOX_MOUNT}/agent.py", "--resident"]
            argv = engine.exec_target(container).argv(command, user="0", stdin=True)
            ask = json.dumps({"path": meeting.inside, "token": meeting.token.hex()})
            done = subprocess.run(  # (nothing of what it prints is kept: the image's python3
                argv,  # may be anyone's, and print without end)
                input=(ask + "\n").encode(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=START_WITHIN,
                check=False,
                env=procutil.marked_environ(),  # ended by our guardian if we die first
            )
            if done.returncode != 0:
                raise OSError(f"the resident did not start (exit {done.returncode})")
            conn = meeting.meet(None)
            if not isinstance(conn, socket.socket):
                raise direct.Broken("no connection")
            with conn:
                conn.settimeout(direct.MEET_WITHIN)
                send_message(conn, {"token": token.hex()}, [listener.fileno()])
            held = True
        finally:
            meeting.close()
    finally:
        listener.close()
        if not held:
            with contextlib.suppress(OSError):
                os.unlink(ENDPOINT, dir_fd=dirfd)
        os.close(dirfd)
    return token


NO_ENDPOINT = (
    "a kept process (keep=True, process(id)) needs the environment's endpoint, which a "
    "detached Docker environment has (`orchestrator up`, spawn_runtime(..., detached=True)) "
    "where its executor reaches a socket of the host's (not under gVisor, nor on a remote "
    "engine)"
)


def check_endpoint(project: Path | None) -> None:
    """UsageError (before anything runs) where `project` has no endpoint of ours."""
    if project is None or not (project / RECORD).is_file():
        raise UsageError(NO_ENDPOINT)


class ResidentLink(ExecutorClient):
    """One connection to an environment's resident, as an executor link: a session of its
    own, one command (number 1). Closing it leaves a kept process running."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__([])
        self._sock, self._sink, self.transport = sock, sock.sendall, "socket"
        self._sock_reader = sock.makefile("rb")

    def _input(self) -> Any:
        return self._sock_reader

    def start(self) -> None:
        self._last_rx = time.monotonic()
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._write, daemon=True),
        ]
        for t in self._threads:
            t.start()

    @property
    def alive(self) -> bool:
        return not self.dead.is_set()

    def close(self, release: bool = True) -> None:
        self._closing = True
        self.shutdown()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(2)
        for end in (self._sock_reader, self._sock):
            if end is not None:
                with contextlib.suppress(OSError):
                    end.close()
        self.dead.set()


def run_kept(
    project: Path | None, cmd: Command, probe: Probe, reopen: Callable[[], bool]
) -> Chunks:
    """Run (or, with `cmd.attach`, read again) the kept process `cmd.keep` over a
    connection of its own to the resident of `project`."""
    link = _connected(project, probe, reopen)
    control = cmd.control
    try:
        return (yield from link.run(cmd, procutil.GRACE, probe))
    except ExecutorLost:
        if control is not None and control.detached:
            raise UsageError(
                f"this Process was detached from kept process {cmd.keep}, which runs on: "
                "Sandbox.process(id, cursor=...) reads it again"
            ) from None
        raise
    finally:
        link.close()


SLOW_READY = 15.0
"""Seconds more a resident that did not greet within READY_WITHIN may take, when it did not
go away and its sandbox runs (not paused): as long as an executor's first greeting may."""
REOPEN_AFTER = 30.0
"""Seconds after a failed start of a resident before `reopen` tries again (a sandbox that
kills each one, or breaks its python3, costs a docker exec at most that often)."""
_reopen_guard = threading.Lock()
_reopen_locks: dict[str, threading.Lock] = {}
_failed_at: dict[str, float] = {}


def reopen(project: Path, start: Callable[[], bool]) -> bool:
    """Start the resident of `project` again with `start` (whose own steps are bounded):
    one caller at a time per environment, among this process's threads (a lock) and other
    processes (a lock file in the project folder); none where another caller's resident
    answers already, nor within REOPEN_AFTER of a failed start. True when one answers."""
    key = str(project)
    with _reopen_guard:
        lock = _reopen_locks.setdefault(key, threading.Lock())
    try:
        with lock, _held(project / "exec.lock"):
            return _reopen_held(project, key, start)
    except OSError:  # its folder went meanwhile (another process's `down`)
        return False


def _reopen_held(project: Path, key: str, start: Callable[[], bool]) -> bool:
    """`reopen`'s work, its locks held."""
    if answers(str(project)):  # (another caller's, started meanwhile)
        return True
    failed = _failed_at.get(key)
    if failed is not None and time.monotonic() - failed < REOPEN_AFTER:
        return False
    # the one this caller starts may greet late on a loaded machine (waited for here
    # alone: those waiting on the locks then find it answering at once)
    if start() and answers(str(project), SLOW_READY):
        _failed_at.pop(key, None)
        return True
    _failed_at[key] = time.monotonic()
    return False


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive lock on the file `path` (made owner-only, never through a link)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _greeted(link: ResidentLink, probe: Probe) -> SandboxUnavailable | None:
    """None once the resident greeted `link`; else why not (it went away: "does not
    answer", which the caller tells from a refusal by `link.dead`). One slow but not gone
    is paused (said at once), or a loaded machine's, which greets late (CI: four callers
    met a new one at once, at load 15): waited for up to SLOW_READY more while its sandbox
    runs, asked again each second."""
    if link.wait_ready(READY_WITHIN):
        return None
    deadline = time.monotonic() + SLOW_READY
    while not link.dead.is_set():
        why = probe()
        if why is not None:
            return why
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if link.wait_ready(min(1.0, left)):
            return None
    return SandboxUnavailable("the environment's endpoint does not answer")


def _connected(project: Path | None, probe: Probe, reopen: Callable[[], bool]) -> ResidentLink:
    """A greeted connection to the resident of `project`. One that is gone (killed in the
    sandbox: the next one kills the kept processes it left, whose timeouts nobody enforces
    any more) is started again once, by `reopen`."""
    check_endpoint(project)
    for again in (False, True):
        try:
            link = ResidentLink(dial(str(project)))
        except NotHere as exc:
            if again or not reopen():
                raise SandboxUnavailable(
                    f"the environment's endpoint does not answer ({exc})"
                ) from None
            continue
        try:
            link.start()
            why = _greeted(link, probe)
        except BaseException:  # (an engine that does not answer the probe; a Ctrl-C)
            link.close()
            raise
        if why is None:
            return link
        gone = link.dead.is_set()
        link.close()
        if not gone:
            raise why
        if again or not reopen():
            raise SandboxUnavailable("the environment's endpoint closed at once")
    raise AssertionError("unreachable")
