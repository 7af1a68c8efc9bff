"""The admission ledger: one folder of tickets per user and state folder, shared by every
process of that user on this host (see services/admission.py for the rules it serves).

Layout, under `state_dir()/admission` (a real folder of ours, mode 0700: another local user
can neither plant a ticket nor hold the lock; one that is not ours, or a link, is refused):
- `lock`: flock'ed around every read-modify-write, held for a bounded piece of work;
- `seq`: the last queue position given (rebuilt from the tickets when unreadable);
- `tickets/<seq>-<pid>-<rand>`: one small JSON object per request, waiting or admitted.

A ticket is dropped (its file removed) when it is not a small regular file of valid JSON of
the expected shape (a link, a folder, garbage, a huge file), or when its holder is gone: its
owner process (pid and start time) has ended and the folder it is anchored to (a detached
environment's project folder, under the projects folder) no longer exists."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchestratorError
from orchestrator.paths import (
    lock_descriptor,
    open_for_lock,
    private_folder,
    projects_dir,
    read_regular,
    state_dir,
    state_folder,
)
from orchestrator.procutil import process_start as process_start
from orchestrator.procutil import stat_fields

TICKET_MAX = 4096
"""Bytes a ticket file may hold; a larger one is dropped unread."""
LOCK_WAIT = 30.0
"""Seconds to wait for the ledger's lock (held by others only for a bounded piece of work)."""
ALIVE_FOR = 0.5
"""Seconds a process found alive (or gone) is taken to be so without looking again."""
PARSED_MAX = 4096
"""Tickets (and holders) remembered by this process, to read only what changed."""
_parsed: dict[tuple[str, str, int, int, int], Ticket] = {}
_alive: dict[tuple[int, str], tuple[bool, float]] = {}


@dataclass(frozen=True)
class Ticket:
    """One request for room: who holds it, what it asks, where it stands in the queue."""

    seq: int
    pid: int
    start: str
    memory: int
    """Bytes."""
    cpus: float
    env: str
    admitted: bool = False
    anchor: str = ""
    """A folder (under the projects folder) whose existence keeps the ticket after its owner
    process ends: a detached environment's project folder ("" none)."""
    name: str = ""
    """Its file name (not stored in it)."""

    def to_json(self) -> bytes:
        data = asdict(self)
        del data["name"]
        return json.dumps(data).encode()


_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,),
    "pid": (int,),
    "start": (str,),
    "memory": (int,),
    "cpus": (int, float),
    "env": (str,),
    "admitted": (bool,),
    "anchor": (str,),
}


def parse_ticket(raw: bytes, name: str) -> Ticket | None:
    """A ticket from its file's bytes, None when they are not one."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        return None
    for key, types in _FIELDS.items():
        value = data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return None
    if data["seq"] < 0 or data["pid"] <= 0 or data["memory"] < 0 or not data["cpus"] >= 0:
        return None
    if data["cpus"] == float("inf"):
        return None
    return Ticket(**data, name=name)


def owner_alive(pid: int, start: str) -> bool:
    """Whether process `pid` still runs and is the one that started at `start` (a zombie,
    dead but not yet waited for, counts as gone). Known for ALIVE_FOR seconds once asked."""
    now = time.monotonic()
    known = _alive.get((pid, start))
    if known is not None and now - known[1] < ALIVE_FOR:
        return known[0]
    fields = stat_fields(pid)
    alive = len(fields) > 19 and fields[0] not in (b"Z", b"X") and fields[19].decode() == start
    if len(_alive) > PARSED_MAX:
        _alive.clear()
    _alive[(pid, start)] = (alive, now)
    return alive


def anchor_alive(anchor: str) -> bool:
    """Whether a ticket's anchor folder exists: a real folder directly in our projects folder."""
    if not anchor:
        return False
    path = Path(anchor)
    try:
        base = projects_dir()
        info = path.lstat()
    except (OSError, ValueError):
        return False
    return path.parent == base and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def holder_alive(ticket: Ticket) -> bool:
    return owner_alive(ticket.pid, ticket.start) or anchor_alive(ticket.anchor)


