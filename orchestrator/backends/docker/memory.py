"""Checkpoints with memory: a gVisor sandbox's processes, memory and in-sandbox files (its
tmpfs) saved by runsc, kept with a suspend record, and restored into copies by the engine
(`checkpoint(memory=True)`, `fork`, `wake`; docs/fork.md).

What works here, and so what this takes:
- gVisor saves a sandbox only without the host's network (`runsc --network=host`, which a
  networked gVisor container needs on these machines, is refused: "checkpoint not supported
  when using hostinet"), and this runsc cannot give a container its own network stack. So
  only a sandbox with no network at all is saved: one container with `network_mode: none`,
  on the runtime runsc with `--network=none` is registered under (`runsc-sealed`,
  scripts/bootstrap-gvisor), made through the Engine API (direct.py).
- It is saved by `runsc checkpoint` (see `held`), and started from an image by the engine
  (`POST /containers/{id}/start?checkpoint=`), which exists in its experimental mode only.
- Docker starts a container from a checkpoint only from its own folder for that container
  (`docker start --checkpoint-dir` answers "custom checkpointdir is not supported"). So an
  image is put there, under the engine's data root, which only root may write: this is
  done only by root, for an engine on this machine's socket.

Why by hand: neither python-on-whales nor the docker CLI moves a checkpoint between
containers. Every file read is opened without following links and must be a regular file;
a record's image is checked against the digests its record holds before it is used, and
its size is bounded (ORCHESTRATOR_CHECKPOINT_LIMIT); runsc runs within a deadline."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import logging
import os
import posixpath
import re
import secrets
import stat
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from orchestrator import procutil, settings
from orchestrator.backends.container.engine import Engine
from orchestrator.backends.container.engine.bounds import up_timeout
from orchestrator.errors import (
    DockerError,
    OrchestratorError,
    SandboxUnavailable,
    SandboxUnsafeArchive,
    StartupError,
    UsageError,
)
from orchestrator.paths import locked_file, read_regular
from orchestrator.sandbox.snapshot import Snapshot, remove_files, unlink_files
from orchestrator.sandbox.unpack import PATH_MAX, parts_of
from orchestrator.tables import printable

if TYPE_CHECKING:
    from orchestrator.backends.docker.lifecycle import Project


log = logging.getLogger("orchestrator.docker")
SEALED_ENV = settings.GVISOR_SEALED_RUNTIME.name
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ID = re.compile(r"[0-9a-f]{64}")
MAX_FILES = 16
LOCK_FILE = "memory.lock"
"""In the project folder: held while its memory is saved or restored (see `locked`)."""
CHUNK = 1 << 20
OUTPUT = 4096
"""Bytes of what runsc says that an error keeps (its last)."""
SETTLE = 2.0
"""Seconds a sandbox whose checkpoint failed must run on, nothing writing its image, to be
taken as running on (see _runs_on)."""
AFTER = 15.0
"""Seconds a sandbox that wrote its image has to stop once the writing ended (it stops at
once, but a loaded engine says so late); past them it is taken as running on."""
MOST_FDS = 1 << 16
"""Open files of the sandbox's process looked through, at most (see `_held_by`)."""
UNPACKED = "ctrd-checkpoint"
"""How the folder containerd unpacks a checkpoint into, to start a container from it, is
named: it makes one in its temporary folder for every such start and never removes it (a
whole memory image left on the host's disk per fork, wake or restart). See `_drop_unpacked`."""
UNPACKED_SCAN = 10.0
"""Longest a restore searches for the folder it was unpacked into (`_drop_unpacked`)."""
_UNPACKED_NAME = re.compile(re.escape(UNPACKED) + r"[0-9]{1,20}")
"""The name of such a folder, as Go's os.MkdirTemp draws it."""
MARKER = ".orchestrator-restore-"
"""The name (then who made it, and 32 hex digits) of the empty file each restore adds to the
image it hands the engine, which tells its unpacked folder from any other (`_drop_unpacked`)."""
_MARKED = re.compile(re.escape(MARKER) + r"([0-9]{1,20})-([0-9]{1,10})-([0-9]{1,20})-[0-9a-f]{32}")
"""A marker naming its restore's process: pid namespace, pid, start time (see `_marker`)."""
UNPACKED_STALE = 600.0
"""Seconds since its last change (and at least the up timeout) after which a folder unpacked
for a restore whose process is gone (killed during its start, so nothing removed it) is
removed by a later restore."""


def sealed_runtime() -> str:
    return settings.GVISOR_SEALED_RUNTIME.get()


def limit() -> int:
    return settings.CHECKPOINT_LIMIT.get()


def checkpoint_seconds() -> float:
    """How long runsc may take to save a sandbox (an engine call's bound)."""
    return up_timeout()


def refusal(project: Project) -> str | None:
    """Why this environment's memory cannot be saved here (None: it can)."""
    engine = project.engine
    if engine.socket is None:
        return "the engine is not on this machine's socket"
    if engine.kind != "docker":
        return f"the engine is {engine.kind}'s, and only Docker's restores a gVisor checkpoint"
    run = project._direct()
    if run is None:  # (one container, network_mode: none)
        return (
            "only a gVisor sandbox with no network is saved with its memory here: one "
            "container (isolation: gvisor, network.egress: none, no service, no published "
            "port); this runsc keeps no network in a checkpoint"
        )
    if run.volumes and project.pins is None:
        return (
            "it mounts host folders of the file's or the caller's (static assets, mounts), "
            "pinned by descriptors that only the process that started it holds (binding.py): "
            "save or fork it from that process"
        )
    got = project.runtime_of_main()
    if got != sealed_runtime():
        return (
            f"its sandbox runs on the engine runtime {got or 'runc'!r}, not on gVisor's "
            f"{sealed_runtime()!r} (runsc with --network=none, which scripts/bootstrap-gvisor "
            f"registers; {SEALED_ENV})"
        )
    return engine_refusal(engine)


def engine_refusal(engine: Engine) -> str | None:
    """Why this engine cannot restore a checkpoint made here (None: it can)."""
    if engine.socket is None:
        return "the engine is not on this machine's socket"
    if os.geteuid() != 0:
        return (
            "a copy starts from the engine's own folder for it (Docker starts a container "
            "from no other), which only root writes: run as root"
        )
    info = engine.described(action="asking the engine for its checkpoint support")
    if info.get("ExperimentalBuild") is not True:
        return "the engine's checkpoint API needs its experimental mode (dockerd --experimental)"
    root = str(info.get("DockerRootDir") or "")
    if not root.startswith("/") or not os.path.isdir(os.path.join(root, "containers")):
        return f"the engine's data root ({root or 'unsaid'}) is not on this machine"
    return None


@contextlib.contextmanager
def held(engine: Engine, container: str, folder: Path) -> Iterator[dict[str, str]]:
    """Save `container`'s processes and memory into `folder` (made here, private) and stop
    it; yield the digest of each file saved, by name, while it stands still (what the block
    saves of its files is of this one instant); then start it again from that image: it
    runs on as it was (also when the block failed).

    runsc itself is asked (`runsc checkpoint`, at the state root its sandbox names), not the
    engine's checkpoint API: the engine pauses the container first, and its containerd then
    keeps the task of a sandbox that was itself started from a checkpoint ("id already in
    use"), so a copy could not be saved again."""
    got = engine.inspected(container, "inspecting the sandbox") or {}
    cid = _checked_id(container, got)
    info = engine.described(action="asking the engine for its runtimes and data root")
    runsc, root = _runsc_of(info, container, got, cid)
    _room_for(info, container, got, folder.parent)
    folder.mkdir(mode=0o700)
    try:
        _checkpoint(runsc, root, cid, folder, container)
    except BaseException as exc:
        # its runsc gave up (or was given up on), but the sandbox may still be saving, and
        # stop once it has: it is started again from what it saved, if it does
        if not _runs_on(engine, container, folder, _pid_of(got)):
            try:
                _restart(engine, container, folder)
            except (OrchestratorError, OSError) as lost:
                if isinstance(exc, Exception):  # (an interrupt stays one)
                    raise SandboxUnavailable(
                        f"{exc}; and the sandbox stopped, and could not be started again "
                        f"from what was saved ({_short(str(lost))}): its processes are gone"
                    ) from exc
        raise
    try:
        yield _sealed(folder, limit())
    finally:
        _restart(engine, container, folder)


def _restart(engine: Engine, container: str, folder: Path) -> None:
    """Start the stopped original again from its own image (unbounded: its own memory)."""
    restore(engine, container, folder, _sealed(folder, None), bounded=False)


def _running(engine: Engine, container: str) -> bool:
    got = engine.inspected(container, "inspecting the sandbox") or {}
    return bool((got.get("State") or {}).get("Running"))


def _runs_on(engine: Engine, container: str, folder: Path, pid: int | None) -> bool:
    """After a checkpoint that failed or was given up on: whether the sandbox runs on (True),
    or stopped (False: it is started again from what it saved). While something writes its
    image (the sandbox; or runsc's request to, sent and not yet taken), it saves, and stops
    once saved, however long that takes on a busy machine: it is waited for, within
    up_timeout(). One that nothing wrote for SETTLE seconds runs on. Only the engine's word
    that it is not running counts as stopped: a sandbox it cannot see is left as it is."""
    now = time.monotonic
    deadline, since, wrote = now() + up_timeout(), now(), None
    while now() < deadline:
        with contextlib.suppress(OrchestratorError):
            if not _running(engine, container):
                return False
        with contextlib.suppress(OSError):
            if _written(folder, pid):
                wrote = now()
        if (now() - since >= SETTLE) if wrote is None else (now() - wrote >= AFTER):
            return True
        time.sleep(0.1 if wrote is None else 0.5)
    try:
        return _running(engine, container)
    except OrchestratorError:
        return True