class Ledger:
    """The tickets of this user's state folder. Every method takes the lock itself, except
    those called inside `locked()`, which say so."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else state_dir() / "admission"
        self.tickets = self.root / "tickets"

    # ----- the folder and its lock -----------------------------------------------------
    @contextlib.contextmanager
    def locked(self, deadline: float | None = None) -> Iterator[None]:
        # made 0700, or checked: ours, a real folder (see paths.private_folder)
        if self.root == state_dir() / "admission":
            state_folder(self.root.name)
        else:
            private_folder(self.root)
        private_folder(self.tickets)
        lock = self.root / "lock"
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = open_for_lock(lock, flags)
        except OSError as exc:  # a folder, a link, ...: not a lock of ours
            raise OrchestratorError(
                f"the admission ledger's lock {lock} cannot be opened ({exc.strerror}): remove "
                "it (it is an ordinary empty file), or set ORCHESTRATOR_ADMISSION=0"
            ) from None
        with lock_descriptor(fd):  # (the lock goes as it closes)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OrchestratorError(
                    f"the admission ledger's lock {lock} is not a regular file: remove it, or "
                    "set ORCHESTRATOR_ADMISSION=0"
                )
            end = time.monotonic() + LOCK_WAIT if deadline is None else deadline
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= end:
                    raise OrchestratorError(
                        f"the admission ledger {self.root} stayed locked for {LOCK_WAIT:g} s "
                        "by another process of yours; find it with `fuser "
                        f"{self.root / 'lock'}`, or set ORCHESTRATOR_ADMISSION=0"
                    )
                time.sleep(0.005)
            yield None

    # ----- tickets (call inside `locked()`) --------------------------------------------
    def read(self) -> list[Ticket]:
        """Every valid ticket of a live holder, in queue order; the others are removed."""
        out = []
        try:
            entries = list(os.scandir(self.tickets))
        except FileNotFoundError:
            return []
        for entry in entries:
            ticket = self._read_one(entry)
            if ticket is None or not holder_alive(ticket):
                self._drop(entry.name)
            else:
                out.append(ticket)
        return sorted(out, key=lambda t: (t.seq, t.name))

    def changed(self) -> int:
        """A number that changes whenever a ticket is added, replaced or removed."""
        try:
            return os.stat(self.tickets).st_mtime_ns
        except OSError:
            return 0

    def _read_one(self, entry: os.DirEntry[str]) -> Ticket | None:
        name = entry.name
        if name.startswith("."):
            return None  # a write that was cut short
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_size > TICKET_MAX:
            return None
        key = (str(self.tickets), name, info.st_ino, info.st_mtime_ns, info.st_size)
        known = _parsed.get(key)
        if known is not None:
            return known
        raw = read_regular(self.tickets / name, TICKET_MAX)
        if raw is None:
            return None
        ticket = parse_ticket(raw, name) if len(raw) <= TICKET_MAX else None
        if ticket is not None:
            if len(_parsed) > PARSED_MAX:
                _parsed.clear()
            _parsed[key] = ticket  # a ticket is only ever replaced by a new file (rename)
        return ticket

    def _drop(self, name: str) -> None:
        """Remove a ticket, or whatever else was put in its place (what cannot be removed
        stays, and is passed over at every read)."""
        path = self.tickets / name
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                for child in path.iterdir():  # a planted folder: emptied one level, then gone
                    with contextlib.suppress(OSError):
                        child.unlink()
                path.rmdir()
            else:
                path.unlink()

    def write(self, ticket: Ticket) -> None:
        """Write (or replace) a ticket in one step: a private file renamed into place."""
        tmp = self.tickets / f".{ticket.name}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, ticket.to_json())
        finally:
            os.close(fd)
        os.replace(tmp, self.tickets / ticket.name)

    def heartbeat(self, name: str) -> None:
        """Say that the waiter holding ticket `name` still looks at the queue (its mtime)."""
        with contextlib.suppress(OSError):
            os.utime(self.tickets / name, follow_symlinks=False)

    def quiet_for(self, name: str) -> float:
        """Seconds since ticket `name` was written or last had a heartbeat."""
        try:
            return max(0.0, time.time() - os.lstat(self.tickets / name).st_mtime)
        except OSError:
            return 0.0

    def next_seq(self, tickets: list[Ticket]) -> int:
        path = self.root / "seq"
        last = max((t.seq for t in tickets), default=0)
        with contextlib.suppress(OSError, ValueError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                last = max(last, int(os.read(fd, 32).decode().strip() or 0))
            finally:
                os.close(fd)
        seq = last + 1
        tmp = self.root / f".seq.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, f"{seq}\n".encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return seq

    # ----- whole operations (each takes the lock) ---------------------------------------
    def enqueue(self, memory: int, cpus: float, env: str) -> Ticket:
        with self.locked():
            seq = self.next_seq(self.read())
            pid = os.getpid()
            name = f"{seq:012d}-{pid}-{secrets.token_hex(4)}"
            ticket = Ticket(seq, pid, process_start(pid), memory, cpus, env[:200], name=name)
            self.write(ticket)
            return ticket

    def release(self, name: str) -> None:
        with self.locked():
            self._drop(name)

    def anchor(self, ticket: Ticket, folder: Path) -> Ticket:
        with self.locked():
            moved = replace(ticket, anchor=str(folder))
            if (self.tickets / ticket.name).exists():
                self.write(moved)
            return moved

    def snapshot(self) -> list[Ticket]:
        """The live tickets, in queue order (dead holders' removed)."""
        with self.locked():
            return self.read()