def _pid_of(got: dict[str, Any]) -> int | None:
    """The sandbox's own process (runsc's sandbox, which writes its image), as inspected."""
    pid = (got.get("State") or {}).get("Pid")
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _written(folder: Path, pid: int | None) -> bool:
    """Whether a file of `folder` (private, made for this save, only root writes in it) is
    open for writing anywhere: the kernel refuses a read lease on a file while any writer of
    it is open, also one runsc sent the sandbox that it has not taken yet. Where no lease is
    to be had, whether the sandbox's process holds one open."""
    with os.scandir(folder) as entries:
        files = [e.path for e in entries if e.is_file(follow_symlinks=False)]
    for path in files:
        refused = _lease_refused(path)
        if refused is None:
            return _held_by(folder, pid)
        if refused:
            return True
    return False


def _lease_refused(path: str) -> bool | None:
    """Whether a read lease on `path` is refused (a writer has it open); None: no leases."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EBUSY):
                return True
            if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EACCES, errno.EPERM):
                return None  # (leases off, or not on this filesystem)
            raise
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def _held_by(folder: Path, pid: int | None) -> bool:
    """Whether process `pid` holds a file of `folder` open (its first MOST_FDS files)."""
    if pid is None:
        return False
    inside = os.path.join(os.path.realpath(folder), "")
    with os.scandir(f"/proc/{pid}/fd") as fds:
        for n, fd in enumerate(fds):
            if n >= MOST_FDS:
                break
            with contextlib.suppress(OSError):
                if os.readlink(fd.path).startswith(inside):
                    return True
    return False


def _room_for(info: dict[str, Any], container: str, got: dict[str, Any], records: Path) -> None:
    """Refuse to save a sandbox whose memory may not fit: its memory limit (else the
    checkpoint limit) must be free both where the record goes and under the engine's data
    root (the image is written to each)."""
    need = int((got.get("HostConfig") or {}).get("Memory") or 0) or limit()
    for where in (records, Path(str(info.get("DockerRootDir") or "/"))):
        st = os.statvfs(where)
        if st.f_bavail * st.f_frsize < need:
            raise UsageError(
                f"{container}: no room to save its memory: {where} has less than the "
                f"{need} bytes it may take free"
            )


def _checked_id(container: str, got: dict[str, Any]) -> str:
    cid = str(got.get("Id") or "")
    if not _ID.fullmatch(cid):
        raise OrchestratorError(f"the engine gave {container} an unexpected id {cid!r}")
    return cid


def _runsc_of(
    info: dict[str, Any], container: str, got: dict[str, Any], cid: str
) -> tuple[str, str]:
    """The runsc binary the engine registered the sealed runtime with, and the state root
    the container's sandbox was started with: its own command line says (`--root=`), once
    that process is seen to be this container's sandbox (`runsc-sandbox ... boot ... <id>`)
    and the root holds this container's state. Each path is checked in every part: absolute,
    root's, no link, writable by root alone (so no one else can point it elsewhere later).
    `info`: the engine's description (`Engine.described`)."""
    binary = str(((info.get("Runtimes") or {}).get(sealed_runtime()) or {}).get("path") or "")
    pid = int((got.get("State") or {}).get("Pid") or 0)
    root = ""
    with contextlib.suppress(OSError, ValueError):
        words = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        roots = [w[len(b"--root=") :] for w in words if w.startswith(b"--root=")]
        ours = pid > 0 and b"boot" in words and words[-1] == cid.encode() and len(roots) == 1
        root = os.fsdecode(roots[0]) if ours and words[0].endswith(b"runsc-sandbox") else ""
    # resolved first: what runsc is given is the very path checked, which only root can change
    binary, root = (os.path.realpath(p) if p.startswith("/") else "" for p in (binary, root))
    for path, what in ((binary, "runsc"), (root, "runsc's state root")):
        if not _roots_own(path):
            raise OrchestratorError(
                f"{container}: {what} ({path or 'not found'}) is not a path of root's that "
                "only root writes, in every part: not used"
            )
    state = Path(root, f"{cid}_sandbox:{cid}.state")
    if not _roots_own(str(state)):
        raise OrchestratorError(f"{container}: runsc keeps no state for it under {root}")
    return binary, root


def _roots_own(path: str, *, sticky: bool = False) -> bool:
    """`path` is absolute and normal, and it and every folder above it is root's, no link,
    and writable by root alone (`sticky`: or, for `path` itself too, a sticky folder)."""
    if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
        return False
    parts = Path(path).parts
    for n in range(1, len(parts) + 1):
        try:
            st = os.lstat(Path(*parts[:n]))
        except OSError:
            return False
        shared = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        # (a sticky folder above, as /tmp: what root has in it, no one else can move)
        kept = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and (n < len(parts) or sticky)
        if stat.S_ISLNK(st.st_mode) or st.st_uid != 0 or (shared and not kept):
            return False
    return True


def _checkpoint(runsc: str, root: str, cid: str, folder: Path, container: str) -> None:
    """`runsc checkpoint` of the sandbox into `folder`, within checkpoint_seconds() (its
    process tree killed past it); what it said, at most OUTPUT bytes of it, in the error."""
    argv = [runsc, f"--root={root}", "checkpoint", f"--image-path={folder}", cid]
    head, said = b"", b""
    run = procutil.run(argv, None, None, timeout=checkpoint_seconds())
    try:
        while True:
            _, data = next(run)
            head += data[: max(0, OUTPUT - len(head))]
            said = (said + data)[-OUTPUT:]
    except StopIteration as stop:
        outcome = stop.value
    finally:
        run.close()
    if outcome.exit_code != 0:
        why = "timed out" if outcome.timed_out else f"exit {outcome.exit_code}"
        raise OrchestratorError(
            f"gVisor could not checkpoint {container} ({why}): {_short(_told(head, said))}"
        )


def _told(head: bytes, tail: bytes) -> str:
    """What runsc said of why it failed, in a line a caller can read: its first line, with
    the dump of the object it could not save cut to that object's type (and a file's name,
    where it is one deleted while in use, which this runsc cannot save: a sandbox's own root
    makes that by replacing a program a process of it runs); else the line its panic began
    with; else the last of what it printed."""
    text = head.decode("utf-8", "replace")
    first = text.split("\n", 1)[0]
    dump = _DUMP.search(first)
    if dump is not None:
        said = first[: dump.end("kind")]
        gone = _DELETED.search(first)
        if gone is not None:
            said += f" (a file deleted while in use: {gone.group('name')!r})"
        return said
    for line in text.splitlines():
        if line.startswith("panic: "):
            return "runsc panicked: " + line.removeprefix("panic: ")
    return tail.decode("utf-8", "replace").strip()


_DUMP = re.compile(r"encoding error at object (?P<kind>[\w.*()]+)\{")
"""runsc's words when an object of the sandbox cannot be saved, before its whole dump."""
_DELETED = re.compile(
    r'name:"(?P<name>[^"]{1,255})".*?deleted:atomicbitops\.Uint32\{[^}]*\}, value:0x1\}'
)
"""A dentry's name, then its `deleted` flag set (a gofer dentry's dump, in that order)."""


def _short(text: str) -> str:
    """At most its first 600 characters, on one line, printable (a file's name in it is
    the sandbox's to choose), without a Go stack trace (runsc's panics print one)."""
    line = printable(" ".join(_TRACE.split(text, 1)[0].split()))
    return line if len(line) <= 600 else line[:600] + "..."


_TRACE = re.compile(r":?\s*goroutine \d+ \[")
"""Where a Go program's stack trace begins."""


def _sealed(folder: Path, bound: int | None) -> dict[str, str]:
    """The image runsc wrote in `folder`: each file made owner-only, and its digest, by
    name; at most `bound` bytes in all (None: unbounded). Anything but regular files with
    plain names: OrchestratorError."""
    done: dict[str, str] = {}
    left = bound
    names = sorted(os.listdir(folder))
    if not names or len(names) > MAX_FILES or not all(map(_FILE.fullmatch, names)):
        raise OrchestratorError(f"{folder}: not a checkpoint image ({len(names)} files)")
    for name in names:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OrchestratorError(f"{folder / name} is not a regular file")
            os.fchmod(fd, 0o600)
            digest = hashlib.sha256()
            while chunk := fh.read(CHUNK):
                left = _spend(left, len(chunk))
                digest.update(chunk)
        done[name] = digest.hexdigest()
    return done


def locked(directory: Path, name: str) -> contextlib.AbstractContextManager[None]:
    """One save or restore of an environment's memory at a time, across processes (the
    CLI's too): a lock file in its project folder, waited for up to twice up_timeout()."""
    within = 2 * up_timeout()
    busy = f"{name}: another save of its memory has run for {within:g}s; try again"
    return locked_file(directory / LOCK_FILE, within, busy)


def restore(
    engine: Engine,
    container: str,
    folder: Path,
    digests: dict[str, str],
    *,
    bounded: bool = True,
) -> None:
    """Start `container` (stopped first) from the memory image in `folder`, each file
    checked against `digests` as it is copied into the engine's own folder: a file changed
    since it was saved is refused (UsageError) before anything starts from it. `bounded`:
    at most limit() bytes in all (a record's; an original's own restart is not)."""
    if not digests or len(digests) > MAX_FILES or not all(map(_FILE.fullmatch, digests)):
        raise UsageError(f"{folder}: the record's memory image is not one this made")
    own = _own_folder(engine, container)
    name = f"orch-{uuid.uuid4().hex[:16]}"
    action = f"restoring {container} from its checkpoint"
    engine.stop_container(container, grace=0, action=action)
    own.mkdir(mode=0o700, exist_ok=True)
    marker = _marker()
    try:
        _copy(folder, own / name, digests, limit() if bounded else None)
        os.close(os.open(own / name / marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        _distinct(own / name)
        _start_from(engine, container, name, action)
    finally:
        with contextlib.suppress(OrchestratorError):
            engine.delete_checkpoint(container, name, action=action)
        remove_files(own / name)
        _drop_unpacked(marker)


def first_start(
    engine: Engine,
    container: str,
    workdir: str,
    snap: Snapshot,
    *,
    seconds: float,
    scratch: Path,
    owners: tuple[int, int],
) -> bool:
    """Start a copy's container, made and never started, from the record `snap` at once:
    the engine unpacks the record's workspace into it (as for `docker cp`, chrooted in the
    container's own view of its files and mounts), then it starts from the memory image.
    Without this, a copy was started plainly only for its own tar to unpack the workspace,
    then stopped: a gVisor boot and a stop (0.6 s a copy here).

    The engine unpacks as root, keeping what a tar says (owners, modes, extended
    attributes, devices) and following links an earlier entry made; and a record may come
    from anywhere (a path), its workspace packed by a sandbox's own tar where it has no host
    folder. So the engine is never sent the record's tar: `_canonical` writes a new one
    into a private file in `scratch` (unlinked at once), of only what the sandbox's own tar
    would make. False, with nothing sent, when the archive holds anything else (the copy
    then starts as before, its own tar unpacking the workspace inside it); a failure once
    sent fails the copy (the engine may have made part of it)."""
    deadline = time.monotonic() + seconds
    try:
        fd = os.open(snap.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read snapshot {snap.path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as record, tempfile.TemporaryFile(dir=scratch) as tar:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        rules = _Rules(deadline, owners, PATH_MAX - len(workdir.encode()) - 2, _held(fd, st))
        if not _canonical(record, tar, rules):
            return False
        tar.flush()
        action = f"putting the workspace into {container}"
        left = max(1.0, deadline - time.monotonic())
        try:
            engine.put_archive(container, workdir, tar, seconds=left, action=action)
        except DockerError as exc:  # (never read for kinds: its words may quote a name)
            raise StartupError(f"{action}: {_short(str(exc))}") from None
    try:
        restore(engine, container, snap.memory_folder, snap.memory)
    except DockerError as exc:  # (gVisor's words may quote the sandbox's file names)
        raise StartupError(f"starting {container} from its memory: {_short(str(exc))}") from None
    return True


def _held(fd: int, st: os.stat_result) -> int:
    """Bytes of content a record holds: its size, or where it has holes (read as zeros),
    what it holds on disk."""
    try:
        whole = os.lseek(fd, 0, os.SEEK_HOLE) >= st.st_size
    except OSError:
        whole = False
    finally:
        os.lseek(fd, 0, os.SEEK_SET)
    return st.st_size if whole else st.st_blocks * 512


MAX_ENTRIES = 200_000
"""Entries of a workspace archive the engine is given at most (more: the sandbox unpacks)."""
MAX_FOLDERS = 100_000
"""Folders among them (the engine keeps each one's header until the end)."""
MAX_NAMES = 64 << 20
"""Bytes of all their names (kept here to check each entry's folder)."""
MAX_HEADER = 1 << 20
"""Bytes tarfile may read at once from a record: a block, a file's chunk (16 KiB), a long
name; a longer read is a header nothing of ours writes (a pax header of gigabytes)."""
MAX_TIME = 1 << 33
"""Times the engine's tar reader takes as they are."""
_CONTROL = re.compile("[\\x00-\\x1f\\x7f\\ud800-\\udfff]")
"""In a name: what tar readers disagree on (a NUL ends Go's names, not Python's) or that
is not UTF-8 (surrogate escapes)."""


@dataclass(frozen=True)
class _Rules:
    """The bounds of one workspace archive given to the engine (see _canonical)."""

    deadline: float
    owners: tuple[int, int]
    """The sandbox user's uid and gid: files are theirs or root's."""
    path_max: int
    """Bytes of a name below the working folder (the engine's path must fit PATH_MAX)."""
    data_max: int
    """Bytes of files' content: at most what the record holds on disk (no holes read)."""


class _Bounded:
    """A record read for tarfile: every read within the deadline and at most MAX_HEADER
    bytes (an OSError past either, which refuses the record)."""

    def __init__(self, raw: IO[bytes], deadline: float) -> None:
        self.raw, self.deadline = raw, deadline

    def read(self, size: int = -1) -> bytes:
        if not 0 <= size <= MAX_HEADER or time.monotonic() > self.deadline:
            raise OSError("a read of the record past its bounds")
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def _canonical(record: IO[bytes], out: IO[bytes], rules: _Rules) -> bool:
    """Write into `out` the workspace archive `record` as a new tar of what the sandbox's
    own tar would make of it, written here field by field: the folder itself first (an
    entry the engine skips; a file name first could read as a compressed stream's
    signature), then folders, regular files, symbolic and hard links, FIFOs; each with its
    owner (the sandbox user or root, as theirs were) and its permissions (no setuid, setgid
    or sticky bit), its name, link target and time; nothing else of the record's headers
    (no extended attributes, no sparse maps, no owners' names). False when the record
    holds anything else: another kind of entry (a device node: the engine, as root, would
    make it); a name or link with a NUL (Go's reader ends the name there, Python's does
    not), a control character or bytes that are not UTF-8, too long, absolute, climbing or
    given twice; an entry whose folder is not an entry before it (then nothing is ever
    written through a link: `out -> /data`, then `out/x`); a symbolic link that climbs
    out of the folder (the engine refuses it midway); a hard link to anything but a file
    before it; a sparse file; another owner, or a time out of range; more entries,
    folders, bytes of names or of content than the bounds; anything but zeros after the
    last entry (tarfile takes a header it cannot read for the end); or what cannot be read
    within its bounds by the deadline. Reads are bounded (_Bounded); file data goes in
    16 KiB chunks."""
    kinds: dict[str, bytes] = {".": tarfile.DIRTYPE}
    counts = [0, 0, 0, 0]  # entries, folders, bytes of names, bytes of content
    bounded = _Bounded(record, rules.deadline)
    try:
        with (
            tarfile.open(fileobj=cast(IO[bytes], bounded), mode="r:") as archive,
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as canon,
        ):
            root = tarfile.TarInfo(".")
            root.type, root.mode = tarfile.DIRTYPE, 0o755
            canon.addfile(root)
            for member in archive:
                archive.members.clear()  # type: ignore[attr-defined]  # (it keeps each entry)
                copy = _entry(member, kinds, rules)
                counts[0] += 1
                if copy is None or not _within(counts, copy, rules):
                    return False
                if copy.name == ".":
                    continue  # (the folder itself: the engine keeps it as it is)
                kinds[copy.name] = copy.type
                if copy.type in _FILES:
                    canon.addfile(copy, archive.extractfile(member))
                else:
                    canon.addfile(copy)
            record.seek(archive.offset)
        rest = record.read(MAX_HEADER + 1)
        return len(rest) <= MAX_HEADER and not rest.strip(b"\0")
    except (tarfile.TarError, OSError, UnicodeError, ValueError, ArithmeticError, RecursionError):
        return False  # (a chain of a thousand name headers: tarfile recurses)


def _within(counts: list[int], copy: tarfile.TarInfo, rules: _Rules) -> bool:
    """Count one more entry; whether every bound still holds."""
    counts[1] += copy.type == tarfile.DIRTYPE
    counts[2] += len(copy.name)
    counts[3] += copy.size
    return (
        counts[0] <= MAX_ENTRIES
        and counts[1] <= MAX_FOLDERS
        and counts[2] <= MAX_NAMES
        and counts[3] <= rules.data_max
        and time.monotonic() <= rules.deadline
    )


_FILES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_KINDS = (*_FILES, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE)


def _entry(
    member: tarfile.TarInfo, kinds: dict[str, bytes], rules: _Rules
) -> tarfile.TarInfo | None:
    """The entry to write for `member`, or None (see _canonical)."""
    if member.type not in _KINDS or member.sparse is not None:
        return None
    if any(key.startswith("GNU.sparse") for key in member.pax_headers):
        return None
    name = _entry_name(member.name, kinds, rules.path_max)
    mtime = float(member.mtime)
    if name is None or not 0 <= mtime < MAX_TIME:
        return None
    if member.uid not in (0, rules.owners[0]) or member.gid not in (0, rules.owners[1]):
        return None
    copy = tarfile.TarInfo(name)
    copy.type, copy.mode = member.type, member.mode & 0o777
    copy.uid, copy.gid, copy.mtime = member.uid, member.gid, int(mtime)
    if name == ".":
        return copy if member.isdir() else None
    if member.issym():
        link = member.linkname
        if not _plain(link, PATH_MAX) or not _inside(posixpath.join(posixpath.dirname(name), link)):
            return None
        copy.linkname = link
    elif member.islnk():
        target = _entry_name(member.linkname, kinds, rules.path_max, new=False)
        if target is None or kinds.get(target) not in _FILES:
            return None
        copy.linkname = target
    elif member.type in _FILES:
        copy.size = member.size
    return copy


def _plain(text: str, most: int) -> bool:
    """A name or link target every tar reader reads alike, of at most `most` bytes."""
    return 0 < len(text.encode()) <= most and not _CONTROL.search(text)


def _entry_name(name: str, kinds: dict[str, bytes], most: int, *, new: bool = True) -> str | None:
    """An entry's name below the folder ("." for the folder itself), or None when it is
    not plain, absolute, climbs, is too deep or long, or (`new`) was named before or lies
    in a folder that no entry before it made (its parent must be a folder entry, so
    nothing is written through a link, nor into a folder the archive did not make)."""
    if not _plain(name, most):
        return None
    try:
        parts = parts_of(name)  # (the rules of a download's unpacking: unpack.py)
    except SandboxUnsafeArchive:
        return None
    clean = "/".join(parts) or "."
    if not new:
        return clean
    if clean in kinds and clean != ".":
        return None
    parent = "/".join(parts[:-1]) or "."
    return clean if kinds.get(parent) == tarfile.DIRTYPE else None


def _inside(path: str) -> bool:
    """A link's target, joined to where it stands, that stays inside the folder (an
    absolute one is resolved only inside the sandbox: nothing of the archive goes
    through a link)."""
    return not posixpath.normpath("./" + path.lstrip("/")).startswith("..")


def _start_from(engine: Engine, container: str, name: str, action: str) -> None:
    """Start `container` from its checkpoint `name`. The engine uploads the image (as a tar
    of its folder) to its containerd's content store, which refuses bytes it is being sent
    already ("already exists"); `_distinct` makes each upload's bytes its own, and what
    still clashes (another upload drew the same time) is tried again, within up_timeout()."""
    deadline = time.monotonic() + up_timeout()
    while True:
        try:
            engine.start_container(container, checkpoint=name, seconds=up_timeout(), action=action)
            return
        except DockerError as exc:
            if "already exists" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _drop_unpacked(marker: str) -> None:
    """Remove the folders containerd unpacked this restore's image into (UNPACKED), found by
    the `marker` file only this restore's image holds: never another's (a start of another
    copy may still need its own), then those restores that died left (`_left_by_the_dead`).
    Each is looked at through descriptors (opened without following a link, root's, holding
    the marker as a regular file), emptied of its files through its own descriptor, then
    removed. The search runs in a thread of its own, waited for UNPACKED_SCAN seconds at
    most (a temporary folder anyone can fill with names, or mount a file system on one that
    never answers). A failure is logged, never raised: the restore's own outcome stands."""
    search = threading.Thread(
        target=_search_unpacked, args=(marker,), name="orchestrator-unpacked", daemon=True
    )
    search.start()
    search.join(UNPACKED_SCAN)
    if search.is_alive():
        log.warning("the folder a restore was unpacked into was not found in time (%s)", marker)


def _search_unpacked(marker: str) -> None:
    """Its own folder first, then those of the dead, within UNPACKED_SCAN in all."""
    deadline = time.monotonic() + UNPACKED_SCAN
    try:
        temps = _containerd_temps()
    except OSError as exc:
        log.debug("containerd's temporary folder: %s", exc)
        return
    mine = functools.partial(_holds, marker=marker)
    for judge in (mine, _left_by_the_dead):
        for where in temps:
            if not _drop_in(where, judge, deadline):
                return


def _drop_in(where: str, judge: Callable[[int, os.stat_result], bool], deadline: float) -> bool:
    """Drop each folder of `where` named as containerd names them that `judge` (given its
    open descriptor and what fstat says of it) takes; False once past `deadline`."""
    try:
        wfd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        with os.scandir(wfd) as entries:
            for entry in entries:
                if time.monotonic() > deadline:
                    return False
                try:
                    if _UNPACKED_NAME.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                        _drop_marked(wfd, entry.name, judge)
                except OSError as exc:  # (one folder that cannot be read stops no other)
                    log.debug("%s/%s: %s", where, entry.name, exc)
    except OSError as exc:
        log.debug("%s: %s", where, exc)
    finally:
        os.close(wfd)
    return True


def _drop_marked(wfd: int, name: str, judge: Callable[[int, os.stat_result], bool]) -> None:
    """Remove the folder `name` of the open folder `wfd` when it is root's and `judge` takes
    it: holding this restore's marker (`_holds`) or left by a restore that died
    (`_left_by_the_dead`). The one looked at is the one emptied: by descriptor."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=wfd)
    except OSError:
        return
    try:
        found = os.fstat(fd)
        if found.st_uid != 0 or not judge(fd, found):
            return
        unlink_files(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=wfd)


def _holds(fd: int, found: os.stat_result, marker: str) -> bool:
    """Whether the folder open at `fd` holds `marker` as a regular file."""
    try:
        return stat.S_ISREG(os.stat(marker, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _marker() -> str:
    """This restore's marker: who makes it (pid namespace, pid, start time), where known,
    so a later restore can tell its folder was left by the dead; then 128 random bits."""
    ns, pid = _pid_namespace(), os.getpid()
    start = procutil.process_start(pid)
    who = f"{ns}-{pid}-{start}-" if ns and start.isdigit() else ""
    return f"{MARKER}{who}{uuid.uuid4().hex}"


def _left_by_the_dead(fd: int, found: os.stat_result) -> bool:
    """Whether the folder open at `fd` was unpacked for a restore of our pid namespace whose
    process is gone (killed during its start: nothing else knew its marker), and has not
    changed for UNPACKED_STALE seconds, nor for the longest a start may take (the engine's
    start it was made for is long over; by its ctime too, which no tar nor utime sets).
    A restore of another pid namespace (another container's) is never judged."""
    ours = _pid_namespace()
    changed = max(found.st_mtime, found.st_ctime)
    if ours is None or time.time() - changed < max(UNPACKED_STALE, up_timeout()):
        return False
    try:
        with os.scandir(fd) as entries:
            for n, entry in enumerate(entries):
                if n > MAX_FILES + 2:  # (an image of ours holds no more)
                    return False
                made = _MARKED.fullmatch(entry.name)
                if made is None or made[1] != ours or not entry.is_file(follow_symlinks=False):
                    continue
                return _gone(int(made[2]), made[3])
    except OSError:
        return False
    return False


def _gone(pid: int, start: str) -> bool:
    """Whether process `pid` started at `start` is gone: no such pid, or a pid now another
    process's (its start time read, and another). One that cannot be looked at is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    now = procutil.process_start(pid)
    return now != "" and now != start


def _pid_namespace() -> str | None:
    """This process's pid namespace (its number), as /proc/self/ns/pid names it; None when
    the /proc mounted here is not of it (its pids would be another namespace's)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
    except OSError:
        return None
    number = (_namespace("self", "pid") or "").removeprefix("pid:[").removesuffix("]")
    return number if number.isdigit() else None


def _containerd_temps() -> tuple[str, ...]:
    """The folders this machine's containerd makes its temporary folders in (as Go's
    os.MkdirTemp is asked there: its XDG_RUNTIME_DIR, else its TMPDIR, else /tmp). Only a
    process named containerd that runs as root in our own mount namespace is asked (anyone
    may name a process so), and only a folder root alone may change the entries of (every
    folder on its path root's, no link; a sticky one such as /tmp). Kept once one was found
    (/tmp meanwhile: a containerd restarting is asked again next time)."""
    if _TEMPS:
        return _TEMPS[0]
    ours = _namespace("self", "mnt")
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        comm = read_regular(Path(entry.path, "comm"), 64, follow=True)
        if comm is None or comm.strip() != b"containerd" or not _root_process(entry.path):
            continue
        if ours is None or _namespace(entry.name, "mnt") != ours:
            continue
        environ = read_regular(Path(entry.path, "environ"), 1 << 16, follow=True) or b""
        pairs = dict(e.partition(b"=")[::2] for e in environ.split(b"\0") if b"=" in e)
        where = os.fsdecode(pairs.get(b"XDG_RUNTIME_DIR") or pairs.get(b"TMPDIR") or b"/tmp")
        if _roots_own(where, sticky=True):
            found.append(where)
    if not found:
        return ("/tmp",)
    _TEMPS.append(tuple(dict.fromkeys(found)))
    return _TEMPS[0]


_TEMPS: list[tuple[str, ...]] = []
"""`_containerd_temps`, once found."""


def _root_process(proc: str) -> bool:
    """Whether the process at `proc` (/proc/PID) runs as root: every uid its status gives."""
    status = read_regular(Path(proc, "status"), 1 << 14, follow=True) or b""
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith(b"Uid:")), [])
    return len(uids) == 4 and all(u == b"0" for u in uids)


def _namespace(pid: str, kind: str) -> str | None:
    """Process `pid`'s namespace of `kind` (mnt, pid), as /proc names it ("mnt:[N]")."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _distinct(folder: Path) -> None:
    """Give the files of a checkpoint folder a modification time drawn at random (whole
    seconds, which the engine's tar keeps): the tar the engine makes of the folder is then
    not another start's, so copies of one image start side by side instead of one at a
    time (the content store refuses one of two equal uploads at once). Nothing reads these
    times: runsc restores from the files' content, which the digests checked."""
    stamp = 1_000_000_000 + secrets.randbelow(1 << 30)
    for entry in os.scandir(folder):  # (files this process made: `_copy`)
        os.utime(entry.path, (stamp, stamp), follow_symlinks=False)
    os.utime(folder, (stamp, stamp), follow_symlinks=False)


def _own_folder(engine: Engine, container: str) -> Path:
    """The engine's folder of `container`'s checkpoints."""
    info = engine.described(action="asking the engine for its data root")
    cid = _checked_id(container, engine.inspected(container, "inspecting the sandbox") or {})
    return Path(str(info["DockerRootDir"]), "containers", cid, "checkpoints")


def _copy(source: Path, dest: Path, want: dict[str, str], bound: int | None) -> None:
    """Copy the files `want` names from `source` into the new private folder `dest` (never
    through a link, regular files only), at most `bound` bytes in all; each must have the
    digest `want` gives it (else UsageError, and `dest` goes)."""
    dest.mkdir(mode=0o700)
    left = bound
    try:
        for name in sorted(want):
            digest, left = _copy_file(source / name, dest / name, left)
            if want[name] != digest:
                raise UsageError(
                    f"{source}: its memory image was changed since it was saved ({name}): refused"
                )
    except BaseException:
        remove_files(dest)
        raise


def _copy_file(source: Path, dest: Path, left: int | None) -> tuple[str, int | None]:
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read the memory image {source}: {exc.strerror}") from None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{source} is not a regular file: refused")
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out, "wb") as dst:
            while chunk := src.read(CHUNK):
                left = _spend(left, len(chunk))
                digest.update(chunk)
                dst.write(chunk)
    return digest.hexdigest(), left


def _spend(left: int | None, size: int) -> int | None:
    """What is left of a bound once `size` more bytes are read (UsageError past it)."""
    if left is None:
        return None
    if left < size:
        raise UsageError(
            f"a checkpoint's memory image is over {limit()} bytes "
            f"({settings.CHECKPOINT_LIMIT.name}): refused"
        )
    return left - size
